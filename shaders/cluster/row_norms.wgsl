// Squared Euclidean norm of each row of a matrix, into a contiguous f32 vector (the centroid
// norms nearest_centroid.wgsl compares with). One thread per row, multiply-adds in order.
// Scalars: 0 row length, 1 offset, 2-3 row and column strides.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn st2(i: i32, v: f32) { B2[i] = bitcast<u32>(v); }
// @end

fn kernel(t: u32) {
    let base = si(1u) + i32(t) * si(2u);
    var acc = 0.0;
    for (var k = 0u; k < s(0u); k = k + 1u) {
        let v = ld1(base + i32(k) * si(3u));
        acc = fma(v, v, acc);
    }
    st2(i32(t), acc);
}
