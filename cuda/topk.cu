// Selection: top-k of rows, and the inverted-list scan of product-quantised codes
// (hal::topk gives the order and the distances). A block owns a row (a query): its threads
// score candidates a round of TK_BLOCK at a time and append those that beat the row's
// threshold to a buffer in shared memory, packed as `order key << 32 | index` (the u64 order
// is the contract's: totalOrder of the values, ties to the lower index); when the buffer
// could overflow in the next round it is sorted (bitonic) and cut to the k best, whose last
// becomes the threshold. So a round costs a comparison per candidate once k good ones are
// known, and the result is exact.
#include "common.cuh"

#define TK_BLOCK 256
// The buffer holds k (at most hal::topk::GPU_MAX_K = 1024) kept candidates plus a round.
#define TK_CAP 2048

__device__ __forceinline__ u32 tk_key(float v) {
    u32 b = __float_as_uint(v);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float tk_value(u32 key) {
    return __uint_as_float((key >> 31) ? (key & 0x7fffffffu) : ~key);
}

// Sorts buf[0..len) ascending; len a power of two. Every thread of the block calls it.
__device__ void tk_sort(u64* buf, u32 len) {
    for (u32 size = 2; size <= len; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 i = threadIdx.x; i < len / 2; i += blockDim.x) {
                u32 lo = 2 * i - (i & (stride - 1));
                u32 hi = lo + stride;
                bool up = (lo & size) == 0;
                u64 a = buf[lo], b = buf[hi];
                if ((a > b) == up) {
                    buf[lo] = b;
                    buf[hi] = a;
                }
            }
            __syncthreads();
        }
    }
}

// The row's selection state in shared memory (16,400 bytes: backend-cuda's TK_STATE_BYTES).
struct TkState {
    u64 buf[TK_CAP];
    u64 thresh;
    u32 count;
    u32 pad;
};

__device__ __forceinline__ void tk_init(TkState& s) {
    if (threadIdx.x == 0) {
        s.count = 0;
        s.thresh = ~0ull;
    }
    __syncthreads();
}

__device__ __forceinline__ void tk_offer(TkState& s, u64 packed) {
    if (packed < s.thresh) {
        u32 pos = atomicAdd(&s.count, 1u);
        s.buf[pos] = packed;
    }
}

// Sorts the buffer and keeps its k best (the threshold their last once there are k).
// Called by every thread after a __syncthreads.
__device__ void tk_compact(TkState& s, u32 k) {
    u32 c = s.count;
    u32 len = 2;
    while (len < c) len <<= 1;
    for (u32 i = c + threadIdx.x; i < len; i += blockDim.x) s.buf[i] = ~0ull;
    __syncthreads();
    tk_sort(s.buf, len);
    if (threadIdx.x == 0) {
        u32 kept = c < k ? c : k;
        s.count = kept;
        if (kept == k) s.thresh = s.buf[k - 1];
    }
    __syncthreads();
}

// After a round's offers: compacts when the next round could overflow the buffer.
// Every thread reads the count between two barriers: without the second, a fast warp's
// offers of the next round would raise the count under a slow warp still deciding, which
// would then compact alone (barriers mismatched, the buffer corrupted).
__device__ __forceinline__ void tk_round_end(TkState& s, u32 k) {
    __syncthreads();
    u32 c = s.count;
    __syncthreads();
    if (c > TK_CAP - TK_BLOCK) tk_compact(s, k);
}

// Writes the k best (after a final compaction): values through `value_of`, then padding.
__device__ __forceinline__ void tk_write(TkState& s, u32 k, u32 flip, float pad_value, u32 pad_index,
                                         float* vals, i64 vs0, i64 vs1, u32* idx, i64 is0, i64 is1, i64 row) {
    for (u32 c = threadIdx.x; c < k; c += blockDim.x) {
        float v = pad_value;
        u32 i = pad_index;
        if (c < s.count) {
            u64 p = s.buf[c];
            v = tk_value((u32)(p >> 32) ^ flip);
            i = (u32)p;
        }
        vals[row * vs0 + c * vs1] = v;
        idx[row * is0 + c * is1] = i;
    }
}

