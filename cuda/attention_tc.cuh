// Attention on TF32 tensor cores (hal::Precision::Fast, f32 operands, rows of at most 64):
// flash attention 2's plan with mma.m16n8k8 (tf32.cuh gives the fragment layouts); every sum
// stays f32. The bodies are templates over the element type: the tile copies and the delta
// pass serve the 16-bit kernels too (attention_mma16.cuh). A block of four
// warps owns 64 query rows (16 a warp); key and value tiles of 32 rows stream through shared
// memory, double-buffered (cp.async copies the next tile during this one's products). Scores,
// weights and the output accumulate in registers in the C layout, where each lane holds two
// rows (g, g+8) and two adjacent columns of every 8-wide tile, so the online softmax's row
// maxima and sums take two shuffles; the weights go through a per-warp shared tile to become
// A fragments for the product with V.
#pragma once
#include "tf32.cuh"

#define TC_D 64
#define TC_BK 32
#define TC_PLD (TC_BK + 4)  // a warp's weights: a0 (g, t) reads P[g][t]: banks 4g + t

// The element types: f32, and the 16-bit floats as structs of their bits. `tc_f32` widens,
// `tc_frag` gives an f32's TF32 fragment register, `tc_put` rounds a result into the type.
struct bf16_t {
    u16 bits;
};
struct f16_t {
    u16 bits;
};
__device__ __forceinline__ float tc_f32(float v) { return v; }
__device__ __forceinline__ float tc_f32(bf16_t v) { return bf16_to_f32(v.bits); }
__device__ __forceinline__ float tc_f32(f16_t v) { return f16_widen(v.bits); }
__device__ __forceinline__ u32 tc_frag(float v) { return to_tf32(v); }
__device__ __forceinline__ void tc_put(float* p, float v) { *p = v; }
__device__ __forceinline__ void tc_put(bf16_t* p, float v) { p->bits = (u16)f32_to_bf16(v); }
__device__ __forceinline__ void tc_put(f16_t* p, float v) { p->bits = (u16)f32_to_f16(v); }

// Leading dimensions of the f32 shared tiles: K rows D + 4 (b0 (t, g) reads K[g][t]: banks
// 4g + t, all distinct), V rows D + 8 (b0 reads V[t][g]: banks 8t + g).
template <typename In> struct TcLd;
template <> struct TcLd<float> {
    static const int K = TC_D + 4, V = TC_D + 8;
};

