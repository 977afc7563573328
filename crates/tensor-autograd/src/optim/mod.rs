//! Optimisers on the backends' fused step kernels (one launch per parameter, state on the
//! device, nothing read back), learning-rate schedules, gradient clipping, and loss scaling
//! for f16 training ([`GradScaler`]).
//!
//! An optimiser does not hold the parameters: `step(&params)` takes them (in a fixed order,
//! as [`crate::nn::ModuleExt::parameters`] returns them), and its state is per position. So a
//! model moved to another device keeps its optimiser: move the state with `to_device`.
//! A parameter listed more than once (a weight tied between two modules, say) is one
//! parameter: it is updated once a step, and positions count first appearances only.

mod clip;
mod grouped;
mod scaler;
mod state_file;

pub use clip::clip_grad_norm;
pub use scaler::GradScaler;

use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::ir::expr::{Expr, Scope};
use hal::ir::{Access, BufferId};
use hal::{AdamParams, Backend, BackendExt, DType, DeviceBuffer, SgdParams};

/// What every optimiser offers.
pub trait Optimizer<B: Backend> {
    /// One update of every parameter that has a gradient.
    fn step(&mut self, params: &[Tensor<B>]) -> Result<()>;
    fn learning_rate(&self) -> f32;
    fn set_learning_rate(&mut self, lr: f32);
    /// Moves the optimiser state (momenta) to `device`.
    fn to_device(&mut self, device: &B) -> Result<()>;

    /// Makes the optimiser ready to update `params` inside a step recorded for replay
    /// ([`crate::models::RecordedStep`]): creates every state buffer now (one allocated inside
    /// a recording would be zeroed again by each replay on a capturing backend) and puts every
    /// value that changes from step to step on the device, where the recorded launches read it.
    /// Optimisers that cannot do that refuse (the default).
    fn prepare_recorded(&mut self, params: &[Tensor<B>]) -> Result<()> {
        let _ = params;
        Err(invalid(
            "prepare_recorded",
            "this optimiser cannot run inside a recorded step (Adam and AdamW can); use train_step",
        ))
    }

    /// The update inside a recorded step, after [`Optimizer::prepare_recorded`]: device
    /// launches only, reading the per-step values from the device.
    fn step_recorded(&mut self, params: &[Tensor<B>]) -> Result<()> {
        let _ = params;
        Err(invalid(
            "step_recorded",
            "this optimiser cannot run inside a recorded step",
        ))
    }

    /// Called before each replay of a recorded step: counts the step on the host and brings
    /// the device's per-step values up to date where the host changed them (a new learning
    /// rate, eager steps taken in between).
    fn before_replay(&mut self) -> Result<()> {
        Ok(())
    }
}

