// Nearest centroid, fused: for a block of 128 points a workgroup sweeps every centroid of this
// slice in tiles of 64, computing dot products with the tiled product of tile.wgsl and
// keeping each point's best |c|^2 - 2 x.c (|x|^2 is the same for every centroid of a point;
// |c|^2 comes precomputed in binding 5, from row_norms.wgsl);
// no point-by-centroid matrix is ever written. Each thread keeps the best of its own columns;
// the 16 threads sharing a row then combine theirs through workgroup memory (lowest index on
// ties), and the winner's distance is recomputed exactly, sum_k (x_k - c_k)^2 with
// multiply-adds in order of k, as the CPU reference does. Each thread also keeps its second
// best; where the row's runner-up score is within the rounding error bound of the best (a
// point about equally far from two centroids), the two are ranked by their exact distances,
// as the reference would rank them (the CPU backend's GEMM search does the same, over every
// candidate within the bound).
//
// Long centroid lists run as several slices (dispatches) in order; a later slice replaces a
// point's result only with a strictly smaller distance, so ties still go to the lowest index.
//
// Blocks: 0 out_index, 1 out_distance. Scalars: 0 n, 1 end of the slice's centroids, 2 d,
// 3 x's offset, 4-5 x's row and column strides, 6 the centroids' offset, 7-8 their row and
// column strides, 9 the slice's first centroid, 10 whether an earlier slice wrote results,
// 11 whether fma() is fused, 12 zero (fma_exact.wgsl).

// @include tile.wgsl
// @include fma_exact.wgsl
// @include keep.wgsl

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn bits3(i: i32) -> u32 { return B3[i]; }
fn stbits3(i: i32, v: u32) { B3[i] = v; }
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
fn ld4(i: i32) -> f32 { return bitcast<f32>(B4[i]); }
fn st4(i: i32, v: f32) { B4[i] = bitcast<u32>(v); }
// @end
@group(0) @binding(5) var<storage, read> B5: array<f32>;

const NONE: u32 = 0xffffffffu;

// Each row's winning centroid, after the workgroup has combined its threads' candidates, its
// score, and the lowest score of any other centroid (the runner-up).
var<workgroup> winner: array<u32, 128>;
var<workgroup> winner_score: array<f32, 128>;
var<workgroup> runner_up: array<f32, 128>;
var<workgroup> runner_up_index: array<u32, 128>;

// This thread's best score and centroid for each of its eight rows.
var<private> bv0: f32; var<private> bv1: f32; var<private> bv2: f32; var<private> bv3: f32;
var<private> bv4: f32; var<private> bv5: f32; var<private> bv6: f32; var<private> bv7: f32;
var<private> bi0: u32; var<private> bi1: u32; var<private> bi2: u32; var<private> bi3: u32;
var<private> bi4: u32; var<private> bi5: u32; var<private> bi6: u32; var<private> bi7: u32;
// This thread's second best score and centroid for each of its eight rows.
var<private> sv0: f32; var<private> sv1: f32; var<private> sv2: f32; var<private> sv3: f32;
var<private> sv4: f32; var<private> sv5: f32; var<private> sv6: f32; var<private> sv7: f32;
var<private> sj0: u32; var<private> sj1: u32; var<private> sj2: u32; var<private> sj3: u32;
var<private> sj4: u32; var<private> sj5: u32; var<private> sj6: u32; var<private> sj7: u32;

// Does candidate (v, i) beat (bv, bi)? The smaller score, then the lower index; NONE is no
// candidate. (Scores that are NaN or infinite never become candidates: a row left without
// one gets the slice's first centroid and its exact distance, NaN or infinite.)
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return i != NONE && (bi == NONE || v < bv || (v == bv && i < bi));
}

// Folds one row's dot products with this tile's four columns (norms `cn`) into its running
// best and second best. Columns arrive in increasing order, so the strict comparison keeps
// the lowest index on ties (an equal score becomes the second best).
fn improve(dots: vec4<f32>, cn: vec4<f32>, col: u32, end: u32, bv: ptr<private, f32>, bi: ptr<private, u32>, sv: ptr<private, f32>, sj: ptr<private, u32>) {
    let v = cn - 2.0 * dots;
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (col + j < end) {
            if (v[j] < *bv) {
                *sv = *bv;
                *sj = *bi;
                *bv = v[j];
                *bi = col + j;
            } else if (v[j] < *sv) {
                *sv = v[j];
                *sj = col + j;
            }
        }
    }
}