// One block per row of x: [rows, n] (strided); the k least keys (flip = ~0: the largest values).
extern "C" __global__ void __launch_bounds__(TK_BLOCK) top_k_rows(
    const float* x, i64 n, i64 xs0, i64 xs1, u32 k, u32 flip,
    float* vals, i64 vs0, i64 vs1, u32* idx, i64 is0, i64 is1) {
    __shared__ TkState s;
    const i64 row = blockIdx.x;
    tk_init(s);
    for (i64 base = 0; base < n; base += TK_BLOCK) {
        i64 c = base + threadIdx.x;
        if (c < n) {
            u32 key = tk_key(x[row * xs0 + c * xs1]) ^ flip;
            tk_offer(s, ((u64)key << 32) | (u64)c);
        }
        tk_round_end(s, k);
    }
    tk_compact(s, k);
    tk_write(s, k, flip, 0.0f, 0u, vals, vs0, vs1, idx, is0, is1, row);
}

// One block per query. Dynamic shared memory: the selection state, then the probed list's
// table (bytes x cw floats).
// WORDS: the code's words when known at compile time (0: `words` at run time).
template <int WORDS>
__device__ void ivf_scan_body(
    const float* tables, const float* list_tables, const u32* probes, const float* bases,
    const u32* offsets, const u32* codes, const u32* ids,
    u32 np, u32 lists, u32 members, u32 bytes, u32 cw, u32 words, u32 k,
    float* dist, i64 ds0, i64 ds1, u32* lab, i64 ls0, i64 ls1,
    u32 fault_index, u32 fault_offsets, u32* fault) {
    extern __shared__ u64 shared_words[];
    TkState& s = *reinterpret_cast<TkState*>(shared_words);
    float* table = reinterpret_cast<float*>(shared_words + sizeof(TkState) / 8);
    const i64 q = blockIdx.x;
    const u32 len = bytes * cw;
    const u32 nw = WORDS > 0 ? (u32)WORDS : words;
    if (q == 0 && threadIdx.x == 0 && offsets[0] != 0u) report_fault(fault, offsets[0], members, fault_offsets);
    tk_init(s);
    for (u32 p = 0; p < np; ++p) {
        const u32 a = probes[q * np + p];
        if (a >= lists) {
            if (threadIdx.x == 0) report_fault(fault, a, lists, fault_index);
            continue;
        }
        const u32 start = offsets[a], end = offsets[a + 1];
        if (start > end || end > members) {
            if (threadIdx.x == 0) report_fault(fault, start > end ? start : end, members, fault_offsets);
            continue;
        }
        const float* qt = tables + q * (i64)len;
        const float* lt = list_tables ? list_tables + (i64)a * len : nullptr;
        for (u32 i = threadIdx.x; i < len; i += TK_BLOCK) table[i] = lt ? lt[i] + qt[i] : qt[i];
        __syncthreads();
        const float base = bases[q * np + p];
        for (u32 b0 = start; b0 < end; b0 += TK_BLOCK) {
            const u32 i = b0 + threadIdx.x;
            if (i < end) {
                float d = base;
                bool ok = true;
                const u32* code = codes + (i64)i * nw;
                // Unrolled where the words are a template constant.
#pragma unroll
                for (u32 w = 0; w < nw; ++w) {
                    const u32 word = code[w];
#pragma unroll
                    for (u32 t = 0; t < 4; ++t) {
                        const u32 j = 4 * w + t;
                        if (j < bytes) {
                            u32 c = (word >> (8 * t)) & 0xffu;
                            if (c >= cw) {
                                ok = false;
                                report_fault(fault, c, cw, fault_index);
                                c = 0;
                            }
                            d += table[j * cw + c];
                        }
                    }
                }
                if (ok) tk_offer(s, ((u64)tk_key(d) << 32) | (u64)ids[i]);
            }
            tk_round_end(s, k);
        }
        // The next probe's table replaces this one only when every thread is done with it.
        __syncthreads();
    }
    tk_compact(s, k);
    tk_write(s, k, 0u, __uint_as_float(0x7f800000u), 0xffffffffu, dist, ds0, ds1, lab, ls0, ls1, q);
}