/// `params` with every repeat of an earlier tensor left out (the same tensor, or the same
/// memory seen through the same layout): a tied weight is stepped once. Borrows when nothing
/// repeats, as in the usual case.
fn unique_params<B: Backend>(params: &[Tensor<B>]) -> std::borrow::Cow<'_, [Tensor<B>]> {
    let same = |a: &Tensor<B>, b: &Tensor<B>| {
        a.id() == b.id() || (a.buffer().same_memory(b.buffer()) && a.layout() == b.layout())
    };
    let repeats = |i: usize| params[..i].iter().any(|p| same(p, &params[i]));
    if !(0..params.len()).any(repeats) {
        return std::borrow::Cow::Borrowed(params);
    }
    let unique = (0..params.len())
        .filter(|&i| !repeats(i))
        .map(|i| params[i].clone())
        .collect();
    std::borrow::Cow::Owned(unique)
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
        let params = unique_params(params);
        self.steps += 1;
        for (i, param) in params.iter().enumerate() {
            let Some(g) = dense_grad(param, op)? else {
                continue;
            };
            let steps = self.steps;
            update(param, &g, self.state_of(op, i, param, kinds)?, steps)?;
        }
        Ok(())
    }

    /// The `kinds` state buffers of parameter `i`, created zeroed on first use.
    fn state_of(
        &mut self,
        op: &'static str,
        i: usize,
        param: &Tensor<B>,
        kinds: usize,
    ) -> Result<&[B::Buffer]> {
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
        self.device.get_or_insert_with(|| param.backend().clone());
        Ok(&self.buffers[i][..kinds])
    }

    /// Creates the `kinds` state buffers of every parameter that lacks them, as its first
    /// step would.
    fn ensure(&mut self, op: &'static str, params: &[Tensor<B>], kinds: usize) -> Result<()> {
        let params = unique_params(params);
        for (i, param) in params.iter().enumerate() {
            dense_grad(param, op)?;
            self.state_of(op, i, param, kinds)?;
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
    /// How recorded steps update, once [`Optimizer::prepare_recorded`] ran.
    recorded: Recorded<B>,
    /// Use the device values on every backend, not only capturing ones.
    force_device_values: bool,
    /// Eager steps' grouped update launches, once built ([`grouped`]).
    eager: Option<grouped::EagerGroups<B>>,
}

/// How [`Adam`] updates inside recorded steps.
enum Recorded<B: Backend> {
    /// Not prepared.
    No,
    /// The backend runs the recorded calls again on each replay: the eager update, as is.
    Eager,
    /// The backend captures: the update reads its per-step values from the device.
    OnDevice(RecordedAdam<B>),
}

/// What Adam keeps on the device for recorded steps: `values = [lr, beta1^t, beta2^t]` (`t`
/// the steps taken), advanced by a one-thread kernel at the start of each recorded update,
/// and the update kernel, which reads them (the fused `adam_step` takes the learning rate and
/// the bias corrections as launch arguments, which a replay would repeat unchanged).
struct RecordedAdam<B: Backend> {
    values: B::Buffer,
    /// This step's `[lr, beta1^t, beta2^t]` as the first of several groups wrote them (see
    /// [`GroupRole`]).
    advanced: B::Buffer,
    advance: B::Kernel,
    update: B::Kernel,
    /// The prepared parameters in groups of up to [`ADAM_GROUP`], each updated by one
    /// launch of its kernel over its longest parameter (used when every parameter has a
    /// gradient; otherwise `update` runs per parameter).
    groups: Vec<AdamGroup<B>>,
    /// The hyperparameters the kernels were built with and the learning rate `values` holds,
    /// and the step count it holds (as the host last wrote or counted it).
    hyper: AdamParams,
    steps: u64,
}

/// See [`RecordedAdam::groups`].
struct AdamGroup<B: Backend> {
    kernel: B::Kernel,
    /// The parameters' positions in the prepared list.
    members: std::ops::Range<usize>,
    longest: usize,
    role: GroupRole,
}

/// Where a grouped update launch sits in the step, which says how it finds the step's bias
/// corrections. The powers `beta^t` advance once a step: with one group, by a launch of
/// their own before it; with several, the first group advances them itself (each of its
/// threads multiplies the previous step's powers in `values` by beta) and its thread 0
/// writes them to `advanced`, which the later groups read, and the last group's thread 0
/// copies them back to `values` for the next step. No launch reads a word that it also
/// writes, so its threads need no ordering among themselves, and a step saves a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GroupRole {
    /// The only group: reads `values`, already advanced by `adam_advance`.
    Alone,
    /// Reads `values` (last step's powers), advances them, writes `advanced`.
    First,
    /// Reads `advanced`.
    Middle,
    /// Reads `advanced`, writes `values`.
    Last,
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
            recorded: Recorded::No,
            force_device_values: false,
            eager: None,
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
    /// Makes recorded steps read the learning rate and bias corrections from the device on
    /// every backend. That is the default, and needed, only where the backend captures
    /// ([`hal::Capabilities::graph_capture`]); elsewhere a replay runs the eager update again,
    /// which is as fast. This exercises the capturing path's update on any backend (tests).
    pub fn device_values_everywhere(mut self) -> Self {
        self.force_device_values = true;
        self
    }
    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.state.steps
    }
}

