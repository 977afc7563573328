//! # backend-cpu: the reference backend
//!
//! Implements every [`hal::Backend`] primitive and the scalar program IR on the CPU. It is the
//! reference the GPU backends are checked against, and a real fallback for users without a
//! GPU: kernels run on all cores (rayon), GEMM uses `faer`'s SIMD micro-kernels (AVX-512 where
//! the CPU has it), and `f16`/`bf16` storage goes through `half`.
//!
//! ```
//! use backend_cpu::CpuBackend;
//! use hal::{Backend, BackendExt, BinaryOp, Layout, View};
//! let cpu = CpuBackend::new();
//! let a = cpu.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
//! let b = cpu.upload(&[10.0f32, 20.0, 30.0]).unwrap();
//! let out = cpu.alloc(hal::DType::F32, 6).unwrap();
//! let (la, lb) = (Layout::contiguous(&[2, 3]), Layout::contiguous(&[3]));
//! // b broadcasts along the rows of a
//! cpu.binary(BinaryOp::Add, View::new(&a, &la), View::new(&b, &lb), View::new(&out, &la)).unwrap();
//! assert_eq!(cpu.read::<f32>(&out).unwrap(), vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
//! ```
//!
//! Execution model: a call runs to completion before it returns (the "queue" is the calling
//! thread), using rayon's pool inside. Calls are serialised process-wide by one lock, which is
//! what makes the raw-pointer kernels sound; do not call the backend from inside a rayon
//! parallel iterator of your own, where a stolen task could try to take the lock again.
//! A program that calls the backend from its main thread should make that thread one of
//! rayon's first ([`join_rayon_pool`]): each parallel pass then starts on it instead of
//! waking the pool and waiting.

// Kernels take each operand as a pointer plus a layout, so eight arguments are the norm, not a
// smell; bundling them into structs would only rename the problem.
#![allow(clippy::too_many_arguments)]

pub mod collective;
mod device;
mod math;
mod ops;
mod profile;
mod program;
mod storage;
mod threads;
mod walk;

pub use collective::CpuCommunicator;
pub use program::CpuKernel;
pub use storage::CpuBuffer;
pub use threads::join_rayon_pool;

use hal::ir::Program;
use hal::{
    AdamParams, ArgReduceOp, AttentionGrads, AttentionInputs, AttentionParams, Backend, BinaryOp,
    CandidateInputs, Capabilities, Conv2dGeometry, Csr, DType, DeviceBuffer, DeviceInfo,
    Distribution, Error, IvfScanInputs, Layout, NormGrads, NormInputs, Precision, ReduceOp, Result,
    SgdParams, TernaryOp, UnaryOp, View, validate,
};
use ops::{
    attention, cluster, conv, elementwise, index, matmul, norm, optim, random, reduce, segment,
    topk,
};
use std::sync::{Arc, Mutex, MutexGuard};

static EXEC: Mutex<()> = Mutex::new(());

/// Whether this CPU runs the kernels compiled with `#[target_feature(enable = "avx2,fma")]`
/// (the build itself targets baseline x86-64). `std` caches the detection.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// The execution lock, held for one call; under `HAL_CPU_PROFILE` it also times the call
/// (see [`profile`]).
struct Exec<'a> {
    _lock: MutexGuard<'static, ()>,
    timing: Option<(&'a str, std::time::Instant)>,
}

impl Drop for Exec<'_> {
    fn drop(&mut self) {
        if let Some((what, start)) = self.timing {
            profile::add(what, start);
        }
    }
}

/// Takes the execution lock for a call of `what` (a primitive's name, or a program's).
fn exec(what: &str) -> Exec<'_> {
    // A panic inside a kernel poisons the lock but leaves no state to repair.
    let lock = EXEC.lock().unwrap_or_else(|p| p.into_inner());
    Exec {
        _lock: lock,
        timing: profile::enabled().then(|| (what, std::time::Instant::now())),
    }
}

/// The CPU device handle. Cheap to clone; clones share the kernel cache.
#[derive(Clone, Default)]
pub struct CpuBackend {
    kernels: Arc<hal::ir::KernelCache<CpuKernel>>,
    /// Only [`Precision::Reproducible`] changes anything here (`segment_sum`'s summation);
    /// the CPU has no faster reduced-precision path.
    precision: Precision,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuBackend({} threads)", rayon::current_num_threads())
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// Under `HAL_CPU_PROFILE`: the wall time per primitive (programs by name) since the last
    /// call, divided by `runs`, and the totals started afresh; `None` when not profiling.
    /// A tuning aid, like the GPU backends' profiles.
    pub fn take_profile(&self, runs: usize) -> Option<String> {
        profile::take_report(runs)
    }
    /// Kernels compiled so far (structurally distinct programs).
    pub fn cached_kernels(&self) -> usize {
        self.kernels.len()
    }
}

