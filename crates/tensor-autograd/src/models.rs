//! Small reference models and the training loop the examples and the bench share.

use crate::data::{DataLoader, Dataset};
use crate::distributed::{Alone, Replicas};
use crate::error::{Result, invalid};
use crate::nn::{BatchNorm2d, Conv2d, Dropout, Init, Layer, Linear, Module, ModuleExt, Sequential};
use crate::optim::{Optimizer, Schedule};
use crate::{Conv2dOptions, Tensor, no_grad};
use hal::{Backend, DType};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A multi-layer perceptron: `Linear` layers with ReLU between them (`widths[0]` inputs,
/// `widths.last()` outputs). Flattens its input first.
pub fn mlp<B: Backend>(init: &mut Init<B>, widths: &[usize]) -> Result<Sequential<B>> {
    let mut model = Sequential::new().push(Layer::Flatten);
    for (i, pair) in widths.windows(2).enumerate() {
        model = model.push(Linear::new(init, pair[0], pair[1])?);
        if i + 2 < widths.len() {
            model = model.push(Layer::Relu);
        }
    }
    Ok(model)
}

/// The digits example's MLP: 64-256-256-10 with ReLU and dropout 0.2 after each hidden layer.
pub fn digits_mlp<B: Backend>(init: &mut Init<B>) -> Result<Sequential<B>> {
    let mut model = Sequential::new().push(Layer::Flatten);
    for (i, o) in [(64, 256), (256, 256)] {
        model = model
            .push(Linear::new(init, i, o)?)
            .push(Layer::Relu)
            .push(Dropout::new(init, 0.2));
    }
    Ok(model.push(Linear::new(init, 256, 10)?))
}

/// Stride 1, padding 1: a 3x3 convolution that keeps the image size.
fn same_padding() -> Conv2dOptions {
    Conv2dOptions {
        padding: (1, 1),
        ..Default::default()
    }
}

/// 2x2 max pooling with stride 2: halves each side.
fn max_pool_2x2() -> Layer {
    Layer::MaxPool2d {
        kernel: (2, 2),
        stride: (2, 2),
        padding: (0, 0),
    }
}

/// The digits example's CNN for `[N, 1, 8, 8]`: three 3x3 convolutions (16, 16, 32 channels)
/// with BatchNorm and ReLU, 2x2 max pooling after the second and third, dropout 0.3, and a
/// linear classifier.
pub fn digits_cnn<B: Backend>(init: &mut Init<B>) -> Result<Sequential<B>> {
    let (same, pool) = (same_padding(), max_pool_2x2());
    Ok(Sequential::new()
        .push(Conv2d::new(init, 1, 16, (3, 3), same)?)
        .push(BatchNorm2d::new(init, 16)?)
        .push(Layer::Relu)
        .push(Conv2d::new(init, 16, 16, (3, 3), same)?)
        .push(BatchNorm2d::new(init, 16)?)
        .push(Layer::Relu)
        .push(pool)
        .push(Conv2d::new(init, 16, 32, (3, 3), same)?)
        .push(BatchNorm2d::new(init, 32)?)
        .push(Layer::Relu)
        .push(pool)
        .push(Layer::Flatten)
        .push(Dropout::new(init, 0.3))
        .push(Linear::new(init, 32 * 2 * 2, 10)?))
}

/// A LeNet-style CNN for `[N, channels, side, side]` images: two 3x3 convolutions (padding 1)
/// each followed by ReLU and 2x2 max pooling, then `Linear(hidden)`, ReLU, `Linear(classes)`.
pub fn lenet<B: Backend>(
    init: &mut Init<B>,
    channels: usize,
    side: usize,
    widths: (usize, usize),
    hidden: usize,
    classes: usize,
) -> Result<Sequential<B>> {
    let (same, pool) = (same_padding(), max_pool_2x2());
    let after = side / 4;
    Ok(Sequential::new()
        .push(Conv2d::new(init, channels, widths.0, (3, 3), same)?)
        .push(Layer::Relu)
        .push(pool)
        .push(Conv2d::new(init, widths.0, widths.1, (3, 3), same)?)
        .push(Layer::Relu)
        .push(pool)
        .push(Layer::Flatten)
        .push(Linear::new(init, widths.1 * after * after, hidden)?)
        .push(Layer::Relu)
        .push(Linear::new(init, hidden, classes)?))
}

/// What a training step leaves behind, on the device and detached from the graph.
#[derive(Clone)]
pub struct StepOutput<B: Backend> {
    pub loss: Tensor<B>,
    pub logits: Tensor<B>,
}

/// One training step: forward, cross-entropy, backward, optimiser update. The loss and the
/// logits stay on the device (reading them is the caller's choice).
pub fn train_step<B: Backend>(
    model: &dyn Module<B>,
    params: &[Tensor<B>],
    opt: &mut dyn Optimizer<B>,
    x: &Tensor<B>,
    y: &Tensor<B>,
) -> Result<StepOutput<B>> {
    step_with(model, params, x, y, None, |params| opt.step(params))
}

/// [`train_step`] as one rank of a data-parallel group (or [`crate::distributed::Alone`]):
/// the backward pass goes through `replicas`, which averages the gradients over the ranks.
pub fn train_step_replicated<B: Backend>(
    model: &dyn Module<B>,
    params: &[Tensor<B>],
    opt: &mut dyn Optimizer<B>,
    x: &Tensor<B>,
    y: &Tensor<B>,
    replicas: &dyn Replicas<B>,
) -> Result<StepOutput<B>> {
    for p in params {
        p.zero_grad();
    }
    let logits = model.forward(x)?;
    let loss = logits.cross_entropy(y)?;
    replicas.backward(&loss)?;
    opt.step(params)?;
    Ok(StepOutput {
        loss: loss.detach(),
        logits: logits.detach(),
    })
}

/// A training step whose optimiser update is `update` (the eager step, or a recorded one).
/// One step; `unit`, where given and of the loss's shape and dtype, is a tensor holding 1
/// that seeds the backward pass instead of a fresh one (a recorded step makes it once,
/// outside, so that its replays do not fill one every time).
fn step_with<B: Backend>(
    model: &dyn Module<B>,
    params: &[Tensor<B>],
    x: &Tensor<B>,
    y: &Tensor<B>,
    unit: Option<&Tensor<B>>,
    update: impl FnOnce(&[Tensor<B>]) -> Result<()>,
) -> Result<StepOutput<B>> {
    for p in params {
        p.zero_grad();
    }
    let logits = model.forward(x)?;
    let loss = logits.cross_entropy(y)?;
    match unit {
        Some(unit) if unit.shape() == loss.shape() && unit.dtype() == loss.dtype() => {
            loss.backward_with_ones(unit)?
        }
        _ => loss.backward()?,
    }
    update(params)?;
    Ok(StepOutput {
        loss: loss.detach(),
        logits: logits.detach(),
    })
}

/// A training step ([`train_step`]'s forward, cross-entropy, backward and optimiser update)
/// recorded once with [`hal::Backend::record`] and replayed for each batch. On a capturing
/// backend (CUDA) a step is then one graph launch, plus two copies that bring the batch into
/// the recording's input tensors; elsewhere a replay runs the step's calls again, so the same
/// code trains everywhere.
///
/// What a replay repeats is fixed at recording: the batch's shape and dtype, the model's
/// structure, and the kernels' launch arguments. So the optimiser keeps its per-step values on
/// the device ([`Optimizer::prepare_recorded`]; Adam and AdamW can, and their learning rate
/// may still change between steps), and training-mode dropout, whose mask would repeat,
/// refuses to run inside. The [`StepOutput`] a run returns aliases the recording's outputs:
/// read or use it (as later device calls do, in queue order) before the next run overwrites
/// it.
///
/// ```
/// use backend_cpu::CpuBackend;
/// use std::sync::Arc;
/// use tensor_autograd::models::{RecordedStep, mlp};
/// use tensor_autograd::nn::{Init, Module};
/// use tensor_autograd::optim::Adam;
/// use tensor_autograd::Tensor;
/// let dev = CpuBackend::new();
/// let model: Arc<dyn Module<CpuBackend>> = Arc::new(mlp(&mut Init::new(&dev, 1), &[4, 8, 3]).unwrap());
/// let x = Tensor::randn(&dev, &[16, 4], 7).unwrap();
/// let y = Tensor::from_elements(&dev, &[0u32, 1, 2, 0].repeat(4), &[16]).unwrap();
/// let step = RecordedStep::new(model, Adam::new(0.01), &x, &y).unwrap();
/// let first = step.run(&x, &y).unwrap().loss.item().unwrap();
/// for _ in 0..20 {
///     step.run(&x, &y).unwrap();
/// }
/// assert!(step.run(&x, &y).unwrap().loss.item().unwrap() < first);
/// assert_eq!(step.optimizer().steps(), 22);
/// ```
pub struct RecordedStep<B: Backend, O: Optimizer<B>> {
    backend: B,
    graph: B::Graph,
    x: Tensor<B>,
    y: Tensor<B>,
    /// The backward pass's seed, made before recording and held here: a capturing backend's
    /// graph need not hold buffers made outside the recording (CUDA's does not), and a seed
    /// returned to the pool would be overwritten by the next allocation.
    _unit: Tensor<B>,
    /// Copies a batch into `x` and `y` in one launch ([`load_pair_program`]).
    load: B::Kernel,
    output: Arc<Mutex<Option<StepOutput<B>>>>,
    /// The error of the step's body, where it was not the backend's (the recording closure
    /// can only return a `hal` error).
    failure: Arc<Mutex<Option<crate::Error>>>,
    optimizer: Arc<Mutex<O>>,
}

impl<B: Backend, O: Optimizer<B> + Send + 'static> RecordedStep<B, O> {
    /// Records the step of `model` (its parameters in [`ModuleExt::parameters`] order) and
    /// `optimizer` on batches shaped like `x` (inputs) and `y` (class labels). Records only:
    /// nothing is trained until [`RecordedStep::run`].
    pub fn new(
        model: Arc<dyn Module<B>>,
        mut optimizer: O,
        x: &Tensor<B>,
        y: &Tensor<B>,
    ) -> Result<Self> {
        let backend = x.backend().clone();
        let params = model.parameters();
        optimizer.prepare_recorded(&params)?;
        let fixed_x = Tensor::zeros(&backend, x.shape(), x.dtype())?;
        let fixed_y = Tensor::zeros(&backend, y.shape(), y.dtype())?;
        // The loss is a mean: a tensor of shape [].
        let unit = Tensor::full(&backend, &[], 1.0, DType::F32)?;
        let load = backend.compile(&load_pair_program([&fixed_x, &fixed_y])?)?;
        let output = Arc::new(Mutex::new(None));
        let failure = Arc::new(Mutex::new(None));
        let optimizer = Arc::new(Mutex::new(optimizer));
        let steps = {
            let (x, y, unit) = (fixed_x.clone(), fixed_y.clone(), unit.clone());
            let (output, failure, optimizer) = (output.clone(), failure.clone(), optimizer.clone());
            move |_: &B| -> hal::Result<()> {
                let body = || {
                    step_with(&*model, &params, &x, &y, Some(&unit), |params| {
                        lock(&optimizer).step_recorded(params)
                    })
                };
                match crate::autograd::in_recorded_step(body) {
                    Ok(out) => {
                        *lock(&output) = Some(out);
                        Ok(())
                    }
                    Err(crate::Error::Hal(e)) => Err(e),
                    Err(e) => {
                        let detail = e.to_string();
                        *lock(&failure) = Some(e);
                        Err(hal::Error::InvalidArgument {
                            op: "RecordedStep",
                            detail,
                        })
                    }
                }
            }
        };
        let graph = backend.record(Arc::new(steps));
        if let Some(e) = lock(&failure).take() {
            return Err(e);
        }
        Ok(Self {
            graph: graph?,
            backend,
            x: fixed_x,
            y: fixed_y,
            _unit: unit,
            load,
            output,
            failure,
            optimizer,
        })
    }

    /// One training step on the batch `x`, `y` (the recording's shapes and dtypes).
    pub fn run(&self, x: &Tensor<B>, y: &Tensor<B>) -> Result<StepOutput<B>> {
        for (name, given, fixed) in [("inputs", x, &self.x), ("labels", y, &self.y)] {
            if given.shape() != fixed.shape() || given.dtype() != fixed.dtype() {
                return Err(crate::error::shape_error(
                    "RecordedStep::run",
                    given.shape(),
                    fixed.shape(),
                    format!(
                        "the {name} must have the recorded shape and dtype ({:?}; got {:?}); record another step for other shapes",
                        fixed.dtype(),
                        given.dtype()
                    ),
                ));
            }
        }
        // Contiguous batches from element 0 (the usual case) in one launch, others by two
        // strided copies.
        let plain = |t: &Tensor<B>| t.is_contiguous() && t.layout().offset == 0 && t.numel() > 0;
        match (plain(x), plain(y)) {
            (true, true) => self.backend.launch(
                &self.load,
                &[x.buffer(), y.buffer(), self.x.buffer(), self.y.buffer()],
                x.numel().max(y.numel()),
            )?,
            _ => {
                self.x.assign(x)?;
                self.y.assign(y)?;
            }
        }
        lock(&self.optimizer).before_replay()?;
        if let Err(e) = self.backend.replay(&self.graph) {
            return Err(lock(&self.failure).take().unwrap_or(crate::Error::Hal(e)));
        }
        lock(&self.output).clone().ok_or_else(|| {
            invalid(
                "RecordedStep::run",
                "the recording left no output (the step failed when it was recorded)",
            )
        })
    }

    /// The optimiser (to change its learning rate between steps, or read its step count).
    pub fn optimizer(&self) -> std::sync::MutexGuard<'_, O> {
        lock(&self.optimizer)
    }
}