impl<B: Backend> Optimizer<B> for Adam<B> {
    fn step(&mut self, params: &[Tensor<B>]) -> Result<()> {
        if self.grouped_step(params)? {
            return Ok(());
        }
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
        // A recording's device values belong to the old device: record again there.
        self.recorded = Recorded::No;
        self.eager = None;
        self.state.move_to(device)
    }

    fn prepare_recorded(&mut self, params: &[Tensor<B>]) -> Result<()> {
        let params = &unique_params(params)[..];
        let Some(first) = params.first() else {
            return Err(invalid("prepare_recorded", "no parameters to update"));
        };
        let b = first.backend().clone();
        self.state.ensure("Adam::prepare_recorded", params, 2)?;
        if !b.capabilities().graph_capture && !self.force_device_values {
            self.recorded = Recorded::Eager;
            return Ok(());
        }
        let h = AdamParams {
            step: 0,
            ..self.hyper
        };
        let mut groups = Vec::new();
        // (An empty parameter would have its element 0 read: such lists update one by one.)
        let grouped = match params.iter().all(|p| p.numel() > 0) {
            true => params.len(),
            false => 0,
        };
        let count = grouped.div_ceil(ADAM_GROUP);
        for (g, start) in (0..grouped).step_by(ADAM_GROUP).enumerate() {
            let members = start..(start + ADAM_GROUP).min(params.len());
            let lens: Vec<usize> = params[members.clone()].iter().map(|p| p.numel()).collect();
            let role = match (g, count) {
                (_, 1) => GroupRole::Alone,
                (0, _) => GroupRole::First,
                (g, _) if g + 1 == count => GroupRole::Last,
                _ => GroupRole::Middle,
            };
            groups.push(AdamGroup {
                kernel: b.compile(&adam_group_program(&h, &lens, role)?)?,
                longest: lens.iter().copied().max().unwrap_or(0),
                members,
                role,
            });
        }
        let mut recorded = RecordedAdam {
            values: b.alloc(DType::F32, 3)?,
            advanced: b.alloc(DType::F32, 3)?,
            advance: b.compile(&adam_advance_program(&h)?)?,
            update: b.compile(&adam_update_program(&h)?)?,
            groups,
            hyper: h,
            steps: 0,
        };
        recorded.sync(&b, self.state.steps)?;
        self.recorded = Recorded::OnDevice(recorded);
        Ok(())
    }

    fn step_recorded(&mut self, params: &[Tensor<B>]) -> Result<()> {
        let r = match &self.recorded {
            Recorded::No => {
                return Err(invalid(
                    "step_recorded",
                    "call prepare_recorded before recording",
                ));
            }
            Recorded::Eager => return self.step(params),
            Recorded::OnDevice(r) => r,
        };
        let params = &unique_params(params)[..];
        let Some(first) = params.first() else {
            return Ok(());
        };
        let b = first.backend();
        let prepared = r.groups.last().map(|g| g.members.end) == Some(params.len());
        let mut grads = Vec::with_capacity(params.len());
        for (i, param) in params.iter().enumerate() {
            match self.state.buffers.get(i) {
                Some(s) if s.len() == 2 && s[0].len() == param.numel() => {}
                _ => {
                    return Err(invalid(
                        "Adam::step_recorded",
                        format!(
                            "parameter {i} was not prepared; pass the parameters given to prepare_recorded"
                        ),
                    ));
                }
            }
            grads.push(dense_grad(param, "Adam::step_recorded")?);
        }
        if prepared && grads.iter().all(Option::is_some) {
            for group in &r.groups {
                if group.role == GroupRole::Alone {
                    b.launch(&r.advance, &[&r.values], 1)?;
                }
                let mut args: Vec<&B::Buffer> = Vec::with_capacity(4 * ADAM_GROUP + 2);
                for i in group.members.clone() {
                    let g = grads[i].as_ref().expect("checked above");
                    let state = &self.state.buffers[i];
                    args.extend([params[i].buffer(), g.buffer(), &state[0], &state[1]]);
                }
                args.extend(match group.role {
                    GroupRole::Alone => vec![&r.values],
                    GroupRole::First | GroupRole::Last => vec![&r.values, &r.advanced],
                    GroupRole::Middle => vec![&r.advanced],
                });
                b.launch(&group.kernel, &args, group.longest)?;
            }
            return Ok(());
        }
        b.launch(&r.advance, &[&r.values], 1)?;
        for (i, (param, g)) in params.iter().zip(&grads).enumerate() {
            let Some(g) = g else { continue };
            let state = &self.state.buffers[i];
            if param.numel() > 0 {
                b.launch(
                    &r.update,
                    &[param.buffer(), g.buffer(), &state[0], &state[1], &r.values],
                    param.numel(),
                )?;
            }
        }
        Ok(())
    }

