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
//!   program's structural hash (`program.rs`).
//! - Memory comes from a caching allocator (`alloc.rs`): a steady-state loop never calls
//!   `cuMemAlloc`. Every launch goes to one stream, which orders reuse.
//! - [`hal::Backend::record`] captures a sequence of calls into a CUDA graph; `replay` launches
//!   it with one call.
//! - Index operands are checked on the device (a check kernel sets a verdict word that the
//!   guarded kernel reads); a fault is reported by the next `synchronize` or read.

mod alloc;
mod device;
mod profile;
mod program;
mod walk;

pub use alloc::PoolStats;
pub use program::{CudaKernel, lower as cuda_source};

use alloc::Block;
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::result as drv;
use device::{Args, Device, driver_error};
use hal::fault::{FaultKind, fault_code, fault_error, index_fault};
use hal::ir::Program;
use hal::validate::{self, MatrixView};
use hal::{
    AdamParams, ArgReduceOp, Backend, BinaryOp, Capabilities, Conv2dGeometry, Csr, DType,
    DeviceBuffer, DeviceInfo, DeviceKind, Distribution, Error, Layout, Precision, ReduceOp, Result,
    SgdParams, TernaryOp, UnaryOp, View,
};
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use walk::{Col2imDivs, FastDiv, Geo, Im2colDivs, Walk};

/// A buffer in device memory. Clones share the memory; the block returns to the backend's
/// pool when the last clone drops.
#[derive(Clone)]
pub struct CudaBuffer {
    block: Arc<Block>,
    dtype: DType,
    len: usize,
}

/// The longest d for which the held nearest-centroid kernels (`nearest_f16_held`,
/// `nearest_f16x3_held`) keep a block's points in shared memory (cluster.cu's `HOLD_D`).
const NEAREST_HOLD_D: usize = 128;

/// Threads per block of `kmeans_pp_race` (reduce.cu's `KPP_BLOCK`).
const KPP_BLOCK: u32 = 256;

/// Below this many centroids `nearest_centroid` takes one light pass instead of a GEMM-style
/// kernel: a warp per point (`nearest_few`), or under `Precision::Reproducible` the
/// reference-order kernel with narrow centroid tiles.
const FEW_CENTROIDS: usize = 16;

/// `arg_reduce` gives each output a block of 1,024 threads (`arg_reduce_block`) instead of a
/// warp when the axis is at least this long and the outputs are few.
const ARG_BLOCK_FROM_LEN: usize = 2048;

/// `arg_reduce` gives each output one thread (`arg_reduce_short`) along axes up to this long.
const ARG_SHORT_UP_TO_LEN: usize = 16;

/// `arg_reduce` of a single output splits the axis over blocks (`arg_reduce_split`) from this
/// length on.
const ARG_SPLIT_FROM_LEN: usize = 4096;

/// The sorted `segment_sum` sums each segment in one part (`segment_ordered`) while segments
/// average at most this many rows.
const WHOLE_SEGMENT_ROWS: usize = 64;

/// `segment_sum` scans every id once per segment (`segment_scan`) while segments times rows
/// stay within this: at 2^24 ids read from L2 that is a few microseconds, against the five
/// launches of the counting sort.
const SCAN_SEGMENTS_TIMES_ROWS: u64 = 1 << 24;

/// Rows per chunk of the segment sums' counting sort: one pass of `segment_place`'s 1,024
/// threads, whose warps take turns within a chunk (so long chunks serialise; chunks of 2,048
/// took 33 us to place a product quantiser's 160,000 rows on an H200, 79 blocks of 64 turns).
const PLACE_CHUNK: usize = 1024;

/// Products with at most this many multiply-adds (`batch * m * n * k`) run as our
/// `small_gemm_*` kernels rather than cuBLAS, whose launch and tile set-up dominate there (a
/// 10 x 128 x 256 weight gradient took 57 us through cuBLAS on an H200).
const SMALL_GEMM_WORK: usize = 1 << 22;

/// The longest inner length of a small product: a warp walks it alone, so longer sums over
/// few outputs go to cuBLAS, which splits them.
const SMALL_GEMM_MAX_K: usize = 4096;

/// From this inner length on, a small product gives each output a warp (`small_gemm_warp`);
/// below it, a thread (`small_gemm_thread`).
const SMALL_GEMM_WARP_FROM_K: usize = 64;

/// A strided matrix operand of the `small_gemm_*` kernels (`SmallMat` in `cuda/reduce.cu`):
/// element offset, then batch, row and column strides.
#[repr(C)]
#[derive(Clone, Copy)]
struct SmallMat {
    offset: i64,
    batch_stride: i64,
    row_stride: i64,
    col_stride: i64,
}

impl SmallMat {
    fn of(m: &MatrixView) -> Self {
        Self {
            offset: m.offset as i64,
            batch_stride: m.batch_stride() as i64,
            row_stride: m.strides[1] as i64,
            col_stride: m.strides[2] as i64,
        }
    }
}

/// Which nearest-centroid kernel runs, and what it needs.
struct NearestPlan {
    kernel: &'static str,
    /// f16 planes of each packed operand (2: high parts and remainders), 0 for unpacked.
    planes: usize,
    /// The points are packed too (the streamed kernels).
    streamed: bool,
    /// Dynamic shared memory, bytes.
    shared: usize,
}

impl NearestPlan {
    /// `tensor_cores`: rows contiguous and aligned, d % 4 == 0; `dp`: d rounded up to 32;
    /// `optin`: the most shared memory a block may have.
    fn choose(
        tensor_cores: bool,
        precision: Precision,
        d: usize,
        dp: usize,
        optin: usize,
    ) -> NearestPlan {
        // The static shared memory of these kernels (candidates, norms) comes on top.
        let fits = |bytes: usize| bytes + (5 << 10) <= optin;
        // cluster.cu: held, (1 + split) x (points + two centroid tiles) of 128 rows of dp + 8
        // halves; streamed, STAGES x (1 + split) x 2 slices of 128 rows of SK + 8 = 40 halves.
        let held = |planes: usize| planes * 3 * 128 * (dp + 8) * 2;
        let streamed = |planes: usize, stages: usize| stages * planes * 2 * 128 * 40 * 2;
        let plan = |kernel, planes, streamed, shared| NearestPlan {
            kernel,
            planes,
            streamed,
            shared,
        };
        let fast = precision == Precision::Fast;
        let planes = if fast { 1 } else { 2 };
        if !tensor_cores {
            return plan("nearest_exact", 0, false, 0);
        }
        if d <= NEAREST_HOLD_D && fits(held(planes)) {
            let kernel = if fast {
                "nearest_f16_held"
            } else {
                "nearest_f16x3_held"
            };
            return plan(kernel, planes, false, held(planes));
        }
        let stages = if fast { 4 } else { 3 };
        if fits(streamed(planes, stages)) {
            let kernel = if fast {
                "nearest_f16_stream"
            } else {
                "nearest_f16x3_stream"
            };
            return plan(kernel, planes, true, streamed(planes, stages));
        }
        if fast {
            plan("nearest_f16", 0, false, 0)
        } else {
            plan("nearest_3xtf32", 0, false, 0)
        }
    }
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuffer({} x {})", self.len, self.dtype)
    }
}

impl DeviceBuffer for CudaBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn same_memory(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.block, &other.block)
    }
}

impl CudaBuffer {
    fn ptr(&self) -> u64 {
        self.block.ptr
    }
    fn bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }
}

/// The kernels' dtype codes (`DT_*` in `cuda/common.cuh`).
pub(crate) fn dtype_code(d: DType) -> i32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::I32 => 3,
        DType::U32 => 4,
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

/// A recorded CUDA graph: the instantiated executable and the memory it uses.
pub struct CudaGraph {
    /// Under `HAL_CUDA_PROFILE`: nothing was captured and a replay makes the calls anew (so
    /// that each launch is timed); `exec` and `graph` are null.
    eager: Option<Arc<hal::RecordedSteps<CudaBackend>>>,
    exec: cudarc::driver::sys::CUgraphExec,
    graph: cudarc::driver::sys::CUgraph,
    /// Blocks allocated during capture (kept alive with the graph).
    _allocated: Vec<Arc<Block>>,
    /// Blocks freed during capture, returned to the pool when the graph drops.
    freed: Vec<(u64, usize)>,
    dev: Arc<Device>,
    /// A launch in the graph can fault (index checks, IR bounds).
    can_fault: bool,
}

// SAFETY: the graph handles are only used under the device's stream order; launching a graph
// exec from several threads is serialised by the driver.
unsafe impl Send for CudaGraph {}
unsafe impl Sync for CudaGraph {}