/// One launch over the longer of two contiguous tensors that copies both into two others of
/// their shapes and dtypes (buffers `[x, y, x_out, y_out]`): a recorded step's batch arrives
/// with one launch instead of two (each launch costs several microseconds on a GPU, whatever
/// its size).
fn load_pair_program<B: Backend>(into: [&Tensor<B>; 2]) -> Result<hal::ir::Program> {
    use hal::ir::{Access, ProgramBuilder};
    let mut p = ProgramBuilder::new("load_batch");
    let sources = into.map(|t| p.buffer(t.dtype(), Access::Read));
    let targets = into.map(|t| p.buffer(t.dtype(), Access::Write));
    let i = p.index();
    let longest = into[0].numel().max(into[1].numel());
    for ((t, src), dst) in into.iter().zip(sources).zip(targets) {
        if t.numel() == longest {
            let v = p.load(src, i);
            p.store(dst, i, v);
            continue;
        }
        // Past the shorter tensor's end: element 0 read, nothing stored.
        let (at, inside) = crate::ops::index_within(&mut p, i, t.numel());
        let v = p.load(src, at);
        p.store_if(inside, dst, at, v);
    }
    Ok(p.build()?)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How many rows of `logits` pick the class in `labels` (a one-element device tensor).
fn hits<B: Backend>(logits: &Tensor<B>, labels: &Tensor<B>) -> Result<Tensor<B>> {
    no_grad(|| {
        logits
            .argmax(1, false)?
            .eq(labels)?
            .to_dtype(hal::DType::F32)?
            .sum_all()
    })
}

/// Adds `value` into a running device-side total.
fn accumulate<B: Backend>(total: &mut Option<Tensor<B>>, value: Tensor<B>) -> Result<()> {
    *total = Some(match total.take() {
        Some(t) => t.add(&value)?,
        None => value,
    });
    Ok(())
}

/// What an epoch of training reports.
#[derive(Clone, Copy, Debug)]
pub struct EpochReport {
    pub mean_loss: f32,
    pub train_accuracy: f32,
}

/// One epoch over `loader`, stepping the learning rate by `schedule` (indexed by the global
/// step). `on_batch` is called after each step (a progress bar). The loss and accuracy are
/// summed on the device and read once at the end.
pub fn train_epoch<B: Backend>(
    model: &mut dyn Module<B>,
    opt: &mut dyn Optimizer<B>,
    schedule: Option<&dyn Schedule>,
    loader: &mut DataLoader<B>,
    global_step: &mut u64,
    on_batch: &mut dyn FnMut(),
) -> Result<EpochReport> {
    train_epoch_replicated(model, opt, schedule, loader, global_step, on_batch, &Alone)
}

/// [`train_epoch`] as one rank of a data-parallel group: each step's backward pass goes
/// through `replicas`. Every rank's loader must yield the same number of batches (the ranks
/// meet at every step); the report is this rank's.
pub fn train_epoch_replicated<B: Backend>(
    model: &mut dyn Module<B>,
    opt: &mut dyn Optimizer<B>,
    schedule: Option<&dyn Schedule>,
    loader: &mut DataLoader<B>,
    global_step: &mut u64,
    on_batch: &mut dyn FnMut(),
    replicas: &dyn Replicas<B>,
) -> Result<EpochReport> {
    model.set_training(true);
    let params = model.parameters();
    let (mut loss_sum, mut correct, mut seen, mut batches) = (None, None, 0usize, 0usize);
    for batch in loader.epoch() {
        let batch = batch?;
        if let Some(s) = schedule {
            opt.set_learning_rate(s.learning_rate(*global_step));
        }
        let out = train_step_replicated(&*model, &params, opt, &batch.x, &batch.y, replicas)?;
        *global_step += 1;
        accumulate(&mut loss_sum, out.loss)?;
        accumulate(&mut correct, hits(&out.logits, &batch.y)?)?;
        seen += batch.y.numel();
        batches += 1;
        on_batch();
    }
    let (Some(loss_sum), Some(correct)) = (loss_sum, correct) else {
        return Err(invalid("train_epoch", "the loader produced no batches"));
    };
    Ok(EpochReport {
        mean_loss: loss_sum.item()? / batches as f32,
        train_accuracy: correct.item()? / seen as f32,
    })
}

/// The fraction of `data` that `model` classifies correctly (evaluation mode, no gradients).
pub fn accuracy<B: Backend>(
    model: &mut dyn Module<B>,
    backend: &B,
    data: Arc<Dataset>,
    batch_size: usize,
) -> Result<f32> {
    model.set_training(false);
    let items = data.len();
    let mut loader = DataLoader::new(backend, data, batch_size)?;
    let mut correct = None;
    let counted = no_grad(|| -> Result<()> {
        for batch in loader.epoch() {
            let batch = batch?;
            accumulate(&mut correct, hits(&model.forward(&batch.x)?, &batch.y)?)?;
        }
        Ok(())
    });
    model.set_training(true);
    counted?;
    Ok(correct.map_or(Ok(0.0), |c| c.item())? / items.max(1) as f32)
}

/// Reads the UCI handwritten digits as converted by `data/convert_digits.py`: 8x8 images
/// scaled to `[0, 1]` (item shape `[1, 8, 8]`) and labels 0-9.
pub fn load_digits(path: &Path) -> Result<Dataset> {
    let bytes = std::fs::read(path).map_err(|source| crate::Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_digits(&bytes, &path.display().to_string())
}

/// [`load_digits`] of a file's bytes held in memory (the `digits` example embeds the set);
/// `name` names it in errors.
pub fn parse_digits(bytes: &[u8], name: &str) -> Result<Dataset> {
    let bad = |detail: String| crate::Error::Checkpoint {
        path: name.to_string(),
        detail,
    };
    if bytes.len() < 12 || &bytes[..8] != b"DIGITS01" {
        return Err(bad(
            "not a digits file (magic DIGITS01 missing); regenerate it with data/convert_digits.py"
                .into(),
        ));
    }
    let rows = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    if bytes.len() != 12 + rows * 65 {
        return Err(bad(format!(
            "{} bytes, expected {} for {rows} rows (truncated?)",
            bytes.len(),
            12 + rows * 65
        )));
    }
    let mut features = Vec::with_capacity(rows * 64);
    let mut labels = Vec::with_capacity(rows);
    for row in bytes[12..].chunks_exact(65) {
        if row[..64].iter().any(|&v| v > 16) || row[64] > 9 {
            return Err(bad("a pixel above 16 or a label above 9".into()));
        }
        features.extend(row[..64].iter().map(|&v| v as f32 / 16.0));
        labels.push(row[64] as u32);
    }
    Dataset::new(features, &[1, 8, 8], labels)
}

/// Shifts a `[channels, side, side]` image by up to one pixel in each direction (chosen by
/// `random`), filling with zeros: the augmentation the digits example trains with.
pub fn shift_image(item: &mut [f32], side: usize, random: u64) {
    let dy = (random % 3) as isize - 1;
    let dx = ((random / 3) % 3) as isize - 1;
    if dx == 0 && dy == 0 {
        return;
    }
    let plane = side * side;
    for chan in item.chunks_mut(plane) {
        let src = chan.to_vec();
        for y in 0..side as isize {
            for x in 0..side as isize {
                let (sy, sx) = (y - dy, x - dx);
                let inside = (0..side as isize).contains(&sy) && (0..side as isize).contains(&sx);
                chan[(y * side as isize + x) as usize] = if inside {
                    src[(sy * side as isize + sx) as usize]
                } else {
                    0.0
                };
            }
        }
    }
}

/// Synthetic classification data shaped like MNIST (`[1, 28, 28]`, 10 classes): each class is
/// a fixed random prototype plus noise, so models can learn it and timing is realistic.
pub fn synthetic_mnist(items: usize, seed: u64) -> Result<Dataset> {
    let mut drawn = 0u64;
    let mut next = move || {
        drawn += 1;
        (crate::data::splitmix(seed ^ crate::data::splitmix(drawn)) >> 40) as f32
            / (1u64 << 24) as f32
    };
    let prototypes: Vec<f32> = (0..10 * 784).map(|_| next()).collect();
    let mut features = Vec::with_capacity(items * 784);
    let mut labels = Vec::with_capacity(items);
    for i in 0..items {
        let class = i % 10;
        features.extend(
            prototypes[class * 784..(class + 1) * 784]
                .iter()
                .map(|&p| 0.6 * p + 0.4 * next()),
        );
        labels.push(class as u32);
    }
    Dataset::new(features, &[1, 28, 28], labels)
}