    fn before_replay(&mut self) -> Result<()> {
        let r = match &mut self.recorded {
            Recorded::No => {
                return Err(invalid(
                    "before_replay",
                    "call prepare_recorded before replaying",
                ));
            }
            // The replay's eager update counts the step.
            Recorded::Eager => return Ok(()),
            Recorded::OnDevice(r) => r,
        };
        let now = AdamParams {
            step: 0,
            lr: r.hyper.lr,
            ..self.hyper
        };
        if now != r.hyper {
            return Err(invalid(
                "before_replay",
                "the hyperparameters changed since the step was recorded (only the learning rate may change); record it again",
            ));
        }
        if r.steps != self.state.steps || r.hyper.lr.to_bits() != self.hyper.lr.to_bits() {
            // Eager steps in between, or a new learning rate: the host's values.
            r.hyper.lr = self.hyper.lr;
            let b = self
                .state
                .device
                .clone()
                .expect("prepared state has a device");
            r.sync(&b, self.state.steps)?;
        }
        // The replay's own advance counts this step on the device.
        self.state.steps += 1;
        r.steps = self.state.steps;
        Ok(())
    }
}

impl<B: Backend> RecordedAdam<B> {
    /// Writes `[lr, beta1^t, beta2^t]` for `t` steps taken.
    fn sync(&mut self, b: &B, t: u64) -> Result<()> {
        let h = &self.hyper;
        let power = t.min(i32::MAX as u64) as i32;
        b.write(
            &self.values,
            &[h.lr, h.beta1.powi(power), h.beta2.powi(power)],
        )?;
        self.steps = t;
        Ok(())
    }
}

/// One thread: `values[1] *= beta1`, `values[2] *= beta2` (the powers for the step about to
/// be taken).
fn adam_advance_program(h: &AdamParams) -> Result<hal::ir::Program> {
    let s = Scope::new("adam_advance");
    let values = s.buffer(DType::F32, Access::ReadWrite);
    for (at, beta) in [(1, h.beta1), (2, h.beta2)] {
        let at = s.u32(at);
        s.store(values, at, s.load(values, at) * beta);
    }
    Ok(s.build()?)
}

/// Element `i` of a parameter: the fused `adam_step` of the backends, with the learning rate
/// and the bias corrections `1 - beta^t` from `values` (buffers `[param, grad, m, v,
/// values]`).
fn adam_update_program(h: &AdamParams) -> Result<hal::ir::Program> {
    let s = Scope::new("adam_update_recorded");
    let buffers = adam_buffers(&s);
    let values = s.buffer(DType::F32, Access::Read);
    let i = s.index();
    let per_step = bias_corrections(load_values(&s, values));
    emit_adam_update(&s, h, buffers, per_step, i, None);
    Ok(s.build()?)
}

