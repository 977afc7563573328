//! The f64 rows of IR programs: arithmetic (correctly rounded, so exact against the host)
//! and the mathematical functions (within a few units in the last place of the host's).

use super::*;

/// An f64 program: loads, fma, division, sqrt, comparisons, selects and casts, all correctly
/// rounded (so exact against the host), and a conditional store.
fn program_on<B: Backend>(b: &B, x: &[f64], y: &[f64]) -> Result<Vec<f64>> {
    let mut p = ProgramBuilder::new("f64_parity");
    let (xb, yb) = (
        p.buffer(DType::F64, Access::Read),
        p.buffer(DType::F64, Access::Read),
    );
    let out = p.buffer(DType::F64, Access::Write);
    let narrow = p.buffer(DType::F32, Access::Write);
    let i = p.index();
    let (xv, yv) = (p.load(xb, i), p.load(yb, i));
    let f = p.fma(xv, yv, xv);
    let q = p.div(f, yv);
    let a = p.unary(IrUnary::Abs, q);
    let r = p.unary(IrUnary::Sqrt, a);
    let zero = p.const_f64(0.0);
    let neg = p.cmp(IrCmp::Lt, xv, zero);
    let tenth = p.const_f64(0.1);
    let shifted = p.binary(IrBinary::Sub, r, tenth);
    let v = p.select(neg, shifted, r);
    p.store(out, i, v);
    let n32 = p.cast(ScalarType::F32, v);
    p.store(narrow, i, n32);
    let program = p.build()?;
    let n = x.len();
    let k = b.compile(&program)?;
    let (xg, yg) = (b.upload(x)?, b.upload(y)?);
    let (og, ng) = (b.alloc(DType::F64, n)?, b.alloc(DType::F32, n)?);
    b.launch(&k, &[&xg, &yg, &og, &ng], n)?;
    let mut r = b.read_f64(&og)?;
    r.extend(b.read_f64(&ng)?);
    Ok(r)
}

pub(super) fn programs<B: Backend>(s: &mut Suite<'_, B>) {
    let attempt = |b: &B| program_on(b, &[1.0], &[1.0]);
    if !offered(s, "f64 ir program", "launch", attempt) {
        return;
    }
    let n = 100_001;
    let x = values(s, n, 10.0);
    let y = values(s, n, 3.0);
    let mut want: Vec<f64> = x
        .iter()
        .zip(&y)
        .map(|(&x, &y)| {
            let r = (x.mul_add(y, x) / y).abs().sqrt();
            if x < 0.0 { r - 0.1 } else { r }
        })
        .collect();
    let narrow: Vec<f64> = want.iter().map(|&v| v as f32 as f64).collect();
    want.extend(narrow);
    // Correctly rounded on the CPU and in CUDA (IEEE division and square root); the wgpu
    // backend refines the Vulkan driver's approximate f64 division and square root to within
    // about one unit, and a value one unit off may round to a neighbouring f32.
    let gpu_ulps = if s.target.info().backend == "wgpu" {
        4.0
    } else {
        0.0
    };
    match both!(s, program_on(&x, &y)) {
        Ok((c, t)) => s.judge(
            "f64 ir program",
            "fma, div, sqrt, select, cast",
            &c,
            t.as_deref(),
            &want,
            // (Relative to the value before `- 0.1`, which cancels digits.)
            &|i, w| {
                let ulp = if i < n { U64 } else { f32::EPSILON as f64 };
                gpu_ulps * ulp * (w.abs() + 0.1)
            },
        ),
        Err(e) => s.fail("f64 ir program", e),
    }
}

