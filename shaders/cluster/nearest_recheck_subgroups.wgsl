// The second half of the fast nearest-centroid search (nearest_coop.wgsl): each point's
// candidates compared by their f32 distances, sum_k (x_k - c_k)^2, each lane of a subgroup
// summing every 32nd k with fused multiply-adds and `subgroupAdd` combining the lanes (reads
// of consecutive coordinates by consecutive lanes). The lower distance wins, the lower index
// on ties, and a NaN best is replaced by any number. Where the range check failed (a
// coordinate beyond f16), every centroid is a candidate. One subgroup of 32 per point
// (invocation t: point t / 32, lane t % 32).
// Blocks: 0 out_index, 1 out_distance. Scalars: 0 n, 1 m, 2 d, 3 x's offset, 4-5 x's strides,
// 6 the centroids' offset, 7-8 their strides, 10-11 the range check's verdict word and serial.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
@group(0) @binding(3) var<storage, read> B3: array<u32>;
fn bits3(i: i32) -> u32 { return B3[i]; }
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
fn stbits4(i: i32, v: u32) { B4[i] = v; }
@group(0) @binding(5) var<storage, read_write> B5: array<u32>;
fn st5(i: i32, v: f32) { B5[i] = bitcast<u32>(v); }
@group(0) @binding(6) var<storage, read> B6: array<u32>;
fn bits6(i: i32) -> u32 { return B6[i]; }
// @end

fn kernel(t: u32) {
    let p = t / 32u;
    let lane = t % 32u;
    var best_j = 0u;
    var best = nan();
    let everything = s(11u) != 0u && bits6(i32(s(10u))) == s(11u);
    let count = select(2u, s(1u), everything);
    let xrow = si(3u) + i32(p) * si(4u);
    for (var q = 0u; q < count; q = q + 1u) {
        // The same for every lane of the subgroup: the branch below is uniform there.
        let j = select(bits3(i32(p * 2u + q)), q, everything);
        if (j < s(1u)) {
            let crow = si(6u) + i32(j) * si(7u);
            var acc = 0.0;
            for (var k = lane; k < s(2u); k = k + 32u) {
                let diff = ld1(xrow + i32(k) * si(5u)) - ld2(crow + i32(k) * si(8u));
                acc = fma(diff, diff, acc);
            }
            let dj = subgroupAdd(acc);
            if (is_nan(best) || dj < best || (dj == best && j < best_j)) {
                best = dj;
                best_j = j;
            }
        }
    }
    if (lane == 0u) {
        stbits4(off(0u, p), best_j);
        st5(off(1u, p), best);
    }
}
