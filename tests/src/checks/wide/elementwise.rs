//! The f64 rows of fill, copy and the elementwise primitives.

use super::*;

fn unary_on<B: Backend>(b: &B, op: UnaryOp, x: &[f64], strided: bool) -> Result<Vec<f64>> {
    let (xl, xn) = layout_of(x.len(), strided);
    let xb = b.upload(&backing(x, &xl, xn))?;
    let ol = Layout::contiguous(&[x.len()]);
    let ob = b.alloc(DType::F64, x.len().max(1))?;
    b.unary(op, View::new(&xb, &xl), View::new(&ob, &ol))?;
    read_at(b, &ob, &ol)
}

fn binary_on<B: Backend>(b: &B, op: BinaryOp, x: &[f64], y: &[f64]) -> Result<Vec<f64>> {
    let l = Layout::contiguous(&[x.len()]);
    let (xb, yb) = (b.upload(x)?, b.upload(y)?);
    let ob = b.alloc(DType::F64, x.len().max(1))?;
    b.binary(
        op,
        View::new(&xb, &l),
        View::new(&yb, &l),
        View::new(&ob, &l),
    )?;
    read_at(b, &ob, &l)
}

fn ternary_on<B: Backend>(b: &B, op: TernaryOp, abc: [&[f64]; 3]) -> Result<Vec<f64>> {
    let l = Layout::contiguous(&[abc[0].len()]);
    let [ab, bb, cb] = [b.upload(abc[0])?, b.upload(abc[1])?, b.upload(abc[2])?];
    let ob = b.alloc(DType::F64, abc[0].len().max(1))?;
    let v = |buf| View::new(buf, &l);
    b.ternary(op, v(&ab), v(&bb), v(&cb), v(&ob))?;
    read_at(b, &ob, &l)
}

/// Elementwise ops on f64, random values and special ones: the correctly rounded ops exactly,
/// the others within a few units of f64's roundoff of the reference's libm.
pub(super) fn unary_binary_ternary<B: Backend>(s: &mut Suite<'_, B>) {
    let mut x = values(s, 517, 8.0);
    x.extend(SPECIAL);
    let y: Vec<f64> = values(s, x.len(), 3.0);
    let attempt = |b: &B| unary_on(b, UnaryOp::Neg, &[1.0], false);
    if offered(s, "f64 unary", "unary", attempt) {
        for (i, op) in UnaryOp::all().into_iter().enumerate() {
            let exact_op = matches!(
                op,
                UnaryOp::Neg
                    | UnaryOp::Abs
                    | UnaryOp::Sqrt
                    | UnaryOp::Recip
                    | UnaryOp::Relu
                    | UnaryOp::Floor
                    | UnaryOp::Ceil
                    | UnaryOp::Round
                    | UnaryOp::Sign
                    | UnaryOp::Square
                    | UnaryOp::Clamp { .. }
                    | UnaryOp::Affine { .. }
            );
            let want: Vec<f64> = x.iter().map(|&v| op.apply_f64(v)).collect();
            let ulps = if exact_op { 0.0 } else { 8.0 };
            match both!(s, unary_on(op, &x, i % 2 == 1)) {
                Ok((c, t)) => s.judge(
                    "f64 unary",
                    &format!("{op:?}"),
                    &c,
                    t.as_deref(),
                    &want,
                    // (Relative to the operand too: Gelu's 1 + erf cancels for negative x.)
                    &|i, w| {
                        let scale = if exact_op {
                            w.abs()
                        } else {
                            w.abs() + x[i].abs()
                        };
                        ulps * U64 * scale + if exact_op { 0.0 } else { 1e-300 }
                    },
                ),
                Err(e) => s.fail("f64 unary", format!("{op:?}: {e}")),
            }
        }
    }
    let attempt = |b: &B| binary_on(b, BinaryOp::Add, &[1.0], &[2.0]);
    if offered(s, "f64 binary", "binary", attempt) {
        let mut y = y.clone();
        y[..SPECIAL.len()].copy_from_slice(&SPECIAL);
        for op in BinaryOp::ALL {
            let approx = matches!(op, BinaryOp::Pow | BinaryOp::Atan2);
            let want: Vec<f64> = x
                .iter()
                .zip(&y)
                .map(|(&a, &b)| op.apply_f64(a, b))
                .collect();
            match both!(s, binary_on(op, &x, &y)) {
                Ok((c, t)) => s.judge(
                    "f64 binary",
                    &format!("{op:?}"),
                    &c,
                    t.as_deref(),
                    &want,
                    &|_, w| {
                        if approx {
                            8.0 * U64 * w.abs() + 1e-300
                        } else {
                            0.0
                        }
                    },
                ),
                Err(e) => s.fail("f64 binary", format!("{op:?}: {e}")),
            }
        }
    }
    let z = values(s, x.len(), 5.0);
    let attempt = |b: &B| ternary_on(b, TernaryOp::Fma, [&[1.0], &[2.0], &[3.0]]);
    if offered(s, "f64 ternary", "ternary", attempt) {
        for op in TernaryOp::ALL {
            let want: Vec<f64> = (0..x.len())
                .map(|i| op.apply_f64(x[i], y[i], z[i]))
                .collect();
            match both!(s, ternary_on(op, [&x, &y, &z])) {
                Ok((c, t)) => s.judge(
                    "f64 ternary",
                    &format!("{op:?}"),
                    &c,
                    t.as_deref(),
                    &want,
                    &|_, _| 0.0,
                ),
                Err(e) => s.fail("f64 ternary", format!("{op:?}: {e}")),
            }
        }
    }
}

fn fill_copy_on<B: Backend>(b: &B, x: &[f64], value: f64) -> Result<Vec<f64>> {
    // fill a strided view, copy x (strided) into the gaps' complement, and cast to f32 and
    // back: every element exact (the cast rounds once to nearest).
    let n = x.len();
    let (sl, sn) = layout_of(n, true);
    let filled = b.alloc(DType::F64, sn)?;
    b.fill(View::new(&filled, &sl), value)?;
    let xb = b.upload(&backing(x, &sl, sn))?;
    let cl = Layout::contiguous(&[n]);
    let copied = b.alloc(DType::F64, n.max(1))?;
    b.copy(View::new(&xb, &sl), View::new(&copied, &cl))?;
    let narrow = b.alloc(DType::F32, n.max(1))?;
    b.copy(View::new(&copied, &cl), View::new(&narrow, &cl))?;
    let mut out = read_at(b, &filled, &sl)?;
    out.extend(read_at(b, &copied, &cl)?);
    out.extend(read_at(b, &narrow, &cl)?);
    Ok(out)
}

pub(super) fn fill_copy<B: Backend>(s: &mut Suite<'_, B>) {
    let mut x = values(s, 300, 1e3);
    x.extend(SPECIAL);
    let value = values(s, 1, 1.0)[0] * 1e-200;
    let attempt = |b: &B| fill_copy_on(b, &[1.0], 0.5);
    if !offered(s, "f64 fill, copy", "copy", attempt) {
        return;
    }
    let mut want = vec![value; x.len()];
    want.extend(&x);
    want.extend(x.iter().map(|&v| v as f32 as f64));
    match both!(s, fill_copy_on(&x, value)) {
        Ok((c, t)) => s.judge(
            "f64 fill, copy",
            "strided fill and copy, f64 to f32",
            &c,
            t.as_deref(),
            &want,
            &|_, _| 0.0,
        ),
        Err(e) => s.fail("f64 fill, copy", e),
    }
}