/// `exp`, `exp2`, `log`, `log2`, `tanh` of `x`; `sin`, `cos`, `tan` of `y`; `pow`, `atan2`
/// and `rem` of both: one output buffer each, in that order.
fn math_on<B: Backend>(b: &B, x: &[f64], y: &[f64]) -> Result<Vec<f64>> {
    let mut p = ProgramBuilder::new("f64_math");
    let (xb, yb) = (
        p.buffer(DType::F64, Access::Read),
        p.buffer(DType::F64, Access::Read),
    );
    let i = p.index();
    let (xv, yv) = (p.load(xb, i), p.load(yb, i));
    let mut results = Vec::new();
    for (op, v) in [
        (IrUnary::Exp, xv),
        (IrUnary::Exp2, xv),
        (IrUnary::Log, xv),
        (IrUnary::Log2, xv),
        (IrUnary::Tanh, xv),
        (IrUnary::Sin, yv),
        (IrUnary::Cos, yv),
        (IrUnary::Tan, yv),
    ] {
        results.push(p.unary(op, v));
    }
    for op in [IrBinary::Pow, IrBinary::Atan2, IrBinary::Rem] {
        results.push(p.binary(op, xv, yv));
    }
    let outs: Vec<_> = results
        .iter()
        .map(|_| p.buffer(DType::F64, Access::Write))
        .collect();
    for (&o, &r) in outs.iter().zip(&results) {
        p.store(o, i, r);
    }
    let program = p.build()?;
    let n = x.len();
    let k = b.compile(&program)?;
    let (xg, yg) = (b.upload(x)?, b.upload(y)?);
    let bufs: Vec<B::Buffer> = outs
        .iter()
        .map(|_| b.alloc(DType::F64, n))
        .collect::<Result<_>>()?;
    let mut args = vec![&xg, &yg];
    args.extend(bufs.iter());
    b.launch(&k, &args, n)?;
    let mut r = Vec::new();
    for o in &bufs {
        r.extend(b.read_f64(o)?);
    }
    Ok(r)
}

/// The host's value of each `math_on` output.
fn math_host(x: f64, y: f64) -> [f64; 11] {
    [
        x.exp(),
        x.exp2(),
        x.ln(),
        x.log2(),
        x.tanh(),
        y.sin(),
        y.cos(),
        y.tan(),
        x.powf(y),
        x.atan2(y),
        x % y,
    ]
}

/// Arguments that reach every region of the functions: near 1, across exp's range, across
/// f64's whole range (both signs), and the special values paired with each other; `y` is
/// moderate, an integer (a negative base's power), or up to 1e5 (where sine's argument
/// reduction works hardest).
fn math_arguments<B: Backend>(s: &mut Suite<'_, B>, n: usize) -> (Vec<f64>, Vec<f64>) {
    let uniform = |s: &mut Suite<'_, B>| (s.rng().next_u64() >> 11) as f64 * 2f64.powi(-53);
    let (mut x, mut y) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let (u, v, w) = (uniform(s), uniform(s), uniform(s));
        let sign = if w < 0.25 { -1.0 } else { 1.0 };
        x.push(match i % 4 {
            0 => 4.0 * u - 2.0,
            1 => sign * 10f64.powf(5.85 * u - 3.0),
            2 => sign * 10f64.powf(600.0 * u - 300.0),
            _ => 0.5 + 1.5 * u,
        });
        y.push(match i % 3 {
            0 => 8.0 * v - 4.0,
            1 => (40.0 * v - 20.0).round(),
            _ => 2e5 * v - 1e5,
        });
    }
    for a in SPECIAL {
        for b in SPECIAL {
            x.push(a);
            y.push(b);
        }
    }
    (x, y)
}

pub(super) fn math<B: Backend>(s: &mut Suite<'_, B>) {
    let attempt = |b: &B| math_on(b, &[1.0], &[1.0]);
    if !offered(s, "f64 ir math", "launch", attempt) {
        return;
    }
    if !s.target_is_reference && !s.target.capabilities().f64.program_math {
        // Programs run in f64 here, their mathematics not: it must be refused.
        match math_on(s.target, &[1.0], &[1.0]) {
            Err(hal::Error::UnsupportedDType { .. }) => s.pass("f64 ir math"),
            other => s.fail("f64 ir math", format!("not refused: {other:?}")),
        }
        return;
    }
    let (x, y) = math_arguments(s, 20_011);
    let n = x.len();
    let host: Vec<[f64; 11]> = x.iter().zip(&y).map(|(&a, &b)| math_host(a, b)).collect();
    let want: Vec<f64> = (0..11)
        .flat_map(|j| host.iter().map(move |h| h[j]))
        .collect();
    // The CPU computes with the host's functions (exactly these values); the GPUs within 4
    // units in the last place of them (their libraries: CUDA's libdevice, math_wide.wgsl for
    // wgpu), `rem` exactly.
    match both!(s, math_on(&x, &y)) {
        Ok((c, t)) => s.judge(
            "f64 ir math",
            "exp, exp2, log, log2, tanh, sin, cos, tan, pow, atan2, rem",
            &c,
            t.as_deref(),
            &want,
            &|i, w| {
                if t.is_none() || i / n == 10 {
                    0.0
                } else {
                    8.0 * U64 * w.abs().max(f64::MIN_POSITIVE) + 4.0 * 5e-324
                }
            },
        ),
        Err(e) => s.fail("f64 ir math", e),
    }
}
