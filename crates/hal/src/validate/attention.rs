//! The checks of [`crate::Backend::attention`] and [`crate::Backend::attention_backward`].

use super::{disjoint, fits, output, rank, same_shape};
use crate::attention::{AttentionGrads, AttentionInputs, AttentionParams};
use crate::{DType, DeviceBuffer, Error, Layout, Result, View};

/// The sizes of one attention call: batch, heads, query rows, key rows, the q/k width and
/// v's width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub heads: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub dv: usize,
}

impl AttentionShape {
    /// The weights' element count, `batch * heads * tq * tk` (checked when validated).
    pub fn weights(&self) -> u64 {
        (self.batch * self.heads) as u64 * self.tq as u64 * self.tk as u64
    }
}

fn invalid(op: &'static str, detail: String) -> Error {
    Error::InvalidArgument { op, detail }
}

/// The forward pass's checks: returns the sizes and the mask's layout broadcast to
/// `[b, h, tq, tk]`.
pub fn attention<B: DeviceBuffer>(
    x: AttentionInputs<'_, B>,
    out: View<'_, B>,
    lse: View<'_, B>,
    p: &AttentionParams,
) -> Result<(AttentionShape, Option<Layout>)> {
    const OP: &str = "attention";
    let (shape, mask) = inputs(OP, x, p)?;
    outputs(OP, x, &[out, lse])?;
    let s = shape;
    same_shape(
        OP,
        &[s.batch, s.heads, s.tq, s.dv],
        &out.layout.shape,
        "out is [b, h, tq, dv]",
    )?;
    same_shape(
        OP,
        &[s.batch, s.heads, s.tq],
        &lse.layout.shape,
        "lse is [b, h, tq]",
    )?;
    one_dtype(OP, x.q.dtype(), out.dtype())?;
    one_dtype(OP, lse_dtype(x.q.dtype()), lse.dtype())?;
    Ok((shape, mask))
}

/// The backward pass's checks (`out`, `lse` as the forward pass wrote them; `dout` shaped as
/// `out`): returns the sizes and the mask's broadcast layout.
pub fn attention_backward<B: DeviceBuffer>(
    x: AttentionInputs<'_, B>,
    out: View<'_, B>,
    lse: View<'_, B>,
    dout: View<'_, B>,
    g: AttentionGrads<'_, B>,
    p: &AttentionParams,
) -> Result<(AttentionShape, Option<Layout>)> {
    const OP: &str = "attention_backward";
    let (shape, mask) = inputs(OP, x, p)?;
    let s = shape;
    let (dt, lse_dt) = (x.q.dtype(), lse_dtype(x.q.dtype()));
    for (v, want, what, dtype) in [
        (
            out,
            vec![s.batch, s.heads, s.tq, s.dv],
            "out is [b, h, tq, dv]",
            dt,
        ),
        (
            dout,
            vec![s.batch, s.heads, s.tq, s.dv],
            "dout is shaped as out",
            dt,
        ),
        (
            lse,
            vec![s.batch, s.heads, s.tq],
            "lse is [b, h, tq]",
            lse_dt,
        ),
        (g.dq, x.q.layout.shape.clone(), "dq is shaped as q", dt),
        (g.dk, x.k.layout.shape.clone(), "dk is shaped as k", dt),
        (g.dv, x.v.layout.shape.clone(), "dv is shaped as v", dt),
    ] {
        fits(OP, v)?;
        same_shape(OP, &want, &v.layout.shape, what)?;
        one_dtype(OP, dtype, v.dtype())?;
    }
    let grads = [g.dq, g.dk, g.dv];
    outputs(OP, x, &grads)?;
    for o in grads {
        for i in [out, lse, dout] {
            disjoint(OP, i, o, false)?;
        }
    }
    Ok((shape, mask))
}

/// The dtype of the rows' log-sum-exps for operands of `dtype`: f32 for the 16-bit floats
/// (which the kernels compute in f32), else the operands' own.
pub fn lse_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

fn one_dtype(op: &'static str, expected: DType, got: DType) -> Result<()> {
    if got != expected {
        return Err(Error::DTypeMismatch { op, expected, got });
    }
    Ok(())
}

/// Outputs lie in their buffers, reach each element once, and overlap no input nor each other.
fn outputs<B: DeviceBuffer>(
    op: &'static str,
    x: AttentionInputs<'_, B>,
    outs: &[View<'_, B>],
) -> Result<()> {
    for (n, &o) in outs.iter().enumerate() {
        output(op, o)?;
        for i in [x.q, x.k, x.v].into_iter().chain(x.mask) {
            disjoint(op, i, o, false)?;
        }
        for &other in &outs[..n] {
            disjoint(op, other, o, false)?;
        }
    }
    Ok(())
}

fn inputs<B: DeviceBuffer>(
    op: &'static str,
    x: AttentionInputs<'_, B>,
    p: &AttentionParams,
) -> Result<(AttentionShape, Option<Layout>)> {
    for (v, what) in [(x.q, "q"), (x.k, "k"), (x.v, "v")] {
        fits(op, v)?;
        rank(op, v, 4, what)?;
    }
    let dtype = x.q.dtype();
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            detail: " (attention takes f32, f64, f16 or bf16 operands)".into(),
        });
    }
    for v in [x.k, x.v] {
        one_dtype(op, dtype, v.dtype())?;
    }
    if let Some(m) = x.mask
        && m.dtype() != dtype
        && !(m.dtype() == DType::F32 && dtype.size_in_bytes() == 2)
    {
        one_dtype(op, dtype, m.dtype())?;
    }
    let (q, k, v) = (&x.q.layout.shape, &x.k.layout.shape, &x.v.layout.shape);
    let s = AttentionShape {
        batch: q[0],
        heads: q[1],
        tq: q[2],
        tk: k[2],
        d: q[3],
        dv: v[3],
    };
    same_shape(
        op,
        &[s.batch, s.heads, s.tk, s.d],
        k,
        "k is [b, h, tk, d] as q is [b, h, tq, d]",
    )?;
    same_shape(
        op,
        &[s.batch, s.heads, s.tk, s.dv],
        v,
        "v is [b, h, tk, dv] with k's tk",
    )?;
    let weights = [s.batch, s.heads, s.tq, s.tk];
    if crate::checked_numel(&weights).is_none() {
        return Err(invalid(
            op,
            format!("{weights:?} weights overflow the index range"),
        ));
    }
    if !p.scale.is_finite() {
        return Err(invalid(
            op,
            format!("scale must be finite, got {}", p.scale),
        ));
    }
    if !(0.0..1.0).contains(&p.dropout) {
        return Err(invalid(
            op,
            format!("dropout must be in [0, 1), got {}", p.dropout),
        ));
    }
    if p.offset.checked_add(s.weights()).is_none() {
        return Err(invalid(
            op,
            "the dropout stream's positions overflow 64 bits".into(),
        ));
    }
    let mask = match x.mask {
        Some(m) => Some(super::broadcast(op, m, &weights)?),
        None => None,
    };
    Ok((s, mask))
}
