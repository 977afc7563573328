// ternary: out[t] = op(x[t], y[t], z[t]) (where, fma, lerp), computed in f32.
// Blocks: 0 the output, 1 x, 2 y, 3 z.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
@group(0) @binding(3) var<storage, read> B3: array<u32>;
fn ld3(i: i32) -> f32 { return bitcast<f32>(B3[i]); }
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
fn st4(i: i32, v: f32) { B4[i] = bitcast<u32>(v); }
// @end

// @slot op
fn op(x: f32, y: f32, z: f32) -> f32 { return select(z, y, x != 0.0); }
// @end

fn kernel(t: u32) {
    st4(off(0u, t), op(ld1(off(1u, t)), ld2(off(2u, t)), ld3(off(3u, t))));
}
