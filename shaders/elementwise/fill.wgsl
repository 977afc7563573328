// fill: every element of the output view set to one value. The host encodes the value in
// the output's own element bits (slot 0), so one kernel serves every dtype.
// Blocks: 0 the output. Scalars: 0 the element bits.

// @slot bindings
@group(0) @binding(1) var<storage, read_write> B1: array<u32>;
fn stbits1(i: i32, v: u32) { B1[i] = v; }
// @end

fn kernel(t: u32) {
    stbits1(off(0u, t), s(0u));
}
