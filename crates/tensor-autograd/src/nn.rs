//! Neural-network layers: the [`Module`] trait, the usual layers, and parameter files.
//!
//! A module owns its state as named tensors: trainable parameters (leaves that require
//! gradients) and buffers (BatchNorm's running statistics). Names follow PyTorch's
//! `state_dict` (`0.weight`, `3.running_mean`, ...), so a file saved here loads in PyTorch with
//! `safetensors.torch.load_file`, and the other way round.
//!
//! Moving a model: [`ModuleExt::to_device`] moves every tensor to another handle of the same
//! backend type. Between backend types (a model trained on CUDA evaluated on the CPU), build
//! the model on the target and copy the state with [`copy_state`] or a safetensors file.

use crate::error::{Error, Result, invalid, shape_error};
use crate::no_grad;
use crate::ops::Conv2dOptions;
use crate::tensor::Tensor;
use hal::{Backend, DType, Distribution, UnaryOp};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether a named tensor is trained or only carried along (running statistics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateKind {
    Parameter,
    Buffer,
}

/// A layer or a model: a forward function and named state.
pub trait Module<B: Backend>: Send + Sync {
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>>;
    /// Calls `f` with every named tensor of the state, in a fixed order.
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor<B>, StateKind));
    /// Calls `f` with every named tensor of the state, which it may replace.
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>, StateKind));
    /// Training mode (dropout active, batch statistics) or evaluation mode.
    fn set_training(&mut self, _training: bool) {}
    /// A Linear layer's weight and bias, so that [`Sequential`] can run it together with the
    /// activation after it ([`Tensor::linear_activation`]).
    fn as_linear(&self) -> Option<(&Tensor<B>, Option<&Tensor<B>>)> {
        None
    }
    /// The elementwise op of an activation layer (ReLU, ...).
    fn activation(&self) -> Option<UnaryOp> {
        None
    }
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// What every module gets from [`Module`].
pub trait ModuleExt<B: Backend>: Module<B> {
    /// The trainable parameters, in the order of [`Module::visit`].
    fn parameters(&self) -> Vec<Tensor<B>> {
        let mut out = Vec::new();
        self.visit("", &mut |_, t, kind| {
            if kind == StateKind::Parameter {
                out.push(t.clone())
            }
        });
        out
    }
    /// Every named tensor of the state (parameters and buffers).
    fn named_tensors(&self) -> Vec<(String, Tensor<B>)> {
        let mut out = Vec::new();
        self.visit("", &mut |name, t, _| {
            out.push((name.to_string(), t.clone()))
        });
        out
    }
    /// The number of trainable scalars.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.numel()).sum()
    }
    /// Forgets every parameter's accumulated gradient.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }
    fn train(&mut self) {
        self.set_training(true)
    }
    fn eval(&mut self) {
        self.set_training(false)
    }
    /// Moves every tensor of the state to `device` (another handle of this backend type).
    fn to_device(&mut self, device: &B) -> Result<()> {
        let mut failure = None;
        self.visit_mut("", &mut |_, t, _| {
            if failure.is_none() {
                match t.to_device(device) {
                    Ok(moved) => *t = moved,
                    Err(e) => failure = Some(e),
                }
            }
        });
        failure.map_or(Ok(()), Err)
    }
    /// Writes the state to a safetensors file (dtypes as stored).
    fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        save_safetensors(&self.named_tensors(), path.as_ref())
    }
    /// Overwrites the state from a safetensors file. Every tensor of the model must be in the
    /// file with its shape (f32, f16 and bf16 convert); a missing or misshapen tensor is an
    /// error naming it, and then nothing of the model has changed.
    fn load(&self, path: impl AsRef<Path>) -> Result<()> {
        load_safetensors(&self.named_tensors(), path.as_ref())
    }
}

impl<B: Backend, M: Module<B> + ?Sized> ModuleExt<B> for M {}

/// Copies every named tensor of `from` into the same-named tensor of `to`, which may live on
/// another backend (through the host). Names and shapes must match.
pub fn copy_state<B1: Backend, B2: Backend>(
    from: &(impl Module<B1> + ?Sized),
    to: &(impl Module<B2> + ?Sized),
) -> Result<()> {
    let source: HashMap<String, Tensor<B1>> = from.named_tensors().into_iter().collect();
    let mut plan = Vec::new();
    for (name, dst) in to.named_tensors() {
        let src = source
            .get(&name)
            .ok_or_else(|| invalid("copy_state", format!("the source has no tensor `{name}`")))?;
        if src.shape() != dst.shape() {
            return Err(shape_error(
                "copy_state",
                src.shape(),
                dst.shape(),
                format!("tensor `{name}`"),
            ));
        }
        plan.push((src.to_vec()?, dst));
    }
    write_all(plan)
}

