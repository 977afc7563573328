//! The [`Backend`] trait: every primitive, specified once.
//!
//! Conventions shared by all primitives:
//! - Operands are [`View`]s: a buffer and a [`Layout`]. A view must lie inside its buffer
//!   ([`Error::OutOfBounds`] otherwise), with every size, offset and address computed in
//!   checked arithmetic ([`Error::Overflow`] where one does not fit `isize`; a backend whose
//!   kernels index in 32 bits refuses larger views with [`Error::Unsupported`]). So no safe
//!   call reads or writes outside the views it is given. Views of zero elements are valid and
//!   do nothing, except where a primitive says an empty input is an error.
//! - Float storage (`f32`, `f16`, `bf16`) is loaded as `f32`, computed in `f32` (reductions
//!   may accumulate wider), and rounded to the output dtype once, on store. Where an operand is
//!   `f64` the primitive computes in `f64` (tolerances in f64's `u`), or, on a backend that
//!   does not run it in `f64` ([`Capabilities::f64`]), is refused with
//!   [`Error::UnsupportedDType`]: never narrowed.
//! - An output view reaches each of its elements once (no broadcast or overlapping output),
//!   and must not overlap an input, except that an elementwise primitive (and `copy`) may
//!   write to an input whose view is identical to the output's (in-place update). Both are
//!   checked: [`Error::InvalidArgument`] otherwise.
//! - Work is enqueued, not waited on: a primitive may return before the device finished.
//!   [`Backend::read`] and [`Backend::synchronize`] wait.
//! - Errors that depend on data already on a device (an index out of range in a gather,
//!   scatter, segment id or CSR column, broken CSR row offsets) are returned by the call on the
//!   CPU, and by the next `synchronize` or read on a GPU backend, which checks on the device
//!   rather than reading the indices back. Either way the failed operation writes nothing.
//! - Tolerances ("may differ from the CPU reference by") are stated per primitive. `u` is the
//!   unit roundoff of the output dtype ([`DType::unit_roundoff`]).

use crate::ir::Program;
use crate::{
    AdamParams, ArgReduceOp, AttentionGrads, AttentionInputs, AttentionParams, BinaryOp,
    CandidateInputs, Capabilities, Conv2dGeometry, DType, DeviceInfo, Distribution, Element,
    Epilogue, Error, IvfScanInputs, Layout, NormGrads, NormInputs, Precision, ReduceOp, Result,
    SgdParams, TernaryOp, UnaryOp,
};
use std::sync::Arc;

/// A backend-owned buffer handle: cheap to clone (clones share the memory), freed (or returned
/// to the backend's pool) when the last clone is dropped.
pub trait DeviceBuffer: Clone + Send + Sync + std::fmt::Debug + 'static {
    fn dtype(&self) -> DType;
    /// Length in elements.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// True when both handles refer to the same memory.
    fn same_memory(&self, other: &Self) -> bool;
    /// The largest element count, dimension, offset and stride magnitude a view of this
    /// buffer may have: what its backend's kernels can index (`isize::MAX`, the default, for
    /// 64-bit indexing; `i32::MAX` for kernels that index in 32 bits). [`crate::validate`]
    /// refuses a larger view with [`crate::Error::Unsupported`] before anything runs.
    fn index_limit(&self) -> usize {
        isize::MAX as usize
    }
}

/// An operand: a buffer seen through a layout.
#[derive(Debug)]
pub struct View<'a, Buf> {
    pub buffer: &'a Buf,
    pub layout: &'a Layout,
}

impl<Buf> Clone for View<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for View<'_, Buf> {}

impl<'a, Buf: DeviceBuffer> View<'a, Buf> {
    pub fn new(buffer: &'a Buf, layout: &'a Layout) -> Self {
        Self { buffer, layout }
    }
    pub fn dtype(&self) -> DType {
        self.buffer.dtype()
    }
    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }
}

