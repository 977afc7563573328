//! Checks of fill, copy, unary, binary, ternary.

use super::*;

pub(super) fn run_fill<B: Backend>(b: &B, out: &HostTensor, v: f64) -> Result<Vec<f64>> {
    let buf = out.upload(b)?;
    b.fill(View::new(&buf, &out.layout), v)?;
    read_view(b, &buf, &out.layout)
}

pub(super) fn fill<B: Backend>(s: &mut Suite<'_, B>) {
    for shape in s.shapes(0..=3, 1 << 18) {
        let dtype = DType::NARROW[s.rng().below(5)];
        let out = output_tensor(s.rng(), &shape, dtype);
        let v = if dtype.is_float() {
            s.rng().range(-100.0, 100.0) as f64
        } else {
            (s.rng().below(1000)) as f64
        };
        let exact = vec![round_to(dtype, v as f32) as f64; numel(&shape)];
        match both!(s, run_fill(&out, v)) {
            Ok((c, t)) => s.judge(
                "fill",
                &format!("{shape:?} {dtype}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail("fill", e),
        }
    }
}

pub(super) fn run_copy<B: Backend>(b: &B, src: &HostTensor, out: &HostTensor) -> Result<Vec<f64>> {
    let (sb, ob) = (src.upload(b)?, out.upload(b)?);
    b.copy(View::new(&sb, &src.layout), View::new(&ob, &out.layout))?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn copy<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases = Vec::new();
    for (i, shape) in s.shapes(0..=4, 1 << 18).into_iter().enumerate() {
        // Every other case keeps the dtype (a strided copy), the rest cast.
        let f = s.rng().below(5);
        let from = DType::NARROW[f];
        let to = if i % 2 == 0 {
            from
        } else {
            DType::NARROW[(f + 1 + s.rng().below(4)) % 5]
        };
        cases.push((shape, from, to, s.kind()));
    }
    // Contiguous float casts with ragged tails (autocast's casts; backends may convert four at
    // a time).
    let (f, b16, h16) = (DType::F32, DType::BF16, DType::F16);
    for (shape, from, to) in [
        (vec![2, 999], f, b16),
        (vec![1031], b16, f),
        (vec![4, 257], h16, b16),
    ] {
        cases.push((shape, from, to, ViewKind::Contiguous));
    }
    for (shape, from, to, kind) in cases {
        let src = random_tensor(s.rng(), &shape, from, kind, |r| r.range(-300.0, 300.0));
        let out = output_tensor(s.rng(), &shape, to);
        let exact: Vec<f64> = src
            .logical()
            .iter()
            .map(|&v| round_to(to, v as f32) as f64)
            .collect();
        let name = if from == to {
            "copy (strided)"
        } else {
            "copy (cast)"
        };
        match both!(s, run_copy(&src, &out)) {
            Ok((c, t)) => s.judge(
                name,
                &format!("{shape:?} {from}->{to} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail(name, e),
        }
    }
}

pub(super) fn run_unary<B: Backend>(
    b: &B,
    op: UnaryOp,
    x: &HostTensor,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, ob) = (x.upload(b)?, out.upload(b)?);
    b.unary(op, View::new(&xb, &x.layout), View::new(&ob, &out.layout))?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn erf64(x: f64) -> f64 {
    // The same rational approximation as `hal::erf_f32`, in f64.
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let r = 1.0 - poly * (-x * x).exp();
    if x < 0.0 { -r } else { r }
}

pub(super) fn unary_f64(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Exp2 => x.exp2(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log2 => x.log2(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::LeakyRelu { slope } => {
            if x < 0.0 {
                slope as f64 * x
            } else {
                x
            }
        }
        UnaryOp::Gelu => 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2)),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        UnaryOp::Square => x * x,
        UnaryOp::Affine { scale, shift } => scale as f64 * x + shift as f64,
        UnaryOp::Clamp { lo, hi } => x.max(lo as f64).min(hi as f64),
        UnaryOp::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
    }
}

pub(super) fn is_exact_unary(op: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(
        op,
        Neg | Abs
            | Relu
            | LeakyRelu { .. }
            | Floor
            | Ceil
            | Round
            | Sign
            | Square
            | Affine { .. }
            | Clamp { .. }
    )
}

pub(super) fn unary<B: Backend>(s: &mut Suite<'_, B>) {
    let ops = UnaryOp::all();
    let shapes = s.shapes(0..=4, 1 << 17);
    let mut cases = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        for op in [ops[i % ops.len()], ops[(i * 7 + 3) % ops.len()]] {
            cases.push((
                shape.clone(),
                op,
                s.float_dtype(),
                s.float_dtype(),
                s.kind(),
            ));
        }
    }
    // Contiguous 16-bit operands with a ragged tail (the pattern backends may read four at a
    // time, converting as they go).
    let (b16, h16, f) = (DType::BF16, DType::F16, DType::F32);
    let contiguous = ViewKind::Contiguous;
    cases.push((vec![3, 1001], UnaryOp::Gelu, b16, b16, contiguous));
    cases.push((vec![1027], UnaryOp::Exp, f, h16, contiguous));
    cases.push((vec![2, 515], UnaryOp::Tanh, h16, f, contiguous));
    for (shape, op, din, dout, kind) in cases {
        let shape = &shape;
        {
            let (lo, hi) = match op {
                UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Sqrt | UnaryOp::Rsqrt => (0.05, 8.0),
                UnaryOp::Exp | UnaryOp::Exp2 => (-6.0, 6.0),
                _ => (-4.0, 4.0),
            };
            let x = random_tensor(s.rng(), shape, din, kind, |r| {
                let v = r.range(lo, hi);
                if matches!(op, UnaryOp::Recip) && v.abs() < 0.05 {
                    0.5
                } else {
                    v
                }
            });
            let out = output_tensor(s.rng(), shape, dout);
            let exact: Vec<f64> = x.logical().iter().map(|&v| unary_f64(op, v)).collect();
            let u = dout.unit_roundoff();
            let (rel, abs) = if is_exact_unary(op) {
                (2.0 * u + 2.0 * U32F, 0.0)
            } else {
                (4.0 * u + 2f64.powi(-18), 2f64.powi(-19))
            };
            match both!(s, run_unary(op, &x, &out)) {
                Ok((c, t)) => s.judge(
                    "unary",
                    &format!("{op:?} {shape:?} {din}->{dout} {kind:?}"),
                    &c,
                    t.as_deref(),
                    &exact,
                    &|_, w| rel * w.abs() + abs + rounding(dout, 0.0, 2.0),
                ),
                Err(e) => s.fail("unary", format!("{op:?} {shape:?}: {e}")),
            }
        }
    }
}

pub(super) fn run_binary<B: Backend>(
    b: &B,
    op: BinaryOp,
    x: &HostTensor,
    y: &HostTensor,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, yb, ob) = (x.upload(b)?, y.upload(b)?, out.upload(b)?);
    b.binary(
        op,
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn binary_f64(op: BinaryOp, a: f64, b: f64) -> f64 {
    let flag = |c: bool| if c { 1.0 } else { 0.0 };
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Rem => a - b * (a / b).floor(),
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        BinaryOp::Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        BinaryOp::Atan2 => a.atan2(b),
        BinaryOp::Eq => flag(a == b),
        BinaryOp::Ne => flag(a != b),
        BinaryOp::Lt => flag(a < b),
        BinaryOp::Le => flag(a <= b),
        BinaryOp::Gt => flag(a > b),
        BinaryOp::Ge => flag(a >= b),
    }
}

/// A copy of `shape` with some dimensions set to 1 and maybe leading ones dropped, so the
/// operand broadcasts inside the primitive.
pub(super) fn broadcastable(rng: &mut TestRng, shape: &[usize]) -> Vec<usize> {
    let mut s: Vec<usize> = shape
        .iter()
        .map(|&d| if rng.below(3) == 0 { 1 } else { d })
        .collect();
    let drop = rng.below(s.len() + 1);
    s.drain(..drop.min(s.len()));
    s
}

/// Values of `t` broadcast to `shape` in row-major order.
pub(super) fn broadcast_logical(t: &HostTensor, shape: &[usize]) -> Vec<f64> {
    let l = t.layout.broadcast_to(shape).expect("broadcastable");
    logical(&t.backing, &l)
}

pub(super) fn binary<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(0..=4, 1 << 17);
    let mut cases = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        for op in [BinaryOp::ALL[i % 15], BinaryOp::ALL[(i * 4 + 9) % 15]] {
            let (da, db, kind) = (s.float_dtype(), s.float_dtype(), s.kind());
            let dout = if op.is_comparison() && s.rng().below(2) == 0 {
                DType::U32
            } else {
                s.float_dtype()
            };
            let bshape = broadcastable(s.rng(), shape);
            cases.push((shape.clone(), bshape, op, [da, db, dout], kind));
        }
    }
    // Biases over f32 contiguous operands (the pattern backends may read four at a time):
    // per channel of a channel-major output, per feature of a batch, and a run of 10.
    let f = DType::F32;
    for (shape, bshape, op) in [
        (vec![8, 12, 20], vec![1, 12, 1], BinaryOp::Add),
        (vec![64, 36], vec![36], BinaryOp::Mul),
        (vec![3, 12, 10], vec![12, 1], BinaryOp::Sub),
    ] {
        cases.push((shape, bshape, op, [f, f, f], ViewKind::Contiguous));
    }
    // Contiguous mixed and 16-bit operands of one shape, ragged tails: a 16-bit branch added
    // to an f32 residual, a bf16 product.
    let (b16, h16) = (DType::BF16, DType::F16);
    for (shape, op, dtypes) in [
        (vec![5, 403], BinaryOp::Add, [b16, f, f]),
        (vec![1029], BinaryOp::Mul, [b16, b16, b16]),
        (vec![3, 7, 9], BinaryOp::Sub, [f, h16, b16]),
    ] {
        cases.push((shape.clone(), shape, op, dtypes, ViewKind::Contiguous));
    }
    for (shape, bshape, op, [da, db, dout], kind) in cases {
        let shape = &shape;
        let gen_a = move |r: &mut TestRng| match op {
            BinaryOp::Pow => r.range(0.1, 3.0),
            _ if op.is_comparison() => (r.below(9) as f32 - 4.0) / 4.0,
            _ => r.range(-4.0, 4.0),
        };
        let gen_b = move |r: &mut TestRng| match op {
            BinaryOp::Pow => r.range(-2.0, 2.0),
            BinaryOp::Div | BinaryOp::Rem => {
                let v = r.range(0.25, 4.0);
                if r.below(2) == 0 { -v } else { v }
            }
            _ if op.is_comparison() => (r.below(9) as f32 - 4.0) / 4.0,
            _ => r.range(-4.0, 4.0),
        };
        let x = random_tensor(s.rng(), shape, da, kind, gen_a);
        let y = random_tensor(s.rng(), &bshape, db, ViewKind::Contiguous, gen_b);
        let out = output_tensor(s.rng(), shape, dout);
        let (xa, yb) = (x.logical(), broadcast_logical(&y, shape));
        let exact: Vec<f64> = xa
            .iter()
            .zip(&yb)
            .map(|(&a, &b)| binary_f64(op, a, b))
            .collect();
        let u = dout.unit_roundoff();
        let transcendental = matches!(op, BinaryOp::Pow | BinaryOp::Atan2);
        let (rel, abs) = if transcendental {
            (4.0 * u + 2f64.powi(-16), 2f64.powi(-20))
        } else {
            (2.0 * u + 4.0 * U32F, 0.0)
        };
        // Rem: floor(a/b) in f32 vs f64 can differ by one at exact multiples; allow |b| there.
        let rem_slack: Vec<f64> = if op == BinaryOp::Rem {
            xa.iter().zip(&yb).map(|(a, b)| a.abs() + b.abs()).collect()
        } else {
            Vec::new()
        };
        let tol = |i: usize, w: f64| {
            rel * w.abs()
                + abs
                + rounding(dout, 0.0, 2.0)
                + if op == BinaryOp::Rem {
                    2f64.powi(-20) * rem_slack[i]
                } else {
                    0.0
                }
        };
        match both!(s, run_binary(op, &x, &y, &out)) {
            Ok((c, t)) => {
                let name = if op.is_comparison() {
                    "binary (comparison)"
                } else {
                    "binary"
                };
                s.judge(
                    name,
                    &format!("{op:?} {shape:?} with {bshape:?} {da},{db}->{dout} {kind:?}"),
                    &c,
                    t.as_deref(),
                    &exact,
                    &tol,
                )
            }
            Err(e) => s.fail("binary", format!("{op:?} {shape:?} with {bshape:?}: {e}")),
        }
    }
}

