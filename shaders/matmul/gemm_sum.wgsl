// The last pass of a product split over k (matmul_split_k): each output element sums its
// slices' partial products in slice order (Kahan-compensated, as reduce.wgsl sums), then adds
// the bias and applies the activation where the product has an epilogue, so a layer's forward
// pass costs no separate bias and activation launches.
// Binding 1: the partials, contiguous [slices, rows, cols] f32; binding 2: the bias (binding 1
// again where there is none; the epilogue slot then reads nothing); binding 3: the output;
// binding 4 (ROW_SUMS): the row sums.
// Blocks: 0 the output as [rows, cols], 1 the bias broadcast to [rows, cols], 2 the row sums
// (ROW_SUMS). Scalars: 0 and 1 the activation's parameters (unary.wgsl's slots), 2 the
// elements of one slice of partials, 3 slices, 4 the partials' columns (ROW_SUMS).

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn st3(i: i32, v: f32) { B3[i] = bitcast<u32>(v); }
// @end

// The bias and activation, generated for each product from unary.wgsl's expressions.
// @slot epilogue
fn epilogue(sum: f32, t: u32) -> f32 {
    let v = sum + ld2(off(1u, t));
    return select(v, 0.0, v < 0.0);
}
// @end

// With ROW_SUMS the partials have one more column than the output (scalar 4: the partials'
// columns), the sums of A's rows (tile.wgsl's ONES_COLUMN), stored through `row_sum` to
// binding 4 at block 2 (the row sums' layout).
// @slot row_sums
const ROW_SUMS: bool = false;
fn row_sum(row: u32, v: f32) {}
// @end

fn kernel(t: u32) {
    var r = running_start();
    for (var slice = 0u; slice < s(3u); slice = slice + 1u) {
        running_add(&r, ld1(i32(slice * s(2u) + t)));
    }
    if (r.seen_nan) { r.sum = nan(); }
    var e = t;
    if (ROW_SUMS) {
        let row = t / s(4u);
        let col = t % s(4u);
        if (col + 1u == s(4u)) {
            row_sum(row, r.sum);
            return;
        }
        e = row * (s(4u) - 1u) + col;
    }
    st3(off(0u, e), epilogue(r.sum, e));
}
