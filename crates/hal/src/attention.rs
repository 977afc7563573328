//! Scaled dot-product attention's parameters and operands ([`crate::Backend::attention`],
//! [`crate::Backend::attention_backward`]), and the dropout rule every backend reproduces.
//!
//! The contract, for each batch `b` and head `h` (`q: [b, h, tq, d]`, `k: [b, h, tk, d]`,
//! `v: [b, h, tk, dv]`):
//!
//! - scores `s_ij = scale * (q_i . k_j) + mask_ij`, with `s_ij = -inf` where `causal` and
//!   `j > i` (PyTorch's `is_causal`: the upper triangle of the top-left-aligned square);
//! - weights `p_ij = exp(s_ij - lse_i)` with `lse_i = ln sum_j exp(s_ij)` (written to `lse`);
//!   a row whose every score is `-inf` has `lse_i = -inf`, weights 0 and output 0 (and no
//!   gradient), where a composed softmax would give NaN;
//! - dropout: `p~_ij = p_ij * z_ij / (1 - dropout)` with `z_ij = 1` where [`keeps`] says so;
//! - `out_i = sum_j p~_ij v_j`.
//!
//! The backward pass recomputes the weights from `lse` (nothing `tq x tk` is stored):
//! `dv_j = sum_i p~_ij dout_i`, `dp_ij = z_ij / (1 - dropout) * (dout_i . v_j)`,
//! `ds_ij = p_ij (dp_ij - delta_i)` with `delta_i = dout_i . out_i`,
//! `dq_i = scale * sum_j ds_ij k_j`, `dk_j = scale * sum_i ds_ij q_i`. The mask gets no
//! gradient.

use crate::View;
use crate::random::philox_words;

/// What [`crate::Backend::attention`] computes besides its operands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Multiplies `q . k` (usually `1 / sqrt(d)`). Finite.
    pub scale: f32,
    /// Masks `j > i` (each query sees itself and the keys before it).
    pub causal: bool,
    /// The probability of dropping each weight, in `[0, 1)`; 0 turns dropout off.
    pub dropout: f32,
    /// The dropout stream's seed and the position of element `[0, 0, 0, 0]` in it: weight
    /// `[b, h, i, j]` is decided by stream position `offset + ((b * heads + h) * tq + i) * tk + j`.
    pub seed: u64,
    pub offset: u64,
}

impl AttentionParams {
    /// No mask, no dropout: `scale = 1 / sqrt(d)`.
    pub fn new(d: usize) -> Self {
        Self {
            scale: 1.0 / (d as f32).sqrt(),
            causal: false,
            dropout: 0.0,
            seed: 0,
            offset: 0,
        }
    }

    /// The factor kept weights are multiplied by: `1 / (1 - dropout)`.
    pub fn keep_scale(&self) -> f32 {
        1.0 / (1.0 - self.dropout)
    }

    /// The 32-bit threshold at and above which a Philox word keeps its weight: a weight is
    /// kept where `unit_uniform(word) >= dropout`, i.e. where `word >> 8 >= ceil(dropout * 2^24)`.
    pub fn keep_threshold(&self) -> u32 {
        crate::random::keep_threshold(self.dropout)
    }
}

/// Whether weight `index` (its stream position, `offset` included) is kept: the first
/// Philox word's top 24 bits, as a uniform in `[0, 1)`, are at least `dropout`. The same
/// decision as `tensor-autograd`'s `dropout` at that position, so a composed attention with
/// the same seed drops the same weights.
#[inline]
pub fn keeps(p: &AttentionParams, index: u64) -> bool {
    p.dropout == 0.0 || (philox_words(p.seed, index)[0] >> 8) >= p.keep_threshold()
}

/// The operands of both passes: `q: [b, h, tq, d]`, `k: [b, h, tk, d]`, `v: [b, h, tk, dv]`
/// (any strides), and an optional additive mask broadcastable to `[b, h, tq, tk]`
/// (`-inf` drops a weight).
#[derive(Debug)]
pub struct AttentionInputs<'a, Buf> {
    pub q: View<'a, Buf>,
    pub k: View<'a, Buf>,
    pub v: View<'a, Buf>,
    pub mask: Option<View<'a, Buf>>,
}

impl<Buf> Clone for AttentionInputs<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for AttentionInputs<'_, Buf> {}

/// The backward pass's outputs, overwritten: `dq` shaped as `q`, `dk` as `k`, `dv` as `v`.
#[derive(Debug)]
pub struct AttentionGrads<'a, Buf> {
    pub dq: View<'a, Buf>,
    pub dk: View<'a, Buf>,
    pub dv: View<'a, Buf>,
}

impl<Buf> Clone for AttentionGrads<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for AttentionGrads<'_, Buf> {}

