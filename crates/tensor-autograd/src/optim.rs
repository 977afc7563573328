//! Optimisers on the backends' fused step kernels (one launch per parameter, state on the
//! device, nothing read back), learning-rate schedules, and gradient clipping.
//!
//! An optimiser does not hold the parameters: `step(&params)` takes them (in a fixed order,
//! as [`crate::nn::ModuleExt::parameters`] returns them), and its state is per position. So a
//! model moved to another device keeps its optimiser: move the state with `to_device`.

use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::{AdamParams, Backend, BackendExt, DType, DeviceBuffer, SgdParams};

/// What every optimiser offers.
pub trait Optimizer<B: Backend> {
    /// One update of every parameter that has a gradient.
    fn step(&mut self, params: &[Tensor<B>]) -> Result<()>;
    fn learning_rate(&self) -> f32;
    fn set_learning_rate(&mut self, lr: f32);
    /// Moves the optimiser state (momenta) to `device`.
    fn to_device(&mut self, device: &B) -> Result<()>;
}

/// The gradient of `p`, checked to be a dense f32 buffer matching it, or `None` if it has
/// none (a parameter that took no part in the loss).
fn dense_grad<B: Backend>(p: &Tensor<B>, op: &'static str) -> Result<Option<Tensor<B>>> {
    if p.dtype() != DType::F32 || !p.is_dense() {
        return Err(invalid(
            op,
            format!("parameters must be dense f32 tensors, got {p:?}"),
        ));
    }
    let Some(g) = p.grad() else { return Ok(None) };
    let g = if g.dtype() == DType::F32 {
        g.dense()?
    } else {
        g.to_dtype(DType::F32)?.dense()?
    };
    Ok(Some(g))
}

/// What every optimiser keeps: the step count, per-parameter-position state buffers (momenta),
/// created zeroed on first use, and the device they live on.
struct State<B: Backend> {
    steps: u64,
    buffers: Vec<Vec<B::Buffer>>,
    device: Option<B>,
}

impl<B: Backend> State<B> {
    fn new() -> Self {
        Self {
            steps: 0,
            buffers: Vec::new(),
            device: None,
        }
    }

    /// Counts a step, then calls `update(param, grad, state, step)` for every parameter with a
    /// gradient, with `kinds` state buffers of the parameter's length.
    fn step(
        &mut self,
        op: &'static str,
        params: &[Tensor<B>],
        kinds: usize,
        mut update: impl FnMut(&Tensor<B>, &Tensor<B>, &[B::Buffer], u64) -> Result<()>,
    ) -> Result<()> {
        self.steps += 1;
        for (i, param) in params.iter().enumerate() {
            let Some(g) = dense_grad(param, op)? else {
                continue;
            };
            if self.buffers.len() <= i {
                self.buffers.resize_with(i + 1, Vec::new);
            }
            let state = &mut self.buffers[i];
            if let Some(b) = state.iter().find(|b| b.len() != param.numel()) {
                return Err(invalid(
                    op,
                    format!(
                        "parameter {i} has {} elements but its state has {}; pass the same parameters in the same order each step",
                        param.numel(),
                        b.len()
                    ),
                ));
            }
            while state.len() < kinds {
                state.push(param.backend().alloc(DType::F32, param.numel())?);
            }
            update(param, &g, &state[..kinds], self.steps)?;
            self.device.get_or_insert_with(|| param.backend().clone());
        }
        Ok(())
    }

    /// Moves every state buffer to `device` (through the host).
    fn move_to(&mut self, device: &B) -> Result<()> {
        if let Some(from) = self.device.replace(device.clone()) {
            for b in self.buffers.iter_mut().flatten() {
                let data = from.read::<f32>(b)?;
                *b = device.upload(&data)?;
            }
        }
        Ok(())
    }
}

/// Stochastic gradient descent with momentum, dampening, Nesterov and weight decay
/// (PyTorch's formulation, [`SgdParams`]).
pub struct Sgd<B: Backend> {
    /// The hyperparameters, as the backends' fused step takes them (`step` is filled in from
    /// the optimiser's own count).
    pub hyper: SgdParams,
    state: State<B>,
}

impl<B: Backend> Sgd<B> {
    pub fn new(lr: f32) -> Self {
        Self {
            hyper: SgdParams {
                lr,
                momentum: 0.0,
                dampening: 0.0,
                weight_decay: 0.0,
                nesterov: false,
                step: 0,
            },
            state: State::new(),
        }
    }
    pub fn momentum(mut self, momentum: f32, nesterov: bool) -> Self {
        self.hyper.momentum = momentum;
        self.hyper.nesterov = nesterov;
        self
    }
    pub fn weight_decay(mut self, weight_decay: f32) -> Self {
        self.hyper.weight_decay = weight_decay;
        self
    }
}

