// Nearest centroid in the reference order for short rows (d <= SHORT_D: 16, or 32 in the
// variant the backend composes for wider rows; a product quantiser's subspaces), a batch of
// groups at once: workgroup (x, y) takes 256 points of group y, each invocation one point,
// its coordinates held in a private array (zeros past d, whose terms add exactly nothing).
// The group's centroids pass through workgroup memory in tiles of SHORT_TILE rows of SHORT_D
// (4,096 values either way), so each invocation reads only the tile after loading its point once
// (nearest_ordered.wgsl re-reads both from storage for every term). Each distance is summed
// over k in order with fused multiply-adds from 0, the first strictly smaller kept (lowest
// index on ties; a NaN best is replaced by any number): bit-identical to the CPU reference.
// Blocks: 0 out_index, 1 out_distance (the whole [groups, n] views). Scalars: 0 n, 1 m, 2 d,
// 3 x's offset, 4-5 x's strides, 6 the centroids' offset, 7-8 their strides, 11 whether
// fma() is fused, 12 zero (fma_exact.wgsl), 13-14 the points' and the centroids' group
// strides.

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

// @slot short_shape
const SHORT_TILE: u32 = 256u;
const SHORT_D: u32 = 16u;
// @end
var<workgroup> short_tile: array<f32, 4096>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = s(0u);
    let m = s(1u);
    let d = s(2u);
    let group = wg.y;
    let p = wg.x * 256u + li;
    let live = p < n;
    var xv: array<f32, SHORT_D>;
    let xrow = si(3u) + i32(group) * si(13u) + i32(p) * si(4u);
    for (var k = 0u; k < SHORT_D; k = k + 1u) {
        var v = 0.0;
        if (live && k < d) {
            v = ld1(xrow + i32(k) * si(5u));
        }
        xv[k] = v;
    }
    let cbase = si(6u) + i32(group) * si(14u);
    var best = nan();
    var best_j = 0u;
    for (var j0 = 0u; j0 < m; j0 = j0 + SHORT_TILE) {
        let width = min(SHORT_TILE, m - j0);
        workgroupBarrier();
        for (var e = li; e < SHORT_TILE * SHORT_D; e = e + 256u) {
            let jj = e / SHORT_D;
            let kk = e % SHORT_D;
            var v = 0.0;
            if (jj < width && kk < d) {
                v = ld2(cbase + i32(j0 + jj) * si(7u) + i32(kk) * si(8u));
            }
            short_tile[e] = v;
        }
        workgroupBarrier();
        for (var jj = 0u; jj < width; jj = jj + 1u) {
            var acc = 0.0;
            for (var k = 0u; k < SHORT_D; k = k + 1u) {
                let diff = xv[k] - short_tile[jj * SHORT_D + k];
                acc = fma_exact(diff, diff, acc);
            }
            if (acc < best || (is_nan(best) && !is_nan(acc))) {
                best = acc;
                best_j = j0 + jj;
            }
        }
    }
    if (live) {
        let t = group * n + p;
        stbits3(off(0u, t), best_j);
        st4(off(1u, t), best);
    }
}
