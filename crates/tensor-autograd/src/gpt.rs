//! A GPT as nanoGPT's `model.py` defines it (Karpathy, MIT): token and position embeddings,
//! `n_layer` pre-norm blocks of causal self-attention and a GELU MLP, a final LayerNorm, and
//! a language-model head tied to the token embedding. The state's names and shapes are
//! nanoGPT's (`transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight`, ...), so
//! [`Gpt::save`] writes a file nanoGPT's `GPT` loads with `strict=True`; its initialisation
//! is nanoGPT's (normal 0.02, the residual projections 0.02 / sqrt(2 n_layer)).
//!
//! Attention is one fused operation ([`Tensor::scaled_dot_product_attention`], causal, with
//! dropout on the weights), or, for comparison, composed from matmul, an additive causal mask
//! and softmax ([`Gpt::set_fused_attention`]).

use crate::error::{Result, invalid, shape_error};
use crate::nn::{Init, Linear, Module, StateKind};
use crate::ops::AttentionOptions;
use crate::tensor::Tensor;
use hal::{Backend, DType, Distribution};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// nanoGPT's `GPTConfig`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    pub block_size: usize,
    pub vocab_size: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub dropout: f32,
    /// Biases in the Linears and LayerNorms (GPT-2's); nanoGPT's `train.py` defaults to none.
    pub bias: bool,
}

impl GptConfig {
    /// nanoGPT's `train_shakespeare_char.py`: 6 layers, 6 heads, 384 wide, block 256, dropout
    /// 0.2, no biases.
    pub fn shakespeare_char(vocab_size: usize) -> Self {
        Self {
            block_size: 256,
            vocab_size,
            n_layer: 6,
            n_head: 6,
            n_embd: 384,
            dropout: 0.2,
            bias: false,
        }
    }

    /// GPT-2 124M as nanoGPT trains it: 12 layers, 12 heads, 768 wide, block 1024, the
    /// vocabulary padded to 50,304.
    pub fn gpt2_124m() -> Self {
        Self {
            block_size: 1024,
            vocab_size: 50304,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            dropout: 0.0,
            bias: false,
        }
    }

    fn check(&self) -> Result<()> {
        if self.n_head == 0 || self.n_embd % self.n_head != 0 {
            return Err(invalid(
                "GptConfig",
                format!(
                    "n_embd {} is not a multiple of n_head {}",
                    self.n_embd, self.n_head
                ),
            ));
        }
        if self.block_size == 0 || self.vocab_size == 0 || self.n_layer == 0 {
            return Err(invalid(
                "GptConfig",
                "block, vocabulary and depth must be positive",
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(invalid("GptConfig", "dropout must be in [0, 1)"));
        }
        Ok(())
    }
}

/// LayerNorm over the last dimension with an optional bias (nanoGPT's, eps 1e-5).
struct Norm<B: Backend> {
    weight: Tensor<B>,
    bias: Option<Tensor<B>>,
}

impl<B: Backend> Norm<B> {
    fn new(init: &mut Init<B>, dim: usize, bias: bool) -> Result<Self> {
        Ok(Self {
            weight: init.constant(&[dim], 1.0)?,
            bias: if bias {
                Some(init.constant(&[dim], 0.0)?)
            } else {
                None
            },
        })
    }

    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        x.layer_norm(1, Some(&self.weight), self.bias.as_ref(), 1e-5)
    }

    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor<B>, StateKind)) {
        f(
            &format!("{prefix}.weight"),
            &self.weight,
            StateKind::Parameter,
        );
        if let Some(b) = &self.bias {
            f(&format!("{prefix}.bias"), b, StateKind::Parameter);
        }
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>, StateKind)) {
        f(
            &format!("{prefix}.weight"),
            &mut self.weight,
            StateKind::Parameter,
        );
        if let Some(b) = &mut self.bias {
            f(&format!("{prefix}.bias"), b, StateKind::Parameter);
        }
    }
}

/// A Linear with nanoGPT's initialisation: weight normal(0, `std`), bias zero.
fn linear<B: Backend>(
    init: &mut Init<B>,
    inputs: usize,
    outputs: usize,
    bias: bool,
    std: f32,
) -> Result<Linear<B>> {
    Ok(Linear {
        weight: init.parameter(&[outputs, inputs], Distribution::Normal { mean: 0.0, std })?,
        bias: if bias {
            Some(init.constant(&[outputs], 0.0)?)
        } else {
            None
        },
    })
}

