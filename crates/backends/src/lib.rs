//! # backends: every `hal` backend, picked by name at run time
//!
//! Workloads are generic over `B: hal::Backend` and depend on `hal` only; a binary, an example
//! or a bench chooses the backend when it runs. This crate is that choice, written once:
//! [`resolve`] turns `auto` into the best backend present, and [`on_backend!`] calls a generic
//! function on the backend a name selects, so the hot path is monomorphised and nothing
//! needs `dyn`.
//!
//! ```
//! fn describe<B: hal::Backend>(b: &B) -> Result<String, String> {
//!     Ok(b.info().name)
//! }
//! let name = backends::on_backend!("cpu", describe()).unwrap();
//! assert!(!name.is_empty());
//! ```

use hal::Backend;

pub use backend_cpu;
pub use backend_cuda;
pub use backend_wgpu;
pub use backend_wgpu::quiet_headless_start;

/// Makes the calling thread the first of rayon's pool ([`backend_cpu::join_rayon_pool`]):
/// for a binary whose main thread alone drives the backend, so that the CPU backend's
/// parallel passes start there instead of waking the pool and waiting. Where the pool cannot
/// be built so (it already exists), `program` says why on standard error and goes on.
pub fn join_rayon_pool(program: &str) {
    if let Err(e) = backend_cpu::join_rayon_pool(0) {
        eprintln!("{program}: {e}");
    }
}

/// The best backend present: CUDA if a driver and GPU are there, else wgpu on a hardware GPU
/// (not a software rasteriser such as lavapipe), else the CPU.
pub fn best_present() -> &'static str {
    if backend_cuda::CudaBackend::new().is_ok() {
        "cuda"
    } else if backend_wgpu::WgpuBackend::new().is_ok_and(|b| b.info().kind.is_hardware_gpu()) {
        "wgpu"
    } else {
        "cpu"
    }
}

/// `choice` itself, or for `auto` the [`best_present`] backend.
pub fn resolve(choice: &str) -> &str {
    match choice {
        "auto" => best_present(),
        other => other,
    }
}

/// `on_backend!(name, f(args...))` runs the generic `f(&backend, args...)` on the backend
/// `name` selects (`cpu`, `wgpu`, `cuda`); `f` returns `Result<T, String>`. A backend that
/// cannot start, or an unknown name, is an `Err` with the reason.
#[macro_export]
macro_rules! on_backend {
    ($choice:expr, $f:ident ( $($arg:expr),* )) => {
        match $choice {
            "cpu" => $f(&$crate::backend_cpu::CpuBackend::new(), $($arg),*),
            "wgpu" => $crate::backend_wgpu::WgpuBackend::new()
                .map_err(|e| e.to_string())
                .and_then(|b| $f(&b, $($arg),*)),
            "cuda" => $crate::backend_cuda::CudaBackend::new()
                .map_err(|e| e.to_string())
                .and_then(|b| $f(&b, $($arg),*)),
            other => Err(format!("unknown backend {other} (expected cpu, wgpu, cuda or auto)")),
        }
    };
}

/// `on_group!(name, n, f(args...))` runs the generic `f(communicators, args...)` with a group of
/// `n` ranks on the backend `name` selects: threads of the CPU reference
/// ([`backend_cpu::CpuCommunicator`]), or GPUs `0..n` over NCCL
/// ([`backend_cuda::NcclCommunicator`]). `f` gets the ranks' handles in rank order (drive each
/// from its own thread) and returns `Result<T, String>`. wgpu has no collectives: an `Err`.
#[macro_export]
macro_rules! on_group {
    ($choice:expr, $n:expr, $f:ident ( $($arg:expr),* )) => {
        match $choice {
            "cpu" => $crate::backend_cpu::CpuCommunicator::group($n)
                .map_err(|e| e.to_string())
                .and_then(|g| $f(g, $($arg),*)),
            "cuda" => (0..$n)
                .map($crate::backend_cuda::CudaBackend::with_ordinal)
                .collect::<Result<Vec<_>, _>>()
                .and_then($crate::backend_cuda::NcclCommunicator::for_backends)
                .map_err(|e| e.to_string())
                .and_then(|g| $f(g, $($arg),*)),
            "wgpu" => Err(
                "wgpu has no collectives: several devices need cuda (NCCL) or cpu".to_string(),
            ),
            other => Err(format!("unknown backend {other} (expected cpu or cuda)")),
        }
    };
}
