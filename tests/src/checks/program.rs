//! Checks of the scalar program IR: edge cases, math, masked stores.

use super::*;

/// An edge-length residual with its gradient scattered by atomic adds: 40-odd instructions
/// touching loads by computed index, arithmetic, sqrt, division, select, casts and atomics.
pub(super) fn edge_program() -> hal::ir::Program {
    let mut b = ProgramBuilder::new("edge_length_residual");
    let pts = b.buffer(DType::F32, Access::Read);
    let edges = b.buffer(DType::U32, Access::Read);
    let rest = b.buffer(DType::F32, Access::Read);
    let resid = b.buffer(DType::F32, Access::Write);
    let grad = b.buffer(DType::F32, Access::ReadWrite);
    let hits = b.buffer(DType::U32, Access::ReadWrite);
    let e = b.index();
    let two = b.const_u32(2);
    let three = b.const_u32(3);
    let one = b.const_u32(1);
    let e2 = b.mul(e, two);
    let e2p1 = b.add(e2, one);
    let (ia, ib) = (b.load(edges, e2), b.load(edges, e2p1));
    let (ba, bb) = (b.mul(ia, three), b.mul(ib, three));
    let mut diffs = Vec::new();
    for k in 0..3u32 {
        let kk = b.const_u32(k);
        let (pa, pb) = (b.add(ba, kk), b.add(bb, kk));
        let (va, vb) = (b.load(pts, pa), b.load(pts, pb));
        diffs.push((b.sub(va, vb), pa, pb));
    }
    let sq0 = b.mul(diffs[0].0, diffs[0].0);
    let sq1 = b.fma(diffs[1].0, diffs[1].0, sq0);
    let sq2 = b.fma(diffs[2].0, diffs[2].0, sq1);
    let len = b.unary(IrUnary::Sqrt, sq2);
    let r0 = b.load(rest, e);
    let r = b.sub(len, r0);
    b.store(resid, e, r);
    // d r / d a_k = diff_k / len (guarded: 0 for a degenerate edge)
    let tiny = b.const_f32(1e-12);
    let degenerate = b.cmp(IrCmp::Lt, len, tiny);
    let zero = b.const_f32(0.0);
    let inv = b.unary(IrUnary::Recip, len);
    let inv = b.select(degenerate, zero, inv);
    let rinv = b.mul(r, inv);
    for &(dk, pa, pb) in &diffs {
        let gk = b.mul(rinv, dk);
        let ngk = b.unary(IrUnary::Neg, gk);
        b.atomic_add(grad, pa, gk);
        b.atomic_add(grad, pb, ngk);
    }
    // Count edges per vertex through integer atomics, and mark long edges via a cast.
    b.atomic_add(hits, ia, one);
    b.atomic_add(hits, ib, one);
    b.build().expect("valid program")
}

pub(super) fn run_edge<B: Backend>(
    b: &B,
    pts: &[f32],
    edges: &[u32],
    rest: &[f32],
) -> Result<Vec<f64>> {
    let k = b.compile(&edge_program())?;
    let ne = rest.len();
    let (pb, eb, rb) = (b.upload(pts)?, b.upload(edges)?, b.upload(rest)?);
    let (res, grad, hits) = (
        b.alloc(DType::F32, ne)?,
        b.alloc(DType::F32, pts.len())?,
        b.alloc(DType::U32, pts.len() / 3)?,
    );
    b.launch(&k, &[&pb, &eb, &rb, &res, &grad, &hits], ne)?;
    let mut out: Vec<f64> = b.read::<f32>(&res)?.into_iter().map(f64::from).collect();
    out.extend(b.read::<f32>(&grad)?.into_iter().map(f64::from));
    out.extend(b.read::<u32>(&hits)?.into_iter().map(f64::from));
    Ok(out)
}