/// Checks that every index in `index` lies in `0..bound`; the first one that does not is the
/// error. Runs before the primitive writes anything, so a failed call leaves its output as it was.
fn check_indices(op: &'static str, index: View<'_, CpuBuffer>, bound: usize) -> Result<()> {
    let walk = walk::Walk::new(&index.layout.shape, [index.layout]);
    let src = index.buffer.src();
    let mut bad: Option<i64> = None;
    walk.runs(0, walk.numel(), |_, [o], [s], len| {
        for j in 0..len as isize {
            // SAFETY: the view was checked to lie inside its buffer.
            let v = unsafe { src.load_index(o + j * s) };
            if bad.is_none() && (v < 0 || v as u64 >= bound as u64) {
                bad = Some(v);
            }
        }
    });
    match bad {
        Some(index) => Err(Error::IndexOutOfRange { op, index, bound }),
        None => Ok(()),
    }
}

/// Refuses `op` on `f64` operands where the CPU backend has no `f64` form of it.
fn f64_offered(op: &'static str, dtypes: &[DType]) -> Result<()> {
    validate::f64_offered(op, dtypes, device::F64_PRIMITIVES.contains(&op), || {
        format!("the CPU backend has no f64 form of `{op}`")
    })
}

fn f32_slice(buf: &CpuBuffer) -> &[f32] {
    // SAFETY: dtype checked by callers; the memory lives as long as the buffer handle.
    unsafe { std::slice::from_raw_parts(buf.typed::<f32>(), buf.len()) }
}

fn u32_slice(buf: &CpuBuffer) -> &[u32] {
    // SAFETY: dtype checked by callers (validate::spmv_csr); the memory lives as long as the
    // handle, and no call writes it while the execution lock is held.
    unsafe { std::slice::from_raw_parts(buf.typed::<u32>(), buf.len()) }
}

/// A contiguous copy of a view as `T` (for kernels that want a slice).
fn contiguous<T: hal::Element + Default>(v: View<'_, CpuBuffer>) -> Vec<T> {
    let mut out = vec![T::default(); v.layout.numel()];
    let dst = storage::Dst {
        ptr: out.as_mut_ptr() as *mut u8,
        dtype: T::DTYPE,
    };
    elementwise::copy(
        v.buffer.src(),
        v.layout,
        dst,
        &Layout::contiguous(&v.layout.shape),
    );
    out
}