// Tiles stream through shared memory double-buffered: cp.async (sm_80) copies the next tile
// while the block computes on this one. A copy of `valid == false` zero-fills its bytes and
// reads nothing.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(p));
    return s;
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most `pending` committed groups are still in flight (this thread's), then
// the block's barrier makes every thread's copies visible.
template <int pending> __device__ __forceinline__ void cp_async_wait_all_but() {
    asm volatile("cp.async.wait_group %0;" ::"n"(pending));
    __syncthreads();
}

// Starts copying rows r0.. (ROWS of them, columns up to TC_D, zero past `rows` and `width`)
// of a rank-4 operand into a shared tile of leading dimension LD: 16 bytes a copy where the
// rows are contiguous and 16-byte aligned; else an element a copy (4-byte cp.async for f32,
// plain loads and stores for the 16-bit types, visible after the pipeline's barrier).
template <typename In, int LD, int ROWS = TC_BK>
__device__ __forceinline__ void tc_issue_tile(const In* __restrict__ x, const Op4& xo, int b, int h, int r0,
                                              int rows, int width, In (*tile)[LD]) {
    constexpr int V = 16 / sizeof(In);  // elements a 16-byte copy moves
    const In* base = x + xo.off + (i64)b * xo.sb + (i64)h * xo.sh;
    const bool wide = xo.sc == 1 && ((xo.off | xo.sb | xo.sh | xo.st) & (V - 1)) == 0 && (width & (V - 1)) == 0 &&
                      ((u64)x & 15) == 0;
    if (wide) {
        for (int e = threadIdx.x; e < ROWS * TC_D / V; e += blockDim.x) {
            int r = e / (TC_D / V), c = (e % (TC_D / V)) * V, rr = r0 + r;
            bool ok = rr < rows && c < width;
            cp_async16(&tile[r][c], ok ? base + (i64)rr * xo.st + c : x, ok);
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * TC_D; e += blockDim.x) {
            int r = e / TC_D, c = e % TC_D, rr = r0 + r;
            bool ok = rr < rows && c < width;
            const In* src = ok ? base + (i64)rr * xo.st + (i64)c * xo.sc : x;
            if constexpr (sizeof(In) == 4) {
                cp_async4(&tile[r][c], src, ok);
            } else {
                In zero;
                zero.bits = 0;
                tile[r][c] = ok ? *src : zero;
            }
        }
    }
}

// The key/value tiles of BN rows a query block of 64 rows starting at row blk0 visits (causal:
// none past its last row), and tile `tile`'s copies of k and v into the given buffers (the forward pass's value
// tile has its own leading dimension).
template <int BN = TC_BK> __device__ __forceinline__ int tc_key_tiles(const AttnArgs& a, int blk0) {
    const int kend = a.causal ? min(a.tk, blk0 + 64) : a.tk;
    return (kend + BN - 1) / BN;
}
template <typename In, int LDK, int LDV, int ROWS = TC_BK>
__device__ __forceinline__ void tc_issue_kv(const In* __restrict__ k, const Op4& ko, const In* __restrict__ v,
                                            const Op4& vo, const AttnArgs& a, int b, int h, int tile,
                                            In (*ks)[LDK], In (*vs)[LDV]) {
    tc_issue_tile<In, LDK, ROWS>(k, ko, b, h, tile * ROWS, a.tk, a.d, ks);
    tc_issue_tile<In, LDV, ROWS>(v, vo, b, h, tile * ROWS, a.tk, a.dv, vs);
}

// The double-buffered pipeline over `tiles` tiles: `tc_pipeline_start` starts tile 0's copy
// into buffer 0; `tc_pipeline_step(it, ...)` starts tile it + 1's into the other buffer and
// waits for tile it's. `issue(tile, buffer)` starts one tile's copies.
template <typename Issue> __device__ __forceinline__ void tc_pipeline_start(int tiles, Issue issue) {
    if (tiles > 0) issue(0, 0);
    cp_async_commit();
}
template <typename Issue> __device__ __forceinline__ void tc_pipeline_step(int it, int tiles, Issue issue) {
    if (it + 1 < tiles) {
        issue(it + 1, (it + 1) & 1);
        cp_async_commit();
        cp_async_wait_all_but<1>();
    } else {
        cp_async_wait_all_but<0>();
    }
}

// Runs `body(j0, buf)` for each key tile of ROWS rows that the query block of 64 rows from
// blk0 visits, with the tile's k and v rows in ks[buf] and vs[buf] (copied double-buffered),
// and the block's barrier after each (every warp is done with a buffer before it is refilled).
template <int ROWS, typename In, int LDK, int LDV, typename Body>
__device__ __forceinline__ void tc_for_key_tiles(const In* __restrict__ k, const Op4& ko, const In* __restrict__ v,
                                                 const Op4& vo, const AttnArgs& a, int b, int h, int blk0,
                                                 In (*ks)[ROWS][LDK], In (*vs)[ROWS][LDV], Body body) {
    const int tiles = tc_key_tiles<ROWS>(a, blk0);
    auto issue = [&](int tile, int buf) {
        tc_issue_kv<In, LDK, LDV, ROWS>(k, ko, v, vo, a, b, h, tile, ks[buf], vs[buf]);
    };
    tc_pipeline_start(tiles, issue);
    for (int it = 0; it < tiles; ++it) {
        tc_pipeline_step(it, tiles, issue);
        body(it * ROWS, it & 1);
        __syncthreads();
    }
}

// Scores of rows (g, g+8) x columns (2t, 2t+1) of each of a tile's four 8-key groups: scaled
// (q was), masked, causal; -inf where a key is past tk.
__device__ __forceinline__ void tc_mask(const AttnArgs& a, const float* mask, const Op4& mo, int b, int h, int i0,
                                        int j0, float (&s)[4][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int i = i0 + g + (e / 2) * 8, j = j0 + nt * 8 + 2 * t + (e % 2);
            float v = s[nt][e];
            if (j >= a.tk || i >= a.tq || (a.causal && j > i)) v = -INFINITY;
            else if (a.has_mask) v += mask[at(mo, b, h, i, j)];
            s[nt][e] = v;
        }
}

// The dropout factor of weight (bh, i, j), as drop_factor's, but inlined: the call of the
// out-of-line Philox cost these kernels a fifth of their time (measured).
__device__ __forceinline__ float tc_drop(const AttnArgs& a, int bh, int i, int j) {
    if (!a.dropout_on) return 1.0f;
    u64 idx = a.offset + ((u64)bh * a.tq + i) * a.tk + j;
    u32 c[4] = {(u32)idx, (u32)(idx >> 32), 0u, 0u};
    philox(c, a.seed_lo, a.seed_hi);
    return (c[0] >> 8) >= a.threshold ? a.keep_scale : 0.0f;
}

// Max and sum across the four lanes of a row group.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <typename In>
__device__ __forceinline__ void attention_fwd_tc_body(const In* __restrict__ q, Op4 qo, const In* __restrict__ k,
                                                      Op4 ko, const In* __restrict__ v, Op4 vo,
                                                      const float* __restrict__ mask, Op4 mo, In* __restrict__ out,
                                                      Op4 oo, float* __restrict__ lse, Op4 lo, AttnArgs a) {
    __shared__ __align__(16) In ks[2][TC_BK][TcLd<In>::K];
    __shared__ __align__(16) In vs[2][TC_BK][TcLd<In>::V];
    __shared__ float ps[4][16][TC_PLD];
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int blk0 = (gridDim.y - 1 - blockIdx.y) * 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int i0 = blk0 + warp * 16;
    // q's A fragments for the eight 8-wide steps of d, pre-scaled.
    u32 qa[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int i = i0 + g + (e % 2) * 8, c = kk * 8 + t + (e / 2) * 4;
            float x = (i < a.tq && c < a.d) ? tc_f32(q[at(qo, b, h, i, c)]) * a.scale : 0.0f;
            qa[kk][e] = to_tf32(x);
        }
    float o[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int tiles = tc_key_tiles(a, blk0);
    auto issue = [&](int tile, int buf) { tc_issue_kv(k, ko, v, vo, a, b, h, tile, ks[buf], vs[buf]); };
    tc_pipeline_start(tiles, issue);
    for (int it = 0; it < tiles; ++it) {
        const int j0 = it * TC_BK, buf = it & 1;
        tc_pipeline_step(it, tiles, issue);
        float s[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < 8; ++kk) {
                u32 kb[2] = {tc_frag(ks[buf][nt * 8 + g][kk * 8 + t]), tc_frag(ks[buf][nt * 8 + g][kk * 8 + t + 4])};
                mma_tf32(s[nt], qa[kk], kb);
            }
        }
        tc_mask(a, mask, mo, b, h, i0, j0, s);
        // The online softmax, row g (r = 0) and row g + 8 (r = 1).
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            float mnew = fmaxf(m[r], quad_max(mx));
            corr[r] = (mnew == -INFINITY || m[r] == -INFINITY) ? (m[r] == -INFINITY ? 0.0f : 1.0f)
                                                               : __expf(m[r] - mnew);
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    float x = s[nt][2 * r + c];
                    float p = x == -INFINITY ? 0.0f : __expf(x - mnew);
                    sum += p;
                    s[nt][2 * r + c] = p;
                }
            l[r] = l[r] * corr[r] + quad_sum(sum);
            m[r] = mnew;
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            o[nt][0] *= corr[0];
            o[nt][1] *= corr[0];
            o[nt][2] *= corr[1];
            o[nt][3] *= corr[1];
        }
        // Weights (dropped ones zeroed, kept ones scaled) to the warp's tile, then A fragments.
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int row = g + (e / 2) * 8, col = nt * 8 + 2 * t + (e % 2);
                float p = s[nt][e];
                if (p != 0.0f) p *= tc_drop(a, bh, i0 + row, j0 + col);
                ps[warp][row][col] = p;
            }
        __syncwarp();