/// One instruction of every other kind: transcendental functions, integer arithmetic,
/// comparisons, selects and casts, on f16 input and bf16 output.
pub(super) fn math_program() -> hal::ir::Program {
    let mut b = ProgramBuilder::new("ir_math");
    let x = b.buffer(DType::F16, Access::Read);
    let y = b.buffer(DType::BF16, Access::Write);
    let z = b.buffer(DType::I32, Access::Write);
    let i = b.index();
    let v = b.load(x, i);
    let mut acc = b.const_f32(0.0);
    let a = b.unary(IrUnary::Abs, v);
    let small = b.const_f32(0.1);
    let pos = b.binary(IrBinary::Max, a, small);
    for op in [
        IrUnary::Sqrt,
        IrUnary::Rsqrt,
        IrUnary::Recip,
        IrUnary::Log,
        IrUnary::Log2,
    ] {
        let t = b.unary(op, pos);
        acc = b.add(acc, t);
    }
    for op in [
        IrUnary::Exp,
        IrUnary::Exp2,
        IrUnary::Sin,
        IrUnary::Cos,
        IrUnary::Tan,
        IrUnary::Tanh,
        IrUnary::Floor,
        IrUnary::Ceil,
        IrUnary::Neg,
    ] {
        let t = b.unary(op, v);
        acc = b.add(acc, t);
    }
    let p = b.binary(IrBinary::Pow, pos, v);
    let at = b.binary(IrBinary::Atan2, v, pos);
    let rm = b.binary(IrBinary::Rem, v, pos);
    let mn = b.binary(IrBinary::Min, p, at);
    let dv = b.div(rm, pos);
    acc = b.add(acc, mn);
    acc = b.add(acc, dv);
    b.store(y, i, acc);
    // Integer path: ((i * 7) xor (i >> 1)) % 13 - 6, then select against a float comparison.
    let seven = b.const_u32(7);
    let one = b.const_u32(1);
    let thirteen = b.const_u32(13);
    let m7 = b.mul(i, seven);
    let sh = b.binary(IrBinary::Shr, i, one);
    let xo = b.binary(IrBinary::Xor, m7, sh);
    let md = b.binary(IrBinary::Rem, xo, thirteen);
    let si = b.cast(ScalarType::I32, md);
    let six = b.const_i32(6);
    let centered = b.sub(si, six);
    let neg = b.cmp(IrCmp::Lt, v, small);
    let notneg = b.unary(IrUnary::Not, neg);
    let absd = b.unary(IrUnary::Abs, centered);
    let fromf = b.cast(ScalarType::I32, acc);
    let chosen = b.select(notneg, absd, fromf);
    b.store(z, i, chosen);
    b.build().expect("valid program")
}

pub(super) fn math_f64(v: f64, i: u32) -> (f64, f64) {
    let pos = v.abs().max(0.1f32 as f64);
    let mut acc = pos.sqrt() + 1.0 / pos.sqrt() + 1.0 / pos + pos.ln() + pos.log2();
    acc += v.exp() + v.exp2() + v.sin() + v.cos() + v.tan() + v.tanh() + v.floor() + v.ceil() - v;
    let p = pos.powf(v);
    let at = v.atan2(pos);
    let rm = v % pos;
    acc += p.min(at) + rm / pos;
    let md = ((i.wrapping_mul(7)) ^ (i >> 1)) % 13;
    let centered = md as i64 - 6;
    let z = if v >= 0.1f32 as f64 {
        centered.abs() as f64
    } else {
        (acc as f32) as i32 as f64
    };
    (acc, z)
}

pub(super) fn run_math<B: Backend>(b: &B, x: &[f32]) -> Result<Vec<f64>> {
    let k = b.compile(&math_program())?;
    let xb = b.upload_bytes(DType::F16, &crate::host::bytes_of(DType::F16, x))?;
    let (yb, zb) = (
        b.alloc(DType::BF16, x.len())?,
        b.alloc(DType::I32, x.len())?,
    );
    b.launch(&k, &[&xb, &yb, &zb], x.len())?;
    let mut out: Vec<f64> = b.read_f32(&yb)?.into_iter().map(f64::from).collect();
    out.extend(b.read::<i32>(&zb)?.into_iter().map(f64::from));
    Ok(out)
}

