//! # backend-cuda: `hal` on NVIDIA GPUs
//!
//! [`CudaBackend`] implements [`hal::Backend`] through cudarc with dynamic loading, so the crate
//! builds on machines without CUDA and reports [`hal::Error::Unavailable`] (never a panic)
//! where the driver, cuBLAS or a GPU is missing.
//!
//! - Kernels are CUDA C in the repository's `cuda/` folder, compiled by `cargo xtask ptx` to PTX
//!   committed in `crates/backend-cuda/ptx/` (ISA 9.0, `compute_80`), each file stamped with the
//!   hash of its sources; building needs no CUDA toolkit (`device::MODULES`). On Hopper the
//!   elementwise kernels come from a compute_90 build and launch with programmatic dependent
//!   launch: each may start while its predecessor runs and waits for it on the device.
//! - `matmul` goes to cuBLAS (`cublasGemmStridedBatchedEx`): f32, f16 and bf16 inputs with f32
//!   accumulation; TF32 tensor cores under [`hal::Precision::Fast`]. The nearest-centroid
//!   search runs on f16 tensor cores, operands scaled into f16's range (exact mode: three
//!   passes over split operands), two candidates a point re-checked in f32.
//! - The scalar program IR is lowered to CUDA C and compiled by NVRTC at run time, cached by the
//!   program's structural hash (`program/`) and, between processes, as CUBIN files on disk
//!   (`cubin_cache.rs`; `BACKEND_CUDA_KERNEL_CACHE=0` turns that off).
//! - Memory comes from a caching allocator (`alloc.rs`): a steady-state loop never calls
//!   `cuMemAlloc`. Every launch goes to one stream, which orders reuse.
//! - [`hal::Backend::record`] captures a sequence of calls into a CUDA graph; `replay` launches
//!   it with one call.
//! - [`NcclCommunicator`]: [`hal::Communicator`] over NCCL (opened at run time), one process
//!   driving several GPUs or one process per GPU meeting through a [`Rendezvous`].
//! - Index operands are checked on the device (a check kernel sets a verdict word that the
//!   guarded kernel reads); a fault is reported by the next `synchronize` or read.

mod alloc;
mod buffer;
mod capture;
pub mod collective;
mod cubin_cache;
mod device;
mod open;
mod ops;
mod profile;
mod program;
mod walk;

pub use alloc::PoolStats;
pub use buffer::CudaBuffer;
pub use capture::CudaGraph;
pub use collective::{NcclCommunicator, Rendezvous, nccl_version};
pub use program::{CudaKernel, lower as cuda_source};

use crate::device::Device;
use hal::ir::Program;
use hal::{
    AdamParams, ArgReduceOp, AttentionGrads, AttentionInputs, AttentionParams, Backend, BinaryOp,
    Capabilities, Conv2dGeometry, Csr, DType, DeviceBuffer, DeviceInfo, Distribution, NormGrads,
    NormInputs, Precision, ReduceOp, Result, SgdParams, TernaryOp, UnaryOp, View,
};
use ops::{
    attention, cluster, conv, elementwise, index, matmul, norm, optim, random, reduce, segment,
    topk,
};
use std::sync::Arc;

/// The kernels' dtype codes (`DT_*` in `cuda/common.cuh`).
pub(crate) fn dtype_code(d: DType) -> i32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::I32 => 3,
        DType::U32 => 4,
        // No primitive kernel takes f64 (they are refused before launch: see ops/).
        DType::F64 => 5,
    }
}

/// A handle to one CUDA device. Cheap to clone; clones share the device, its stream and pool.
#[derive(Clone)]
pub struct CudaBackend {
    dev: Arc<Device>,
    kernels: Arc<hal::ir::KernelCache<CudaKernel>>,
    precision: Precision,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({}, {:?})", self.dev.name, self.precision)
    }
}