/// Runs `search` on each group of a batched [`Backend::nearest_centroid`] call (rank-3 views,
/// validated), as rank-2 views: the plain way to serve a batch.
pub fn nearest_per_group<Buf: DeviceBuffer>(
    views: [View<'_, Buf>; 4],
    mut search: impl FnMut([View<'_, Buf>; 4]) -> Result<()>,
) -> Result<()> {
    for g in 0..views[0].layout.shape[0] {
        let [a, b, c, d] = views.map(|v| v.layout.select(0, g));
        let layouts = [a?, b?, c?, d?];
        search(std::array::from_fn(|i| {
            View::new(views[i].buffer, &layouts[i])
        }))?;
    }
    Ok(())
}

/// A sparse matrix in compressed sparse row form: row `r` holds `values[k]` at column
/// `col_indices[k]` for `k` in `row_offsets[r]..row_offsets[r + 1]`. `row_offsets` (`u32`,
/// `rows + 1` entries, non-decreasing, starting at 0) and `col_indices` (`u32`) and `values`
/// (`f32`) are contiguous buffers.
#[derive(Debug)]
pub struct Csr<'a, Buf> {
    pub rows: usize,
    pub cols: usize,
    pub row_offsets: &'a Buf,
    pub col_indices: &'a Buf,
    pub values: &'a Buf,
}

/// A compute device and everything it can run.
///
/// Implemented by a cheap-to-clone handle. Workloads are generic over `B: Backend`; binaries
/// pick the implementation at run time.
pub trait Backend: Clone + Send + Sync + 'static {
    type Buffer: DeviceBuffer;
    /// A compiled scalar program.
    type Kernel: Clone + Send + Sync + std::fmt::Debug;
    /// A recorded sequence of calls ([`Backend::record`]): a device graph where the backend can
    /// capture one, otherwise the steps themselves ([`Replay`]).
    type Graph: Send + Sync + std::fmt::Debug;

    // ----- device -----

    fn info(&self) -> DeviceInfo;
    fn capabilities(&self) -> Capabilities;
    /// Waits until all enqueued work has finished; reports a deferred error if one occurred.
    fn synchronize(&self) -> Result<()>;

    // ----- memory -----

    /// A zero-filled buffer of `len` elements. Fails with [`Error::AllocationTooLarge`] when
    /// the size exceeds the device's largest buffer, [`Error::OutOfMemory`] when the device
    /// cannot supply it now.
    fn alloc(&self, dtype: DType, len: usize) -> Result<Self::Buffer>;
    /// A buffer of `len` elements whose contents are unspecified (a pooled buffer may still
    /// hold its last owner's data), for the output of a call that overwrites it whole: it
    /// saves [`Backend::alloc`]'s zero fill, a launch on a GPU. Errors as `alloc`. The default
    /// is `alloc`.
    fn alloc_for_write(&self, dtype: DType, len: usize) -> Result<Self::Buffer> {
        self.alloc(dtype, len)
    }
    /// A new buffer holding `bytes` (little-endian elements of `dtype`).
    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<Self::Buffer>;
    /// Overwrites the whole buffer with `bytes`, which must be exactly its size.
    fn write_bytes(&self, dst: &Self::Buffer, bytes: &[u8]) -> Result<()>;
    /// Waits for pending work and returns the buffer's contents.
    fn read_bytes(&self, src: &Self::Buffer) -> Result<Vec<u8>>;
    /// [`Backend::read_bytes`] as a future, for a caller that must not block: a browser's
    /// main thread cannot wait for a GPU read-back, and WebGPU maps a buffer only once the
    /// page's event loop runs. Same result and errors as `read_bytes`.
    ///
    /// A backend whose reads complete at once (every native one) reads when this is called
    /// and returns a ready future: the default. `backend-wgpu` on WebGPU (wasm32) returns a
    /// future that resolves when the browser has mapped the copy; there `read_bytes`
    /// itself cannot work. A workload written against this method runs unchanged in both
    /// places: natively any executor (`pollster::block_on`) completes it in one poll.
    fn read_bytes_async<'a>(
        &'a self,
        src: &'a Self::Buffer,
    ) -> impl std::future::Future<Output = Result<Vec<u8>>> + 'a {
        std::future::ready(self.read_bytes(src))
    }

    /// [`Backend::read_bytes`] into `dst`, which must be exactly the buffer's size: a caller
    /// that reads results round after round keeps one host buffer (a backend whose memory is
    /// the host's copies once, into pages already touched).
    fn read_bytes_into(&self, src: &Self::Buffer, dst: &mut [u8]) -> Result<()> {
        let bytes = self.read_bytes(src)?;
        crate::validate::read_into(bytes.len(), dst.len())?;
        dst.copy_from_slice(&bytes);
        Ok(())
    }

    /// [`Backend::read_bytes_into`] as a future, as [`Backend::read_bytes_async`] is of
    /// `read_bytes`: ready at once natively (the default), resolved once the browser has
    /// mapped the copy on WebGPU (`backend-wgpu` on wasm32). Same result and errors.
    fn read_bytes_into_async<'a>(
        &'a self,
        src: &'a Self::Buffer,
        dst: &'a mut [u8],
    ) -> impl std::future::Future<Output = Result<()>> + 'a {
        std::future::ready(self.read_bytes_into(src, dst))
    }

    // ----- elementwise -----

    /// Writes `value` (rounded to the dtype; integers truncate) to every element of `out`.
    fn fill(&self, out: View<'_, Self::Buffer>, value: f64) -> Result<()>;

    /// `out = src`, element by element, converting dtype (float to int truncates toward zero
    /// and saturates, NaN gives 0). Shapes must be equal. This is both strided copy ("make
    /// contiguous") and cast. Exact: backends agree bit for bit.
    fn copy(&self, src: View<'_, Self::Buffer>, out: View<'_, Self::Buffer>) -> Result<()>;

    /// `out = op(x)`; `x` broadcasts to `out`'s shape. Float dtypes only. Tolerance: exact for
    /// Neg, Abs, Relu, LeakyRelu, Floor, Ceil, Round, Sign, Square, Affine, Clamp (up to the
    /// fused or unfused multiply-add of Affine: `2u` relative); otherwise
    /// `|got - ref| <= (4u + 2^-18)|ref| + 2^-19` (GPU math libraries are a few ulps off;
    /// NVIDIA's `sin` was seen 5.6e-7 off near 0.02).
    fn unary(
        &self,
        op: UnaryOp,
        x: View<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
    ) -> Result<()>;

    /// `out = op(a, b)`; `a` and `b` broadcast to `out`'s shape. `a` and `b` may have any
    /// dtype (loaded as `f32`); `out` any dtype. Tolerance: exact for Add, Sub, Mul, Div, Max,
    /// Min and comparisons (a device's division may be 2 ulps off: `2u` relative); Pow and
    /// Atan2 `(4u + 2^-16)|ref| + 2^-20`; Rem `2^-20 (|a| + |b|)`.
    fn binary(
        &self,
        op: BinaryOp,
        a: View<'_, Self::Buffer>,
        b: View<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
    ) -> Result<()>;

    /// `out = op(a, b, c)`, all broadcasting to `out`'s shape. Exact.
    fn ternary(
        &self,
        op: TernaryOp,
        a: View<'_, Self::Buffer>,
        b: View<'_, Self::Buffer>,
        c: View<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
    ) -> Result<()>;

    // ----- reductions -----

    /// Reduces `x` over `axes` (distinct, each `< rank`). `out` has `x`'s shape with those axes
    /// set to 1 (keep-dims). NaN propagates. Max and Min over an empty axis are an
    /// [`Error::Empty`]. Tolerance for Sum and Mean: `|got - ref| <= 2^-17 * sum|x| + u|ref|`
    /// (any summation order, f32 partial sums); for LogSumExp `2^-16 + u|ref|`; Max and Min
    /// exact.
    fn reduce(
        &self,
        op: ReduceOp,
        x: View<'_, Self::Buffer>,
        axes: &[usize],
        out: View<'_, Self::Buffer>,
    ) -> Result<()>;

    /// The index (`u32`) of the largest / smallest element along `axis`; `out` has `x`'s shape
    /// with `axis` set to 1. Ties give the lowest index; a NaN counts as the extreme (the first
    /// NaN's index). An empty axis is an [`Error::Empty`]. Exact.
    fn arg_reduce(
        &self,
        op: ArgReduceOp,
        x: View<'_, Self::Buffer>,
        axis: usize,
        out: View<'_, Self::Buffer>,
    ) -> Result<()>;

    // ----- linear algebra -----

    /// Batched matrix product `out = alpha * a @ b + beta * out` over rank-3 views
    /// `a: [batch, m, k]`, `b: [batch, k, n]`, `out: [batch, m, n]` (rank-2 views are one
    /// batch). Any strides, so transposed and broadcast (stride-0 batch) operands need no
    /// copy. `a` and `b` share a float dtype; `beta == 0` ignores `out`'s old contents (even
    /// NaN). Tolerance: `|got - ref| <= 2^-18 * k * (|a| @ |b|)` elementwise, plus `u|ref|`.
    fn matmul(
        &self,
        a: View<'_, Self::Buffer>,
        b: View<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
        alpha: f32,
        beta: f32,
    ) -> Result<()>;

    /// [`Backend::matmul`] with an [`Epilogue`]:
    /// `out = activation(alpha * gated_a @ b + beta * out + bias)`, `bias` (any float dtype)
    /// broadcasting to `out`'s shape and not overlapping it, `gated_a` = `a` through the
    /// [`Gate`](crate::Gate) if there is one, and the rows of `gated_a` summed (times alpha) into
    /// `a_row_sums` if asked.
    /// A backend may fuse the epilogue into the product's kernel (saving a pass over `out` and
    /// a launch or two; see [`Capabilities::fused_gradient_products`]); the default runs
    /// separate calls ([`matmul_epilogue_steps`](crate::matmul_epilogue_steps)).
    /// Tolerance: matmul's on the product (its scale `k * (|gated_a| @ |b|)`, the gate
    /// applied in f32 and rounded to f32 once: `2u_f32` relative per element of `gated_a`);
    /// the activation's own (as [`Backend::unary`]) on the sum; for a 16-bit `out`, `2u|ref|`
    /// more (a fused kernel rounds once, the steps after each call). The row sums: as a
    /// [`ReduceOp::Sum`] of `gated_a`, plus `u|ref|` for the scaling by alpha.
    fn matmul_epilogue(
        &self,
        a: View<'_, Self::Buffer>,
        b: View<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
        alpha: f32,
        beta: f32,
        epilogue: Epilogue<'_, Self::Buffer>,
    ) -> Result<()> {
        crate::matmul_epilogue_steps(self, [a, b, out], alpha, beta, epilogue)
    }

    /// Sparse matrix times dense vector: `y = alpha * A x + beta * y` (`f32`, contiguous `x` of
    /// `cols` and `y` of `rows`). Column indices `>= cols` are an
    /// [`Error::IndexOutOfRange`]. Tolerance as matmul with `k` the row's length.
    fn spmv_csr(
        &self,
        a: Csr<'_, Self::Buffer>,
        x: &Self::Buffer,
        y: &Self::Buffer,
        alpha: f32,
        beta: f32,
    ) -> Result<()>;

    // ----- indexing -----

    /// `out[p] = x[p with p[axis] replaced by index[p]]` (PyTorch's `gather`). `index`
    /// (`u32` or `i32`) and `out` have the same shape; `x` has the same rank, and for every
    /// other dimension `index.shape[d] <= x.shape[d]`. `index_select` is a gather with an
    /// index broadcast along the other dimensions. An index outside `0..x.shape[axis]` is an
    /// [`Error::IndexOutOfRange`]. Exact.
    fn gather(
        &self,
        x: View<'_, Self::Buffer>,
        axis: usize,
        index: View<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
    ) -> Result<()>;

    /// `out[p with p[axis] replaced by index[p]] += src[p]` for every `p` in `src`'s shape
    /// (PyTorch's `scatter_add_`; `index_add` is the broadcast-index case). `index` and `src`
    /// share a shape; `out` has the same rank, with `index.shape[d] <= out.shape[d]` off
    /// `axis`. Float `out` only. The terms landing on one element may be added in any order,
    /// each add rounding to `out`'s dtype: with `k` terms, `|got - ref| <= 2k(2^-24 + u) sum|terms|`.
    fn scatter_add(
        &self,
        src: View<'_, Self::Buffer>,
        axis: usize,
        index: View<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
    ) -> Result<()>;

    /// Unfolds NCHW patches into columns: `out[n, (c*kh + i)*kw + j, oy*ow + ox] =
    /// x[n, c, oy*sh - ph + i*dh, ox*sw - pw + j*dw]` (0 where that falls in the padding).
    /// `x` has the geometry's image shape, `out` its columns shape. Exact.
    fn im2col(
        &self,
        x: View<'_, Self::Buffer>,
        geometry: &Conv2dGeometry,
        out: View<'_, Self::Buffer>,
    ) -> Result<()>;

    /// The adjoint of [`Backend::im2col`]: `out` (image shape) is overwritten with the sum of
    /// every column entry that reads each pixel. Tolerance as Sum.
    fn col2im(
        &self,
        cols: View<'_, Self::Buffer>,
        geometry: &Conv2dGeometry,
        out: View<'_, Self::Buffer>,
    ) -> Result<()>;

    // ----- clustering -----

    /// For each row of `x: [n, d]`, the index (`u32`, into `out_index: [n]`) and squared
    /// Euclidean distance (`f32`, into `out_distance: [n]`) of its nearest row of
    /// `centroids: [m, d]`; ties give the lowest index. The reference computes
    /// `sum_k (x_k - c_k)^2` in order of `k` with fused multiply-adds; backends may use the
    /// expansion `|x|^2 - 2 x.c + |c|^2`. Tolerance: the distance within `2^-16 (|x|^2 + |c|^2)`
    /// and, if the index differs, the reference's distance to the backend's centroid within the
    /// same bound. `m == 0` with `n > 0` is an [`Error::Empty`].
    ///
    /// Batched: with `x: [g, n, d]`, `centroids: [g, m, d]` and outputs `[g, n]`, group `i`'s
    /// points are searched among group `i`'s centroids only (the codebooks of a product
    /// quantiser, say), in one call.
    fn nearest_centroid(
        &self,
        x: View<'_, Self::Buffer>,
        centroids: View<'_, Self::Buffer>,
        out_index: View<'_, Self::Buffer>,
        out_distance: View<'_, Self::Buffer>,
    ) -> Result<()>;

    /// Per-segment sums of rows: `sums[s] = sum of w_i * x[i]` and `counts[s] = sum of w_i`
    /// over rows `i` with `segment[i] == s` (`w_i = 1` without weights). `x: [n, d]`,
    /// `segment: [n]` (`u32`), `weights: [n]`, `sums: [m, d]`, `counts: [m]` (both
    /// overwritten). A segment id `>= m` is an [`Error::IndexOutOfRange`]. Deterministic on a
    /// given backend. Tolerance as Sum.
    fn segment_sum(
        &self,
        x: View<'_, Self::Buffer>,
        segment: View<'_, Self::Buffer>,
        weights: Option<View<'_, Self::Buffer>>,
        sums: View<'_, Self::Buffer>,
        counts: View<'_, Self::Buffer>,
    ) -> Result<()>;

    // ----- selection -----

    /// The `k` smallest values of each row of `x: [rows, n]` (f32, any strides), or the `k`
    /// largest with `largest`, in order (smallest first, or largest first), into `values:
    /// [rows, k]` (f32) and their column indices into `indices: [rows, k]` (u32). Values
    /// compare by IEEE totalOrder, ties to the lower index ([`crate::topk`]): the result is
    /// exact and the same on every backend. `k <= n`; `n < 2^32`. A GPU backend may refuse
    /// `k` above [`crate::topk::GPU_MAX_K`] ([`Error::Unsupported`]).
    fn top_k(
        &self,
        x: View<'_, Self::Buffer>,
        values: View<'_, Self::Buffer>,
        indices: View<'_, Self::Buffer>,
        largest: bool,
    ) -> Result<()>;

    /// The inverted-list scan of product-quantised vectors ([`crate::topk`] gives the
    /// distances and their order): each query's `k` nearest members of the lists it probes,
    /// nearest first, into `distances: [q, k]` (f32) and `labels: [q, k]` (u32, the members'
    /// ids), padded with `+inf` and `u32::MAX`. A probe naming no list, a code byte at or
    /// above `codewords` ([`Error::IndexOutOfRange`]) or broken offsets
    /// ([`Error::InvalidArgument`]) are errors: the CPU returns them and writes nothing; GPU
    /// backends find them while scanning, skip what they name, and report them at the next
    /// synchronisation or read (the outputs then hold what the scan of the rest found, and are
    /// not to be used). Tolerance: none (the same
    /// additions in the same order everywhere). A GPU backend may refuse `k` above
    /// [`crate::topk::GPU_MAX_K`] or tables beyond its on-chip memory
    /// ([`Error::Unsupported`]).
    fn ivf_scan(
        &self,
        x: IvfScanInputs<'_, Self::Buffer>,
        distances: View<'_, Self::Buffer>,
        labels: View<'_, Self::Buffer>,
    ) -> Result<()>;

    /// The scores of each query's candidates ([`crate::topk`] defines them): `scores: [q, c]`
    /// (f32) of `(query_bias[r] + vector_bias[l]) + alpha * (queries[r] . vectors[l])` for
    /// `l = labels[r, c]`, `+inf` where `l` is [`crate::topk::NO_CANDIDATE`]. Any other label
    /// at or above `n` is an [`Error::IndexOutOfRange`] (the CPU returns it and writes
    /// nothing; GPU backends score it `+inf` and report it at the next synchronisation or
    /// read). Tolerance: `|got - ref| <= |alpha| ((2^-18 d + u) sum_j |q_j v_j| + d 2^-126) +
    /// u (|ref| + |query_bias[r]| + |vector_bias[l]|)` (the dot product in any order; a
    /// device may flush subnormal operands to zero, so an infinity times a subnormal may give
    /// NaN there).
    fn candidate_scores(
        &self,
        x: CandidateInputs<'_, Self::Buffer>,
        alpha: f32,
        scores: View<'_, Self::Buffer>,
    ) -> Result<()>;

    // ----- attention -----

    /// Scaled dot-product attention, fused: `out = softmax(scale q k^T + mask) v` per batch
    /// and head, with optional causal masking and dropout, as [`crate::attention`] specifies;
    /// also writes each row's log-sum-exp `lse: [b, h, tq]` for the backward pass. No
    /// `tq x tk` matrix is stored on the GPU backends. `q`, `k`, `v` and `out` share one
    /// dtype: `f32`, `f64`, or a 16-bit float (computed in f32 from its exact values, the
    /// output rounded once; a backend without 16-bit kernels runs
    /// [`attention_widened`](crate::attention::attention_widened)); `lse` is f32 for 16-bit
    /// operands ([`validate::lse_dtype`](crate::validate::lse_dtype)), else their dtype; the
    /// mask has the operands' dtype, or f32 with 16-bit operands. A GPU backend may refuse
    /// widths `d`, `dv` above what its kernels hold ([`Error::Unsupported`] naming the limit).
    ///
    /// Tolerance: with `sigma_ij = scale sum_c |q_ic k_jc| + |mask_ij|` (a score's own
    /// rounding moves its weight by about `d u sigma_ij`) and `sigma_i = max_j sigma_ij`, each
    /// output within `(8 + log2 tk + d) u sum_j |p~_ij v_j| (1 + sigma_ij + sigma_i)`, and
    /// `lse` within `(8 + log2 tk + d) u (1 + |lse_i| + sigma_i)`. Under [`Precision::Fast`]
    /// the products may round their operands to TF32, as `matmul`'s do: `u` is then `2^-11`
    /// (both passes). 16-bit operands are exact in f32 and TF32: `u` stays the policy's, and
    /// each result (and the output the backward pass reads) adds one rounding to the dtype,
    /// its unit roundoff times the result's magnitude (and f16's subnormal spacing). Under
    /// [`Precision::Fast`] a backend may also round the weights (and, backward, the score
    /// gradients) of 16-bit operands to their dtype before the products that take them, as
    /// flash attention does on 16-bit matrix units: the output then adds the dtype's unit
    /// roundoff times the sum of its terms' magnitudes.
    fn attention(
        &self,
        x: AttentionInputs<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
        lse: View<'_, Self::Buffer>,
        p: &AttentionParams,
    ) -> Result<()>;

    /// The gradients of [`Backend::attention`] with respect to `q`, `k` and `v` given `dout`
    /// (the gradient of `out`), recomputing the weights from `out` and `lse`
    /// ([`crate::attention`] gives the formulas); `dq`, `dk`, `dv` are overwritten, in the
    /// operands' dtype (`dout` too). Deterministic on a given backend (no atomics).
    ///
    /// Tolerance: each gradient within `(16 + 2 log2 t + d + dv) u` times the sum of its terms'
    /// magnitudes, each weight's term scaled by `1 + sigma_ij + sigma_i` as in
    /// [`Backend::attention`] (`t` the longer of `tq`, `tk`).
    fn attention_backward(
        &self,
        x: AttentionInputs<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
        lse: View<'_, Self::Buffer>,
        dout: View<'_, Self::Buffer>,
        grads: AttentionGrads<'_, Self::Buffer>,
        p: &AttentionParams,
    ) -> Result<()>;

    // ----- norm -----

    /// Layer normalisation over the last dimension of `x: [rows, n]`, with optional affine
    /// `weight` and `bias` (see [`crate::norm`]); also writes each row's `mean` and `rstd`
    /// (`[rows]`) for the backward pass. One dtype throughout, f32 or f64.
    ///
    /// Tolerance: `mean` within `(4 + log2 n) u` of `mean |x|`; `rstd` within
    /// `(8 + 2 log2 n) u rstd`; each output within `(8 + 2 log2 n) u (1 + |xhat|) |w| + u |b|`.
    fn layer_norm(
        &self,
        x: NormInputs<'_, Self::Buffer>,
        out: View<'_, Self::Buffer>,
        mean: View<'_, Self::Buffer>,
        rstd: View<'_, Self::Buffer>,
        eps: f32,
    ) -> Result<()>;

    /// The gradients of [`Backend::layer_norm`] given `dout`: `dx` always, `dweight` and
    /// `dbias` where given (overwritten; see [`crate::norm`]). Deterministic (rows summed in
    /// order, no atomics).
    ///
    /// Tolerance: each element within `(16 + 2 log2 m) u` times the sum of its terms'
    /// magnitudes (`m` the number of terms: `n` for `dx`, `rows` for the parameters').
    fn layer_norm_backward(
        &self,
        x: NormInputs<'_, Self::Buffer>,
        mean: View<'_, Self::Buffer>,
        rstd: View<'_, Self::Buffer>,
        dout: View<'_, Self::Buffer>,
        grads: NormGrads<'_, Self::Buffer>,
    ) -> Result<()>;

    /// k-means++ seeding: writes into `anchors: [m, d]` the rows of `x: [n, d]` (both
    /// contiguous `f32`, offset 0; `m <= n`) that D^2 sampling picks, by an exponential race
    /// (Efraimidis and Spirakis, 2006) on the stream of [`Backend::random`] for `seed`. With
    /// `u_j(i)` the uniform value at offset `j n + i` of that stream: anchor 0 is the row with
    /// the smallest `u_0(i)`; anchor `j > 0` is the row with the smallest key
    /// `-ln(max(u_j(i), f32::MIN_POSITIVE)) / D2(i)`, where `D2(i)` is row `i`'s squared
    /// distance to its nearest anchor so far, kept as the running `min` of the distances to
    /// each new anchor (`+inf` where `D2 = 0`: a row already taken never wins; ties go to the
    /// lowest index). Row `i` thus wins with probability `D2(i) / sum D2`. The rows must be
    /// finite (with NaN or infinite coordinates the picks are unspecified).
    ///
    /// Tolerance: each distance as [`Backend::nearest_centroid`]'s; where two rows' keys lie
    /// within what that allows, a backend may pick either (and the steps after it then differ).
    /// Under [`Precision::Reproducible`] the distances follow `nearest_centroid`'s reference
    /// order and, on a backend that runs f64 programs with their math
    /// ([`F64Support::program_math`](crate::F64Support::program_math)), each key is computed
    /// in f64 and rounded to f32 once, so every such backend picks the same rows (unless a
    /// key lies within about 2^-50 of an f32 rounding boundary; backends' f32 logarithms and
    /// divisions differ in their last bits, which picked other rows at near-ties).
    /// Deterministic on a given backend.
    ///
    /// The default runs it as a few calls of other primitives and IR kernels per anchor
    /// ([`crate::seeding`]); a backend may fuse it.
    fn kmeans_pp(
        &self,
        x: View<'_, Self::Buffer>,
        anchors: View<'_, Self::Buffer>,
        seed: u64,
    ) -> Result<()> {
        crate::seeding::kmeans_pp_steps(self, x, anchors, seed)
    }

    // ----- optimisers (contiguous f32 buffers of one length) -----

    /// One SGD step as specified by [`SgdParams`]; `momentum_buffer` is required when
    /// `momentum != 0`. Tolerance `8u` relative.
    fn sgd_step(
        &self,
        param: &Self::Buffer,
        grad: &Self::Buffer,
        momentum_buffer: Option<&Self::Buffer>,
        p: &SgdParams,
    ) -> Result<()>;

    /// One Adam / AdamW step as specified by [`AdamParams`]. Tolerance `16u` relative.
    fn adam_step(
        &self,
        param: &Self::Buffer,
        grad: &Self::Buffer,
        m: &Self::Buffer,
        v: &Self::Buffer,
        p: &AdamParams,
    ) -> Result<()>;

    // ----- random -----

    /// Fills `out` (float) with the counter-based stream of [`crate::random`]: the element at
    /// row-major position `i` of `out`'s shape gets `random_value(dist, seed, offset + i)`.
    /// The Philox words are bit-exact across backends; uniform values within `2u|ref|` (one
    /// multiply-add, fused or not), normal values within `2^-15 * std` (ln, sqrt, cos).
    fn random(
        &self,
        out: View<'_, Self::Buffer>,
        dist: Distribution,
        seed: u64,
        offset: u64,
    ) -> Result<()>;

    // ----- scalar programs -----

    /// Validates and compiles a program, or returns the cached kernel of a structurally equal
    /// one.
    fn compile(&self, program: &Program) -> Result<Self::Kernel>;

    /// Runs the kernel for launch indices `0..n`. `args` bind the program's buffers in order
    /// and must match their dtypes. Tolerance: exact for arithmetic, comparisons, select and
    /// casts; `4u + 2^-22` relative per math function; `k` atomic float adds landing on one
    /// element in any order: `|got - ref| <= 2 k 2^-24 sum|terms|` (the bound of sequential
    /// summation, which is what contended atomics do). `F64` values: the same, in f64's `u`
    /// (`2^-53`; math functions `8u`), except that division and square root may be off by `4u`
    /// on a Vulkan device (Vulkan requires no correct rounding of them in f64; the wgpu backend
    /// refines the driver's). A device without f64 refuses the program
    /// ([`Error::UnsupportedDType`], see [`Capabilities::f64`]).
    fn launch(&self, kernel: &Self::Kernel, args: &[&Self::Buffer], n: usize) -> Result<()>;

    // ----- precision policy -----

    /// A handle to the same device whose `matmul`, `nearest_centroid` and `segment_sum` follow
    /// `precision` (buffers, kernels and queued work are shared with `self`).
    /// [`Precision::Exact`] is every handle's default. A backend whose
    /// [`Capabilities::fast_precision`] is false has no faster path and runs
    /// [`Precision::Fast`] calls exactly; every backend implements
    /// [`Precision::Reproducible`] as specified, which is why there is no default here.
    fn with_precision(&self, precision: Precision) -> Self;

    /// The policy this handle's calls follow.
    fn precision(&self) -> Precision;

    // ----- recording -----

    /// Records the calls `steps` makes on the handle it is given, to run again with
    /// [`Backend::replay`]. Where [`Capabilities::graph_capture`] is true the launches are
    /// captured (recording then runs no device work; on CUDA a replay is one graph launch, on
    /// wgpu the captured dispatches encoded again without the calls' host work); elsewhere the steps are kept and run again on each replay, so workloads use
    /// one code path. A replay repeats the same launches with the same scalar arguments on the
    /// same buffers; the buffers' contents may change between replays. Inside `steps`, calls
    /// that wait for the device or move data to or from the host (`synchronize`, `read_bytes`,
    /// `upload_bytes`, `write_bytes`) are an [`Error::InvalidArgument`] on a capturing backend;
    /// buffers allocated inside stay alive as long as the graph.
    fn record(&self, steps: Arc<RecordedSteps<Self>>) -> Result<Self::Graph>;

    /// Runs a recording once more (enqueued, like every call).
    fn replay(&self, graph: &Self::Graph) -> Result<()>;
}

