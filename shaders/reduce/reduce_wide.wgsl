// reduce in f64 (sum, max, min; mean is a scaled sum), for f64 operands (`shader-f64`): the
// structure of reduce.wgsl, every sum and partial an f64 with Kahan compensation. Inputs of
// any float dtype are widened exactly; `put` rounds once into a narrower output.
// Blocks: 0 the output (or partials), 1 each output's base offset in x, 2 the reduced axes.
// Scalars: 0 elements reduced, 1 scale (an f32: 1, or 1 / count for a mean; the mean's
// exact scale is scalar 6's count), 2 chunk length, 3 chunks per output, 4 the thread layout
// (as reduce.wgsl's), 5 outputs, 6 the count a mean divides by (0: none).

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<f64>;
fn ld1(i: i32) -> f64 { return B1[i]; }
@group(0) @binding(2) var<storage, read_write> B2: array<f64>;
fn st2(i: i32, v: f64) { B2[i] = v; }
// @end

// @slot put
fn put(i: i32, v: f64) { st2(i, v); }
// @end

// @slot finish
fn finish(sum: f64, mx: f64, mn: f64, seen_nan: bool) -> f64 { return sum; }
// @end

// @slot guard
fn skipped() -> bool { return false; }
// @end

struct Wide { sum: f64, comp: f64, mx: f64, mn: f64, seen_nan: bool }

fn wide_add(r: ptr<function, Wide>, v: f64) {
    let y = v - (*r).comp;
    let t = (*r).sum + y;
    (*r).comp = (t - (*r).sum) - y;
    (*r).sum = t;
    (*r).mx = max((*r).mx, v);
    (*r).mn = min((*r).mn, v);
    (*r).seen_nan = (*r).seen_nan || !(v == v);
}

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
    let one_axis = block_rank(2u) == 1u;
    let red_stride = block_stride(2u, 0u);
    let far = f64(inf());
    var r = Wide(0.0lf, 0.0lf, -far, far, false);
    for (var j = first; j < end; j = j + step) {
        var at = base + i32(j) * red_stride;
        if (!one_axis) { at = base + off(2u, j); }
        wide_add(&r, f64(ld1(at)));
    }
    var v = finish(r.sum, r.mx, r.mn, r.seen_nan);
    if (s(6u) != 0u) { v = v / f64(s(6u)); }
    put(off(0u, t), v);
}
