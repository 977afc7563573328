// reduce (sum, max, min; mean is a scaled sum) of short lines in one pass, where reduce.wgsl
// would write per-chunk partials and reduce them in a second dispatch (a bias gradient: 512
// sums of 256 rows). A workgroup takes `lanes` neighbouring outputs (scalar 4: 32 where
// neighbouring outputs are closer in memory than neighbouring elements, so a warp reads a
// row's run of outputs; otherwise 1), and the 256 / lanes invocations of each output take every
// (256 / lanes)-th element from their own (fewer invocations, each at least PER_PART
// elements, for short lines), with Kahan-compensated sums. The invocations' results are then
// combined in invocation order in workgroup memory: the same result on every run.
// Blocks: 0 the output, 1 each output's base offset in x, 2 the reduced axes. Scalars: 0
// elements reduced, 1 scale, 4 lanes, 5 outputs. Workgroup (x, y) of a grid nwg.x wide takes
// outputs (y nwg.x + x) lanes ...

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

const PER_PART: u32 = 8u;

var<workgroup> part_sum: array<f32, 256>;
var<workgroup> part_max: array<f32, 256>;
var<workgroup> part_min: array<f32, 256>;
var<workgroup> part_nan: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lanes = s(4u);
    let count = s(0u);
    // At least PER_PART elements an invocation where the line is short: the combining below
    // is one invocation's serial loop over the parts (a loss's mean, one line of 256, was
    // profiled at 14 us on an H200 with 256 parts of one). Invocations past `parts` only
    // wait at the barrier.
    let parts = clamp((count + PER_PART - 1u) / PER_PART, 1u, 256u / lanes);
    let o = (wg.y * nwg.x + wg.x) * lanes + li % lanes;
    let part = li / lanes;
    let live = o < s(5u) && part < parts;
    // One reduced axis (the usual case once the backend merged them): no division per element.
    let one_axis = block_rank(2u) == 1u;
    let red_stride = block_stride(2u, 0u);
    var r = running_start();
    if (live) {
        let base = off(1u, o);
        for (var j = part; j < count; j = j + parts) {
            var at = base + i32(j) * red_stride;
            if (!one_axis) { at = base + off(2u, j); }
            running_add(&r, ld1(at));
        }
    }
    part_sum[li] = r.sum;
    part_max[li] = r.mx;
    part_min[li] = r.mn;
    part_nan[li] = select(0u, 1u, r.seen_nan);
    workgroupBarrier();
    if (part != 0u || !live || skipped()) { return; }
    // The invocations' sums added in order; their max, min and NaN flags merged.
    var all = running_start();
    for (var k = 0u; k < parts; k = k + 1u) {
        let at = k * lanes + li;
        running_sum(&all, part_sum[at]);
        all.mx = max(all.mx, part_max[at]);
        all.mn = min(all.mn, part_min[at]);
        all.seen_nan = all.seen_nan || part_nan[at] != 0u;
    }
    if (all.seen_nan) { all.sum = nan(); }
    st2(off(0u, o), finish(all.sum, all.mx, all.mn, all.seen_nan));
}