pub(super) fn run_ternary<B: Backend>(
    b: &B,
    op: TernaryOp,
    x: &HostTensor,
    y: &HostTensor,
    z: &HostTensor,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, yb, zb, ob) = (x.upload(b)?, y.upload(b)?, z.upload(b)?, out.upload(b)?);
    b.ternary(
        op,
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&zb, &z.layout),
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn ternary<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(0..=4, 1 << 17);
    for (i, shape) in shapes.iter().enumerate() {
        let op = TernaryOp::ALL[i % 3];
        let dcond = if op == TernaryOp::Where && s.rng().below(2) == 0 {
            DType::U32
        } else {
            s.float_dtype()
        };
        let kind = s.kind();
        let x = random_tensor(s.rng(), shape, dcond, kind, move |r| {
            if op == TernaryOp::Where {
                r.below(2) as f32
            } else {
                r.range(-2.0, 2.0)
            }
        });
        let (ys, zs) = (broadcastable(s.rng(), shape), broadcastable(s.rng(), shape));
        let (dy, dz, dout) = (s.float_dtype(), s.float_dtype(), s.float_dtype());
        let y = random_tensor(s.rng(), &ys, dy, ViewKind::Contiguous, |r| {
            r.range(-2.0, 2.0)
        });
        let z = random_tensor(s.rng(), &zs, dz, ViewKind::Flipped, |r| r.range(-2.0, 2.0));
        let out = output_tensor(s.rng(), shape, dout);
        let (a, b, c) = (
            x.logical(),
            broadcast_logical(&y, shape),
            broadcast_logical(&z, shape),
        );
        let exact: Vec<f64> = (0..a.len())
            .map(|i| match op {
                TernaryOp::Where => {
                    if a[i] != 0.0 {
                        b[i]
                    } else {
                        c[i]
                    }
                }
                TernaryOp::Fma => a[i] * b[i] + c[i],
                TernaryOp::Lerp => b[i] + a[i] * (c[i] - b[i]),
            })
            .collect();
        let mags: Vec<f64> = (0..a.len())
            .map(|i| a[i].abs() * (b[i].abs() + c[i].abs()) + b[i].abs() + c[i].abs())
            .collect();
        match both!(s, run_ternary(op, &x, &y, &z, &out)) {
            Ok((cv, t)) => s.judge(
                "ternary",
                &format!("{op:?} {shape:?} {kind:?}"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, w| rounding(dout, w, 2.0) + 4.0 * U32F * mags[i],
            ),
            Err(e) => s.fail("ternary", format!("{op:?} {shape:?}: {e}")),
        }
    }
}
