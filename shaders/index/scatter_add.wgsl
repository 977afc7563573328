// scatter-add along an axis: out[.. index[p] ..] += src[p]. One thread per line (every
// position but the axis), walking its line in order: each output element has one writer and
// its additions happen in index order, so results are deterministic without atomics.
// Blocks: 0 src, 1 index, 2 out, each with the axis zeroed. Scalars: 0 end and 4 start of
// this slice of the axis, 1-3 the axis strides of src, index and out.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ldi2(i: i32) -> i32 { return bitcast<i32>(B2[i]); }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn ld3(i: i32) -> f32 { return bitcast<f32>(B3[i]); }
fn st3(i: i32, v: f32) { B3[i] = bitcast<u32>(v); }
// @end

// After a device-side index check, the backend replaces this with a read of the launch's
// verdict word: a kernel whose indices failed writes nothing.
// @slot guard
fn skipped() -> bool { return false; }
// @end

fn kernel(t: u32) {
    if (skipped()) { return; }
    let s0 = off(0u, t);
    let i0 = off(1u, t);
    let o0 = off(2u, t);
    for (var j = s(4u); j < s(0u); j = j + 1u) {
        let at = o0 + ldi2(i0 + i32(j) * si(2u)) * si(3u);
        st3(at, ld3(at) + ld1(s0 + i32(j) * si(1u)));
    }
}
