//! [`ReduceOp::LogSumExp`] built from other primitives, for backends (or dtypes) without a
//! kernel of their own: the row maxima (`reduce` Max), the infinite ones replaced by 0, the
//! shifted exponentials `exp(x - m)` in a temporary the size of `x`, their sums, `log`, and
//! `m` added back. Six passes and a temporary where a fused kernel reads `x` once, but every
//! step is a primitive whose contract the parity suite checks.

use crate::{Backend, BinaryOp, DType, Layout, ReduceOp, Result, TernaryOp, UnaryOp, View};

/// `out = log(sum(exp(x)))` over `axes`, as [`Backend::reduce`] with
/// [`ReduceOp::LogSumExp`] defines it (the caller has validated the views). Computed in
/// `f64` where `x` or `out` is `f64`, else in `f32`.
pub fn log_sum_exp_steps<B: Backend>(
    b: &B,
    x: View<'_, B::Buffer>,
    axes: &[usize],
    out: View<'_, B::Buffer>,
) -> Result<()> {
    let wide = match x.dtype() == DType::F64 || out.dtype() == DType::F64 {
        true => DType::F64,
        false => DType::F32,
    };
    let n_out = out.layout.numel();
    if n_out == 0 {
        return Ok(());
    }
    let count: usize = axes.iter().map(|&a| x.layout.shape[a]).product();
    if count == 0 {
        return b.fill(out, f64::NEG_INFINITY);
    }
    let kept = Layout::contiguous(&out.layout.shape);
    // A one-element buffer seen at every output position (stride 0).
    let scalar = |value: f64| -> Result<B::Buffer> {
        let buffer = b.alloc(wide, 1)?;
        b.fill(View::new(&buffer, &Layout::contiguous(&[1])), value)?;
        Ok(buffer)
    };
    let everywhere = Layout::strided(&out.layout.shape, &vec![0; out.layout.rank()], 0)?;
    // m: the maxima where finite, 0 where infinite (or NaN: the NaN then reaches the sum).
    let m = b.alloc(wide, n_out)?;
    let mv = View::new(&m, &kept);
    b.reduce(ReduceOp::Max, x, axes, mv)?;
    let finite = b.alloc(wide, n_out)?;
    let fv = View::new(&finite, &kept);
    let (infinity, zero) = (scalar(f64::INFINITY)?, scalar(0.0)?);
    b.unary(UnaryOp::Abs, mv, fv)?;
    b.binary(BinaryOp::Lt, fv, View::new(&infinity, &everywhere), fv)?;
    b.ternary(TernaryOp::Where, fv, mv, View::new(&zero, &everywhere), mv)?;
    // exp(x - m), m broadcast over the reduced axes.
    let shifted_layout = Layout::contiguous(&x.layout.shape);
    let shifted = b.alloc(wide, x.layout.numel())?;
    let sv = View::new(&shifted, &shifted_layout);
    b.binary(BinaryOp::Sub, x, mv, sv)?;
    b.unary(UnaryOp::Exp, sv, sv)?;
    // log of the sums, plus m.
    let sums = b.alloc(wide, n_out)?;
    let sums_view = View::new(&sums, &kept);
    b.reduce(ReduceOp::Sum, sv, axes, sums_view)?;
    b.unary(UnaryOp::Log, sums_view, sums_view)?;
    b.binary(BinaryOp::Add, sums_view, mv, out)
}