struct Block<B: Backend> {
    ln_1: Norm<B>,
    c_attn: Linear<B>,
    attn_proj: Linear<B>,
    ln_2: Norm<B>,
    c_fc: Linear<B>,
    mlp_proj: Linear<B>,
}

/// A GPT (see the module docs). `forward` takes `u32` token ids `[batch, t]` (t at most the
/// block size) and gives logits `[batch, t, vocab_size]`.
pub struct Gpt<B: Backend> {
    pub config: GptConfig,
    wte: Tensor<B>,
    wpe: Tensor<B>,
    blocks: Vec<Block<B>>,
    ln_f: Norm<B>,
    /// `[block, block]`: 0 on and below the diagonal, -inf above (added to the scores).
    causal: Tensor<B>,
    /// Position ids `0..block` (`u32`).
    positions: Tensor<B>,
    training: bool,
    fused_attention: bool,
    /// Each dropout call's seed offset, so no two calls share a mask.
    dropout_calls: AtomicU64,
    seed: u64,
}

impl<B: Backend> Gpt<B> {
    pub fn new(init: &mut Init<B>, config: GptConfig) -> Result<Self> {
        config.check()?;
        let (c, bias) = (config.n_embd, config.bias);
        let normal = |std| Distribution::Normal { mean: 0.0, std };
        let proj_std = 0.02 / (2.0 * config.n_layer as f32).sqrt();
        let wte = init.parameter(&[config.vocab_size, c], normal(0.02))?;
        let wpe = init.parameter(&[config.block_size, c], normal(0.02))?;
        let mut blocks = Vec::with_capacity(config.n_layer);
        for _ in 0..config.n_layer {
            blocks.push(Block {
                ln_1: Norm::new(init, c, bias)?,
                c_attn: linear(init, c, 3 * c, bias, 0.02)?,
                attn_proj: linear(init, c, c, bias, proj_std)?,
                ln_2: Norm::new(init, c, bias)?,
                c_fc: linear(init, c, 4 * c, bias, 0.02)?,
                mlp_proj: linear(init, 4 * c, c, bias, proj_std)?,
            });
        }
        let ln_f = Norm::new(init, c, bias)?;
        let backend = init.backend().clone();
        let t = config.block_size;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let causal = Tensor::from_slice(&backend, &mask, &[t, t])?;
        let ids: Vec<u32> = (0..t as u32).collect();
        let positions = Tensor::from_elements(&backend, &ids, &[t])?;
        Ok(Self {
            config,
            wte,
            wpe,
            blocks,
            ln_f,
            causal,
            positions,
            training: true,
            fused_attention: true,
            dropout_calls: AtomicU64::new(0),
            seed: init.seed(),
        })
    }

    /// Training mode (dropout on) or evaluation.
    pub fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    /// Fused attention (the default) or the composed form: matmul, the additive causal mask,
    /// softmax, dropout, matmul. Both draw the same dropout masks, so they agree to rounding.
    pub fn set_fused_attention(&mut self, fused: bool) {
        self.fused_attention = fused;
    }

    /// The dropout probability in the current mode and the next call's stream offset.
    fn next_dropout(&self) -> Option<(f32, u64)> {
        if !self.training || self.config.dropout == 0.0 {
            return None;
        }
        let call = self.dropout_calls.fetch_add(1, Ordering::Relaxed);
        Some((self.config.dropout, call.wrapping_mul(1 << 32)))
    }

    fn dropout(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        match self.next_dropout() {
            Some((p, offset)) => x.dropout(p, self.seed, offset),
            None => Ok(x.clone()),
        }
    }

