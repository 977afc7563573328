//! Checks of gather and scatter_add.

use super::*;

pub(super) fn run_gather<B: Backend>(
    b: &B,
    x: &HostTensor,
    axis: usize,
    index: &HostTensor,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, ib, ob) = (x.upload(b)?, index.upload(b)?, out.upload(b)?);
    b.gather(
        View::new(&xb, &x.layout),
        axis,
        View::new(&ib, &index.layout),
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn gather<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(1..=3, 1 << 17);
    for (i, shape) in shapes.iter().enumerate() {
        let axis = s.rng().below(shape.len());
        if shape[axis] == 0 {
            continue;
        }
        let (dx, kind) = (s.float_dtype(), s.kind());
        let x = random_tensor(s.rng(), shape, dx, kind, |r| r.range(-3.0, 3.0));
        let select = i % 2 == 1; // index_select: one index list broadcast along the other dims
        let ishape = s.index_shape(shape, axis);
        let bound = shape[axis];
        let idt = if s.rng().below(2) == 0 {
            DType::U32
        } else {
            DType::I32
        };
        let index = if select {
            let mut t = random_tensor(s.rng(), &[ishape[axis]], idt, ViewKind::Contiguous, |r| {
                r.below(bound) as f32
            });
            let mut l = Layout {
                shape: vec![1; shape.len()],
                strides: vec![0; shape.len()],
                offset: 0,
            };
            l.shape[axis] = ishape[axis];
            l.strides[axis] = 1;
            t.layout = l.broadcast_to(&ishape).expect("broadcast");
            t
        } else {
            random_tensor(s.rng(), &ishape, idt, ViewKind::Strided, |r| {
                r.below(bound) as f32
            })
        };
        let fdt = s.float_dtype();
        let out = output_tensor(s.rng(), &ishape, fdt);
        let (xs, is) = (&x, index.logical());
        let exact: Vec<f64> = (0..numel(&ishape))
            .map(|p| {
                let mut idx = unravel(p, &ishape);
                idx[axis] = is[p] as usize;
                round_to(out.dtype, xs.backing[xs.layout.index_of(&idx)]) as f64
            })
            .collect();
        let name = if select {
            "gather (index_select)"
        } else {
            "gather"
        };
        match both!(s, run_gather(&x, axis, &index, &out)) {
            Ok((c, t)) => s.judge(
                name,
                &format!("{shape:?} axis {axis} index {ishape:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail(name, format!("{shape:?} axis {axis} index {ishape:?}: {e}")),
        }
    }
}

pub(super) fn run_scatter<B: Backend>(
    b: &B,
    src: &HostTensor,
    axis: usize,
    index: &HostTensor,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (sb, ib, ob) = (src.upload(b)?, index.upload(b)?, out.upload(b)?);
    b.scatter_add(
        View::new(&sb, &src.layout),
        axis,
        View::new(&ib, &index.layout),
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn scatter_add<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(1..=3, 1 << 17);
    for shape in shapes {
        let axis = s.rng().below(shape.len());
        if shape[axis] == 0 {
            continue;
        }
        let ishape = s.index_shape(&shape, axis);
        let bound = shape[axis];
        let index = random_tensor(s.rng(), &ishape, DType::U32, ViewKind::Contiguous, |r| {
            r.below(bound) as f32
        });
        let kind = s.kind();
        let fdt = s.float_dtype();
        let src = random_tensor(s.rng(), &ishape, fdt, kind, |r| r.range(-1.0, 1.0));
        let fdt = s.float_dtype();
        let out = output_tensor(s.rng(), &shape, fdt);
        let mut exact = out.logical();
        let mut mag: Vec<f64> = exact.iter().map(|v| v.abs()).collect();
        let mut terms = vec![1f64; exact.len()];
        let (is, ss) = (index.logical(), src.logical());
        let cl = Layout::contiguous(&shape);
        for p in 0..numel(&ishape) {
            let mut idx = unravel(p, &ishape);
            idx[axis] = is[p] as usize;
            let o = cl.index_of(&idx);
            exact[o] += ss[p];
            mag[o] += ss[p].abs();
            terms[o] += 1.0;
        }
        let dout = out.dtype;
        // Each add rounds to the output dtype: the sequential-summation bound, k terms.
        match both!(s, run_scatter(&src, axis, &index, &out)) {
            Ok((c, t)) => s.judge(
                "scatter_add",
                &format!("{shape:?} axis {axis} index {ishape:?} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| {
                    2.0 * terms[o] * (U32F + dout.unit_roundoff()) * mag[o] + rounding(dout, w, 2.0)
                },
            ),
            Err(e) => s.fail("scatter_add", format!("{shape:?} axis {axis}: {e}")),
        }
    }
}
