// binary on contiguous, 16-byte-aligned f32 operands: one vec4 per thread, so each load and
// store moves 16 bytes (what it takes to reach bandwidth). Scalars 0, 1, 2: the offsets of a,
// b and the output, in vec4 words.

@group(0) @binding(1) var<storage, read> B1: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> B2: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> B3: array<vec4<u32>>;

// @slot op
fn op(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> { return a + b; }
// @end

fn kernel(t: u32) {
    let a = bitcast<vec4<f32>>(B1[s(0u) + t]);
    let b = bitcast<vec4<f32>>(B2[s(1u) + t]);
    B3[s(2u) + t] = bitcast<vec4<u32>>(op(a, b));
}