fn scratch_put(w: u32, v: f32) { As[w / 4u][w % 4u] = v; }
fn scratch_get(w: u32) -> f32 { return As[w / 4u][w % 4u]; }

// One candidate per (row, thread) into the scratch: scores at 0..1023, indices after.
fn put_candidate(slot: u32, v: f32, i: u32) {
    scratch_put(slot, v);
    scratch_put(1024u + slot, bitcast<f32>(i));
}

struct Candidate { v: f32, i: u32 }

// The best of row `r`'s 16 candidates in the scratch (`beats`: lower score, then index).
fn best_of_row(r: u32) -> Candidate {
    var best = Candidate(0.0, NONE);
    for (var j = 0u; j < 16u; j = j + 1u) {
        let v = scratch_get(r * 16u + j);
        let i = bitcast<u32>(scratch_get(1024u + r * 16u + j));
        if (beats(v, i, best.v, best.i)) { best = Candidate(v, i); }
    }
    return best;
}

// Combines the 16 candidates of 64 rows (this thread's rows `half` of c0..c3 or c4..c7): the
// winner, then the runner-up (each thread's best other than the winner, else its second best).
fn combine(li: u32, half: u32, v: vec4<f32>, i: vec4<u32>, second: vec4<f32>, second_i: vec4<u32>) {
    let tx = li % 16u;
    let ty = li / 16u;
    for (var q = 0u; q < 4u; q = q + 1u) {
        put_candidate((4u * ty + q) * 16u + tx, v[q], i[q]);
    }
    workgroupBarrier();
    if (li < 64u) {
        let best = best_of_row(li);
        winner[half * 64u + li] = best.i;
        winner_score[half * 64u + li] = best.v;
    }
    workgroupBarrier();
    for (var q = 0u; q < 4u; q = q + 1u) {
        let slot = (4u * ty + q) * 16u + tx;
        if (i[q] == winner[half * 64u + 4u * ty + q]) {
            put_candidate(slot, second[q], second_i[q]);
        } else {
            put_candidate(slot, v[q], i[q]);
        }
    }
    workgroupBarrier();
    if (li < 64u) {
        let other = best_of_row(li);
        runner_up[half * 64u + li] = other.v;
        runner_up_index[half * 64u + li] = other.i;
    }
    workgroupBarrier();
}

