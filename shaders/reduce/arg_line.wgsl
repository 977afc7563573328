// argmax / argmin of a few long lines: workgroup (x) takes output x's whole line, each
// invocation every 256th element in order, then a tree over the invocations' winners in
// workgroup memory. One dispatch where arg_reduce.wgsl would need two passes of long serial
// chunks (k-means++ draws one winner among thousands of keys a step).
// Blocks: 0 the output indices, 1 each output's base offset, 2 the line, 3 the output values
// (written when scalar 5 is 1). Scalars: 0 line length, 5 whether values are written.
// Ties go to the lowest position; with NAN_WINS the lowest NaN wins, otherwise NaNs lose.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn stbits2(i: i32, v: u32) { B2[i] = v; }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn st3(i: i32, v: f32) { B3[i] = bitcast<u32>(v); }
// @end

// @slot rule
fn better(v: f32, best: f32) -> bool { return v > best; }
const NAN_WINS: bool = true;
// @end

const LINE_WIDTH: u32 = 256u;
// No position yet.
const LINE_NONE: u32 = 0xffffffffu;
var<workgroup> line_best: array<f32, 256>;
var<workgroup> line_at: array<u32, 256>;

// Whether value `v` at position `pv` displaces `b` at `pb`.
fn displaces(v: f32, pv: u32, b: f32, pb: u32) -> bool {
    if (pv == LINE_NONE) { return false; }
    if (pb == LINE_NONE) { return true; }
    if (is_nan(v) || is_nan(b)) {
        if (is_nan(v) && is_nan(b)) { return pv < pb; }
        return is_nan(v) == NAN_WINS;
    }
    return better(v, b) || (v == b && pv < pb);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let o = wg.x;
    let count = s(0u);
    let base = off(1u, o);
    var best = 0.0;
    var at = LINE_NONE;
    for (var j = li; j < count; j = j + LINE_WIDTH) {
        let v = ld1(base + off(2u, j));
        if (displaces(v, j, best, at)) {
            best = v;
            at = j;
        }
    }
    line_best[li] = best;
    line_at[li] = at;
    for (var w = LINE_WIDTH / 2u; w > 0u; w = w / 2u) {
        workgroupBarrier();
        if (li < w && displaces(line_best[li + w], line_at[li + w], line_best[li], line_at[li])) {
            line_best[li] = line_best[li + w];
            line_at[li] = line_at[li + w];
        }
    }
    if (li == 0u) {
        stbits2(off(0u, o), select(line_at[0], 0u, line_at[0] == LINE_NONE));
        if (s(5u) == 1u) {
            st3(off(3u, o), line_best[0]);
        }
    }
}
