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
// Operands are read through the typed, strided accessors `ld1` (A, by way of `lda`) and `ld2`
// (B) that the including kernel binds, so any dtype and any strides work.

// How A is read: a backward product's gate (the backend's `a_load` slot) scales each element
// by an activation's derivative as it is staged.
// @slot a_load
fn lda(i: i32) -> f32 { return ld1(i); }
// @end

// With ONES_COLUMN, B has a column of ones after its real columns (the last of `n`), so the
// product's last column holds the sums of A's rows (a Linear layer's bias gradient beside its
// weight gradient).
// @slot ones_column
const ONES_COLUMN: bool = false;
// @end

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
// stages 16 consecutive k of one row (see `place`) spread over the banks (at most 2-way
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

// Staging A[row0 .., kk ..] and B[kk .., col0 ..] into workgroup memory; out-of-range
// elements are staged as 0. Each thread moves TM elements of A and TN of B, numbered `e`, so
// that a warp's loads are coalesced:
// - where k is its operand's contiguous dimension (`a_col` or `b_row` 1: a row-major A, a
//   transposed B), 16 neighbouring threads read 16 consecutive k of one row (column), 64
//   bytes: element e is the k % 16 = q % 16 of row (column) q / 16, q = li + 256 e;
// - otherwise neighbouring threads read neighbouring rows (columns), each four consecutive
//   k, which is one warp-wide run per k where rows (columns) are contiguous: element e is k
//   4 (q / BM) + e % 4 of row q % BM, q = li + 256 (e / 4).
// (The first form used to be read like the second: each thread's four k one 16-byte run, but
// 32 rows apart across the warp. A weight gradient, both operands k-contiguous, ran at a
// third of the product's rate with the other operand layouts.)
// The loads of the next step are issued before the current step's multiply-adds (into
// registers: `na*`, `nb*`) and stored to workgroup memory after them, so their latency hides
// behind the arithmetic instead of stalling every step.

var<private> na0: vec4<f32>;
var<private> na1: vec4<f32>;
var<private> nb0: vec4<f32>;
var<private> nb1: vec4<f32>;

// Element e of an operand's staging: its (row or column, k) within the block, for an operand
// whose k is contiguous (`k_contiguous`) or not, `extent` rows (A: BM) or columns (B: BN).
fn place(k_contiguous: bool, extent: u32, li: u32, e: u32) -> vec2<u32> {
    if (k_contiguous) {
        let q = li + e * 256u;
        return vec2<u32>(q / BK, q % BK);
    }
    let q = li + (e / 4u) * 256u;
    return vec2<u32>(q % extent, (q / extent) * 4u + e % 4u);
}

fn a_place(o: Operands, li: u32, e: u32) -> vec2<u32> { return place(o.a_col == 1, BM, li, e); }
fn b_place(o: Operands, li: u32, e: u32) -> vec2<u32> { return place(o.b_row == 1, BN, li, e); }

fn a_fetch(o: Operands, li: u32, row0: u32, kk: u32, e: u32) -> f32 {
    let at = a_place(o, li, e);
    let row = row0 + at.x;
    let k = kk + at.y;
    if (row < o.m && k < o.kend) { return lda(o.a_base + i32(row) * o.a_row + i32(k) * o.a_col); }
    return 0.0;
}

fn b_fetch(o: Operands, li: u32, col0: u32, kk: u32, e: u32) -> f32 {
    let at = b_place(o, li, e);
    let col = col0 + at.x;
    let k = kk + at.y;
    if (ONES_COLUMN && col + 1u == o.n) { return select(0.0, 1.0, k < o.kend); }
    if (col < o.n && k < o.kend) { return ld2(o.b_base + i32(k) * o.b_row + i32(col) * o.b_col); }
    return 0.0;
}

// Loads this thread's elements of step kk into the registers (straight-line code: no
// indexed private array, which would live in memory).
fn fetch(o: Operands, li: u32, row0: u32, col0: u32, kk: u32) {
    na0 = vec4<f32>(a_fetch(o, li, row0, kk, 0u), a_fetch(o, li, row0, kk, 1u), a_fetch(o, li, row0, kk, 2u), a_fetch(o, li, row0, kk, 3u));
    if (TM == 8u) {
        na1 = vec4<f32>(a_fetch(o, li, row0, kk, 4u), a_fetch(o, li, row0, kk, 5u), a_fetch(o, li, row0, kk, 6u), a_fetch(o, li, row0, kk, 7u));
    }
    nb0 = vec4<f32>(b_fetch(o, li, col0, kk, 0u), b_fetch(o, li, col0, kk, 1u), b_fetch(o, li, col0, kk, 2u), b_fetch(o, li, col0, kk, 3u));
    if (TN == 8u) {
        nb1 = vec4<f32>(b_fetch(o, li, col0, kk, 4u), b_fetch(o, li, col0, kk, 5u), b_fetch(o, li, col0, kk, 6u), b_fetch(o, li, col0, kk, 7u));
    }
}

fn a_deposit(o: Operands, li: u32, e: u32, v: f32) {
    let at = a_place(o, li, e);
    As[at.y * AS_ROW + at.x / 4u][at.x % 4u] = v;
}

fn b_deposit(o: Operands, li: u32, e: u32, v: f32) {
    let at = b_place(o, li, e);
    Bs[at.y * BS_ROW + at.x / 4u][at.x % 4u] = v;
}

// Stores the fetched registers to workgroup memory.
fn deposit(o: Operands, li: u32) {
    a_deposit(o, li, 0u, na0.x); a_deposit(o, li, 1u, na0.y); a_deposit(o, li, 2u, na0.z); a_deposit(o, li, 3u, na0.w);
    if (TM == 8u) {
        a_deposit(o, li, 4u, na1.x); a_deposit(o, li, 5u, na1.y); a_deposit(o, li, 6u, na1.z); a_deposit(o, li, 7u, na1.w);
    }
    b_deposit(o, li, 0u, nb0.x); b_deposit(o, li, 1u, nb0.y); b_deposit(o, li, 2u, nb0.z); b_deposit(o, li, 3u, nb0.w);
    if (TN == 8u) {
        b_deposit(o, li, 4u, nb1.x); b_deposit(o, li, 5u, nb1.y); b_deposit(o, li, 6u, nb1.z); b_deposit(o, li, 7u, nb1.w);
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

// The whole k range of one block: fetch the first step, then deposit, fetch the next,
// multiply, repeat. Must be reached in uniform control flow (it synchronises the workgroup;
// `kstart`, `o.kend` and so every branch here are uniform).
fn accumulate_block(o: Operands, li: u32, row0: u32, col0: u32, kstart: u32) {
    let tx = li % 16u;
    let ty = li / 16u;
    if (kstart >= o.kend) { return; }
    fetch(o, li, row0, col0, kstart);
    for (var kk = kstart; kk < o.kend; kk = kk + BK) {
        deposit(o, li);
        workgroupBarrier();
        if (kk + BK < o.kend) { fetch(o, li, row0, col0, kk + BK); }
        multiply(tx, ty);
        workgroupBarrier();
    }
}
