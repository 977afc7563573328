//! Scaled dot-product attention as one fused operation forward and one backward
//! ([`hal::Backend::attention`]): no `T x T` matrix is kept for the backward pass, which
//! recomputes the weights from each row's log-sum-exp.

use crate::error::{Result, invalid, shape_error};
use crate::tensor::Tensor;
use hal::{AttentionGrads, AttentionInputs, AttentionParams, Backend, DType, Layout};

/// What [`Tensor::scaled_dot_product_attention`] does besides `softmax(q k^T scale) v`.
#[derive(Clone, Debug)]
pub struct AttentionOptions<B: Backend> {
    /// An additive mask broadcastable to `[b, h, tq, tk]` (`-inf` drops a weight), in the
    /// operands' dtype. It gets no gradient: one that requires a gradient is refused.
    pub mask: Option<Tensor<B>>,
    /// Masks key `j > i` for query `i` (PyTorch's `is_causal`).
    pub causal: bool,
    /// Dropout probability on the weights, in `[0, 1)`; with `seed` and `offset` choosing the
    /// stream ([`Tensor::dropout`]'s), so a run is repeatable.
    pub dropout: f32,
    pub seed: u64,
    pub offset: u64,
    /// Multiplies `q k^T`; `None`: `1 / sqrt(d)`.
    pub scale: Option<f32>,
}

impl<B: Backend> Default for AttentionOptions<B> {
    fn default() -> Self {
        Self {
            mask: None,
            causal: false,
            dropout: 0.0,
            seed: 0,
            offset: 0,
            scale: None,
        }
    }
}

/// The permuted dense layout `[b, h, t, c]` of a `[b, t, h, c]` buffer: the output and the
/// gradients are laid out so, so that merging heads (`permute(0, 2, 1, 3)` then reshape to
/// `[b, t, h c]`) is free, as it is for PyTorch's fused attention.
fn heads_last(shape: &[usize]) -> Layout {
    Layout::contiguous(&[shape[0], shape[2], shape[1], shape[3]])
        .permute(&[0, 2, 1, 3])
        .expect("rank 4")
}

/// One fused attention call's operands and settings, kept for its backward pass.
struct Fused<B: Backend> {
    q: Tensor<B>,
    k: Tensor<B>,
    v: Tensor<B>,
    mask: Option<Tensor<B>>,
    p: AttentionParams,
}

impl<B: Backend> Fused<B> {
    /// Checks the operands (rank 4, one float dtype, a mask without a gradient in that dtype
    /// or f32) and fixes the parameters.
    fn new(
        op: &'static str,
        [q, k, v]: [&Tensor<B>; 3],
        options: &AttentionOptions<B>,
    ) -> Result<Self> {
        for (t, what) in [(q, "q"), (k, "k"), (v, "v")] {
            if t.rank() != 4 {
                return Err(shape_error(
                    op,
                    t.shape(),
                    &[0, 0, 0, 0],
                    format!("{what} must be [batch, heads, t, width]"),
                ));
            }
        }
        let dtype = q.dtype();
        let mask_ok = |m: &Tensor<B>| {
            m.dtype() == dtype || (m.dtype() == DType::F32 && dtype.size_in_bytes() == 2)
        };
        if !dtype.is_float()
            || k.dtype() != dtype
            || v.dtype() != dtype
            || options.mask.as_ref().is_some_and(|m| !mask_ok(m))
        {
            return Err(invalid(
                op,
                format!(
                    "q, k, v must share one float dtype (the mask theirs, or f32 with 16-bit ones); got {}, {}, {}",
                    q.dtype(),
                    k.dtype(),
                    v.dtype()
                ),
            ));
        }
        if options
            .mask
            .as_ref()
            .is_some_and(|m| m.requires_grad_flag())
        {
            return Err(invalid(
                op,
                "the mask gets no gradient here; detach it (or compose the attention by hand)",
            ));
        }
        let d = q.shape()[3];
        Ok(Self {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            mask: options.mask.clone(),
            p: AttentionParams {
                scale: options.scale.unwrap_or(1.0 / (d.max(1) as f32).sqrt()),
                causal: options.causal,
                dropout: options.dropout,
                seed: options.seed,
                offset: options.offset,
            },
        })
    }

    fn inputs(&self) -> AttentionInputs<'_, B::Buffer> {
        AttentionInputs {
            q: self.q.view(),
            k: self.k.view(),
            v: self.v.view(),
            mask: self.mask.as_ref().map(|m| m.view()),
        }
    }

    /// The result `[b, h, tq, dv]`, laid out heads-last, and the rows' log-sum-exps.
    fn forward(&self) -> Result<(Tensor<B>, Tensor<B>)> {
        let (q, v) = (&self.q, &self.v);
        let (b, h, tq, dv) = (q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[3]);
        let backend = q.backend();
        let out = Tensor::for_write_as(backend, heads_last(&[b, h, tq, dv]), q.dtype())?;
        let lse = Tensor::for_write(backend, &[b, h, tq], hal::validate::lse_dtype(q.dtype()))?;
        backend.attention(self.inputs(), out.view(), lse.view(), &self.p)?;
        Ok((out, lse))
    }

    /// Writes the gradients of q, k and v into `grads` (views of their shapes) from the
    /// forward pass's `out` and `lse` and the result's gradient `g`.
    fn backward(
        &self,
        (out, lse): (&Tensor<B>, &Tensor<B>),
        g: &Tensor<B>,
        [dq, dk, dv]: [&Tensor<B>; 3],
    ) -> Result<()> {
        let dtype = self.q.dtype();
        let cast;
        let g = if g.dtype() == dtype {
            g
        } else {
            cast = g.to_dtype(dtype)?;
            &cast
        };
        self.q.backend().attention_backward(
            self.inputs(),
            out.view(),
            lse.view(),
            g.view(),
            AttentionGrads {
                dq: dq.view(),
                dk: dk.view(),
                dv: dv.view(),
            },
            &self.p,
        )?;
        Ok(())
    }
}

