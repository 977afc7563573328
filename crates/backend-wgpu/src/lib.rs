//! # backend-wgpu: the hal backend on wgpu
//!
//! Implements every [`hal::Backend`] primitive and the scalar program IR as WGSL compute
//! shaders on wgpu (Vulkan, Metal, DX12, and a browser's WebGPU on wasm32). It runs on real
//! GPUs and, in CI, on Mesa's software Vulkan driver (lavapipe) and in headless Chromium
//! (SwiftShader). In a browser, open it with [`WgpuBackend::open`] and read with
//! [`hal::Backend::read_bytes_async`]: nothing there may block (`browser.rs`).
//!
//! ```
//! # fn main() -> hal::Result<()> {
//! use backend_wgpu::WgpuBackend;
//! use hal::{Backend, BackendExt, BinaryOp, Layout, View};
//! let gpu = match WgpuBackend::new() {
//!     Ok(b) => b,
//!     Err(e) => { println!("no adapter here: {e}"); return Ok(()); }
//! };
//! let a = gpu.upload(&[1.0f32, 2.0, 3.0])?;
//! let out = gpu.alloc(hal::DType::F32, 3)?;
//! let l = Layout::contiguous(&[3]);
//! gpu.binary(BinaryOp::Mul, View::new(&a, &l), View::new(&a, &l), View::new(&out, &l))?;
//! assert_eq!(gpu.read::<f32>(&out)?, vec![1.0, 4.0, 9.0]);
//! # Ok(()) }
//! ```
//!
//! Kernels live in `shaders/` at the repository root, one WGSL file per primitive family
//! (see [`wgsl`] for how they are specialised and composed). Matrix products and the fused
//! nearest-centroid search share a shared-memory tile, 128 x 128 or smaller by shape;
//! products with few outputs and a long k take a dot-product kernel instead; contiguous f32
//! arithmetic uses vec4 loads. docs/PERF.md has the figures. Buffers are pooled; nothing reads back to the host
//! unless asked: index operands are checked on the device and a bad one is reported by the
//! next synchronize. `record` captures (`src/capture.rs`): a replay encodes the recorded
//! dispatches again without the calls' host work.
//!
//! Optional adapter features, each with a fallback ([`WgpuOptions`] turns them off):
//! immediates (launch parameters as push constants, no buffer write per dispatch),
//! `shader-f16` (f16 buffers as `array<f16>`: 16-bit loads and stores instead of packed words
//! and atomic read-modify-writes; arithmetic stays f32; elementwise kernels write 16-bit
//! outputs a whole word of two elements at a time either way), subgroups (the dot-product GEMM
//! combines partial sums with subgroup shuffles instead of a workgroup-memory tree) and
//! cooperative matrices (tensor cores, see [`coop`]: f16 and bf16 products, f32 products under
//! [`Precision::Fast`] and [`Precision::Compensated`], and the fast nearest-centroid search).

#[cfg(target_arch = "wasm32")]
mod browser;
mod buffer;
mod capture;
pub mod coop;
mod device;
mod fault;
mod knob;
mod ops;
mod pipeline;
mod profile;
mod program;
mod queue;
pub mod wgsl;

pub use buffer::WgpuBuffer;
pub use capture::WgpuGraph;
pub use device::{WgpuOptions, quiet_headless_start};
pub use ops::matmul::route::{TileShape, tile_shape};

use crate::device::Inner;
use hal::ir::Program;
use hal::{
    AdamParams, ArgReduceOp, AttentionGrads, AttentionInputs, AttentionParams, Backend, BinaryOp,
    Capabilities, Conv2dGeometry, Csr, DType, DeviceBuffer, DeviceInfo, Distribution, Epilogue,
    Error, NormGrads, NormInputs, Precision, ReduceOp, Result, SgdParams, TernaryOp, UnaryOp, View,
};
use ops::{
    attention, cluster, conv, elementwise, index, matmul, norm, optim, random, reduce, segment,
    topk,
};
use std::sync::{Arc, Mutex};

/// The WGSL a scalar IR program lowers to (what [`Backend::compile`] builds), for inspection
/// and for `cargo xtask wgsl`.
/// `features`: what the module may use (the default: none).
pub fn program_wgsl(program: &Program, features: wgsl::Features) -> Result<String> {
    program::lower(program, features)
}

const NAME: &str = "wgpu";