/// The update of up to [`ADAM_GROUP`] parameters of `lens` elements in one launch over the
/// longest (buffers `[param, grad, m, v]` per parameter, then `values`): each launch costs
/// a few microseconds of device time however little it does, and a training step updates
/// every parameter.
fn adam_group_program(h: &AdamParams, lens: &[usize], role: GroupRole) -> Result<hal::ir::Program> {
    let s = Scope::new("adam_update_recorded_group");
    let buffers: Vec<[BufferId; 4]> = lens.iter().map(|_| adam_buffers(&s)).collect();
    let i = s.index();
    let per_step = match role {
        GroupRole::Alone | GroupRole::Middle => {
            let values = s.buffer(DType::F32, Access::Read);
            bias_corrections(load_values(&s, values))
        }
        GroupRole::First | GroupRole::Last => {
            let values = s.buffer(DType::F32, Access::ReadWrite);
            let advanced = s.buffer(DType::F32, Access::ReadWrite);
            let (read, write) = match role {
                GroupRole::First => (values, advanced),
                _ => (advanced, values),
            };
            let [lr, mut power1, mut power2] = load_values(&s, read);
            if role == GroupRole::First {
                (power1, power2) = (power1 * h.beta1, power2 * h.beta2);
            }
            let first_thread = i.eq(s.u32(0));
            for (k, v) in [lr, power1, power2].into_iter().enumerate() {
                s.store_if(first_thread, write, s.u32(k as u32), v);
            }
            bias_corrections([lr, power1, power2])
        }
    };
    let longest = lens.iter().copied().max().unwrap_or(0);
    for (&len, &b) in lens.iter().zip(&buffers) {
        if len == longest {
            emit_adam_update(&s, h, b, per_step, i, None);
            continue;
        }
        // Past a shorter parameter's end: element 0 read, nothing stored.
        let (at, inside) = s.with_builder(|p| crate::ops::index_within(p, i.value(), len));
        emit_adam_update(&s, h, b, per_step, s.expr(at), Some(s.expr(inside)));
    }
    Ok(s.build()?)
}

/// Parameters per grouped update launch: 4 buffers each, `values` and `advanced` stay within
/// the 14 buffers an IR program may bind on wgpu.
const ADAM_GROUP: usize = 3;

fn adam_buffers(s: &Scope) -> [BufferId; 4] {
    [
        s.buffer(DType::F32, Access::ReadWrite),
        s.buffer(DType::F32, Access::Read),
        s.buffer(DType::F32, Access::ReadWrite),
        s.buffer(DType::F32, Access::ReadWrite),
    ]
}

/// `[lr, beta1^t, beta2^t]` as stored in `values` (or `advanced`).
fn load_values(s: &Scope, values: BufferId) -> [Expr<'_>; 3] {
    [0u32, 1, 2].map(|k| s.load(values, s.u32(k)))
}

/// `[lr, 1 - beta1^t, 1 - beta2^t]` from `[lr, beta1^t, beta2^t]`.
fn bias_corrections([lr, power1, power2]: [Expr<'_>; 3]) -> [Expr<'_>; 3] {
    [lr, 1.0 - power1, 1.0 - power2]
}

/// Element `at` of one parameter's update, stored only where `when` holds (if given):
/// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
/// `param -= lr (m / bc1) / (sqrt(v / bc2) + eps)`, with the weight decay folded into `g`
/// (Adam) or applied to `param` first (AdamW), each operation rounded as `adam_step`'s.
fn emit_adam_update<'s>(
    s: &'s Scope,
    h: &AdamParams,
    [param, grad, m, v]: [BufferId; 4],
    [lr, bc1, bc2]: [Expr<'s>; 3],
    at: Expr<'s>,
    when: Option<Expr<'s>>,
) {
    let store = |buffer, value| match when {
        Some(w) => s.store_if(w, buffer, at, value),
        None => s.store(buffer, at, value),
    };
    let (mut pi, mut gi) = (s.load(param, at), s.load(grad, at));
    if h.decoupled_weight_decay {
        pi = pi * (1.0 - lr * h.weight_decay);
    } else {
        gi = gi + h.weight_decay * pi;
    }
    let mi = h.beta1 * s.load(m, at) + (1.0 - h.beta1) * gi;
    let vi = h.beta2 * s.load(v, at) + (1.0 - h.beta2) * gi * gi;
    store(m, mi);
    store(v, vi);
    let den = (vi / bc2).sqrt() + h.eps;
    store(param, pi - lr * (mi / bc1) / den);
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