// ----- initialisation -----

/// Seeded parameter initialisation: each tensor drawn from its own counter-based stream.
pub struct Init<B: Backend> {
    backend: B,
    seed: u64,
    drawn: u64,
}

impl<B: Backend> Init<B> {
    pub fn new(backend: &B, seed: u64) -> Self {
        Self {
            backend: backend.clone(),
            seed,
            drawn: 0,
        }
    }
    pub fn backend(&self) -> &B {
        &self.backend
    }
    fn next_seed(&mut self) -> u64 {
        self.drawn += 1;
        splitmix64(self.seed ^ splitmix64(self.drawn))
    }
    /// A trainable leaf drawn from `dist`.
    pub fn parameter(&mut self, shape: &[usize], dist: Distribution) -> Result<Tensor<B>> {
        let seed = self.next_seed();
        Ok(Tensor::random(&self.backend, shape, dist, seed)?.requires_grad())
    }
    /// Uniform on `(-bound, bound)`.
    pub fn uniform(&mut self, shape: &[usize], bound: f32) -> Result<Tensor<B>> {
        self.parameter(
            shape,
            Distribution::Uniform {
                low: -bound,
                high: bound,
            },
        )
    }
    /// A trainable leaf filled with `value`.
    pub fn constant(&mut self, shape: &[usize], value: f64) -> Result<Tensor<B>> {
        Ok(Tensor::full(&self.backend, shape, value, DType::F32)?.requires_grad())
    }
    /// A fresh seed for a stochastic layer (dropout).
    pub fn seed(&mut self) -> u64 {
        self.next_seed()
    }
}

use crate::data::splitmix as splitmix64;

// ----- layers -----

/// `y = x W^T + b` with `W: [out, in]`, initialised as PyTorch does (uniform within
/// `1/sqrt(in)`).
pub struct Linear<B: Backend> {
    pub weight: Tensor<B>,
    pub bias: Option<Tensor<B>>,
}

impl<B: Backend> Linear<B> {
    pub fn new(init: &mut Init<B>, inputs: usize, outputs: usize) -> Result<Self> {
        let bound = 1.0 / (inputs.max(1) as f32).sqrt();
        Ok(Self {
            weight: init.uniform(&[outputs, inputs], bound)?,
            bias: Some(init.uniform(&[outputs], bound)?),
        })
    }
}

/// Implements `visit`/`visit_mut` over a layer's fields: `param name` for a tensor,
/// `optional name` for an optional one, `buffer name` for a running statistic.
macro_rules! state_fields {
    ($($kind:ident $field:ident),* $(,)?) => {
        fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor<B>, StateKind)) {
            $( state_fields!(@one f, prefix, self.$field, $kind, stringify!($field), as_ref); )*
        }
        fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>, StateKind)) {
            $( state_fields!(@one f, prefix, self.$field, $kind, stringify!($field), as_mut); )*
        }
    };
    (@one $f:ident, $prefix:ident, $e:expr, param, $name:expr, $how:ident) => {
        $f(&join($prefix, $name), state_fields!(@ref $e, $how), StateKind::Parameter)
    };
    (@one $f:ident, $prefix:ident, $e:expr, buffer, $name:expr, $how:ident) => {
        $f(&join($prefix, $name), state_fields!(@ref $e, $how), StateKind::Buffer)
    };
    (@one $f:ident, $prefix:ident, $e:expr, optional, $name:expr, $how:ident) => {
        if let Some(t) = $e.$how() {
            $f(&join($prefix, $name), t, StateKind::Parameter)
        }
    };
    (@ref $e:expr, as_ref) => { &$e };
    (@ref $e:expr, as_mut) => { &mut $e };
}

impl<B: Backend> Module<B> for Linear<B> {
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        x.linear(&self.weight, self.bias.as_ref())
    }
    state_fields!(param weight, optional bias);
    fn as_linear(&self) -> Option<(&Tensor<B>, Option<&Tensor<B>>)> {
        Some((&self.weight, self.bias.as_ref()))
    }
}