/// The wgpu device handle. Cheap to clone.
#[derive(Clone)]
pub struct WgpuBackend(Arc<Inner>, Precision);

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WgpuBackend({} on {:?})",
            self.0.info.name, self.0.info.backend
        )
    }
}

/// Locks `m`, going on with the data of a thread that panicked while holding it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn backend_error(detail: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: NAME,
        detail: detail.to_string(),
    }
}

type V<'a> = View<'a, WgpuBuffer>;

/// Runs `f` inside an error scope of `filter` and returns what it caught. In a browser a
/// scope's answer arrives only through the page's event loop, which a synchronous call cannot
/// wait for: there no scope is opened, and an error reaches the device's uncaptured-error
/// handler instead, which the next synchronize or read reports.
fn caught<T>(
    device: &wgpu::Device,
    filter: wgpu::ErrorFilter,
    f: impl FnOnce() -> T,
) -> (T, Option<wgpu::Error>) {
    if cfg!(target_arch = "wasm32") {
        return (f(), None);
    }
    let scope = device.push_error_scope(filter);
    let value = f();
    (value, pollster::block_on(scope.pop()))
}

impl Backend for WgpuBackend {
    type Buffer = WgpuBuffer;
    type Kernel = program::WgpuKernel;
    type Graph = WgpuGraph;

    fn info(&self) -> DeviceInfo {
        device::info(self)
    }

    fn capabilities(&self) -> Capabilities {
        device::capabilities(self)
    }

    fn synchronize(&self) -> Result<()> {
        queue::synchronize(self)
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<WgpuBuffer> {
        buffer::alloc(self, dtype, len)
    }

    fn alloc_for_write(&self, dtype: DType, len: usize) -> Result<WgpuBuffer> {
        buffer::alloc_for_write(self, dtype, len)
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<WgpuBuffer> {
        buffer::upload_bytes(self, dtype, bytes)
    }

    fn write_bytes(&self, dst: &WgpuBuffer, bytes: &[u8]) -> Result<()> {
        buffer::write_bytes(self, dst, bytes)
    }

    fn read_bytes(&self, src: &WgpuBuffer) -> Result<Vec<u8>> {
        buffer::read_bytes(self, src)
    }

    #[cfg(target_arch = "wasm32")]
    fn read_bytes_async<'a>(
        &'a self,
        src: &'a WgpuBuffer,
    ) -> impl std::future::Future<Output = Result<Vec<u8>>> + 'a {
        browser::read_bytes_async(self, src)
    }

