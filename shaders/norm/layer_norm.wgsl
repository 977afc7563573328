// Layer normalisation forward (hal::norm): one thread per row, the row read twice (mean, then
// the centred sum of squares), then written normalised and scaled.
// Blocks: 0 x, 1 weight, 2 bias, 3 out, 4 mean, 5 rstd. Scalars: norm_params.wgsl.

// @include norm_params.wgsl

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
@group(0) @binding(5) var<storage, read_write> B5: array<u32>;
@group(0) @binding(6) var<storage, read_write> B6: array<u32>;

fn kernel(r: u32) {
    let a = norm_params();
    var s = 0.0;
    for (var c = 0u; c < a.n; c = c + 1u) { s = s + bitcast<f32>(B1[at2(0u, r, c)]); }
    let m = s / f32(a.n);
    var q = 0.0;
    for (var c = 0u; c < a.n; c = c + 1u) {
        let d = bitcast<f32>(B1[at2(0u, r, c)]) - m;
        q = fma(d, d, q);
    }
    let rs = 1.0 / sqrt(q / f32(a.n) + a.eps);
    for (var c = 0u; c < a.n; c = c + 1u) {
        var y = (bitcast<f32>(B1[at2(0u, r, c)]) - m) * rs;
        if (a.has_w == 1u) { y = y * bitcast<f32>(B2[at1(1u, c)]); }
        if (a.has_b == 1u) { y = y + bitcast<f32>(B3[at1(2u, c)]); }
        B4[at2(3u, r, c)] = bitcast<u32>(y);
    }
    B5[at1(4u, r)] = bitcast<u32>(m);
    B6[at1(5u, r)] = bitcast<u32>(rs);
}
