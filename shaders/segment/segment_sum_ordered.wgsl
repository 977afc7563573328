// Segment sums under hal::Precision::Reproducible: one thread per (segment, column), column d
// being the count, adding the rows of this dispatch's range [scalar 8, scalar 0) in ascending
// order, with a fused multiply-add per term, into [m, d + 1] accumulators that an earlier
// dispatch left (scalar 9 says whether to continue from them). The order is the one every
// backend follows, so the sums are bit-identical to the CPU's. lavapipe stops loops after 65535
// iterations, so the backend splits long inputs into several dispatches, run in order.
// Blocks: 0 segment ids, 1 weights. Scalars: 0 end row, 1 d, 3 x's offset, 4-5 x's strides,
// 7 whether there are weights (without, B3 is bound but not read), 8 first row, 9 continue,
// 11 whether fma() is fused, 12 zero (fma_exact.wgsl).


// @include fma_exact.wgsl
// @include keep.wgsl
// @include segment_term.wgsl

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn bits2(i: i32) -> u32 { return B2[i]; }
@group(0) @binding(3) var<storage, read> B3: array<u32>;
fn ld3(i: i32) -> f32 { return bitcast<f32>(B3[i]); }
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
fn ld4(i: i32) -> f32 { return bitcast<f32>(B4[i]); }
fn st4(i: i32, v: f32) { B4[i] = bitcast<u32>(v); }
// @end

fn kernel(t: u32) {
    let d = s(1u);
    let seg = t / (d + 1u);
    let col = t % (d + 1u);
    var acc = 0.0;
    if (s(9u) == 1u) { acc = ld4(i32(t)); }
    for (var i = s(8u); i < s(0u); i = i + 1u) {
        if (bits2(off(0u, i)) != seg) { continue; }
        acc = add_row_term(acc, i, col, d);
    }
    st4(i32(t), acc);
}