/// `y[i] = 2 x[i]` where `x[i] > 0`, nothing elsewhere; and a store far out of range under a
/// condition that never holds, which must not fault.
pub(super) fn masked_program() -> hal::ir::Program {
    let mut b = ProgramBuilder::new("ir_masked");
    let x = b.buffer(DType::F32, Access::Read);
    let y = b.buffer(DType::F32, Access::Write);
    let i = b.index();
    let v = b.load(x, i);
    let zero = b.const_f32(0.0);
    let positive = b.cmp(IrCmp::Gt, v, zero);
    let twice = b.add(v, v);
    b.store_if(positive, y, i, twice);
    let huge = b.const_f32(100.0);
    let never = b.cmp(IrCmp::Gt, v, huge);
    let far = b.const_u32(1 << 30);
    let out_of_range = b.add(i, far);
    b.store_if(never, y, out_of_range, v);
    b.build().expect("a valid program")
}

pub(super) fn run_masked<B: Backend>(b: &B, x: &[f32]) -> Result<Vec<f64>> {
    let k = b.compile(&masked_program())?;
    let xb = b.upload(x)?;
    let yb = b.upload(&vec![-7.0f32; x.len()])?;
    b.launch(&k, &[&xb, &yb], x.len())?;
    Ok(b.read::<f32>(&yb)?.into_iter().map(f64::from).collect())
}

/// `y[i]` = word 0 of the stream in `stream` ([`hal::random::stream_words`]) at `offset + i`.
pub(super) fn random_bits_program() -> hal::ir::Program {
    let mut b = ProgramBuilder::new("ir_random_bits");
    let stream = b.buffer(DType::U32, Access::Read);
    let y = b.buffer(DType::U32, Access::Write);
    let i = b.index();
    let bits = hal::random::stream_bits(&mut b, stream, i);
    b.store(y, i, bits);
    b.build().expect("a valid program")
}

pub(super) fn run_random_bits<B: Backend>(
    b: &B,
    n: usize,
    seed: u64,
    offset: u64,
) -> Result<Vec<f64>> {
    let k = b.compile(&random_bits_program())?;
    let stream = b.upload(&hal::random::stream_words(seed, offset))?;
    let yb = b.alloc(DType::U32, n)?;
    b.launch(&k, &[&stream, &yb], n)?;
    Ok(b.read::<u32>(&yb)?.into_iter().map(f64::from).collect())
}

/// `y[i] = a[i] / b[i]` and `z[i] = sqrt(|a[i]|)` in f32.
pub(super) fn div_program() -> hal::ir::Program {
    let mut b = ProgramBuilder::new("ir_div_sqrt");
    let x = b.buffer(DType::F32, Access::Read);
    let z = b.buffer(DType::F32, Access::Read);
    let y = b.buffer(DType::F32, Access::Write);
    let root = b.buffer(DType::F32, Access::Write);
    let i = b.index();
    let (xv, zv) = (b.load(x, i), b.load(z, i));
    let q = b.div(xv, zv);
    b.store(y, i, q);
    let m = b.unary(hal::ir::IrUnary::Abs, xv);
    let r = b.unary(hal::ir::IrUnary::Sqrt, m);
    b.store(root, i, r);
    b.build().expect("a valid program")
}

/// The quotients, then the square roots.
pub(super) fn run_div<B: Backend>(b: &B, x: &[f32], z: &[f32]) -> Result<Vec<f64>> {
    let k = b.compile(&div_program())?;
    let (xb, zb) = (b.upload(x)?, b.upload(z)?);
    let (yb, rb) = (b.alloc(DType::F32, x.len())?, b.alloc(DType::F32, x.len())?);
    b.launch(&k, &[&xb, &zb, &yb, &rb], x.len())?;
    let mut out: Vec<f64> = b.read::<f32>(&yb)?.into_iter().map(f64::from).collect();
    out.extend(b.read::<f32>(&rb)?.into_iter().map(f64::from));
    Ok(out)
}

