//! Checks of im2col and col2im.

use super::*;

pub(super) fn run_im2col<B: Backend>(
    b: &B,
    x: &HostTensor,
    g: &Conv2dGeometry,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, ob) = (x.upload(b)?, out.upload(b)?);
    b.im2col(View::new(&xb, &x.layout), g, View::new(&ob, &out.layout))?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn run_col2im<B: Backend>(
    b: &B,
    c: &HostTensor,
    g: &Conv2dGeometry,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (cb, ob) = (c.upload(b)?, out.upload(b)?);
    b.col2im(View::new(&cb, &c.layout), g, View::new(&ob, &out.layout))?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn conv<B: Backend>(s: &mut Suite<'_, B>) {
    let mut done = 0;
    while done < s.cfg.cases + 4 {
        let r = s.rng();
        let g = Conv2dGeometry {
            batch: 1 + r.below(2),
            channels: 1 + r.below(3),
            height: 1 + r.below(12),
            width: 1 + r.below(12),
            kernel: (1 + r.below(3), 1 + r.below(3)),
            stride: (1 + r.below(2), 1 + r.below(2)),
            padding: (r.below(2), r.below(2)),
            dilation: (1 + r.below(2), 1 + r.below(2)),
        };
        let Some(cols) = g.cols_shape() else { continue };
        done += 1;
        let (oh, ow) = g.output_size().expect("valid");
        let kind = s.kind();
        let fdt = s.float_dtype();
        let x = random_tensor(s.rng(), &g.image_shape(), fdt, kind, |r| r.range(-1.0, 1.0));
        let out = output_tensor(s.rng(), &cols, x.dtype);
        // Reference: each (column row, output position) reads one pixel or the padding.
        let xs = x.logical();
        let il = Layout::contiguous(&g.image_shape());
        let (kh, kw) = g.kernel;
        let pixel = |n: usize, row: usize, pos: usize| -> Option<usize> {
            let (c, i, j) = (row / (kh * kw), (row / kw) % kh, row % kw);
            let (oy, ox) = (pos / ow, pos % ow);
            let iy = (oy * g.stride.0 + i * g.dilation.0) as isize - g.padding.0 as isize;
            let ix = (ox * g.stride.1 + j * g.dilation.1) as isize - g.padding.1 as isize;
            (iy >= 0 && ix >= 0 && (iy as usize) < g.height && (ix as usize) < g.width)
                .then(|| il.index_of(&[n, c, iy as usize, ix as usize]))
        };
        let exact: Vec<f64> = (0..numel(&cols))
            .map(|p| {
                let [n, row, pos] = <[usize; 3]>::try_from(unravel(p, &cols)).expect("rank 3");
                pixel(n, row, pos).map_or(0.0, |at| xs[at])
            })
            .collect();
        match both!(s, run_im2col(&x, &g, &out)) {
            Ok((c, t)) => s.judge(
                "im2col",
                &format!("{g:?} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail("im2col", format!("{g:?}: {e}")),
        }
        // col2im: the adjoint, summing every column entry into its pixel.
        let fdt = s.float_dtype();
        let colsv = random_tensor(s.rng(), &cols, fdt, kind, |r| r.range(-1.0, 1.0));
        let fdt = s.float_dtype();
        let img = output_tensor(s.rng(), &g.image_shape(), fdt);
        let cv = colsv.logical();
        let mut exact = vec![0f64; numel(&g.image_shape())];
        let mut mag = vec![0f64; exact.len()];
        for (p, &v) in cv.iter().enumerate() {
            let [n, row, pos] = <[usize; 3]>::try_from(unravel(p, &cols)).expect("rank 3");
            if let Some(at) = pixel(n, row, pos) {
                exact[at] += v;
                mag[at] += v.abs();
            }
        }
        let _ = (oh, ow);
        match both!(s, run_col2im(&colsv, &g, &img)) {
            Ok((c, t)) => s.judge(
                "col2im",
                &format!("{g:?} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| 2f64.powi(-17) * mag[o] + rounding(img.dtype, w, 2.0),
            ),
            Err(e) => s.fail("col2im", format!("{g:?}: {e}")),
        }
    }
}