// The exact distance from row `xb` to centroid `at`, summed as the CPU reference does, with
// correctly rounded multiply-adds (fma_exact.wgsl) so that the bits match it.
fn exact_distance(xb: i32, at: u32) -> f32 {
    let cb = si(6u) + i32(at) * si(7u);
    var dist = 0.0;
    for (var k = 0u; k < s(2u); k = k + 1u) {
        let diff = ld1(xb + i32(k) * si(5u)) - ld2(cb + i32(k) * si(8u));
        dist = fma_exact(diff, diff, dist);
    }
    return dist;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    _ = arrayLength(&B1); _ = arrayLength(&B2); _ = arrayLength(&B3); _ = arrayLength(&B4); _ = arrayLength(&B5);
    let n = s(0u);
    let row0 = (wg.y * nwg.x + wg.x) * BM;
    if (row0 >= n) { return; }
    let o = Operands(n, s(1u), s(2u), si(3u), si(4u), si(5u), si(6u), si(8u), si(7u));
    let far = inf();
    bv0 = far; bv1 = far; bv2 = far; bv3 = far; bv4 = far; bv5 = far; bv6 = far; bv7 = far;
    bi0 = NONE; bi1 = NONE; bi2 = NONE; bi3 = NONE; bi4 = NONE; bi5 = NONE; bi6 = NONE; bi7 = NONE;
    sv0 = far; sv1 = far; sv2 = far; sv3 = far; sv4 = far; sv5 = far; sv6 = far; sv7 = far;
    sj0 = NONE; sj1 = NONE; sj2 = NONE; sj3 = NONE; sj4 = NONE; sj5 = NONE; sj6 = NONE; sj7 = NONE;
    let end = s(1u);
    for (var col0 = s(9u); col0 < end; col0 = col0 + BN) {
        clear_tile();
        accumulate_block(o, li, row0, col0, 0u);
        let col = col0 + 4u * (li % 16u);
        var cn = vec4<f32>(0.0);
        for (var j = 0u; j < 4u; j = j + 1u) {
            if (col + j < end) { cn[j] = B5[col + j]; }
        }
        improve(c0, cn, col, end, &bv0, &bi0, &sv0, &sj0);
        improve(c1, cn, col, end, &bv1, &bi1, &sv1, &sj1);
        improve(c2, cn, col, end, &bv2, &bi2, &sv2, &sj2);
        improve(c3, cn, col, end, &bv3, &bi3, &sv3, &sj3);
        improve(c4, cn, col, end, &bv4, &bi4, &sv4, &sj4);
        improve(c5, cn, col, end, &bv5, &bi5, &sv5, &sj5);
        improve(c6, cn, col, end, &bv6, &bi6, &sv6, &sj6);
        improve(c7, cn, col, end, &bv7, &bi7, &sv7, &sj7);
        if (TN == 8u) {
            // This thread's second group of columns, 64 further on (visited after the first,
            // so ties still resolve to the lower index).
            let col2 = col + 64u;
            var cn2 = vec4<f32>(0.0);
            for (var j = 0u; j < 4u; j = j + 1u) {
                if (col2 + j < end) { cn2[j] = B5[col2 + j]; }
            }
            improve(d0, cn2, col2, end, &bv0, &bi0, &sv0, &sj0);
            improve(d1, cn2, col2, end, &bv1, &bi1, &sv1, &sj1);
            improve(d2, cn2, col2, end, &bv2, &bi2, &sv2, &sj2);
            improve(d3, cn2, col2, end, &bv3, &bi3, &sv3, &sj3);
            improve(d4, cn2, col2, end, &bv4, &bi4, &sv4, &sj4);
            improve(d5, cn2, col2, end, &bv5, &bi5, &sv5, &sj5);
            improve(d6, cn2, col2, end, &bv6, &bi6, &sv6, &sj6);
            improve(d7, cn2, col2, end, &bv7, &bi7, &sv7, &sj7);
        }
    }
    combine(li, 0u, vec4<f32>(bv0, bv1, bv2, bv3), vec4<u32>(bi0, bi1, bi2, bi3), vec4<f32>(sv0, sv1, sv2, sv3), vec4<u32>(sj0, sj1, sj2, sj3));
    combine(li, 1u, vec4<f32>(bv4, bv5, bv6, bv7), vec4<u32>(bi4, bi5, bi6, bi7), vec4<f32>(sv4, sv5, sv6, sv7), vec4<u32>(sj4, sj5, sj6, sj7));
    let row = row0 + li;
    if (li >= BM || row >= n) { return; }
    var at = winner[li];
    if (at == NONE) { at = s(9u); }
    let xb = si(3u) + i32(row) * si(4u);
    var dist = exact_distance(xb, at);
    let other = runner_up_index[li];
    if (winner[li] != NONE && other != NONE) {
        // Scores are within (d + 1) u (|x| + |c|)^2 of their true values, the exact distances
        // within d u (|x| + |c|)^2, and a centroid scoring near the best has
        // |c| <= 2 |x| + |c_winner|; twice the sum of those errors, as in the CPU backend.
        var xx = 0.0;
        for (var k = 0u; k < s(2u); k = k + 1u) {
            let xv = ld1(xb + i32(k) * si(5u));
            xx = fma(xv, xv, xx);
        }
        let reach = 3.0 * sqrt(xx) + 2.0 * sqrt(max(B5[at], 0.0));
        let slack = 8.0 * (f32(s(2u)) + 2.0) * 5.9604645e-8 * reach * reach;
        if (runner_up[li] <= winner_score[li] + slack) {
            // Too close to call by scores: the exact distances rank the two, as in the
            // reference (the lower distance, then the lower index; a NaN loses).
            let e = exact_distance(xb, other);
            if (e < dist || (e == dist && other < at) || (is_nan(dist) && !is_nan(e))) {
                at = other;
                dist = e;
            }
        }
    }
    if (s(10u) == 1u) {
        let before = ld4(off(1u, row));
        if (!(dist < before || (is_nan(before) && !is_nan(dist)))) { return; }
    }
    stbits3(off(0u, row), at);
    st4(off(1u, row), dist);
}
