// Layer normalisation forward (hal::norm): a workgroup of 64 per row (workgroup (x, y): row
// y * groups_x + x). Each invocation sums every 64th column, the workgroup adds the partial
// sums in a fixed tree (deterministic); the row is read twice (mean, then the centred sum of
// squares), then written normalised and scaled.
// Blocks: 0 x, 1 weight, 2 bias, 3 out, 4 mean, 5 rstd. Scalars: norm_params.wgsl.

// @include norm_params.wgsl

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
@group(0) @binding(5) var<storage, read_write> B5: array<u32>;
@group(0) @binding(6) var<storage, read_write> B6: array<u32>;

var<workgroup> part: array<f32, 64>;

// The workgroup's total of `v` (every invocation gets it).
fn row_total(lid: u32, v: f32) -> f32 {
    part[lid] = v;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w = w / 2u) {
        if (lid < w) { part[lid] = part[lid] + part[lid + w]; }
        workgroupBarrier();
    }
    let total = part[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let a = norm_params();
    let r = wg.y * nwg.x + wg.x;
    if (r >= a.rows) { return; }
    var s = 0.0;
    for (var c = lid; c < a.n; c = c + 64u) { s = s + bitcast<f32>(B1[at2(0u, r, c)]); }
    let m = row_total(lid, s) / f32(a.n);
    var q = 0.0;
    for (var c = lid; c < a.n; c = c + 64u) {
        let d = bitcast<f32>(B1[at2(0u, r, c)]) - m;
        q = fma(d, d, q);
    }
    let rs = 1.0 / sqrt(row_total(lid, q) / f32(a.n) + a.eps);
    for (var c = lid; c < a.n; c = c + 64u) {
        var y = (bitcast<f32>(B1[at2(0u, r, c)]) - m) * rs;
        if (a.has_w == 1u) { y = y * bitcast<f32>(B2[at1(1u, c)]); }
        if (a.has_b == 1u) { y = y + bitcast<f32>(B3[at1(2u, c)]); }
        B4[at2(3u, r, c)] = bitcast<u32>(y);
    }
    if (lid == 0u) {
        B5[at1(4u, r)] = bitcast<u32>(m);
        B6[at1(5u, r)] = bitcast<u32>(rs);
    }
}
