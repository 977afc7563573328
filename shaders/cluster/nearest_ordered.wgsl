// Nearest centroid under hal::Precision::Reproducible: one thread per point, each distance
// summed over k in order with fused multiply-adds from 0, the first strictly smaller distance
// kept (lowest index on ties; a NaN best is replaced by any number), exactly as the CPU
// reference does, so the result is bit-identical to it. Centroids come in slices [scalar 9,
// scalar 1), one dispatch each, in order (lavapipe stops loops after 65535 iterations); a slice
// after the first continues from the results the previous one stored (scalar 10).
// Blocks: 0 out_index, 1 out_distance. Scalars: 0 n, 1 end of the slice, 2 d, 3 x's offset,
// 4-5 x's strides, 6 the centroids' offset, 7-8 their strides, 9 the slice's first centroid,
// 10 whether an earlier slice wrote results, 11 whether fma() is fused, 12 zero (fma_exact.wgsl),
// 13-14 the points' and the centroids' group strides. A batch of searches (rank-3 views) runs
// n threads per group, thread t taking point t mod n of group t / n; the output blocks are
// the whole [groups, n] views.

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

fn kernel(t: u32) {
    let d = s(2u);
    var best_j = 0u;
    var best = nan();
    if (s(10u) == 1u) {
        best_j = bits3(off(0u, t));
        best = ld4(off(1u, t));
    }
    let group = i32(t / s(0u));
    let xrow = si(3u) + group * si(13u) + i32(t % s(0u)) * si(4u);
    let cbase = si(6u) + group * si(14u);
    for (var j = s(9u); j < s(1u); j = j + 1u) {
        let crow = cbase + i32(j) * si(7u);
        var acc = 0.0;
        for (var k = 0u; k < d; k = k + 1u) {
            let diff = ld1(xrow + i32(k) * si(5u)) - ld2(crow + i32(k) * si(8u));
            acc = fma_exact(diff, diff, acc);
        }
        if (acc < best || (is_nan(best) && !is_nan(acc))) {
            best = acc;
            best_j = j;
        }
    }
    stbits3(off(0u, t), best_j);
    st4(off(1u, t), best);
}
