//! Layer normalisation as one fused operation forward and one backward
//! ([`hal::Backend::layer_norm`]), instead of the eight or so elementwise and reduction
//! launches of its composition each way.

use crate::error::{Result, invalid, shape_error};
use crate::tensor::Tensor;
use hal::{Backend, DType, NormGrads, NormInputs};

impl<B: Backend> Tensor<B> {
    /// Layer normalisation over the last `dims` dimensions (PyTorch's `layer_norm` with
    /// `normalized_shape` the trailing `dims` sizes): each slice is shifted to mean 0 and
    /// scaled to variance 1 (biased, plus `eps`), then scaled by `weight` and shifted by `bias`
    /// (both shaped as the normalised dimensions) where given. f32 or f64, one dtype throughout;
    /// under [`crate::autocast`], 16-bit operands are widened to f32 first.
    pub fn layer_norm(
        &self,
        dims: usize,
        weight: Option<&Tensor<B>>,
        bias: Option<&Tensor<B>>,
        eps: f32,
    ) -> Result<Tensor<B>> {
        const OP: &str = "layer_norm";
        if crate::autocast_dtype().is_some() {
            let x = self.autocast_wide()?;
            let w = weight.map(|w| w.autocast_wide()).transpose()?;
            let b = bias.map(|b| b.autocast_wide()).transpose()?;
            return crate::autocast::outside(|| x.layer_norm(dims, w.as_ref(), b.as_ref(), eps));
        }
        if dims == 0 || dims > self.rank() {
            return Err(invalid(
                OP,
                format!("dims must be in 1..={}, got {dims}", self.rank()),
            ));
        }
        let shape = self.shape().to_vec();
        let trailing = &shape[shape.len() - dims..];
        for p in [weight, bias].into_iter().flatten() {
            if p.shape() != trailing {
                return Err(shape_error(
                    OP,
                    trailing,
                    p.shape(),
                    "weight and bias are shaped as the normalised dimensions",
                ));
            }
        }
        let dtype = self.dtype();
        if !matches!(dtype, DType::F32 | DType::F64)
            || [weight, bias]
                .into_iter()
                .flatten()
                .any(|p| p.dtype() != dtype)
        {
            return Err(invalid(
                OP,
                format!("x, weight and bias must share one dtype, f32 or f64; x is {dtype}"),
            ));
        }
        let n: usize = trailing.iter().product();
        let rows = self.numel() / n.max(1);
        let x = self.reshape(&[rows, n])?;
        let w = weight.map(|w| w.reshape(&[n])).transpose()?;
        let b = bias.map(|b| b.reshape(&[n])).transpose()?;
        let be = self.backend().clone();
        let out = Tensor::for_write(&be, &[rows, n], dtype)?;
        let mean = Tensor::for_write(&be, &[rows], dtype)?;
        let rstd = Tensor::for_write(&be, &[rows], dtype)?;
        be.layer_norm(
            NormInputs {
                x: x.view(),
                weight: w.as_ref().map(|t| t.view()),
                bias: b.as_ref().map(|t| t.view()),
            },
            out.view(),
            mean.view(),
            rstd.view(),
            eps,
        )?;
        let mut inputs = vec![&x];
        inputs.extend(w.as_ref());
        inputs.extend(b.as_ref());
        let (xs, ws, has_b) = (x.clone(), w.clone(), b.is_some());
        let result = Tensor::from_op(out, OP, &inputs, move |g| {
            let be = xs.backend();
            let cast;
            let g = if g.dtype() == dtype {
                g
            } else {
                cast = g.to_dtype(dtype)?;
                &cast
            };
            let dx = Tensor::for_write(be, &[rows, n], dtype)?;
            let dw = ws
                .as_ref()
                .map(|_| Tensor::for_write(be, &[n], dtype))
                .transpose()?;
            let db = has_b
                .then(|| Tensor::for_write(be, &[n], dtype))
                .transpose()?;
            be.layer_norm_backward(
                NormInputs {
                    x: xs.view(),
                    weight: ws.as_ref().map(|t| t.view()),
                    bias: None,
                },
                mean.view(),
                rstd.view(),
                g.view(),
                NormGrads {
                    dx: dx.view(),
                    dweight: dw.as_ref().map(|t| t.view()),
                    dbias: db.as_ref().map(|t| t.view()),
                },
            )?;
            let mut grads = vec![Some(dx)];
            grads.extend(dw.map(Some));
            grads.extend(db.map(Some));
            Ok(grads)
        });
        result.reshape(&shape)
    }
}
