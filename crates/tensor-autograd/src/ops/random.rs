//! Dropout, from the backends' counter-based random stream, drawn inside its kernels.

use super::fused;
use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::Backend;
use hal::ir::{IrBinary, IrCmp};

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
        if self.numel() > u32::MAX as usize {
            return Err(invalid(
                "dropout",
                format!("{} elements: the mask is indexed in 32 bits", self.numel()),
            ));
        }
        // Element i (row-major) is kept where the stream's word at offset + i, as a 24-bit
        // uniform (w >> 8) 2^-24, is at least p: (w >> 8) >= ceil(p 2^24), the decision
        // `random` with a uniform in [0, 1) and hal::attention::keeps make. The word is drawn
        // in the kernel that applies it, forward and backward, so no mask is stored.
        let threshold = (p as f64 * 16_777_216.0).ceil() as u32;
        let scale = 1.0 / (1.0 - p);
        let masked = move |name: &str, x: &Tensor<B>| {
            fused(name, &[x], x.shape(), x.dtype(), |b, v| {
                let ty = b.type_of(v[0]).unwrap_or(hal::ir::ScalarType::F32);
                let i = b.index();
                let bits = b.random_bits(seed, offset, i);
                let eight = b.const_u32(8);
                let top = b.binary(IrBinary::Shr, bits, eight);
                let at_least = b.const_u32(threshold);
                let keep = b.cmp(IrCmp::Ge, top, at_least);
                let (s, zero) = (b.const_float(ty, scale as f64), b.const_float(ty, 0.0));
                let factor = b.select(keep, s, zero);
                b.mul(v[0], factor)
            })
        };
        // Row-major operands, so the launch index is the element's position.
        let x = match self.is_contiguous() {
            true => self.clone(),
            false => self.contiguous()?,
        };
        let out = masked("dropout", &x)?;
        Ok(Tensor::from_op(out, "dropout", &[&x], move |g| {
            let g = match g.is_contiguous() {
                true => g.clone(),
                false => g.contiguous()?,
            };
            Ok(vec![Some(masked("dropout_grad", &g)?)])
        }))
    }
}