impl std::fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaGraph({} blocks held)",
            self._allocated.len() + self.freed.len()
        )
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if self.eager.is_some() {
            return;
        }
        let _ = self.dev.bind();
        // SAFETY: the handles are ours; the stream orders any replay still running before the
        // freed blocks are reused.
        unsafe {
            let _ = drv::graph::exec_destroy(self.exec);
            let _ = drv::graph::destroy(self.graph);
        }
        self.dev.pool.give_back(std::mem::take(&mut self.freed));
    }
}

type V<'a> = View<'a, CudaBuffer>;

impl CudaBackend {
    /// Opens GPU 0. Fails with [`Error::Unavailable`] (saying why) when there is no driver, no
    /// cuBLAS, no device, or a device older than compute capability 8.0.
    pub fn new() -> Result<Self> {
        Self::with_ordinal(0)
    }

    /// For tests of code that allocates with `alloc_for_write`: from now on (on every clone of
    /// this handle) such buffers start as all-ones bits, NaN in every float dtype, so that an
    /// element the next call fails to write shows up instead of passing as a leftover zero.
    pub fn poison_for_write(&self, on: bool) {
        self.dev.poison_for_write.store(on, Ordering::Relaxed);
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

    /// The allocator's figures: memory taken from the driver and in use, and how many times it
    /// called `cuMemAlloc`.
    pub fn pool_stats(&self) -> PoolStats {
        self.dev.pool.stats()
    }

    /// Launches an empty kernel (one block of one thread): the launch overhead, for the bench.
    pub fn launch_empty(&self) -> Result<()> {
        self.dev.bind()?;
        let f = self.dev.function("empty_kernel")?;
        self.dev.launch_raw(f, (1, 1, 1), 1, Args::new())
    }

    /// The driver's device-to-device copy of a whole buffer (`cuMemcpyDtoDAsync`): the copy
    /// bandwidth the bench compares elementwise kernels with.
    pub fn copy_whole_buffer(&self, src: &CudaBuffer, dst: &CudaBuffer) -> Result<()> {
        if src.bytes() != dst.bytes() {
            return Err(Error::InvalidArgument {
                op: "copy_whole_buffer",
                detail: format!("{} bytes into {} bytes", src.bytes(), dst.bytes()),
            });
        }
        self.dev.bind()?;
        // SAFETY: both blocks hold the stated bytes.
        unsafe { drv::memcpy_dtod_async(dst.ptr(), src.ptr(), src.bytes(), self.dev.stream) }
            .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
    }

    /// Device memory the driver reports free and total, in bytes.
    pub fn device_memory(&self) -> Result<(usize, usize)> {
        self.dev.bind()?;
        drv::mem_get_info().map_err(|e| driver_error("cuMemGetInfo", e))
    }

    fn new_buffer(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .filter(|&b| (b as u64) <= self.dev.memory_total)
            .ok_or_else(|| Error::AllocationTooLarge {
                requested_bytes: len as u128 * dtype.size_in_bytes() as u128,
                limit_bytes: self.dev.memory_total,
                what: format!("a buffer of {len} x {dtype}"),
            })?;
        self.dev.bind()?;
        Ok(CudaBuffer {
            block: self.dev.pool.alloc(bytes)?,
            dtype,
            len,
        })
    }

    /// A zeroed scratch buffer for one call (back to the pool when dropped).
    fn scratch(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        let b = self.new_buffer(dtype, len)?;
        self.dev.memset(b.ptr(), 0, b.bytes())?;
        Ok(b)
    }

    /// Launches an im2col/col2im kernel over `total` positions: `args` holds the geometry
    /// (and the divisors of the u32 form); the source and destination follow.
    fn launch_image_copy(
        &self,
        name: &'static str,
        total: usize,
        args: Args,
        src: V<'_>,
        out: V<'_>,
    ) -> Result<()> {
        self.dev
            .launch(name, total, args.operand(src.buffer).operand(out.buffer))
    }

    fn refuse_in_capture(&self, op: &'static str) -> Result<()> {
        if self.dev.capturing.load(Ordering::Acquire) {
            return Err(Error::inside_recording(op));
        }
        Ok(())
    }

    /// Makes `v` a contiguous buffer of `dtype` (the buffer itself when it already is one).
    fn contiguous(&self, v: V<'_>, dtype: DType) -> Result<CudaBuffer> {
        if v.layout.is_contiguous()
            && v.layout.offset == 0
            && v.dtype() == dtype
            && v.buffer.len() == v.layout.numel()
        {
            return Ok(v.buffer.clone());
        }
        let out = self.new_buffer(dtype, v.layout.numel())?;
        let l = Layout::contiguous(&v.layout.shape);
        self.copy_view(v, View::new(&out, &l))?;
        Ok(out)
    }

    fn copy_view(&self, src: V<'_>, out: V<'_>) -> Result<()> {
        let (ol, [sl]) = hal::in_memory_order(out.layout, [src.layout]);
        let w = Walk::of("copy", &ol.shape, &[&ol, &sl])?;
        self.dev.launch(
            "copy_kernel",
            w.n as usize,
            Args::new().arg(w).operand(out.buffer).operand(src.buffer),
        )
    }

    /// Gather and scatter-add, which share one shape: a walk over `walked` (gather's output,
    /// scatter's source) and `index`, into `target` (gather's source, scatter's output) along
    /// `axis` at the position the index gives. The kernel's parameters are
    /// `(walk, walked, dtype, index, dtype, target, dtype, target's axis stride, verdict)`.
    fn indexed(
        &self,
        op: &'static str,
        kernel: &'static str,
        walked: V<'_>,
        index: V<'_>,
        target: V<'_>,
        axis: usize,
    ) -> Result<()> {
        self.dev.bind()?;
        let verdict = self.check_indices(op, index, target.layout.shape[axis])?;
        let mut ts = target.layout.strides.clone();
        ts[axis] = 0;
        let w = Walk::new(
            op,
            &walked.layout.shape,
            &[
                (&walked.layout.strides, walked.layout.offset),
                (&index.layout.strides, index.layout.offset),
                (&ts, target.layout.offset),
            ],
        )?;
        self.dev.launch(
            kernel,
            w.n as usize,
            Args::new()
                .arg(w)
                .operand(walked.buffer)
                .operand(index.buffer)
                .operand(target.buffer)
                .arg(target.layout.strides[axis] as i64)
                .arg(verdict.ptr()),
        )
    }

    /// Runs an index check over `index` against `bound`; the returned verdict word is read by
    /// the guarded kernel.
    fn check_indices(&self, op: &'static str, index: V<'_>, bound: usize) -> Result<CudaBuffer> {
        let verdict = self.scratch(DType::U32, 1)?;
        let w = Walk::of(op, &index.layout.shape, &[index.layout])?;
        self.dev.launch(
            "check_index",
            w.n as usize,
            Args::new()
                .arg(w)
                .operand(index.buffer)
                .arg(bound as i64)
                .arg(fault_code(op, index_fault(index.dtype())))
                .arg(self.dev.fault.ptr)
                .arg(verdict.ptr()),
        )?;
        self.dev.fault_pending.store(true, Ordering::Release);
        Ok(verdict)
    }

    fn reduce_into(&self, op: ReduceOp, x: V<'_>, axes: &[usize], out: V<'_>) -> Result<()> {
        let kept = Walk::of("reduce", &out.layout.shape, &[out.layout, x.layout])?;
        let red_shape: Vec<usize> = (0..x.layout.rank())
            .map(|d| {
                if axes.contains(&d) {
                    x.layout.shape[d]
                } else {
                    1
                }
            })
            .collect();
        let red = Walk::new("reduce", &red_shape, &[(&x.layout.strides, 0)])?;
        let code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Mean => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
        };
        if kept.n == 0 {
            return Ok(());
        }
        // Few outputs with very long reductions (a whole-array sum): one block per output
        // would leave the GPU idle, so the reduction is split into chunks over many blocks
        // (`reduce_partial`), whose partial results are then reduced as below.
        let sms = self.dev.sms as i64;
        if kept.n < sms && red.n >= 1 << 14 {
            // About eight blocks per multiprocessor in all: enough threads to keep the loads
            // in flight.
            let chunks = ((8 * sms + kept.n - 1) / kept.n).min(red.n / 4096).max(2);
            let partial = self.new_buffer(DType::F32, (kept.n * chunks) as usize)?;
            self.dev.launch_raw(
                self.dev.function("reduce_partial")?,
                ((kept.n * chunks).min(sms * 32) as u32, 1, 1),
                device::BLOCK,
                Args::new()
                    .arg(kept)
                    .arg(red)
                    .arg(partial.ptr())
                    .arg(chunks)
                    .operand(x.buffer)
                    .arg(code),
            )?;
            let mut strides = hal::contiguous_strides(&out.layout.shape);
            strides.iter_mut().for_each(|s| *s *= chunks as isize);
            let parts = Layout::strided(&out.layout.shape, &strides, 0)?;
            let kept2 = Walk::of("reduce", &out.layout.shape, &[out.layout, &parts])?;
            let red2 = Walk::new("reduce", &[chunks as usize], &[(&[1], 0)])?;
            let pass2 = if op == ReduceOp::Max || op == ReduceOp::Min {
                code
            } else {
                0
            };
            return self.dev.launch_raw(
                self.dev.function("reduce_warp")?,
                (
                    (kept.n as usize)
                        .div_ceil(8)
                        .min(self.dev.sms as usize * 32)
                        .max(1) as u32,
                    1,
                    1,
                ),
                device::BLOCK,
                Args::new()
                    .arg(kept2)
                    .arg(red2)
                    .operand(out.buffer)
                    .operand(&partial)
                    .arg(pass2),
            );
        }
        // One reduced axis of far-apart elements, with neighbouring outputs next to each other
        // in x and not too many rows: 32 outputs a block (`reduce_columns`), so loads coalesce.
        let columns = red.rank() == 1
            && red.stride(0, 0).abs() > 1
            && kept.rank() >= 1
            && kept.stride(1, kept.rank() - 1) == 1
            && kept.n >= 2
            && red.n <= 1 << 14;
        // Otherwise few outputs with long reductions get a block each, and the rest a warp
        // each.
        const COLUMN_W: usize = 32;
        let per_block = kept.n < 4 * sms && red.n >= 1024;
        let (name, groups, threads) = if columns {
            ("reduce_columns", (kept.n as usize).div_ceil(COLUMN_W), 1024)
        } else if kept.n == 1 && red.n >= 4096 {
            // One output: a block of 1,024 threads has four times the loads in flight (the
            // 10,000 distances of an assignment's energy).
            ("reduce_block_wide", 1, 1024)
        } else if per_block {
            ("reduce_block", kept.n as usize, device::BLOCK)
        } else {
            ("reduce_warp", (kept.n as usize).div_ceil(8), device::BLOCK)
        };
        let blocks = groups.min(self.dev.sms as usize * 32).max(1) as u32;
        self.dev.launch_raw(
            self.dev.function(name)?,
            (blocks, 1, 1),
            threads,
            Args::new()
                .arg(kept)
                .arg(red)
                .operand(out.buffer)
                .operand(x.buffer)
                .arg(code),
        )
    }

