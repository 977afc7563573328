// Layer normalisation backward, dx: one thread per row; both row sums in one pass, then dx.
// Blocks: 0 x, 1 weight, 2 mean, 3 rstd, 4 dout, 5 dx. Scalars: norm_params.wgsl.

// @include norm_params.wgsl

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read> B4: array<u32>;
@group(0) @binding(5) var<storage, read> B5: array<u32>;
@group(0) @binding(6) var<storage, read_write> B6: array<u32>;

fn weight(a: NormLaunch, c: u32) -> f32 {
    if (a.has_w == 1u) { return bitcast<f32>(B2[at1(1u, c)]); }
    return 1.0;
}

fn kernel(r: u32) {
    let a = norm_params();
    let m = bitcast<f32>(B3[at1(2u, r)]);
    let rs = bitcast<f32>(B4[at1(3u, r)]);
    var sa = 0.0;
    var sb = 0.0;
    for (var c = 0u; c < a.n; c = c + 1u) {
        let gw = bitcast<f32>(B5[at2(4u, r, c)]) * weight(a, c);
        sa = sa + gw;
        sb = fma(gw, (bitcast<f32>(B1[at2(0u, r, c)]) - m) * rs, sb);
    }
    sa = sa / f32(a.n);
    sb = sb / f32(a.n);
    for (var c = 0u; c < a.n; c = c + 1u) {
        let gw = bitcast<f32>(B5[at2(4u, r, c)]) * weight(a, c);
        let xh = (bitcast<f32>(B1[at2(0u, r, c)]) - m) * rs;
        B6[at2(5u, r, c)] = bitcast<u32>(rs * (gw - sa - xh * sb));
    }
}
