//! # backend-wgpu: the hal backend on wgpu
//!
//! Implements every [`hal::Backend`] primitive and the scalar program IR as WGSL compute
//! shaders on wgpu (Vulkan, Metal, DX12). It runs on real GPUs and, in CI, on Mesa's software
//! Vulkan driver (lavapipe).
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
//! nearest-centroid search share a shared-memory tile, 128 x 128 or smaller by shape (about 28 TFLOP/s f32 GEMM on
//! an H200; 1M x 128 points against 4096 centroids in 57 ms); products with few outputs and a
//! long k take a dot-product kernel instead; contiguous f32 arithmetic uses vec4 loads
//! (3.9 TB/s); docs/PERF.md has the figures. Buffers are pooled; nothing reads back to the host
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
//! [`Precision::Fast`] and [`Precision::Compensated`], and the fast nearest-centroid search;
//! on an H200, 163 TFLOP/s for f16 inputs at 8192^3, 67 TFLOP/s for f32 split into three f16
//! products at 3.5e-7 relative error, the search above in 11.7 ms).

mod capture;
pub mod coop;
mod profile;
mod program;
pub mod wgsl;

/// The WGSL a scalar IR program lowers to (what [`Backend::compile`] builds), for inspection
/// and for `cargo xtask wgsl`.
/// `features`: what the module may use (the default: none).
pub fn program_wgsl(program: &Program, features: wgsl::Features) -> Result<String> {
    program::lower(program, features)
}

use hal::fault::{FaultKind, fault_code, fault_error, index_fault};
use hal::ir::Program;
use hal::{
    AdamParams, ArgReduceOp, Backend, BinaryOp, Capabilities, Conv2dGeometry, Csr, DType,
    DeviceBuffer, DeviceInfo, DeviceKind, Distribution, Epilogue, Error, Layout, Precision,
    ReduceOp, Result, SgdParams, TernaryOp, UnaryOp, View, validate,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wgsl::{Access, Entry};

pub use capture::WgpuGraph;

const NAME: &str = "wgpu";

/// The most elements one thread scans or multiplies in one pass.
const CHUNK: usize = 2048;

/// `arg_reduce` shortens its chunks when chunks of [`CHUNK`] would give it fewer threads than
/// this.
const ARG_FEW_THREADS: usize = 4096;
/// The threads `reduce_chunked` shortens its chunks to give (see there).
const REDUCE_THREADS: usize = 65_536;
/// The longest run one invocation of `reduce_lanes.wgsl` takes (see `reduce_chunked`).
const LANE_ELEMENTS: usize = 64;
/// `arg_reduce` gives each output a workgroup of its own (arg_line.wgsl) when there are few
/// outputs and their lines are at least this long.
const ARG_LINE_FROM: usize = 1024;
/// The most terms one thread adds in sequence before a partial is written: short runs keep
/// f32 sums accurate without relying on compensation, which a shader compiler may undo.
const SUM_CHUNK: usize = 256;
/// From this many segments on, `segment_sum` sorts rows by segment first (O(n d) work)
/// instead of having every (chunk, segment, column) thread scan its chunk (O(n m d)).
const SORTED_SEGMENTS: usize = 128;

/// Below this many centroids `nearest_centroid` takes nearest_ordered.wgsl under every
/// precision.
const FEW_CENTROIDS: usize = 16;

/// Segments of at most this many rows on average are summed whole by the sorted segment sum
/// (no parts, so no reduction over parts).
const WHOLE_SEGMENT_ROWS: usize = 64;

/// `segment_sum` lets each segment's workgroup scan every id (segment_scan.wgsl) while
/// segments times rows stay within this.
const SCAN_SEGMENTS_TIMES_ROWS: u64 = 1 << 24;

/// Iterations one invocation's loops may run in the reproducible kernels. lavapipe stops a
/// loop after 65535 of its own counts, and a body with branches costs several counts per
/// iteration (the weighted segment sum lost rows past about 13,000); 8192 was measured safe.
const LOOP_BUDGET: usize = 8_192;

/// The `guard` slot of a kernel file: the verdict words at binding `b`, and `skipped()`, true
/// when the check whose word and serial sit in scalar slots `[word, serial]` failed, or, with
/// `unless_failed`, when it passed (the f32 fallback of a range-checked product).
fn guard_slot(b: usize, [word, serial]: [u32; 2], unless_failed: bool) -> String {
    let test = if unless_failed { "!=" } else { "==" };
    format!(
        "@group(0) @binding({b}) var<storage, read> B{b}: array<u32>;\nfn skipped() -> bool {{ return B{b}[s({word}u)] {test} s({serial}u); }}"
    )
}

/// What the segment-sum kernels bind as weights: the weights and their layout, or, without
/// weights, `x` itself under a broadcast layout, which the kernels are told (a scalar slot)
/// not to read: no per-call buffer of ones.
fn weight_binding<'a>(
    x: View<'a, WgpuBuffer>,
    weights: Option<View<'a, WgpuBuffer>>,
) -> Result<(&'a WgpuBuffer, Layout)> {
    Ok(match weights {
        Some(w) => (w.buffer, w.layout.clone()),
        None => (
            x.buffer,
            Layout::contiguous(&[1]).broadcast_to(&[x.layout.shape[0]])?,
        ),
    })
}

/// The parameters the nearest-centroid kernels take for the slice of centroids `first..end`
/// (see nearest_centroid.wgsl, nearest_ordered.wgsl and nearest_short.wgsl), `fused` saying
/// whether `fma()` is fused. Rank-3 views (a batch) give the first group's matrices and the
/// group strides (scalars 13 and 14); the outputs are passed whole.
fn nearest_slice_params(
    [x, c, out_index, out_distance]: [View<'_, WgpuBuffer>; 4],
    first: usize,
    end: usize,
    fused: bool,
) -> Result<Params> {
    let batched = x.layout.rank() == 3;
    let (xl, cl) = match batched {
        true => (x.layout.select(0, 0)?, c.layout.select(0, 0)?),
        false => (x.layout.clone(), c.layout.clone()),
    };
    let group_stride = |l: &Layout| {
        if batched {
            l.strides[0] as i32 as u32
        } else {
            0
        }
    };
    Ok(Params::default()
        .block(out_index.layout)
        .block(out_distance.layout)
        .scalar(0, xl.shape[0] as u32)
        .scalar(1, end as u32)
        .scalar(2, xl.shape[1] as u32)
        .matrix(3, &xl)
        .matrix(6, &cl)
        .scalar(9, first as u32)
        .scalar(10, (first > 0) as u32)
        .scalar(11, fused as u32)
        .scalar(13, group_stride(x.layout))
        .scalar(14, group_stride(c.layout)))
}

/// Launch parameters: sixteen scalar slots and up to eight layout blocks (see `wgsl/`).
#[derive(Clone, Default)]
struct Params {
    scalars: [u32; 16],
    blocks: Vec<(Vec<usize>, Vec<isize>, isize)>,
    /// Elements each invocation handles (0 means 1).
    per_thread: u32,
}

impl Params {
    fn block(mut self, l: &Layout) -> Self {
        self.blocks
            .push((l.shape.clone(), l.strides.clone(), l.offset as isize));
        self
    }
    fn scalar(mut self, i: usize, v: u32) -> Self {
        self.scalars[i] = v;
        self
    }
    fn f(self, i: usize, v: f32) -> Self {
        self.scalar(i, v.to_bits())
    }
    /// A 2-D view's offset, row stride and column stride in slots `i`, `i + 1`, `i + 2`
    /// (as i32 bits).
    fn matrix(self, i: usize, l: &Layout) -> Self {
        let bits = |v: isize| v as i32 as u32;
        self.scalar(i, bits(l.offset as isize))
            .scalar(i + 1, bits(l.strides[0]))
            .scalar(i + 2, bits(l.strides[1]))
    }
    fn encode(&self, threads: u32) -> Vec<u32> {
        let mut p = vec![threads];
        p.extend_from_slice(&self.scalars);
        let mut starts = [0u32; 8];
        let mut body = Vec::new();
        for (k, (shape, strides, offset)) in self.blocks.iter().enumerate() {
            starts[k] = (25 + body.len()) as u32;
            body.push(shape.len() as u32);
            body.push(*offset as i32 as u32);
            body.extend(shape.iter().map(|&d| d as u32));
            body.extend(strides.iter().map(|&s| s as i32 as u32));
        }
        p.extend_from_slice(&starts);
        p.extend(body);
        p
    }
}

/// Which kernel to run: a file of `shaders/` and how it is specialised (see
/// [`wgsl::compose`]). It is the pipeline-cache key (with the immediates variant).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Spec {
    file: &'static str,
    bindings: Option<Vec<(DType, Access)>>,
    slots: Vec<(&'static str, String)>,
    entry: Entry,
}

impl Spec {
    fn new(file: &'static str) -> Self {
        Spec {
            file,
            bindings: None,
            slots: Vec::new(),
            entry: Entry::Strided,
        }
    }
    /// Typed accessors for these dtypes instead of the file's default `bindings` slot.
    fn bindings(mut self, bindings: Vec<(DType, Access)>) -> Self {
        self.bindings = Some(bindings);
        self
    }
    fn slot(mut self, name: &'static str, text: String) -> Self {
        self.slots.push((name, text));
        self
    }
    /// The contiguous entry (several elements per thread) when every operand is contiguous;
    /// its pairs form when `out` is 16-bit, starts on a word and has an even length, so whole
    /// words (two elements) are stored without atomics. For the elementwise files of
    /// [`wgsl::PAIRS_ENTRY_FILES`].
    fn contiguous_if(mut self, all_contiguous: bool, out: V<'_>) -> Self {
        debug_assert!(wgsl::PAIRS_ENTRY_FILES.contains(&self.file));
        let l = out.layout;
        if all_contiguous {
            self.entry =
                if out.dtype().size_in_bytes() == 2 && l.offset % 2 == 0 && l.numel() % 2 == 0 {
                    Entry::ContiguousPairs
                } else {
                    Entry::Contiguous
                };
        }
        self
    }
}

/// A compiled compute pipeline and its bind-group layout (fetched once: wgpu creates a new
/// layout object on every `get_bind_group_layout` call).
pub(crate) struct Kernel {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    /// Words of launch parameters the kernel takes as immediates; 0: it reads binding 0.
    immediate_words: u32,
    /// What it was built from, to build the binding-0 variant for a launch whose parameters
    /// do not fit the immediates (`None` for IR programs, whose parameters always fit).
    spec: Option<Spec>,
    /// Its shader file, or `ir:` and the program's name (for profiles).
    name: String,
}

/// A dispatch with its bind group and launch parameters built (see `WgpuBackend::prepare`).
struct Prepared {
    /// A [`capture::Command::Dispatch`].
    dispatch: capture::Command,
    /// Its buffers, for a capture to hold.
    buffers: Vec<WgpuBuffer>,
}

/// The output block one GEMM or nearest-centroid workgroup computes (`tile.wgsl`): rows and
/// columns, each 64 or 128.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    pub rows: usize,
    pub cols: usize,
}

impl TileShape {
    /// The `tile_shape` slot of `tile.wgsl` (rows and columns per thread).
    fn slot(self) -> (&'static str, String) {
        (
            "tile_shape",
            format!(
                "const TM: u32 = {}u;\nconst TN: u32 = {}u;",
                self.rows / 16,
                self.cols / 16
            ),
        )
    }
}

/// The GEMM tile of large products: 128 x 128 unless the environment's `HAL_WGPU_TILE` names
/// another of `128x64`, `64x128`, `64x64`, `128x128` (a tuning knob for comparing them on a
/// new GPU, which then holds for every product; `bench` reports it). Otherwise each product
/// takes the tile `gemm_tile` chooses for its shape. Nearest-centroid always uses 128 rows,
/// with these columns.
pub fn tile_shape() -> TileShape {
    tile_override().unwrap_or(TileShape {
        rows: 128,
        cols: 128,
    })
}

/// The tile `HAL_WGPU_TILE` asks for, if any.
fn tile_override() -> Option<TileShape> {
    static SHAPE: std::sync::OnceLock<Option<TileShape>> = std::sync::OnceLock::new();
    *SHAPE.get_or_init(|| {
        let (rows, cols) = match std::env::var("HAL_WGPU_TILE").as_deref() {
            Ok("128x64") => (128, 64),
            Ok("64x64") => (64, 64),
            Ok("128x128") => (128, 128),
            Ok("64x128") => (64, 128),
            _ => return None,
        };
        Some(TileShape { rows, cols })
    })
}

/// The GEMM tile of a product with an `rows x cols` output (times `batch`), unless
/// `HAL_WGPU_TILE` says otherwise:
/// - 64 x 64 where 128 x 128 would give fewer than [`SMALL_PRODUCT_TILES`] workgroups (a
///   training step's 256 x 512 products: 8 workgroups on a GPU of 132 multiprocessors; with
///   64 x 64 tiles an MLP step went from 0.86 to 0.60 ms on an H200). That includes long
///   products over few tiles, which are split over k ([`k_slices`]): a convolution's weight
///   gradient, 64 x 288 over k = 50176, took 139 us in 64 x 64 tiles, 152 in 64 x 128 and 178
///   in 128 x 64 (H200).
/// - otherwise 128 x 128, or a half tile (64 x 128 or 128 x 64) where that pads less: a
///   convolution's 64 x 50176 forward product (123 us against 149 in 128 x 128 tiles, half of
///   which padding) and its 288 x 50176 input gradient (138 against 149 us).
fn gemm_tile(rows: usize, cols: usize, batch: usize) -> TileShape {
    if let Some(t) = tile_override() {
        return t;
    }
    let shape = |rows, cols| TileShape { rows, cols };
    let padded =
        |t: TileShape| rows.div_ceil(t.rows) * cols.div_ceil(t.cols) * batch * t.rows * t.cols;
    let square = shape(128, 128);
    if padded(square) / (128 * 128) < SMALL_PRODUCT_TILES {
        return shape(64, 64);
    }
    let half = [shape(64, 128), shape(128, 64)]
        .into_iter()
        .min_by_key(|&t| padded(t))
        .expect("two candidates");
    match padded(half) < padded(square) {
        true => half,
        false => square,
    }
}

/// See [`gemm_tile`].
const SMALL_PRODUCT_TILES: usize = 256;

/// Into how many slices of `k` a product of `tiles` output tiles splits (1: none): enough
/// for about [`SMALL_PRODUCT_TILES`] workgroups, each slice at least [`MIN_SLICE_K`] long and
/// all of one length (a divisor of `k`). A small CNN's weight gradient, 64 x 288 outputs over
/// k = 50176 (256 images of 14 x 14), is 5 tiles: one workgroup a multiprocessor on a few.
fn k_slices(k: usize, tiles: usize) -> usize {
    let wanted = split_groups().div_ceil(tiles.max(1));
    (2..=wanted.min(k / min_slice_k()))
        .rev()
        .find(|s| k % s == 0)
        .unwrap_or(1)
}

/// See [`k_slices`]. Measured on an H200 (recorded training steps, `bench --suite train`,
/// with `HAL_WGPU_MIN_SLICE_K` and `HAL_WGPU_SPLIT_GROUPS`): 128 against 64 took the MLP step
/// from 0.209 to 0.185 ms (its 256 x 512 products over k = 512 and 784 in 4 slices, not 8;
/// its 512-row weight gradients over k = 256 in 2, not 4) and the CNN step from 0.93 to 0.91;
/// 256 took the MLP to 0.24 ms. Aiming for 128 or 192 workgroups instead of 256 slowed the CNN.
const MIN_SLICE_K: usize = 128;

/// The workgroups a split product aims for: [`SMALL_PRODUCT_TILES`], or `HAL_WGPU_SPLIT_GROUPS`
/// (a tuning knob, at least 1).
fn split_groups() -> usize {
    static GROUPS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    knob(&GROUPS, "HAL_WGPU_SPLIT_GROUPS", SMALL_PRODUCT_TILES)
}

/// [`MIN_SLICE_K`], or `HAL_WGPU_MIN_SLICE_K` (a tuning knob, at least 1).
fn min_slice_k() -> usize {
    static K: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    knob(&K, "HAL_WGPU_MIN_SLICE_K", MIN_SLICE_K)
}

/// A path on unless the environment variable `var` is `0` (a knob for comparisons); read
/// once, into `cell`.
fn switch(cell: &'static std::sync::OnceLock<bool>, var: &str) -> bool {
    *cell.get_or_init(|| std::env::var(var).as_deref() != Ok("0"))
}

/// A tuning knob: the environment variable `var` as a number (at least 1), else `default`;
/// read once, into `cell`.
fn knob(cell: &'static std::sync::OnceLock<usize>, var: &str, default: usize) -> usize {
    *cell.get_or_init(|| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(default, |n| n.max(1))
    })
}

/// The tile of a product, into how many slices of k it splits (1: none) and whether it runs
/// whole as dot products: products with thin outputs, small thin ones ([`whole_dot`]), with
/// beta (the sum pass overwrites), batched ones and, under `HAL_WGPU_GEMM=tile`, every product
/// stay whole. Dot products where the output is thin or covers fewer than
/// [`DOT_BELOW_TILES`] tiles, k is at least [`DOT_FROM_K`] and the k strides are 1, or where
/// [`whole_dot`] holds.
fn gemm_route(
    am: &validate::MatrixView,
    bm: &validate::MatrixView,
    om: &validate::MatrixView,
    beta: f32,
) -> GemmRoute {
    let tile = gemm_tile(om.rows, om.cols, om.batch);
    let tiles = om.rows.div_ceil(tile.rows) * om.cols.div_ceil(tile.cols) * om.batch;
    let thin = om.rows.min(om.cols) <= DOT_THIN;
    let small = whole_dot(am, om);
    let slices = match thin || small || beta != 0.0 || om.batch != 1 || tile_only() {
        true => 1,
        false => k_slices(am.cols, tiles),
    };
    let dot = slices == 1
        && !tile_only()
        && (small
            || ((thin || tiles < DOT_BELOW_TILES)
                && am.cols >= DOT_FROM_K
                && unit_k_strides(am, bm)));
    GemmRoute { tile, slices, dot }
}

/// Whether a product runs whole as dot products, whatever its k strides: an output of at most
/// [`SPLIT_DOT_THIN`] rows or columns and [`WHOLE_DOT_OUTPUTS`] elements over k from
/// [`DOT_FROM_K`] to [`WHOLE_DOT_K`] (an MLP's last layer: its 256 x 10 forward product over
/// k = 512 and its 10 x 512 weight gradient over k = 256). Split, each took two launches (the
/// slices, then the sum pass); whole, the dot kernel also applies a fused epilogue, so such a
/// layer's forward pass or weight and bias gradient is one launch. Off under
/// `HAL_WGPU_WHOLE_DOT=0` (a knob for comparisons).
fn whole_dot(am: &validate::MatrixView, om: &validate::MatrixView) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch(&ON, "HAL_WGPU_WHOLE_DOT")
        && om.rows.min(om.cols) <= SPLIT_DOT_THIN
        && om.batch * om.rows * om.cols <= WHOLE_DOT_OUTPUTS
        && (DOT_FROM_K..=WHOLE_DOT_K).contains(&am.cols)
}

/// See [`whole_dot`]: each of an output's 32 threads then reads at most 32 elements of each
/// operand, and strided reads (a weight gradient's k runs down both operands' columns) touch
/// at most a few hundred kilobytes.
const WHOLE_DOT_K: usize = 1024;
const WHOLE_DOT_OUTPUTS: usize = 16384;

/// The name profiles file a product's dispatches under: its shape.
fn gemm_label(am: &validate::MatrixView, om: &validate::MatrixView) -> String {
    format!(
        "gemm {}x{}x{} batch {}",
        om.rows, om.cols, am.cols, om.batch
    )
}

/// See [`gemm_route`].
struct GemmRoute {
    tile: TileShape,
    slices: usize,
    /// One dot product per output (gemm_dot.wgsl), never split.
    dot: bool,
}

/// `op`'s parameters, which [`wgsl::unary_expr`] reads from scalars 0 and 1 (LeakyRelu's
/// slope, Affine's scale and shift, Clamp's bounds); `None` for an op without any.
fn unary_scalars(op: UnaryOp) -> Option<[f32; 2]> {
    match op {
        UnaryOp::LeakyRelu { slope } => Some([slope, 0.0]),
        UnaryOp::Affine { scale, shift } => Some([scale, shift]),
        UnaryOp::Clamp { lo, hi } => Some([lo, hi]),
        _ => None,
    }
}

