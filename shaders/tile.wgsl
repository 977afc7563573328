// Matrix tiles, shared by gemm.wgsl and nearest_centroid.wgsl (included by both).
//
// A workgroup of 256 threads computes a BM x BN block of A B, BM = 16 TM and BN = 16 TN with
// TM, TN in {4, 8} (every pairing), stepping through k BK = 16 at a time with both
// operand tiles staged in workgroup memory. Thread (tx, ty) = (li % 16, li / 16) accumulates
// rows 4 ty .. 4 ty + 3 and, with TM = 8, 64 + 4 ty .. 64 + 4 ty + 3, over columns
// 4 tx .. 4 tx + 3 (c0..c7) and, with TN = 8, 64 + 4 tx .. 64 + 4 tx + 3 (d0..d7). Per k it
// reads TM / 4 + TN / 4 vec4s from workgroup memory (the A ones broadcast across the warp) for
// TM TN multiply-adds. The accumulators are private vec4s, never an indexed array, so they
// stay in registers.
//
// Operands are read through the typed, strided accessors `ld1` (A) and `ld2` (B) that the
// including kernel binds, so any dtype and any strides work.

// Rows and columns per thread.
// @slot tile_shape
const TM: u32 = 8u;
const TN: u32 = 4u;
// @end
const BM: u32 = 16u * TM;
const BN: u32 = 16u * TN;
const BK: u32 = 16u;

// As[k * AS_ROW + r / 4][r % 4] = A[row0 + r, kk + k]; Bs[k * BS_ROW + c / 4][c % 4] =
// B[kk + k, col0 + c]. Each k's row is padded by one vec4, so that the stores of a warp that
// stages 16 consecutive k of one row (see `stage`) spread over the banks (at most 2-way
// conflicts) instead of all landing in one.
const AS_ROW: u32 = BM / 4u + 1u;
const BS_ROW: u32 = BN / 4u + 1u;
var<workgroup> As: array<vec4<f32>, 528>;
var<workgroup> Bs: array<vec4<f32>, 528>;

var<private> c0: vec4<f32>;
var<private> c1: vec4<f32>;
var<private> c2: vec4<f32>;
var<private> c3: vec4<f32>;
var<private> c4: vec4<f32>;
var<private> c5: vec4<f32>;
var<private> c6: vec4<f32>;
var<private> c7: vec4<f32>;
var<private> d0: vec4<f32>;
var<private> d1: vec4<f32>;
var<private> d2: vec4<f32>;
var<private> d3: vec4<f32>;
var<private> d4: vec4<f32>;
var<private> d5: vec4<f32>;
var<private> d6: vec4<f32>;
var<private> d7: vec4<f32>;

struct Operands {
    m: u32,
    n: u32,
    kend: u32,
    // A[r, k] is element a_base + r a_row + k a_col of binding 1.
    a_base: i32,
    a_row: i32,
    a_col: i32,
    // B[k, c] is element b_base + k b_row + c b_col of binding 2.
    b_base: i32,
    b_row: i32,
    b_col: i32,
}

fn clear_tile() {
    c0 = vec4<f32>(0.0); c1 = vec4<f32>(0.0); c2 = vec4<f32>(0.0); c3 = vec4<f32>(0.0);
    c4 = vec4<f32>(0.0); c5 = vec4<f32>(0.0); c6 = vec4<f32>(0.0); c7 = vec4<f32>(0.0);
    d0 = vec4<f32>(0.0); d1 = vec4<f32>(0.0); d2 = vec4<f32>(0.0); d3 = vec4<f32>(0.0);
    d4 = vec4<f32>(0.0); d5 = vec4<f32>(0.0); d6 = vec4<f32>(0.0); d7 = vec4<f32>(0.0);
}