#pragma unroll
        for (int kk = 0; kk < TC_BK / 8; ++kk) {
            u32 pa[4] = {to_tf32(ps[warp][g][kk * 8 + t]), to_tf32(ps[warp][g + 8][kk * 8 + t]),
                         to_tf32(ps[warp][g][kk * 8 + t + 4]), to_tf32(ps[warp][g + 8][kk * 8 + t + 4])};
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                u32 vb[2] = {tc_frag(vs[buf][kk * 8 + t][nt * 8 + g]), tc_frag(vs[buf][kk * 8 + t + 4][nt * 8 + g])};
                mma_tf32(o[nt], pa, vb);
            }
        }
        // Every warp is done with this buffer before the next iteration refills it.
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        int i = i0 + g + r * 8;
        if (i >= a.tq) continue;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                int col = nt * 8 + 2 * t + c;
                if (col < a.dv) tc_put(&out[at(oo, b, h, i, col)], o[nt][2 * r + c] * inv);
            }
        if (t == 0) lse[at(lo, b, h, i, 0)] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
    }
}

// delta = dout . out for each query row (a warp a row), into a contiguous scratch [bh * tq]
// that both tensor-core gradient kernels read.
template <typename In>
__device__ __forceinline__ void attention_delta_tc_body(const In* __restrict__ out, Op4 oo, const In* __restrict__ dout,
                                                        Op4 go, float* __restrict__ delta, i64 rows, AttnArgs a) {
    const i64 r = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const int i = (int)(r % a.tq), bh = (int)(r / a.tq), b = bh / a.heads, h = bh % a.heads;
    float s = 0.0f;
    for (int c = lane; c < a.dv; c += 32) s = fmaf(tc_f32(dout[at(go, b, h, i, c)]), tc_f32(out[at(oo, b, h, i, c)]), s);
    s = warp_sum(s);
    if (lane == 0) delta[r] = s;
}

