// unary: out[t] = op(x[t]), computed in f32. Blocks: 0 the output, 1 x.
// Scalars 0 and 1 carry the op's parameters (LeakyRelu's slope, Affine's scale and shift,
// Clamp's bounds).

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn st2(i: i32, v: f32) { B2[i] = bitcast<u32>(v); }
// @end

// @slot op
fn op(v: f32) -> f32 { return -v; }
// @end

fn kernel(t: u32) {
    st2(off(0u, t), op(ld1(off(1u, t))));
}
