//! Which kernel a product takes: tile shapes, k slices, dot products.

use crate::knob::{knob, switch};
use hal::validate;

/// The output block one GEMM or nearest-centroid workgroup computes (`tile.wgsl`): rows and
/// columns, each 64 or 128.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    pub rows: usize,
    pub cols: usize,
}

impl TileShape {
    /// The `tile_shape` slot of `tile.wgsl` (rows and columns per thread).
    pub(crate) fn slot(self) -> (&'static str, String) {
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
pub(crate) fn tile_override() -> Option<TileShape> {
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
///   training step's 256 x 512 products: 8 workgroups on a GPU of 132 multiprocessors). That
///   includes long products over few tiles, which are split over k ([`k_slices`]), such as a
///   convolution's weight gradient.
/// - otherwise 128 x 128, or a half tile (64 x 128 or 128 x 64) where that pads less (a
///   convolution's 64 x 50176 forward product: half of a 128 x 128 tile would be padding).
///
/// docs/PERF.md's tuning evidence has the timings behind each choice.
pub(crate) fn gemm_tile(rows: usize, cols: usize, batch: usize) -> TileShape {
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
pub(crate) const SMALL_PRODUCT_TILES: usize = 256;

/// Into how many slices of `k` a product of `tiles` output tiles splits (1: none): enough
/// for about [`SMALL_PRODUCT_TILES`] workgroups, each slice at least [`MIN_SLICE_K`] long and
/// all of one length (a divisor of `k`). A small CNN's weight gradient, 64 x 288 outputs over
/// k = 50176 (256 images of 14 x 14), is 5 tiles: one workgroup a multiprocessor on a few.
pub(crate) fn k_slices(k: usize, tiles: usize) -> usize {
    let wanted = split_groups().div_ceil(tiles.max(1));
    (2..=wanted.min(k / min_slice_k()))
        .rev()
        .find(|s| k % s == 0)
        .unwrap_or(1)
}

/// See [`k_slices`]. Chosen against 64 and 256 (and against aiming for 128 or 192
/// workgroups) on recorded training steps, with `HAL_WGPU_MIN_SLICE_K` and
/// `HAL_WGPU_SPLIT_GROUPS` (docs/PERF.md, tuning evidence): an MLP's 256 x 512 products over
/// k = 512 and 784 then take 4 slices, not 8, its 512-row weight gradients 2, not 4.
pub(crate) const MIN_SLICE_K: usize = 128;

/// The workgroups a split product aims for: [`SMALL_PRODUCT_TILES`], or `HAL_WGPU_SPLIT_GROUPS`
/// (a tuning knob, at least 1).
pub(crate) fn split_groups() -> usize {
    static GROUPS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    knob(&GROUPS, "HAL_WGPU_SPLIT_GROUPS", SMALL_PRODUCT_TILES)
}

/// [`MIN_SLICE_K`], or `HAL_WGPU_MIN_SLICE_K` (a tuning knob, at least 1).
pub(crate) fn min_slice_k() -> usize {
    static K: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    knob(&K, "HAL_WGPU_MIN_SLICE_K", MIN_SLICE_K)
}

/// The tile of a product, into how many slices of k it splits (1: none) and whether it runs
/// whole as dot products: products with thin outputs, small thin ones ([`whole_dot`]), with
/// beta (the sum pass overwrites), batched ones and, under `HAL_WGPU_GEMM=tile`, every product
/// stay whole. Dot products where the output is thin or covers fewer than
/// [`DOT_BELOW_TILES`] tiles, k is at least [`DOT_FROM_K`] and the k strides are 1, or where
/// [`whole_dot`] holds.
pub(crate) fn gemm_route(
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
pub(crate) fn whole_dot(am: &validate::MatrixView, om: &validate::MatrixView) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch(&ON, "HAL_WGPU_WHOLE_DOT")
        && om.rows.min(om.cols) <= SPLIT_DOT_THIN
        && om.batch * om.rows * om.cols <= WHOLE_DOT_OUTPUTS
        && (DOT_FROM_K..=WHOLE_DOT_K).contains(&am.cols)
}

/// See [`whole_dot`]: each of an output's 32 threads then reads at most 32 elements of each
/// operand, and strided reads (a weight gradient's k runs down both operands' columns) touch
/// at most a few hundred kilobytes.
pub(crate) const WHOLE_DOT_K: usize = 1024;

pub(crate) const WHOLE_DOT_OUTPUTS: usize = 16384;

/// The name profiles file a product's dispatches under: its shape.
pub(crate) fn gemm_label(am: &validate::MatrixView, om: &validate::MatrixView) -> String {
    format!(
        "gemm {}x{}x{} batch {}",
        om.rows, om.cols, am.cols, om.batch
    )
}

/// See [`gemm_route`].
pub(crate) struct GemmRoute {
    pub(crate) tile: TileShape,
    pub(crate) slices: usize,
    /// One dot product per output (gemm_dot.wgsl), never split.
    pub(crate) dot: bool,
}

/// Whether `matmul_epilogue` fuses where it can: yes unless `HAL_WGPU_EPILOGUE=0` (a knob
/// for comparing against the separate calls).
pub(crate) fn fused_epilogues() -> bool {
    static FUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch(&FUSED, "HAL_WGPU_EPILOGUE")
}

/// `HAL_WGPU_GEMM=tile` sends every matrix product to the tile kernel (for comparisons).
pub(crate) fn tile_only() -> bool {
    static TILE_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TILE_ONLY.get_or_init(|| matches!(std::env::var("HAL_WGPU_GEMM").as_deref(), Ok("tile")))
}

/// Matrix products with unit k strides and k at least [`DOT_FROM_K`] whose output is thin
/// (at most [`DOT_THIN`] rows or columns: a tile would compute mostly padding) or covers fewer
/// tiles (of [`gemm_tile`]'s choice) than [`DOT_BELOW_TILES`] (a quarter of a big GPU's
/// multiprocessors) run as
/// one dot product per output (`gemm_dot.wgsl`) instead of the tile.
pub(crate) const DOT_BELOW_TILES: usize = 32;

pub(crate) const DOT_THIN: usize = 8;

pub(crate) const DOT_FROM_K: usize = 128;

/// A split product (`matmul_split_k`) whose output has at most this many rows or columns
/// computes its slices as dot products.
pub(crate) const SPLIT_DOT_THIN: usize = 16;

/// Whether the dot-product kernel can read both operands: k is `a`'s column and `b`'s row
/// dimension, and it wants unit strides along it.
pub(crate) fn unit_k_strides(am: &validate::MatrixView, bm: &validate::MatrixView) -> bool {
    am.strides[2] == 1 && bm.strides[1] == 1
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