/// `p` with `op`'s parameters ([`unary_scalars`]) in scalars 0 and 1.
fn unary_params(p: Params, op: UnaryOp) -> Params {
    match unary_scalars(op) {
        Some([first, second]) => p.f(0, first).f(1, second),
        None => p,
    }
}

/// Whether `matmul_epilogue` fuses where it can: yes unless `HAL_WGPU_EPILOGUE=0` (a knob
/// for comparing against the separate calls).
fn fused_epilogues() -> bool {
    static FUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch(&FUSED, "HAL_WGPU_EPILOGUE")
}

/// What a product does besides the product (a [`hal::Epilogue`] as the kernels take it): `a`
/// read through a gate, the sums of `a`'s rows (a column of ones after `b`'s last, stored to
/// this buffer and `[rows]` layout), the bias (its layout broadcast to the output's `[rows,
/// cols]`) and the activation. A split product ([`WgpuBackend::matmul_split_k`]) reads the
/// gate and makes the row sums in its slices and does the rest in its sum pass
/// (gemm_sum.wgsl); a whole dot product does all of it in its one launch; the tile kernel
/// takes the gate alone.
#[derive(Clone, Copy, Default)]
struct Fused<'a> {
    gate: Option<GateRead<'a>>,
    row_sums: Option<(&'a WgpuBuffer, &'a Layout)>,
    bias: Option<(&'a WgpuBuffer, &'a Layout)>,
    activation: Option<UnaryOp>,
}

impl Fused<'_> {
    /// Whether anything besides the gate is asked for: what the tile kernel cannot do.
    fn finishes(&self) -> bool {
        self.bias.is_some() || self.activation.is_some() || self.row_sums.is_some()
    }
}

/// f32 products take the cooperative-matrix kernels only where each packed operand element
/// is used at least this often on average (`m n / (m + n)`, half the harmonic mean of the
/// output's sides; 4096 for an 8192^3 product): see `matmul_coop`. A convolution's
/// 288 x 50176 input gradient (286) took 0.21 ms on them against 0.07 ms on the f32 kernels
/// (H200), most of it the packing and the epilogue.
const COOP_F32_MIN_REUSE: usize = 512;

/// Which of the adapter's optional features the backend uses. Each has a fallback that runs
/// everywhere; turning one off (tests do, to run the fallbacks on an adapter that has them)
/// changes speed, never results beyond the tolerances `hal` states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgpuOptions {
    /// Launch parameters as immediates (Vulkan push constants) instead of a buffer written
    /// before every dispatch.
    pub immediates: bool,
    /// f16 buffers as `array<f16>` (`shader-f16`): plain 16-bit loads and stores instead of
    /// packed words and atomic read-modify-writes. Arithmetic stays f32 either way.
    pub native_f16: bool,
    /// Subgroup reductions (`subgroupAdd`, ...) instead of workgroup-memory trees.
    pub subgroups: bool,
    /// Cooperative matrices (tensor cores) for f16 and bf16 products and for products under
    /// [`Precision::Fast`] and [`Precision::Compensated`], where the adapter offers 16 x 16 x 16
    /// tiles of f16 with f32 accumulation and 32-lane subgroups (wgpu's experimental
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX`); needs `subgroups` too (the fast nearest-centroid
    /// search re-checks its candidates with subgroup sums).
    pub cooperative_matrix: bool,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            immediates: true,
            native_f16: true,
            subgroups: true,
            cooperative_matrix: true,
        }
    }
}

impl WgpuOptions {
    /// Every optional feature off: the paths an adapter without them takes.
    pub fn fallbacks() -> Self {
        WgpuOptions {
            immediates: false,
            native_f16: false,
            subgroups: false,
            cooperative_matrix: false,
        }
    }
}

/// `HAL_WGPU_GEMM=tile` sends every matrix product to the tile kernel (for comparisons).
fn tile_only() -> bool {
    static TILE_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TILE_ONLY.get_or_init(|| matches!(std::env::var("HAL_WGPU_GEMM").as_deref(), Ok("tile")))
}

/// How long `synchronize` polls before it blocks.
const SPIN_BEFORE_SLEEP: std::time::Duration = std::time::Duration::from_micros(500);

/// Matrix products with unit k strides and k at least [`DOT_FROM_K`] whose output is thin
/// (at most [`DOT_THIN`] rows or columns: a tile would compute mostly padding) or covers fewer
/// tiles (of [`gemm_tile`]'s choice) than [`DOT_BELOW_TILES`] (a quarter of a big GPU's
/// multiprocessors) run as
/// one dot product per output (`gemm_dot.wgsl`) instead of the tile.
const DOT_BELOW_TILES: usize = 32;
const DOT_THIN: usize = 8;
const DOT_FROM_K: usize = 128;

/// A split product (`matmul_split_k`) whose output has at most this many rows or columns
/// computes its slices as dot products.
const SPLIT_DOT_THIN: usize = 16;

/// Whether the dot-product kernel can read both operands: k is `a`'s column and `b`'s row
/// dimension, and it wants unit strides along it.
fn unit_k_strides(am: &validate::MatrixView, bm: &validate::MatrixView) -> bool {
    am.strides[2] == 1 && bm.strides[1] == 1
}

/// Verdict words of index checks, reused round robin. A word is reused only by a check
/// submitted after the kernel that read it, and the queue runs work in order.
const VERDICT_WORDS: u32 = 1024;

/// What a cooperative-matrix product checks of its operands while packing them (scalar 6
/// of gemm_pack.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RangeCheck {
    /// f16 operands: nothing to check.
    None = 0,
    /// bf16 operands: each value must be exactly an f16.
    ExactlyF16 = 1,
    /// f32 operands: each value finite and within f16's range.
    F16Range = 2,
}

/// An operand as gemm_coop.wgsl reads it (all in halves).
struct CoopOperand {
    buffer: WgpuBuffer,
    offset: usize,
    row_stride: usize,
    batch_stride: usize,
    /// Where the low parts start, past `offset` (the split mode).
    low: usize,
}

/// Where a kernel guarded by an index check finds the check's verdict.
#[derive(Clone, Copy)]
struct Guard {
    word: u32,
    serial: u32,
}

/// What a product's f32 kernel does besides the plain product ([`WgpuBackend::matmul_f32`]).
#[derive(Clone, Copy, Default)]
struct ProductExtras<'a> {
    /// The f32 fallback of a cooperative-matrix product: it writes only if that product's
    /// range check failed.
    fallback_of: Option<Guard>,
    /// `a` read through a gate (the `a_load` slot of tile.wgsl and gemm_dot_body.wgsl), and
    /// for the dot kernel alone the rest of the epilogue (its `dot_epilogue` slot).
    fused: Fused<'a>,
    /// `b` read with a column of ones after its last (the `ones_column` slot): the output's
    /// last column, one more than `b` has, sums the rows of (the gated) `a` (stored apart
    /// where `fused` has row sums).
    ones_column: bool,
}

/// A [`hal::Gate`] as a product's kernel applies it: the gate's output lies at `a`'s strides,
/// each element `shift` elements from `a`'s in its own buffer (binding 4, scalar 15).
#[derive(Clone, Copy)]
struct GateRead<'a> {
    activation: UnaryOp,
    output: &'a WgpuBuffer,
    shift: i32,
}

impl<'a> GateRead<'a> {
    /// The gate as a kernel reading `am` can apply it: where the gate's output has `am`'s
    /// strides (one matrix; a batch of one) and lies within reach of an i32 shift.
    fn of(gate: hal::Gate<'a, WgpuBuffer>, am: &validate::MatrixView) -> Option<Self> {
        let gm = validate::MatrixView::of(gate.output.layout);
        let same = gm.batch == 1 && am.batch == 1 && gm.strides[1..] == am.strides[1..];
        let shift = i32::try_from(gm.offset as isize - am.offset as isize).ok()?;
        same.then_some(GateRead {
            activation: gate.activation,
            output: gate.output.buffer,
            shift,
        })
    }
}

/// Size of the launch-parameter buffer: far more than any kernel's parameters need.
const PARAMS_BYTES: u64 = 16 << 10;

/// Commands go to the queue in batches of at most this many by default: a submission costs
/// tens of microseconds on the host (fences, tracking), several times a dispatch's encoding,
/// so a chain of small launches submitted one by one was bound by it.
const BATCH_COMMANDS: usize = 32;

/// The batch size in use: [`BATCH_COMMANDS`], or `HAL_WGPU_BATCH` (a tuning knob, at least 1).
fn batch_commands() -> usize {
    static BATCH: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    knob(&BATCH, "HAL_WGPU_BATCH", BATCH_COMMANDS)
}

/// After a wait for the device, the first batch goes to the queue once it holds this many
/// commands, and each next batch may hold twice as many as the last, up to
/// [`batch_commands`]: an idle GPU then starts on the first commands while the host encodes
/// the rest, instead of waiting for a whole batch (a recorded MLP training step is 19
/// dispatches, which the host encodes in about 0.13 ms). Measured on an H200 (`bench --suite
/// train` with `HAL_WGPU_FIRST_BATCH`, three runs each): 8 took the recorded MLP step to
/// 0.183-0.184 ms, against 0.186-0.188 for 2 and 0.187-0.201 for 32 (no ramp); 2 made single
/// short calls waited for slower (`bench --suite vlc`'s "each alone and waited for": 0.10 ->
/// 0.16-0.19 ms for the assignment), which 8 leaves alone.
const FIRST_BATCH: usize = 8;

/// [`FIRST_BATCH`], or `HAL_WGPU_FIRST_BATCH` (a tuning knob, at least 1).
fn first_batch() -> usize {
    static FIRST: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    knob(&FIRST, "HAL_WGPU_FIRST_BATCH", FIRST_BATCH)
}

/// The command encoder that dispatches and copies are appended to, submitted when it holds
/// its limit of commands (see [`FIRST_BATCH`]) and before anything that must see their
/// effects or must not be overtaken by them: a wait, a read, a queue write (`write_buffer`
/// lands before the next submission's commands, so the batch goes first), a dispatch reading
/// the shared parameter buffer. Work therefore still runs in the order it was asked for.
/// Consecutive dispatches share one compute pass (WebGPU orders and synchronises the
/// dispatches of a pass); a copy or clear closes it.
#[derive(Default)]
struct Batch {
    /// Declared first, so dropped before the encoder it records into.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    commands: usize,
    /// The size at which this batch is submitted; 0 after a wait (then [`first_batch`]).
    limit: usize,
    /// A recording under way ([`capture`]): dispatches, copies and clears go here instead.
    capture: Option<capture::Capture>,
}

impl Batch {
    /// The size at which this batch is submitted.
    fn due_at(&self) -> usize {
        match self.limit {
            0 => first_batch(),
            n => n,
        }
        .min(batch_commands())
    }

    /// Whether the batch is due for submission.
    fn full(&self) -> bool {
        self.commands >= self.due_at()
    }

    /// After a submission: the next batch may be twice as large.
    fn grow(&mut self) {
        self.limit = (2 * self.due_at()).min(batch_commands());
    }

    /// The open encoder (a new one if there is none). Its compute pass, if open, must have
    /// been closed before the encoder records anything else.
    fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.encoder
            .get_or_insert_with(|| device.create_command_encoder(&Default::default()))
    }

    /// The open compute pass (opened on the encoder if there is none).
    fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder(device)
                .begin_compute_pass(&Default::default())
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("opened above")
    }
}

struct Inner {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    features: wgpu::Features,
    /// Words of launch parameters passed as immediates (0: the device has none, or they are
    /// turned off).
    immediate_words: u32,
    pipelines: Mutex<HashMap<(Spec, u32), Arc<Kernel>>>,
    /// Launch parameters of a dispatch on a device without immediates. One buffer serves every
    /// such dispatch: each writes it and is submitted alone right after (see [`Batch`]), and
    /// queue writes land in submission order, so no dispatch sees another's parameters.
    params: wgpu::Buffer,
    /// Commands encoded but not yet submitted.
    batch: Mutex<Batch>,
    kernels: hal::ir::KernelCache<program::WgpuKernel>,
    /// Errors wgpu reported outside an error scope, returned by the next synchronize.
    deferred: Arc<Mutex<Option<String>>>,
    /// Fault flags of IR launches not yet checked (read at the next synchronize).
    /// The fault record every IR launch writes its first out-of-range access into:
    /// `[buffer + 1, index, bound]`, all 0 while there is none (see `program.rs`).
    faults: WgpuBuffer,
    /// An IR launch or index check happened since the fault record was last read.
    faults_unread: std::sync::atomic::AtomicBool,
    /// One word per recent index check ([`VERDICT_WORDS`], used round robin): set to the
    /// check's serial when it finds a bad index, read by the kernel it guards.
    verdicts: WgpuBuffer,
    /// Serial of the next index check (never 0, the verdict words' initial value).
    check_serial: std::sync::atomic::AtomicU32,
    pool: Arc<Mutex<Pool>>,
    buffers_created: std::sync::atomic::AtomicU64,
    /// Whether WGSL's `fma` is fused on this device (probed on first need; lavapipe's is not).
    fma_fused: std::sync::OnceLock<bool>,
    /// `alloc_for_write` fills its buffers with all-ones bits (NaN) (see `poison_for_write`).
    poison_for_write: std::sync::atomic::AtomicBool,
    /// With cooperative matrices: the tiling of single-pass products (settable for tuning).
    coop: Option<Mutex<coop::CoopTiles>>,
    /// Per-dispatch timestamps, under `HAL_WGPU_PROFILE` (see [`profile`]).
    profiler: Option<Mutex<profile::Profiler>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(p) = &self.profiler {
            let mut p = lock(p);
            if !p.is_empty() {
                eprint!("{}", p.take_report(1));
            }
        }
    }
}

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

/// A wgpu buffer: storage memory, rounded up to whole 4-byte words.
#[derive(Clone)]
pub struct WgpuBuffer(Arc<BufferInner>);

struct BufferInner {
    buffer: wgpu::Buffer,
    dtype: DType,
    len: usize,
    /// Where the buffer goes when the last handle drops.
    pool: Arc<Mutex<Pool>>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        lock(&self.pool).put(self.buffer.clone());
    }
}

/// Freed buffers by size, reused by later allocations of the same size class, so a loop that
/// allocates and drops the same shapes each iteration creates no device buffers after the
/// first. Reuse is safe without waiting: the queue runs work in submission order, so work
/// submitted with the old owner finishes before any work of the new one starts.
#[derive(Default)]
struct Pool {
    /// Per size class, the free buffers with the order they were freed in.
    free: HashMap<u64, Vec<(u64, wgpu::Buffer)>>,
    bytes: u64,
    /// Buffers freed so far (the next one's place in that order).
    freed: u64,
}

/// The most bytes of freed buffers the pool keeps; beyond it, the buffers freed longest ago
/// are released. (Keeping the first ones instead left a later loop whose working set did not
/// fit beside them creating and clearing its large buffers every iteration: a wgpu
/// nearest-centroid iteration at 100,000 x 768 took 7.6-8.7 ms instead of 2.7 ms after a
/// seeding that left other buffers in the pool.)
const POOL_MAX_BYTES: u64 = 1 << 30;

impl Pool {
    /// The size class of an allocation: four classes per power of two (at most 25% spare).
    fn class(bytes: u64, limit: u64) -> u64 {
        let bytes = bytes.max(16);
        let top = bytes.next_power_of_two();
        let step = (top / 8).max(4);
        let class = bytes.div_ceil(step) * step;
        if class > limit {
            bytes.div_ceil(4) * 4
        } else {
            class
        }
    }
    fn take(&mut self, size: u64) -> Option<wgpu::Buffer> {
        let (_, b) = self.free.get_mut(&size)?.pop()?;
        self.bytes -= size;
        Some(b)
    }
    fn put(&mut self, b: wgpu::Buffer) {
        let size = b.size();
        if size > POOL_MAX_BYTES {
            return;
        }
        while self.bytes + size > POOL_MAX_BYTES {
            // Each class's list is in the order freed, so its first is its oldest.
            let Some(oldest) = self
                .free
                .iter()
                .filter_map(|(&class, list)| list.first().map(|&(at, _)| (at, class)))
                .min()
                .map(|(_, class)| class)
            else {
                break;
            };
            let list = self.free.get_mut(&oldest).expect("found above");
            list.remove(0);
            if list.is_empty() {
                self.free.remove(&oldest);
            }
            self.bytes -= oldest;
        }
        self.bytes += size;
        self.freed += 1;
        self.free.entry(size).or_default().push((self.freed, b));
    }
}

impl std::fmt::Debug for WgpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuBuffer({} x {})", self.0.len, self.0.dtype)
    }
}

