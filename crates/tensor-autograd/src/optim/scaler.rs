//! Loss scaling for f16 training, as PyTorch's `torch.amp.GradScaler`.

use super::Optimizer;
use super::clip::scale_by_norm;
use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::Backend;

/// Dynamic loss scaling for training under [`crate::autocast`] with f16, whose smallest
/// normal value (6.1e-5) flushes small gradients to zero and whose largest (65504) lets
/// large ones overflow.
///
/// Each step: back-propagate from [`GradScaler::scale_loss`] (the loss times the scale), then
/// [`GradScaler::step`]: the gradients are divided by the scale (optionally clipped in the
/// same pass, [`GradScaler::unscale`]) and the optimisers step only where their joint norm is
/// finite. After a step that overflowed the scale is multiplied by `backoff` (0.5); after
/// `growth_interval` (2000) steps in a row that did not, by `growth` (2). The defaults are
/// PyTorch's, starting at 65536. One scalar (the norm) is read back per step.
#[derive(Clone, Debug)]
pub struct GradScaler {
    scale: f32,
    growth: f32,
    backoff: f32,
    growth_interval: u32,
    good_steps: u32,
    /// The norm [`GradScaler::unscale`] found since the last step, if it ran.
    unscaled: Option<f32>,
    skipped: u64,
}

impl Default for GradScaler {
    fn default() -> Self {
        Self::new()
    }
}

impl GradScaler {
    pub fn new() -> Self {
        Self {
            scale: 65536.0,
            growth: 2.0,
            backoff: 0.5,
            growth_interval: 2000,
            good_steps: 0,
            unscaled: None,
            skipped: 0,
        }
    }

    /// Starts from `scale` (finite, positive) instead of 65536.
    pub fn init_scale(mut self, scale: f32) -> Result<Self> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(invalid(
                "GradScaler",
                format!("the scale must be finite and positive, got {scale}"),
            ));
        }
        self.scale = scale;
        Ok(self)
    }

    /// Grows the scale after `steps` (at least 1) steps without overflow instead of 2000.
    pub fn growth_interval(mut self, steps: u32) -> Result<Self> {
        if steps == 0 {
            return Err(invalid(
                "GradScaler",
                "the growth interval must be at least 1",
            ));
        }
        self.growth_interval = steps;
        Ok(self)
    }

    /// The current scale.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// How many steps were skipped because their gradients overflowed.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }

    /// `loss * scale`: back-propagate from this instead of `loss`.
    pub fn scale_loss<B: Backend>(&self, loss: &Tensor<B>) -> Result<Tensor<B>> {
        loss.mul_scalar(self.scale)
    }

    /// Divides every gradient of `params` by the scale in place (grouped launches, as
    /// [`super::clip_grad_norm`]'s) and, with `max_norm`, clips them to that joint norm in the
    /// same pass. Returns the unscaled gradients' joint norm: not finite where some gradient
    /// overflowed (the gradients are then unusable, and [`GradScaler::step`] skips the
    /// optimiser). Call it between the backward pass and `step` to clip or inspect
    /// gradients; `step` calls it otherwise. `None` where no parameter has a gradient.
    pub fn unscale<B: Backend>(
        &mut self,
        params: &[Tensor<B>],
        max_norm: Option<f32>,
    ) -> Result<Option<f32>> {
        if self.unscaled.is_some() {
            return Err(invalid(
                "GradScaler::unscale",
                "the gradients were already unscaled since the last step",
            ));
        }
        let inv = 1.0 / self.scale;
        let factor = |norm: &Tensor<B>| -> Result<Tensor<B>> {
            match max_norm {
                // min(1, max_norm / (norm / scale + 1e-6)) / scale.
                Some(max) => norm
                    .mul_scalar(inv)?
                    .add_scalar(1e-6)?
                    .recip()?
                    .mul_scalar(max)?
                    .clamp(0.0, 1.0)?
                    .mul_scalar(inv),
                None => Tensor::full(norm.backend(), norm.shape(), inv as f64, norm.dtype()),
            }
        };
        let Some(norm) = scale_by_norm(params, &factor)? else {
            return Ok(None);
        };
        let norm = norm.item()? * inv;
        self.unscaled = Some(norm);
        Ok(Some(norm))
    }

    /// Steps each optimiser on its parameters unless their gradients overflowed (unscaling
    /// them all first where [`GradScaler::unscale`] did not run), then updates the scale.
    /// Returns whether the optimisers stepped.
    pub fn step<B: Backend>(
        &mut self,
        steps: &mut [(&mut dyn Optimizer<B>, &[Tensor<B>])],
    ) -> Result<bool> {
        let norm = match self.unscaled {
            Some(norm) => Some(norm),
            None => {
                let all: Vec<Tensor<B>> =
                    steps.iter().flat_map(|(_, p)| p.iter().cloned()).collect();
                self.unscale(&all, None)?
            }
        };
        self.unscaled = None;
        let Some(norm) = norm else {
            return Ok(false);
        };
        if !norm.is_finite() {
            self.scale *= self.backoff;
            self.good_steps = 0;
            self.skipped += 1;
            return Ok(false);
        }
        for (optimizer, params) in steps.iter_mut() {
            optimizer.step(params)?;
        }
        self.good_steps += 1;
        if self.good_steps >= self.growth_interval {
            let grown = self.scale * self.growth;
            if grown.is_finite() {
                self.scale = grown;
            }
            self.good_steps = 0;
        }
        Ok(true)
    }
}
