//! Random fills.

use crate::device::Args;
use crate::walk::Walk;
use crate::{CudaBackend, V};
use hal::{DType, DeviceBuffer, Distribution, Result, validate};

pub(crate) fn random(
    gpu: &CudaBackend,
    out: V<'_>,
    dist: Distribution,
    seed: u64,
    offset: u64,
) -> Result<()> {
    validate::random(out)?;
    gpu.dev.bind()?;
    let w = Walk::of("random", &out.layout.shape, &[out.layout])?;
    let (normal, p0, p1) = match dist {
        Distribution::Uniform { low, high } => (0i32, low, high),
        Distribution::Normal { mean, std } => (1, mean, std),
    };
    if out.buffer.dtype() == DType::F64 {
        return gpu.dev.launch(
            "random_wide_kernel",
            w.n as usize,
            Args::new()
                .arg(w)
                .arg(out.buffer.ptr())
                .arg(seed as u32)
                .arg((seed >> 32) as u32)
                .arg(offset)
                .arg(normal)
                .arg(p0 as f64)
                .arg(p1 as f64),
        );
    }
    gpu.dev.launch(
        "random_kernel",
        w.n as usize,
        Args::new()
            .arg(w)
            .operand(out.buffer)
            .arg(seed as u32)
            .arg((seed >> 32) as u32)
            .arg(offset)
            .arg(normal)
            .arg(p0)
            .arg(p1),
    )
}