type V<'a> = View<'a, CpuBuffer>;

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;
    type Kernel = CpuKernel;
    type Graph = hal::Replay<Self>;

    fn info(&self) -> DeviceInfo {
        device::info()
    }

    fn capabilities(&self) -> Capabilities {
        device::capabilities()
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CpuBuffer> {
        device::alloc(dtype, len)
    }

    fn alloc_for_write(&self, dtype: DType, len: usize) -> Result<CpuBuffer> {
        device::alloc_for_write(dtype, len)
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<CpuBuffer> {
        let buf = self.alloc(dtype, validate::upload(dtype, bytes)?)?;
        let _g = exec("upload_bytes");
        // SAFETY: the new buffer has exactly `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.0.as_ptr(), bytes.len()) };
        Ok(buf)
    }

    fn write_bytes(&self, dst: &CpuBuffer, bytes: &[u8]) -> Result<()> {
        validate::write(dst, bytes)?;
        let _g = exec("write_bytes");
        // SAFETY: validate::write proved `bytes` exactly as long as the buffer.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.0.as_ptr(), bytes.len()) };
        Ok(())
    }

    fn read_bytes(&self, src: &CpuBuffer) -> Result<Vec<u8>> {
        let _g = exec("read_bytes");
        // SAFETY: the storage holds `bytes()` initialised bytes.
        Ok(unsafe { std::slice::from_raw_parts(src.0.as_ptr(), src.0.bytes()) }.to_vec())
    }

    fn read_bytes_into(&self, src: &CpuBuffer, dst: &mut [u8]) -> Result<()> {
        let _g = exec("read_bytes_into");
        hal::validate::read_into(src.0.bytes(), dst.len())?;
        // SAFETY: the storage holds `bytes()` initialised bytes; `dst` is a distinct slice.
        dst.copy_from_slice(unsafe { std::slice::from_raw_parts(src.0.as_ptr(), src.0.bytes()) });
        Ok(())
    }

    fn fill(&self, out: V<'_>, value: f64) -> Result<()> {
        validate::fill(out)?;
        let _g = exec("fill");
        elementwise::fill(out.buffer.dst(), out.layout, value);
        Ok(())
    }

    fn copy(&self, src: V<'_>, out: V<'_>) -> Result<()> {
        validate::copy(src, out)?;
        let _g = exec("copy");
        elementwise::copy(src.buffer.src(), src.layout, out.buffer.dst(), out.layout);
        Ok(())
    }

    fn unary(&self, op: UnaryOp, x: V<'_>, out: V<'_>) -> Result<()> {
        let xl = validate::unary(x, out)?;
        f64_offered("unary", &[x.dtype(), out.dtype()])?;
        let _g = exec("unary");
        elementwise::unary(op, x.buffer.src(), &xl, out.buffer.dst(), out.layout);
        Ok(())
    }

    fn binary(&self, op: BinaryOp, a: V<'_>, b: V<'_>, out: V<'_>) -> Result<()> {
        let (al, bl) = validate::binary(a, b, out)?;
        f64_offered("binary", &[a.dtype(), b.dtype(), out.dtype()])?;
        let _g = exec("binary");
        elementwise::binary(
            op,
            a.buffer.src(),
            &al,
            b.buffer.src(),
            &bl,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn ternary(&self, op: TernaryOp, a: V<'_>, b: V<'_>, c: V<'_>, out: V<'_>) -> Result<()> {
        let [al, bl, cl] = validate::ternary(a, b, c, out)?;
        f64_offered("ternary", &[a.dtype(), b.dtype(), c.dtype(), out.dtype()])?;
        let _g = exec("ternary");
        elementwise::ternary(
            op,
            a.buffer.src(),
            &al,
            b.buffer.src(),
            &bl,
            c.buffer.src(),
            &cl,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn reduce(&self, op: ReduceOp, x: V<'_>, axes: &[usize], out: V<'_>) -> Result<()> {
        validate::reduce(op, x, axes, out)?;
        let _g = exec("reduce");
        reduce::reduce(
            op,
            x.buffer.src(),
            x.layout,
            axes,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn arg_reduce(&self, op: ArgReduceOp, x: V<'_>, axis: usize, out: V<'_>) -> Result<()> {
        validate::arg_reduce(x, axis, out)?;
        let _g = exec("arg_reduce");
        reduce::arg_reduce(
            op,
            x.buffer.src(),
            x.layout,
            axis,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn matmul(&self, a: V<'_>, b: V<'_>, out: V<'_>, alpha: f32, beta: f32) -> Result<()> {
        let [am, bm, om] = validate::matmul(a, b, out)?;
        f64_offered("matmul", &[a.dtype(), b.dtype(), out.dtype()])?;
        let _g = exec("matmul");
        matmul::matmul(a.buffer, am, b.buffer, bm, out.buffer, om, alpha, beta);
        Ok(())
    }

    fn spmv_csr(
        &self,
        a: Csr<'_, CpuBuffer>,
        x: &CpuBuffer,
        y: &CpuBuffer,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        validate::spmv_csr(&a, x, y)?;
        f64_offered("spmv_csr", &[a.values.dtype(), x.dtype(), y.dtype()])?;
        let _g = exec("spmv_csr");
        matmul::spmv_csr(a, x, y, alpha, beta)
    }

    fn gather(&self, x: V<'_>, axis: usize, index: V<'_>, out: V<'_>) -> Result<()> {
        validate::gather(x, axis, index, out)?;
        f64_offered("gather", &[x.dtype(), out.dtype()])?;
        let _g = exec("gather");
        check_indices("gather", index, x.layout.shape[axis])?;
        index::gather(
            x.buffer.src(),
            x.layout,
            axis,
            index.buffer.src(),
            index.layout,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn scatter_add(&self, src: V<'_>, axis: usize, index: V<'_>, out: V<'_>) -> Result<()> {
        validate::scatter_add(src, axis, index, out)?;
        f64_offered("scatter_add", &[src.dtype(), out.dtype()])?;
        let _g = exec("scatter_add");
        check_indices("scatter_add", index, out.layout.shape[axis])?;
        index::scatter_add(
            src.buffer.src(),
            src.layout,
            axis,
            index.buffer.src(),
            index.layout,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn im2col(&self, x: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
        validate::im2col(x, g, out)?;
        f64_offered("im2col", &[x.dtype(), out.dtype()])?;
        let _g = exec("im2col");
        conv::im2col(x.buffer.src(), x.layout, g, out.buffer.dst(), out.layout);
        Ok(())
    }

    fn col2im(&self, cols: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
        validate::col2im(cols, g, out)?;
        f64_offered("col2im", &[cols.dtype(), out.dtype()])?;
        let _g = exec("col2im");
        conv::col2im(
            cols.buffer.src(),
            cols.layout,
            g,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn nearest_centroid(
        &self,
        x: V<'_>,
        c: V<'_>,
        out_index: V<'_>,
        out_distance: V<'_>,
    ) -> Result<()> {
        validate::nearest_centroid(x, c, out_index, out_distance)?;
        f64_offered(
            "nearest_centroid",
            &[x.dtype(), c.dtype(), out_distance.dtype()],
        )?;
        if x.layout.rank() == 3 {
            return hal::nearest_per_group([x, c, out_index, out_distance], |[x, c, i, d]| {
                self.nearest_centroid(x, c, i, d)
            });
        }
        let _g = exec("nearest_centroid");
        let reproducible = self.precision == Precision::Reproducible;
        cluster::nearest_centroid_views([x, c, out_index, out_distance], reproducible);
        Ok(())
    }

    fn segment_sum(
        &self,
        x: V<'_>,
        segment: V<'_>,
        weights: Option<V<'_>>,
        sums: V<'_>,
        counts: V<'_>,
    ) -> Result<()> {
        validate::segment_sum(x, segment, weights, sums, counts)?;
        f64_offered("segment_sum", &[x.dtype(), sums.dtype(), counts.dtype()])?;
        let _g = exec("segment_sum");
        check_indices("segment_sum", segment, sums.layout.shape[0])?;
        let reproducible = self.precision == Precision::Reproducible;
        segment::segment_sum_views(x, segment, weights, [sums, counts], reproducible);
        Ok(())
    }

    fn top_k(&self, x: V<'_>, values: V<'_>, indices: V<'_>, largest: bool) -> Result<()> {
        let (rows, n, k) = validate::top_k(x, values, indices)?;
        let _g = exec("top_k");
        topk::top_k(x, values, indices, [rows, n, k], largest);
        Ok(())
    }

    fn ivf_scan(
        &self,
        x: IvfScanInputs<'_, CpuBuffer>,
        distances: V<'_>,
        labels: V<'_>,
    ) -> Result<()> {
        let shape = validate::ivf_scan(x, distances, labels)?;
        let _g = exec("ivf_scan");
        topk::ivf_scan(x, &shape, distances, labels)
    }

    fn candidate_scores(
        &self,
        x: CandidateInputs<'_, CpuBuffer>,
        alpha: f32,
        scores: V<'_>,
    ) -> Result<()> {
        let shape = validate::candidate_scores(x, scores)?;
        let _g = exec("candidate_scores");
        topk::candidate_scores(x, &shape, alpha, scores)
    }

    fn attention(
        &self,
        x: AttentionInputs<'_, CpuBuffer>,
        out: V<'_>,
        lse: V<'_>,
        p: &AttentionParams,
    ) -> Result<()> {
        let (s, mask) = validate::attention(x, out, lse, p)?;
        let _g = exec("attention");
        if x.q.dtype() == DType::F64 {
            attention::forward::<f64>(&s, mask.as_ref(), x, out, lse, p);
        } else {
            attention::forward::<f32>(&s, mask.as_ref(), x, out, lse, p);
        }
        Ok(())
    }

    fn attention_backward(
        &self,
        x: AttentionInputs<'_, CpuBuffer>,
        out: V<'_>,
        lse: V<'_>,
        dout: V<'_>,
        grads: AttentionGrads<'_, CpuBuffer>,
        p: &AttentionParams,
    ) -> Result<()> {
        let (s, mask) = validate::attention_backward(x, out, lse, dout, grads, p)?;
        let _g = exec("attention_backward");
        if x.q.dtype() == DType::F64 {
            attention::backward::<f64>(&s, mask.as_ref(), x, out, lse, dout, grads, p);
        } else {
            attention::backward::<f32>(&s, mask.as_ref(), x, out, lse, dout, grads, p);
        }
        Ok(())
    }

    fn layer_norm(
        &self,
        x: NormInputs<'_, CpuBuffer>,
        out: V<'_>,
        mean: V<'_>,
        rstd: V<'_>,
        eps: f32,
    ) -> Result<()> {
        let size = validate::layer_norm(x, out, mean, rstd, eps)?;
        let _g = exec("layer_norm");
        if norm::is_wide(&x) {
            norm::forward::<f64>(x, size, out, mean, rstd, eps);
        } else {
            norm::forward::<f32>(x, size, out, mean, rstd, eps);
        }
        Ok(())
    }

    fn layer_norm_backward(
        &self,
        x: NormInputs<'_, CpuBuffer>,
        mean: V<'_>,
        rstd: V<'_>,
        dout: V<'_>,
        grads: NormGrads<'_, CpuBuffer>,
    ) -> Result<()> {
        let size = validate::layer_norm_backward(x, mean, rstd, dout, grads)?;
        let _g = exec("layer_norm_backward");
        if norm::is_wide(&x) {
            norm::backward::<f64>(x, size, mean, rstd, dout, grads);
        } else {
            norm::backward::<f32>(x, size, mean, rstd, dout, grads);
        }
        Ok(())
    }

    fn sgd_step(
        &self,
        param: &CpuBuffer,
        grad: &CpuBuffer,
        momentum_buffer: Option<&CpuBuffer>,
        p: &SgdParams,
    ) -> Result<()> {
        validate::sgd_step(param, grad, momentum_buffer, p)?;
        f64_offered("sgd_step", &[param.dtype()])?;
        let _g = exec("sgd_step");
        if param.dtype() == DType::F64 {
            let buf = momentum_buffer.filter(|_| p.momentum != 0.0);
            // SAFETY: validate::sgd_step: f64 buffers of one length.
            unsafe {
                optim::sgd_f64(
                    param.len(),
                    param.typed::<f64>(),
                    grad.typed::<f64>(),
                    buf.map(|b| b.typed::<f64>()),
                    p,
                )
            };
            return Ok(());
        }
        let sh = |b: &CpuBuffer| optim::Shared(b.typed::<f32>());
        let buf = if p.momentum != 0.0 {
            momentum_buffer.map(sh)
        } else {
            None
        };
        optim::sgd(param.len(), sh(param), sh(grad), buf, p);
        Ok(())
    }

    fn adam_step(
        &self,
        param: &CpuBuffer,
        grad: &CpuBuffer,
        m: &CpuBuffer,
        v: &CpuBuffer,
        p: &AdamParams,
    ) -> Result<()> {
        validate::adam_step(param, grad, m, v, p)?;
        f64_offered("adam_step", &[param.dtype()])?;
        let _g = exec("adam_step");
        if param.dtype() == DType::F64 {
            let ptrs = [param, grad, m, v].map(|b| b.typed::<f64>());
            // SAFETY: validate::adam_step: f64 buffers of one length.
            unsafe { optim::adam_f64(param.len(), ptrs, p) };
            return Ok(());
        }
        let sh = |b: &CpuBuffer| optim::Shared(b.typed::<f32>());
        optim::adam(param.len(), sh(param), sh(grad), sh(m), sh(v), p);
        Ok(())
    }

    fn random(&self, out: V<'_>, dist: Distribution, seed: u64, offset: u64) -> Result<()> {
        validate::random(out)?;
        f64_offered("random", &[out.dtype()])?;
        let _g = exec("random");
        random::random(out.buffer.dst(), out.layout, dist, seed, offset);
        Ok(())
    }

    fn compile(&self, program: &Program) -> Result<CpuKernel> {
        self.kernels
            .get_or_compile(program, |p| Ok(CpuKernel(Arc::new(program::compile(p)?))))
    }

    fn launch(&self, kernel: &CpuKernel, args: &[&CpuBuffer], n: usize) -> Result<()> {
        let _g = exec(&kernel.0.program.name);
        program::launch(&kernel.0, args, n)
    }
    fn with_precision(&self, precision: Precision) -> Self {
        Self {
            precision,
            ..self.clone()
        }
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn record(&self, steps: std::sync::Arc<hal::RecordedSteps<Self>>) -> Result<Self::Graph> {
        Ok(hal::Replay::new(steps))
    }

    fn replay(&self, graph: &Self::Graph) -> Result<()> {
        graph.run(self)
    }
}

/// faer's parallelism over every core: rayon's pool natively, the calling thread on wasm32,
/// which has no threads (faer's rayon support is built only for native targets).
pub(crate) fn all_cores() -> faer::Par {
    #[cfg(not(target_arch = "wasm32"))]
    {
        faer::Par::rayon(0)
    }
    #[cfg(target_arch = "wasm32")]
    {
        faer::Par::Seq
    }
}