/// Operands for the division row: `(a, b, in_range)`. Where both magnitudes lie in
/// `[2^-50, 2^50]` the quotient must be correctly rounded; half of those are drawn so that
/// `a / b` falls next to a midpoint between two floats. The rest: magnitudes to 2^±60 (quotients stay normal),
/// zeros, infinities, NaN.
fn division_operands(r: &mut impl RngCoreExt, n: usize) -> (Vec<f32>, Vec<f32>, Vec<bool>) {
    let float = |r: &mut dyn FnMut() -> f32, lo: i32, hi: i32| -> f32 {
        let sign = if r() < 0.5 { -1.0 } else { 1.0 };
        let e = lo + ((hi - lo + 1) as f32 * r()).floor().min((hi - lo) as f32) as i32;
        sign * (1.0 + r()) * 2f32.powi(e)
    };
    let (mut a, mut b, mut inside) = (vec![0f32; n], vec![0f32; n], vec![true; n]);
    for i in 0..n {
        let mut u = || r.range(0.0, 1.0);
        match i % 8 {
            0..=2 => {
                a[i] = float(&mut u, -49, 48);
                b[i] = float(&mut u, -49, 48);
            }
            3..=5 => {
                // Drawn until the quotient lies within 2^-8 ulp of a midpoint between two
                // floats (where a quotient an ulp off rounds the wrong way).
                for _ in 0..100_000 {
                    a[i] = float(&mut u, -20, 20);
                    b[i] = float(&mut u, -20, 20);
                    let q = a[i] as f64 / b[i] as f64;
                    let near = q as f32;
                    let ulp = (f32::from_bits(near.abs().to_bits() + 1) - near.abs()) as f64;
                    if (q - near as f64).abs() / ulp > 0.5 - 2f64.powi(-8) {
                        break;
                    }
                }
            }
            6 => {
                a[i] = float(&mut u, -60, 60);
                b[i] = float(&mut u, -60, 60);
                inside[i] = false;
            }
            _ => {
                let specials = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.5];
                a[i] = specials[(6.0 * u()) as usize % 6];
                b[i] = specials[(6.0 * u()) as usize % 6];
                inside[i] = false;
            }
        }
        let m = |v: f32| v.abs() >= 2f32.powi(-50) && v.abs() <= 2f32.powi(50);
        inside[i] = inside[i] && m(a[i]) && m(b[i]);
    }
    (a, b, inside)
}

/// The IR programs the suite runs, for tools that check their lowering (`cargo xtask wgsl`).
pub fn sample_programs() -> Vec<hal::ir::Program> {
    vec![
        edge_program(),
        math_program(),
        masked_program(),
        random_bits_program(),
        div_program(),
    ]
}

