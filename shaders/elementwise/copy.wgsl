// copy (with dtype conversion): out[t] = convert(src[t]).
// Blocks: 0 the output, 1 the source. The `convert` slot is chosen per dtype pair: raw bits
// for equal dtypes, saturating between i32 and u32, through f32 otherwise.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn bits1(i: i32) -> u32 { return B1[i]; }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn stbits2(i: i32, v: u32) { B2[i] = v; }
// @end

fn kernel(t: u32) {
    let src = off(1u, t);
    let dst = off(0u, t);
    // @slot convert
    stbits2(dst, bits1(src));
    // @end
}
