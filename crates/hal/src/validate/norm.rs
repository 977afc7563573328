//! The checks of [`crate::Backend::layer_norm`] and [`crate::Backend::layer_norm_backward`].

use super::{disjoint, fits, output, rank, same_shape};
use crate::norm::{NormGrads, NormInputs};
use crate::{DType, DeviceBuffer, Error, Result, View};

fn one_dtype(op: &'static str, expected: DType, got: DType) -> Result<()> {
    if got != expected {
        return Err(Error::DTypeMismatch { op, expected, got });
    }
    Ok(())
}

/// `x` is `[rows, n]` in f32 or f64, the affine parameters `[n]` of its dtype; returns
/// `(rows, n)`.
fn inputs<B: DeviceBuffer>(op: &'static str, x: NormInputs<'_, B>) -> Result<(usize, usize)> {
    fits(op, x.x)?;
    rank(op, x.x, 2, "x")?;
    let dtype = x.x.dtype();
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            detail: " (layer_norm computes in f32 or f64)".into(),
        });
    }
    let (rows, n) = (x.x.layout.shape[0], x.x.layout.shape[1]);
    for p in [x.weight, x.bias].into_iter().flatten() {
        fits(op, p)?;
        same_shape(op, &[n], &p.layout.shape, "weight and bias are [n]")?;
        one_dtype(op, dtype, p.dtype())?;
    }
    Ok((rows, n))
}

fn outputs<B: DeviceBuffer>(
    op: &'static str,
    reads: &[View<'_, B>],
    outs: &[View<'_, B>],
    dtype: DType,
) -> Result<()> {
    for (k, &o) in outs.iter().enumerate() {
        output(op, o)?;
        one_dtype(op, dtype, o.dtype())?;
        for &i in reads {
            disjoint(op, i, o, false)?;
        }
        for &other in &outs[..k] {
            disjoint(op, other, o, false)?;
        }
    }
    Ok(())
}

/// Returns `(rows, n)`. `eps` must be finite and non-negative.
pub fn layer_norm<B: DeviceBuffer>(
    x: NormInputs<'_, B>,
    out: View<'_, B>,
    mean: View<'_, B>,
    rstd: View<'_, B>,
    eps: f32,
) -> Result<(usize, usize)> {
    const OP: &str = "layer_norm";
    let (rows, n) = inputs(OP, x)?;
    same_shape(OP, &[rows, n], &out.layout.shape, "out is shaped as x")?;
    same_shape(OP, &[rows], &mean.layout.shape, "mean is [rows]")?;
    same_shape(OP, &[rows], &rstd.layout.shape, "rstd is [rows]")?;
    let reads: Vec<View<'_, B>> = [Some(x.x), x.weight, x.bias]
        .into_iter()
        .flatten()
        .collect();
    outputs(OP, &reads, &[out, mean, rstd], x.x.dtype())?;
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::InvalidArgument {
            op: OP,
            detail: format!("eps must be finite and non-negative, got {eps}"),
        });
    }
    Ok((rows, n))
}

/// Returns `(rows, n)`; `mean`, `rstd` as the forward pass wrote them.
pub fn layer_norm_backward<B: DeviceBuffer>(
    x: NormInputs<'_, B>,
    mean: View<'_, B>,
    rstd: View<'_, B>,
    dout: View<'_, B>,
    g: NormGrads<'_, B>,
) -> Result<(usize, usize)> {
    const OP: &str = "layer_norm_backward";
    let (rows, n) = inputs(OP, x)?;
    let dtype = x.x.dtype();
    for (v, want, what) in [
        (mean, vec![rows], "mean is [rows]"),
        (rstd, vec![rows], "rstd is [rows]"),
        (dout, vec![rows, n], "dout is shaped as x"),
        (g.dx, vec![rows, n], "dx is shaped as x"),
    ] {
        fits(OP, v)?;
        same_shape(OP, &want, &v.layout.shape, what)?;
        one_dtype(OP, dtype, v.dtype())?;
    }
    for p in [g.dweight, g.dbias].into_iter().flatten() {
        same_shape(OP, &[n], &p.layout.shape, "dweight and dbias are [n]")?;
    }
    let reads: Vec<View<'_, B>> = [
        Some(x.x),
        x.weight,
        x.bias,
        Some(mean),
        Some(rstd),
        Some(dout),
    ]
    .into_iter()
    .flatten()
    .collect();
    let outs: Vec<View<'_, B>> = [Some(g.dx), g.dweight, g.dbias]
        .into_iter()
        .flatten()
        .collect();
    outputs(OP, &reads, &outs, dtype)?;
    Ok((rows, n))
}
