// Layer normalisation backward, the parameter gradients: one thread per column sums the
// chunks' partials (bindings 1 and 2, [chunk, n]) in order into dweight and dbias where wanted.
// Blocks: 0 dweight, 1 dbias. Scalars: norm_params.wgsl.

// @include norm_params.wgsl

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;

fn kernel(c: u32) {
    let a = norm_params();
    var sw = 0.0;
    var sb = 0.0;
    for (var k = 0u; k < a.chunks; k = k + 1u) {
        sw = sw + bitcast<f32>(B1[k * a.n + c]);
        sb = sb + bitcast<f32>(B2[k * a.n + c]);
    }
    if (a.want_w == 1u) { B3[at1(0u, c)] = bitcast<u32>(sw); }
    if (a.want_b == 1u) { B4[at1(1u, c)] = bitcast<u32>(sb); }
}
