//! The f64 rows of arg_reduce (the reduce family), im2col/col2im (conv) and sgd_step
//! (optim), whose f32 rows live with their families.

use super::*;

fn arg_reduce_on<B: Backend>(b: &B, x: &[f64], rows: usize) -> Result<Vec<f64>> {
    let cols = x.len() / rows;
    let (xl, ol) = (
        Layout::contiguous(&[rows, cols]),
        Layout::contiguous(&[rows, 1]),
    );
    let xb = b.upload(x)?;
    let (mx, mn) = (b.alloc(DType::U32, rows)?, b.alloc(DType::U32, rows)?);
    b.arg_reduce(
        ArgReduceOp::ArgMax,
        View::new(&xb, &xl),
        1,
        View::new(&mx, &ol),
    )?;
    b.arg_reduce(
        ArgReduceOp::ArgMin,
        View::new(&xb, &xl),
        1,
        View::new(&mn, &ol),
    )?;
    let mut r = b.read_f64(&mx)?;
    r.extend(b.read_f64(&mn)?);
    Ok(r)
}

/// Arg-reductions on f64 values that round alike in f32 (a row of neighbours one f64 ulp
/// apart): the exact index, which f32 arithmetic could not tell.
pub(super) fn arg_reduce<B: Backend>(s: &mut Suite<'_, B>) {
    let attempt = |b: &B| arg_reduce_on(b, &[1.0], 1);
    if !offered(s, "f64 arg_reduce", "arg_reduce", attempt) {
        return;
    }
    let (rows, cols) = (37usize, 1001usize);
    let mut x = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let base = values(s, 1, 100.0)[0];
        let (hi, lo) = (s.rng().below(cols), s.rng().below(cols));
        for c in 0..cols {
            // Every value within a few ulps of `base`: the extremes differ by one ulp.
            let v = if c == hi {
                base + base.abs() * 4.0 * f64::EPSILON
            } else if c == lo && lo != hi {
                base - base.abs() * 4.0 * f64::EPSILON
            } else {
                base + base.abs() * f64::EPSILON * (c % 3) as f64
            };
            x.push(if r == 0 && c == 5 { f64::NAN } else { v });
        }
    }
    let argmax = |row: &[f64]| -> f64 {
        let mut best = 0;
        for (i, &v) in row.iter().enumerate() {
            if v.is_nan() {
                return i as f64;
            }
            if v > row[best] {
                best = i;
            }
        }
        best as f64
    };
    let argmin = |row: &[f64]| -> f64 {
        let mut best = 0;
        for (i, &v) in row.iter().enumerate() {
            if v.is_nan() {
                return i as f64;
            }
            if v < row[best] {
                best = i;
            }
        }
        best as f64
    };
    let mut want: Vec<f64> = x.chunks(cols).map(argmax).collect();
    want.extend(x.chunks(cols).map(argmin));
    match both!(s, arg_reduce_on(&x, rows)) {
        Ok((c, t)) => s.judge(
            "f64 arg_reduce",
            "37 rows of 1001 values an ulp apart, a NaN",
            &c,
            t.as_deref(),
            &want,
            &|_, _| 0.0,
        ),
        Err(e) => s.fail("f64 arg_reduce", e),
    }
}

fn image_on<B: Backend>(b: &B, x: &[f64], g: &Conv2dGeometry) -> Result<Vec<f64>> {
    let (oh, ow) = g.output_size().expect("valid geometry");
    let rows = g.channels * g.kernel.0 * g.kernel.1;
    let xl = Layout::contiguous(&[g.batch, g.channels, g.height, g.width]);
    let cl = Layout::contiguous(&[g.batch, rows, oh * ow]);
    let xb = b.upload(x)?;
    let cols = b.alloc(DType::F64, cl.numel())?;
    b.im2col(View::new(&xb, &xl), g, View::new(&cols, &cl))?;
    let back = b.alloc(DType::F64, xl.numel())?;
    b.col2im(View::new(&cols, &cl), g, View::new(&back, &xl))?;
    let mut r = b.read_f64(&cols)?;
    r.extend(b.read_f64(&back)?);
    Ok(r)
}

