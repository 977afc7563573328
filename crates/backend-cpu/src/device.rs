//! The machine the backend runs on: its name, memory and what it can do, and allocation
//! within its memory.

use crate::CpuBuffer;
use crate::storage;
use hal::{Capabilities, DType, DeviceInfo, DeviceKind, Error, Result};
use std::sync::Arc;

/// `(total, available)` system memory in bytes, from `/proc/meminfo` where it exists.
pub(crate) fn memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:").unwrap_or(16 << 30);
    (total, field("MemAvailable:").unwrap_or(total))
}

pub(crate) fn info() -> DeviceInfo {
    let (total, available) = memory();
    let name = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    DeviceInfo {
        backend: "cpu",
        name: format!("{name} ({} threads)", rayon::current_num_threads()),
        kind: DeviceKind::Cpu,
        memory_total: total,
        memory_available: available,
    }
}

/// The primitives that run in `f64` here: every one that has an `f64` form.
pub(crate) const F64_PRIMITIVES: &[&str] = &hal::F64Support::ALL_PRIMITIVES;

pub(crate) fn capabilities() -> Capabilities {
    Capabilities {
        dtypes: DType::ALL.to_vec(),
        max_buffer_bytes: memory().0,
        parallelism: rayon::current_num_threads(),
        native_float_atomics: false,
        subgroups: false,
        matrix_units: false,
        graph_capture: false,
        program_buffers: usize::MAX,
        fast_precision: false,
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

/// A zeroed buffer of `len` elements, refused beyond the system memory or what is available.
pub(crate) fn alloc(dtype: DType, len: usize) -> Result<CpuBuffer> {
    alloc_as(dtype, len, storage::Storage::zeroed)
}

/// A buffer of `len` elements for an output written whole: a kept allocation is not cleared
/// first (see [`storage::Storage::for_write`]).
pub(crate) fn alloc_for_write(dtype: DType, len: usize) -> Result<CpuBuffer> {
    alloc_as(dtype, len, storage::Storage::for_write)
}

/// Requests below this many bytes skip the check against the system's memory, which reads
/// `/proc/meminfo` (a training step allocates hundreds of buffers; the read cost more than
/// the allocations).
const CHECKED_BYTES: u128 = 64 << 20;

fn alloc_as(
    dtype: DType,
    len: usize,
    make: fn(DType, usize) -> Option<storage::Storage>,
) -> Result<CpuBuffer> {
    let requested = len as u128 * dtype.size_in_bytes() as u128;
    if requested >= CHECKED_BYTES {
        check_memory(requested, dtype, len)?;
    }
    make(dtype, len)
        .map(|s| CpuBuffer(Arc::new(s)))
        .ok_or(Error::OutOfMemory {
            requested_bytes: requested,
        })
}

fn check_memory(requested: u128, dtype: DType, len: usize) -> Result<()> {
    let (total, available) = memory();
    if requested > total as u128 {
        return Err(Error::AllocationTooLarge {
            requested_bytes: requested,
            limit_bytes: total,
            what: format!(
                "{len} elements of {dtype}; the CPU backend's limit is the system memory"
            ),
        });
    }
    // Linux would hand out such an allocation lazily and kill the process when it is
    // touched; refusing it here keeps the error an error.
    if requested > available as u128 {
        return Err(Error::OutOfMemory {
            requested_bytes: requested,
        });
    }
    Ok(())
}