impl DeviceBuffer for WgpuBuffer {
    fn dtype(&self) -> DType {
        self.0.dtype
    }
    fn len(&self) -> usize {
        self.0.len
    }
    fn same_memory(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
    /// Kernels index elements in 32 bits (`u32` positions, `i32` offsets and strides).
    fn index_limit(&self) -> usize {
        i32::MAX as usize
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

impl WgpuBackend {
    /// Opens the highest-performance adapter. No adapter (no Vulkan driver, say) is
    /// [`Error::Unavailable`] with the reason.
    pub fn new() -> Result<Self> {
        Self::with_options(WgpuOptions::default())
    }

    /// [`Self::new`] using only the optional features `options` allows (where the adapter
    /// has them).
    pub fn with_options(options: WgpuOptions) -> Result<Self> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| Error::Unavailable {
            backend: NAME,
            reason: format!(
                "no GPU adapter: {e} (on Linux: install a Vulkan driver, e.g. mesa-vulkan-drivers)"
            ),
        })?;
        let limits = adapter.limits();
        let mut wanted = wgpu::Features::empty();
        wanted.set(wgpu::Features::SUBGROUP, options.subgroups);
        wanted.set(wgpu::Features::SHADER_F16, options.native_f16);
        wanted.set(wgpu::Features::IMMEDIATES, options.immediates);
        wanted.set(wgpu::Features::TIMESTAMP_QUERY, profile::requested());
        let info = adapter.get_info();
        // The fast nearest-centroid search's re-check sums over subgroups.
        let coop = options.cooperative_matrix
            && options.subgroups
            && adapter.features().contains(
                wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
                    | wgpu::Features::SHADER_F16
                    | wgpu::Features::SUBGROUP,
            )
            && adapter
                .get_downlevel_capabilities()
                .flags
                .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32)
            && info.subgroup_min_size == 32
            && info.subgroup_max_size == 32
            && adapter.cooperative_matrix_properties().iter().any(|p| {
                (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                    && p.ab_type == wgpu::CooperativeScalarType::F16
                    && p.cr_type == wgpu::CooperativeScalarType::F32
            });
        if coop {
            wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
        }
        let features = adapter.features() & wanted;
        // Whole vec4s of words, at most 64 (256 bytes, what Vulkan drivers commonly offer);
        // fewer than 32 words would not hold most launches.
        let immediate_words = if features.contains(wgpu::Features::IMMEDIATES) {
            let w = (limits.max_immediate_size / 16 * 4).min(64);
            if w >= 32 { w } else { 0 }
        } else {
            0
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("hal"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: if coop {
                // SAFETY: wgpu marks cooperative matrices experimental (its validation of
                // them may be incomplete); the backend's only cooperative-matrix kernels are
                // its own (gemm_coop.wgsl), whose loads and stores stay inside their buffers.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        }))
        .map_err(|e| Error::Unavailable {
            backend: NAME,
            reason: format!("the adapter refused a device: {e}"),
        })?;
        let deferred: Arc<Mutex<Option<String>>> = Arc::default();
        let sink = deferred.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut d = lock(&sink);
            d.get_or_insert_with(|| e.to_string());
        }));
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("launch parameters"),
            size: PARAMS_BYTES,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let pool: Arc<Mutex<Pool>> = Arc::default();
        let faults = {
            let f = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("fault record"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            WgpuBuffer(Arc::new(BufferInner {
                buffer: f,
                dtype: DType::U32,
                len: 4,
                pool: pool.clone(),
            }))
        };
        let verdicts = WgpuBuffer(Arc::new(BufferInner {
            buffer: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("index check verdicts"),
                size: VERDICT_WORDS as u64 * 4,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            dtype: DType::U32,
            len: VERDICT_WORDS as usize,
            pool: pool.clone(),
        }));
        let profiler = features
            .contains(wgpu::Features::TIMESTAMP_QUERY)
            .then(|| Mutex::new(profile::Profiler::new(&device, &queue)));
        if profile::requested() && profiler.is_none() {
            eprintln!("HAL_WGPU_PROFILE: this adapter has no timestamp queries; not profiling");
        }
        Ok(Self(
            Arc::new(Inner {
                profiler,
                params,
                verdicts,
                check_serial: std::sync::atomic::AtomicU32::new(1),
                batch: Mutex::default(),
                device,
                queue,
                info,
                coop: coop.then(|| Mutex::new(coop::CoopTiles::SINGLE)),
                limits,
                features,
                immediate_words,
                pipelines: Mutex::default(),
                kernels: Default::default(),
                deferred,
                faults,
                faults_unread: Default::default(),
                pool,
                buffers_created: Default::default(),
                fma_fused: Default::default(),
                poison_for_write: Default::default(),
            }),
            Precision::Exact,
        ))
    }

    /// The squared norm of each centroid (row_norms.wgsl) in a new f32 buffer of `len >= m`
    /// entries, those past `m` +inf (padding that no search picks).
    fn centroid_norms(&self, c: V<'_>, len: usize) -> Result<WgpuBuffer> {
        let (m, d) = (c.layout.shape[0], c.layout.shape[1]);
        let norms = self.scratch(DType::F32, len)?;
        self.run(
            Spec::new("row_norms.wgsl").bindings(wgsl::io(&[c.dtype()], DType::F32)),
            Params::default().scalar(0, d as u32).matrix(1, c.layout),
            &[(c.buffer, false), (&norms, true)],
            m,
        )?;
        if len > m {
            let tail = Layout {
                shape: vec![len - m],
                strides: vec![1],
                offset: m,
            };
            self.fill(View::new(&norms, &tail), f64::INFINITY)?;
        }
        Ok(norms)
    }

    /// Whether `halves` f16 elements fit one storage binding and the cooperative kernels' u32
    /// element offsets (which also address f32 products of half as many elements).
    fn coop_fits(&self, halves: usize) -> bool {
        (halves as u64 * 2) <= self.max_binding_bytes() && halves < (1 << 31)
    }

    /// `nearest_centroid` under [`Precision::Fast`] on cooperative matrices: candidates
    /// ranked with f16 operands (nearest_coop.wgsl), then compared in f32
    /// (nearest_recheck_subgroups.wgsl). A coordinate beyond f16's range fails the packing's range
    /// check, and the re-check then searches every centroid in f32. `false`: not taken (no
    /// cooperative matrices, or operands too large to pack).
    fn nearest_coop(&self, [x, c, out_index, out_distance]: [V<'_>; 4]) -> Result<bool> {
        if self.0.coop.is_none() {
            return Ok(false);
        }
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], c.layout.shape[0]);
        let tiles = coop::NEAREST_TILES;
        let np = n.next_multiple_of(tiles.rows());
        let mp = m.next_multiple_of(tiles.cols());
        let kp = d.next_multiple_of(coop::STEP_K);
        if !self.coop_fits(np * kp) || !self.coop_fits(kp * mp) {
            return Ok(false);
        }
        let guard = self.next_guard();
        let check = RangeCheck::F16Range;
        let xv = validate::MatrixView::of(x.layout);
        let px = self.coop_operand(x, &xv, [np, kp], false, check, Some(guard))?;
        // The centroids transposed ([d, m]): the right-hand operand of x c^T.
        let ct = Layout {
            shape: vec![d, m],
            strides: vec![c.layout.strides[1], c.layout.strides[0]],
            offset: c.layout.offset,
        };
        let cv = validate::MatrixView::of(&ct);
        let pc = self.coop_operand(
            View::new(c.buffer, &ct),
            &cv,
            [kp, mp],
            false,
            check,
            Some(guard),
        )?;
        // Padding centroids score +inf: never a candidate.
        let norms = self.centroid_norms(c, mp)?;
        let candidates = self.scratch(DType::U32, 2 * np)?;
        let kernel = self.kernel(&Spec {
            file: "nearest_coop.wgsl",
            bindings: None,
            slots: coop::nearest_slots(),
            entry: Entry::Strided,
        })?;
        let p = Params::default()
            .scalar(0, kp as u32)
            .scalar(1, px.row_stride as u32)
            .scalar(2, pc.row_stride as u32)
            .scalar(3, m as u32)
            .scalar(4, (mp / tiles.cols()) as u32)
            .scalar(5, n as u32)
            .scalar(10, guard.word)
            .scalar(11, guard.serial)
            .scalar(12, px.offset as u32)
            .scalar(13, pc.offset as u32);
        let blocks = np / tiles.rows();
        let max = self.0.limits.max_compute_workgroups_per_dimension as usize;
        self.dispatch_groups(
            &kernel,
            &p,
            &[
                (&px.buffer, false),
                (&pc.buffer, false),
                (&norms, false),
                (&candidates, true),
                (&self.0.verdicts, false),
            ],
            [blocks.min(max) as u32, blocks.div_ceil(max) as u32, 1],
        )?;
        let p = Params::default()
            .block(out_index.layout)
            .block(out_distance.layout)
            .scalar(0, n as u32)
            .scalar(1, m as u32)
            .scalar(2, d as u32)
            .matrix(3, x.layout)
            .matrix(6, c.layout)
            .scalar(10, guard.word)
            .scalar(11, guard.serial);
        let bindings = vec![
            (x.dtype(), Access::Read),
            (c.dtype(), Access::Read),
            (DType::U32, Access::Read),
            (DType::U32, Access::Write),
            (DType::F32, Access::Write),
            (DType::U32, Access::Read),
        ];
        self.run(
            Spec::new("nearest_recheck_subgroups.wgsl").bindings(bindings),
            p,
            &[
                (x.buffer, false),
                (c.buffer, false),
                (&candidates, false),
                (out_index.buffer, true),
                (out_distance.buffer, true),
                (&self.0.verdicts, false),
            ],
            32 * n,
        )?;
        Ok(true)
    }

    /// The matrix product on cooperative matrices (gemm_coop.wgsl), where this device has
    /// them and the call suits: f16 operands; bf16 operands (exactly f16 where every value
    /// is one, else the f32 kernels); f32 operands under [`Precision::Fast`] (rounded to f16)
    /// or [`Precision::Compensated`] (split into f16 high and low parts). A value outside
    /// f16's range sends the product to the f32 kernels, decided on the device: a range check
    /// while packing the operands, the cooperative kernel and the f32 fallback each guarded
    /// by its verdict. `false`: not taken (the caller runs the f32 kernels).
    fn matmul_coop(
        &self,
        [a, b, out]: [V<'_>; 3],
        [am, bm, om]: [&validate::MatrixView; 3],
        alpha: f32,
        beta: f32,
    ) -> Result<bool> {
        let Some(tiling) = &self.0.coop else {
            return Ok(false);
        };
        let split = a.dtype() == DType::F32 && self.1 == Precision::Compensated;
        let check = match (a.dtype(), self.1) {
            (DType::F16, _) => RangeCheck::None,
            (DType::BF16, _) => RangeCheck::ExactlyF16,
            (DType::F32, Precision::Fast | Precision::Compensated) => RangeCheck::F16Range,
            _ => return Ok(false),
        };
        let tiles = if split {
            coop::CoopTiles::SPLIT
        } else {
            *lock(tiling)
        };
        let (m, n, k) = (om.rows, om.cols, am.cols);
        if a.dtype() == DType::F32 && m * n < COOP_F32_MIN_REUSE * (m + n) {
            // f32 operands are packed to halves first, a pass over both: with a thin output
            // (a convolution's 64 x 50176, say) the packing and the epilogue alone cost more
            // than the f32 kernels' whole product (0.72 against 0.89 ms per step of a small
            // CNN on an H200).
            return Ok(false);
        }
        let mp = m.next_multiple_of(tiles.rows());
        let np = n.next_multiple_of(tiles.cols());
        let kp = k.next_multiple_of(coop::STEP_K);
        let direct = out.dtype() == DType::F32
            && alpha == 1.0
            && beta == 0.0
            && (m, n) == (mp, np)
            && om.strides[1] == n as isize
            && om.strides[2] == 1
            && om.offset % 4 == 0
            && (om.batch == 1 || om.strides[0] == (m * n) as isize);
        let parts = if split { 2 } else { 1 };
        // The padded product as f32 takes as many bytes as twice its elements in halves.
        if !self.coop_fits(parts * am.batch * mp * kp)
            || !self.coop_fits(parts * bm.batch * kp * np)
            || (!direct && !self.coop_fits(2 * om.batch * mp * np))
        {
            return Ok(false);
        }
        let guard = (check != RangeCheck::None).then(|| self.next_guard());
        let pa = self.coop_operand(a, am, [mp, kp], split, check, guard)?;
        let pb = self.coop_operand(b, bm, [kp, np], split, check, guard)?;
        let (product, c_offset, ldc) = if direct {
            (out.buffer.clone(), om.offset, n)
        } else {
            (self.scratch(DType::F32, om.batch * mp * np)?, 0, np)
        };
        let kernel = self.kernel(&Spec {
            file: "gemm_coop.wgsl",
            bindings: None,
            slots: coop::gemm_slots(tiles, split),
            entry: Entry::Strided,
        })?;
        let g = guard.unwrap_or(Guard { word: 0, serial: 0 });
        let p = Params::default()
            .scalar(0, kp as u32)
            .scalar(1, pa.row_stride as u32)
            .scalar(2, pb.row_stride as u32)
            .scalar(3, ldc as u32)
            .scalar(4, pa.batch_stride as u32)
            .scalar(5, pb.batch_stride as u32)
            .scalar(6, (mp * ldc) as u32)
            .scalar(7, pa.low as u32)
            .scalar(8, pb.low as u32)
            .scalar(9, c_offset as u32)
            .scalar(10, g.word)
            .scalar(11, g.serial)
            .scalar(12, pa.offset as u32)
            .scalar(13, pb.offset as u32);
        self.dispatch_groups(
            &kernel,
            &p,
            &[
                (&pa.buffer, false),
                (&pb.buffer, false),
                (&product, true),
                (&self.0.verdicts, false),
            ],
            [
                (np / tiles.cols()) as u32,
                (mp / tiles.rows()) as u32,
                om.batch as u32,
            ],
        )?;
        if !direct {
            let p = Params::default()
                .block(&om.layout())
                .scalar(0, m as u32)
                .scalar(1, n as u32)
                .scalar(2, np as u32)
                .scalar(3, (mp * np) as u32)
                .f(4, alpha)
                .f(5, beta);
            self.run_guarded(
                Spec::new("gemm_epilogue.wgsl").bindings(wgsl::io(&[DType::F32], out.dtype())),
                p,
                &[(&product, false), (out.buffer, true)],
                om.batch * m * n,
                guard,
            )?;
        }
        if let Some(g) = guard {
            let tile = gemm_tile(om.rows, om.cols, om.batch);
            let extras = ProductExtras {
                fallback_of: Some(g),
                ..Default::default()
            };
            self.matmul_f32(
                [a, b, out],
                [am, bm, om],
                alpha,
                beta,
                (false, tile),
                extras,
            )?;
        }
        Ok(true)
    }

    /// One operand of [`Self::matmul_coop`] as the kernel reads it: `v` itself where it is
    /// already f16, row major and whole tiles (`[rows, cols]` padded), else a packed copy
    /// (gemm_pack.wgsl) with the range check's verdict written under `guard`.
    fn coop_operand(
        &self,
        v: V<'_>,
        mv: &validate::MatrixView,
        [rows, cols]: [usize; 2],
        split: bool,
        check: RangeCheck,
        guard: Option<Guard>,
    ) -> Result<CoopOperand> {
        let batch_stride = mv.batch_stride();
        if v.dtype() == DType::F16
            && !split
            && (mv.rows, mv.cols) == (rows, cols)
            && mv.strides[1] == cols as isize
            && mv.strides[2] == 1
            && (batch_stride == 0 || batch_stride == (rows * cols) as isize)
            && mv.offset % 8 == 0
        {
            return Ok(CoopOperand {
                buffer: v.buffer.clone(),
                offset: mv.offset,
                row_stride: cols,
                batch_stride: batch_stride as usize,
                low: 0,
            });
        }
        // A broadcast batch is packed once.
        let batches = if batch_stride == 0 { 1 } else { mv.batch };
        let layout = mv.layout();
        let words = batches * rows * cols / 2;
        let parts = if split { 2 } else { 1 };
        let packed = self.scratch(DType::U32, parts * words)?;
        let g = guard.unwrap_or(Guard { word: 0, serial: 0 });
        let i32s = |v: isize| v as i32 as u32;
        let p = Params::default()
            .scalar(7, layout.offset as u32)
            .scalar(8, i32s(if batches == 1 { 0 } else { layout.strides[0] }))
            .scalar(9, i32s(layout.strides[1]))
            .scalar(10, i32s(layout.strides[2]))
            .scalar(0, mv.rows as u32)
            .scalar(1, mv.cols as u32)
            .scalar(2, rows as u32)
            .scalar(3, cols as u32)
            .scalar(4, split as u32)
            .scalar(5, words as u32)
            .scalar(6, check as u32)
            .scalar(14, g.word)
            .scalar(15, g.serial);
        let bindings = vec![
            (v.dtype(), Access::Read),
            (DType::U32, Access::Write),
            (DType::U32, Access::Write),
        ];
        self.run(
            Spec::new("gemm_pack.wgsl").bindings(bindings),
            p,
            &[(v.buffer, false), (&packed, true), (&self.0.verdicts, true)],
            words,
        )?;
        Ok(CoopOperand {
            buffer: packed,
            offset: 0,
            row_stride: cols,
            batch_stride: if batches == 1 { 0 } else { rows * cols },
            low: 2 * words,
        })
    }

    /// The matrix product on the shader cores (f32 arithmetic): the dot-product kernel when
    /// `dot`, else the shared-memory kernel with `tile` ([`gemm_tile`]), doing the `extras`
    /// as it goes (beyond a gate, an epilogue only in the dot kernel; beta 0 with one). With
    /// a ones column, `om` has one column more than `bm`.
    fn matmul_f32<'a>(
        &'a self,
        [a, b, out]: [V<'a>; 3],
        [am, bm, om]: [&validate::MatrixView; 3],
        alpha: f32,
        beta: f32,
        (dot, tile): (bool, TileShape),
        extras: ProductExtras<'a>,
    ) -> Result<()> {
        let fallback_of = extras.fallback_of;
        let Fused {
            gate,
            row_sums,
            bias,
            activation,
        } = extras.fused;
        debug_assert!(
            fallback_of.is_none() || gate.is_none(),
            "a cooperative-matrix fallback reads no gate (both use scalars past 8)"
        );
        let finishes = extras.fused.finishes();
        debug_assert!(
            !finishes || (dot && beta == 0.0 && om.batch == 1),
            "only the dot kernel applies an epilogue, to one product with beta 0"
        );
        let batch = |mv: &validate::MatrixView| Layout {
            shape: vec![om.batch],
            strides: vec![mv.batch_stride()],
            offset: mv.offset,
        };
        let mut bindings = wgsl::io(&[a.dtype(), b.dtype()], out.dtype());
        // The extras' slots, which both kernels' files take.
        let mut slots = Vec::new();
        let mut buffers = vec![(a.buffer, false), (b.buffer, false), (out.buffer, true)];
        if let Some(g) = gate {
            bindings.push((g.output.dtype(), Access::Read));
            buffers.push((g.output, false));
            slots.push(wgsl::gate_load_slot(g.activation));
        }
        if extras.ones_column {
            slots.push(wgsl::ones_column_slot());
        }
        // The epilogue's buffers follow (after the gate's, if any), their layouts in blocks 3
        // and 4.
        let mut finish_blocks = Vec::new();
        if finishes {
            let mut next_binding = |buffer: &'a WgpuBuffer, access: Access| {
                bindings.push((buffer.dtype(), access));
                buffers.push((buffer, access == Access::Write));
                bindings.len()
            };
            let bias_at = bias.map(|(buffer, l)| {
                finish_blocks.push(l.clone());
                next_binding(buffer, Access::Read)
            });
            let sums_at = row_sums.map(|(buffer, l)| {
                // `[rows]` or `[1, rows]` (one matrix): its last axis.
                let r = l.rank();
                finish_blocks.push(Layout {
                    shape: vec![l.shape[r - 1]],
                    strides: vec![l.strides[r - 1]],
                    offset: l.offset,
                });
                next_binding(buffer, Access::Write)
            });
            slots.push(wgsl::dot_epilogue_slot(bias_at, activation, sums_at));
        }
        let with_slots = |mut spec: Spec| {
            for (name, text) in &slots {
                spec = spec.slot(name, text.clone());
            }
            spec
        };
        // Both kernels take the same parameters (gemm.wgsl) and slice k so that no thread
        // loops past CHUNK steps (lavapipe); later slices accumulate into `out`.
        let (pipeline, k_slice, groups) = if dot {
            // One dot product per output, 32 threads each, 8 outputs per workgroup;
            // subgroup shuffles combine the partial sums where the adapter has them.
            let file = if self.0.features.contains(wgpu::Features::SUBGROUP) {
                "gemm_dot_subgroups.wgsl"
            } else {
                "gemm_dot.wgsl"
            };
            let g = (om.batch * om.rows * om.cols).div_ceil(8);
            let max = self.0.limits.max_compute_workgroups_per_dimension as usize;
            (
                self.kernel(&with_slots(Spec::new(file).bindings(bindings)))?,
                32 * CHUNK,
                [g.min(max) as u32, g.div_ceil(max) as u32, 1],
            )
        } else {
            let (name, text) = tile.slot();
            let mut spec = with_slots(Spec::new("gemm.wgsl").bindings(bindings).slot(name, text));
            if fallback_of.is_some() {
                // gemm.wgsl's free scalars hold the verdict word and serial.
                spec = spec.slot("guard", guard_slot(4, [9, 12], true));
            }
            (
                self.kernel(&spec)?,
                8 * CHUNK,
                [
                    om.cols.div_ceil(tile.cols) as u32,
                    om.rows.div_ceil(tile.rows) as u32,
                    om.batch as u32,
                ],
            )
        };
        let i32s = |v: isize| v as i32 as u32;
        // k = 0 still runs once, to apply beta.
        let k = am.cols;
        let mut k0 = 0;
        loop {
            let k1 = (k0 + k_slice).min(k);
            let p = Params::default()
                .block(&batch(am))
                .block(&batch(bm))
                .block(&batch(om))
                .scalar(0, om.rows as u32)
                .scalar(1, om.cols as u32)
                .scalar(2, k0 as u32)
                .scalar(3, k1 as u32)
                .f(4, alpha)
                .f(5, if k0 == 0 { beta } else { 1.0 })
                .scalar(6, (om.batch * om.rows * om.cols) as u32)
                .scalar(7, i32s(am.strides[1]))
                .scalar(8, i32s(am.strides[2]))
                .scalar(10, i32s(bm.strides[1]))
                .scalar(11, i32s(bm.strides[2]))
                .scalar(13, i32s(om.strides[1]))
                .scalar(14, i32s(om.strides[2]));
            let mut p = match (fallback_of, gate) {
                (Some(g), _) => p.scalar(9, g.word).scalar(12, g.serial),
                (None, Some(g)) => p.scalar(15, g.shift as u32),
                (None, None) => p,
            };
            for l in &finish_blocks {
                p = p.block(l);
            }
            let mut buffers = buffers.clone();
            if fallback_of.is_some() {
                buffers.push((&self.0.verdicts, false));
            }
            debug_assert!(
                !finishes || k1 >= k,
                "an epilogue applies once, to the whole sum"
            );
            self.dispatch_groups(&pipeline, &p, &buffers, groups)?;
            if k1 >= k {
                return Ok(());
            }
            k0 = k1;
        }
    }

    /// The product routed to a kernel ([`gemm_route`]): split k for long products over few
    /// tiles, the cooperative-matrix kernel where it applies (never with a gate), else the f32
    /// tile or dot-product kernel, doing what `fused` asks as it goes (more than a gate only
    /// where `matmul_epilogue` allows it). `om` is the product's own output, without a column
    /// for row sums.
    fn matmul_routed(
        &self,
        [a, b, out]: [V<'_>; 3],
        [am, bm, om]: [&validate::MatrixView; 3],
        alpha: f32,
        beta: f32,
        fused: Fused<'_>,
    ) -> Result<()> {
        let GemmRoute { tile, slices, dot } = gemm_route(am, bm, om, beta);
        // Long products over few tiles go to the split tile kernel even under
        // Precision::Fast: the cooperative-matrix kernel does not split k, and on an H200 it
        // took 1.4 ms per product on a small CNN's weight gradients (k up to 200704).
        if slices > 1 {
            return self.matmul_split_k([a, b, out], [am, bm, om], alpha, (slices, tile), fused);
        }
        let plain = fused.gate.is_none() && !fused.finishes();
        if plain && !dot && self.matmul_coop([a, b, out], [am, bm, om], alpha, beta)? {
            return Ok(());
        }
        // Row sums are the output's column past its last (the kernels' column of ones).
        let ones_column = fused.row_sums.is_some();
        let with_sums = validate::MatrixView {
            cols: om.cols + usize::from(ones_column),
            ..*om
        };
        let extras = ProductExtras {
            fused,
            ones_column,
            ..Default::default()
        };
        self.matmul_f32(
            [a, b, out],
            [am, bm, &with_sums],
            alpha,
            beta,
            (dot, tile),
            extras,
        )
    }

    /// A product of one `rows x cols` output over a long `k` as `slices` products over
    /// `k / slices` each (a batch, so the tile kernel runs `slices` times as many workgroups),
    /// written to a scratch `[slices, rows, cols]` and summed in slice order into `out`
    /// (beta 0; alpha applied to each slice), each slice's product in `tile`s. The same result
    /// on every run. With row sums the scratch has a column more (`b`'s column of ones), which
    /// the sum pass stores to the row sums; with an epilogue, the sum pass applies it.
    fn matmul_split_k(
        &self,
        [a, b, out]: [V<'_>; 3],
        [am, bm, om]: [&validate::MatrixView; 3],
        alpha: f32,
        (slices, tile): (usize, TileShape),
        fused: Fused<'_>,
    ) -> Result<()> {
        let ks = am.cols / slices;
        let (rows, cols) = (om.rows, om.cols);
        let partial_cols = cols + usize::from(fused.row_sums.is_some());
        let partial = self.scratch(DType::F32, slices * rows * partial_cols)?;
        // Slice s: A's columns and B's rows s ks .. (s + 1) ks.
        let a_slices = validate::MatrixView {
            batch: slices,
            cols: ks,
            strides: [ks as isize * am.strides[2], am.strides[1], am.strides[2]],
            ..*am
        };
        let b_slices = validate::MatrixView {
            batch: slices,
            rows: ks,
            strides: [ks as isize * bm.strides[1], bm.strides[1], bm.strides[2]],
            ..*bm
        };
        let partial_l = Layout::contiguous(&[slices, rows, partial_cols]);
        let p_slices = validate::MatrixView::of(&partial_l);
        // An output narrower than a quarter tile on a side (a convolution's 32 x 9 weight
        // gradient) would leave the tile kernel computing mostly padding: its slices are
        // dot products, where the k strides allow.
        let dot = rows.min(cols) <= SPLIT_DOT_THIN && unit_k_strides(am, bm);
        let extras = ProductExtras {
            fallback_of: None,
            fused: Fused {
                gate: fused.gate,
                ..Default::default()
            },
            ones_column: fused.row_sums.is_some(),
        };
        self.matmul_f32(
            [a, b, View::new(&partial, &partial_l)],
            [&a_slices, &b_slices, &p_slices],
            alpha,
            0.0,
            (dot, tile),
            extras,
        )?;
        // The sum pass: one thread an output element (gemm_sum.wgsl), with or without an
        // epilogue. (`reduce` over the slices' axis, the first form, took 10.2 us against
        // 8.4 for a 256 x 512 output of 8 slices on an H200, under the profiler.)
        self.split_sum(&partial, slices, out.buffer, om, fused)
    }

    /// [`Backend::matmul_epilogue`] as separate calls through f32 scratch buffers (the
    /// default's in-place calls would each copy their operand first here: an elementwise
    /// dispatch may not read and write one buffer). Validated by the caller. With beta, a
    /// gate or row sums, the default's calls.
    fn matmul_epilogue_unfused(
        &self,
        [a, b, out]: [V<'_>; 3],
        alpha: f32,
        beta: f32,
        epilogue: Epilogue<'_, WgpuBuffer>,
    ) -> Result<()> {
        // With beta the product reads `out`: the default's order of calls.
        if beta != 0.0
            || epilogue.is_empty()
            || epilogue.a_gate.is_some()
            || epilogue.a_row_sums.is_some()
        {
            return hal::matmul_epilogue_steps(self, [a, b, out], alpha, beta, epilogue);
        }
        let shape = Layout::contiguous(&out.layout.shape);
        let scratch = || self.scratch(DType::F32, shape.numel().max(1));
        let product = scratch()?;
        let product_view = View::new(&product, &shape);
        self.matmul(a, b, product_view, alpha, 0.0)?;
        match (epilogue.bias, epilogue.activation) {
            (Some(bias), None) => self.binary(BinaryOp::Add, product_view, bias, out),
            (Some(bias), Some(op)) => {
                let sum = scratch()?;
                let sum_view = View::new(&sum, &shape);
                self.binary(BinaryOp::Add, product_view, bias, sum_view)?;
                self.unary(op, sum_view, out)
            }
            (None, Some(op)) => self.unary(op, product_view, out),
            (None, None) => self.copy(product_view, out),
        }
    }

    /// The last pass of a split product (gemm_sum.wgsl): the slices of `partial` (`[slices,
    /// rows, cols]`, contiguous, a column more with row sums) summed in order into `out` and
    /// the row sums, any bias added and activation applied on the way to `out`.
    fn split_sum(
        &self,
        partial: &WgpuBuffer,
        slices: usize,
        out: &WgpuBuffer,
        om: &validate::MatrixView,
        fused: Fused<'_>,
    ) -> Result<()> {
        let (rows, cols) = (om.rows, om.cols);
        let partial_cols = cols + usize::from(fused.row_sums.is_some());
        let out_l = Layout {
            shape: vec![rows, cols],
            strides: vec![om.strides[1], om.strides[2]],
            offset: om.offset,
        };
        // Without a bias, binding 2 is the partials again and the epilogue reads nothing.
        let (bias, bias_l, add_bias) = match fused.bias {
            Some((buffer, layout)) => (buffer, layout, "ld2(off(1u, t))"),
            None => (partial, &out_l, "0.0"),
        };
        let mut p = Params::default().block(&out_l).block(bias_l);
        let expr = match fused.activation {
            Some(op) => {
                p = unary_params(p, op);
                wgsl::unary_expr(op)
            }
            None => "v",
        };
        let mut bindings = wgsl::io(&[DType::F32, bias.dtype()], out.dtype());
        let mut buffers = vec![(partial, false), (bias, false), (out, true)];
        let mut spec = Spec::new("gemm_sum.wgsl").slot(
            "epilogue",
            format!(
                "fn epilogue(sum: f32, t: u32) -> f32 {{\n    let v = sum + {add_bias};\n    return {expr};\n}}"
            ),
        );
        if let Some((sums, sums_l)) = fused.row_sums {
            bindings.push((sums.dtype(), Access::Write));
            buffers.push((sums, true));
            p = p.block(sums_l).scalar(4, partial_cols as u32);
            let (name, text) = wgsl::row_sums_slot();
            spec = spec.slot(name, text);
        }
        let p = p
            .scalar(2, (rows * partial_cols) as u32)
            .scalar(3, slices as u32);
        self.run(spec.bindings(bindings), p, &buffers, rows * partial_cols)
    }

    /// Whether this device's WGSL `fma` rounds once, probed with `(1 + 2^-12)^2 - 1`, whose
    /// unfused result loses the 2^-24 term. The reproducible kernels use `fma` where it is
    /// fused and an exact emulation (fma_exact.wgsl) where it is not.
    fn fma_is_fused(&self) -> Result<bool> {
        if let Some(&fused) = self.0.fma_fused.get() {
            return Ok(fused);
        }
        use hal::BackendExt;
        use hal::ir::{Access as IrAccess, ProgramBuilder};
        let mut p = ProgramBuilder::new("fma_probe");
        let a = p.buffer(DType::F32, IrAccess::Read);
        let y = p.buffer(DType::F32, IrAccess::Write);
        let i = p.index();
        let av = p.load(a, i);
        let minus_one = p.const_f32(-1.0);
        let r = p.fma(av, av, minus_one);
        p.store(y, i, r);
        let kernel = self.compile(&p.build()?)?;
        let x = 1.0f32 + 2f32.powi(-12);
        let (xb, yb) = (self.upload(&[x])?, self.alloc(DType::F32, 1)?);
        self.launch(&kernel, &[&xb, &yb], 1)?;
        let fused = self.read::<f32>(&yb)?[0] == x.mul_add(x, -1.0);
        Ok(*self.0.fma_fused.get_or_init(|| fused))
    }

    /// `nearest_centroid` under [`Precision::Reproducible`] (nearest_ordered.wgsl): the CPU
    /// reference's order of operations, one thread per point, centroids in slices short
    /// enough for lavapipe's loop limit.
    fn nearest_ordered(
        &self,
        x: View<'_, WgpuBuffer>,
        c: View<'_, WgpuBuffer>,
        out_index: View<'_, WgpuBuffer>,
        out_distance: View<'_, WgpuBuffer>,
    ) -> Result<()> {
        // Rank 2, or rank 3 with a leading group axis (see nearest_ordered.wgsl).
        let r = x.layout.rank();
        let groups = hal::numel(&x.layout.shape[..r - 2]);
        let (n, d, m) = (
            x.layout.shape[r - 2],
            x.layout.shape[r - 1],
            c.layout.shape[r - 2],
        );
        if groups * n == 0 {
            return Ok(());
        }
        let fused = self.fma_is_fused()?;
        let slice = (LOOP_BUDGET / d.max(1)).max(1);
        let spec = Spec::new("nearest_ordered.wgsl").bindings(vec![
            (x.dtype(), Access::Read),
            (c.dtype(), Access::Read),
            (DType::U32, Access::Write),
            (DType::F32, Access::Write),
        ]);
        let mut first = 0;
        while first < m {
            let end = (first + slice).min(m);
            let p = nearest_slice_params([x, c, out_index, out_distance], first, end, fused)?;
            self.run(
                spec.clone(),
                p,
                &[
                    (x.buffer, false),
                    (c.buffer, false),
                    (out_index.buffer, true),
                    (out_distance.buffer, true),
                ],
                groups * n,
            )?;
            first = end;
        }
        Ok(())
    }

    /// A batch of searches among short rows (rank-3 views, `d <= 16`; see
    /// nearest_short.wgsl): a workgroup per 256 points of a group.
    fn nearest_short(
        &self,
        [x, c, out_index, out_distance]: [View<'_, WgpuBuffer>; 4],
    ) -> Result<()> {
        let (g, n, m) = (x.layout.shape[0], x.layout.shape[1], c.layout.shape[1]);
        if g * n == 0 {
            return Ok(());
        }
        let pipeline = self.kernel(&Spec::new("nearest_short.wgsl").bindings(vec![
            (x.dtype(), Access::Read),
            (c.dtype(), Access::Read),
            (DType::U32, Access::Write),
            (DType::F32, Access::Write),
        ]))?;
        let fused = self.fma_is_fused()?;
        let p = nearest_slice_params([x, c, out_index, out_distance], 0, m, fused)?;
        self.dispatch_groups(
            &pipeline,
            &p,
            &[
                (x.buffer, false),
                (c.buffer, false),
                (out_index.buffer, true),
                (out_distance.buffer, true),
            ],
            [n.div_ceil(256) as u32, g as u32, 1],
        )
    }

    /// Sums per-part partial results into `sums` and `counts`: `partials` is seen as
    /// `[m, d + 1, parts]` (columns `0..d` the sums, column `d` the weight total), and the
    /// parts are reduced, honouring the index check's `guard`.
    fn sum_segment_partials(
        &self,
        partial: &WgpuBuffer,
        parts_last: &Layout,
        sums: View<'_, WgpuBuffer>,
        counts: View<'_, WgpuBuffer>,
        guard: Guard,
    ) -> Result<()> {
        let d = parts_last.shape[1] - 1;
        let sums_src = parts_last.narrow(1, 0, d)?;
        let counts_src = parts_last.narrow(1, d, 1)?;
        let sums_out = sums.layout.unsqueeze(2)?;
        let counts_out = counts.layout.unsqueeze(1)?.unsqueeze(2)?;
        self.reduce_chunked(
            ReduceOp::Sum,
            View::new(partial, &sums_src),
            &[2],
            View::new(sums.buffer, &sums_out),
            1.0,
            Some(guard),
        )?;
        self.reduce_chunked(
            ReduceOp::Sum,
            View::new(partial, &counts_src),
            &[2],
            View::new(counts.buffer, &counts_out),
            1.0,
            Some(guard),
        )
    }

    /// `segment_sum` for many segments: a stable counting sort of the rows by segment
    /// (segment_count, segment_offsets, segment_starts, segment_place .wgsl), then each
    /// segment's rows summed in order in parts (segment_gather.wgsl) and the parts
    /// summed by the reduction. Deterministic, no atomics, O(n d + chunks m) work.
    #[allow(clippy::too_many_arguments)]
    fn segment_sum_sorted(
        &self,
        x: View<'_, WgpuBuffer>,
        segment: View<'_, WgpuBuffer>,
        weights: Option<View<'_, WgpuBuffer>>,
        sums: View<'_, WgpuBuffer>,
        counts: View<'_, WgpuBuffer>,
        guard: Guard,
    ) -> Result<()> {
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
        // Each segment's rows are summed in parts: several for long segments (a GPU gets
        // enough threads from 16); segments of a few rows on average (the residual codes'
        // 4,096 of about 40) whole, where parts of two or three rows and the reduction over
        // them would cost more than the sums. On a software rasteriser a part must also keep
        // one thread's loop under lavapipe's cap even if every row falls in one segment.
        let capped = !self.info().kind.is_hardware_gpu();
        let parts_needed = if capped { n.div_ceil(LOOP_BUDGET) } else { 1 };
        let parts = if n <= m * WHOLE_SEGMENT_ROWS {
            parts_needed
        } else {
            parts_needed.max(16)
        };
        // Chunks of at least 2,048 rows (eight tiles of segment_place's workgroup), at most
        // LOOP_BUDGET of them (the offsets pass loops over chunks), and few enough that the
        // per-chunk counts (chunks x m words) stay within 16M words.
        let rows = 2048
            .max(n.div_ceil(LOOP_BUDGET))
            .max(((n as u64 * m as u64) >> 24) as usize + 1);
        let chunks = n.div_ceil(rows).max(1);
        let u32s = |len: usize| self.scratch(DType::U32, len);
        let per_chunk = u32s(chunks * m)?;
        self.fill(
            View::new(&per_chunk, &Layout::contiguous(&[chunks * m])),
            0.0,
        )?;
        let sorting = Params::default()
            .block(segment.layout)
            .scalar(0, n as u32)
            .scalar(1, m as u32)
            .scalar(2, rows as u32)
            .scalar(3, chunks as u32);
        self.run_guarded(
            Spec::new("segment_count.wgsl"),
            sorting.clone(),
            &[(segment.buffer, false), (&per_chunk, true)],
            n,
            Some(guard),
        )?;
        let totals = u32s(m)?;
        let u = DType::U32;
        self.run(
            Spec::new("segment_offsets.wgsl")
                .bindings(vec![(u, Access::Write), (u, Access::Write)]),
            sorting.clone(),
            &[(&per_chunk, true), (&totals, true)],
            m,
        )?;
        let starts = u32s(m)?;
        self.dispatch_groups(
            &self.kernel(&Spec::new("segment_starts.wgsl"))?,
            &sorting,
            &[(&totals, false), (&starts, true)],
            [1, 1, 1],
        )?;
        let order = u32s(n.max(1))?;
        let (place, params, buffers) = self.guarded(
            Spec::new("segment_place.wgsl"),
            sorting,
            &[
                (segment.buffer, false),
                (&starts, false),
                (&per_chunk, true),
                (&order, true),
            ],
            guard,
        );
        self.dispatch_groups(
            &self.kernel(&place)?,
            &params,
            &buffers,
            [chunks as u32, 1, 1],
        )?;
        let (w, wl) = weight_binding(x, weights)?;
        let partial = self.scratch(DType::F32, m * parts * (d + 1))?;
        self.run(
            Spec::new("segment_gather.wgsl").bindings(vec![
                (x.dtype(), Access::Read),
                (w.dtype(), Access::Read),
                (u, Access::Read),
                (u, Access::Read),
                (u, Access::Read),
                (DType::F32, Access::Write),
            ]),
            Params::default()
                .block(&wl)
                .scalar(1, d as u32)
                .matrix(3, x.layout)
                .scalar(6, parts as u32)
                .scalar(7, weights.is_some() as u32),
            &[
                (x.buffer, false),
                (w, false),
                (&starts, false),
                (&totals, false),
                (&order, false),
                (&partial, true),
            ],
            m * parts * (d + 1),
        )?;
        let parts_last = Layout::contiguous(&[m, parts, d + 1]).permute(&[0, 2, 1])?;
        self.sum_segment_partials(&partial, &parts_last, sums, counts, guard)
    }

    /// Whether segment_scan.wgsl takes a segment sum: segments times rows within
    /// [`SCAN_SEGMENTS_TIMES_ROWS`], and, since its per-thread loops run over all of a
    /// segment's rows, on a software rasteriser (loops capped) only within the loop budget.
    fn scan_fits(&self, n: usize, m: usize, d: usize) -> bool {
        let capped = !self.info().kind.is_hardware_gpu();
        (m as u64) * (n as u64) <= SCAN_SEGMENTS_TIMES_ROWS
            && d < 1024
            && (!capped || n <= LOOP_BUDGET)
    }

    /// `segment_sum` in the reproducible order (each segment's rows ascending, a correctly
    /// rounded fused multiply-add per term) into `[m, d + 1]` accumulators, then copied into
    /// `sums` and `counts` by the pass that honours the index check's guard (a sum over an
    /// axis of length 1, exact). Small sums in one dispatch (segment_scan.wgsl: a workgroup
    /// per segment scans every id for its rows; outside Precision::Reproducible it adds in
    /// compensated runs instead, for accuracy on long segments); otherwise
    /// segment_sum_ordered.wgsl, one thread per (segment, column), in row ranges short enough
    /// for lavapipe's loop limit.
    fn segment_sum_ordered(
        &self,
        x: View<'_, WgpuBuffer>,
        segment: View<'_, WgpuBuffer>,
        weights: Option<View<'_, WgpuBuffer>>,
        sums: View<'_, WgpuBuffer>,
        counts: View<'_, WgpuBuffer>,
        guard: Guard,
    ) -> Result<()> {
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
        let (w, wl) = weight_binding(x, weights)?;
        let fused = self.fma_is_fused()?;
        let acc = self.scratch(DType::F32, m * (d + 1))?;
        let bindings = wgsl::io(&[x.dtype(), DType::U32, w.dtype()], DType::F32);
        let buffers = [
            (x.buffer, false),
            (segment.buffer, false),
            (w, false),
            (&acc, true),
        ];
        let params = Params::default()
            .block(segment.layout)
            .block(&wl)
            .scalar(1, d as u32)
            .matrix(3, x.layout)
            .scalar(7, weights.is_some() as u32)
            .scalar(11, fused as u32);
        if self.scan_fits(n, m, d) {
            let pipeline = self.kernel(&Spec::new("segment_scan.wgsl").bindings(bindings))?;
            let max = self.0.limits.max_compute_workgroups_per_dimension as usize;
            self.dispatch_groups(
                &pipeline,
                &params
                    .scalar(0, n as u32)
                    .scalar(2, m as u32)
                    .scalar(13, (self.1 != Precision::Reproducible) as u32),
                &buffers,
                [m.min(max) as u32, m.div_ceil(max) as u32, 1],
            )?;
        } else {
            let spec = Spec::new("segment_sum_ordered.wgsl").bindings(bindings);
            let mut first = 0;
            loop {
                let end = (first + LOOP_BUDGET).min(n);
                let p = params
                    .clone()
                    .scalar(0, end as u32)
                    .scalar(8, first as u32)
                    .scalar(9, (first > 0) as u32);
                self.run(spec.clone(), p, &buffers, m * (d + 1))?;
                first = end;
                if first >= n {
                    break;
                }
            }
        }
        let parts_last = Layout::contiguous(&[m, d + 1, 1]);
        self.sum_segment_partials(&acc, &parts_last, sums, counts, guard)
    }

    /// Copies all of `src` into `dst` (same dtype and length) with the device's own buffer
    /// copy: no kernel, no view arithmetic. The bench uses it as the device's copy bandwidth.
    pub fn copy_whole_buffer(&self, src: &WgpuBuffer, dst: &WgpuBuffer) -> Result<()> {
        if src.dtype() != dst.dtype() || src.len() != dst.len() {
            return Err(Error::InvalidArgument {
                op: "copy_whole_buffer",
                detail: format!("{src:?} and {dst:?} differ"),
            });
        }
        let copy = capture::Command::Copy {
            src: src.0.buffer.clone(),
            dst: dst.0.buffer.clone(),
            bytes: src.0.buffer.size(),
        };
        self.transfer(&mut self.lock_batch(), copy, &[src, dst]);
        Ok(())
    }

    fn lock_batch(&self) -> std::sync::MutexGuard<'_, Batch> {
        lock(&self.0.batch)
    }

    /// Submits the batch's commands, if any.
    fn submit_batch(&self, batch: &mut Batch) {
        batch.pass = None;
        if let Some(encoder) = batch.encoder.take() {
            batch.commands = 0;
            batch.grow();
            self.0.queue.submit([encoder.finish()]);
        }
    }

    /// Submits every command encoded so far.
    fn flush(&self) {
        self.submit_batch(&mut self.lock_batch());
    }

    /// Writes `bytes` into `buffer` through the queue, after every command encoded so far.
    /// (Also inside a recording, where it happens once, when recording: the poison of
    /// `poison_for_write`, whose buffer nothing else uses yet.)
    fn write_after_batch(&self, buffer: &wgpu::Buffer, bytes: &[u8]) {
        let mut batch = self.lock_batch();
        self.submit_batch(&mut batch);
        self.0.queue.write_buffer(buffer, 0, bytes);
    }

    /// Whether a recording is under way (see [`capture`]). Takes the batch's lock: never call
    /// it holding that.
    fn capturing(&self) -> bool {
        self.lock_batch().capture.is_some()
    }

    /// `hal`'s contract for capturing backends: no waits, reads or queue writes inside a
    /// recording (they would happen once, when recording, rather than at each replay).
    fn refuse_in_capture(&self, op: &'static str) -> Result<()> {
        if self.capturing() {
            return Err(Error::inside_recording(op));
        }
        Ok(())
    }

    /// Appends a copy or clear (not a dispatch) to the batch, or to the capture under way,
    /// which then holds `buffers`.
    fn transfer(&self, batch: &mut Batch, command: capture::Command, buffers: &[&WgpuBuffer]) {
        if let Some(c) = batch.capture.as_mut() {
            c.keep(buffers.iter().copied());
        }
        self.encode_command(batch, None, &command);
    }

    /// Appends one command to the batch (see [`Batch`]), or inside a recording to the capture
    /// (a dispatch filed under the profile name it would have now; the caller has the capture
    /// hold its buffers).
    fn encode_command(
        &self,
        batch: &mut Batch,
        profiler: Option<&mut profile::Profiler>,
        command: &capture::Command,
    ) {
        if let Some(c) = batch.capture.as_mut() {
            let mut kept = command.clone();
            if let capture::Command::Dispatch { kernel, name, .. } = &mut kept
                && name.is_none()
            {
                *name = profiler.map(|p| p.name_of(&kernel.name));
            }
            c.commands.push(kept);
            return;
        }
        match command {
            capture::Command::Dispatch {
                kernel,
                group,
                words,
                groups,
                name,
            } => self.encode_dispatch(
                batch,
                profiler,
                (kernel, name.as_deref()),
                group,
                words,
                *groups,
            ),
            capture::Command::Copy { src, dst, bytes } => {
                self.encode_locked(batch, |e| e.copy_buffer_to_buffer(src, 0, dst, 0, *bytes))
            }
            capture::Command::Clear(b) => self.encode_locked(batch, |e| e.clear_buffer(b, 0, None)),
            capture::Command::ClearWord { buffer, word } => {
                self.encode_locked(batch, |e| e.clear_buffer(buffer, *word as u64 * 4, Some(4)))
            }
        }
    }

    /// Notes that the fault record may be written by what was just encoded or captured, so
    /// the next synchronize or read checks it.
    fn faults_may_be_written(&self) {
        self.0
            .faults_unread
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(c) = self.lock_batch().capture.as_mut() {
            c.writes_faults = true;
        }
    }

    /// Encodes `commands` in order (one lock of the batch for all of them unless profiling,
    /// whose read-backs need it in between).
    fn encode_commands<'a>(
        &self,
        commands: impl IntoIterator<Item = &'a capture::Command>,
    ) -> Result<()> {
        if self.0.profiler.is_none() {
            let mut batch = self.lock_batch();
            for command in commands {
                self.encode_command(&mut batch, None, command);
            }
            return Ok(());
        }
        for command in commands {
            self.make_room_in_profile()?;
            let mut profiler = self.0.profiler.as_ref().map(lock);
            let mut batch = self.lock_batch();
            self.encode_command(&mut batch, profiler.as_deref_mut(), command);
        }
        Ok(())
    }

    fn encode_locked(&self, batch: &mut Batch, command: impl FnOnce(&mut wgpu::CommandEncoder)) {
        batch.pass = None;
        command(batch.encoder(&self.0.device));
        batch.commands += 1;
        if batch.full() {
            self.submit_batch(batch);
        }
    }

    /// Under `HAL_WGPU_PROFILE` (see the `profile` module): waits for the device, returns the GPU time
    /// per kernel since the last call divided by `runs`, and starts the totals afresh.
    /// `None` when not profiling.
    pub fn take_profile(&self, runs: usize) -> Result<Option<String>> {
        let Some(profiler) = &self.0.profiler else {
            return Ok(None);
        };
        self.synchronize()?;
        let mut p = lock(profiler);
        let report = p.take_report(runs);
        Ok(Some(report))
    }

    /// What modules are composed for on this device.
    fn module_features(&self) -> wgsl::Features {
        wgsl::Features {
            immediate_words: self.0.immediate_words,
            native_f16: self.0.features.contains(wgpu::Features::SHADER_F16),
            subgroups: self.0.features.contains(wgpu::Features::SUBGROUP),
            cooperative_matrix: self.0.coop.is_some(),
            fused_fma: self.0.fma_fused.get().copied(),
        }
    }

    /// The optional adapter features this device uses (see [`WgpuOptions`]), for reports.
    /// Sets the tiling of single-pass cooperative-matrix products (for tuning runs);
    /// `false` where the device has no cooperative matrices.
    pub fn set_coop_tiles(&self, tiles: coop::CoopTiles) -> bool {
        match &self.0.coop {
            Some(t) => {
                *lock(t) = tiles;
                true
            }
            None => false,
        }
    }

    pub fn features_in_use(&self) -> String {
        let mut used = Vec::new();
        if self.0.immediate_words > 0 {
            used.push(format!("immediates ({} words)", self.0.immediate_words));
        }
        if self.0.features.contains(wgpu::Features::SHADER_F16) {
            used.push("shader-f16".to_string());
        }
        if self.0.features.contains(wgpu::Features::SUBGROUP) {
            used.push("subgroups".to_string());
        }
        if self.0.coop.is_some() {
            used.push("cooperative matrices (16x16x16 f16, f32 accumulation)".to_string());
        }
        if used.is_empty() {
            "none (fallbacks only)".into()
        } else {
            used.join(", ")
        }
    }

    /// The largest buffer a kernel can bind, in bytes.
    pub fn max_binding_bytes(&self) -> u64 {
        self.0
            .limits
            .max_storage_buffer_binding_size
            .min(self.0.limits.max_buffer_size)
    }

    /// A buffer of `len` elements whose contents are unspecified (from the pool when one of its
    /// size class is free: then the flag is true). Checks the size against the adapter.
    fn pooled_buffer(&self, dtype: DType, len: usize) -> Result<(WgpuBuffer, bool)> {
        let bytes = len as u128 * dtype.size_in_bytes() as u128;
        let limit = self.max_binding_bytes();
        if bytes > limit as u128 {
            return Err(Error::AllocationTooLarge {
                requested_bytes: bytes,
                limit_bytes: limit,
                what: format!(
                    "{len} elements of {dtype}; the adapter's largest storage binding (max_storage_buffer_binding_size) is {limit} bytes"
                ),
            });
        }
        let size = Pool::class(bytes as u64, limit);
        let reused = lock(&self.0.pool).take(size);
        let fresh = reused.is_none();
        let buffer = match reused {
            Some(b) => b,
            None => {
                let d = &self.0.device;
                let scope = d.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
                let buffer = self.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                if pollster::block_on(scope.pop()).is_some() {
                    return Err(Error::OutOfMemory {
                        requested_bytes: bytes,
                    });
                }
                buffer
            }
        };
        let inner = BufferInner {
            buffer,
            dtype,
            len,
            pool: self.0.pool.clone(),
        };
        Ok((WgpuBuffer(Arc::new(inner)), !fresh))
    }

    /// Runs `f` with profiles filing its dispatches under `label()` (only when profiling,
    /// and only outside another labelled call, whose label the inner dispatches keep).
    fn labelled(
        &self,
        label: impl FnOnce() -> String,
        f: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let Some(profiler) = &self.0.profiler else {
            return f();
        };
        if !lock(profiler).set_label_if_none(label) {
            return f();
        }
        let result = f();
        lock(profiler).set_label(None);
        result
    }

    /// Scratch space a kernel overwrites completely (partials, unused dummies): no clearing.
    fn scratch(&self, dtype: DType, len: usize) -> Result<WgpuBuffer> {
        Ok(self.pooled_buffer(dtype, len)?.0)
    }

    /// For tests of code that allocates with `alloc_for_write`: from now on (on every clone of
    /// this handle) such buffers start as all-ones bits, NaN in every float dtype, so that an
    /// element the next call fails to write shows up instead of passing as a leftover zero.
    pub fn poison_for_write(&self, on: bool) {
        self.0
            .poison_for_write
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Storage buffers created since the backend was opened (allocations, scratch, staging
    /// copies of aliased operands); those served from the pool are not counted, nor are the
    /// staging buffers of read-backs the caller asks for. A steady-state loop that frees what
    /// it allocates leaves this unchanged.
    pub fn buffers_created(&self) -> u64 {
        self.0
            .buffers_created
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every storage buffer after construction is made here (through the pool), so
    /// [`Self::buffers_created`] counts them all.
    fn create_buffer(&self, desc: &wgpu::BufferDescriptor<'_>) -> wgpu::Buffer {
        self.0
            .buffers_created
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.device.create_buffer(desc)
    }

    /// Compiles WGSL into a pipeline; a validation error is returned with the validator's
    /// report and the shader file and line it points at.
    ///
    /// `built_in`: one of this crate's kernels, compiled without the checks naga would
    /// otherwise inject: a clamp on every workgroup-array index and an iteration counter in
    /// every loop, which together cost about a quarter of the GEMM's inner loop. That is sound
    /// because every loop in `shaders/` runs to a bound read from the launch parameters, every
    /// workgroup-array index is in range by construction, and buffer accesses stay inside the
    /// views `hal::validate` accepted on the host, with indices read from buffers checked on
    /// the device first (a guarded kernel skips its work after a failed check); on Vulkan the driver's
    /// robust buffer access still bounds buffer accesses. Integer division keeps its guard. IR
    /// programs, which users write, keep every check.
    fn build_pipeline(
        &self,
        label: &str,
        code: &wgsl::Module,
        built_in: bool,
        immediate_words: u32,
        spec: Option<Spec>,
    ) -> Result<Arc<Kernel>> {
        let d = &self.0.device;
        let scope = d.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(code.source.as_str().into()),
        };
        let module = if built_in {
            let mut checks = wgpu::ShaderRuntimeChecks::checked();
            checks.bounds_checks = false;
            checks.force_loop_bounding = false;
            // SAFETY: see above: the crate's own kernels have bounded loops and in-range
            // indices; only those two checks are dropped.
            unsafe { d.create_shader_module_trusted(desc, checks) }
        } else {
            d.create_shader_module(desc)
        };
        let pipeline = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            let report = e.to_string();
            // The report points at `wgsl:LINE:COLUMN` of the composed module.
            let at = report
                .split("wgsl:")
                .nth(1)
                .and_then(|r| r.split(':').next()?.parse::<usize>().ok())
                .map(|line| {
                    let (file, line) = code.locate(line);
                    format!(" (at {file} line {line})")
                })
                .unwrap_or_default();
            return Err(backend_error(format!(
                "shader `{label}` failed to compile{at}: {report}"
            )));
        }
        let name = match &spec {
            Some(s) => s.file.to_string(),
            None => format!("ir:{label}"),
        };
        Ok(Arc::new(Kernel {
            layout: pipeline.get_bind_group_layout(0),
            pipeline,
            immediate_words,
            spec,
            name,
        }))
    }

    /// Runs `threads` invocations of the kernel (workgroups of [`wgsl::WORKGROUP`], each
    /// invocation handling `params.per_thread` elements) with `params` at binding 0 and
    /// `buffers` at 1.. (`true` marks a buffer the kernel writes).
    fn dispatch(
        &self,
        kernel: &Arc<Kernel>,
        params: &Params,
        buffers: &[(&WgpuBuffer, bool)],
        threads: usize,
    ) -> Result<()> {
        if threads == 0 {
            return Ok(());
        }
        let threads = u32::try_from(threads).map_err(|_| Error::InvalidArgument {
            op: "dispatch",
            detail: format!("{threads} threads exceed 2^32"),
        })?;
        let groups = threads.div_ceil(wgsl::WORKGROUP * params.per_thread.max(1));
        let max = self.0.limits.max_compute_workgroups_per_dimension.max(1);
        self.submit(
            kernel,
            params,
            threads,
            buffers,
            [groups.min(max), groups.div_ceil(max), 1],
        )
    }

    /// [`Self::dispatch`] for kernels that index their own workgroup grid (`P[0]` is 0).
    fn dispatch_groups(
        &self,
        kernel: &Arc<Kernel>,
        params: &Params,
        buffers: &[(&WgpuBuffer, bool)],
        groups: [u32; 3],
    ) -> Result<()> {
        let max = self.0.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::InvalidArgument {
                op: "dispatch",
                detail: format!("{groups:?} workgroups exceed the adapter's {max} per dimension"),
            });
        }
        self.submit(kernel, params, 0, buffers, groups)
    }

    /// Encodes and submits one dispatch. A read-only buffer that is also written in the same
    /// call is copied first: wgpu forbids binding one buffer both ways.
    fn submit(
        &self,
        kernel: &Arc<Kernel>,
        params: &Params,
        threads: u32,
        buffers: &[(&WgpuBuffer, bool)],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let mut words = params.encode(threads);
        let immediates = kernel.immediate_words as usize;
        if immediates > 0 && words.len() > immediates {
            // Too many parameters (high-rank views) for the immediate block: the variant
            // that reads them from binding 0.
            let spec = kernel.spec.as_ref().ok_or_else(|| {
                backend_error(format!(
                    "{} words of launch parameters exceed the {immediates} immediates",
                    words.len()
                ))
            })?;
            let fallback = self.kernel_variant(spec, 0)?;
            return self.submit(&fallback, params, threads, buffers, groups);
        }
        if words.len() as u64 * 4 > PARAMS_BYTES {
            return Err(Error::InvalidArgument {
                op: "dispatch",
                detail: format!(
                    "{} bytes of launch parameters exceed {PARAMS_BYTES}",
                    words.len() * 4
                ),
            });
        }
        // Copies come from the pool (same dtype and length, so the same size class) and go
        // back to it once this call returns: queue order keeps them intact until the dispatch
        // has read them.
        let mut copies: Vec<Option<WgpuBuffer>> = Vec::with_capacity(buffers.len());
        for (i, &(b, _)) in buffers.iter().enumerate() {
            copies.push(if read_and_written(buffers, i) {
                Some(self.scratch(b.dtype(), b.len())?)
            } else {
                None
            });
        }
        let bound: Vec<&wgpu::Buffer> = buffers
            .iter()
            .zip(&copies)
            .map(|(&(b, _), copy)| copy.as_ref().map_or(&b.0.buffer, |c| &c.0.buffer))
            .collect();
        let capturing = self.capturing();
        // Binding 0: the shared parameter buffer, or inside a recording one of the dispatch's
        // own (the shared one is rewritten before every such dispatch, which a replay cannot).
        let own_params = match capturing && immediates == 0 {
            true => Some(self.params_buffer(&words)?),
            false => None,
        };
        let params_binding = (immediates == 0).then(|| {
            let buffer = own_params.as_ref().unwrap_or(&self.0.params);
            (buffer, words.len())
        });
        let group = self.bind_group(kernel, params_binding, &bound);
        self.make_room_in_profile()?;
        // Taken before the batch, as in read_profile.
        let mut profiler = self.0.profiler.as_ref().map(lock);
        let mut batch = self.lock_batch();
        if let Some(c) = batch.capture.as_mut() {
            c.keep(
                buffers
                    .iter()
                    .map(|&(b, _)| b)
                    .chain(copies.iter().flatten()),
            );
        }
        let shared_params = immediates == 0 && !capturing;
        if shared_params {
            // The shared parameter buffer: what came before is submitted first (the write
            // would land ahead of it), and this dispatch right after (the next write would
            // land ahead of it).
            self.submit_batch(&mut batch);
            self.0
                .queue
                .write_buffer(&self.0.params, 0, bytemuck::cast_slice(&words));
        }
        for (&(b, _), copy) in buffers.iter().zip(&copies) {
            if let Some(tmp) = copy {
                let copy = capture::Command::Copy {
                    src: b.0.buffer.clone(),
                    dst: tmp.0.buffer.clone(),
                    bytes: b.0.buffer.size(),
                };
                self.transfer(&mut batch, copy, &[]);
            }
        }
        if immediates > 0 {
            // The shader declares the whole block; every word must be set.
            words.resize(immediates, 0);
        }
        let dispatch = capture::Command::Dispatch {
            kernel: kernel.clone(),
            group,
            words,
            groups,
            name: None,
        };
        self.encode_command(&mut batch, profiler.as_deref_mut(), &dispatch);
        if shared_params {
            self.submit_batch(&mut batch);
        }
        Ok(())
    }

    /// A parameter buffer of one dispatch, holding `words` (made without the queue, so it may
    /// be made inside a recording).
    fn params_buffer(&self, words: &[u32]) -> Result<wgpu::Buffer> {
        let buffer = self.0.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("captured launch parameters"),
            size: (words.len() as u64 * 4).max(4),
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: true,
        });
        {
            let mut view = buffer
                .slice(..)
                .get_mapped_range_mut()
                .map_err(backend_error)?;
            view.slice(..words.len() * 4)
                .copy_from_slice(bytemuck::cast_slice(words));
        }
        buffer.unmap();
        Ok(buffer)
    }