impl<B: Backend> Tensor<B> {
    /// `softmax(q k^T scale + mask) v` over `q: [b, h, tq, d]`, `k: [b, h, tk, d]`,
    /// `v: [b, h, tk, dv]` (any strides), as PyTorch's `scaled_dot_product_attention`, fused:
    /// one kernel forward and one backward on the GPUs, nothing `tq x tk` stored. The result
    /// `[b, h, tq, dv]` is laid out heads-last in memory. A row with every key masked gives 0
    /// (PyTorch's composed form gives NaN). Any float dtype, one for q, k and v (16-bit ones
    /// computed in f32, the result rounded once); under [`crate::autocast`], f32 operands are
    /// cast to the autocast dtype first, as PyTorch's autocast does.
    pub fn scaled_dot_product_attention(
        &self,
        k: &Tensor<B>,
        v: &Tensor<B>,
        options: &AttentionOptions<B>,
    ) -> Result<Tensor<B>> {
        if crate::autocast_dtype().is_some() {
            let (q, k, v) = (
                self.autocast_narrow()?,
                k.autocast_narrow()?,
                v.autocast_narrow()?,
            );
            return crate::autocast::outside(|| q.scaled_dot_product_attention(&k, &v, options));
        }
        let fused = Fused::new("scaled_dot_product_attention", [self, k, v], options)?;
        let (out, lse) = fused.forward()?;
        let saved = out.clone();
        Ok(Tensor::from_op(out, "attention", &[self, k, v], move |g| {
            let be = fused.q.backend();
            let dtype = fused.q.dtype();
            let grads = [&fused.q, &fused.k, &fused.v]
                .map(|t| Tensor::for_write_as(be, heads_last(t.shape()), dtype));
            let [dq, dk, dv] = grads;
            let grads = [dq?, dk?, dv?];
            fused.backward((&saved, &lse), g, [&grads[0], &grads[1], &grads[2]])?;
            Ok(grads.into_iter().map(Some).collect())
        }))
    }

    /// Causal-or-masked self-attention over packed projections, as a GPT block computes it:
    /// `self` is `[b, t, 3 c]` holding q, k and v side by side on the last axis (nanoGPT's
    /// `c_attn` output), each split into `heads` heads of `c / heads`; the result is
    /// `[b, t, c]` with the heads merged. The same as narrowing out q, k and v, splitting
    /// heads and calling [`Tensor::scaled_dot_product_attention`], without the copies: the
    /// kernels read the heads where they lie, the result is written heads-merged, and the
    /// backward pass writes all three gradients into one `[b, t, 3 c]` tensor. Under
    /// [`crate::autocast`], an f32 input is cast to the autocast dtype first.
    pub fn qkv_attention(&self, heads: usize, options: &AttentionOptions<B>) -> Result<Tensor<B>> {
        const OP: &str = "qkv_attention";
        if crate::autocast_dtype().is_some() {
            let x = self.autocast_narrow()?;
            return crate::autocast::outside(|| x.qkv_attention(heads, options));
        }
        let shape = self.shape().to_vec();
        if shape.len() != 3 || heads == 0 || shape[2] % (3 * heads) != 0 {
            return Err(shape_error(
                OP,
                &shape,
                &[0, 0, 3 * heads.max(1)],
                format!("expects [batch, t, 3 c] with c a multiple of heads ({heads})"),
            ));
        }
        let (b, t, c) = (shape[0], shape[1], shape[2] / 3);
        let split = move |x: &Tensor<B>| -> Result<[Tensor<B>; 3]> {
            let part = |i: usize| {
                x.narrow(2, i * c, c)?
                    .reshape(&[b, t, heads, c / heads])?
                    .permute(&[0, 2, 1, 3])
            };
            Ok([part(0)?, part(1)?, part(2)?])
        };
        let [q, k, v] = split(&self.detach())?;
        let fused = Fused::new(OP, [&q, &k, &v], options)?;
        let (out, lse) = fused.forward()?;
        // Heads-last [b, h, t, d] is [b, t, c] in memory.
        let merged = out.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c])?;
        Ok(Tensor::from_op(merged, OP, &[self], move |g| {
            let dx = Tensor::for_write(fused.q.backend(), &[b, t, 3 * c], fused.q.dtype())?;
            let [dq, dk, dv] = split(&dx)?;
            let gh = g
                .reshape(&[b, t, heads, c / heads])?
                .permute(&[0, 2, 1, 3])?;
            fused.backward((&out, &lse), &gh, [&dq, &dk, &dv])?;
            Ok(vec![Some(dx)])
        }))
    }
}
