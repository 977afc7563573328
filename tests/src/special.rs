//! Special values through every unary and binary op: ±0, ±inf, NaN, subnormals, the largest
//! finite values, negative bases. The reference is the op's definition in `hal`
//! ([`UnaryOp::apply`], [`BinaryOp::apply`]); both the CPU backend and the target must give
//! the same class of result (NaN, +inf, -inf or finite) and, where finite, the same value
//! within the op's tolerance. A GPU may flush subnormals to zero (hal's rule), so for a
//! subnormal operand or result the target may also give what a zero would.

use crate::Suite;
use hal::{Backend, BackendExt, BinaryOp, DType, Layout, Result, UnaryOp, View};

/// The values every op is run on.
pub const SPECIAL: [f32; 18] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    1.0,
    -1.0,
    2.0,
    -2.0,
    0.5,
    -1.5,
    3.0,
    -3.0,
    1e-40,  // subnormal
    -1e-40, // subnormal
    f32::MIN_POSITIVE,
    f32::MAX,
    -f32::MAX,
];

fn is_subnormal(v: f32) -> bool {
    v != 0.0 && v.is_finite() && v.abs() < f32::MIN_POSITIVE
}

/// `v` with a subnormal flushed to a zero of its sign.
fn flushed(v: f32) -> f32 {
    if is_subnormal(v) {
        0.0f32.copysign(v)
    } else {
        v
    }
}

/// True when `got` matches `want`: both NaN, equal infinities, or finite values within
/// `rel * |want| + abs`. With `flush` (a GPU, which may flush subnormals at any step, in a
/// comparison as in arithmetic) finite values may also differ by up to the smallest normal
/// number, the most a flushed subnormal changes anything.
fn matches(got: f32, want: f32, rel: f64, abs: f64, flush: bool) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return want == got;
    }
    let (g, w) = (got as f64, want as f64);
    let slack = if flush { f32::MIN_POSITIVE as f64 } else { 0.0 };
    (g - w).abs() <= rel * w.abs() + abs + slack
}

fn run_unary<B: Backend>(b: &B, op: UnaryOp, x: &[f32]) -> Result<Vec<f32>> {
    let l = Layout::contiguous(&[x.len()]);
    let (xb, ob) = (b.upload(x)?, b.alloc(DType::F32, x.len())?);
    b.unary(op, View::new(&xb, &l), View::new(&ob, &l))?;
    b.read(&ob)
}

fn run_binary<B: Backend>(b: &B, op: BinaryOp, x: &[f32], y: &[f32]) -> Result<Vec<f32>> {
    let l = Layout::contiguous(&[x.len()]);
    let (xb, yb, ob) = (b.upload(x)?, b.upload(y)?, b.alloc(DType::F32, x.len())?);
    b.binary(
        op,
        View::new(&xb, &l),
        View::new(&yb, &l),
        View::new(&ob, &l),
    )?;
    b.read(&ob)
}

/// The relative and absolute tolerance of a unary op's finite results at these values.
fn unary_tolerance(op: UnaryOp) -> (f64, f64) {
    use UnaryOp::*;
    match op {
        Neg | Abs | Relu | LeakyRelu { .. } | Floor | Ceil | Round | Sign | Clamp { .. } => {
            (0.0, 0.0)
        }
        Square | Recip | Sqrt | Affine { .. } => (1e-6, 0.0),
        _ => (2e-5, 2f64.powi(-20)),
    }
}

/// The relative and absolute tolerance of a binary op's finite results at these values.
fn binary_tolerance(op: BinaryOp) -> (f64, f64) {
    match op {
        BinaryOp::Pow | BinaryOp::Atan2 => (2e-5, 2f64.powi(-20)),
        BinaryOp::Div | BinaryOp::Rem => (1e-6, 0.0),
        _ => (0.0, 0.0),
    }
}

/// Sines and cosines of huge arguments are only required to be finite and in [-1, 1]: a
/// GPU's reduction of the argument is approximate there.
fn loose(op: UnaryOp, x: f32) -> bool {
    matches!(op, UnaryOp::Sin | UnaryOp::Cos) && x.is_finite() && x.abs() > 1e4
}