// A warp's 16 rows x 64 columns of a row-major operand as A fragments (eight 8-wide steps),
// scaled by `by` (0 past `rows` or `width`).
template <typename In>
__device__ __forceinline__ void tc_rows_a(const In* __restrict__ x, const Op4& xo, int b, int h, int r0, int rows,
                                          int width, float by, u32 (&frag)[8][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int r = r0 + g + (e % 2) * 8, c = kk * 8 + t + (e / 2) * 4;
            frag[kk][e] = to_tf32((r < rows && c < width) ? tc_f32(x[at(xo, b, h, r, c)]) * by : 0.0f);
        }
}

// acc[nt] += A (16 x 64, fragments) . B^T where B's rows are tile rows nt*8.. of `tile`
// (row-major, leading dimension LD): the 16 x 32 product of a warp's rows with a tile.
template <typename In, int LD>
__device__ __forceinline__ void tc_times_rows(const u32 (&frag)[8][4], const In (*tile)[LD], float (&acc)[4][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            u32 bb[2] = {tc_frag(tile[nt * 8 + g][kk * 8 + t]), tc_frag(tile[nt * 8 + g][kk * 8 + t + 4])};
            mma_tf32(acc[nt], frag[kk], bb);
        }
    }
}

// acc (16 x 64) += W (a warp's 16 x 32 tile in shared memory, leading dimension TC_PLD) . tile
// (32 x 64, row-major, leading dimension LD).
template <typename In, int LD>
__device__ __forceinline__ void tc_accumulate(const float (*w)[TC_PLD], const In (*tile)[LD], float (&acc)[8][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < TC_BK / 8; ++kk) {
        u32 wa[4] = {to_tf32(w[g][kk * 8 + t]), to_tf32(w[g + 8][kk * 8 + t]), to_tf32(w[g][kk * 8 + t + 4]),
                     to_tf32(w[g + 8][kk * 8 + t + 4])};
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            u32 bb[2] = {tc_frag(tile[kk * 8 + t][nt * 8 + g]), tc_frag(tile[kk * 8 + t + 4][nt * 8 + g])};
            mma_tf32(acc[nt], wa, bb);
        }
    }
}