impl<B: Backend> Optimizer<B> for Sgd<B> {
    fn step(&mut self, params: &[Tensor<B>]) -> Result<()> {
        let p = self.hyper;
        let kinds = usize::from(p.momentum != 0.0);
        self.state
            .step("Sgd::step", params, kinds, |param, g, state, step| {
                let p = SgdParams { step, ..p };
                Ok(param
                    .backend()
                    .sgd_step(param.buffer(), g.buffer(), state.first(), &p)?)
            })
    }
    fn learning_rate(&self) -> f32 {
        self.hyper.lr
    }
    fn set_learning_rate(&mut self, lr: f32) {
        self.hyper.lr = lr;
    }
    fn to_device(&mut self, device: &B) -> Result<()> {
        self.state.move_to(device)
    }
}

/// Adam, or AdamW with decoupled weight decay ([`AdamParams`]).
pub struct Adam<B: Backend> {
    /// The hyperparameters, as the backends' fused step takes them (`step` is filled in from
    /// the optimiser's own count).
    pub hyper: AdamParams,
    state: State<B>,
}

impl<B: Backend> Adam<B> {
    /// Adam with PyTorch's defaults (betas 0.9, 0.999; eps 1e-8; no weight decay).
    pub fn new(lr: f32) -> Self {
        Self {
            hyper: AdamParams {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
                decoupled_weight_decay: false,
                step: 0,
            },
            state: State::new(),
        }
    }
    /// AdamW with PyTorch's defaults (weight decay 0.01).
    pub fn adamw(lr: f32) -> Self {
        let mut adam = Self::new(lr);
        adam.hyper.weight_decay = 0.01;
        adam.hyper.decoupled_weight_decay = true;
        adam
    }
    pub fn weight_decay(mut self, weight_decay: f32) -> Self {
        self.hyper.weight_decay = weight_decay;
        self
    }
    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.state.steps
    }
}

impl<B: Backend> Optimizer<B> for Adam<B> {
    fn step(&mut self, params: &[Tensor<B>]) -> Result<()> {
        let p = self.hyper;
        self.state
            .step("Adam::step", params, 2, |param, g, state, step| {
                let p = AdamParams { step, ..p };
                Ok(param.backend().adam_step(
                    param.buffer(),
                    g.buffer(),
                    &state[0],
                    &state[1],
                    &p,
                )?)
            })
    }
    fn learning_rate(&self) -> f32 {
        self.hyper.lr
    }
    fn set_learning_rate(&mut self, lr: f32) {
        self.hyper.lr = lr;
    }
    fn to_device(&mut self, device: &B) -> Result<()> {
        self.state.move_to(device)
    }
}

/// A learning rate as a function of the step (0-based).
pub trait Schedule {
    fn learning_rate(&self, step: u64) -> f32;
}

/// `base * gamma^(step / every)`.
#[derive(Clone, Copy, Debug)]
pub struct StepDecay {
    pub base: f32,
    pub gamma: f32,
    pub every: u64,
}

impl Schedule for StepDecay {
    fn learning_rate(&self, step: u64) -> f32 {
        self.base * self.gamma.powi((step / self.every.max(1)) as i32)
    }
}

/// Linear warm-up over `warmup` steps, then cosine annealing from `base` to `min` at `total`.
#[derive(Clone, Copy, Debug)]
pub struct Cosine {
    pub base: f32,
    pub min: f32,
    pub warmup: u64,
    pub total: u64,
}

impl Schedule for Cosine {
    fn learning_rate(&self, step: u64) -> f32 {
        if step < self.warmup {
            return self.base * (step + 1) as f32 / self.warmup as f32;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let t = ((step - self.warmup) as f32 / span as f32).min(1.0);
        self.min + 0.5 * (self.base - self.min) * (1.0 + (std::f32::consts::PI * t).cos())
    }
}

/// Scales the parameters' gradients so their joint L2 norm is at most `max_norm` and returns
/// the norm before clipping (a one-element device tensor: nothing is read back).
pub fn clip_grad_norm<B: Backend>(
    params: &[Tensor<B>],
    max_norm: f32,
) -> Result<Option<Tensor<B>>> {
    crate::no_grad(|| {
        let grads: Vec<(Tensor<B>, Tensor<B>)> = params
            .iter()
            .filter_map(|p| p.grad().map(|g| (p.clone(), g)))
            .collect();
        let mut total: Option<Tensor<B>> = None;
        for (_, g) in &grads {
            let s = g.square()?.sum_all()?;
            total = Some(match total {
                Some(t) => t.add(&s)?,
                None => s,
            });
        }
        let Some(total) = total else { return Ok(None) };
        let norm = total.sqrt()?;
        // scale = min(1, max_norm / (norm + 1e-6)), computed on the device.
        let scale = norm
            .add_scalar(1e-6)?
            .recip()?
            .mul_scalar(max_norm)?
            .clamp(0.0, 1.0)?;
        for (p, g) in grads {
            p.set_grad(Some(g.mul(&scale)?.dense()?));
        }
        Ok(Some(norm))
    })
}
