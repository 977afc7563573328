// The selection state of a row (a workgroup of 256 owns one): candidates that beat the row's
// threshold are appended to a buffer in workgroup memory as (order key, index) pairs, which
// compare as the contract's order (hal::topk: totalOrder of the values, ties to the lower
// index); when the next round could overflow the buffer it is sorted (bitonic) and cut to the
// k best, whose last becomes the threshold. cuda/topk.cu keeps the same state. Every function
// holding a barrier is called by all invocations from uniform control flow. The backend sizes
// the buffer (the `cap` slot: 1024 or 2048 pairs) so that k plus a round fit, so a compaction
// always leaves room for the next round and the buffer's indices stay below TK_CAP.

const TK_BLOCK: u32 = 256u;
// @slot cap
const TK_CAP: u32 = 2048u;
// @end

var<workgroup> tk_keys: array<u32, TK_CAP>;
var<workgroup> tk_ids: array<u32, TK_CAP>;
var<workgroup> tk_count: atomic<u32>;
// The count as all invocations read it after a barrier, and the threshold (key, index).
var<workgroup> tk_seen: u32;
var<workgroup> tk_thresh: vec2<u32>;

fn tk_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b >> 31u) == 1u) { return ~b; }
    return b | 0x80000000u;
}

fn tk_value(key: u32) -> f32 {
    if ((key >> 31u) == 1u) { return bitcast<f32>(key & 0x7fffffffu); }
    return bitcast<f32>(~key);
}

fn tk_less(ak: u32, ai: u32, bk: u32, bi: u32) -> bool {
    return ak < bk || (ak == bk && ai < bi);
}

fn tk_init(li: u32) {
    if (li == 0u) {
        atomicStore(&tk_count, 0u);
        tk_thresh = vec2<u32>(0xffffffffu, 0xffffffffu);
    }
    workgroupBarrier();
}

fn tk_offer(key: u32, id: u32) {
    let t = tk_thresh;
    if (tk_less(key, id, t.x, t.y)) {
        let pos = atomicAdd(&tk_count, 1u);
        tk_keys[pos] = key;
        tk_ids[pos] = id;
    }
}

// The count after a barrier, the same in every invocation.
fn tk_uniform_count(li: u32) -> u32 {
    workgroupBarrier();
    if (li == 0u) { tk_seen = atomicLoad(&tk_count); }
    return workgroupUniformLoad(&tk_seen);
}

// Sorts the buffer and keeps its k best.
fn tk_compact(li: u32, k: u32) {
    let c = tk_uniform_count(li);
    var len = 2u;
    while (len < c) { len = len * 2u; }
    for (var i = c + li; i < len; i = i + TK_BLOCK) {
        tk_keys[i] = 0xffffffffu;
        tk_ids[i] = 0xffffffffu;
    }
    workgroupBarrier();
    for (var size = 2u; size <= len; size = size * 2u) {
        for (var stride = size / 2u; stride > 0u; stride = stride / 2u) {
            for (var i = li; i < len / 2u; i = i + TK_BLOCK) {
                let lo = 2u * i - (i & (stride - 1u));
                let hi = lo + stride;
                let up = (lo & size) == 0u;
                let ak = tk_keys[lo]; let ai = tk_ids[lo];
                let bk = tk_keys[hi]; let bi = tk_ids[hi];
                if (tk_less(bk, bi, ak, ai) == up) {
                    tk_keys[lo] = bk; tk_ids[lo] = bi;
                    tk_keys[hi] = ak; tk_ids[hi] = ai;
                }
            }
            workgroupBarrier();
        }
    }
    if (li == 0u) {
        let kept = min(c, k);
        atomicStore(&tk_count, kept);
        if (kept == k && k > 0u) { tk_thresh = vec2<u32>(tk_keys[k - 1u], tk_ids[k - 1u]); }
    }
    workgroupBarrier();
}

// After a round's offers: compacts when the next round could overflow the buffer.
fn tk_round_end(li: u32, k: u32) {
    if (tk_uniform_count(li) > TK_CAP - TK_BLOCK) { tk_compact(li, k); }
}

// How many of the k slots hold candidates (after the final compaction).
fn tk_found(li: u32) -> u32 {
    return tk_uniform_count(li);
}