/// 2-D convolution over NCHW input (`weight: [out, in / groups, kh, kw]`).
pub struct Conv2d<B: Backend> {
    pub weight: Tensor<B>,
    pub bias: Option<Tensor<B>>,
    pub options: Conv2dOptions,
}

impl<B: Backend> Conv2d<B> {
    pub fn new(
        init: &mut Init<B>,
        inputs: usize,
        outputs: usize,
        kernel: (usize, usize),
        options: Conv2dOptions,
    ) -> Result<Self> {
        if options.groups == 0 || inputs % options.groups != 0 || outputs % options.groups != 0 {
            return Err(invalid(
                "Conv2d::new",
                format!(
                    "{inputs} inputs and {outputs} outputs must both divide into {} groups",
                    options.groups
                ),
            ));
        }
        let fan_in = inputs / options.groups * kernel.0 * kernel.1;
        let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
        Ok(Self {
            weight: init.uniform(
                &[outputs, inputs / options.groups, kernel.0, kernel.1],
                bound,
            )?,
            bias: Some(init.uniform(&[outputs], bound)?),
            options,
        })
    }
}

impl<B: Backend> Module<B> for Conv2d<B> {
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        x.conv2d(&self.weight, self.bias.as_ref(), self.options)
    }
    state_fields!(param weight, optional bias);
}

/// A lookup table `weight: [vocabulary, dim]`; the input is a `u32` tensor of indices and the
/// output has one more dimension of size `dim`.
pub struct Embedding<B: Backend> {
    pub weight: Tensor<B>,
}

impl<B: Backend> Embedding<B> {
    pub fn new(init: &mut Init<B>, vocabulary: usize, dim: usize) -> Result<Self> {
        Ok(Self {
            weight: init.parameter(
                &[vocabulary, dim],
                Distribution::Normal {
                    mean: 0.0,
                    std: 1.0,
                },
            )?,
        })
    }
}

impl<B: Backend> Module<B> for Embedding<B> {
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        let rows = self.weight.index_select(0, &x.flatten(0)?)?;
        let mut shape = x.shape().to_vec();
        shape.push(self.weight.shape()[1]);
        rows.reshape(&shape)
    }
    state_fields!(param weight);
}

/// Normalisation over the last dimension with a learned scale and shift
/// ([`Tensor::layer_norm`], fused).
pub struct LayerNorm<B: Backend> {
    pub weight: Tensor<B>,
    pub bias: Tensor<B>,
    pub eps: f32,
}

impl<B: Backend> LayerNorm<B> {
    pub fn new(init: &mut Init<B>, dim: usize) -> Result<Self> {
        Ok(Self {
            weight: init.constant(&[dim], 1.0)?,
            bias: init.constant(&[dim], 0.0)?,
            eps: 1e-5,
        })
    }
}

impl<B: Backend> Module<B> for LayerNorm<B> {
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        x.layer_norm(1, Some(&self.weight), Some(&self.bias), self.eps)
    }
    state_fields!(param weight, param bias);
}

/// Batch normalisation over N, H, W of NCHW input, with running statistics for evaluation
/// (momentum 0.1, as PyTorch).
pub struct BatchNorm2d<B: Backend> {
    pub weight: Tensor<B>,
    pub bias: Tensor<B>,
    pub running_mean: Tensor<B>,
    pub running_var: Tensor<B>,
    pub eps: f32,
    pub momentum: f32,
    pub training: bool,
}

impl<B: Backend> BatchNorm2d<B> {
    pub fn new(init: &mut Init<B>, channels: usize) -> Result<Self> {
        let b = init.backend().clone();
        Ok(Self {
            weight: init.constant(&[channels], 1.0)?,
            bias: init.constant(&[channels], 0.0)?,
            running_mean: Tensor::zeros(&b, &[channels], DType::F32)?,
            running_var: Tensor::full(&b, &[channels], 1.0, DType::F32)?,
            eps: 1e-5,
            momentum: 0.1,
            training: true,
        })
    }
}