// Stores a warp's 16 x 64 accumulator (C layout) times `by` into rows r0.. of a rank-4
// operand, skipping rows past `rows` and columns past `width`.
template <typename In>
__device__ __forceinline__ void tc_store_rows(const float (&acc)[8][4], In* __restrict__ x, const Op4& xo, int b, int h,
                                              int r0, int rows, int width, float by) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        int row = r0 + g + r * 8;
        if (row >= rows) continue;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                int col = nt * 8 + 2 * t + c;
                if (col < width) tc_put(&x[at(xo, b, h, row, col)], acc[nt][2 * r + c] * by);
            }
    }
}

// dk, dv: a block of four warps owns 64 key rows (16 a warp: k and v as A fragments, both
// gradients accumulated in registers); tiles of 32 query rows (q, dout, lse, delta) stream
// through shared memory. Per tile a warp forms S^T and dP^T (16 x 32) on tensor cores, the
// weights and dS^T elementwise, then dv += P~^T dout and dk += dS^T q. Three blocks an SM:
// a few spilled registers cost less than the third block's latency hiding gains (measured).
template <typename In>
__device__ __forceinline__ void attention_bwd_kv_tc_body(const In* __restrict__ q, Op4 qo, const In* __restrict__ k,
                                                         Op4 ko, const In* __restrict__ v, Op4 vo,
                                                         const float* __restrict__ mask, Op4 mo,
                                                         const float* __restrict__ lse, Op4 lo,
                                                         const In* __restrict__ dout, Op4 go,
                                                         const float* __restrict__ delta, In* __restrict__ dk, Op4 dko,
                                                         In* __restrict__ dv, Op4 dvo, AttnArgs a) {
    __shared__ __align__(16) In qs[2][TC_BK][TcLd<In>::K];
    __shared__ __align__(16) In gs[2][TC_BK][TcLd<In>::K];
    __shared__ float ls[2][TC_BK], dls[2][TC_BK];
    __shared__ float w[4][16][TC_PLD];
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int blk0 = (gridDim.y - 1 - blockIdx.y) * 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int j0 = blk0 + warp * 16;
    u32 ka[8][4], va[8][4];
    tc_rows_a(k, ko, b, h, j0, a.tk, a.d, a.scale, ka);
    tc_rows_a(v, vo, b, h, j0, a.tk, a.dv, 1.0f, va);
    float gk[8][4], gv[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) gk[nt][e] = gv[nt][e] = 0.0f;
    const int istart = a.causal ? (blk0 / TC_BK) * TC_BK : 0;
    const int tiles = a.tq > istart ? (a.tq - istart + TC_BK - 1) / TC_BK : 0;
    // Query tile `tile` (rows from istart + tile TC_BK) into buffer `buf`: q, dout, and the
    // rows' log-sum-exps and deltas (rows past tq read as 0; no weight of theirs is formed).
    auto issue = [&](int tile, int buf) {
        const int i0 = istart + tile * TC_BK;
        tc_issue_tile(q, qo, b, h, i0, a.tq, a.d, qs[buf]);
        tc_issue_tile(dout, go, b, h, i0, a.tq, a.dv, gs[buf]);
        if (threadIdx.x < TC_BK) {
            int i = i0 + threadIdx.x;
            bool ok = i < a.tq;
            cp_async4(&ls[buf][threadIdx.x], ok ? lse + at(lo, b, h, i, 0) : lse, ok);
            cp_async4(&dls[buf][threadIdx.x], ok ? delta + (i64)bh * a.tq + i : delta, ok);
        }
    };
    tc_pipeline_start(tiles, issue);
    for (int it = 0; it < tiles; ++it) {
        const int i0 = istart + it * TC_BK, buf = it & 1;
        tc_pipeline_step(it, tiles, issue);
        float st[4][4], dpt[4][4];
        tc_times_rows(ka, qs[buf], st);
        tc_times_rows(va, gs[buf], dpt);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int row = g + (e / 2) * 8, col = nt * 8 + 2 * t + (e % 2);
                int j = j0 + row, i = i0 + col;
                float p = 0.0f, ds = 0.0f;
                if (j < a.tk && i < a.tq && !(a.causal && j > i)) {
                    float s = st[nt][e];
                    if (a.has_mask) s += mask[at(mo, b, h, i, j)];
                    p = recompute<float>(s, ls[buf][col]);
                    if (p != 0.0f) {
                        float z = tc_drop(a, bh, i, j);
                        ds = p * (z * dpt[nt][e] - dls[buf][col]);
                        p *= z;
                    }
                }
                w[warp][row][col] = p;
                dpt[nt][e] = ds;
            }
        // The warp's tile holds the weights for dv, then dS for dk.
        __syncwarp();
        tc_accumulate(w[warp], gs[buf], gv);
        __syncwarp();
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) w[warp][g + (e / 2) * 8][nt * 8 + 2 * t + (e % 2)] = dpt[nt][e];
        __syncwarp();
        tc_accumulate(w[warp], qs[buf], gk);
        // Every warp is done with this buffer before the next iteration refills it.
        __syncthreads();
    }
    tc_store_rows(gk, dk, dko, b, h, j0, a.tk, a.d, a.scale);
    tc_store_rows(gv, dv, dvo, b, h, j0, a.tk, a.dv, 1.0f);
}

