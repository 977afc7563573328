// Batched matrix product: out = alpha A B + beta out (beta 0 ignores out), one BM x BN block
// of one batch per workgroup (grid: column blocks, row blocks, batch). See tile.wgsl; the
// parameters are gemm_params.wgsl's, shared with gemm_dot_body.wgsl. As the f32 fallback of
// a cooperative-matrix product, the `guard` slot reads that product's range-check verdict
// (verdict_word, verdict_serial) and the block writes nothing unless the check failed.

// @include tile.wgsl
// @include gemm_params.wgsl

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn ld3(i: i32) -> f32 { return bitcast<f32>(B3[i]); }
fn st3(i: i32, v: f32) { B3[i] = bitcast<u32>(v); }
// @end

// @slot guard
fn skipped() -> bool { return false; }
// @end

var<workgroup> skip_block: u32;

fn store_row(obase: i32, r: u32, col: u32, v: vec4<f32>) {
    let p = gemm_params();
    if (r >= p.rows) { return; }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let c = col + j;
        if (c < p.cols) {
            let o = obase + i32(r) * p.out_row_stride + i32(c) * p.out_col_stride;
            var x = p.alpha * v[j];
            if (p.beta != 0.0) { x = x + p.beta * ld3(o); }
            st3(o, x);
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    _ = arrayLength(&B1); _ = arrayLength(&B2); _ = arrayLength(&B3);
    // Through workgroup memory, so that the early return is uniform (barriers follow).
    if (li == 0u) { skip_block = select(0u, 1u, skipped()); }
    if (workgroupUniformLoad(&skip_block) != 0u) { return; }
    let p = gemm_params();
    let o = Operands(p.rows, p.cols, p.k_end, off(0u, wg.z), p.a_row_stride, p.a_col_stride,
        off(1u, wg.z), p.b_row_stride, p.b_col_stride);
    let row0 = wg.y * BM;
    let col0 = wg.x * BN;
    clear_tile();
    accumulate_block(o, li, row0, col0, p.k_start);
    let obase = off(2u, wg.z);
    let r = row0 + 4u * (li / 16u);
    let c = col0 + 4u * (li % 16u);
    store_row(obase, r, c, c0);
    store_row(obase, r + 1u, c, c1);
    store_row(obase, r + 2u, c, c2);
    store_row(obase, r + 3u, c, c3);
    if (TM == 8u) {
        store_row(obase, r + 64u, c, c4);
        store_row(obase, r + 65u, c, c5);
        store_row(obase, r + 66u, c, c6);
        store_row(obase, r + 67u, c, c7);
    }
    if (TN == 8u) {
        store_row(obase, r, c + 64u, d0);
        store_row(obase, r + 1u, c + 64u, d1);
        store_row(obase, r + 2u, c + 64u, d2);
        store_row(obase, r + 3u, c + 64u, d3);
        if (TM == 8u) {
            store_row(obase, r + 64u, c + 64u, d4);
            store_row(obase, r + 65u, c + 64u, d5);
            store_row(obase, r + 66u, c + 64u, d6);
            store_row(obase, r + 67u, c + 64u, d7);
        }
    }
}
