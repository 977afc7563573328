//! Opening a device: what it is, what it can do, waiting for it.

use crate::CudaBackend;
use crate::device::{Args, Device, driver_error};
use cudarc::driver::result as drv;
use hal::fault::fault_error;
use hal::{Capabilities, DType, DeviceInfo, DeviceKind, Error, Precision, Result};
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub(crate) fn info(gpu: &CudaBackend) -> DeviceInfo {
    let available = gpu
        .device_memory()
        .map(|(free, _)| free as u64)
        .unwrap_or(0);
    DeviceInfo {
        backend: "cuda",
        name: gpu.dev.name.clone(),
        kind: DeviceKind::DiscreteGpu,
        memory_total: gpu.dev.memory_total,
        memory_available: available,
    }
}

pub(crate) fn capabilities(gpu: &CudaBackend) -> Capabilities {
    Capabilities {
        dtypes: DType::ALL.to_vec(),
        max_buffer_bytes: gpu.dev.memory_total,
        parallelism: gpu.dev.sms as usize,
        native_float_atomics: true,
        subgroups: true,
        matrix_units: true,
        graph_capture: true,
        program_buffers: crate::program::MAX_BUFFERS,
        fast_precision: true,
        compensated_precision: false,
        fused_gradient_products: false,
        f64: hal::F64Support {
            storage: true,
            programs: true,
            program_math: true,
            atomics: true,
            primitives: F64_PRIMITIVES.to_vec(),
            note: String::new(),
        },
    }
}

/// The primitives that run in `f64` on this backend: all that have an f64 form.
pub(crate) const F64_PRIMITIVES: &[&str] = &hal::F64Support::ALL_PRIMITIVES;

impl CudaBackend {
    /// Refuses `op` on `f64` operands where this backend does not run it in `f64`.
    pub(crate) fn f64_offered(&self, op: &'static str, dtypes: &[DType]) -> Result<()> {
        hal::validate::f64_offered(op, dtypes, F64_PRIMITIVES.contains(&op), || {
            format!("the CUDA backend has no f64 form of `{op}`")
        })
    }
}

pub(crate) fn synchronize(gpu: &CudaBackend) -> Result<()> {
    gpu.refuse_in_capture("synchronize")?;
    gpu.dev.bind()?;
    gpu.dev.synchronize_stream()?;
    match gpu.dev.take_fault()?.and_then(|w| fault_error("cuda", w)) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

impl CudaBackend {
    /// Opens GPU 0. Fails with [`Error::Unavailable`] (saying why) when there is no driver, no
    /// cuBLAS, no device, or a device older than compute capability 8.0.
    pub fn new() -> Result<Self> {
        Self::with_ordinal(0)
    }

    /// Under `HAL_CUDA_PROFILE` (see the `profile` module): waits for the device, returns the GPU time
    /// per kernel since the last call divided by `runs`, and starts the totals afresh.
    /// `None` when not profiling.
    pub fn take_profile(&self, runs: usize) -> Result<Option<String>> {
        let Some(profiler) = &self.dev.profiler else {
            return Ok(None);
        };
        self.dev.bind()?;
        self.dev.synchronize_stream()?;
        let report = profiler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_report(runs);
        Ok(Some(report))
    }

    pub fn with_ordinal(ordinal: usize) -> Result<Self> {
        Ok(Self {
            dev: Arc::new(Device::open(ordinal)?),
            kernels: Arc::new(hal::ir::KernelCache::default()),
            precision: Precision::Exact,
        })
    }

    /// Launches an empty kernel (one block of one thread): the launch overhead, for the bench.
    /// The CUDA device ordinal this handle drives.
    pub fn ordinal(&self) -> usize {
        self.dev.ctx.ordinal()
    }

    pub fn launch_empty(&self) -> Result<()> {
        self.dev.bind()?;
        let f = self.dev.function("empty_kernel")?;
        self.dev.launch_raw(f, (1, 1, 1), 1, Args::new())
    }

    /// Device memory the driver reports free and total, in bytes.
    pub fn device_memory(&self) -> Result<(usize, usize)> {
        self.dev.bind()?;
        drv::mem_get_info().map_err(|e| driver_error("cuMemGetInfo", e))
    }

    pub(crate) fn refuse_in_capture(&self, op: &'static str) -> Result<()> {
        if self.dev.capturing.load(Ordering::Acquire) {
            return Err(Error::inside_recording(op));
        }
        Ok(())
    }
}
