// reduce (sum, max, min; mean is a scaled sum): each thread reduces one chunk of one output's
// line, with Kahan-compensated sums. Outputs with more than one chunk write partials that a
// second pass reduces the same way (the backend recurses), so no thread runs a long loop.
// Blocks: 0 the output (or partials), 1 each output's base offset in x, 2 the reduced axes.
// Scalars: 0 elements reduced, 1 scale, 2 chunk length, 3 chunks per output, 4 the thread
// layout, 5 outputs. Thread t takes output t / chunks and chunk t % chunks, the chunk being
// elements c * length .. (c + 1) * length (layout 0) or every chunks-th element from c
// (layout 2: neighbouring threads read neighbouring elements); with layout 1, output t % outputs
// and chunk t / outputs (neighbouring threads take neighbouring outputs). Partial t is written
// at t.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn st2(i: i32, v: f32) { B2[i] = bitcast<u32>(v); }
// @end

// @slot finish
fn finish(sum: f32, mx: f32, mn: f32, seen_nan: bool) -> f32 { return sum * sf(1u); }
// @end

// After a device-side index check, the backend replaces this with a read of the launch's
// verdict word: a kernel whose indices failed writes nothing.
// @slot guard
fn skipped() -> bool { return false; }
// @end

fn kernel(t: u32) {
    if (skipped()) { return; }
    let chunks = s(3u);
    var o = t / chunks;
    var c = t % chunks;
    if (s(4u) == 1u) {
        o = t % s(5u);
        c = t / s(5u);
    }
    let base = off(1u, o);
    var first = c * s(2u);
    var end = min(s(0u), first + s(2u));
    var step = 1u;
    if (s(4u) == 2u) {
        first = c;
        end = s(0u);
        step = chunks;
    }
    // One reduced axis (the usual case once the backend merged them): no division per element.
    let one_axis = block_rank(2u) == 1u;
    let red_stride = block_stride(2u, 0u);
    var r = running_start();
    for (var j = first; j < end; j = j + step) {
        var at = base + i32(j) * red_stride;
        if (!one_axis) { at = base + off(2u, j); }
        running_add(&r, ld1(at));
    }
    if (r.seen_nan) { r.sum = nan(); }
    st2(off(0u, t), finish(r.sum, r.mx, r.mn, r.seen_nan));
}
