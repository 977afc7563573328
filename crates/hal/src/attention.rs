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