/// A view widened to f32 for [`attention_widened`]: the view itself where it is f32 (or
/// f64), else a contiguous f32 copy (exact: every 16-bit value is an f32).
struct Widened<B: crate::Backend> {
    buffer: Option<B::Buffer>,
    layout: crate::Layout,
}

impl<B: crate::Backend> Widened<B> {
    fn of(backend: &B, v: View<'_, B::Buffer>) -> crate::Result<Self> {
        if v.dtype().size_in_bytes() != 2 {
            return Ok(Self {
                buffer: None,
                layout: v.layout.clone(),
            });
        }
        let layout = crate::Layout::contiguous(&v.layout.shape);
        let buffer = backend.alloc_for_write(crate::DType::F32, layout.numel().max(1))?;
        backend.copy(v, View::new(&buffer, &layout))?;
        Ok(Self {
            buffer: Some(buffer),
            layout,
        })
    }

    /// A fresh f32 output shaped as `v` where `v` is 16-bit (its result is copied back by
    /// [`Widened::store`]).
    fn output(backend: &B, v: View<'_, B::Buffer>) -> crate::Result<Self> {
        if v.dtype().size_in_bytes() != 2 {
            return Self::of(backend, v);
        }
        let layout = crate::Layout::contiguous(&v.layout.shape);
        let buffer = backend.alloc_for_write(crate::DType::F32, layout.numel().max(1))?;
        Ok(Self {
            buffer: Some(buffer),
            layout,
        })
    }

    fn view<'a>(&'a self, original: View<'a, B::Buffer>) -> View<'a, B::Buffer> {
        match &self.buffer {
            Some(b) => View::new(b, &self.layout),
            None => original,
        }
    }

    /// Rounds the f32 result into `out` (nothing where `out` was used directly).
    fn store(&self, backend: &B, out: View<'_, B::Buffer>) -> crate::Result<()> {
        match &self.buffer {
            Some(b) => backend.copy(View::new(b, &self.layout), out),
            None => Ok(()),
        }
    }
}

/// [`crate::Backend::attention`] of 16-bit operands through f32 copies, for a backend without
/// 16-bit attention kernels: the operands widened (exactly), the f32 call, the output rounded
/// once into `out`. Validates first.
pub fn attention_widened<B: crate::Backend>(
    backend: &B,
    x: AttentionInputs<'_, B::Buffer>,
    out: View<'_, B::Buffer>,
    lse: View<'_, B::Buffer>,
    p: &AttentionParams,
) -> crate::Result<()> {
    crate::validate::attention(x, out, lse, p)?;
    let [q, k, v] = [x.q, x.k, x.v].map(|v| Widened::of(backend, v));
    let (q, k, v) = (q?, k?, v?);
    let mask = x.mask.map(|m| Widened::of(backend, m)).transpose()?;
    let o = Widened::output(backend, out)?;
    let wide = AttentionInputs {
        q: q.view(x.q),
        k: k.view(x.k),
        v: v.view(x.v),
        mask: mask.as_ref().zip(x.mask).map(|(w, m)| w.view(m)),
    };
    backend.attention(wide, o.view(out), lse, p)?;
    o.store(backend, out)
}

/// [`crate::Backend::attention_backward`] of 16-bit operands through f32 copies, as
/// [`attention_widened`].
pub fn attention_backward_widened<B: crate::Backend>(
    backend: &B,
    x: AttentionInputs<'_, B::Buffer>,
    [out, lse, dout]: [View<'_, B::Buffer>; 3],
    g: AttentionGrads<'_, B::Buffer>,
    p: &AttentionParams,
) -> crate::Result<()> {
    crate::validate::attention_backward(x, out, lse, dout, g, p)?;
    let [q, k, v, o, d] = [x.q, x.k, x.v, out, dout].map(|v| Widened::of(backend, v));
    let (q, k, v, o, d) = (q?, k?, v?, o?, d?);
    let mask = x.mask.map(|m| Widened::of(backend, m)).transpose()?;
    let [dq, dk, dv] = [g.dq, g.dk, g.dv].map(|v| Widened::output(backend, v));
    let (dq, dk, dv) = (dq?, dk?, dv?);
    let wide = AttentionInputs {
        q: q.view(x.q),
        k: k.view(x.k),
        v: v.view(x.v),
        mask: mask.as_ref().zip(x.mask).map(|(w, m)| w.view(m)),
    };
    let grads = AttentionGrads {
        dq: dq.view(g.dq),
        dk: dk.view(g.dk),
        dv: dv.view(g.dv),
    };
    backend.attention_backward(wide, o.view(out), lse, d.view(dout), grads, p)?;
    dq.store(backend, g.dq)?;
    dk.store(backend, g.dk)?;
    dv.store(backend, g.dv)
}