// Stages A[row0 .., kk ..] and B[kk .., col0 ..]; out-of-range elements are staged as 0.
// Each operand is read so that a warp's loads are coalesced:
// - where k is its contiguous dimension (`a_col` or `b_row` 1: a row-major A, a transposed
//   B), 16 neighbouring threads read 16 consecutive k of one row (column), 64 bytes;
// - otherwise neighbouring threads read neighbouring rows (columns), each four consecutive
//   k, which is one warp-wide run per k where rows (columns) are contiguous.
// (The first form used to be read like the second: each thread's four k one 16-byte run, but
// 32 rows apart across the warp. A weight gradient, both operands k-contiguous, ran at a
// third of the product's rate with the other operand layouts.)
fn stage(o: Operands, li: u32, row0: u32, col0: u32, kk: u32) {
    if (o.a_col == 1) {
        for (var e = 0u; e < TM; e = e + 1u) {
            let q = li + e * 256u;
            let k = q % BK;
            let r = q / BK;
            let row = row0 + r;
            var v = 0.0;
            if (row < o.m && kk + k < o.kend) { v = ld1(o.a_base + i32(row) * o.a_row + i32(kk + k)); }
            As[k * AS_ROW + r / 4u][r % 4u] = v;
        }
    } else {
        for (var e = 0u; e < TM / 4u; e = e + 1u) {
            let q = li + e * 256u;
            let r = q % BM;
            let k4 = (q / BM) * 4u;
            let row = row0 + r;
            for (var i = 0u; i < 4u; i = i + 1u) {
                let k = kk + k4 + i;
                var v = 0.0;
                if (row < o.m && k < o.kend) { v = ld1(o.a_base + i32(row) * o.a_row + i32(k) * o.a_col); }
                As[(k4 + i) * AS_ROW + r / 4u][r % 4u] = v;
            }
        }
    }
    if (o.b_row == 1) {
        for (var e = 0u; e < TN; e = e + 1u) {
            let q = li + e * 256u;
            let k = q % BK;
            let c = q / BK;
            let col = col0 + c;
            var v = 0.0;
            if (col < o.n && kk + k < o.kend) { v = ld2(o.b_base + i32(kk + k) + i32(col) * o.b_col); }
            Bs[k * BS_ROW + c / 4u][c % 4u] = v;
        }
    } else {
        for (var e = 0u; e < TN / 4u; e = e + 1u) {
            let q = li + e * 256u;
            let c = q % BN;
            let k4 = (q / BN) * 4u;
            let col = col0 + c;
            for (var i = 0u; i < 4u; i = i + 1u) {
                let k = kk + k4 + i;
                var v = 0.0;
                if (col < o.n && k < o.kend) { v = ld2(o.b_base + i32(k) * o.b_row + i32(col) * o.b_col); }
                Bs[(k4 + i) * BS_ROW + c / 4u][c % 4u] = v;
            }
        }
    }
}

// Accumulates the staged tiles into this thread's TM x TN block. (TM and TN are constants,
// so the compiler keeps only the branches of this shape.)
fn multiply(tx: u32, ty: u32) {
    for (var k = 0u; k < BK; k = k + 1u) {
        let b = Bs[k * BS_ROW + tx];
        let a0 = As[k * AS_ROW + ty];
        c0 = fma(vec4<f32>(a0.x), b, c0);
        c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2);
        c3 = fma(vec4<f32>(a0.w), b, c3);
        if (TN == 8u) {
            let b1 = Bs[k * BS_ROW + 16u + tx];
            d0 = fma(vec4<f32>(a0.x), b1, d0);
            d1 = fma(vec4<f32>(a0.y), b1, d1);
            d2 = fma(vec4<f32>(a0.z), b1, d2);
            d3 = fma(vec4<f32>(a0.w), b1, d3);
            if (TM == 8u) {
                let a1 = As[k * AS_ROW + 16u + ty];
                d4 = fma(vec4<f32>(a1.x), b1, d4);
                d5 = fma(vec4<f32>(a1.y), b1, d5);
                d6 = fma(vec4<f32>(a1.z), b1, d6);
                d7 = fma(vec4<f32>(a1.w), b1, d7);
            }
        }
        if (TM == 8u) {
            let a1 = As[k * AS_ROW + 16u + ty];
            c4 = fma(vec4<f32>(a1.x), b, c4);
            c5 = fma(vec4<f32>(a1.y), b, c5);
            c6 = fma(vec4<f32>(a1.z), b, c6);
            c7 = fma(vec4<f32>(a1.w), b, c7);
        }
    }
}

// The whole k range of one block: stage, multiply, repeat. Must be reached in uniform
// control flow (it synchronises the workgroup).
fn accumulate_block(o: Operands, li: u32, row0: u32, col0: u32, kstart: u32) {
    let tx = li % 16u;
    let ty = li / 16u;
    for (var kk = kstart; kk < o.kend; kk = kk + BK) {
        stage(o, li, row0, col0, kk);
        workgroupBarrier();
        multiply(tx, ty);
        workgroupBarrier();
    }
}