// dq: a block of four warps owns 64 query rows (q and dout as A fragments, dq accumulated in
// registers); tiles of 32 key rows (k, v) stream through shared memory.
template <typename In>
__device__ __forceinline__ void attention_bwd_q_tc_body(const In* __restrict__ q, Op4 qo, const In* __restrict__ k,
                                                        Op4 ko, const In* __restrict__ v, Op4 vo,
                                                        const float* __restrict__ mask, Op4 mo,
                                                        const float* __restrict__ lse, Op4 lo,
                                                        const In* __restrict__ dout, Op4 go,
                                                        const float* __restrict__ delta, In* __restrict__ dq, Op4 dqo,
                                                        AttnArgs a) {
    __shared__ __align__(16) In ks[2][TC_BK][TcLd<In>::K];
    __shared__ __align__(16) In vs[2][TC_BK][TcLd<In>::K];
    __shared__ float sw[4][16][TC_PLD];
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int blk0 = (gridDim.y - 1 - blockIdx.y) * 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int i0 = blk0 + warp * 16;
    u32 qa[8][4], ga[8][4];
    tc_rows_a(q, qo, b, h, i0, a.tq, a.d, a.scale, qa);
    tc_rows_a(dout, go, b, h, i0, a.tq, a.dv, 1.0f, ga);
    float li[2], di[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        int i = i0 + g + r * 8;
        li[r] = i < a.tq ? lse[at(lo, b, h, i, 0)] : -INFINITY;
        di[r] = i < a.tq ? delta[(i64)bh * a.tq + i] : 0.0f;
    }
    float gq[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) gq[nt][e] = 0.0f;
    const int tiles = tc_key_tiles(a, blk0);
    auto issue = [&](int tile, int buf) { tc_issue_kv(k, ko, v, vo, a, b, h, tile, ks[buf], vs[buf]); };
    tc_pipeline_start(tiles, issue);
    for (int it = 0; it < tiles; ++it) {
        const int j0 = it * TC_BK, buf = it & 1;
        tc_pipeline_step(it, tiles, issue);
        float s[4][4], dp[4][4];
        tc_times_rows(qa, ks[buf], s);
        tc_times_rows(ga, vs[buf], dp);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int row = g + (e / 2) * 8, col = nt * 8 + 2 * t + (e % 2);
                int i = i0 + row, j = j0 + col;
                float ds = 0.0f;
                if (j < a.tk && i < a.tq && !(a.causal && j > i)) {
                    float x = s[nt][e];
                    if (a.has_mask) x += mask[at(mo, b, h, i, j)];
                    float p = recompute<float>(x, li[e / 2]);
                    if (p != 0.0f) ds = p * (tc_drop(a, bh, i, j) * dp[nt][e] - di[e / 2]);
                }
                sw[warp][row][col] = ds;
            }
        __syncwarp();
        tc_accumulate(sw[warp], ks[buf], gq);
        // Every warp is done with this buffer before the next iteration refills it.
        __syncthreads();
    }
    tc_store_rows(gq, dq, dqo, b, h, i0, a.tq, a.d, a.scale);
}