/// Judges the CPU's results and, unless the target is the reference, the target's: one case
/// of `row` each, failing with the (first eight) descriptions `bad(i, got, on_gpu, who)`
/// gives of wrong elements.
fn judge_each<B: Backend>(
    s: &mut Suite<'_, B>,
    row: &'static str,
    what: String,
    results: [Option<Result<Vec<f32>>>; 2],
    bad: impl Fn(usize, f32, bool, &str) -> Option<String>,
) {
    for (who, got) in ["cpu", "target"].into_iter().zip(results) {
        let Some(got) = got else { continue };
        let got = match got {
            Ok(v) => v,
            Err(e) => {
                s.fail(row, format!("{what} on {who}: {e}"));
                continue;
            }
        };
        let wrong: Vec<String> = got
            .iter()
            .enumerate()
            .filter_map(|(i, &g)| bad(i, g, who == "target", who))
            .take(8)
            .collect();
        match wrong.is_empty() {
            true => s.pass(row),
            false => s.fail(row, wrong.join("; ")),
        }
    }
}

pub(crate) fn unary_special<B: Backend>(s: &mut Suite<'_, B>) {
    let x = SPECIAL.to_vec();
    for op in UnaryOp::all() {
        let results = [
            Some(run_unary(s.cpu, op, &x)),
            (!s.target_is_reference).then(|| run_unary(s.target, op, &x)),
        ];
        let (rel, abs) = unary_tolerance(op);
        let bad = |i: usize, g: f32, gpu: bool, who: &str| {
            let v = x[i];
            let ok = match loose(op, v) {
                true => g.is_finite() && g.abs() <= 1.0,
                false => {
                    matches(g, op.apply(v), rel, abs, gpu)
                        || (gpu && matches(g, op.apply(flushed(v)), rel, abs, gpu))
                }
            };
            (!ok).then(|| format!("{op:?}({v:e}) = {g:e} on {who}, not {:e}", op.apply(v)))
        };
        judge_each(s, "unary (special values)", format!("{op:?}"), results, bad);
    }
}

pub(crate) fn binary_special<B: Backend>(s: &mut Suite<'_, B>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &u in &SPECIAL {
        for &v in &SPECIAL {
            a.push(u);
            b.push(v);
        }
    }
    for op in BinaryOp::ALL {
        let results = [
            Some(run_binary(s.cpu, op, &a, &b)),
            (!s.target_is_reference).then(|| run_binary(s.target, op, &a, &b)),
        ];
        let (rel, abs) = binary_tolerance(op);
        let bad = |i: usize, g: f32, gpu: bool, who: &str| {
            let (u, v) = (a[i], b[i]);
            let ok = matches(g, op.apply(u, v), rel, abs, gpu)
                || (gpu && matches(g, op.apply(flushed(u), flushed(v)), rel, abs, gpu));
            (!ok).then(|| {
                format!(
                    "{op:?}({u:e}, {v:e}) = {g:e} on {who}, not {:e}",
                    op.apply(u, v)
                )
            })
        };
        judge_each(
            s,
            "binary (special values)",
            format!("{op:?}"),
            results,
            bad,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_tells_classes_apart() {
        assert!(matches(f32::NAN, f32::NAN, 0.0, 0.0, false));
        assert!(!matches(1.0, f32::NAN, 1.0, 1.0, false));
        assert!(!matches(f32::INFINITY, f32::NEG_INFINITY, 1.0, 1.0, false));
        assert!(!matches(f32::MAX, f32::INFINITY, 1.0, 1.0, false));
        assert!(matches(0.0, 1e-40, 0.0, 0.0, true));
        assert!(!matches(0.0, 1e-40, 0.0, 0.0, false));
        assert!(!matches(1e-37, 0.0, 0.0, 0.0, true));
        assert_eq!(flushed(-1e-40).to_bits(), (-0.0f32).to_bits());
    }
}
