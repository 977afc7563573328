// binary: out[t] = op(a[t], b[t]), computed in f32 (broadcasting is in the layouts).
// Blocks: 0 the output, 1 a, 2 b.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn st3(i: i32, v: f32) { B3[i] = bitcast<u32>(v); }
// @end

// @slot op
fn op(a: f32, b: f32) -> f32 { return a + b; }
// @end

// Python's `%`: the remainder takes the sign of the divisor.
fn rem_floored(a: f32, b: f32) -> f32 {
    let r = fmod(a, b);
    return select(r, r + b, r != 0.0 && ((r < 0.0) != (b < 0.0)));
}

fn kernel(t: u32) {
    st3(off(0u, t), op(ld1(off(1u, t)), ld2(off(2u, t))));
}
