//! What a device is and what it can do.

use crate::DType;

/// The broad kind of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    DiscreteGpu,
    IntegratedGpu,
    /// A software rasteriser or emulator (lavapipe, for instance).
    Software,
    Other,
}

impl DeviceKind {
    /// A discrete or integrated GPU: what `auto` backend choices prefer over the CPU backend.
    /// A software rasteriser (lavapipe) is not one, whatever API it speaks.
    pub fn is_hardware_gpu(self) -> bool {
        matches!(self, DeviceKind::DiscreteGpu | DeviceKind::IntegratedGpu)
    }
}

/// A description of the device a backend runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The backend's short name: `cpu`, `wgpu`, `cuda`.
    pub backend: &'static str,
    /// The device's name as the driver reports it.
    pub name: String,
    pub kind: DeviceKind,
    /// Total device memory in bytes (system memory for the CPU).
    pub memory_total: u64,
    /// Memory available now in bytes, as best the backend can tell.
    pub memory_available: u64,
}

/// Which optional paths a backend offers. Workloads consult this instead of probing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Dtypes buffers may hold.
    pub dtypes: Vec<DType>,
    /// The largest single buffer in bytes.
    pub max_buffer_bytes: u64,
    /// Parallel workers (CPU threads, GPU streaming multiprocessors, ...).
    pub parallelism: usize,
    /// Float atomics in the IR's `AtomicAdd` are native rather than emulated.
    pub native_float_atomics: bool,
    /// Subgroup (warp) operations are available to the backend's kernels.
    pub subgroups: bool,
    /// Matrix units (tensor cores / cooperative matrices) are available to the backend.
    pub matrix_units: bool,
    /// `record`/`replay` capture launches (into a device graph on CUDA, a list of encoded
    /// dispatches on wgpu) rather than re-running the calls.
    pub graph_capture: bool,
    /// The most buffers one IR program may declare ([`Backend::compile`](crate::Backend::compile)
    /// refuses more): what a caller batching many tensors into one launch sizes its groups by.
    pub program_buffers: usize,
    /// [`Precision::Fast`](crate::Precision::Fast) has its own, faster path (otherwise it runs
    /// exactly).
    pub fast_precision: bool,
    /// [`Precision::Compensated`](crate::Precision::Compensated) has its own path on matrix
    /// units (otherwise it runs exactly).
    pub compensated_precision: bool,
    /// [`Backend::matmul_epilogue`](crate::Backend::matmul_epilogue) applies
    /// [`Epilogue::a_gate`](crate::Epilogue::a_gate) as its kernel reads `a` (and, for
    /// products of some shapes, makes [`Epilogue::a_row_sums`](crate::Epilogue::a_row_sums)
    /// in the same pass), so a caller with one gated operand for two products does better
    /// passing the gate to each than making the gated operand once (which the default, and a
    /// backend without this, does per call).
    pub fused_gradient_products: bool,
    /// What the device runs in double precision.
    pub f64: F64Support,
}

/// What a device runs in `f64`. Whatever is not offered is refused with
/// [`crate::Error::UnsupportedDType`] naming the operation and the reason, never run in a
/// narrower type.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct F64Support {
    /// `f64` buffers: alloc, upload, read, write, fill and copy.
    pub storage: bool,
    /// Programs with `F64` values: arithmetic, `sqrt`, `fma`, `min`/`max`, `floor`/`ceil`,
    /// comparisons, selects, casts, loads and stores.
    pub programs: bool,
    /// The transcendental functions (`exp`, `exp2`, `log`, `log2`, `sin`, `cos`, `tan`,
    /// `tanh`, `pow`, `atan2`) in `F64` programs.
    pub program_math: bool,
    /// `AtomicAdd` into `f64` buffers.
    pub atomics: bool,
    /// The primitives (by their [`crate::Backend`] method names) that take `f64` operands;
    /// `"reduce_logsumexp"` is `reduce` with [`crate::ReduceOp::LogSumExp`], listed apart
    /// because a backend may have the other reductions in `f64` and not that one.
    pub primitives: Vec<&'static str>,
    /// Why what is missing is missing (empty when everything is offered).
    pub note: String,
}

impl F64Support {
    /// Every primitive that has an `f64` form.
    pub const ALL_PRIMITIVES: [&'static str; 23] = [
        "layer_norm",
        "layer_norm_backward",
        "attention",
        "attention_backward",
        "fill",
        "copy",
        "unary",
        "binary",
        "ternary",
        "reduce",
        "reduce_logsumexp",
        "arg_reduce",
        "matmul",
        "spmv_csr",
        "gather",
        "scatter_add",
        "im2col",
        "col2im",
        "segment_sum",
        "sgd_step",
        "adam_step",
        "random",
        "launch",
    ];

    /// Whether primitive `op` takes `f64` operands here.
    pub fn primitive(&self, op: &str) -> bool {
        self.primitives.contains(&op)
    }
}
