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
}
