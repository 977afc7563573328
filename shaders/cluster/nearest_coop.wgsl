enable f16;
enable wgpu_cooperative_matrix;

// Nearest-centroid search under hal::Precision::Fast on cooperative matrices: each point's
// centroids ranked by |c|^2 - 2 x.c with x and c rounded to f16 (products on the matrix units,
// f32 accumulation), its two best kept as candidates that nearest_recheck_subgroups.wgsl compares in
// f32. No n x m matrix is written: a workgroup takes 128 points and sweeps every block of 128
// centroids (gemm_coop.wgsl's accumulation, each subgroup 16 points by the 128 centroids),
// then scans the block's scores two fragments at a time through workgroup memory.
// Bindings: 1 the points [Np, Kp] and 2 the centroids transposed [Kp, Mp], f16 packed by
// gemm_pack.wgsl; 3 the centroids' squared norms (f32, Mp of them, +inf past m); 4 the candidates (u32, two
// per point, 0xffffffff for none); 5 the range check's verdicts.
// Scalars: 0 Kp, 1 the points' row stride (Kp), 2 the centroids' row stride (Mp), 3 m,
// 4 blocks of centroids (Mp / 128), 5 n, 10-11 the range check's verdict word and serial
// (a failed check leaves the search to nearest_recheck_subgroups.wgsl), 12-13 zero (the operands'
// offsets). Grid: the blocks of points, over x then y.

@group(0) @binding(1) var<storage, read> MA: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> MB: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> NORMS: array<f32>;
@group(0) @binding(4) var<storage, read_write> CAND: array<u32>;
@group(0) @binding(5) var<storage, read> V: array<u32>;

const BK: u32 = 32u;
const SR: u32 = 8u;
const SC: u32 = 1u;
const TM: u32 = 1u;
const TN: u32 = 8u;

// @include coop_tiles.wgsl

// Each subgroup's scratch: two fragments of scores stored column by column, the second 16
// floats further than packed, so that at each step the 32 lanes (lane: row lane % 16 of
// fragment lane / 16) read 32 distinct banks.
const SECOND: u32 = 272u;
var<workgroup> SCORE: array<f32, 8u * (SECOND + 256u)>;
// The block's centroid norms.
var<workgroup> NS: array<f32, 128>;
// The two halves of each row's candidates, merged at the end.
var<workgroup> MERGE: array<u32, 1024>;

const NONE: u32 = 0xffffffffu;

// The two lowest (score, index) pairs seen, in order (an index breaks ties; NaN never enters).
struct Best {
    v0: f32,
    i0: u32,
    v1: f32,
    i1: u32,
}

fn offer(b: ptr<function, Best>, v: f32, i: u32) {
    if (v < (*b).v0 || (v == (*b).v0 && i < (*b).i0)) {
        (*b).v1 = (*b).v0;
        (*b).i1 = (*b).i0;
        (*b).v0 = v;
        (*b).i0 = i;
    } else if (v < (*b).v1 || (v == (*b).v1 && i < (*b).i1)) {
        (*b).v1 = v;
        (*b).i1 = i;
    }
}

// A lane's share of two fragments of scores: row `lane % 16` of fragment `lane / 16`, the
// columns `first..first + 16` of the block (at centroid `col0`). Columns come in increasing
// order, so a strictly lower score is the only way in (ties keep the lower index).
fn scan(sbase: u32, first: u32, col0: u32, lane: u32, best: ptr<function, Best>) {
    let h = lane / 16u;
    let at = sbase + h * SECOND + lane % 16u;
    let c = first + h * 16u;
    for (var j = 0u; j < 16u; j = j + 1u) {
        let v = fma(-2.0, SCORE[at + 16u * j], NS[c + j]);
        if (v < (*best).v1) {
            if (v < (*best).v0) {
                (*best).v1 = (*best).v0;
                (*best).i1 = (*best).i0;
                (*best).v0 = v;
                (*best).i0 = col0 + c + j;
            } else {
                (*best).v1 = v;
                (*best).i1 = col0 + c + j;
            }
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    _ = arrayLength(&MA); _ = arrayLength(&MB); _ = arrayLength(&NORMS); _ = arrayLength(&CAND); _ = arrayLength(&V);
    // The verdict through workgroup memory: fragment operations need uniform control flow.
    // (A workgroup past the last point, in a grid of whole rows, has nothing to do either.)
    let row0 = (wg.y * nwg.x + wg.x) * BM;
    if (li == 0u) {
        let failed = s(11u) != 0u && V[s(10u)] == s(11u);
        skip = vec4<u32>(select(0u, 1u, failed || row0 >= s(5u)));
    }
    if (workgroupUniformLoad(&skip).x != 0u) { return; }
    let sg = li / 32u;
    let lane = li % 32u;
    let ar = sg * 16u;
    let bc = 0u;
    let abase = s(12u) + row0 * s(1u);
    let sbase = sg * (SECOND + 256u);
    var best = Best(inf(), NONE, inf(), NONE);
    for (var cb = 0u; cb < s(4u); cb = cb + 1u) {
        let col0 = cb * BN;
        let bbase = s(13u) + col0;
        // @slot accumulators
        var c00 = coop_mat16x16<f32, C>();
        var c01 = coop_mat16x16<f32, C>();
        var c02 = coop_mat16x16<f32, C>();
        var c03 = coop_mat16x16<f32, C>();
        var c04 = coop_mat16x16<f32, C>();
        var c05 = coop_mat16x16<f32, C>();
        var c06 = coop_mat16x16<f32, C>();
        var c07 = coop_mat16x16<f32, C>();
        // @end
        // @slot k_loop
        // (Filled by the backend with gemm_coop.wgsl's accumulation over k, from coop.rs.)
        // @end
        // @slot scan
        if (li < BN) { NS[li] = NORMS[col0 + li]; }
        workgroupBarrier();
        coopStore(c00, &SCORE[sbase], 16u);
        coopStore(c01, &SCORE[sbase + SECOND], 16u);
        workgroupBarrier();
        scan(sbase, 0u, col0, lane, &best);
        workgroupBarrier();
        coopStore(c02, &SCORE[sbase], 16u);
        coopStore(c03, &SCORE[sbase + SECOND], 16u);
        workgroupBarrier();
        scan(sbase, 32u, col0, lane, &best);
        workgroupBarrier();
        coopStore(c04, &SCORE[sbase], 16u);
        coopStore(c05, &SCORE[sbase + SECOND], 16u);
        workgroupBarrier();
        scan(sbase, 64u, col0, lane, &best);
        workgroupBarrier();
        coopStore(c06, &SCORE[sbase], 16u);
        coopStore(c07, &SCORE[sbase + SECOND], 16u);
        workgroupBarrier();
        scan(sbase, 96u, col0, lane, &best);
        // @end
    }
    MERGE[li * 4u] = bitcast<u32>(best.v0);
    MERGE[li * 4u + 1u] = best.i0;
    MERGE[li * 4u + 2u] = bitcast<u32>(best.v1);
    MERGE[li * 4u + 3u] = best.i1;
    workgroupBarrier();
    if (lane < 16u) {
        let other = (li + 16u) * 4u;
        offer(&best, bitcast<f32>(MERGE[other]), MERGE[other + 1u]);
        offer(&best, bitcast<f32>(MERGE[other + 2u]), MERGE[other + 3u]);
        let row = row0 + ar + lane;
        if (row < s(5u)) {
            CAND[row * 2u] = best.i0;
            CAND[row * 2u + 1u] = best.i1;
        }
    }
}
