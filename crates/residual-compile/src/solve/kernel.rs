//! A scope for the solvers' IR kernels whose float buffers and constants take the solve's
//! precision.

use crate::Precision;
use hal::DType;
use hal::ir::expr::{Expr, Scope};
use hal::ir::{Access, BufferId, ScalarType};

/// A scope whose buffers are of `p`'s dtype.
pub(super) struct Kernel {
    pub(super) s: Scope,
    dtype: DType,
    ft: ScalarType,
}

impl Kernel {
    pub(super) fn new(name: &str, p: Precision) -> Self {
        Kernel {
            s: Scope::new(name),
            dtype: p.dtype(),
            ft: p.scalar(),
        }
    }
    pub(super) fn read(&self) -> BufferId {
        self.s.buffer(self.dtype, Access::Read)
    }
    pub(super) fn write(&self) -> BufferId {
        self.s.buffer(self.dtype, Access::Write)
    }
    pub(super) fn read_write(&self) -> BufferId {
        self.s.buffer(self.dtype, Access::ReadWrite)
    }
    /// A `U32` buffer read as indices.
    pub(super) fn indices(&self) -> BufferId {
        self.s.buffer(DType::U32, Access::Read)
    }
    pub(super) fn float(&self, v: f64) -> Expr<'_> {
        self.s.float(self.ft, v)
    }
    /// `scal[num] / scal[den]` where the denominator is positive, 0 otherwise.
    pub(super) fn safe_ratio(&self, scal: BufferId, num: u32, den: u32) -> Expr<'_> {
        let s = &self.s;
        let (n, d) = (s.load(scal, s.u32(num)), s.load(scal, s.u32(den)));
        let zero = self.float(0.0);
        d.gt(zero).select(n / d, zero)
    }
}

/// Compiles `programs` on `backend`, each on a thread of its own: the larger unrolled kernels
/// take NVRTC a fraction of a second each, which one after another added up to seconds
/// (on wasm32, which has no threads, they are compiled one after another).
pub(super) fn compile_all<B: hal::Backend>(
    backend: &B,
    programs: &[hal::ir::Program],
) -> Result<Vec<B::Kernel>, crate::Error> {
    if cfg!(target_arch = "wasm32") {
        return programs
            .iter()
            .map(|p| backend.compile(p).map_err(Into::into))
            .collect();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = programs
            .iter()
            .map(|p| s.spawn(move || backend.compile(p)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .expect("a compile thread panicked")
                    .map_err(Into::into)
            })
            .collect()
    })
}
