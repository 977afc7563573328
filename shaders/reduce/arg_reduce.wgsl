// argmax / argmin along one line per output, one chunk per thread; later passes reduce the
// chunks' winners (x then holds their values and B3 their positions: scalar 4 is 1).
// Blocks: 0 the output indices, 1 each output's base offset, 2 the line, 3 the output values
// (written when scalar 5 is 1). Scalars: 0 line length, 2 chunk length, 3 chunks per output.
// Ties go to the first position, as every pass visits positions in order.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn stbits2(i: i32, v: u32) { B2[i] = v; }
@group(0) @binding(3) var<storage, read> B3: array<u32>;
fn bits3(i: i32) -> u32 { return B3[i]; }
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
fn st4(i: i32, v: f32) { B4[i] = bitcast<u32>(v); }
// @end

// @slot rule
// Whether `v` displaces the current `best`.
fn better(v: f32, best: f32) -> bool { return v > best; }
// argmax/argmin: a NaN is the extreme. Nearest-centroid combining: NaNs lose.
const NAN_WINS: bool = true;
// @end

fn kernel(t: u32) {
    let o = t / s(3u);
    let c = t % s(3u);
    let base = off(1u, o);
    let start = c * s(2u);
    let end = min(s(0u), start + s(2u));
    var best = nan();
    var at = 0u;
    var first = true;
    for (var j = start; j < end; j = j + 1u) {
        let v = ld1(base + off(2u, j));
        var pos = j;
        if (s(4u) == 1u) { pos = bits3(base + off(2u, j)); }
        let wins = (NAN_WINS && is_nan(v)) || better(v, best) || (is_nan(best) && !is_nan(v));
        if (first || (!(NAN_WINS && is_nan(best)) && wins)) {
            best = v;
            at = pos;
            first = false;
        }
        if (NAN_WINS && is_nan(best)) { break; }
    }
    stbits2(off(0u, t), at);
    if (s(5u) == 1u) { st4(off(3u, t), best); }
}