pub(super) fn programs<B: Backend>(s: &mut Suite<'_, B>) {
    assert!(
        edge_program().insts.len() >= 20,
        "the IR parity program must have at least 20 instructions"
    );
    let sizes = [0usize, 1, 7, 257, 65537];
    for c in 0..s.cfg.cases + 4 {
        let (np, ne) = (sizes[(c + 1) % 5].max(2), sizes[c % 5]);
        let r = s.rng();
        let pts: Vec<f32> = (0..3 * np).map(|_| r.range(-1.0, 1.0)).collect();
        let edges: Vec<u32> = (0..2 * ne).map(|_| r.below(np) as u32).collect();
        let rest: Vec<f32> = (0..ne).map(|_| r.range(0.0, 0.5)).collect();
        let mut exact = vec![0f64; ne + 3 * np + np];
        let mut mag = vec![0f64; exact.len()];
        let mut terms = vec![1f64; exact.len()];
        for e in 0..ne {
            let (a, b) = (edges[2 * e] as usize, edges[2 * e + 1] as usize);
            let d: Vec<f64> = (0..3)
                .map(|k| pts[3 * a + k] as f64 - pts[3 * b + k] as f64)
                .collect();
            let len = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
            let res = len - rest[e] as f64;
            exact[e] = res;
            mag[e] = len + rest[e] as f64;
            let inv = if len < 1e-12 { 0.0 } else { 1.0 / len };
            // f32 error of each gradient term: a few roundings of len and rest, amplified by
            // the cancellation in len - rest, times d_k / len.
            let cond = 4.0 * (len + rest[e] as f64) * inv;
            for k in 0..3 {
                let g = res * inv * d[k];
                exact[ne + 3 * a + k] += g;
                exact[ne + 3 * b + k] -= g;
                mag[ne + 3 * a + k] += g.abs() + cond * d[k].abs();
                mag[ne + 3 * b + k] += g.abs() + cond * d[k].abs();
                terms[ne + 3 * a + k] += 1.0;
                terms[ne + 3 * b + k] += 1.0;
            }
            exact[ne + 3 * np + a] += 1.0;
            exact[ne + 3 * np + b] += 1.0;
        }
        match both!(s, run_edge(&pts, &edges, &rest)) {
            // A degenerate edge (a == b) has len 0 in both; elsewhere f32 vs f64 rounding.
            Ok((cv, t)) => s.judge(
                "ir program (edge residual, atomics)",
                &format!("{np} points, {ne} edges"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, w| 2.0 * U32F * terms[i] * mag[i] + 8.0 * U32F * w.abs(),
            ),
            Err(e) => s.fail(
                "ir program (edge residual, atomics)",
                format!("{np} points, {ne} edges: {e}"),
            ),
        }
        let n = sizes[c % 5];
        let r = s.rng();
        let x: Vec<f32> = (0..n)
            .map(|_| round_to(DType::F16, r.range(-3.0, 3.0)))
            .collect();
        let mut exact = vec![0f64; 2 * n];
        let mut tolv = vec![0f64; 2 * n];
        for (i, &v) in x.iter().enumerate() {
            let (y, z) = math_f64(v as f64, i as u32);
            exact[i] = round_to(DType::BF16, y as f32) as f64;
            tolv[i] = 2.0 * DType::BF16.unit_roundoff() * y.abs()
                + 1e-4 * (1.0 + (v as f64).exp() + (v as f64).tan().abs() + 4.0);
            exact[n + i] = z;
            // The float-to-int branch may land one off when the sum straddles an integer.
            tolv[n + i] = if v < 0.1 { 1.0 } else { 0.0 };
        }
        match both!(s, run_math(&x)) {
            Ok((cv, t)) => s.judge(
                "ir program (math, int, select, cast)",
                &format!("n={n}"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, _| tolv[i],
            ),
            Err(e) => s.fail(
                "ir program (math, int, select, cast)",
                format!("n={n}: {e}"),
            ),
        }
        let x: Vec<f32> = (0..n).map(|_| s.rng().range(-1.0, 1.0)).collect();
        let exact: Vec<f64> = x
            .iter()
            .map(|&v| if v > 0.0 { 2.0 * v as f64 } else { -7.0 })
            .collect();
        match both!(s, run_masked(&x)) {
            Ok((cv, t)) => s.judge(
                "ir program (conditional store)",
                &format!("n={n}"),
                &cv,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail("ir program (conditional store)", format!("n={n}: {e}")),
        }
        // The random stream's words, bit for bit; offsets whose low word carries into the
        // high one within the launch.
        let seed = s.rng().next_u64();
        let offset = match c % 2 {
            0 => (s.rng().next_u64() >> 1) | 0xffff_ff00,
            _ => s.rng().next_u64() >> 1,
        };
        let exact: Vec<f64> = (0..n)
            .map(|i| hal::random::philox_words(seed, offset.wrapping_add(i as u64))[0] as f64)
            .collect();
        match both!(s, run_random_bits(n, seed, offset)) {
            Ok((cv, t)) => s.judge(
                "ir program (random bits)",
                &format!("n={n} seed {seed} offset {offset}"),
                &cv,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail("ir program (random bits)", format!("n={n}: {e}")),
        }
        // f32 division and square root, correctly rounded where the operands lie in
        // [2^-50, 2^50] (the f64 result rounded to f32 is: 53 >= 2 * 24 + 2 bits make the
        // double rounding innocuous); elsewhere within the 2-ulp bound `binary` allows.
        let (a, d, inside) = division_operands(s.rng(), n);
        let mut exact: Vec<f64> = a
            .iter()
            .zip(&d)
            .map(|(&x, &y)| ((x as f64) / (y as f64)) as f32 as f64)
            .collect();
        exact.extend(a.iter().map(|&x| (x.abs() as f64).sqrt() as f32 as f64));
        match both!(s, run_div(&a, &d)) {
            Ok((cv, t)) => s.judge(
                "ir program (f32 division, sqrt)",
                &format!("n={n}"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, w| {
                    if inside[i % n.max(1)] {
                        0.0
                    } else {
                        2.0 * f32::EPSILON as f64 * w.abs()
                    }
                },
            ),
            Err(e) => s.fail("ir program (f32 division, sqrt)", format!("n={n}: {e}")),
        }
    }
}