// The kernels of one element type over the given bodies: the f32 ones here (names
// unsuffixed), the 16-bit ones in attention_mma16.cuh, which use this file's delta pass,
// pipeline and tile copies. The dk/dv kernel runs three blocks an SM: a few spilled registers
// cost less than the third block's latency hiding gains (measured).
#define TC_KERNELS(In, SUFFIX, FWD, KV, Q)                                                                             \
    extern "C" __global__ void __launch_bounds__(128)                                                                  \
        attention_fwd_tc##SUFFIX(const In* q, Op4 qo, const In* k, Op4 ko, const In* v, Op4 vo, const float* mask,    \
                                 Op4 mo, In* out, Op4 oo, float* lse, Op4 lo, AttnArgs a) {                           \
        FWD<In>(q, qo, k, ko, v, vo, mask, mo, out, oo, lse, lo, a);                                                   \
    }                                                                                                                  \
    extern "C" __global__ void attention_delta_tc##SUFFIX(const In* out, Op4 oo, const In* dout, Op4 go, float* delta, \
                                                          i64 rows, AttnArgs a) {                                      \
        attention_delta_tc_body<In>(out, oo, dout, go, delta, rows, a);                                                \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(128, 3)                                                               \
        attention_bwd_kv_tc##SUFFIX(const In* q, Op4 qo, const In* k, Op4 ko, const In* v, Op4 vo, const float* mask, \
                                    Op4 mo, const float* lse, Op4 lo, const In* dout, Op4 go, const float* delta,     \
                                    In* dk, Op4 dko, In* dv, Op4 dvo, AttnArgs a) {                                   \
        KV<In>(q, qo, k, ko, v, vo, mask, mo, lse, lo, dout, go, delta, dk, dko, dv, dvo, a);                          \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(128)                                                                  \
        attention_bwd_q_tc##SUFFIX(const In* q, Op4 qo, const In* k, Op4 ko, const In* v, Op4 vo, const float* mask,  \
                                   Op4 mo, const float* lse, Op4 lo, const In* dout, Op4 go, const float* delta,      \
                                   In* dq, Op4 dqo, AttnArgs a) {                                                     \
        Q<In>(q, qo, k, ko, v, vo, mask, mo, lse, lo, dout, go, delta, dq, dqo, a);                                    \
    }

TC_KERNELS(float, , attention_fwd_tc_body, attention_bwd_kv_tc_body, attention_bwd_q_tc_body)