    /// cuBLAS's view of a matrix operand: `(transpose, leading dimension)` such that the
    /// column-major matrix it describes is the row-major matrix's transpose, or `None` when the
    /// strides fit neither form (or are negative).
    fn blas_form(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<(bool, i64)> {
        let (rs, cs) = (
            if rows == 1 { cols.max(1) as isize } else { rs },
            if cols == 1 { 1 } else { cs },
        );
        if cs == 1 && rs >= cols.max(1) as isize {
            Some((false, rs as i64))
        } else if rs == 1 && cs >= rows.max(1) as isize {
            Some((true, cs as i64))
        } else {
            None
        }
    }

    fn gemm(&self, a: V<'_>, b: V<'_>, out: V<'_>, alpha: f32, beta: f32) -> Result<()> {
        let [am, bm, om] = validate::matmul(a, b, out)?;
        if om.batch * om.rows * om.cols == 0 {
            return Ok(());
        }
        if am.cols == 0 {
            // No products: out = beta * out (beta == 0 ignores old contents).
            return if beta == 0.0 {
                self.fill(out, 0.0)
            } else {
                self.unary(
                    UnaryOp::Affine {
                        scale: beta,
                        shift: 0.0,
                    },
                    out,
                    out,
                )
            };
        }
        if om.batch * om.rows * om.cols * am.cols <= SMALL_GEMM_WORK && am.cols <= SMALL_GEMM_MAX_K
        {
            let outputs = om.batch * om.rows * om.cols;
            let (name, threads) = if am.cols >= SMALL_GEMM_WARP_FROM_K {
                ("small_gemm_warp", outputs * 32)
            } else {
                ("small_gemm_thread", outputs)
            };
            let args = Args::new()
                .arg(om.batch as i64)
                .arg(om.rows as i64)
                .arg(om.cols as i64)
                .arg(am.cols as i64)
                .operand(a.buffer)
                .arg(SmallMat::of(&am))
                .operand(b.buffer)
                .arg(SmallMat::of(&bm))
                .operand(out.buffer)
                .arg(SmallMat::of(&om))
                .arg(alpha)
                .arg(beta);
            return self.dev.launch(name, threads, args);
        }
        let in_dt = a.dtype();
        let out_ok = match in_dt {
            DType::F32 => out.dtype() == DType::F32,
            _ => out.dtype() == in_dt || out.dtype() == DType::F32,
        };
        let out_form = Self::blas_form(om.rows, om.cols, om.strides[1], om.strides[2])
            .filter(|&(t, _)| !t)
            .filter(|_| om.batch == 1 || om.strides[0] > 0);
        if !out_ok || out_form.is_none() {
            // Into a contiguous f32 (or input-dtype) temporary, then copied into place.
            let tmp_dt = if out_ok { out.dtype() } else { DType::F32 };
            let shape = [om.batch, om.rows, om.cols];
            let tl = Layout::contiguous(&shape);
            let tmp = self.new_buffer(tmp_dt, tl.numel())?;
            let ol = om.layout();
            if beta != 0.0 {
                self.copy_view(View::new(out.buffer, &ol), View::new(&tmp, &tl))?;
            }
            self.gemm(a, b, View::new(&tmp, &tl), alpha, beta)?;
            return self.copy_view(View::new(&tmp, &tl), View::new(out.buffer, &ol));
        }
        let operand = |v: V<'_>, m: MatrixView| -> Result<(CudaBuffer, MatrixView)> {
            let ok = Self::blas_form(m.rows, m.cols, m.strides[1], m.strides[2]).is_some()
                && m.strides[0] >= 0;
            if ok {
                return Ok((v.buffer.clone(), m));
            }
            let l = m.layout();
            let c = self.contiguous(View::new(v.buffer, &l), v.dtype())?;
            Ok((
                c,
                MatrixView::of(&Layout::contiguous(&[m.batch, m.rows, m.cols])),
            ))
        };
        let (abuf, am) = operand(a, am)?;
        let (bbuf, bm) = operand(b, bm)?;
        let (ta, lda) =
            Self::blas_form(am.rows, am.cols, am.strides[1], am.strides[2]).expect("checked");
        let (tb, ldb) =
            Self::blas_form(bm.rows, bm.cols, bm.strides[1], bm.strides[2]).expect("checked");
        let (_, ldc) = out_form.expect("checked");
        // cuBLAS takes sizes and leading dimensions as 32-bit ints: a larger one would be
        // truncated into a product over other memory.
        let dims = [om.rows, om.cols, am.cols, om.batch].map(|v| v as i64);
        let sizes = [dims[0], dims[1], dims[2], dims[3], lda, ldb, ldc];
        if sizes.iter().any(|&v| !(0..=i32::MAX as i64).contains(&v)) {
            return Err(Error::Unsupported {
                op: "matmul",
                detail: format!(
                    "cuBLAS indexes sizes and leading dimensions in 32 bits; got {sizes:?} \
                     (rows, cols, k, batch, lda, ldb, ldc)"
                ),
            });
        }
        let dt = |d: DType| match d {
            DType::F16 => blas_sys::cudaDataType::CUDA_R_16F,
            DType::BF16 => blas_sys::cudaDataType::CUDA_R_16BF,
            _ => blas_sys::cudaDataType::CUDA_R_32F,
        };
        let compute = if in_dt == DType::F32 && self.precision == Precision::Fast {
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let es = in_dt.size_in_bytes() as u64;
        let oes = out.dtype().size_in_bytes() as u64;
        // Row-major out = a @ b is column-major out^T = b^T @ a^T: cuBLAS's "A" is b.
        let handle = self.dev.cublas.lock().unwrap_or_else(|e| e.into_inner());
        // Profiles name each product's shape (the formatting only when profiling).
        let name = match self.dev.profiler {
            Some(_) => format!(
                "cublas gemm {}x{}x{} batch {}",
                om.rows, om.cols, am.cols, om.batch
            ),
            None => String::new(),
        };
        // SAFETY: the pointers are live blocks; validate::matmul proved every operand's extent
        // inside its buffer with checked arithmetic, and the sizes fit cuBLAS's ints (above).
        self.dev.timed(&name, || unsafe {
            blas::gemm_strided_batched_ex(
                *handle,
                op(tb),
                op(ta),
                om.cols as i32,
                om.rows as i32,
                am.cols as i32,
                &alpha as *const f32 as *const c_void,
                (bbuf.ptr() + bm.offset as u64 * es) as *const c_void,
                dt(in_dt),
                ldb as i32,
                bm.batch_stride() as i64,
                (abuf.ptr() + am.offset as u64 * es) as *const c_void,
                dt(in_dt),
                lda as i32,
                am.batch_stride() as i64,
                &beta as *const f32 as *const c_void,
                (out.buffer.ptr() + om.offset as u64 * oes) as *mut c_void,
                dt(out.dtype()),
                ldc as i32,
                om.strides[0] as i64,
                om.batch as i32,
                compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .map_err(|e| device::blas_error("cublasGemmStridedBatchedEx", e))
        })
    }
}

fn unary_code(op: UnaryOp) -> (i32, f32, f32) {
    UnaryOp::all()
        .iter()
        .position(|o| std::mem::discriminant(o) == std::mem::discriminant(&op))
        .map(|i| {
            let (p0, p1) = match op {
                UnaryOp::LeakyRelu { slope } => (slope, 0.0),
                UnaryOp::Affine { scale, shift } => (scale, shift),
                UnaryOp::Clamp { lo, hi } => (lo, hi),
                _ => (0.0, 0.0),
            };
            (i as i32, p0, p1)
        })
        .expect("UnaryOp::all lists every op")
}

/// True when `v` is a contiguous f32 view starting on a 16-byte boundary.
fn vec4_ready(v: V<'_>) -> bool {
    v.dtype() == DType::F32 && v.layout.is_contiguous() && v.layout.offset % 4 == 0
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type Kernel = CudaKernel;
    type Graph = CudaGraph;

    fn info(&self) -> DeviceInfo {
        let available = self
            .device_memory()
            .map(|(free, _)| free as u64)
            .unwrap_or(0);
        DeviceInfo {
            backend: "cuda",
            name: self.dev.name.clone(),
            kind: DeviceKind::DiscreteGpu,
            memory_total: self.dev.memory_total,
            memory_available: available,
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dtypes: vec![DType::F32, DType::F16, DType::BF16, DType::I32, DType::U32],
            max_buffer_bytes: self.dev.memory_total,
            parallelism: self.dev.sms as usize,
            native_float_atomics: true,
            subgroups: true,
            matrix_units: true,
            graph_capture: true,
            fast_precision: true,
            compensated_precision: false,
            fused_gradient_products: false,
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.refuse_in_capture("synchronize")?;
        self.dev.bind()?;
        self.dev.synchronize_stream()?;
        match self.dev.take_fault()?.and_then(|w| fault_error("cuda", w)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        self.scratch(dtype, len)
    }

    fn alloc_for_write(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        let b = self.new_buffer(dtype, len)?;
        if self.dev.poison_for_write.load(Ordering::Relaxed) {
            self.dev.memset(b.ptr(), 0xff, b.bytes())?;
        }
        Ok(b)
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<CudaBuffer> {
        self.refuse_in_capture("upload_bytes")?;
        let len = validate::upload(dtype, bytes)?;
        let b = self.new_buffer(dtype, len)?;
        if !bytes.is_empty() {
            // SAFETY: the block holds at least `bytes.len()` bytes; a copy from pageable memory
            // has read the host data when it returns.
            unsafe { drv::memcpy_htod_async(b.ptr(), bytes, self.dev.stream) }
                .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
        }
        Ok(b)
    }

    fn write_bytes(&self, dst: &CudaBuffer, bytes: &[u8]) -> Result<()> {
        self.refuse_in_capture("write_bytes")?;
        validate::write(dst, bytes)?;
        self.dev.bind()?;
        if !bytes.is_empty() {
            // SAFETY: as in upload_bytes; the size was validated.
            unsafe { drv::memcpy_htod_async(dst.ptr(), bytes, self.dev.stream) }
                .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
        }
        Ok(())
    }

    fn read_bytes(&self, src: &CudaBuffer) -> Result<Vec<u8>> {
        self.refuse_in_capture("read_bytes")?;
        self.synchronize()?;
        let mut out = vec![0u8; src.bytes()];
        if !out.is_empty() {
            // SAFETY: the block holds the buffer's bytes; the stream has drained.
            unsafe { drv::memcpy_dtoh_sync(&mut out, src.ptr()) }
                .map_err(|e| driver_error("cuMemcpyDtoH", e))?;
        }
        Ok(out)
    }

    fn fill(&self, out: V<'_>, value: f64) -> Result<()> {
        validate::fill(out)?;
        self.dev.bind()?;
        let (ol, []) = hal::in_memory_order(out.layout, []);
        let w = Walk::of("fill", &ol.shape, &[&ol])?;
        self.dev.launch(
            "fill_kernel",
            w.n as usize,
            Args::new()
                .arg(w)
                .arg(out.buffer.ptr())
                .arg(out.dtype().size_in_bytes() as i32)
                .arg(out.dtype().fill_bits(value)),
        )
    }

    fn copy(&self, src: V<'_>, out: V<'_>) -> Result<()> {
        validate::copy(src, out)?;
        self.dev.bind()?;
        self.copy_view(src, out)
    }

    fn unary(&self, op: UnaryOp, x: V<'_>, out: V<'_>) -> Result<()> {
        let xl = validate::unary(x, out)?;
        self.dev.bind()?;
        let (code, p0, p1) = unary_code(op);
        let n = out.layout.numel();
        let (ol, [xl]) = hal::in_memory_order(out.layout, [&xl]);
        if vec4_ready(View::new(out.buffer, &ol)) && vec4_ready(View::new(x.buffer, &xl)) {
            return self.dev.launch(
                "unary_f32_vec4",
                n.div_ceil(4),
                Args::new()
                    .arg(n as i64)
                    .arg(out.buffer.ptr() + out.layout.offset as u64 * 4)
                    .arg(x.buffer.ptr() + xl.offset as u64 * 4)
                    .arg(code)
                    .arg(p0)
                    .arg(p1),
            );
        }
        let w = Walk::of("unary", &ol.shape, &[&ol, &xl])?;
        self.dev.launch(
            "unary_kernel",
            n,
            Args::new()
                .arg(w)
                .operand(out.buffer)
                .operand(x.buffer)
                .arg(code)
                .arg(p0)
                .arg(p1),
        )
    }

    fn binary(&self, op: BinaryOp, a: V<'_>, b: V<'_>, out: V<'_>) -> Result<()> {
        let (al, bl) = validate::binary(a, b, out)?;
        self.dev.bind()?;
        let code = BinaryOp::ALL.iter().position(|&o| o == op).expect("listed") as i32;
        let n = out.layout.numel();
        let (ol, [al, bl]) = hal::in_memory_order(out.layout, [&al, &bl]);
        if vec4_ready(View::new(out.buffer, &ol))
            && vec4_ready(View::new(a.buffer, &al))
            && vec4_ready(View::new(b.buffer, &bl))
        {
            return self.dev.launch(
                "binary_f32_vec4",
                n.div_ceil(4),
                Args::new()
                    .arg(n as i64)
                    .arg(out.buffer.ptr() + out.layout.offset as u64 * 4)
                    .arg(a.buffer.ptr() + al.offset as u64 * 4)
                    .arg(b.buffer.ptr() + bl.offset as u64 * 4)
                    .arg(code),
            );
        }
        let w = Walk::of("binary", &ol.shape, &[&ol, &al, &bl])?;
        self.dev.launch(
            "binary_kernel",
            n,
            Args::new()
                .arg(w)
                .operand(out.buffer)
                .operand(a.buffer)
                .operand(b.buffer)
                .arg(code),
        )
    }

    fn ternary(&self, op: TernaryOp, a: V<'_>, b: V<'_>, c: V<'_>, out: V<'_>) -> Result<()> {
        let [al, bl, cl] = validate::ternary(a, b, c, out)?;
        self.dev.bind()?;
        let code = TernaryOp::ALL
            .iter()
            .position(|&o| o == op)
            .expect("listed") as i32;
        let (ol, [al, bl, cl]) = hal::in_memory_order(out.layout, [&al, &bl, &cl]);
        let w = Walk::of("ternary", &ol.shape, &[&ol, &al, &bl, &cl])?;
        self.dev.launch(
            "ternary_kernel",
            w.n as usize,
            Args::new()
                .arg(w)
                .operand(out.buffer)
                .operand(a.buffer)
                .operand(b.buffer)
                .operand(c.buffer)
                .arg(code),
        )
    }

    fn reduce(&self, op: ReduceOp, x: V<'_>, axes: &[usize], out: V<'_>) -> Result<()> {
        validate::reduce(op, x, axes, out)?;
        self.dev.bind()?;
        self.reduce_into(op, x, axes, out)
    }

    fn arg_reduce(&self, op: ArgReduceOp, x: V<'_>, axis: usize, out: V<'_>) -> Result<()> {
        validate::arg_reduce(x, axis, out)?;
        self.dev.bind()?;
        let kept = Walk::of("arg_reduce", &out.layout.shape, &[out.layout, x.layout])?;
        if kept.n == 0 {
            return Ok(());
        }
        let len = x.layout.shape[axis];
        let args = Args::new()
            .arg(kept)
            .arg(len as i64)
            .arg(x.layout.strides[axis] as i64)
            .arg(out.buffer.ptr())
            .operand(x.buffer)
            .arg(matches!(op, ArgReduceOp::ArgMax) as i32);
        // A thread per output along short axes; a warp per output while there are enough
        // outputs to fill the device; a block each for a few long ones; one output along a
        // long axis split over blocks of 256 with 1,024 keys or more each.
        if kept.n == 1 && len >= ARG_SPLIT_FROM_LEN {
            let blocks = (len / 1024).min(self.dev.sms as usize * 2);
            // Each block's best value, and its index (an i64: two words).
            let part_v = self.new_buffer(DType::F32, blocks)?;
            let part_i = self.new_buffer(DType::U32, 2 * blocks)?;
            return self.dev.launch_raw(
                self.dev.function("arg_reduce_split")?,
                (blocks as u32, 1, 1),
                256,
                args.arg(part_v.ptr())
                    .arg(part_i.ptr())
                    .arg(self.dev.ticket.ptr),
            );
        }
        if len >= ARG_BLOCK_FROM_LEN && (kept.n as usize) < self.dev.sms as usize * 8 {
            return self.dev.launch_raw(
                self.dev.function("arg_reduce_block")?,
                (kept.n as u32, 1, 1),
                1024,
                args,
            );
        }
        if (1..=ARG_SHORT_UP_TO_LEN).contains(&len) {
            return self.dev.launch("arg_reduce_short", kept.n as usize, args);
        }
        self.dev
            .launch("arg_reduce_kernel", kept.n as usize * 32, args)
    }

    fn matmul(&self, a: V<'_>, b: V<'_>, out: V<'_>, alpha: f32, beta: f32) -> Result<()> {
        self.dev.bind()?;
        self.gemm(a, b, out, alpha, beta)
    }

    fn spmv_csr(
        &self,
        a: Csr<'_, CudaBuffer>,
        x: &CudaBuffer,
        y: &CudaBuffer,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        validate::spmv_csr(&a, x, y)?;
        self.dev.bind()?;
        let verdict = self.scratch(DType::U32, 1)?;
        let nnz = a.col_indices.len();
        self.dev.launch(
            "check_csr",
            (a.rows + 1).max(nnz),
            Args::new()
                .arg(a.row_offsets.ptr())
                .arg(a.rows as i64)
                .arg(a.col_indices.ptr())
                .arg(nnz as i64)
                .arg(a.cols as i64)
                .arg(fault_code("spmv_csr", FaultKind::CsrOffsets))
                .arg(fault_code("spmv_csr", index_fault(DType::U32)))
                .arg(self.dev.fault.ptr)
                .arg(verdict.ptr()),
        )?;
        self.dev.fault_pending.store(true, Ordering::Release);
        self.dev.launch(
            "spmv_kernel",
            a.rows * 32,
            Args::new()
                .arg(a.rows as i64)
                .arg(a.row_offsets.ptr())
                .arg(a.col_indices.ptr())
                .arg(a.values.ptr())
                .arg(x.ptr())
                .arg(y.ptr())
                .arg(alpha)
                .arg(beta)
                .arg(verdict.ptr()),
        )
    }

    fn gather(&self, x: V<'_>, axis: usize, index: V<'_>, out: V<'_>) -> Result<()> {
        validate::gather(x, axis, index, out)?;
        self.indexed("gather", "gather_kernel", out, index, x, axis)
    }

    fn scatter_add(&self, src: V<'_>, axis: usize, index: V<'_>, out: V<'_>) -> Result<()> {
        validate::scatter_add(src, axis, index, out)?;
        self.indexed("scatter_add", "scatter_add_kernel", src, index, out, axis)
    }

    fn im2col(&self, x: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
        validate::im2col(x, g, out)?;
        self.dev.bind()?;
        let geo = geometry(g, x.layout, out.layout);
        let total = (geo.n * geo.c * geo.kh * geo.kw * geo.oh * geo.ow) as usize;
        let args = Args::new().arg(geo);
        let (name, threads, args) = if fits_fast_division(&geo, total) {
            let d = |v: i64| FastDiv::new(v as u32);
            let divs = Im2colDivs {
                ohw: d(geo.oh * geo.ow),
                c: d(geo.c),
                ow: d(geo.ow),
            };
            // A thread per window position, writing its kh*kw entries.
            let threads = (geo.n * geo.c * geo.oh * geo.ow) as usize;
            ("im2col_kernel32", threads, args.arg(divs))
        } else {
            ("im2col_kernel", total, args)
        };
        self.launch_image_copy(name, threads, args, x, out)
    }

    fn col2im(&self, cols: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
        validate::col2im(cols, g, out)?;
        self.dev.bind()?;
        let geo = geometry(g, out.layout, cols.layout);
        let total = (geo.n * geo.c * geo.h * geo.w) as usize;
        let args = Args::new().arg(geo);
        let (name, args) = if fits_fast_division(&geo, total) {
            let d = |v: i64| FastDiv::new(v as u32);
            let divs = Col2imDivs {
                w: d(geo.w),
                h: d(geo.h),
                c: d(geo.c),
                sh: d(geo.sh),
                sw: d(geo.sw),
            };
            ("col2im_kernel32", args.arg(divs))
        } else {
            ("col2im_kernel", args)
        };
        self.launch_image_copy(name, total, args, cols, out)
    }

    fn nearest_centroid(
        &self,
        x: V<'_>,
        centroids: V<'_>,
        out_index: V<'_>,
        out_distance: V<'_>,
    ) -> Result<()> {
        validate::nearest_centroid(x, centroids, out_index, out_distance)?;
        self.dev.bind()?;
        if x.layout.rank() == 3 {
            return self.nearest_batched([x, centroids, out_index, out_distance]);
        }
        if self.precision == Precision::Reproducible {
            // The reference's order: a batch of one.
            let views = [x, centroids, out_index, out_distance];
            let one: Vec<Layout> = views
                .iter()
                .map(|v| v.layout.unsqueeze(0))
                .collect::<Result<_>>()?;
            return self
                .nearest_batched(std::array::from_fn(|i| View::new(views[i].buffer, &one[i])));
        }
        let (n, d, m) = (
            x.layout.shape[0],
            x.layout.shape[1],
            centroids.layout.shape[0],
        );
        if n == 0 {
            return Ok(());
        }
        // The kernels read f32; other float dtypes are converted once.
        let (xb, xl) = self.as_f32(x)?;
        let (cb, cl) = self.as_f32(centroids)?;
        // A matrix's parameters as the kernels take them: start, rows, d, row and column
        // strides (nearest_* pass the points' and the centroids' in turn, then d once).
        let rows = |a: Args, b: &CudaBuffer, l: &Layout, count: usize| {
            a.arg(b.ptr() + l.offset as u64 * 4)
                .arg(count as i64)
                .arg(l.strides[0] as i64)
                .arg(l.strides[1] as i64)
        };
        let matrix_onto = |a: Args, b: &CudaBuffer, l: &Layout, count: usize| {
            a.arg(b.ptr() + l.offset as u64 * 4)
                .arg(count as i64)
                .arg(d as i64)
                .arg(l.strides[0] as i64)
                .arg(l.strides[1] as i64)
        };
        let matrix =
            |b: &CudaBuffer, l: &Layout, count: usize| matrix_onto(Args::new(), b, l, count);
        let both = || rows(rows(Args::new(), &xb, &xl, n), &cb, &cl, m).arg(d as i64);
        let outputs = |a: Args| {
            a.arg(out_index.buffer.ptr())
                .arg(out_index.layout.offset as i64)
                .arg(out_index.layout.strides[0] as i64)
                .arg(out_distance.buffer.ptr())
                .arg(out_distance.layout.offset as i64)
                .arg(out_distance.layout.strides[0] as i64)
        };
        // A few centroids take one light pass, a warp per point, where the GEMM-style paths
        // would spend their set-up (norms, scaling, packing, a tile of 128 centroids) on a
        // handful.
        if m < FEW_CENTROIDS {
            return self.dev.launch("nearest_few", n * 32, outputs(both()));
        }
        // Tensor cores where the rows are contiguous and 16-byte aligned: f16 under
        // Precision::Fast (operands scaled by powers of two into f16's range, measured first);
        // otherwise three passes over operands split into high and low parts (f16 ones, scaled
        // likewise; TF32 ones on devices with too little shared memory), which rank as
        // accurately as f32. All re-check their two best candidates in f32. Other layouts
        // take the f32 SIMT kernel.
        let rows_ok = |l: &Layout| l.strides[1] == 1 && l.strides[0] % 4 == 0 && l.offset % 4 == 0;
        let tensor_cores = rows_ok(&xl) && rows_ok(&cl) && d % 4 == 0;
        // Where the device lends a block enough shared memory (Hopper 227 KiB, A100 163, other
        // Ampere and Ada parts 99): for d <= 128 the held kernels (points held in shared
        // memory, centroids packed to f16 beforehand and copied a tile ahead; at d = 128,
        // 107 KiB in fast mode, 209 KiB for exact mode's split form), beyond that the streamed
        // ones (points packed too, k-slices copied stages ahead: 84 and 124 KiB). The older
        // register-staged kernels remain for devices with less.
        let (np, mp, dp) = (
            n.next_multiple_of(128),
            m.next_multiple_of(128),
            d.next_multiple_of(32),
        );
        let plan = NearestPlan::choose(tensor_cores, self.precision, d, dp, self.dev.shared_optin);
        // The scales the f16 kernels take (two words, cleared by row_norms).
        let scales = if plan.kernel.starts_with("nearest_f16") {
            Some(self.new_buffer(DType::U32, 2)?)
        } else {
            None
        };
        // The norms padded to whole tiles of 128 with NaN, which the held kernels copy with
        // each tile and which no score can win with.
        let norms = self.new_buffer(DType::F32, mp)?;
        self.dev.launch(
            "row_norms",
            mp * 32,
            matrix(&cb, &cl, m)
                .arg(norms.ptr())
                .arg(mp as i64)
                .arg(scales.as_ref().map_or(0, |s| s.ptr()))
                .arg(if scales.is_some() { 2i32 } else { 0 }),
        )?;
        if let Some(scales) = &scales {
            // Both operands' scales in one launch, each its own share of blocks as
            // `Device::launch` would give it alone.
            let (bx, bc) = (self.dev.blocks_for(n * d), self.dev.blocks_for(m * d));
            let args = matrix(&xb, &xl, n).arg(scales.ptr());
            let args = matrix_onto(args, &cb, &cl, m).arg(scales.ptr() + 4);
            self.dev.launch_raw(
                self.dev.function("absmax_rows_pair")?,
                (bx + bc, 1, 1),
                device::BLOCK,
                args.arg(bx as i64),
            )?;
        }
        // The held and streamed kernels read their operands packed to f16 (rows padded to
        // whole tiles of 128 and to a multiple of 32 halves; the split form's remainders in a
        // second plane): the centroids for both, the points for the streamed ones.
        let pack = |b: &CudaBuffer, l: &Layout, rows: usize, rows_p: usize, scale: u64| {
            let packed = self.new_buffer(DType::U32, plan.planes * rows_p * dp / 2)?;
            let args = matrix(b, l, rows)
                .arg(scale)
                .arg(rows_p as i64)
                .arg(dp as i64)
                .arg(packed.ptr())
                .arg((plan.planes - 1) as i64);
            self.dev.launch("pack_f16_scaled", rows_p * dp / 2, args)?;
            Ok::<_, Error>(packed)
        };
        let (packed_c, packed_x) = match &scales {
            Some(scales) if plan.planes > 0 => (
                Some(pack(&cb, &cl, m, mp, scales.ptr() + 4)?),
                match plan.streamed {
                    true => Some(pack(&xb, &xl, n, np, scales.ptr())?),
                    false => None,
                },
            ),
            _ => (None, None),
        };
        // Every kernel here takes the same leading parameters (the tensor-core ones require
        // unit column strides and ignore them); the f16 ones take the scales, the packed
        // centroids, their row length and the packed points after them, which the others
        // ignore.
        let ptr = |b: &Option<CudaBuffer>| b.as_ref().map_or(0, |b| b.ptr());
        let blocks = n.div_ceil(128) as u32;
        self.dev.launch_shared(
            self.dev.function(plan.kernel)?,
            (blocks, 1, 1),
            256,
            plan.shared,
            outputs(both().arg(norms.ptr()))
                .arg(ptr(&scales))
                .arg(ptr(&packed_c))
                .arg(dp as i64)
                .arg(ptr(&packed_x)),
        )
    }

    fn kmeans_pp(&self, x: V<'_>, anchors: V<'_>, seed: u64) -> Result<()> {
        let [n, d, m] = validate::kmeans_pp(x, anchors)?;
        // The reproducible precision keeps the reference's distance order (hal's steps).
        // (Indices are packed into 32 bits.)
        if self.precision == Precision::Reproducible || m == 0 || n > u32::MAX as usize {
            return hal::seeding::kmeans_pp_steps(self, x, anchors, seed);
        }
        self.dev.bind()?;
        // One cooperative launch (reduce.cu's kmeans_pp_race): a group of lanes per point,
        // about 16 coordinates a lane, and at most a block per multiprocessor, so that every
        // block is resident.
        let lanes = hal::seeding::lanes_per_point(d);
        let blocks = (n * lanes)
            .div_ceil(KPP_BLOCK as usize)
            .clamp(1, self.dev.sms as usize);
        let d2 = self.new_buffer(DType::F32, n)?;
        // Per anchor, the packed winner (u64) and the blocks counted in (u32), all ones.
        let slots = self.new_buffer(DType::U32, 3 * m)?;
        self.dev.memset(slots.ptr(), 0xff, 12 * m)?;
        self.dev.launch_cooperative(
            self.dev.function("kmeans_pp_race")?,
            blocks as u32,
            KPP_BLOCK,
            Args::new()
                .arg(x.buffer.ptr())
                .arg(n as i64)
                .arg(d as i64)
                .arg(m as i64)
                .arg(anchors.buffer.ptr())
                .arg(d2.ptr())
                .arg(slots.ptr())
                .arg(slots.ptr() + 8 * m as u64)
                .arg(seed as u32)
                .arg((seed >> 32) as u32)
                .arg(lanes as i32),
        )
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
        self.dev.bind()?;
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
        if m == 0 {
            return Ok(());
        }
        // Runs of rows folded with Kahan compensation outside Precision::Reproducible
        // (cuda/reduce.cu says why); reproducible sums are one chain.
        let runs = (self.precision != Precision::Reproducible) as i32;
        // Few segments times few rows: each segment's block scans all the ids itself (one
        // launch, under either precision), checking them on the way. With runs its shared
        // memory also holds the compensations, so rows are narrower (static and dynamic
        // within 48 KiB).
        let widest = if runs == 1 { 2048 } else { 4096 };
        let scan = (m as u64) * (n as u64) <= SCAN_SEGMENTS_TIMES_ROWS && d < widest;
        let verdict = match scan {
            true => None,
            false => Some(self.check_indices("segment_sum", segment, m)?),
        };
        let verdict_ptr = verdict.as_ref().map_or(0, |v| v.ptr());
        let seg = self.contiguous(segment, DType::U32)?;
        let (wptr, wdt, woff, ws, has_w) = match weights {
            Some(w) => (
                w.buffer.ptr(),
                dtype_code(w.dtype()),
                w.layout.offset as i64,
                w.layout.strides[0] as i64,
                1i32,
            ),
            None => (x.buffer.ptr(), 0, 0, 0, 0),
        };
        // The rows and their weights lead every segment kernel's parameters; the outputs and
        // the index check's verdict close them.
        let with_rows = |a: Args| {
            a.operand(x.buffer)
                .arg(x.layout.offset as i64)
                .arg(x.layout.strides[0] as i64)
                .arg(x.layout.strides[1] as i64)
                .arg(wptr)
                .arg(wdt)
                .arg(woff)
                .arg(ws)
                .arg(has_w)
        };
        let with_outputs = |a: Args| {
            a.operand(sums.buffer)
                .arg(sums.layout.offset as i64)
                .arg(sums.layout.strides[0] as i64)
                .arg(sums.layout.strides[1] as i64)
                .operand(counts.buffer)
                .arg(counts.layout.offset as i64)
                .arg(counts.layout.strides[0] as i64)
                .arg(verdict_ptr)
        };
        if scan {
            self.dev.fault_pending.store(true, Ordering::Release);
            return self.dev.launch_shared(
                self.dev.function("segment_scan")?,
                (m as u32, 1, 1),
                1024,
                (d + 1) * 4 * (1 + runs as usize),
                with_outputs(
                    with_rows(Args::new())
                        .arg(seg.ptr())
                        .arg(n as i64)
                        .arg(d as i64),
                )
                .arg(runs)
                .arg(self.dev.fault.ptr)
                .arg(fault_code("segment_sum", index_fault(segment.dtype()))),
            );
        }
        let verdict = verdict.expect("checked on every path but the scan");
        // A stable counting sort of the rows by segment (chunks of rows count, then place,
        // in order), then each segment's rows summed in order in `PARTS` sub-ranges, then the
        // sub-ranges summed in order: the same result on every run.
        const PARTS: usize = 16;
        // Chunks of PLACE_CHUNK rows, as many as keep the per-chunk counts (chunks x m words)
        // within 16M words.
        let chunks = n.div_ceil(PLACE_CHUNK).clamp(1, ((1 << 24) / m).max(1));
        let chunk_len = n.div_ceil(chunks).max(1);
        let counts_u = self.scratch(DType::U32, chunks * m)?;
        self.dev.launch(
            "segment_histogram",
            n,
            Args::new()
                .arg(seg.ptr())
                .arg(n as i64)
                .arg(m as i64)
                .arg(chunk_len as i64)
                .arg(counts_u.ptr())
                .arg(verdict_ptr),
        )?;
        let totals = self.new_buffer(DType::U32, m)?;
        // A warp per segment.
        self.dev.launch_raw(
            self.dev.function("segment_chunk_prefix")?,
            (m.div_ceil(8) as u32, 1, 1),
            256,
            Args::new()
                .arg(counts_u.ptr())
                .arg(m as i64)
                .arg(chunks as i64)
                .arg(totals.ptr()),
        )?;
        let starts = self.new_buffer(DType::U32, m + 1)?;
        self.dev.launch_raw(
            self.dev.function("exclusive_scan_one_block")?,
            (1, 1, 1),
            1024,
            Args::new()
                .arg(totals.ptr())
                .arg(m as i64)
                .arg(starts.ptr()),
        )?;
        let order = self.new_buffer(DType::U32, n.max(1))?;
        if n > 0 {
            self.dev.launch_raw(
                self.dev.function("segment_place")?,
                (chunks as u32, 1, 1),
                1024,
                Args::new()
                    .arg(seg.ptr())
                    .arg(n as i64)
                    .arg(m as i64)
                    .arg(chunk_len as i64)
                    .arg(starts.ptr())
                    .arg(counts_u.ptr())
                    .arg(order.ptr())
                    .arg(verdict_ptr),
            )?;
        }
        // The rows, their weights and their order: the leading parameters of both kernels.
        let rows_args = || {
            with_rows(Args::new())
                .arg(starts.ptr())
                .arg(order.ptr())
                .arg(d as i64)
        };
        // Segments of a few rows on average (the residual codes' 4,096 of about 40) are summed
        // whole, in order, by one block each: split into parts, most blocks would sum two or
        // three rows and the parts' two reductions would cost more than the sums.
        if self.precision != Precision::Reproducible && d < 32 && n <= m * WHOLE_SEGMENT_ROWS {
            // Narrow rows: a warp per segment, lanes over its rows.
            return self.dev.launch_raw(
                self.dev.function("segment_warp")?,
                (m.div_ceil(8) as u32, 1, 1),
                256,
                with_outputs(rows_args().arg(m as i64)),
            );
        }
        if self.precision == Precision::Reproducible || n <= m * WHOLE_SEGMENT_ROWS {
            return self.dev.launch_raw(
                self.dev.function("segment_ordered")?,
                (m as u32, 1, 1),
                128,
                with_outputs(rows_args()).arg(runs),
            );
        }
        let partial = self.new_buffer(DType::F32, m * PARTS * (d + 1))?;
        self.dev.launch_raw(
            self.dev.function("segment_partial")?,
            (m as u32, PARTS as u32, 1),
            128,
            rows_args()
                .arg(PARTS as i64)
                .arg(partial.ptr())
                .arg(verdict.ptr()),
        )?;
        // partial is [m, PARTS, d + 1]: sum over the parts into sums and counts.
        let all = Layout::contiguous(&[m, PARTS, d + 1]);
        let sums_src = all.narrow(2, 0, d)?.permute(&[0, 2, 1])?;
        let counts_src = all.narrow(2, d, 1)?.permute(&[0, 2, 1])?;
        let sums_out = sums.layout.unsqueeze(2)?;
        let counts_out = counts.layout.unsqueeze(1)?.unsqueeze(2)?;
        self.reduce_guarded(
            &verdict,
            View::new(&partial, &sums_src),
            View::new(sums.buffer, &sums_out),
        )?;
        self.reduce_guarded(
            &verdict,
            View::new(&partial, &counts_src),
            View::new(counts.buffer, &counts_out),
        )
    }

    fn sgd_step(
        &self,
        param: &CudaBuffer,
        grad: &CudaBuffer,
        momentum_buffer: Option<&CudaBuffer>,
        p: &SgdParams,
    ) -> Result<()> {
        validate::sgd_step(param, grad, momentum_buffer, p)?;
        self.dev.bind()?;
        // Without momentum the buffer is neither read nor written (as on the CPU).
        let momentum_buffer = momentum_buffer.filter(|_| p.momentum != 0.0);
        self.dev.launch(
            "sgd_kernel",
            param.len(),
            Args::new()
                .arg(param.len() as i64)
                .arg(param.ptr())
                .arg(grad.ptr())
                .arg(momentum_buffer.map_or(0, |b| b.ptr()))
                .arg(momentum_buffer.is_some() as i32)
                .arg(p.lr)
                .arg(p.momentum)
                .arg(p.dampening)
                .arg(p.weight_decay)
                .arg(p.nesterov as i32)
                .arg((p.step <= 1) as i32),
        )
    }

    fn adam_step(
        &self,
        param: &CudaBuffer,
        grad: &CudaBuffer,
        m: &CudaBuffer,
        v: &CudaBuffer,
        p: &AdamParams,
    ) -> Result<()> {
        validate::adam_step(param, grad, m, v, p)?;
        self.dev.bind()?;
        let t = p.step.max(1) as i32;
        let (bc1, bc2) = (1.0 - p.beta1.powi(t), 1.0 - p.beta2.powi(t));
        self.dev.launch(
            "adam_kernel",
            param.len(),
            Args::new()
                .arg(param.len() as i64)
                .arg(param.ptr())
                .arg(grad.ptr())
                .arg(m.ptr())
                .arg(v.ptr())
                .arg(p.lr)
                .arg(p.beta1)
                .arg(p.beta2)
                .arg(p.eps)
                .arg(p.weight_decay)
                .arg(p.decoupled_weight_decay as i32)
                .arg(bc1)
                .arg(bc2),
        )
    }

    fn random(&self, out: V<'_>, dist: Distribution, seed: u64, offset: u64) -> Result<()> {
        validate::random(out)?;
        self.dev.bind()?;
        let w = Walk::of("random", &out.layout.shape, &[out.layout])?;
        let (normal, p0, p1) = match dist {
            Distribution::Uniform { low, high } => (0i32, low, high),
            Distribution::Normal { mean, std } => (1, mean, std),
        };
        self.dev.launch(
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

    fn compile(&self, program: &Program) -> Result<CudaKernel> {
        self.kernels.get_or_compile(program, |p| {
            self.dev.bind()?;
            program::compile(&self.dev, p)
        })
    }

    fn launch(&self, kernel: &CudaKernel, args: &[&CudaBuffer], n: usize) -> Result<()> {
        validate::launch(&kernel.program, args, n)?;
        self.dev.bind()?;
        if n == 0 {
            return Ok(());
        }
        let mut a = Args::new().arg(n as i64).arg(self.dev.fault.ptr);
        for b in args {
            a = a.arg(b.ptr()).arg(b.len() as i64);
        }
        self.dev.fault_pending.store(true, Ordering::Release);
        // A thread per element (the kernel's grid-stride loop runs once): for these kernels
        // that measured faster than a capped grid looping (0.60 against 0.71 ms for 30M
        // edge-length residuals on an H200); the loop covers grids beyond the hardware limit.
        self.dev.launch_raw(
            kernel.function,
            (
                n.div_ceil(device::BLOCK as usize).min(i32::MAX as usize) as u32,
                1,
                1,
            ),
            device::BLOCK,
            a,
        )
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
        use cudarc::driver::sys;
        self.refuse_in_capture("record")?;
        self.dev.bind()?;
        if self.dev.profiler.is_some() {
            return Ok(CudaGraph {
                eager: Some(steps),
                exec: std::ptr::null_mut(),
                graph: std::ptr::null_mut(),
                _allocated: Vec::new(),
                freed: Vec::new(),
                dev: self.dev.clone(),
                can_fault: false,
            });
        }
        let pending_before = self.dev.fault_pending.swap(false, Ordering::AcqRel);
        // No implicit device synchronization from another backend while this captures.
        let _gate = alloc::capture_gate();
        self.dev.pool.begin_capture();
        self.dev.capturing.store(true, Ordering::Release);
        // SAFETY: the backend's stream; relaxed mode lets other threads use the driver meanwhile.
        let begun = unsafe {
            drv::stream::begin_capture(
                self.dev.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        };
        let ran = begun
            .map_err(|e| driver_error("cuStreamBeginCapture", e))
            .and_then(|_| steps(self));
        // SAFETY: ends the capture begun above (also after a failed step, to leave the stream usable).
        let ended = unsafe { drv::stream::end_capture(self.dev.stream) };
        self.dev.capturing.store(false, Ordering::Release);
        let hold = self.dev.pool.end_capture();
        let can_fault = self
            .dev
            .fault_pending
            .swap(pending_before, Ordering::AcqRel);
        let graph = match (ran, ended) {
            (Err(e), ended) => {
                if let Ok(g) = ended {
                    // SAFETY: an unused graph from the aborted capture.
                    unsafe {
                        let _ = drv::graph::destroy(g);
                    }
                }
                self.dev.pool.give_back(hold.freed);
                return Err(e);
            }
            (Ok(()), Err(e)) => {
                self.dev.pool.give_back(hold.freed);
                return Err(driver_error("cuStreamEndCapture", e));
            }
            (Ok(()), Ok(g)) => g,
        };
        // SAFETY: a graph captured above.
        let exec = unsafe { drv::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
            .map_err(|e| driver_error("cuGraphInstantiate", e));
        let exec = match exec {
            Ok(x) => x,
            Err(e) => {
                // SAFETY: the graph captured above, not instantiated, destroyed once.
                unsafe {
                    let _ = drv::graph::destroy(graph);
                }
                self.dev.pool.give_back(hold.freed);
                return Err(e);
            }
        };
        // Upload now so the first replay pays no setup.
        // SAFETY: a live executable graph on the backend's stream.
        unsafe { drv::graph::upload(exec, self.dev.stream) }
            .map_err(|e| driver_error("cuGraphUpload", e))?;
        Ok(CudaGraph {
            eager: None,
            exec,
            graph,
            _allocated: hold.allocated,
            freed: hold.freed,
            dev: self.dev.clone(),
            can_fault,
        })
    }

    fn replay(&self, graph: &CudaGraph) -> Result<()> {
        if !Arc::ptr_eq(&graph.dev, &self.dev) {
            return Err(Error::InvalidArgument {
                op: "replay",
                detail: "the graph was recorded on another device".into(),
            });
        }
        self.dev.bind()?;
        if let Some(steps) = &graph.eager {
            return steps(self);
        }
        if graph.can_fault {
            self.dev.fault_pending.store(true, Ordering::Release);
        }
        // SAFETY: a live executable graph on the backend's stream.
        unsafe { drv::graph::launch(graph.exec, self.dev.stream) }
            .map_err(|e| driver_error("cuGraphLaunch", e))
    }
}

/// The expanded-distance twin of a reference-order short-row kernel (`nearest_short_*`), for
/// batched searches outside `Precision::Reproducible`; `None` for the other kernels.
fn expanded_short(kernel: &str) -> Option<&'static str> {
    match kernel {
        "nearest_short_4" => Some("nearest_short_expanded_4"),
        "nearest_short_8" => Some("nearest_short_expanded_8"),
        "nearest_short_16" => Some("nearest_short_expanded_16"),
        _ => None,
    }
}

/// The reference-order nearest-centroid kernel for `m` centroids of dimension `d`, and the
/// points each block of 256 threads takes: rows of at most 4, 8 or 16 held in registers
/// (`nearest_short_*`), otherwise tiles of 32, 8 or 1 centroids (each computing thread keeps
/// that many sums).
fn ordered_kernel(m: usize, d: usize) -> (&'static str, usize) {
    match (m, d) {
        (_, 0..=4) => ("nearest_short_4", 256),
        (_, 5..=8) => ("nearest_short_8", 256),
        (9.., 9..=16) => ("nearest_short_16", 256),
        (1, _) => ("nearest_ordered_1", 64),
        (2..=8, _) => ("nearest_ordered_8", 64),
        _ => ("nearest_ordered", 128),
    }
}

impl CudaBackend {
    /// `v` as f32: itself, or a contiguous f32 copy of another float dtype.
    fn as_f32(&self, v: V<'_>) -> Result<(CudaBuffer, Layout)> {
        if v.dtype() == DType::F32 {
            Ok((v.buffer.clone(), v.layout.clone()))
        } else {
            let c = self.contiguous(v, DType::F32)?;
            Ok((c, Layout::contiguous(&v.layout.shape)))
        }
    }

    /// A batch of nearest-centroid searches (rank-3 views, validated), and every search under
    /// `Precision::Reproducible` (as a batch of one): the reference-order kernels, a grid row
    /// per group (batches search small codebooks, where the tensor-core paths' set-up would
    /// dominate).
    fn nearest_batched(&self, [x, c, out_index, out_distance]: [V<'_>; 4]) -> Result<()> {
        let (g, n, d, m) = (
            x.layout.shape[0],
            x.layout.shape[1],
            x.layout.shape[2],
            c.layout.shape[1],
        );
        if g == 0 || n == 0 {
            return Ok(());
        }
        if g > u16::MAX as usize {
            // More groups than a grid has rows.
            return hal::nearest_per_group([x, c, out_index, out_distance], |[x, c, i, o]| {
                self.nearest_centroid(x, c, i, o)
            });
        }
        let (xb, xl) = self.as_f32(x)?;
        let (cb, cl) = self.as_f32(c)?;
        let (mut kernel, points) = ordered_kernel(m, d);
        if self.precision != Precision::Reproducible {
            // Short rows take the expanded distance (same launch shape).
            kernel = expanded_short(kernel).unwrap_or(kernel);
        }
        let s = |l: &Layout, i: usize| l.strides[i] as i64;
        let args = Args::new()
            .arg(xb.ptr() + xl.offset as u64 * 4)
            .arg(n as i64)
            .arg(s(&xl, 1))
            .arg(s(&xl, 2))
            .arg(cb.ptr() + cl.offset as u64 * 4)
            .arg(m as i64)
            .arg(s(&cl, 1))
            .arg(s(&cl, 2))
            .arg(d as i64)
            .arg(out_index.buffer.ptr())
            .arg(out_index.layout.offset as i64)
            .arg(s(out_index.layout, 1))
            .arg(out_distance.buffer.ptr())
            .arg(out_distance.layout.offset as i64)
            .arg(s(out_distance.layout, 1))
            .arg(s(&xl, 0))
            .arg(s(&cl, 0))
            .arg(s(out_index.layout, 0))
            .arg(s(out_distance.layout, 0));
        self.dev.launch_raw(
            self.dev.function(kernel)?,
            (n.div_ceil(points) as u32, g as u32, 1),
            256,
            args,
        )
    }

    /// A sum over the last axis of `src` into `out`, skipped when `verdict` is set (the segment
    /// sums' final step: a failed check writes nothing).
    fn reduce_guarded(&self, verdict: &CudaBuffer, src: V<'_>, out: V<'_>) -> Result<()> {
        // The sums land in a scratch buffer; `out = verdict ? out : sums` then copies them out
        // only when the check passed (the verdict word broadcast over the output).
        let tmp_l = Layout::contiguous(&out.layout.shape);
        let tmp = self.new_buffer(DType::F32, tmp_l.numel())?;
        let axes = [src.layout.rank() - 1];
        self.reduce_into(ReduceOp::Sum, src, &axes, View::new(&tmp, &tmp_l))?;
        // The verdict word (a u32, nonzero after a failed check) broadcast over the output.
        let verdict_view = Layout::contiguous(&[1]);
        self.ternary(
            TernaryOp::Where,
            View::new(verdict, &verdict_view),
            out,
            View::new(&tmp, &tmp_l),
            out,
        )
    }
}

/// Whether the u32 im2col/col2im kernels serve geometry `g` with `total` threads' worth of
/// positions: every position, window coordinate (`y + pad`, `k * dilation`) and divisor
/// below 2^31, where their multiply-high division is exact.
fn fits_fast_division(g: &Geo, total: usize) -> bool {
    let limit = i32::MAX as i64;
    let spans = [
        total as i64,
        g.h + 2 * g.ph,
        g.w + 2 * g.pw,
        g.kh * g.dh,
        g.kw * g.dw,
        g.c * g.kh * g.kw,
        g.oh * g.ow,
        g.sh,
        g.sw,
    ];
    total as u64 <= limit as u64 && spans.iter().all(|&v| (0..limit).contains(&v))
}

fn geometry(g: &Conv2dGeometry, image: &Layout, cols: &Layout) -> Geo {
    let (oh, ow) = g.output_size().unwrap_or((0, 0));
    let s = |l: &Layout, i: usize| l.strides[i] as i64;
    Geo {
        n: g.batch as i64,
        c: g.channels as i64,
        h: g.height as i64,
        w: g.width as i64,
        kh: g.kernel.0 as i64,
        kw: g.kernel.1 as i64,
        sh: g.stride.0 as i64,
        sw: g.stride.1 as i64,
        ph: g.padding.0 as i64,
        pw: g.padding.1 as i64,
        dh: g.dilation.0 as i64,
        dw: g.dilation.1 as i64,
        oh: oh as i64,
        ow: ow as i64,
        xs: [s(image, 0), s(image, 1), s(image, 2), s(image, 3)],
        xoff: image.offset as i64,
        cs: [s(cols, 0), s(cols, 1), s(cols, 2)],
        coff: cols.offset as i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
