//! Dropout, from the backends' counter-based random stream, drawn inside its kernels.

use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::ir::{Access, IrBinary, IrCmp, ProgramBuilder, ScalarType};
use hal::{Backend, BackendExt, DType, Layout};

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
    /// row-major operands (so the launch index is the element's position), stored as
    /// `out_dtype` (the operands are read in their own dtypes and computed in the result's
    /// width: a 16-bit branch added to an f32 residual is not cast first). The stream
    /// `(seed, offset)` travels in a four-word buffer, so one compiled program serves every
    /// call of a shape and dtype.
    fn apply<B: Backend>(
        self,
        name: &str,
        (x, residual): (&Tensor<B>, Option<&Tensor<B>>),
        out_dtype: DType,
    ) -> Result<Tensor<B>> {
        let backend = x.backend();
        let layout = Layout::contiguous(x.shape());
        let x = x.stored_as(&layout)?;
        let residual = residual.map(|r| r.stored_as(&layout)).transpose()?;
        let stream = backend.upload(&hal::random::stream_words(self.seed, self.offset))?;
        let threshold = hal::random::keep_threshold(self.p);
        let scale = 1.0 / (1.0 - self.p);
        let mut b = ProgramBuilder::new(name);
        let xb = b.buffer(x.dtype(), Access::Read);
        let rb = residual.as_ref().map(|r| b.buffer(r.dtype(), Access::Read));
        let sb = b.buffer(DType::U32, Access::Read);
        let out_id = b.buffer(out_dtype, Access::Write);
        let i = b.index();
        let ty = match out_dtype {
            DType::F64 => ScalarType::F64,
            _ => ScalarType::F32,
        };
        let v = b.load(xb, i);
        let v = match b.type_of(v) {
            Some(t) if t != ty => b.cast(ty, v),
            _ => v,
        };
        let bits = hal::random::stream_bits(&mut b, sb, i);
        let eight = b.const_u32(8);
        let top = b.binary(IrBinary::Shr, bits, eight);
        let at_least = b.const_u32(threshold);
        let keep = b.cmp(IrCmp::Ge, top, at_least);
        let (s, zero) = (b.const_float(ty, scale as f64), b.const_float(ty, 0.0));
        let factor = b.select(keep, s, zero);
        let mut y = b.mul(v, factor);
        if let Some(rb) = rb {
            let r = b.load(rb, i);
            let r = match b.type_of(r) {
                Some(t) if t != ty => b.cast(ty, r),
                _ => r,
            };
            y = b.add(y, r);
        }
        b.store(out_id, i, y);
        let kernel = backend.compile(&b.build()?)?;
        let out = Tensor::for_write_as(backend, layout, out_dtype)?;
        let mut args = vec![x.buffer()];
        args.extend(residual.as_ref().map(|r| r.buffer()));
        args.extend([&stream, out.buffer()]);
        if out.numel() > 0 {
            backend.launch(&kernel, &args, out.numel())?;
        }
        Ok(out)
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
        let dtype = self.dtype();
        let out = mask.apply("dropout", (self, None), dtype)?;
        Ok(Tensor::from_op(out, "dropout", &[self], move |g| {
            Ok(vec![Some(mask.apply("dropout_grad", (g, None), dtype)?)])
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
        let (x_dtype, r_dtype) = (self.dtype(), residual.dtype());
        let dtype = super::promote(x_dtype, r_dtype);
        let out = mask.apply("dropout_add", (self, Some(residual)), dtype)?;
        Ok(Tensor::from_op(
            out,
            "dropout_add",
            &[self, residual],
            move |g| {
                let gr = match g.dtype() == r_dtype {
                    true => g.clone(),
                    false => g.to_dtype(r_dtype)?,
                };
                // The branch's gradient in its own dtype, straight from the kernel.
                let gx = mask.apply("dropout_grad", (g, None), x_dtype)?;
                Ok(vec![Some(gx), Some(gr)])
            },
        ))
    }
}