    fn attention(&self, b: &Block<B>, x: &Tensor<B>) -> Result<Tensor<B>> {
        let (batch, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let (h, d) = (self.config.n_head, c / self.config.n_head);
        let qkv = x.linear(&b.c_attn.weight, b.c_attn.bias.as_ref())?;
        if self.fused_attention {
            let (dropout, offset) = self.next_dropout().unwrap_or((0.0, 0));
            let options = AttentionOptions {
                causal: true,
                dropout,
                seed: self.seed,
                offset,
                ..AttentionOptions::default()
            };
            let y = qkv.qkv_attention(h, &options)?;
            return y.linear(&b.attn_proj.weight, b.attn_proj.bias.as_ref());
        }
        let heads = |k: usize| -> Result<Tensor<B>> {
            qkv.narrow(2, k * c, c)?
                .reshape(&[batch, t, h, d])?
                .permute(&[0, 2, 1, 3])
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let mask = self.causal.narrow(0, 0, t)?.narrow(1, 0, t)?;
        let scores = q
            .matmul(&k.transpose(-2, -1)?)?
            .mul_scalar(1.0 / (d as f32).sqrt())?
            .add(&mask)?;
        let att = self.dropout(&scores.softmax(-1)?)?;
        let y = att
            .matmul(&v)?
            .permute(&[0, 2, 1, 3])?
            .reshape(&[batch, t, c])?;
        y.linear(&b.attn_proj.weight, b.attn_proj.bias.as_ref())
    }

    fn mlp(&self, b: &Block<B>, x: &Tensor<B>) -> Result<Tensor<B>> {
        let hidden = x.linear(&b.c_fc.weight, b.c_fc.bias.as_ref())?.gelu()?;
        hidden.linear(&b.mlp_proj.weight, b.mlp_proj.bias.as_ref())
    }

    /// `x + dropout(branch)`: a block's residual connection, in one kernel when training.
    fn residual(&self, x: &Tensor<B>, branch: &Tensor<B>) -> Result<Tensor<B>> {
        match self.next_dropout() {
            Some((p, offset)) => branch.dropout_add(x, p, self.seed, offset),
            None => x.add(branch),
        }
    }

    /// Logits `[batch, t, vocab]` of token ids `[batch, t]`.
    pub fn forward(&self, idx: &Tensor<B>) -> Result<Tensor<B>> {
        if idx.rank() != 2 || idx.shape()[1] == 0 || idx.shape()[1] > self.config.block_size {
            return Err(shape_error(
                "Gpt::forward",
                idx.shape(),
                &[self.config.block_size],
                "expects token ids [batch, t] with 1 <= t <= block_size",
            ));
        }
        if !matches!(idx.dtype(), DType::U32 | DType::I32) {
            return Err(invalid("Gpt::forward", "token ids must be u32 or i32"));
        }
        let (batch, t) = (idx.shape()[0], idx.shape()[1]);
        let c = self.config.n_embd;
        let tok = self
            .wte
            .index_select(0, &idx.flatten(0)?)?
            .reshape(&[batch, t, c])?;
        let pos = self.wpe.index_select(0, &self.positions.narrow(0, 0, t)?)?;
        let mut x = self.dropout(&tok.add(&pos)?)?;
        for b in &self.blocks {
            x = self.residual(&x, &self.attention(b, &b.ln_1.forward(&x)?)?)?;
            x = self.residual(&x, &self.mlp(b, &b.ln_2.forward(&x)?)?)?;
        }
        let x = self.ln_f.forward(&x)?;
        // The head is the token embedding (tied weights): logits = x wte^T.
        x.linear(&self.wte, None)
    }

    /// Mean cross-entropy of the next-token predictions: `targets` `[batch, t]` (`u32`).
    pub fn loss(&self, idx: &Tensor<B>, targets: &Tensor<B>) -> Result<Tensor<B>> {
        let logits = self.forward(idx)?;
        let (batch, t) = (idx.shape()[0], idx.shape()[1]);
        logits
            .reshape(&[batch * t, self.config.vocab_size])?
            .cross_entropy(&targets.reshape(&[batch * t])?)
    }

    /// Continues `prompt` by `new_tokens` tokens, each drawn from the softmax of the last
    /// position's logits divided by `temperature`, among the `top_k` most likely (all where
    /// `None`), as nanoGPT's `generate`. The context is cropped to the block size. `seed`
    /// makes the draw repeatable. Runs without gradients, in the current mode (call
    /// `set_training(false)` first, as nanoGPT's `sample.py` does `model.eval()`).
    pub fn generate(
        &self,
        prompt: &[u32],
        new_tokens: usize,
        temperature: f32,
        top_k: Option<usize>,
        seed: u64,
    ) -> Result<Vec<u32>> {
        if prompt.is_empty() {
            return Err(invalid("Gpt::generate", "an empty prompt"));
        }
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(invalid("Gpt::generate", "temperature must be positive"));
        }
        let backend = self.wte.backend().clone();
        let mut tokens = prompt.to_vec();
        let mut state = seed;
        crate::no_grad(|| -> Result<()> {
            for _ in 0..new_tokens {
                let start = tokens.len().saturating_sub(self.config.block_size);
                let context = &tokens[start..];
                let idx = Tensor::from_elements(&backend, context, &[1, context.len()])?;
                let logits = self.forward(&idx)?;
                let last = logits
                    .narrow(1, context.len() - 1, 1)?
                    .reshape(&[self.config.vocab_size])?
                    .to_vec()?;
                tokens.push(sample(&last, temperature, top_k, &mut state));
            }
            Ok(())
        })?;
        Ok(tokens)
    }

    /// Every named tensor, nanoGPT's names, the tied head once (as `transformer.wte.weight`).
    pub fn visit(&self, f: &mut dyn FnMut(&str, &Tensor<B>, StateKind)) {
        let p = StateKind::Parameter;
        f("transformer.wte.weight", &self.wte, p);
        f("transformer.wpe.weight", &self.wpe, p);
        for (i, b) in self.blocks.iter().enumerate() {
            let pre = format!("transformer.h.{i}");
            b.ln_1.visit(&format!("{pre}.ln_1"), f);
            b.c_attn.visit(&format!("{pre}.attn.c_attn"), f);
            b.attn_proj.visit(&format!("{pre}.attn.c_proj"), f);
            b.ln_2.visit(&format!("{pre}.ln_2"), f);
            b.c_fc.visit(&format!("{pre}.mlp.c_fc"), f);
            b.mlp_proj.visit(&format!("{pre}.mlp.c_proj"), f);
        }
        self.ln_f.visit("transformer.ln_f", f);
    }

    /// [`Gpt::visit`] with each tensor replaceable (loading a file).
    pub fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor<B>, StateKind)) {
        let p = StateKind::Parameter;
        f("transformer.wte.weight", &mut self.wte, p);
        f("transformer.wpe.weight", &mut self.wpe, p);
        for (i, b) in self.blocks.iter_mut().enumerate() {
            let pre = format!("transformer.h.{i}");
            b.ln_1.visit_mut(&format!("{pre}.ln_1"), f);
            b.c_attn.visit_mut(&format!("{pre}.attn.c_attn"), f);
            b.attn_proj.visit_mut(&format!("{pre}.attn.c_proj"), f);
            b.ln_2.visit_mut(&format!("{pre}.ln_2"), f);
            b.c_fc.visit_mut(&format!("{pre}.mlp.c_fc"), f);
            b.mlp_proj.visit_mut(&format!("{pre}.mlp.c_proj"), f);
        }
        self.ln_f.visit_mut("transformer.ln_f", f);
    }

    /// The trainable parameters (the tied head once).
    pub fn parameters(&self) -> Vec<Tensor<B>> {
        let mut out = Vec::new();
        self.visit(&mut |_, t, _| out.push(t.clone()));
        out
    }

    /// How many scalars the parameters hold (nanoGPT's count includes the position
    /// embedding; its `get_num_params` subtracts it by default).
    pub fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Tensor::numel).sum()
    }

    /// Writes the parameters as safetensors under nanoGPT's names, with `lm_head.weight` (the
    /// tied head, which nanoGPT's state dict lists too) as a copy of the token embedding.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors = Vec::new();
        self.visit(&mut |name, t, _| tensors.push((name.to_string(), t.clone())));
        tensors.push(("lm_head.weight".to_string(), self.wte.clone()));
        crate::nn::save_safetensors(&tensors, path)
    }

    /// Reads a file written by [`Gpt::save`] (or nanoGPT's state dict saved as safetensors):
    /// every tensor must be there with its shape.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let mut tensors = Vec::new();
        self.visit(&mut |name, t, _| tensors.push((name.to_string(), t.clone())));
        crate::nn::load_safetensors(&tensors, path)
    }
}

/// Draws from `softmax(logits / temperature)` restricted to the `top_k` largest, with a
/// SplitMix64 state.
fn sample(logits: &[f32], temperature: f32, top_k: Option<usize>, state: &mut u64) -> u32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let keep = top_k.unwrap_or(logits.len()).clamp(1, logits.len());
    let best = logits[order[0]] as f64;
    let weights: Vec<f64> = order[..keep]
        .iter()
        .map(|&i| ((logits[i] as f64 - best) / temperature as f64).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let u = (crate::data::splitmix(*state) >> 11) as f64 * 2f64.powi(-53) * total;
    let mut acc = 0.0;
    for (w, &i) in weights.iter().zip(&order[..keep]) {
        acc += w;
        if u < acc {
            return i as u32;
        }
    }
    order[keep - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_respects_top_k_and_temperature() {
        let logits = [0.0, 5.0, 1.0, 4.9];
        let mut s = 3;
        for _ in 0..50 {
            let t = sample(&logits, 1.0, Some(2), &mut s);
            assert!(t == 1 || t == 3, "{t}");
        }
        // A tiny temperature picks the maximum.
        for _ in 0..20 {
            assert_eq!(sample(&logits, 1e-4, None, &mut s), 1);
        }
    }
}