/// The calls a recording makes: a closure over the backend handle it is given.
pub type RecordedSteps<B> = dyn Fn(&B) -> Result<()> + Send + Sync;

/// The graph of a backend that cannot capture: the steps, run again on each replay.
pub struct Replay<B: ?Sized> {
    steps: Arc<RecordedSteps<B>>,
}

impl<B: Backend> Replay<B> {
    pub fn new(steps: Arc<RecordedSteps<B>>) -> Self {
        Self { steps }
    }
    /// Runs the steps on `backend`.
    pub fn run(&self, backend: &B) -> Result<()> {
        (self.steps)(backend)
    }
}

impl<B: ?Sized> std::fmt::Debug for Replay<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Replay(steps run again on each replay)")
    }
}

/// Conveniences every backend gets for free.
pub trait BackendExt: Backend {
    /// A new buffer holding `data`.
    fn upload<T: Element>(&self, data: &[T]) -> Result<Self::Buffer> {
        self.upload_bytes(T::DTYPE, bytemuck::cast_slice(data))
    }

    /// Waits for pending work and returns the buffer's contents as `T`, which must be its dtype.
    fn read<T: Element>(&self, src: &Self::Buffer) -> Result<Vec<T>> {
        if src.dtype() != T::DTYPE {
            return Err(Error::DTypeMismatch {
                op: "read",
                expected: src.dtype(),
                got: T::DTYPE,
            });
        }
        let bytes = self.read_bytes(src)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// [`BackendExt::read`] into `dst`, which must hold exactly the buffer's elements.
    fn read_into<T: Element>(&self, src: &Self::Buffer, dst: &mut [T]) -> Result<()> {
        if src.dtype() != T::DTYPE {
            return Err(Error::DTypeMismatch {
                op: "read_into",
                expected: src.dtype(),
                got: T::DTYPE,
            });
        }
        self.read_bytes_into(src, bytemuck::cast_slice_mut(dst))
    }

    /// Reads any float or integer buffer as `f32` (`f64`, and integers beyond 2^24, rounded to
    /// nearest).
    fn read_f32(&self, src: &Self::Buffer) -> Result<Vec<f32>> {
        Ok(self.read_f64(src)?.into_iter().map(|v| v as f32).collect())
    }

    /// Reads any float or integer buffer as `f64` (exactly: every element of every dtype is
    /// an `f64`).
    fn read_f64(&self, src: &Self::Buffer) -> Result<Vec<f64>> {
        Ok(widen_to_f64(src.dtype(), &self.read_bytes(src)?))
    }

    /// [`BackendExt::read`] through [`Backend::read_bytes_async`].
    fn read_async<'a, T: Element>(
        &'a self,
        src: &'a Self::Buffer,
    ) -> impl std::future::Future<Output = Result<Vec<T>>> + 'a {
        async move {
            if src.dtype() != T::DTYPE {
                return Err(Error::DTypeMismatch {
                    op: "read_async",
                    expected: src.dtype(),
                    got: T::DTYPE,
                });
            }
            Ok(bytemuck::pod_collect_to_vec(
                &self.read_bytes_async(src).await?,
            ))
        }
    }

    /// [`BackendExt::read_f64`] through [`Backend::read_bytes_async`].
    fn read_f64_async<'a>(
        &'a self,
        src: &'a Self::Buffer,
    ) -> impl std::future::Future<Output = Result<Vec<f64>>> + 'a {
        async move {
            let bytes = self.read_bytes_async(src).await?;
            Ok(widen_to_f64(src.dtype(), &bytes))
        }
    }

    /// [`BackendExt::read_f64_async`] into `dst`, resized to the buffer's length: a caller
    /// that reads round after round (a solver's Jacobian, megabytes a linearization) keeps
    /// one vector, whose pages are faulted in once. An `f64` buffer goes straight in through
    /// [`Backend::read_bytes_into_async`] (one copy on the CPU backend); other dtypes are
    /// widened from a read of their bytes.
    fn read_f64_into_async<'a>(
        &'a self,
        src: &'a Self::Buffer,
        dst: &'a mut Vec<f64>,
    ) -> impl std::future::Future<Output = Result<()>> + 'a {
        async move {
            if src.dtype() == DType::F64 {
                dst.resize(src.len(), 0.0);
                self.read_bytes_into_async(src, bytemuck::cast_slice_mut(dst))
                    .await
            } else {
                *dst = self.read_f64_async(src).await?;
                Ok(())
            }
        }
    }

    /// Writes `data` over the whole of `dst`.
    fn write<T: Element>(&self, dst: &Self::Buffer, data: &[T]) -> Result<()> {
        if dst.dtype() != T::DTYPE {
            return Err(Error::DTypeMismatch {
                op: "write",
                expected: dst.dtype(),
                got: T::DTYPE,
            });
        }
        self.write_bytes(dst, bytemuck::cast_slice(data))
    }
}

impl<B: Backend> BackendExt for B {}

/// The little-endian elements of `dtype` in `bytes`, each as the `f64` equal to it.
fn widen_to_f64(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    fn conv<T: Element>(b: &[u8]) -> Vec<f64> {
        bytemuck::pod_collect_to_vec::<u8, T>(b)
            .into_iter()
            .map(T::to_f64)
            .collect()
    }
    match dtype {
        DType::F32 => conv::<f32>(bytes),
        DType::F16 => conv::<half::f16>(bytes),
        DType::BF16 => conv::<half::bf16>(bytes),
        DType::I32 => conv::<i32>(bytes),
        DType::U32 => conv::<u32>(bytes),
        DType::F64 => conv::<f64>(bytes),
    }
}
