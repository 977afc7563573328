// What gemm_dot.wgsl and gemm_dot_subgroups.wgsl share: the operands and one thread's part of
// an output's dot product. Parameters: gemm_params.wgsl (the kernel files include it).

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn ld3(i: i32) -> f32 { return bitcast<f32>(B3[i]); }
fn st3(i: i32, v: f32) { B3[i] = bitcast<u32>(v); }
// @end

// How A is read and whether B has a column of ones after its last: as in tile.wgsl.
// @slot a_load
fn lda(i: i32) -> f32 { return ld1(i); }
// @end
// @slot ones_column
const ONES_COLUMN: bool = false;
// @end

// What a product run whole here does to each output after alpha and beta (the backend's
// `dot_epilogue` slot): a matmul epilogue's bias and activation at (row, column), and with
// ROW_SUMS_APART (B has a column of ones) the store of that last column, the row sums times
// alpha, apart from the output. A split product's slices write the column of ones with their
// partials and leave all this to its sum pass (gemm_sum.wgsl).
// @slot dot_epilogue
const ROW_SUMS_APART: bool = false;
fn epilogue(x: f32, row: u32, col: u32) -> f32 { return x; }
fn row_sum(row: u32, v: f32) {}
// @end

var<workgroup> RED: array<f32, 256>;

// Output `o` (batch, row, column) of the batched product, row-major over (batch, m, n).
fn output_at(o: u32) -> vec3<u32> {
    let p = gemm_params();
    let mn = p.rows * p.cols;
    return vec3<u32>(o / mn, (o % mn) / p.cols, o % p.cols);
}

// Thread `lane`'s share of output `o`: k = first k + lane, + 32, ... below the end k. Outputs
// past the last give 0 (their threads still take part in the combining).
fn dot_partial(o: u32, lane: u32) -> f32 {
    _ = arrayLength(&B1); _ = arrayLength(&B2); _ = arrayLength(&B3);
    // Parameters in registers: read from a buffer, the compiler could not hoist them (the
    // output binding might alias it).
    let p = gemm_params();
    if (o >= p.outputs) { return 0.0; }
    let at = output_at(o);
    let a = off(0u, at.x) + i32(at.y) * p.a_row_stride;
    let b = off(1u, at.x) + i32(at.z) * p.b_col_stride;
    let end = p.k_end;
    let sa = p.a_col_stride;
    let sb = p.b_row_stride;
    var acc = 0.0;
    if (ONES_COLUMN && at.z + 1u == p.cols) {
        // The column of ones: the sum of A's row.
        for (var k = p.k_start + lane; k < end; k = k + 32u) {
            acc = acc + lda(a + i32(k) * sa);
        }
        return acc;
    }
    for (var k = p.k_start + lane; k < end; k = k + 32u) {
        acc = fma(lda(a + i32(k) * sa), ld2(b + i32(k) * sb), acc);
    }
    return acc;
}

fn write_out(o: u32, sum: f32) {
    let p = gemm_params();
    if (o >= p.outputs) { return; }
    let at = output_at(o);
    if (ROW_SUMS_APART && at.z + 1u == p.cols) {
        row_sum(at.y, p.alpha * sum);
        return;
    }
    let i = off(2u, at.x) + i32(at.y) * p.out_row_stride + i32(at.z) * p.out_col_stride;
    var x = p.alpha * sum;
    if (p.beta != 0.0) { x = x + p.beta * ld3(i); }
    st3(i, epilogue(x, at.y, at.z));
}
