// Layer normalisation backward, dx: a workgroup of 64 per row (as layer_norm.wgsl); both row
// sums in one pass, added in a fixed tree, then dx.
// Blocks: 0 x, 1 weight, 2 mean, 3 rstd, 4 dout, 5 dx. Scalars: norm_params.wgsl.

// @include norm_params.wgsl

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read> B4: array<u32>;
@group(0) @binding(5) var<storage, read> B5: array<u32>;
@group(0) @binding(6) var<storage, read_write> B6: array<u32>;

var<workgroup> part: array<vec2<f32>, 64>;

fn weight(a: NormLaunch, c: u32) -> f32 {
    if (a.has_w == 1u) { return bitcast<f32>(B2[at1(1u, c)]); }
    return 1.0;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let a = norm_params();
    let r = wg.y * nwg.x + wg.x;
    if (r >= a.rows) { return; }
    let m = bitcast<f32>(B3[at1(2u, r)]);
    let rs = bitcast<f32>(B4[at1(3u, r)]);
    var sums = vec2<f32>(0.0, 0.0);
    for (var c = lid; c < a.n; c = c + 64u) {
        let gw = bitcast<f32>(B5[at2(4u, r, c)]) * weight(a, c);
        sums = vec2<f32>(sums.x + gw, fma(gw, (bitcast<f32>(B1[at2(0u, r, c)]) - m) * rs, sums.y));
    }
    part[lid] = sums;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w = w / 2u) {
        if (lid < w) { part[lid] = part[lid] + part[lid + w]; }
        workgroupBarrier();
    }
    let sa = part[0].x / f32(a.n);
    let sb = part[0].y / f32(a.n);
    for (var c = lid; c < a.n; c = c + 64u) {
        let gw = bitcast<f32>(B5[at2(4u, r, c)]) * weight(a, c);
        let xh = (bitcast<f32>(B1[at2(0u, r, c)]) - m) * rs;
        B6[at2(5u, r, c)] = bitcast<u32>(rs * (gw - sa - xh * sb));
    }
}
