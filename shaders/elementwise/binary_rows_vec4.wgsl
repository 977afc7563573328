// binary on a contiguous, 16-byte-aligned f32 `a` and output with a broadcast f32 `b` (a
// bias): output element e takes b[s(1) + (e / inner) % outer], where `inner` (scalar 3) is the
// run of elements that share one b value and `outer` (scalar 4) the number of b values before
// the pattern repeats (a convolution's per-channel bias over its channel-major output: inner
// = N*oh*ow, outer = channels; a Linear bias over [batch, features]: inner 1, outer =
// features). One vec4 of `a` and the output per thread, as binary_vec4 (the strided kernel
// spent 51 us per call on a small CNN's bias adds on an H200). Scalars 0, 2: the offsets of
// a and the output in vec4 words; 1: b's offset in elements.

@group(0) @binding(1) var<storage, read> B1: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read_write> B3: array<vec4<u32>>;

// @slot op
fn op(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> { return a + b; }
// @end

fn bias_at(e: u32) -> f32 {
    return bitcast<f32>(B2[s(1u) + (e / s(3u)) % s(4u)]);
}

fn kernel(t: u32) {
    let a = bitcast<vec4<f32>>(B1[s(0u) + t]);
    let e = 4u * t;
    var b: vec4<f32>;
    if (s(3u) % 4u == 0u) {
        // The four elements share one value.
        b = vec4<f32>(bias_at(e));
    } else {
        b = vec4<f32>(bias_at(e), bias_at(e + 1u), bias_at(e + 2u), bias_at(e + 3u));
    }
    B3[s(2u) + t] = bitcast<vec4<u32>>(op(a, b));
}
