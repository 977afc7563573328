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

impl<B: Backend> Tensor<B> {
    /// `softmax(q k^T scale + mask) v` over `q: [b, h, tq, d]`, `k: [b, h, tk, d]`,
    /// `v: [b, h, tk, dv]` (any strides), as PyTorch's `scaled_dot_product_attention`, fused:
    /// one kernel forward and one backward on the GPUs, nothing `tq x tk` stored. The result
    /// `[b, h, tq, dv]` is laid out heads-last in memory. A row with every key masked gives 0
    /// (PyTorch's composed form gives NaN). f32 or f64 (all operands one dtype).
    pub fn scaled_dot_product_attention(
        &self,
        k: &Tensor<B>,
        v: &Tensor<B>,
        options: &AttentionOptions<B>,
    ) -> Result<Tensor<B>> {
        const OP: &str = "scaled_dot_product_attention";
        let q = self;
        for (t, what) in [(q, "q"), (k, "k"), (v, "v")] {
            if t.rank() != 4 {
                return Err(shape_error(
                    OP,
                    t.shape(),
                    &[0, 0, 0, 0],
                    format!("{what} must be [batch, heads, t, width]"),
                ));
            }
        }
        let dtype = q.dtype();
        if !matches!(dtype, DType::F32 | DType::F64)
            || k.dtype() != dtype
            || v.dtype() != dtype
            || options.mask.as_ref().is_some_and(|m| m.dtype() != dtype)
        {
            return Err(invalid(
                OP,
                format!(
                    "q, k, v (and the mask) must share one dtype, f32 or f64; got {}, {}, {}",
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
                OP,
                "the mask gets no gradient here; detach it (or compose the attention by hand)",
            ));
        }
        let (b, h, tq, dv) = (q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[3]);
        let d = q.shape()[3];
        let p = AttentionParams {
            scale: options.scale.unwrap_or(1.0 / (d.max(1) as f32).sqrt()),
            causal: options.causal,
            dropout: options.dropout,
            seed: options.seed,
            offset: options.offset,
        };
        let backend = q.backend().clone();
        let out = Tensor::for_write_as(&backend, heads_last(&[b, h, tq, dv]), dtype)?;
        let lse = Tensor::for_write(&backend, &[b, h, tq], dtype)?;
        let mask = options.mask.clone();
        backend.attention(
            AttentionInputs {
                q: q.view(),
                k: k.view(),
                v: v.view(),
                mask: mask.as_ref().map(|m| m.view()),
            },
            out.view(),
            lse.view(),
            &p,
        )?;
        let (qs, ks, vs, saved_out) = (q.clone(), k.clone(), v.clone(), out.clone());
        Ok(Tensor::from_op(out, "attention", &[q, k, v], move |g| {
            let be = qs.backend();
            let cast;
            let g = if g.dtype() == dtype {
                g
            } else {
                cast = g.to_dtype(dtype)?;
                &cast
            };
            let grads = [
                Tensor::for_write_as(be, heads_last(qs.shape()), dtype)?,
                Tensor::for_write_as(be, heads_last(ks.shape()), dtype)?,
                Tensor::for_write_as(be, heads_last(vs.shape()), dtype)?,
            ];
            be.attention_backward(
                AttentionInputs {
                    q: qs.view(),
                    k: ks.view(),
                    v: vs.view(),
                    mask: mask.as_ref().map(|m| m.view()),
                },
                saved_out.view(),
                lse.view(),
                g.view(),
                AttentionGrads {
                    dq: grads[0].view(),
                    dk: grads[1].view(),
                    dv: grads[2].view(),
                },
                &p,
            )?;
            Ok(grads.into_iter().map(Some).collect())
        }))
    }
}
