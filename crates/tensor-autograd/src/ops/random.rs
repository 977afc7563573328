//! Dropout, from the backends' counter-based random stream, drawn inside its kernels.

use super::fused;
use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::Backend;
use hal::ir::{IrBinary, IrCmp};

/// One dropout call's mask: element `i` (row-major) is kept where the stream's word at
/// `offset + i`, as a 24-bit uniform `(w >> 8) 2^-24`, is at least `p`, that is where
/// `(w >> 8) >= ceil(p 2^24)`: the decision `random` with a uniform in `[0, 1)` and
/// `hal::attention::keeps` make. The word is drawn in the kernel that applies it, forward and
/// backward, so no mask is stored.
#[derive(Clone, Copy)]
struct Mask {
    p: f32,
    seed: u64,
    offset: u64,
}

impl Mask {
    fn new(op: &'static str, p: f32, seed: u64, offset: u64, numel: usize) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(invalid(op, format!("p must be in [0, 1), got {p}")));
        }
        if p > 0.0 && numel > u32::MAX as usize {
            return Err(invalid(
                op,
                format!("{numel} elements: the mask is indexed in 32 bits"),
            ));
        }
        Ok(Self { p, seed, offset })
    }

    /// `x * mask / (1 - p)`, plus `residual` where given (of `x`'s shape), in one kernel over
    /// row-major operands (so the launch index is the element's position).
    fn apply<B: Backend>(
        self,
        name: &str,
        x: &Tensor<B>,
        residual: Option<&Tensor<B>>,
    ) -> Result<Tensor<B>> {
        let threshold = (self.p as f64 * 16_777_216.0).ceil() as u32;
        let scale = 1.0 / (1.0 - self.p);
        let mut inputs = vec![x];
        inputs.extend(residual);
        fused(name, &inputs, x.shape(), x.dtype(), |b, v| {
            let ty = b.type_of(v[0]).unwrap_or(hal::ir::ScalarType::F32);
            let i = b.index();
            let bits = b.random_bits(self.seed, self.offset, i);
            let eight = b.const_u32(8);
            let top = b.binary(IrBinary::Shr, bits, eight);
            let at_least = b.const_u32(threshold);
            let keep = b.cmp(IrCmp::Ge, top, at_least);
            let (s, zero) = (b.const_float(ty, scale as f64), b.const_float(ty, 0.0));
            let factor = b.select(keep, s, zero);
            let dropped = b.mul(v[0], factor);
            match v.get(1) {
                Some(&r) => {
                    let r = match b.type_of(r) {
                        Some(t) if t != ty => b.cast(ty, r),
                        _ => r,
                    };
                    b.add(dropped, r)
                }
                None => dropped,
            }
        })
    }
}

/// `t` itself where row-major, else a row-major copy.
fn row_major<B: Backend>(t: &Tensor<B>) -> Result<Tensor<B>> {
    match t.is_contiguous() {
        true => Ok(t.clone()),
        false => t.contiguous(),
    }
}

impl<B: Backend> Tensor<B> {
    /// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)`. The mask
    /// comes from the random stream of (`seed`, `offset`), so a run is reproducible; callers
    /// advance `offset` between steps ([`crate::nn::Dropout`] does). One kernel forward and
    /// one backward; nothing but the result is stored.
    pub fn dropout(&self, p: f32, seed: u64, offset: u64) -> Result<Self> {
        let mask = Mask::new("dropout", p, seed, offset, self.numel())?;
        if p == 0.0 {
            return Ok(self.clone());
        }
        let x = row_major(self)?;
        let out = mask.apply("dropout", &x, None)?;
        Ok(Tensor::from_op(out, "dropout", &[&x], move |g| {
            Ok(vec![Some(mask.apply(
                "dropout_grad",
                &row_major(g)?,
                None,
            )?)])
        }))
    }

    /// `residual + self.dropout(p, seed, offset)` in one kernel (a transformer block's
    /// residual connection): the same mask and values as the two calls, with no
    /// intermediate. `residual` has this tensor's shape; its gradient is the result's.
    pub fn dropout_add(
        &self,
        residual: &Tensor<B>,
        p: f32,
        seed: u64,
        offset: u64,
    ) -> Result<Self> {
        let mask = Mask::new("dropout_add", p, seed, offset, self.numel())?;
        if residual.shape() != self.shape() {
            return Err(crate::error::shape_error(
                "dropout_add",
                self.shape(),
                residual.shape(),
                "the residual must have the dropped tensor's shape",
            ));
        }
        if p == 0.0 {
            return residual.add(self);
        }
        let (x, r) = (row_major(self)?, row_major(residual)?);
        let dtype = super::promote(x.dtype(), r.dtype());
        let x = match x.dtype() == dtype {
            true => x,
            false => x.to_dtype(dtype)?,
        };
        let out = mask.apply("dropout_add", &x, Some(&r))?;
        let r_dtype = r.dtype();
        Ok(Tensor::from_op(out, "dropout_add", &[&x, &r], move |g| {
            let g = row_major(g)?;
            let gr = match g.dtype() == r_dtype {
                true => g.clone(),
                false => g.to_dtype(r_dtype)?,
            };
            Ok(vec![Some(mask.apply("dropout_grad", &g, None)?), Some(gr)])
        }))
    }
}
