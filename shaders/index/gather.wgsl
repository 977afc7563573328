// gather along an axis: out[p] = x[p with its axis coordinate replaced by index[p]].
// Blocks: 0 the output, 1 the index, 2 x with the gathered axis zeroed. Scalar 0: x's stride
// along the axis. Indices were checked against the axis length by check_index.wgsl.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ldi2(i: i32) -> i32 { return bitcast<i32>(B2[i]); }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn st3(i: i32, v: f32) { B3[i] = bitcast<u32>(v); }
// @end

// After a device-side index check, the backend replaces this with a read of the launch's
// verdict word: a kernel whose indices failed writes nothing.
// @slot guard
fn skipped() -> bool { return false; }
// @end

fn kernel(t: u32) {
    if (skipped()) { return; }
    let i = ldi2(off(1u, t));
    st3(off(0u, t), ld1(off(2u, t) + i * si(0u)));
}