impl<B: Backend> Module<B> for BatchNorm2d<B> {
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        if x.rank() != 4 || x.shape()[1] != self.weight.numel() {
            return Err(shape_error(
                "BatchNorm2d",
                x.shape(),
                self.weight.shape(),
                "expects NCHW input with one channel per weight",
            ));
        }
        let c = self.weight.numel();
        let per_channel = [1, c, 1, 1];
        let (mean, var) = if self.training {
            let mean = x.mean(&[0, 2, 3], true)?;
            let var = x.sub(&mean)?.square()?.mean(&[0, 2, 3], true)?;
            let count = x.numel() / c;
            no_grad(|| -> Result<()> {
                let unbiased = count as f32 / (count.max(2) - 1) as f32;
                let m = self.momentum;
                let rm = self
                    .running_mean
                    .affine(1.0 - m, 0.0)?
                    .add(&mean.reshape(&[c])?.mul_scalar(m)?)?;
                let rv = self
                    .running_var
                    .affine(1.0 - m, 0.0)?
                    .add(&var.reshape(&[c])?.mul_scalar(m * unbiased)?)?;
                self.running_mean.assign(&rm)?;
                self.running_var.assign(&rv)
            })?;
            (mean, var)
        } else {
            (
                self.running_mean.reshape(&per_channel)?,
                self.running_var.reshape(&per_channel)?,
            )
        };
        let normed = x.sub(&mean)?.mul(&var.add_scalar(self.eps)?.rsqrt()?)?;
        normed
            .mul(&self.weight.reshape(&per_channel)?)?
            .add(&self.bias.reshape(&per_channel)?)
    }
    state_fields!(param weight, param bias, buffer running_mean, buffer running_var);
    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Zeroes activations with probability `p` while training; the identity in evaluation.
pub struct Dropout {
    pub p: f32,
    seed: u64,
    drawn: AtomicU64,
    pub training: bool,
}

impl Dropout {
    pub fn new<B: Backend>(init: &mut Init<B>, p: f32) -> Self {
        Self {
            p,
            seed: init.seed(),
            drawn: AtomicU64::new(0),
            training: true,
        }
    }
}

impl<B: Backend> Module<B> for Dropout {
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        if !self.training {
            return Ok(x.clone());
        }
        if crate::autograd::is_recording_step() {
            // The stream offset is taken on the host, once per recording: a capturing
            // backend's replays would all draw the same mask.
            return Err(crate::error::invalid(
                "Dropout",
                "dropout in training mode cannot run inside a recorded step (its replays would repeat one mask); train it with train_step",
            ));
        }
        // Each call consumes a fresh stretch of the stream, so masks differ between steps.
        let offset = self.drawn.fetch_add(x.numel() as u64, Ordering::Relaxed);
        x.dropout(self.p, self.seed, offset)
    }
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor<B>, StateKind)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor<B>, StateKind)) {}
    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Stateless layers: activations, flattening and pooling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Layer {
    Relu,
    LeakyRelu(f32),
    Gelu,
    Silu,
    Tanh,
    Sigmoid,
    /// Flattens every dimension after the first.
    Flatten,
    MaxPool2d {
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    },
    AvgPool2d {
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    },
}

impl Layer {
    /// The elementwise op of an activation layer; `None` for the others.
    pub fn activation_op(&self) -> Option<UnaryOp> {
        Some(match *self {
            Layer::Relu => UnaryOp::Relu,
            Layer::LeakyRelu(slope) => UnaryOp::LeakyRelu { slope },
            Layer::Gelu => UnaryOp::Gelu,
            Layer::Silu => UnaryOp::Silu,
            Layer::Tanh => UnaryOp::Tanh,
            Layer::Sigmoid => UnaryOp::Sigmoid,
            _ => return None,
        })
    }
}

impl<B: Backend> Module<B> for Layer {
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        if let Some(op) = self.activation_op() {
            return x.unary(op);
        }
        match *self {
            Layer::Relu
            | Layer::LeakyRelu(_)
            | Layer::Gelu
            | Layer::Silu
            | Layer::Tanh
            | Layer::Sigmoid => unreachable!("activations return above"),
            Layer::Flatten => x.flatten(1),
            Layer::MaxPool2d {
                kernel,
                stride,
                padding,
            } => x.max_pool2d(kernel, stride, padding),
            Layer::AvgPool2d {
                kernel,
                stride,
                padding,
            } => x.avg_pool2d(kernel, stride, padding),
        }
    }
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor<B>, StateKind)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor<B>, StateKind)) {}
    fn activation(&self) -> Option<UnaryOp> {
        self.activation_op()
    }
}

/// Layers applied in order; their state is named `0.weight`, `1.bias`, ... as in PyTorch.
pub struct Sequential<B: Backend> {
    pub layers: Vec<Box<dyn Module<B>>>,
}

impl<B: Backend> Default for Sequential<B> {
    fn default() -> Self {
        Self { layers: Vec::new() }
    }
}