type V<'a> = View<'a, CudaBuffer>;

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type Kernel = CudaKernel;
    type Graph = CudaGraph;

    fn info(&self) -> DeviceInfo {
        open::info(self)
    }

    fn capabilities(&self) -> Capabilities {
        open::capabilities(self)
    }

    fn synchronize(&self) -> Result<()> {
        open::synchronize(self)
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        buffer::alloc(self, dtype, len)
    }

    fn alloc_for_write(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        buffer::alloc_for_write(self, dtype, len)
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<CudaBuffer> {
        buffer::upload_bytes(self, dtype, bytes)
    }

    fn write_bytes(&self, dst: &CudaBuffer, bytes: &[u8]) -> Result<()> {
        buffer::write_bytes(self, dst, bytes)
    }

    fn read_bytes(&self, src: &CudaBuffer) -> Result<Vec<u8>> {
        buffer::read_bytes(self, src)
    }

    fn fill(&self, out: V<'_>, value: f64) -> Result<()> {
        self.f64_offered("fill", &[out.dtype()])?;
        elementwise::fill(self, out, value)
    }

    fn copy(&self, src: V<'_>, out: V<'_>) -> Result<()> {
        self.f64_offered("copy", &[src.dtype(), out.dtype()])?;
        elementwise::copy(self, src, out)
    }

    fn unary(&self, op: UnaryOp, x: V<'_>, out: V<'_>) -> Result<()> {
        self.f64_offered("unary", &[x.dtype(), out.dtype()])?;
        elementwise::unary(self, op, x, out)
    }

    fn binary(&self, op: BinaryOp, a: V<'_>, b: V<'_>, out: V<'_>) -> Result<()> {
        self.f64_offered("binary", &[a.dtype(), b.dtype(), out.dtype()])?;
        elementwise::binary(self, op, a, b, out)
    }

    fn ternary(&self, op: TernaryOp, a: V<'_>, b: V<'_>, c: V<'_>, out: V<'_>) -> Result<()> {
        self.f64_offered("ternary", &[a.dtype(), b.dtype(), c.dtype(), out.dtype()])?;
        elementwise::ternary(self, op, a, b, c, out)
    }

    fn reduce(&self, op: ReduceOp, x: V<'_>, axes: &[usize], out: V<'_>) -> Result<()> {
        self.f64_offered("reduce", &[x.dtype(), out.dtype()])?;
        reduce::reduce(self, op, x, axes, out)
    }

    fn arg_reduce(&self, op: ArgReduceOp, x: V<'_>, axis: usize, out: V<'_>) -> Result<()> {
        self.f64_offered("arg_reduce", &[x.dtype()])?;
        reduce::arg_reduce(self, op, x, axis, out)
    }

    fn matmul(&self, a: V<'_>, b: V<'_>, out: V<'_>, alpha: f32, beta: f32) -> Result<()> {
        self.f64_offered("matmul", &[a.dtype(), b.dtype(), out.dtype()])?;
        matmul::matmul(self, a, b, out, alpha, beta)
    }

    fn spmv_csr(
        &self,
        a: Csr<'_, CudaBuffer>,
        x: &CudaBuffer,
        y: &CudaBuffer,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        self.f64_offered("spmv_csr", &[a.values.dtype(), x.dtype(), y.dtype()])?;
        matmul::spmv_csr(self, a, x, y, alpha, beta)
    }

    fn gather(&self, x: V<'_>, axis: usize, index: V<'_>, out: V<'_>) -> Result<()> {
        self.f64_offered("gather", &[x.dtype(), out.dtype()])?;
        index::gather(self, x, axis, index, out)
    }

    fn scatter_add(&self, src: V<'_>, axis: usize, index: V<'_>, out: V<'_>) -> Result<()> {
        self.f64_offered("scatter_add", &[src.dtype(), out.dtype()])?;
        index::scatter_add(self, src, axis, index, out)
    }

    fn im2col(&self, x: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
        self.f64_offered("im2col", &[x.dtype(), out.dtype()])?;
        conv::im2col(self, x, g, out)
    }

    fn col2im(&self, cols: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
        self.f64_offered("col2im", &[cols.dtype(), out.dtype()])?;
        conv::col2im(self, cols, g, out)
    }

    fn nearest_centroid(
        &self,
        x: V<'_>,
        centroids: V<'_>,
        out_index: V<'_>,
        out_distance: V<'_>,
    ) -> Result<()> {
        self.f64_offered(
            "nearest_centroid",
            &[x.dtype(), centroids.dtype(), out_distance.dtype()],
        )?;
        cluster::nearest_centroid(self, x, centroids, out_index, out_distance)
    }

    fn kmeans_pp(&self, x: V<'_>, anchors: V<'_>, seed: u64) -> Result<()> {
        self.f64_offered("kmeans_pp", &[x.dtype(), anchors.dtype()])?;
        cluster::kmeans_pp(self, x, anchors, seed)
    }

    fn top_k(&self, x: V<'_>, values: V<'_>, indices: V<'_>, largest: bool) -> Result<()> {
        topk::top_k(self, x, values, indices, largest)
    }

    fn ivf_scan(
        &self,
        x: hal::IvfScanInputs<'_, CudaBuffer>,
        distances: V<'_>,
        labels: V<'_>,
    ) -> Result<()> {
        topk::ivf_scan(self, x, distances, labels)
    }

    fn candidate_scores(
        &self,
        x: hal::CandidateInputs<'_, CudaBuffer>,
        alpha: f32,
        scores: V<'_>,
    ) -> Result<()> {
        topk::candidate_scores(self, x, alpha, scores)
    }

    fn segment_sum(
        &self,
        x: V<'_>,
        segment: V<'_>,
        weights: Option<V<'_>>,
        sums: V<'_>,
        counts: V<'_>,
    ) -> Result<()> {
        self.f64_offered("segment_sum", &[x.dtype(), sums.dtype(), counts.dtype()])?;
        segment::segment_sum(self, x, segment, weights, sums, counts)
    }

    fn sgd_step(
        &self,
        param: &CudaBuffer,
        grad: &CudaBuffer,
        momentum_buffer: Option<&CudaBuffer>,
        p: &SgdParams,
    ) -> Result<()> {
        self.f64_offered("sgd_step", &[param.dtype()])?;
        optim::sgd_step(self, param, grad, momentum_buffer, p)
    }

    fn attention(
        &self,
        x: AttentionInputs<'_, CudaBuffer>,
        out: V<'_>,
        lse: V<'_>,
        p: &AttentionParams,
    ) -> Result<()> {
        attention::attention(self, x, out, lse, p)
    }

    fn attention_backward(
        &self,
        x: AttentionInputs<'_, CudaBuffer>,
        out: V<'_>,
        lse: V<'_>,
        dout: V<'_>,
        grads: AttentionGrads<'_, CudaBuffer>,
        p: &AttentionParams,
    ) -> Result<()> {
        attention::attention_backward(self, x, out, lse, dout, grads, p)
    }

    fn layer_norm(
        &self,
        x: NormInputs<'_, CudaBuffer>,
        out: V<'_>,
        mean: V<'_>,
        rstd: V<'_>,
        eps: f32,
    ) -> Result<()> {
        norm::layer_norm(self, x, out, mean, rstd, eps)
    }

    fn layer_norm_backward(
        &self,
        x: NormInputs<'_, CudaBuffer>,
        mean: V<'_>,
        rstd: V<'_>,
        dout: V<'_>,
        grads: NormGrads<'_, CudaBuffer>,
    ) -> Result<()> {
        norm::layer_norm_backward(self, x, mean, rstd, dout, grads)
    }

    fn adam_step(
        &self,
        param: &CudaBuffer,
        grad: &CudaBuffer,
        m: &CudaBuffer,
        v: &CudaBuffer,
        p: &AdamParams,
    ) -> Result<()> {
        self.f64_offered("adam_step", &[param.dtype()])?;
        optim::adam_step(self, param, grad, m, v, p)
    }

    fn random(&self, out: V<'_>, dist: Distribution, seed: u64, offset: u64) -> Result<()> {
        self.f64_offered("random", &[out.dtype()])?;
        random::random(self, out, dist, seed, offset)
    }

    fn compile(&self, program: &Program) -> Result<CudaKernel> {
        program::compile_cached(self, program)
    }

    fn launch(&self, kernel: &CudaKernel, args: &[&CudaBuffer], n: usize) -> Result<()> {
        program::launch(self, kernel, args, n)
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

    fn record(&self, steps: Arc<hal::RecordedSteps<Self>>) -> Result<CudaGraph> {
        capture::record(self, steps)
    }

    fn replay(&self, graph: &CudaGraph) -> Result<()> {
        capture::replay(self, graph)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cluster::NearestPlan;
    use crate::ops::elementwise::unary_code;
    use hal::Error;

    /// Without a driver (CI, this crate's build machines) opening the backend is an
    /// `Unavailable` error that says why, never a panic; with one, it opens.
    #[test]
    fn opening_without_a_gpu_is_an_error_not_a_panic() {
        match CudaBackend::new() {
            Ok(b) => assert_eq!(b.info().backend, "cuda"),
            Err(Error::Unavailable { backend, reason }) => {
                assert_eq!(backend, "cuda");
                assert!(!reason.is_empty());
            }
            Err(e) => panic!("expected Unavailable, got {e}"),
        }
    }

    #[test]
    fn every_unary_op_has_a_kernel_code() {
        let codes: Vec<i32> = UnaryOp::all()
            .into_iter()
            .map(|op| unary_code(op).0)
            .collect();
        assert_eq!(codes, (0..UnaryOp::all().len() as i32).collect::<Vec<_>>());
        // The kernel's switch ends with Clamp as its default case.
        assert_eq!(unary_code(UnaryOp::Clamp { lo: 0.0, hi: 1.0 }).0, 23);
    }

    /// The nearest-centroid kernel follows d, the policy and the device's shared memory
    /// (Hopper 227 KiB, A100 163, other Ampere and Ada parts 99).
    #[test]
    fn nearest_kernels_fit_the_shared_memory_they_are_given() {
        let kernel = |precision, d: usize, optin_kib: usize| {
            let p =
                NearestPlan::choose(true, precision, d, d.next_multiple_of(32), optin_kib << 10);
            assert!(p.shared + (5 << 10) <= optin_kib << 10 || p.shared == 0);
            p.kernel
        };
        let (fast, exact) = (Precision::Fast, Precision::Exact);
        assert_eq!(kernel(fast, 128, 227), "nearest_f16_held");
        assert_eq!(kernel(exact, 128, 227), "nearest_f16x3_held");
        assert_eq!(kernel(fast, 132, 227), "nearest_f16_stream");
        assert_eq!(kernel(exact, 768, 227), "nearest_f16x3_stream");
        assert_eq!(kernel(exact, 128, 163), "nearest_f16x3_stream");
        assert_eq!(kernel(fast, 128, 99), "nearest_f16_stream");
        assert_eq!(kernel(exact, 64, 99), "nearest_3xtf32");
        assert_eq!(kernel(fast, 768, 48), "nearest_f16");
        let simt = NearestPlan::choose(false, fast, 128, 128, 227 << 10);
        assert_eq!((simt.kernel, simt.planes), ("nearest_exact", 0));
    }

    #[test]
    fn blas_forms_cover_row_and_column_major_and_refuse_the_rest() {
        assert_eq!(CudaBackend::blas_form(3, 4, 4, 1), Some((false, 4)));
        assert_eq!(CudaBackend::blas_form(3, 4, 1, 3), Some((true, 3)));
        assert_eq!(CudaBackend::blas_form(3, 4, 8, 2), None);
        assert_eq!(CudaBackend::blas_form(3, 4, -4, 1), None);
    }
}