/// im2col moves f64 values exactly; col2im sums each pixel's copies (a few terms).
pub(super) fn images<B: Backend>(s: &mut Suite<'_, B>) {
    let g = Conv2dGeometry {
        batch: 2,
        channels: 3,
        height: 7,
        width: 9,
        kernel: (3, 2),
        stride: (2, 1),
        padding: (1, 1),
        dilation: (1, 2),
    };
    let tiny = Conv2dGeometry {
        batch: 1,
        channels: 1,
        height: 1,
        width: 1,
        kernel: (1, 1),
        stride: (1, 1),
        padding: (0, 0),
        dilation: (1, 1),
    };
    let attempt = |b: &B| image_on(b, &[1.0], &tiny);
    if !offered(s, "f64 im2col, col2im", "im2col", attempt) {
        return;
    }
    let x = values(s, g.batch * g.channels * g.height * g.width, 1e6);
    let (oh, ow) = g.output_size().expect("valid");
    let rows = g.channels * g.kernel.0 * g.kernel.1;
    let mut cols = vec![0.0; g.batch * rows * oh * ow];
    let mut back = vec![Dd::default(); x.len()];
    let mut abs = vec![0.0; x.len()];
    for n in 0..g.batch {
        for r in 0..rows {
            let (c, i, j) = (
                r / (g.kernel.0 * g.kernel.1),
                (r / g.kernel.1) % g.kernel.0,
                r % g.kernel.1,
            );
            for oy in 0..oh {
                for ox in 0..ow {
                    let iy = (oy * g.stride.0 + i * g.dilation.0) as isize - g.padding.0 as isize;
                    let ix = (ox * g.stride.1 + j * g.dilation.1) as isize - g.padding.1 as isize;
                    let inside =
                        iy >= 0 && ix >= 0 && (iy as usize) < g.height && (ix as usize) < g.width;
                    if inside {
                        let at =
                            ((n * g.channels + c) * g.height + iy as usize) * g.width + ix as usize;
                        cols[(n * rows + r) * oh * ow + oy * ow + ox] = x[at];
                        back[at] = back[at].add(x[at]);
                        abs[at] += x[at].abs();
                    }
                }
            }
        }
    }
    let n_cols = cols.len();
    let mut want = cols;
    want.extend(back.iter().map(|d| d.value()));
    match both!(s, image_on(&x, &g)) {
        Ok((c, t)) => s.judge(
            "f64 im2col, col2im",
            "2x3x7x9, kernel 3x2, stride (2, 1), padding 1, dilation (1, 2)",
            &c,
            t.as_deref(),
            &want,
            &|i, w| {
                if i < n_cols {
                    0.0
                } else {
                    8.0 * U64 * (abs[i - n_cols] + w.abs())
                }
            },
        ),
        Err(e) => s.fail("f64 im2col, col2im", e),
    }
}

fn sgd_on<B: Backend>(b: &B, p: &[f64], g: &[f64], h: &SgdParams) -> Result<Vec<f64>> {
    let [pb, gb] = [b.upload(p)?, b.upload(g)?];
    let mb = b.alloc(DType::F64, p.len())?;
    for step in 1..=3 {
        b.sgd_step(&pb, &gb, Some(&mb), &SgdParams { step, ..*h })?;
    }
    b.read_f64(&pb)
}

/// SGD with momentum and Nesterov in f64, three steps, against the update in f64.
pub(super) fn sgd<B: Backend>(s: &mut Suite<'_, B>) {
    let h = SgdParams {
        lr: 0.05,
        momentum: 0.9,
        dampening: 0.1,
        weight_decay: 1e-3,
        nesterov: true,
        step: 1,
    };
    let attempt = |b: &B| sgd_on(b, &[1.0], &[1.0], &h);
    if !offered(s, "f64 sgd_step", "sgd_step", attempt) {
        return;
    }
    let p = values(s, 1031, 3.0);
    let g = values(s, 1031, 1.0);
    let (lr, mom, damp, wd) = (
        h.lr as f64,
        h.momentum as f64,
        h.dampening as f64,
        h.weight_decay as f64,
    );
    let mut want = p.clone();
    let mut buf = vec![0.0; p.len()];
    for step in 1..=3 {
        for i in 0..p.len() {
            let gi = g[i] + wd * want[i];
            buf[i] = if step == 1 {
                gi
            } else {
                mom * buf[i] + (1.0 - damp) * gi
            };
            want[i] -= lr * (gi + mom * buf[i]);
        }
    }
    match both!(s, sgd_on(&p, &g, &h)) {
        Ok((c, t)) => s.judge(
            "f64 sgd_step",
            "three Nesterov steps",
            &c,
            t.as_deref(),
            &want,
            &|_, w| 8.0 * U64 * w.abs().max(1.0),
        ),
        Err(e) => s.fail("f64 sgd_step", e),
    }
}
