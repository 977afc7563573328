enable f16;
enable wgpu_cooperative_matrix;

// Matrix product on cooperative matrices (tensor cores): C = A B with f16 inputs and f32
// accumulation, 16 x 16 x 16 fragments. A is [batch, Mp, Kp] and B [batch, Kp, Np], row major,
// f16 (bindings MA, MB), every extent a whole number of tiles (gemm_pack.wgsl pads and converts other operands);
// C is f32 at `MC[s9 + z s6 + r s3 + c]`.
//
// One workgroup computes a BM x BN block of C with 8 subgroups of 32 lanes in an SR x SC
// grid, each TM x TN fragments. Each step of BK = 32 along k, every thread copies its share of
// the A and B tiles from storage to registers (the next tile's, while this one is multiplied),
// then to workgroup memory, whose rows are padded by 8 halves so that the fragment loads of
// the 8 rows a lane group reads fall in distinct banks.
//
// With `SPLIT` (the "fast f32" mode) the operands carry a second, low part at `s7` / `s8`
// halves past the high part: a = hi + lo / 2048. The high products accumulate in `c`, the two
// cross products (hi lo, lo hi) in `d`, and C = c + d / 2048: about 22 significant bits.
//
// Scalars: 0 Kp, 1 A's row stride, 2 B's row stride, 3 C's row stride, 4-6 the batch strides
// of A, B, C, 7-8 the low parts' offsets, 9 C's offset, 10-11 the range check's verdict word
// and serial (serial 0: no check; otherwise the kernel writes nothing if the verdict matches),
// 12-13 A's and B's offsets (halves, multiples of 8, as are the strides).
// Grid: (Np / BN, Mp / BM, batch).

@group(0) @binding(1) var<storage, read> MA: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> MB: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> MC: array<f32>;
@group(0) @binding(4) var<storage, read> V: array<u32>;

const BK: u32 = 32u;
// @slot config
const SR: u32 = 2u;
const SC: u32 = 4u;
const TM: u32 = 4u;
const TN: u32 = 2u;
// @end

// @include coop_tiles.wgsl

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    _ = arrayLength(&MA); _ = arrayLength(&MB); _ = arrayLength(&MC); _ = arrayLength(&V);
    // The verdict through workgroup memory: fragment operations need uniform control flow.
    if (li == 0u) { skip = vec4<u32>(select(0u, 1u, s(11u) != 0u && V[s(10u)] == s(11u))); }
    if (workgroupUniformLoad(&skip).x != 0u) { return; }
    let sg = li / 32u;
    let ar = (sg / SC) * TM * 16u;
    let bc = (sg % SC) * TN * 16u;
    let row0 = wg.y * BM;
    let col0 = wg.x * BN;
    let abase = s(12u) + wg.z * s(4u) + row0 * s(1u);
    let bbase = s(13u) + wg.z * s(5u) + col0;
    // @slot accumulators
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c20 = coop_mat16x16<f32, C>();
    var c21 = coop_mat16x16<f32, C>();
    var c30 = coop_mat16x16<f32, C>();
    var c31 = coop_mat16x16<f32, C>();
    // @end
    // @slot k_loop
    var ra: array<vec4<u32>, AV>;
    var rb: array<vec4<u32>, BV>;
    for (var j = 0u; j < AV; j = j + 1u) { ra[j] = MA[a_at(abase, li + 256u * j, 0u)]; }
    for (var j = 0u; j < BV; j = j + 1u) { rb[j] = MB[b_at(bbase, li + 256u * j, 0u)]; }
    let steps = s(0u) / BK;
    for (var kt = 0u; kt < steps; kt = kt + 1u) {
        workgroupBarrier();
        for (var j = 0u; j < AV; j = j + 1u) { put_a(li + 256u * j, ra[j], false); }
        for (var j = 0u; j < BV; j = j + 1u) { put_b(li + 256u * j, rb[j], false); }
        workgroupBarrier();
        if (kt + 1u < steps) {
            let k1 = (kt + 1u) * BK;
            for (var j = 0u; j < AV; j = j + 1u) { ra[j] = MA[a_at(abase, li + 256u * j, k1)]; }
            for (var j = 0u; j < BV; j = j + 1u) { rb[j] = MB[b_at(bbase, li + 256u * j, k1)]; }
        }
        for (var kk = 0u; kk < BK; kk = kk + 16u) {
            let at_a0 = (ar + 0u) * AS + kk;
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&SA[at_a0], AS);
            let at_a1 = (ar + 16u) * AS + kk;
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&SA[at_a1], AS);
            let at_a2 = (ar + 32u) * AS + kk;
            let a2 = coopLoadT<coop_mat16x16<f16, A>>(&SA[at_a2], AS);
            let at_a3 = (ar + 48u) * AS + kk;
            let a3 = coopLoadT<coop_mat16x16<f16, A>>(&SA[at_a3], AS);
            let at_b0 = kk * BS + bc + 0u;
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&SB[at_b0], BS);
            let at_b1 = kk * BS + bc + 16u;
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&SB[at_b1], BS);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            c20 = coopMultiplyAdd(a2, b0, c20);
            c21 = coopMultiplyAdd(a2, b1, c21);
            c30 = coopMultiplyAdd(a3, b0, c30);
            c31 = coopMultiplyAdd(a3, b1, c31);
        }
    }
    // @end
    let cbase = s(9u) + wg.z * s(6u) + (row0 + ar) * s(3u) + col0 + bc;
    let ld = s(3u);
    // @slot store
    let at_c00 = cbase + 0u * ld + 0u;
    coopStoreT(c00, &MC[at_c00], ld);
    let at_c01 = cbase + 0u * ld + 16u;
    coopStoreT(c01, &MC[at_c01], ld);
    let at_c10 = cbase + 16u * ld + 0u;
    coopStoreT(c10, &MC[at_c10], ld);
    let at_c11 = cbase + 16u * ld + 16u;
    coopStoreT(c11, &MC[at_c11], ld);
    let at_c20 = cbase + 32u * ld + 0u;
    coopStoreT(c20, &MC[at_c20], ld);
    let at_c21 = cbase + 32u * ld + 16u;
    coopStoreT(c21, &MC[at_c21], ld);
    let at_c30 = cbase + 48u * ld + 0u;
    coopStoreT(c30, &MC[at_c30], ld);
    let at_c31 = cbase + 48u * ld + 16u;
    coopStoreT(c31, &MC[at_c31], ld);
    // @end
}