impl<B: Backend> Sequential<B> {
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends a layer (builder style).
    pub fn push(mut self, layer: impl Module<B> + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }
}

impl<B: Backend> Module<B> for Sequential<B> {
    /// Runs the layers in order, a Linear layer and an activation after it as one
    /// [`Tensor::linear_activation`] (the same values and gradients, fewer launches).
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        let mut h = x.clone();
        let mut i = 0;
        while i < self.layers.len() {
            let layer = &self.layers[i];
            if let Some((weight, bias)) = layer.as_linear() {
                // (linear_activation runs an activation it cannot fuse as its own operation.)
                let activation = self.layers.get(i + 1).and_then(|next| next.activation());
                h = h.linear_activation(weight, bias, activation)?;
                i += 1 + activation.is_some() as usize;
                continue;
            }
            h = layer.forward(&h)?;
            i += 1;
        }
        Ok(h)
    }
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor<B>, StateKind)) {
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit(&join(prefix, &i.to_string()), f);
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>, StateKind)) {
        for (i, layer) in self.layers.iter_mut().enumerate() {
            layer.visit_mut(&join(prefix, &i.to_string()), f);
        }
    }
    fn set_training(&mut self, training: bool) {
        for layer in &mut self.layers {
            layer.set_training(training);
        }
    }
}

// ----- safetensors -----

fn st_dtype(dtype: DType) -> Option<safetensors::Dtype> {
    Some(match dtype {
        DType::F32 => safetensors::Dtype::F32,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::I32 => safetensors::Dtype::I32,
        DType::U32 => safetensors::Dtype::U32,
        DType::F64 => safetensors::Dtype::F64,
    })
}

fn checkpoint_error(path: &Path, detail: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

/// Writes named tensors to a safetensors file.
pub fn save_safetensors<B: Backend>(tensors: &[(String, Tensor<B>)], path: &Path) -> Result<()> {
    let mut blobs = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let dense = t.dense()?;
        blobs.push((
            name.clone(),
            t.dtype(),
            t.shape().to_vec(),
            t.backend().read_bytes(dense.buffer())?,
        ));
    }
    let views = blobs
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            let view = safetensors::tensor::TensorView::new(
                st_dtype(*dtype).expect("every dtype maps"),
                shape.clone(),
                bytes,
            )
            .map_err(|e| checkpoint_error(path, format!("tensor `{name}`: {e}")))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    // Serialised in memory, then written atomically: an interrupted save leaves the old
    // checkpoint whole.
    let bytes =
        safetensors::serialize(views, None).map_err(|e| checkpoint_error(path, e.to_string()))?;
    hal::durable::write_bytes_atomic(path, &bytes).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Overwrites `tensors` (in place) from a safetensors file, converting between float dtypes.
/// Everything is checked before anything is written.
pub fn load_safetensors<B: Backend>(tensors: &[(String, Tensor<B>)], path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| checkpoint_error(path, format!("not a valid safetensors file: {e}")))?;
    let mut staged = Vec::with_capacity(tensors.len());
    for (name, dst) in tensors {
        let view = file.tensor(name).map_err(|_| {
            checkpoint_error(
                path,
                format!(
                    "the file has no tensor `{name}` (the model needs shape {:?})",
                    dst.shape()
                ),
            )
        })?;
        if view.shape() != dst.shape() {
            return Err(checkpoint_error(
                path,
                format!(
                    "tensor `{name}` has shape {:?} in the file but {:?} in the model",
                    view.shape(),
                    dst.shape()
                ),
            ));
        }
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            safetensors::Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            safetensors::Dtype::F16 => data
                .chunks_exact(2)
                .map(|c| hal::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            safetensors::Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| hal::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(checkpoint_error(
                    path,
                    format!("tensor `{name}` has dtype {other:?}; f32, f16 or bf16 expected"),
                ));
            }
        };
        if values.iter().any(|v| !v.is_finite()) {
            return Err(checkpoint_error(
                path,
                format!("tensor `{name}` holds NaN or infinite values"),
            ));
        }
        staged.push((values, dst.clone()));
    }
    write_all(staged)
}

/// Overwrites each tensor with its host values (staged through an upload, then a copy that
/// converts to the tensor's dtype and layout). Called only after every source was checked.
fn write_all<B: Backend>(staged: Vec<(Vec<f32>, Tensor<B>)>) -> Result<()> {
    for (values, dst) in staged {
        dst.assign(&Tensor::from_slice(dst.backend(), &values, dst.shape())?)?;
    }
    Ok(())
}
