//! Dropout, from the backends' counter-based random stream.

use super::fused;
use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::ir::IrCmp;
use hal::{Backend, Distribution};

impl<B: Backend> Tensor<B> {
    /// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)`. The mask
    /// comes from the random stream of (`seed`, `offset`), so a run is reproducible; callers
    /// advance `offset` between steps ([`crate::nn::Dropout`] does).
    pub fn dropout(&self, p: f32, seed: u64, offset: u64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(invalid("dropout", format!("p must be in [0, 1), got {p}")));
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let u = self.new_output_like(hal::DType::F32)?;
        self.backend().random(
            u.view(),
            Distribution::Uniform {
                low: 0.0,
                high: 1.0,
            },
            seed,
            offset,
        )?;
        let scale = 1.0 / (1.0 - p);
        // x times the mask value (1 / (1 - p) where u >= p, else 0), one kernel each way; the
        // uniforms are kept for the backward pass instead of a mask.
        let masked = move |name: &str, x: &Tensor<B>, u: &Tensor<B>| {
            fused(name, &[x, u], x.shape(), x.dtype(), |b, v| {
                let ty = b.type_of(v[0]).unwrap_or(hal::ir::ScalarType::F32);
                let uty = b.type_of(v[1]).unwrap_or(hal::ir::ScalarType::F32);
                let pp = b.const_float(uty, p as f64);
                let (s, zero) = (b.const_float(ty, scale as f64), b.const_float(ty, 0.0));
                let keep = b.cmp(IrCmp::Ge, v[1], pp);
                let factor = b.select(keep, s, zero);
                b.mul(v[0], factor)
            })
        };
        let out = masked("dropout", self, &u)?;
        Ok(Tensor::from_op(out, "dropout", &[self], move |g| {
            Ok(vec![Some(masked("dropout_grad", g, &u)?)])
        }))
    }
}
