// Layer normalisation backward, the parameter gradients' partial sums: one thread per (chunk of
// `per` rows, column) sums g xhat and g over its rows in order into partials [chunk, n]
// (contiguous, bindings 5 and 6). Blocks: 0 x, 1 mean, 2 rstd, 3 dout.
// Scalars: norm_params.wgsl.

// @include norm_params.wgsl

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read> B4: array<u32>;
@group(0) @binding(5) var<storage, read_write> B5: array<u32>;
@group(0) @binding(6) var<storage, read_write> B6: array<u32>;

fn kernel(t: u32) {
    let a = norm_params();
    let c = t % a.n;
    let chunk = t / a.n;
    let end = min(a.rows, (chunk + 1u) * a.per);
    var sw = 0.0;
    var sb = 0.0;
    for (var r = chunk * a.per; r < end; r = r + 1u) {
        let g = bitcast<f32>(B4[at2(3u, r, c)]);
        let xh = (bitcast<f32>(B1[at2(0u, r, c)]) - bitcast<f32>(B2[at1(1u, r)]))
            * bitcast<f32>(B3[at1(2u, r)]);
        sw = fma(g, xh, sw);
        sb = sb + g;
    }
    B5[t] = bitcast<u32>(sw);
    B6[t] = bitcast<u32>(sb);
}
