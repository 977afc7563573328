// Counter-based random numbers, bit for bit the stream of hal::random: element t of a call
// with (seed, offset) is Philox 4x32-10 of counter offset + t under key seed; uniform takes the
// top 24 bits of word 0, normal is Box-Muller on words 0 and 1. The last step is a fused
// multiply-add, as in hal's `random_value` (`mul_add`): written as one, so a compiler's choice
// whether to contract it does not change the values (lavapipe's `fma` rounds twice).
// Blocks: 0 the output. Scalars: RandomParams, mirrored by the struct of that name in
// crates/backend-wgpu/src/ops/random.rs (`cargo xtask wgsl` checks the two).

struct RandomParams {
    seed_lo: u32,
    seed_hi: u32,
    offset_lo: u32,
    offset_hi: u32,
    // Uniform: low and high; normal: mean and standard deviation.
    a: f32,
    b: f32,
    normal: u32,
}

fn random_params() -> RandomParams {
    return RandomParams(s(0u), s(1u), s(2u), s(3u), sf(4u), sf(5u), s(6u));
}

// @slot bindings
@group(0) @binding(1) var<storage, read_write> B1: array<u32>;
fn st1(i: i32, v: f32) { B1[i] = bitcast<u32>(v); }
// @end

// ln(u) for u in (0, 1], accurate relative to the result: drivers' `log` is accurate to an
// absolute 2^-21 near 1 (Vulkan's bound), which is most of ln(u) itself when u is within a
// few thousandths of 1 (a lavapipe value was 14% off at u = 1 - 1.7e-6). There, with
// e = 1 - u (exact: u is a multiple of 2^-24), ln(1 - e) = -(e + e^2/2 + ... + e^6/6 + ...),
// whose first six terms are within 2^-29 relative for e <= 1/32.
fn ln_unit(u: f32) -> f32 {
    let e = 1.0 - u;
    if (e > 0.03125) { return log(u); }
    return -e * (1.0 + e * (0.5 + e * (0.33333334 + e * (0.25 + e * (0.2 + e * 0.16666667)))));
}

fn kernel(t: u32) {
    let r = random_params();
    let lo = r.offset_lo + t;
    let hi = r.offset_hi + select(0u, 1u, lo < t);
    let w = philox(vec4<u32>(lo, hi, 0u, 0u), vec2<u32>(r.seed_lo, r.seed_hi));
    var v = 0.0;
    if (r.normal == 0u) {
        v = fma(r.b - r.a, f32(w.x >> 8u) * (1.0 / 16777216.0), r.a);
    } else {
        let u1 = f32((w.x >> 8u) + 1u) * (1.0 / 16777216.0);
        let u2 = f32(w.y >> 8u) * (1.0 / 16777216.0);
        v = fma(r.b, sqrt(-2.0 * ln_unit(u1)) * cos(6.283185307179586 * u2), r.a);
    }
    st1(off(0u, t), v);
}