#define IVF_SCAN(NAME, WORDS)                                                                      \
    extern "C" __global__ void __launch_bounds__(TK_BLOCK) NAME(                                   \
        const float* tables, const float* list_tables, const u32* probes, const float* bases,     \
        const u32* offsets, const u32* codes, const u32* ids, u32 np, u32 lists, u32 members,     \
        u32 bytes, u32 cw, u32 words, u32 k, float* dist, i64 ds0, i64 ds1, u32* lab, i64 ls0,     \
        i64 ls1, u32 fault_index, u32 fault_offsets, u32* fault) {                                 \
        ivf_scan_body<WORDS>(tables, list_tables, probes, bases, offsets, codes, ids, np, lists,  \
                             members, bytes, cw, words, k, dist, ds0, ds1, lab, ls0, ls1,          \
                             fault_index, fault_offsets, fault);                                   \
    }

IVF_SCAN(ivf_scan_w1, 1)
IVF_SCAN(ivf_scan_w2, 2)
IVF_SCAN(ivf_scan_w4, 4)
IVF_SCAN(ivf_scan_w8, 8)
IVF_SCAN(ivf_scan_any, 0)

// Candidate scores (hal::topk): a warp per (query, candidate). The lanes stride the
// dimension (f16 vectors two values a load where rows start on a 4-byte boundary), shuffles
// add the lanes' partial sums, lane 0 adds the biases and writes.

template <int KIND>  // 0: f32 vectors; 1: f16, one value a load; 2: f16, two a load
__device__ __forceinline__ float cs_dot(const float* q, const void* v, u64 row, u32 d, u32 lane) {
    float acc = 0.f;
    if (KIND == 0) {
        const float* vr = (const float*)v + row * d;
        for (u32 j = lane; j < d; j += 32) acc = fmaf(q[j], vr[j], acc);
    } else if (KIND == 1) {
        const unsigned short* vr = (const unsigned short*)v + row * d;
        for (u32 j = lane; j < d; j += 32) acc = fmaf(q[j], f16_widen(vr[j]), acc);
    } else {
        const u32* vr = (const u32*)((const unsigned short*)v + row * d);
        for (u32 p = lane; p < d / 2; p += 32) {
            u32 w = vr[p];
            acc = fmaf(q[2 * p], f16_widen(w & 0xffffu), acc);
            acc = fmaf(q[2 * p + 1], f16_widen(w >> 16), acc);
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

template <int KIND>
__device__ void candidate_scores_body(const float* q, const void* v, const u32* labels,
                                      const float* qb, const float* vb, u32 rows, u32 c, u32 d,
                                      u32 n, float alpha, float* out, i64 os0, i64 os1,
                                      u32 fault_index, u32* fault) {
    u64 pair = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    u32 lane = threadIdx.x & 31u;
    if (pair >= (u64)rows * c) return;  // the whole warp: pair is the warp's
    u64 r = pair / c, j = pair % c;
    u32 l = labels[pair];
    float score = __uint_as_float(0x7f800000u);
    if (l != 0xffffffffu && l >= n) {
        if (lane == 0u) report_fault(fault, l, n, fault_index);
    } else if (l != 0xffffffffu) {
        float dot = cs_dot<KIND>(q + r * d, v, l, d, lane);
        float bias = (qb ? qb[r] : 0.f) + (vb ? vb[l] : 0.f);
        score = bias + alpha * dot;
    }
    if (lane == 0u) out[(i64)r * os0 + (i64)j * os1] = score;
}

#define CANDIDATE_SCORES(NAME, KIND)                                                               \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                        \
        const float* q, const void* v, const u32* labels, const float* qb, const float* vb,       \
        u32 rows, u32 c, u32 d, u32 n, float alpha, float* out, i64 os0, i64 os1,                 \
        u32 fault_index, u32* fault) {                                                             \
        candidate_scores_body<KIND>(q, v, labels, qb, vb, rows, c, d, n, alpha, out, os0, os1,    \
                                    fault_index, fault);                                           \
    }

CANDIDATE_SCORES(candidate_scores_f32, 0)
CANDIDATE_SCORES(candidate_scores_f16, 1)
CANDIDATE_SCORES(candidate_scores_f16x2, 2)