    /// `kernel`'s bind group: `buffers` at bindings 1.., and with `params`, that many words of
    /// that parameter buffer at binding 0.
    fn bind_group(
        &self,
        kernel: &Kernel,
        params: Option<(&wgpu::Buffer, usize)>,
        buffers: &[&wgpu::Buffer],
    ) -> wgpu::BindGroup {
        let params = params.map(|(buffer, words)| wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: 0,
                size: std::num::NonZeroU64::new(words as u64 * 4),
            }),
        });
        let entries: Vec<wgpu::BindGroupEntry<'_>> = params
            .into_iter()
            .chain(
                buffers
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: b.as_entire_binding(),
                    }),
            )
            .collect();
        self.0.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &kernel.layout,
            entries: &entries,
        })
    }

    /// Reads the profile's timestamps back when another dispatch's would not fit (never
    /// inside a recording, which times nothing: its replays are timed).
    fn make_room_in_profile(&self) -> Result<()> {
        if !self.capturing() && self.0.profiler.as_ref().is_some_and(|p| lock(p).full()) {
            self.read_profile()?;
        }
        Ok(())
    }

    /// Encodes one dispatch into the batch (under a profiler, in a pass of its own timed at both
    /// ends, filed under `name` where given), submitting the batch when it is full.
    fn encode_dispatch(
        &self,
        batch: &mut Batch,
        profiler: Option<&mut profile::Profiler>,
        (kernel, name): (&Arc<Kernel>, Option<&str>),
        group: &wgpu::BindGroup,
        words: &[u32],
        groups: [u32; 3],
    ) {
        let timed = profiler.is_some();
        if let Some(profiler) = profiler {
            batch.pass = None;
            let name = name.map_or_else(|| profiler.name_of(&kernel.name), str::to_string);
            let writes = profiler.next(name);
            let pass = batch
                .encoder(&self.0.device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(writes),
                })
                .forget_lifetime();
            batch.pass = Some(pass);
        }
        let pass = batch.pass(&self.0.device);
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, group, &[]);
        if kernel.immediate_words > 0 {
            pass.set_immediates(0, bytemuck::cast_slice(words));
        }
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        if timed {
            batch.pass = None;
        }
        batch.commands += 1;
        if batch.full() {
            self.submit_batch(batch);
        }
    }

    /// A dispatch of `spec` over `groups` workgroups made ready to encode many times without
    /// building its bind group again: `None` where the kernel reads its parameters from the
    /// shared binding 0 (no immediates, or too many words for them) or a buffer would have to
    /// be copied first (bound both to read and to write).
    fn prepare(
        &self,
        spec: &Spec,
        params: &Params,
        buffers: &[(&WgpuBuffer, bool)],
        groups: [u32; 3],
    ) -> Result<Option<Prepared>> {
        let kernel = self.kernel(spec)?;
        let immediates = kernel.immediate_words as usize;
        let mut words = params.encode(0);
        let aliased = (0..buffers.len()).any(|i| read_and_written(buffers, i));
        if immediates == 0 || words.len() > immediates || aliased {
            return Ok(None);
        }
        words.resize(immediates, 0);
        let bound: Vec<&wgpu::Buffer> = buffers.iter().map(|&(b, _)| &b.0.buffer).collect();
        let group = self.bind_group(&kernel, None, &bound);
        Ok(Some(Prepared {
            dispatch: capture::Command::Dispatch {
                kernel,
                group,
                words,
                groups,
                name: None,
            },
            buffers: buffers.iter().map(|&(b, _)| b.clone()).collect(),
        }))
    }

    /// Encodes `sequence` `times` times over, in order.
    fn encode_repeated(&self, sequence: &[Prepared], times: usize) -> Result<()> {
        if let Some(c) = self.lock_batch().capture.as_mut() {
            c.keep(sequence.iter().flat_map(|p| &p.buffers));
        }
        self.encode_commands((0..times).flat_map(|_| sequence.iter().map(|p| &p.dispatch)))
    }

    /// The pipeline of `spec`, compiled on first use, taking its parameters as immediates
    /// where the device can.
    fn kernel(&self, spec: &Spec) -> Result<Arc<Kernel>> {
        self.kernel_variant(spec, self.0.immediate_words)
    }

    /// The pipeline of `spec` with `immediate_words` words of immediates (0: parameters in
    /// binding 0). The cache key is the spec itself and the variant, so two calls share a
    /// pipeline exactly when they would compose the same WGSL.
    fn kernel_variant(&self, spec: &Spec, immediate_words: u32) -> Result<Arc<Kernel>> {
        // Looked up by the spec itself: formatting it per dispatch cost more than the lookup.
        let key = (spec.clone(), immediate_words);
        let cached = lock(&self.0.pipelines).get(&key).cloned();
        if let Some(p) = cached {
            return Ok(p);
        }
        if wgsl::uses_fma_exact(spec.file) {
            // Probed first, so the module has no run-time test between fma() and its
            // emulation (see fma_exact.wgsl).
            self.fma_is_fused()?;
        }
        let features = wgsl::Features {
            immediate_words,
            ..self.module_features()
        };
        let module = wgsl::compose(
            spec.file,
            spec.bindings.as_deref(),
            &spec.slots,
            spec.entry,
            features,
        );
        let label = format!("{spec:?} immediates {immediate_words}");
        let p = self.build_pipeline(&label, &module, true, immediate_words, Some(spec.clone()))?;
        lock(&self.0.pipelines).insert(key, p.clone());
        Ok(p)
    }

    /// Compiles (once) and runs the `fn kernel(t)` file of `spec` over `threads` elements
    /// (several per invocation under the contiguous entry).
    fn run(
        &self,
        spec: Spec,
        params: Params,
        buffers: &[(&WgpuBuffer, bool)],
        threads: usize,
    ) -> Result<()> {
        let kernel = self.kernel(&spec)?;
        let params = Params {
            per_thread: match spec.entry {
                Entry::Contiguous | Entry::ContiguousPairs => wgsl::PER_THREAD,
                Entry::Strided => 1,
            },
            ..params
        };
        // Pairs: one thread step per output word.
        let threads = if spec.entry == Entry::ContiguousPairs {
            threads / 2
        } else {
            threads
        };
        self.dispatch(&kernel, &params, buffers, threads)
    }

    /// Reads the timestamps of the dispatches timed since the last call into the profile's
    /// totals (see [`profile`]); nothing without `HAL_WGPU_PROFILE`.
    fn read_profile(&self) -> Result<()> {
        let Some(profiler) = &self.0.profiler else {
            return Ok(());
        };
        let mut profiler = lock(profiler);
        let timed = profiler.pending_dispatches();
        if timed == 0 {
            return Ok(());
        }
        let bytes = self.read_back(timed as u64 * 16, |e, staging| profiler.resolve(e, staging))?;
        profiler.add(timed, &bytemuck::pod_collect_to_vec::<u8, u64>(&bytes));
        Ok(())
    }

    /// Records `copy` into a new `MAP_READ` buffer of `size` bytes after everything encoded so
    /// far, submits it with them, and returns the buffer's contents once the device is done.
    fn read_back(
        &self,
        size: u64,
        copy: impl FnOnce(&mut wgpu::CommandEncoder, &wgpu::Buffer),
    ) -> Result<Vec<u8>> {
        self.refuse_in_capture("read_bytes")?;
        let staging = self.0.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        {
            let mut batch = self.lock_batch();
            self.encode_locked(&mut batch, |e| copy(e, &staging));
            self.submit_batch(&mut batch);
        }
        let slice = staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.0
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(backend_error)?;
        self.lock_batch().limit = 0;
        rx.recv().map_err(backend_error)?.map_err(backend_error)?;
        let bytes = slice.get_mapped_range().map_err(backend_error)?.to_vec();
        staging.unmap();
        Ok(bytes)
    }

    fn read_words(&self, buffer: &wgpu::Buffer) -> Result<Vec<u8>> {
        let size = buffer.size();
        self.read_back(size, |e, staging| {
            e.copy_buffer_to_buffer(buffer, 0, staging, 0, size)
        })
    }

    fn check_deferred(&self) -> Result<()> {
        if let Some(e) = lock(&self.0.deferred).take() {
            return Err(backend_error(e));
        }
        // One read of the shared fault record, and only when an IR launch may have written it.
        if self
            .0
            .faults_unread
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            let w: Vec<u32> =
                bytemuck::pod_collect_to_vec(&self.read_words(&self.0.faults.0.buffer)?);
            if w[0] != 0 {
                self.write_after_batch(&self.0.faults.0.buffer, &[0u8; 16]);
                return Err(
                    fault_error("wgpu", [w[0], w[1], w[2], w[3]]).expect("the record is claimed")
                );
            }
        }
        Ok(())
    }

    /// A fresh verdict word and serial for an index check.
    fn next_guard(&self) -> Guard {
        use std::sync::atomic::Ordering::Relaxed;
        let mut serial = self.0.check_serial.fetch_add(1, Relaxed);
        if serial == 0 {
            // 0 is what unused verdict words hold: never a serial.
            serial = self.0.check_serial.fetch_add(1, Relaxed);
        }
        let word = serial % VERDICT_WORDS;
        if self.capturing() {
            // Each replay repeats the serial: its check must not find the verdict of the
            // replay before.
            let clear = capture::Command::ClearWord {
                buffer: self.0.verdicts.0.buffer.clone(),
                word,
            };
            self.transfer(&mut self.lock_batch(), clear, &[]);
        }
        Guard { word, serial }
    }

    /// Checks on the device that every index of `index` lies in `0..bound`, without waiting:
    /// a bad one is reported by the next synchronize or read (as [`Error::IndexOutOfRange`]
    /// naming `op`), and the kernel run with the returned guard writes nothing.
    fn check_indices(&self, op: &'static str, index: V<'_>, bound: usize) -> Result<Guard> {
        let p = Params::default()
            .block(index.layout)
            .scalar(0, bound.min(u32::MAX as usize) as u32)
            .scalar(1, fault_code(op, index_fault(index.dtype())));
        self.run_check(
            Spec::new("check_index.wgsl"),
            p,
            &[index.buffer],
            index.layout.numel(),
        )
    }

    /// Runs a check kernel (`check_*.wgsl`) over `inputs`, with the verdict words and the
    /// fault record bound after them and its verdict word and serial in scalars 14 and 15 (the
    /// slots the guarded kernel reads them from).
    fn run_check(
        &self,
        spec: Spec,
        params: Params,
        inputs: &[&WgpuBuffer],
        threads: usize,
    ) -> Result<Guard> {
        let guard = self.next_guard();
        let params = params.scalar(14, guard.word).scalar(15, guard.serial);
        let mut buffers: Vec<(&WgpuBuffer, bool)> = inputs.iter().map(|&b| (b, false)).collect();
        buffers.push((&self.0.verdicts, true));
        buffers.push((&self.0.faults, true));
        self.run(spec, params, &buffers, threads)?;
        self.faults_may_be_written();
        Ok(guard)
    }

    /// [`Self::run`] for a kernel with a `guard` slot: with a guard, it reads the verdict of
    /// that index check (bound after `buffers`, scalars 14 and 15) and writes nothing when the
    /// check failed.
    fn run_guarded(
        &self,
        spec: Spec,
        params: Params,
        buffers: &[(&WgpuBuffer, bool)],
        threads: usize,
        guard: Option<Guard>,
    ) -> Result<()> {
        let Some(g) = guard else {
            return self.run(spec, params, buffers, threads);
        };
        let (spec, params, buffers) = self.guarded(spec, params, buffers, g);
        self.run(spec, params, &buffers, threads)
    }

    /// A launch of a kernel with a `guard` slot made to read `guard`'s verdict: the slot
    /// filled (the verdict words bound after `buffers`), the serial in scalars 14 and 15.
    fn guarded<'a>(
        &'a self,
        spec: Spec,
        params: Params,
        buffers: &[(&'a WgpuBuffer, bool)],
        guard: Guard,
    ) -> (Spec, Params, Vec<(&'a WgpuBuffer, bool)>) {
        let spec = spec.slot("guard", guard_slot(buffers.len() + 1, [14, 15], false));
        let params = params.scalar(14, guard.word).scalar(15, guard.serial);
        let mut with_verdicts = buffers.to_vec();
        with_verdicts.push((&self.0.verdicts, false));
        (spec, params, with_verdicts)
    }

    /// Reduces `x` over `axes` into `out` (times `scale`), at most [`CHUNK`] elements per
    /// thread: longer reductions write per-chunk partials and reduce those in another pass.
    /// (Bounded per-thread loops are also what lavapipe needs: llvmpipe stops any invocation's
    /// loops after 65535 iterations.) With a `guard`, the pass that writes `out` writes nothing
    /// when that index check failed.
    fn reduce_chunked(
        &self,
        op: ReduceOp,
        x: V<'_>,
        axes: &[usize],
        out: V<'_>,
        scale: f32,
        guard: Option<Guard>,
    ) -> Result<()> {
        let red = reduced_in_memory_order(x.layout, axes);
        let count = red.numel();
        let n_out = out.layout.numel();
        let longest = if op == ReduceOp::Sum {
            SUM_CHUNK
        } else {
            CHUNK
        };
        // Chunks short enough to give the GPU REDUCE_THREADS threads where the work allows
        // (a bias gradient, 512 sums of 256, was 512 threads each walking 256 values in
        // sequence: 78 us on an H200), at least 32 values long.
        let per = (count * n_out).div_ceil(REDUCE_THREADS).clamp(32, longest);
        let chunks = count.div_ceil(per).max(1);
        let keep = kept(x.layout, &out.layout.shape, axes);
        // Which thread takes what, so that neighbouring threads read neighbouring words: each
        // output's elements contiguous (a channel's bias gradient over a channel-major
        // convolution output) -> a chunk is every `chunks`-th element (REDUCE_INTERLEAVED);
        // neighbouring outputs closer in memory than neighbouring elements (a bias gradient
        // over a batch's rows) -> neighbouring threads take neighbouring outputs
        // (REDUCE_OUTPUTS_FASTEST); otherwise each thread a run of `per` elements.
        let smallest = |l: &Layout| {
            l.shape
                .iter()
                .zip(&l.strides)
                .filter(|&(&n, &st)| n > 1 && st != 0)
                .map(|(_, st)| st.unsigned_abs())
                .min()
        };
        let mode = match (smallest(&red), smallest(&keep)) {
            _ if red.rank() == 1 && red.strides[0] == 1 => REDUCE_INTERLEAVED,
            (Some(r), Some(k)) if k < r => REDUCE_OUTPUTS_FASTEST,
            _ => REDUCE_CHUNKED,
        };
        let finish = match op {
            ReduceOp::Max => "select(mx, nan(), seen_nan)",
            ReduceOp::Min => "select(mn, nan(), seen_nan)",
            _ => "sum * sf(1u)",
        };
        let spec = |bind: Vec<(DType, Access)>| {
            Spec::new("reduce.wgsl").bindings(bind).slot(
                "finish",
                format!(
                    "fn finish(sum: f32, mx: f32, mn: f32, seen_nan: bool) -> f32 {{ return {finish}; }}"
                ),
            )
        };
        let a = x.dtype();
        // What both kernels read: the output, where each output's line starts, the line.
        let whole_lines = Params::default()
            .block(out.layout)
            .block(&keep)
            .block(&red)
            .scalar(0, count as u32)
            .f(1, scale)
            .scalar(5, n_out as u32);
        if chunks == 1 {
            let p = whole_lines
                .scalar(2, per as u32)
                .scalar(3, 1)
                .scalar(4, mode);
            let b = out.dtype();
            return self.run_guarded(
                spec(wgsl::io(&[a], b)),
                p,
                &[(x.buffer, false), (out.buffer, true)],
                n_out,
                guard,
            );
        }
        // Short lines that still need several chunks: one pass of reduce_lanes.wgsl, a
        // workgroup's invocations sharing each line, instead of partials and a second
        // dispatch (each dispatch costs several microseconds on the GPU: a training step's
        // bias gradients are a handful of these).
        let lanes = if mode == REDUCE_OUTPUTS_FASTEST {
            32
        } else {
            1
        };
        let groups = n_out.div_ceil(lanes);
        let max_groups = self.0.limits.max_compute_workgroups_per_dimension as usize;
        if count.div_ceil(256 / lanes) <= LANE_ELEMENTS && groups.div_ceil(max_groups) <= max_groups
        {
            let p = whole_lines.scalar(4, lanes as u32);
            let lanes_spec = spec(wgsl::io(&[a], out.dtype()));
            let lanes_spec = Spec {
                file: "reduce_lanes.wgsl",
                ..lanes_spec
            };
            let buffers = [(x.buffer, false), (out.buffer, true)];
            let (lanes_spec, p, buffers) = match guard {
                Some(g) => self.guarded(lanes_spec, p, &buffers, g),
                None => (lanes_spec, p, buffers.to_vec()),
            };
            let grid = [
                groups.min(max_groups) as u32,
                groups.div_ceil(max_groups) as u32,
                1,
            ];
            return self.dispatch_groups(&self.kernel(&lanes_spec)?, &p, &buffers, grid);
        }
        let partial = self.scratch(DType::F32, n_out * chunks)?;
        let pl = Layout::contiguous(&[n_out * chunks]);
        let p = Params::default()
            .block(&pl)
            .block(&keep)
            .block(&red)
            .scalar(0, count as u32)
            .f(1, 1.0)
            .scalar(2, per as u32)
            .scalar(3, chunks as u32)
            .scalar(4, mode)
            .scalar(5, n_out as u32);
        let f = DType::F32;
        self.run(
            spec(wgsl::io(&[a], f)),
            p,
            &[(x.buffer, false), (&partial, true)],
            n_out * chunks,
        )?;
        // Partial `c` of output `o` is at `o * chunks + c`, or at `c * n_out + o` where
        // outputs went fastest.
        let mut shape = out.layout.shape.clone();
        shape.push(chunks);
        let mut strides = hal::contiguous_strides(&out.layout.shape);
        match mode {
            REDUCE_OUTPUTS_FASTEST => strides.push(n_out as isize),
            _ => {
                strides.iter_mut().for_each(|st| *st *= chunks as isize);
                strides.push(1);
            }
        }
        let partial_layout = Layout::strided(&shape, &strides, 0)?;
        let out_layout = out.layout.unsqueeze(out.layout.rank())?;
        self.reduce_chunked(
            op,
            View::new(&partial, &partial_layout),
            &[shape.len() - 1],
            View::new(out.buffer, &out_layout),
            scale,
            guard,
        )
    }

    /// The index of the extreme value along a line, at most [`CHUNK`] values per thread.
    /// `keep` gives each output's base offset in `x`, `line` the values along the reduced axis.
    /// With `index` given, `x` holds earlier passes' extremes and `index` their positions.
    /// `nan_wins`: a NaN is the extreme (argmax/argmin); otherwise NaNs lose (nearest centroid).
    /// With `out_value`, the extreme values are written too.
    #[allow(clippy::too_many_arguments)]
    fn arg_chunked(
        &self,
        op: ArgReduceOp,
        nan_wins: bool,
        x: &WgpuBuffer,
        keep: &Layout,
        line: &Layout,
        index: Option<&WgpuBuffer>,
        out: &WgpuBuffer,
        out_layout: &Layout,
        out_value: Option<(&WgpuBuffer, &Layout)>,
    ) -> Result<()> {
        let count = line.numel();
        let n_out = out_layout.numel();
        // Few outputs along a long line get chunks of about sqrt(count) (two passes of that
        // many steps each) instead of CHUNK, which left one line of 8,192 to four threads, or,
        // for lines long enough, a workgroup each (below).
        let few_outputs = n_out * count.div_ceil(CHUNK) < ARG_FEW_THREADS;
        let chunk = if few_outputs {
            count.isqrt().clamp(32, CHUNK)
        } else {
            CHUNK
        };
        let chunks = count.div_ceil(chunk).max(1);
        let better = if op == ArgReduceOp::ArgMax {
            "v > best"
        } else {
            "v < best"
        };
        let rule = format!(
            "fn better(v: f32, best: f32) -> bool {{ return {better}; }}\nconst NAN_WINS: bool = {nan_wins};"
        );
        let a = x.dtype();
        // Where a one-pass kernel writes the extreme values: `out_value`, or a word it is told
        // (scalar 5) not to write.
        let vdummy = self.scratch(DType::F32, 1)?;
        let (vb, vl, has) = match out_value {
            Some((b, l)) => (b, l.clone(), 1),
            None => (
                &vdummy,
                Layout::contiguous(&[1]).broadcast_to(&out_layout.shape)?,
                0,
            ),
        };
        let max_groups = self.0.limits.max_compute_workgroups_per_dimension as usize;
        if index.is_none()
            && few_outputs
            && (ARG_LINE_FROM..=LOOP_BUDGET * 256).contains(&count)
            && n_out <= max_groups
        {
            // Few long lines: a workgroup each (arg_line.wgsl), one dispatch.
            let spec = Spec::new("arg_line.wgsl")
                .bindings(vec![
                    (a, Access::Read),
                    (DType::U32, Access::Write),
                    (DType::F32, Access::Write),
                ])
                .slot("rule", rule);
            let p = Params::default()
                .block(out_layout)
                .block(keep)
                .block(line)
                .block(&vl)
                .scalar(0, count as u32)
                .scalar(5, has);
            return self.dispatch_groups(
                &self.kernel(&spec)?,
                &p,
                &[(x, false), (out, true), (vb, true)],
                [n_out as u32, 1, 1],
            );
        }
        let dummy = self.scratch(DType::U32, 1)?;
        let idx = index.unwrap_or(&dummy);
        let spec = Spec::new("arg_reduce.wgsl")
            .bindings(vec![
                (a, Access::Read),
                (DType::U32, Access::Write),
                (DType::U32, Access::Read),
                (DType::F32, Access::Write),
            ])
            .slot("rule", rule);
        let scalars = |p: Params| {
            p.scalar(0, count as u32)
                .scalar(2, chunk as u32)
                .scalar(3, chunks as u32)
                .scalar(4, index.is_some() as u32)
        };
        if chunks == 1 {
            let p = scalars(
                Params::default()
                    .block(out_layout)
                    .block(keep)
                    .block(line)
                    .block(&vl),
            )
            .scalar(5, has);
            return self.run(
                spec,
                p,
                &[(x, false), (out, true), (idx, false), (vb, true)],
                n_out,
            );
        }
        let (pv, pi) = (
            self.scratch(DType::F32, n_out * chunks)?,
            self.scratch(DType::U32, n_out * chunks)?,
        );
        let pl = Layout::contiguous(&[n_out * chunks]);
        let p = scalars(
            Params::default()
                .block(&pl)
                .block(keep)
                .block(line)
                .block(&pl),
        )
        .scalar(5, 1);
        self.run(
            spec,
            p,
            &[(x, false), (&pi, true), (idx, false), (&pv, true)],
            n_out * chunks,
        )?;
        // Output `o`'s partials are `o * chunks ..`, one per chunk, in order.
        let keep2 = Layout {
            shape: out_layout.shape.clone(),
            strides: hal::contiguous_strides(&out_layout.shape)
                .iter()
                .map(|s| s * chunks as isize)
                .collect(),
            offset: 0,
        };
        let line2 = Layout {
            shape: vec![chunks],
            strides: vec![1],
            offset: 0,
        };
        self.arg_chunked(
            op,
            nan_wins,
            &pv,
            &keep2,
            &line2,
            Some(&pi),
            out,
            out_layout,
            out_value,
        )
    }
}

type V<'a> = View<'a, WgpuBuffer>;

/// Whether operand `i` of a dispatch is read while another binding of the same buffer is
/// written (wgpu forbids binding one buffer both ways, so it is read from a copy).
fn read_and_written(buffers: &[(&WgpuBuffer, bool)], i: usize) -> bool {
    let (b, writes) = buffers[i];
    !writes && buffers.iter().any(|&(o, w)| w && o.same_memory(b))
}

/// True when every layout is contiguous over `shape` (so element `t` of each is `offset + t`).
fn all_contiguous(shape: &[usize], layouts: &[&Layout]) -> bool {
    layouts
        .iter()
        .all(|l| l.shape == shape && l.is_contiguous())
}

/// The pattern of a broadcast operand that `binary_rows_vec4.wgsl` reads: leading dimensions
/// of stride 0, then dimensions laid out row-major among themselves (`outer` elements), then
/// trailing dimensions of stride 0 (`inner` elements each value covers). `None` for any other
/// layout, or sizes past `u32`.
fn broadcast_rows(l: &Layout) -> Option<(usize, usize)> {
    let dims: Vec<(usize, isize)> = l
        .shape
        .iter()
        .zip(&l.strides)
        .filter(|&(&d, _)| d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    let trailing = dims.iter().rev().take_while(|&&(_, s)| s == 0).count();
    let inner: usize = dims[dims.len() - trailing..]
        .iter()
        .map(|&(d, _)| d)
        .product();
    let (mut outer, mut expected) = (1usize, 1isize);
    let mut rest = dims[..dims.len() - trailing].iter().rev();
    for &(d, s) in rest.by_ref() {
        if s == 0 {
            break;
        }
        if s != expected {
            return None;
        }
        outer *= d;
        expected *= d as isize;
    }
    let leading_broadcast = rest.all(|&(_, s)| s == 0);
    let fits = l.offset + outer <= u32::MAX as usize && inner <= u32::MAX as usize;
    (leading_broadcast && fits).then_some((inner, outer))
}

/// `reduce.wgsl`'s thread layouts (scalar 4; see `reduce_chunked`).
const REDUCE_CHUNKED: u32 = 0;
const REDUCE_OUTPUTS_FASTEST: u32 = 1;
const REDUCE_INTERLEAVED: u32 = 2;

/// The elements `axes` of `x` reduce over, as a layout (offset 0) in memory order: the axes
/// sorted by stride, largest first, and merged where one steps over the other whole (the
/// NCHW view of a channel-major convolution output reduced over N, H and W is one run of
/// N*H*W contiguous elements). The order of a reduction's terms changes, not its terms.
fn reduced_in_memory_order(x: &Layout, axes: &[usize]) -> Layout {
    let mut dims: Vec<(usize, isize)> = axes
        .iter()
        .map(|&a| (x.shape[a], x.strides[a]))
        .filter(|&(n, _)| n != 1)
        .collect();
    if dims.iter().any(|&(n, _)| n == 0) {
        dims = vec![(0, 1)];
    }
    dims.sort_by_key(|&(_, st)| std::cmp::Reverse(st.unsigned_abs()));
    let mut merged: Vec<(usize, isize)> = Vec::with_capacity(dims.len().max(1));
    for (n, st) in dims {
        match merged.last_mut() {
            Some(last) if last.1 == st * n as isize => *last = (last.0 * n, st),
            _ => merged.push((n, st)),
        }
    }
    if merged.is_empty() {
        merged.push((1, 0));
    }
    Layout {
        shape: merged.iter().map(|&(n, _)| n).collect(),
        strides: merged.iter().map(|&(_, st)| st).collect(),
        offset: 0,
    }
}

/// `x`'s strides with `axes` zeroed, on `shape`: the base offset of each output's reduction.
fn kept(x: &Layout, shape: &[usize], axes: &[usize]) -> Layout {
    let mut l = Layout {
        shape: shape.to_vec(),
        strides: x.strides.clone(),
        offset: x.offset,
    };
    for &a in axes {
        l.strides[a] = 0;
    }
    l
}

impl Backend for WgpuBackend {
    type Buffer = WgpuBuffer;
    type Kernel = program::WgpuKernel;
    type Graph = WgpuGraph;

    fn info(&self) -> DeviceInfo {
        let kind = match self.0.info.device_type {
            wgpu::DeviceType::DiscreteGpu => DeviceKind::DiscreteGpu,
            wgpu::DeviceType::IntegratedGpu => DeviceKind::IntegratedGpu,
            wgpu::DeviceType::Cpu => DeviceKind::Software,
            _ => DeviceKind::Other,
        };
        DeviceInfo {
            backend: NAME,
            name: format!(
                "{} ({:?}, {})",
                self.0.info.name, self.0.info.backend, self.0.info.driver
            ),
            kind,
            // wgpu does not report device memory; the largest buffer is what it guarantees.
            memory_total: self.0.limits.max_buffer_size,
            memory_available: self.0.limits.max_buffer_size,
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dtypes: DType::ALL.to_vec(),
            max_buffer_bytes: self.max_binding_bytes(),
            parallelism: 1,
            native_float_atomics: false,
            subgroups: self.0.features.contains(wgpu::Features::SUBGROUP),
            matrix_units: self.0.coop.is_some(),
            graph_capture: capture::enabled(),
            fast_precision: self.0.coop.is_some(),
            compensated_precision: self.0.coop.is_some(),
            fused_gradient_products: fused_epilogues(),
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.refuse_in_capture("synchronize")?;
        self.flush();
        // Short work is awaited by polling without blocking for a while: a blocking wait sleeps
        // in the driver and wakes up tens of microseconds after the GPU is done.
        let start = std::time::Instant::now();
        loop {
            let status = self
                .0
                .device
                .poll(wgpu::PollType::Poll)
                .map_err(backend_error)?;
            if status.is_queue_empty() {
                break;
            }
            if start.elapsed() > SPIN_BEFORE_SLEEP {
                self.0
                    .device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(backend_error)?;
                break;
            }
            std::hint::spin_loop();
        }
        // The device is idle: the next commands go out in a small batch.
        self.lock_batch().limit = 0;
        self.read_profile()?;
        self.check_deferred()
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<WgpuBuffer> {
        let (buf, reused) = self.pooled_buffer(dtype, len)?;
        // A reused buffer holds its last owner's data; the contract is zeros. So does a buffer
        // allocated inside a recording once a replay has written it.
        if reused || self.capturing() {
            let clear = capture::Command::Clear(buf.0.buffer.clone());
            self.transfer(&mut self.lock_batch(), clear, &[&buf]);
        }
        Ok(buf)
    }

    fn alloc_for_write(&self, dtype: DType, len: usize) -> Result<WgpuBuffer> {
        let buffer = self.scratch(dtype, len)?;
        if self
            .0
            .poison_for_write
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.write_after_batch(
                &buffer.0.buffer,
                &vec![0xff; buffer.0.buffer.size() as usize],
            );
        }
        Ok(buffer)
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<WgpuBuffer> {
        self.refuse_in_capture("upload_bytes")?;
        let (buf, _) = self.pooled_buffer(dtype, validate::upload(dtype, bytes)?)?;
        self.write_bytes(&buf, bytes)?;
        Ok(buf)
    }

    fn write_bytes(&self, dst: &WgpuBuffer, bytes: &[u8]) -> Result<()> {
        self.refuse_in_capture("write_bytes")?;
        validate::write(dst, bytes)?;
        let mut padded = bytes.to_vec();
        padded.resize(dst.0.buffer.size() as usize, 0);
        self.write_after_batch(&dst.0.buffer, &padded);
        Ok(())
    }

    fn read_bytes(&self, src: &WgpuBuffer) -> Result<Vec<u8>> {
        self.check_deferred()?;
        let mut bytes = self.read_words(&src.0.buffer)?;
        bytes.truncate(src.len() * src.dtype().size_in_bytes());
        self.check_deferred()?;
        Ok(bytes)
    }

    fn fill(&self, out: V<'_>, value: f64) -> Result<()> {
        validate::fill(out)?;
        let (ol, []) = hal::in_memory_order(out.layout, []);
        let out = View::new(out.buffer, &ol);
        let dt = out.dtype();
        let spec = Spec::new("fill.wgsl")
            .bindings(vec![(dt, Access::Write)])
            .contiguous_if(out.layout.is_contiguous(), out);
        // One kernel for every dtype: the value goes in as the output's own element bits.
        let p = Params::default()
            .block(out.layout)
            .scalar(0, dt.fill_bits(value));
        self.run(spec, p, &[(out.buffer, true)], out.layout.numel())
    }

    fn copy(&self, src: V<'_>, out: V<'_>) -> Result<()> {
        validate::copy(src, out)?;
        let (ol, [sl]) = hal::in_memory_order(out.layout, [src.layout]);
        let (src, out) = (View::new(src.buffer, &sl), View::new(out.buffer, &ol));
        let (a, b) = (src.dtype(), out.dtype());
        let convert = match (a, b) {
            _ if a == b => "stbits2(dst, bits1(src));",
            (DType::I32, DType::U32) => "stbits2(dst, u32(max(ldi1(src), 0)));",
            (DType::U32, DType::I32) => "stbits2(dst, min(bits1(src), 0x7fffffffu));",
            _ => "st2(dst, ld1(src));",
        };
        let spec = Spec::new("copy.wgsl")
            .bindings(wgsl::io(&[a], b))
            .slot("convert", format!("    {convert}"))
            .contiguous_if(
                all_contiguous(&out.layout.shape, &[out.layout, src.layout]),
                out,
            );
        let p = Params::default().block(out.layout).block(src.layout);
        self.run(
            spec,
            p,
            &[(src.buffer, false), (out.buffer, true)],
            out.layout.numel(),
        )
    }

    fn unary(&self, op: UnaryOp, x: V<'_>, out: V<'_>) -> Result<()> {
        let xl = validate::unary(x, out)?;
        let (ol, [xl]) = hal::in_memory_order(out.layout, [&xl]);
        let out = View::new(out.buffer, &ol);
        let p = unary_params(Params::default().block(out.layout).block(&xl), op);
        let (a, b) = (x.dtype(), out.dtype());
        let expr = wgsl::unary_expr(op);
        let spec = Spec::new("unary.wgsl")
            .bindings(wgsl::io(&[a], b))
            .slot("op", format!("fn op(v: f32) -> f32 {{ return {expr}; }}"))
            .contiguous_if(all_contiguous(&out.layout.shape, &[out.layout, &xl]), out);
        self.run(
            spec,
            p,
            &[(x.buffer, false), (out.buffer, true)],
            out.layout.numel(),
        )
    }

    fn binary(&self, op: BinaryOp, a: V<'_>, b: V<'_>, out: V<'_>) -> Result<()> {
        let (al, bl) = validate::binary(a, b, out)?;
        let (ol, [al, bl]) = hal::in_memory_order(out.layout, [&al, &bl]);
        let out = View::new(out.buffer, &ol);
        let (da, db, dout) = (a.dtype(), b.dtype(), out.dtype());
        // f32 arithmetic on contiguous operands that start and end on 16-byte boundaries: four
        // elements per load and store, so enough bytes are in flight to reach bandwidth.
        let arithmetic = matches!(
            op,
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
        );
        let n = out.layout.numel();
        let aligned = [out.layout, &al, &bl].iter().all(|l| l.offset % 4 == 0) && n % 4 == 0;
        // `b` contiguous too (binary_vec4), or a broadcast bias (binary_rows_vec4: its offset in
        // elements, then the run each value covers and the values before the pattern repeats).
        let vec4 = if arithmetic
            && aligned
            && [da, db, dout].iter().all(|&d| d == DType::F32)
            && all_contiguous(&out.layout.shape, &[out.layout, &al])
        {
            match broadcast_rows(&bl) {
                _ if all_contiguous(&out.layout.shape, &[&bl]) => Some((
                    "binary_vec4.wgsl",
                    Params::default().scalar(1, (bl.offset / 4) as u32),
                )),
                Some((inner, outer)) => Some((
                    "binary_rows_vec4.wgsl",
                    Params::default()
                        .scalar(1, bl.offset as u32)
                        .scalar(3, inner as u32)
                        .scalar(4, outer as u32),
                )),
                None => None,
            }
        } else {
            None
        };
        if let Some((file, p)) = vec4 {
            let p = p
                .scalar(0, (al.offset / 4) as u32)
                .scalar(2, (out.layout.offset / 4) as u32);
            let expr = wgsl::binary_vec4_expr(op);
            let spec = Spec::new(file).slot(
                "op",
                format!("fn op(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {{ return {expr}; }}"),
            );
            return self.run(
                spec,
                p,
                &[(a.buffer, false), (b.buffer, false), (out.buffer, true)],
                n / 4,
            );
        }
        let expr = wgsl::binary_expr(op);
        let spec = Spec::new("binary.wgsl")
            .bindings(wgsl::io(&[da, db], dout))
            .slot(
                "op",
                format!("fn op(a: f32, b: f32) -> f32 {{ return {expr}; }}"),
            )
            .contiguous_if(
                all_contiguous(&out.layout.shape, &[out.layout, &al, &bl]),
                out,
            );
        let p = Params::default().block(out.layout).block(&al).block(&bl);
        self.run(
            spec,
            p,
            &[(a.buffer, false), (b.buffer, false), (out.buffer, true)],
            out.layout.numel(),
        )
    }

    fn ternary(&self, op: TernaryOp, a: V<'_>, b: V<'_>, c: V<'_>, out: V<'_>) -> Result<()> {
        let [al, bl, cl] = validate::ternary(a, b, c, out)?;
        let (ol, [al, bl, cl]) = hal::in_memory_order(out.layout, [&al, &bl, &cl]);
        let out = View::new(out.buffer, &ol);
        let dts = [a.dtype(), b.dtype(), c.dtype(), out.dtype()];
        let expr = match op {
            TernaryOp::Where => "select(z, y, x != 0.0)",
            TernaryOp::Fma => "fma(x, y, z)",
            TernaryOp::Lerp => "fma(x, z - y, y)",
        };
        let p = Params::default()
            .block(out.layout)
            .block(&al)
            .block(&bl)
            .block(&cl);
        let spec = Spec::new("ternary.wgsl")
            .bindings(wgsl::io(&[dts[0], dts[1], dts[2]], dts[3]))
            .slot(
                "op",
                format!("fn op(x: f32, y: f32, z: f32) -> f32 {{ return {expr}; }}"),
            )
            .contiguous_if(
                all_contiguous(&out.layout.shape, &[out.layout, &al, &bl, &cl]),
                out,
            );
        self.run(
            spec,
            p,
            &[
                (a.buffer, false),
                (b.buffer, false),
                (c.buffer, false),
                (out.buffer, true),
            ],
            out.layout.numel(),
        )
    }

    fn reduce(&self, op: ReduceOp, x: V<'_>, axes: &[usize], out: V<'_>) -> Result<()> {
        validate::reduce(op, x, axes, out)?;
        let count = hal::numel(&axes.iter().map(|&a| x.layout.shape[a]).collect::<Vec<_>>());
        let scale = if op == ReduceOp::Mean {
            1.0 / count as f32
        } else {
            1.0
        };
        let op = if op == ReduceOp::Mean {
            ReduceOp::Sum
        } else {
            op
        };
        self.labelled(
            || format!("reduce {:?} over {axes:?}", x.layout.shape),
            || self.reduce_chunked(op, x, axes, out, scale, None),
        )
    }

    fn kmeans_pp(&self, x: V<'_>, anchors: V<'_>, seed: u64) -> Result<()> {
        let [n, d, m] = validate::kmeans_pp(x, anchors)?;
        // A group of lanes per point (about 16 coordinates a lane), so many points a
        // workgroup.
        let lanes = hal::seeding::lanes_per_point(d);
        let groups = n.div_ceil(256 / lanes);
        let fits = (m as u64) * (n as u64) < 1 << 32
            && groups <= self.0.limits.max_compute_workgroups_per_dimension as usize;
        // The reproducible precision keeps the reference's distance order (hal's steps).
        if self.1 == Precision::Reproducible || m == 0 || !fits {
            return hal::seeding::kmeans_pp_steps(self, x, anchors, seed);
        }
        let d2 = self.scratch(DType::F32, n)?;
        let winners = self.scratch(DType::U32, m)?;
        let step = self.alloc(DType::U32, 1)?;
        let best_key = self.scratch(DType::F32, groups)?;
        let best_at = self.scratch(DType::U32, groups)?;
        let keys = self.prepare(
            &Spec::new("kmeans_pp_keys.wgsl"),
            &Params::default()
                .scalar(0, n as u32)
                .scalar(1, d as u32)
                .scalar(2, lanes as u32)
                .scalar(3, seed as u32)
                .scalar(4, (seed >> 32) as u32),
            &[
                (x.buffer, false),
                (&d2, true),
                (&winners, false),
                (&step, false),
                (&best_key, true),
                (&best_at, true),
            ],
            [groups as u32, 1, 1],
        )?;
        let pick = self.prepare(
            &Spec::new("kmeans_pp_pick.wgsl"),
            &Params::default().scalar(0, groups as u32),
            &[
                (&best_key, false),
                (&best_at, false),
                (&winners, true),
                (&step, true),
            ],
            [1, 1, 1],
        )?;
        let (Some(keys), Some(pick)) = (keys, pick) else {
            // (No immediates on this device: every dispatch would need its own submission.)
            return hal::seeding::kmeans_pp_steps(self, x, anchors, seed);
        };
        // Every step's two dispatches encoded from the same bind groups (the step number is
        // on the device), then the winners' rows gathered.
        self.encode_repeated(&[keys, pick], m)?;
        let rows = Layout::strided(&[m, d], &[1, 0], 0)?;
        self.gather(x, 0, View::new(&winners, &rows), anchors)
    }

    fn arg_reduce(&self, op: ArgReduceOp, x: V<'_>, axis: usize, out: V<'_>) -> Result<()> {
        validate::arg_reduce(x, axis, out)?;
        let keep = kept(x.layout, &out.layout.shape, &[axis]);
        let line = Layout {
            shape: vec![x.layout.shape[axis]],
            strides: vec![x.layout.strides[axis]],
            offset: 0,
        };
        self.arg_chunked(
            op, true, x.buffer, &keep, &line, None, out.buffer, out.layout, None,
        )
    }

    fn matmul(&self, a: V<'_>, b: V<'_>, out: V<'_>, alpha: f32, beta: f32) -> Result<()> {
        let [am, bm, om] = validate::matmul(a, b, out)?;
        if om.batch == 0 || om.rows == 0 || om.cols == 0 {
            return Ok(());
        }
        self.labelled(
            || gemm_label(&am, &om),
            || self.matmul_routed([a, b, out], [&am, &bm, &om], alpha, beta, Fused::default()),
        )
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
        let ([am, bm, om], bias) = validate::matmul_epilogue([a, b, out], &epilogue)?;
        let GemmRoute { slices, dot, .. } = gemm_route(&am, &bm, &om, beta);
        // A gate fuses where its output has a's strides (the kernels read both at one index).
        let gate = epilogue.a_gate.map(|g| GateRead::of(g, &am));
        let gate_fuses = gate.is_none_or(|g| g.is_some());
        let gate = gate.flatten();
        let empty = om.batch * om.rows * om.cols == 0;
        if empty || !gate_fuses || !fused_epilogues() {
            return self.matmul_epilogue_unfused([a, b, out], alpha, beta, epilogue);
        }
        // A rank-3 output has batch 1 where the rest fuses: the bias as the output's [rows,
        // cols].
        let bias = bias.map(|l| {
            let r = l.rank();
            Layout {
                shape: l.shape[r - 2..].to_vec(),
                strides: l.strides[r - 2..].to_vec(),
                offset: l.offset,
            }
        });
        let fused = Fused {
            gate,
            row_sums: epilogue.a_row_sums.map(|v| (v.buffer, v.layout)),
            bias: epilogue.bias.map(|v| v.buffer).zip(bias.as_ref()),
            activation: epilogue.activation,
        };
        // Everything fuses where the product is split over k (its slices read `a` through
        // the gate and sum its rows, its sum pass adds the bias and applies the activation:
        // a Linear layer's forward and backward products in a training step) or runs whole
        // as dot products (an activation without parameters: the kernel's scalars 0 and 1
        // are taken). Other products take a gate alone (their kernels read `a` through it);
        // the rest runs as separate calls.
        let fuses = match (slices > 1, dot) {
            (true, _) => true,
            (false, true) => {
                beta == 0.0
                    && om.batch == 1
                    && epilogue
                        .activation
                        .is_none_or(|op| unary_scalars(op).is_none())
            }
            (false, false) => fused.gate.is_some() && !fused.finishes(),
        };
        if !fuses {
            return self.matmul_epilogue_unfused([a, b, out], alpha, beta, epilogue);
        }
        self.labelled(
            || gemm_label(&am, &om),
            || self.matmul_routed([a, b, out], [&am, &bm, &om], alpha, beta, fused),
        )
    }

    fn spmv_csr(
        &self,
        a: Csr<'_, WgpuBuffer>,
        x: &WgpuBuffer,
        y: &WgpuBuffer,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        validate::spmv_csr(&a, x, y)?;
        // The structure is checked on the device first; the product reads the verdict.
        let nnz = a.values.len();
        let p = Params::default()
            .scalar(0, a.rows as u32)
            .scalar(1, a.cols.min(u32::MAX as usize) as u32)
            .scalar(2, nnz as u32)
            .scalar(4, fault_code("spmv_csr", FaultKind::CsrOffsets))
            .scalar(5, fault_code("spmv_csr", index_fault(DType::U32)));
        let guard = self.run_check(
            Spec::new("check_csr.wgsl"),
            p,
            &[a.row_offsets, a.col_indices],
            (a.rows + 1).max(nnz),
        )?;
        let p = Params::default().f(0, alpha).f(1, beta);
        self.run_guarded(
            Spec::new("spmv.wgsl"),
            p,
            &[
                (a.row_offsets, false),
                (a.col_indices, false),
                (a.values, false),
                (x, false),
                (y, true),
            ],
            a.rows,
            Some(guard),
        )
    }

    fn gather(&self, x: V<'_>, axis: usize, index: V<'_>, out: V<'_>) -> Result<()> {
        validate::gather(x, axis, index, out)?;
        let guard = self.check_indices("gather", index, x.layout.shape[axis])?;
        let xm = kept(x.layout, &index.layout.shape, &[axis]);
        let p = Params::default()
            .block(out.layout)
            .block(index.layout)
            .block(&xm)
            .scalar(0, x.layout.strides[axis] as i32 as u32);
        let dts = [x.dtype(), index.dtype(), out.dtype()];
        self.run_guarded(
            Spec::new("gather.wgsl").bindings(wgsl::io(&[dts[0], dts[1]], dts[2])),
            p,
            &[(x.buffer, false), (index.buffer, false), (out.buffer, true)],
            out.layout.numel(),
            Some(guard),
        )
    }

    fn scatter_add(&self, src: V<'_>, axis: usize, index: V<'_>, out: V<'_>) -> Result<()> {
        validate::scatter_add(src, axis, index, out)?;
        let guard = self.check_indices("scatter_add", index, out.layout.shape[axis])?;
        // One thread per line (all positions but `axis`): each output element has one writer.
        let mut outer = index.layout.shape.clone();
        outer[axis] = 1;
        let (sm, im, om) = (
            kept(src.layout, &outer, &[axis]),
            kept(index.layout, &outer, &[axis]),
            kept(out.layout, &outer, &[axis]),
        );
        let dts = [src.dtype(), index.dtype(), out.dtype()];
        let line = index.layout.shape[axis];
        let threads = if index.layout.numel() == 0 {
            0
        } else {
            hal::numel(&outer)
        };
        // Slices of at most CHUNK along the axis, in order: each element's adds stay ordered.
        let mut j0 = 0;
        while j0 < line {
            let j1 = (j0 + CHUNK).min(line);
            let p = Params::default()
                .block(&sm)
                .block(&im)
                .block(&om)
                .scalar(0, j1 as u32)
                .scalar(1, src.layout.strides[axis] as i32 as u32)
                .scalar(2, index.layout.strides[axis] as i32 as u32)
                .scalar(3, out.layout.strides[axis] as i32 as u32)
                .scalar(4, j0 as u32);
            self.run_guarded(
                Spec::new("scatter_add.wgsl").bindings(wgsl::io(&[dts[0], dts[1]], dts[2])),
                p,
                &[
                    (src.buffer, false),
                    (index.buffer, false),
                    (out.buffer, true),
                ],
                threads,
                Some(guard),
            )?;
            j0 = j1;
        }
        Ok(())
    }

    fn im2col(&self, x: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
        validate::im2col(x, g, out)?;
        let (oh, ow) = g.output_size().expect("validated");
        let p = conv_params(g, oh, ow).block(out.layout).block(x.layout);
        let dts = [x.dtype(), out.dtype()];
        // A thread per window position (it writes the window's kh*kw entries).
        self.run(
            Spec::new("im2col.wgsl").bindings(wgsl::io(&[dts[0]], dts[1])),
            p,
            &[(x.buffer, false), (out.buffer, true)],
            g.batch * g.channels * oh * ow,
        )
    }

    fn col2im(&self, cols: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
        validate::col2im(cols, g, out)?;
        let (oh, ow) = g.output_size().expect("validated");
        let p = conv_params(g, oh, ow).block(out.layout).block(cols.layout);
        // One thread per pixel gathers every column entry that reads it: no atomics.
        let dts = [cols.dtype(), out.dtype()];
        self.run(
            Spec::new("col2im.wgsl").bindings(wgsl::io(&[dts[0]], dts[1])),
            p,
            &[(cols.buffer, false), (out.buffer, true)],
            out.layout.numel(),
        )
    }

    fn nearest_centroid(
        &self,
        x: V<'_>,
        c: V<'_>,
        out_index: V<'_>,
        out_distance: V<'_>,
    ) -> Result<()> {
        validate::nearest_centroid(x, c, out_index, out_distance)?;
        if x.layout.rank() == 3 {
            // A batch (the codebooks of a product quantiser): one light pass over all groups,
            // short rows with the centroids in workgroup memory.
            let (g, n, d) = (x.layout.shape[0], x.layout.shape[1], x.layout.shape[2]);
            let max = self.0.limits.max_compute_workgroups_per_dimension as usize;
            if d <= 16 && n.div_ceil(256) <= max && g <= max {
                return self.nearest_short([x, c, out_index, out_distance]);
            }
            return self.nearest_ordered(x, c, out_index, out_distance);
        }
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], c.layout.shape[0]);
        if n == 0 {
            return Ok(());
        }
        // The reference's order, one light pass: under Precision::Reproducible, and for a few
        // centroids under any precision, where the tiled paths would spend their set-up on a
        // handful (k-means++ asks for one at a time).
        if self.1 == Precision::Reproducible || m < FEW_CENTROIDS {
            return self.nearest_ordered(x, c, out_index, out_distance);
        }
        if self.1 == Precision::Fast && self.nearest_coop([x, c, out_index, out_distance])? {
            return Ok(());
        }
        // One fused pass (nearest_centroid.wgsl): no n x m distance matrix. The centroids are
        // swept in slices that keep each invocation's loops short (lavapipe stops loops after
        // 65535 iterations; each 64-centroid tile costs about 30 iterations per 16 of d).
        let tiles_per_slice = (1000 / d.div_ceil(16).max(1)).max(1);
        let tile = TileShape {
            rows: 128,
            cols: tile_shape().cols,
        };
        let slice = tiles_per_slice * tile.cols;
        let dts = [x.dtype(), c.dtype()];
        let (name, text) = tile.slot();
        let pipeline = self.kernel(
            &Spec::new("nearest_centroid.wgsl")
                .bindings(vec![
                    (dts[0], Access::Read),
                    (dts[1], Access::Read),
                    (DType::U32, Access::Write),
                    (DType::F32, Access::Write),
                ])
                .slot(name, text),
        )?;
        // The centroids' squared norms, once per call.
        let norms = self.centroid_norms(c, m)?;
        let fused = self.fma_is_fused()?;
        let blocks = n.div_ceil(tile.rows);
        let max = self.0.limits.max_compute_workgroups_per_dimension as usize;
        let groups = [blocks.min(max) as u32, blocks.div_ceil(max) as u32, 1];
        let mut first = 0;
        while first < m {
            let end = (first + slice).min(m);
            let p = nearest_slice_params([x, c, out_index, out_distance], first, end, fused)?;
            self.dispatch_groups(
                &pipeline,
                &p,
                &[
                    (x.buffer, false),
                    (c.buffer, false),
                    (out_index.buffer, true),
                    (out_distance.buffer, true),
                    (&norms, false),
                ],
                groups,
            )?;
            first = end;
        }
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
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
        // Small sums take the scan under either precision (in the reproducible order, or in
        // compensated runs of rows outside Precision::Reproducible).
        let ordered = self.1 == Precision::Reproducible || self.scan_fits(n, m, d);
        if ordered {
            // Probed (once per device, with a read-back) before the index check is enqueued,
            // whose fault must surface at the caller's synchronize, not at the probe's.
            self.fma_is_fused()?;
        }
        let guard = self.check_indices("segment_sum", segment, m)?;
        if ordered {
            return self.segment_sum_ordered(x, segment, weights, sums, counts, guard);
        }
        if m >= SORTED_SEGMENTS {
            return self.segment_sum_sorted(x, segment, weights, sums, counts, guard);
        }
        // One thread per (row chunk, segment, column) plus one per (row chunk, segment) for
        // the count, each summing its rows in order with Kahan compensation; then the chunks'
        // partials are summed by the reduction. Deterministic, no atomics; O(n m d) work, the
        // straightforward version, correct before fast.
        let (w, wl) = weight_binding(x, weights)?;
        let chunks = n.div_ceil(SUM_CHUNK).max(1);
        let width = m * (d + 1);
        let partial = self.scratch(DType::F32, chunks * width)?;
        let p = Params::default()
            .block(segment.layout)
            .block(&wl)
            .scalar(0, n as u32)
            .scalar(1, d as u32)
            .scalar(2, m as u32)
            .matrix(3, x.layout)
            .scalar(6, SUM_CHUNK as u32)
            .scalar(7, weights.is_some() as u32);
        // Partial layout: [chunk, segment, column 0..d (sums) and d (count)].
        let dts = [x.dtype(), w.dtype()];
        self.run(
            Spec::new("segment_sum.wgsl")
                .bindings(wgsl::io(&[dts[0], DType::U32, dts[1]], DType::F32)),
            p,
            &[
                (x.buffer, false),
                (segment.buffer, false),
                (w, false),
                (&partial, true),
            ],
            chunks * width,
        )?;
        // Sum the chunks: sums[s, k] = sum_c partial[c, s, k]; counts[s] = sum_c partial[c, s, d].
        let parts_last = Layout::contiguous(&[chunks, m, d + 1]).permute(&[1, 2, 0])?;
        self.sum_segment_partials(&partial, &parts_last, sums, counts, guard)
    }

    fn sgd_step(
        &self,
        param: &WgpuBuffer,
        grad: &WgpuBuffer,
        momentum_buffer: Option<&WgpuBuffer>,
        h: &SgdParams,
    ) -> Result<()> {
        validate::sgd_step(param, grad, momentum_buffer, h)?;
        let use_momentum = h.momentum != 0.0;
        let p = Params::default()
            .f(0, h.lr)
            .f(1, h.momentum)
            .f(2, h.dampening)
            .f(3, h.weight_decay)
            .scalar(4, h.nesterov as u32)
            .scalar(5, (h.step <= 1) as u32)
            .scalar(6, use_momentum as u32);
        let dummy;
        let mb = match momentum_buffer {
            Some(b) if use_momentum => b,
            _ => {
                dummy = self.scratch(DType::F32, 1)?;
                &dummy
            }
        };
        self.run(
            Spec::new("sgd.wgsl"),
            p,
            &[(param, true), (grad, false), (mb, true)],
            param.len(),
        )
    }

    fn adam_step(
        &self,
        param: &WgpuBuffer,
        grad: &WgpuBuffer,
        m: &WgpuBuffer,
        v: &WgpuBuffer,
        h: &AdamParams,
    ) -> Result<()> {
        validate::adam_step(param, grad, m, v, h)?;
        let t = h.step.max(1) as i32;
        let p = Params::default()
            .f(0, h.lr)
            .f(1, h.beta1)
            .f(2, h.beta2)
            .f(3, h.eps)
            .f(4, h.weight_decay)
            .scalar(5, h.decoupled_weight_decay as u32)
            .f(6, 1.0 - h.beta1.powi(t))
            .f(7, 1.0 - h.beta2.powi(t));
        self.run(
            Spec::new("adam.wgsl"),
            p,
            &[(param, true), (grad, false), (m, true), (v, true)],
            param.len(),
        )
    }

    fn random(&self, out: V<'_>, dist: Distribution, seed: u64, offset: u64) -> Result<()> {
        validate::random(out)?;
        let (normal, a, b) = match dist {
            Distribution::Uniform { low, high } => (0, low, high),
            Distribution::Normal { mean, std } => (1, mean, std),
        };
        let p = Params::default()
            .block(out.layout)
            .scalar(0, seed as u32)
            .scalar(1, (seed >> 32) as u32)
            .scalar(2, offset as u32)
            .scalar(3, (offset >> 32) as u32)
            .f(4, a)
            .f(5, b)
            .scalar(6, normal);
        let dt = out.dtype();
        self.run(
            Spec::new("random.wgsl").bindings(vec![(dt, Access::Write)]),
            p,
            &[(out.buffer, true)],
            out.layout.numel(),
        )
    }

    fn compile(&self, program: &Program) -> Result<program::WgpuKernel> {
        self.0.kernels.get_or_compile(program, |program| {
            let features = self.module_features();
            let words = features.immediate_words;
            let source = program::lower(program, features)?;
            // The kernel cache is this pipeline's cache: no string key to collide on.
            let module = wgsl::Module::generated("<ir program>", source.clone());
            let pipeline = self.build_pipeline(&program.name, &module, false, words, None)?;
            Ok(program::WgpuKernel {
                program: Arc::new(program.clone()),
                pipeline,
                source: Arc::new(source),
            })
        })
    }

    fn launch(&self, kernel: &program::WgpuKernel, args: &[&WgpuBuffer], n: usize) -> Result<()> {
        let prog = &kernel.program;
        validate::launch(prog, args, n)?;
        if n == 0 {
            return Ok(());
        }
        let mut p = Params::default();
        for (i, a) in args.iter().enumerate().take(15) {
            p = p.scalar(i, a.len() as u32);
        }
        let mut bufs: Vec<(&WgpuBuffer, bool)> = args
            .iter()
            .zip(&prog.buffers)
            .map(|(a, d)| (*a, d.access != hal::ir::Access::Read))
            .collect();
        bufs.push((&self.0.faults, true));
        self.dispatch(&kernel.pipeline, &p, &bufs, n)?;
        self.faults_may_be_written();
        Ok(())
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
        if !capture::enabled() {
            return Ok(WgpuGraph {
                steps: Some(hal::Replay::new(steps)),
                commands: Vec::new(),
                keep: Vec::new(),
                writes_faults: false,
                device: Arc::as_ptr(&self.0) as usize,
            });
        }
        // Probed now: the first kernel that needs it would otherwise read inside the capture.
        self.fma_is_fused()?;
        {
            let mut batch = self.lock_batch();
            if batch.capture.is_some() {
                return Err(Error::InvalidArgument {
                    op: "record",
                    detail: "a recording inside a recording".into(),
                });
            }
            batch.capture = Some(capture::Capture::default());
        }
        let result = steps(self);
        let captured = self.lock_batch().capture.take().unwrap_or_default();
        result?;
        Ok(WgpuGraph {
            steps: None,
            commands: captured.commands,
            keep: captured.keep,
            writes_faults: captured.writes_faults,
            device: Arc::as_ptr(&self.0) as usize,
        })
    }

    /// Encodes the captured commands again (inside another recording: appends them to it).
    fn replay(&self, graph: &Self::Graph) -> Result<()> {
        if graph.device != Arc::as_ptr(&self.0) as usize {
            return Err(Error::InvalidArgument {
                op: "replay",
                detail: "the graph was recorded on another wgpu device".into(),
            });
        }
        if let Some(steps) = &graph.steps {
            return steps.run(self);
        }
        if let Some(c) = self.lock_batch().capture.as_mut() {
            c.keep(&graph.keep);
        }
        self.encode_commands(&graph.commands)?;
        if graph.writes_faults {
            self.faults_may_be_written();
        }
        Ok(())
    }
}

fn conv_params(g: &Conv2dGeometry, oh: usize, ow: usize) -> Params {
    let v = [
        g.batch,
        g.channels,
        g.height,
        g.width,
        g.kernel.0,
        g.kernel.1,
        g.stride.0,
        g.stride.1,
        g.padding.0,
        g.padding.1,
        g.dilation.0,
        g.dilation.1,
        oh,
        ow,
    ];
    let mut p = Params::default();
    for (i, x) in v.into_iter().enumerate() {
        p = p.scalar(i, x as u32);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_products_over_few_tiles_split_k_evenly() {
        // A convolution's weight gradient: 5 tiles, k = 30976 = 2^8 x 121.
        let s = k_slices(30976, 5);
        assert_eq!(30976 % s, 0);
        assert!(
            s * 5 <= 2 * SMALL_PRODUCT_TILES && s * 5 * 2 > SMALL_PRODUCT_TILES,
            "{s}"
        );
        // Slices stay at least MIN_SLICE_K long; a prime k does not split.
        assert_eq!(k_slices(512, 32), 4);
        assert_eq!(k_slices(256, 32), 2);
        assert_eq!(k_slices(127, 1), 1);
        assert_eq!(k_slices(4099, 1), 1);
        // Enough tiles already: no split.
        assert_eq!(k_slices(4096, SMALL_PRODUCT_TILES), 1);
    }

    /// [`gemm_route`] of a product with beta 0, each matrix as (rows, columns, row stride,
    /// column stride).
    fn route(matrices: [(usize, usize, isize, isize); 3]) -> GemmRoute {
        let [a, b, o] = matrices.map(|(rows, cols, row, col)| validate::MatrixView {
            batch: 1,
            rows,
            cols,
            strides: [0, row, col],
            offset: 0,
        });
        gemm_route(&a, &b, &o, 0.0)
    }

    #[test]
    fn small_thin_products_run_whole_as_dot_products() {
        // An MLP's last layer: the forward product (x [256, 512] times the [10, 512] weight
        // transposed) and the weight gradient (g^T [10, 256] times x [256, 512]), whose k
        // runs down both operands' columns.
        let forward = route([(256, 512, 512, 1), (512, 10, 1, 512), (256, 10, 10, 1)]);
        assert!(forward.dot && forward.slices == 1);
        let weight = route([(10, 256, 1, 10), (256, 512, 512, 1), (10, 512, 512, 1)]);
        assert!(weight.dot && weight.slices == 1);
        // Too long a k, or too wide an output: split, in tiles.
        let long = route([(10, 4096, 1, 10), (4096, 512, 512, 1), (10, 512, 512, 1)]);
        assert!(!long.dot && long.slices > 1);
        let wide = route([(256, 512, 512, 1), (512, 512, 1, 512), (256, 512, 512, 1)]);
        assert!(!wide.dot && wide.slices == 4);
    }
}
