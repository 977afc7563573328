// Counter-based random numbers, bit for bit the stream of hal::random: element t of a call
// with (seed, offset) is Philox 4x32-10 of counter offset + t under key seed; uniform takes the
// top 24 bits of word 0, normal is Box-Muller on words 0 and 1.
// Blocks: 0 the output. Scalars: 0-1 seed, 2-3 offset (low, high), 4-5 low/high or mean/std,
// 6 normal.

// @slot bindings
@group(0) @binding(1) var<storage, read_write> B1: array<u32>;
fn st1(i: i32, v: f32) { B1[i] = bitcast<u32>(v); }
// @end

fn kernel(t: u32) {
    let lo = s(2u) + t;
    let hi = s(3u) + select(0u, 1u, lo < t);
    let w = philox(vec4<u32>(lo, hi, 0u, 0u), vec2<u32>(s(0u), s(1u)));
    var v = 0.0;
    if (s(6u) == 0u) {
        v = sf(4u) + (sf(5u) - sf(4u)) * (f32(w.x >> 8u) * (1.0 / 16777216.0));
    } else {
        let u1 = f32((w.x >> 8u) + 1u) * (1.0 / 16777216.0);
        let u2 = f32(w.y >> 8u) * (1.0 / 16777216.0);
        v = sf(4u) + sf(5u) * (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    st1(off(0u, t), v);
}
