// k-means++ (hal::Backend::kmeans_pp), the end of one step: the best of kmeans_pp_keys.wgsl's
// per-workgroup keys (ties to the lower point) becomes winner j, and the step word moves on
// to j + 1. One workgroup.
// Scalars: 0 the number of per-workgroup results.

// Bindings: 1 and 2 the per-workgroup keys (f32) and points (u32), 3 the winners (u32), 4 the
// step (one u32 word).
// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn bits2(i: i32) -> u32 { return B2[i]; }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn stbits3(i: i32, v: u32) { B3[i] = v; }
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
fn bits4(i: i32) -> u32 { return B4[i]; }
fn stbits4(i: i32, v: u32) { B4[i] = v; }
// @end

const PICK_NONE: u32 = 0xffffffffu;
var<workgroup> pick_key: array<f32, 256>;
var<workgroup> pick_at: array<u32, 256>;

// Whether (k, a) beats (bk, ba): a lower key, or an equal one at a lower point.
fn pick_beats(k: f32, a: u32, bk: f32, ba: u32) -> bool {
    if (a == PICK_NONE) { return false; }
    return ba == PICK_NONE || k < bk || (k == bk && a < ba);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    let count = s(0u);
    let j = bits4(0);
    var best = 0.0;
    var at = PICK_NONE;
    for (var g = li; g < count; g = g + 256u) {
        let k = ld1(i32(g));
        let a = bits2(i32(g));
        if (pick_beats(k, a, best, at)) {
            best = k;
            at = a;
        }
    }
    pick_key[li] = best;
    pick_at[li] = at;
    for (var w = 128u; w > 0u; w = w / 2u) {
        workgroupBarrier();
        if (li < w && pick_beats(pick_key[li + w], pick_at[li + w], pick_key[li], pick_at[li])) {
            pick_key[li] = pick_key[li + w];
            pick_at[li] = pick_at[li + w];
        }
    }
    if (li == 0u) {
        stbits3(i32(j), pick_at[0]);
        stbits4(0, j + 1u);
    }
}