    #[cfg(target_arch = "wasm32")]
    async fn read_bytes_into_async(&self, src: &WgpuBuffer, dst: &mut [u8]) -> Result<()> {
        let bytes = browser::read_bytes_async(self, src).await?;
        hal::validate::read_into(bytes.len(), dst.len())?;
        dst.copy_from_slice(&bytes);
        Ok(())
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

    fn kmeans_pp(&self, x: V<'_>, anchors: V<'_>, seed: u64) -> Result<()> {
        self.f64_offered("kmeans_pp", &[x.dtype(), anchors.dtype()])?;
        cluster::kmeans_pp(self, x, anchors, seed)
    }

    fn arg_reduce(&self, op: ArgReduceOp, x: V<'_>, axis: usize, out: V<'_>) -> Result<()> {
        self.f64_offered("arg_reduce", &[x.dtype()])?;
        reduce::arg_reduce(self, op, x, axis, out)
    }

    fn matmul(&self, a: V<'_>, b: V<'_>, out: V<'_>, alpha: f32, beta: f32) -> Result<()> {
        self.f64_offered("matmul", &[a.dtype(), b.dtype(), out.dtype()])?;
        matmul::matmul(self, a, b, out, alpha, beta)
    }

    fn matmul_epilogue(
        &self,
        a: V<'_>,
        b: V<'_>,
        out: V<'_>,
        alpha: f32,
        beta: f32,
        epilogue: Epilogue<'_, WgpuBuffer>,
    ) -> Result<()> {
        self.f64_offered("matmul_epilogue", &[a.dtype(), b.dtype(), out.dtype()])?;
        matmul::matmul_epilogue(self, a, b, out, alpha, beta, epilogue)
    }

    fn spmv_csr(
        &self,
        a: Csr<'_, WgpuBuffer>,
        x: &WgpuBuffer,
        y: &WgpuBuffer,
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
        c: V<'_>,
        out_index: V<'_>,
        out_distance: V<'_>,
    ) -> Result<()> {
        self.f64_offered(
            "nearest_centroid",
            &[x.dtype(), c.dtype(), out_distance.dtype()],
        )?;
        cluster::nearest_centroid(self, x, c, out_index, out_distance)
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

    fn top_k(&self, x: V<'_>, values: V<'_>, indices: V<'_>, largest: bool) -> Result<()> {
        topk::top_k(self, x, values, indices, largest)
    }

    fn ivf_scan(
        &self,
        x: hal::IvfScanInputs<'_, WgpuBuffer>,
        distances: V<'_>,
        labels: V<'_>,
    ) -> Result<()> {
        topk::ivf_scan(self, x, distances, labels)
    }

    fn candidate_scores(
        &self,
        x: hal::CandidateInputs<'_, WgpuBuffer>,
        alpha: f32,
        scores: V<'_>,
    ) -> Result<()> {
        ops::topk::candidate_scores(self, x, alpha, scores)
    }

    fn sgd_step(
        &self,
        param: &WgpuBuffer,
        grad: &WgpuBuffer,
        momentum_buffer: Option<&WgpuBuffer>,
        h: &SgdParams,
    ) -> Result<()> {
        self.f64_offered("sgd_step", &[param.dtype()])?;
        optim::sgd_step(self, param, grad, momentum_buffer, h)
    }

    fn attention(
        &self,
        x: AttentionInputs<'_, WgpuBuffer>,
        out: V<'_>,
        lse: V<'_>,
        p: &AttentionParams,
    ) -> Result<()> {
        attention::attention(self, x, out, lse, p)
    }

    fn attention_backward(
        &self,
        x: AttentionInputs<'_, WgpuBuffer>,
        out: V<'_>,
        lse: V<'_>,
        dout: V<'_>,
        grads: AttentionGrads<'_, WgpuBuffer>,
        p: &AttentionParams,
    ) -> Result<()> {
        attention::attention_backward(self, x, out, lse, dout, grads, p)
    }

    fn layer_norm(
        &self,
        x: NormInputs<'_, WgpuBuffer>,
        out: V<'_>,
        mean: V<'_>,
        rstd: V<'_>,
        eps: f32,
    ) -> Result<()> {
        norm::layer_norm(self, x, out, mean, rstd, eps)
    }

    fn layer_norm_backward(
        &self,
        x: NormInputs<'_, WgpuBuffer>,
        mean: V<'_>,
        rstd: V<'_>,
        dout: V<'_>,
        grads: NormGrads<'_, WgpuBuffer>,
    ) -> Result<()> {
        norm::layer_norm_backward(self, x, mean, rstd, dout, grads)
    }

    fn adam_step(
        &self,
        param: &WgpuBuffer,
        grad: &WgpuBuffer,
        m: &WgpuBuffer,
        v: &WgpuBuffer,
        h: &AdamParams,
    ) -> Result<()> {
        self.f64_offered("adam_step", &[param.dtype()])?;
        optim::adam_step(self, param, grad, m, v, h)
    }

    fn random(&self, out: V<'_>, dist: Distribution, seed: u64, offset: u64) -> Result<()> {
        self.f64_offered("random", &[out.dtype()])?;
        random::random(self, out, dist, seed, offset)
    }

    fn compile(&self, program: &Program) -> Result<program::WgpuKernel> {
        program::compile(self, program)
    }

    fn launch(&self, kernel: &program::WgpuKernel, args: &[&WgpuBuffer], n: usize) -> Result<()> {
        program::launch(self, kernel, args, n)
    }

    fn with_precision(&self, precision: Precision) -> Self {
        Self(self.0.clone(), precision)
    }

    fn precision(&self) -> Precision {
        self.1
    }

    /// Captures the dispatches, copies and clears `steps` makes (see `src/capture.rs`); nothing
    /// runs until a replay. Calls from other threads on this device while it records are
    /// captured too.
    fn record(&self, steps: std::sync::Arc<hal::RecordedSteps<Self>>) -> Result<Self::Graph> {
        capture::record(self, steps)
    }

    /// Encodes the captured commands again (inside another recording: appends them to it).
    fn replay(&self, graph: &Self::Graph) -> Result<()> {
        capture::replay(self, graph)
    }
}
