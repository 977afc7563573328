// Attention on 16-bit tensor cores (hal::Precision::Fast, bf16 or f16 operands, rows of at
// most 64): flash attention 2's plan with mma.m16n8k16, operands in their own type, every sum
// in f32. The weights (and, backward, the score gradients) are rounded to the operands' type
// before their products, as flash attention does. A block of four warps owns 64 rows (16 a
// warp); tiles of the other side stream through shared memory, double-buffered with cp.async
// (attention_tc.cuh's pipeline), and reach the tensor cores through ldmatrix.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4; two 16-bit elements a
// register, the lower column in the lower half): A (16x16, row) reg e holds row g + (e % 2) 8,
// columns 2t + (e / 2) 8 and the next; B (16x8, col) reg e holds rows (k) 2t + 8e and the
// next, column (n) g; C (16x8, f32) c0 c1 at row g, columns 2t, 2t + 1, c2 c3 at row g + 8.
// So an accumulator's two adjacent 8-wide tiles are, packed, one A fragment: the weights go
// from the scores' registers straight into the next product.
#pragma once
#include "attention_tc.cuh"

// 144-byte rows: 16-byte aligned for cp.async and ldmatrix, and the eight rows one ldmatrix
// reads start in distinct groups of four banks.
#define M16_LD (TC_D + 8)

__device__ __forceinline__ void mma16(bf16_t, float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16(f16_t, float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 values rounded (to nearest) into one register of the type: `lo` in the lower half.
__device__ __forceinline__ u32 pack16(bf16_t, float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u32 pack16(f16_t, float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Four 8x8 matrices of 16-bit elements from shared memory: lane l gives the address of row
// l % 8 of matrix l / 8 and receives, in r[m], matrix m's elements (row g, columns 2t, 2t+1);
// transposed, its elements (rows 2t, 2t+1, column g).
__device__ __forceinline__ void ldsm4(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm4_t(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// B fragments of two 8-wide n tiles (n0, n0 + 8) for the k step k0..k0+15, from a tile stored
// with n along its rows (row-major [n][k]): r[0], r[1] for tile n0, r[2], r[3] for n0 + 8.
template <typename In>
__device__ __forceinline__ void m16_b_rows(u32 (&r)[4], const In (*tile)[M16_LD], int n0, int k0) {
    const int lane = threadIdx.x % 32, m = lane / 8;
    ldsm4(r, &tile[n0 + lane % 8 + (m / 2) * 8][k0 + (m % 2) * 8]);
}
// The same from a tile stored with k along its rows (row-major [k][n]), transposed on load.
template <typename In>
__device__ __forceinline__ void m16_b_cols(u32 (&r)[4], const In (*tile)[M16_LD], int k0, int n0) {
    const int lane = threadIdx.x % 32, m = lane / 8;
    ldsm4_t(r, &tile[k0 + lane % 8 + (m % 2) * 8][n0 + (m / 2) * 8]);
}

// A warp's 16 rows (from r0) x 64 columns of a rank-4 operand as A fragments for four k
// steps, their bits as stored (0 past `rows` or `width`).
template <typename In>
__device__ __forceinline__ void m16_rows_a(const In* __restrict__ x, const Op4& xo, int b, int h, int r0, int rows,
                                           int width, u32 (&frag)[4][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = r0 + g + (e % 2) * 8, c = kk * 16 + 2 * t + (e / 2) * 8;
            const bool row = r < rows;
            const u32 lo = row && c < width ? x[at(xo, b, h, r, c)].bits : 0u;
            const u32 hi = row && c + 1 < width ? x[at(xo, b, h, r, c + 1)].bits : 0u;
            frag[kk][e] = lo | (hi << 16);
        }
}

template <int NT> __device__ __forceinline__ void m16_zero(float (&acc)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
}

// acc (16 rows x 8 NT columns) = A (16 x 64, four k steps) . B where B's n index runs along
// the rows of `tile` (rows n0.., 64 columns of k): the products with a tile's rows.
template <typename In, int NT>
__device__ __forceinline__ void m16_times_rows(const u32 (&a)[4][4], const In (*tile)[M16_LD], float (&acc)[NT][4]) {
    m16_zero(acc);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            u32 bb[4];
            m16_b_rows(bb, tile, np * 16, kk * 16);
            mma16(In{}, acc[2 * np], a[kk], bb[0], bb[1]);
            mma16(In{}, acc[2 * np + 1], a[kk], bb[2], bb[3]);
        }
}

// acc (16 x 64) += W . tile, where W (16 x 8 NT, an accumulator in the C layout) is rounded to
// the type and the tile holds 8 NT rows (k) of 64 columns (n).
template <typename In, int NT>
__device__ __forceinline__ void m16_accumulate(const float (&w)[NT][4], const In (*tile)[M16_LD],
                                               float (&acc)[8][4]) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        const u32 wa[4] = {pack16(In{}, w[2 * kk][0], w[2 * kk][1]), pack16(In{}, w[2 * kk][2], w[2 * kk][3]),
                           pack16(In{}, w[2 * kk + 1][0], w[2 * kk + 1][1]),
                           pack16(In{}, w[2 * kk + 1][2], w[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            u32 bb[4];
            m16_b_cols(bb, tile, kk * 16, np * 16);
            mma16(In{}, acc[2 * np], wa, bb[0], bb[1]);
            mma16(In{}, acc[2 * np + 1], wa, bb[2], bb[3]);
        }
    }
}

// Raw products to scores, rows i0 + (g, g+8) x columns j0 + 8 nt + (2t, 2t+1): scaled,
// masked, causal; -inf past tk or tq. A tile wholly inside the rows, keys and the causal
// triangle, with no mask, is only scaled.
template <int NT>
__device__ __forceinline__ void m16_scores(const AttnArgs& a, const float* mask, const Op4& mo, int b, int h, int i0,
                                           int j0, float (&s)[NT][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const bool inside = !a.has_mask && i0 + 16 <= a.tq && j0 + 8 * NT <= a.tk && (!a.causal || j0 + 8 * NT <= i0 + 1);
    if (inside) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] *= a.scale;
        return;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = i0 + g + (e / 2) * 8, j = j0 + nt * 8 + 2 * t + (e % 2);
            float v = s[nt][e] * a.scale;
            if (j >= a.tk || i >= a.tq || (a.causal && j > i)) v = -INFINITY;
            else if (a.has_mask) v += mask[at(mo, b, h, i, j)];
            s[nt][e] = v;
        }
}

// The dropout and the elementwise passes of the gradients take whether dropout is on as a
// template parameter, tested once a tile outside them: a run-time test inside their unrolled
// loops let the compiler predicate every element's inlined Philox into the tile (a thousand
// instructions a tile for a warp, issued whether dropout was on or not).

// Weights (rows i0 + (g, g+8), columns j0 + 8 nt + (2t, 2t+1)) times their dropout factors.
template <int NT>
__device__ __forceinline__ void m16_drop(const AttnArgs& a, int bh, int i0, int j0, float (&s)[NT][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (s[nt][e] != 0.0f) s[nt][e] *= tc_drop(a, bh, i0 + g + (e / 2) * 8, j0 + nt * 8 + 2 * t + (e % 2));
}

// A row's log-sum-exp l as the weights exp(s - l) take it: -inf (a row without weights)
// becomes +inf, so that every weight of such a row, like a masked score's, comes out 0
// without a branch.
__device__ __forceinline__ float m16_lse(float l) { return l == -INFINITY ? INFINITY : l; }

// dS from a weight: p (z dp - delta), exactly 0 where the weight is (whatever dp holds).
__device__ __forceinline__ float m16_ds(float p, float z, float dp, float delta) {
    return p != 0.0f ? p * (z * dp - delta) : 0.0f;
}

// A dk/dv tile's weights and dS^T in place: st holds the raw products k.q and becomes the
// (dropped) weights, dpt holds v.dout and becomes dS^T; rows are keys j0 + (g, g+8), columns
// queries i0 + 8 nt + (2t, 2t+1), whose log-sum-exps and deltas are ls and dls. Pairs out of
// range or past the causal line take a score of -inf in a pass of their own, so the common
// pass has no branch.
template <bool DROP, int NT>
__device__ __forceinline__ void m16_kv_weights(const AttnArgs& a, const float* mask, const Op4& mo, int b, int h,
                                               int bh, int j0, int i0, const float* ls, const float* dls,
                                               float (&st)[NT][4], float (&dpt)[NT][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const bool inside = !a.has_mask && j0 + 16 <= a.tk && i0 + 8 * NT <= a.tq && (!a.causal || j0 + 15 <= i0);
    if (inside) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[nt][e] *= a.scale;
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = j0 + g + (e / 2) * 8, i = i0 + nt * 8 + 2 * t + (e % 2);
                const bool live = j < a.tk && i < a.tq && !(a.causal && j > i);
                float s = st[nt][e] * a.scale;
                if (live && a.has_mask) s += mask[at(mo, b, h, i, j)];
                st[nt][e] = live ? s : -INFINITY;
            }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int col = nt * 8 + 2 * t + c;
            const float l = m16_lse(ls[col]), delta = dls[col];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int e = 2 * r + c;
                const float p = __expf(st[nt][e] - l);
                const float z = DROP && p != 0.0f ? tc_drop(a, bh, i0 + col, j0 + g + r * 8) : 1.0f;
                dpt[nt][e] = m16_ds(p, z, dpt[nt][e], delta);
                st[nt][e] = p * z;
            }
        }
}

// A dq tile's dS in place: s holds the scores (m16_scores's), dp holds dout.v; rows are
// queries i0 + (g, g+8) with log-sum-exps li and deltas di, columns keys j0 + 8 nt + (2t, 2t+1).
template <bool DROP, int NT>
__device__ __forceinline__ void m16_q_grads(const AttnArgs& a, int bh, int i0, int j0, const float (&li)[2],
                                            const float (&di)[2], const float (&s)[NT][4], float (&dp)[NT][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float l[2] = {m16_lse(li[0]), m16_lse(li[1])};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = __expf(s[nt][e] - l[e / 2]);
            const float z =
                DROP && p != 0.0f ? tc_drop(a, bh, i0 + g + (e / 2) * 8, j0 + nt * 8 + 2 * t + (e % 2)) : 1.0f;
            dp[nt][e] = m16_ds(p, z, dp[nt][e], di[e / 2]);
        }
}

// Forward: a warp's 16 query rows against key tiles of 64.
template <typename In>
__device__ __forceinline__ void attention_fwd_m16_body(const In* __restrict__ q, Op4 qo, const In* __restrict__ k,
                                                       Op4 ko, const In* __restrict__ v, Op4 vo,
                                                       const float* __restrict__ mask, Op4 mo, In* __restrict__ out,
                                                       Op4 oo, float* __restrict__ lse, Op4 lo, AttnArgs a) {
    constexpr int BN = 64;
    __shared__ __align__(16) In ks[2][BN][M16_LD];
    __shared__ __align__(16) In vs[2][BN][M16_LD];
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int blk0 = (gridDim.y - 1 - blockIdx.y) * 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int i0 = blk0 + warp * 16;
    u32 qa[4][4];
    m16_rows_a(q, qo, b, h, i0, a.tq, a.d, qa);
    float o[8][4];
    m16_zero(o);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    tc_for_key_tiles(k, ko, v, vo, a, b, h, blk0, ks, vs, [&](int j0, int buf) {
        float s[8][4];
        m16_times_rows(qa, ks[buf], s);
        m16_scores(a, mask, mo, b, h, i0, j0, s);
        // The online softmax, row g (r = 0) and row g + 8 (r = 1).
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            const float mnew = fmaxf(m[r], quad_max(mx));
            // A row with no weight yet subtracts 0: its -inf scores give 0, its old sum (0)
            // is scaled by exp(-inf) = 0, and no branch is needed.
            const float base = mnew == -INFINITY ? 0.0f : mnew;
            corr[r] = __expf(m[r] - base);
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float p = __expf(s[nt][2 * r + c] - base);
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
        if (a.dropout_on) m16_drop(a, bh, i0, j0, s);
        m16_accumulate(s, vs[buf], o);
    });
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = i0 + g + r * 8;
        if (i >= a.tq) continue;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = nt * 8 + 2 * t + c;
                if (col < a.dv) tc_put(&out[at(oo, b, h, i, col)], o[nt][2 * r + c] * inv);
            }
        if (t == 0) lse[at(lo, b, h, i, 0)] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
    }
}

// dk, dv: a warp's 16 key rows (k and v as A fragments, both gradients in registers) against
// query tiles of 32 (q, dout, their log-sum-exps and deltas). Per tile: S^T and dP^T on the
// tensor cores, the weights and dS^T in registers, then dv += P~^T dout and dk += dS^T q.
template <typename In>
__device__ __forceinline__ void attention_bwd_kv_m16_body(const In* __restrict__ q, Op4 qo, const In* __restrict__ k,
                                                          Op4 ko, const In* __restrict__ v, Op4 vo,
                                                          const float* __restrict__ mask, Op4 mo,
                                                          const float* __restrict__ lse, Op4 lo,
                                                          const In* __restrict__ dout, Op4 go,
                                                          const float* __restrict__ delta, In* __restrict__ dk,
                                                          Op4 dko, In* __restrict__ dv, Op4 dvo, AttnArgs a) {
    constexpr int BM = 32;
    __shared__ __align__(16) In qs[2][BM][M16_LD];
    __shared__ __align__(16) In gs[2][BM][M16_LD];
    __shared__ float ls[2][BM], dls[2][BM];
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    // Causal: the blocks with the most query tiles (the first keys) first.
    const int blk0 = blockIdx.y * 64;
    const int warp = threadIdx.x / 32;
    const int j0 = blk0 + warp * 16;
    u32 ka[4][4], va[4][4];
    m16_rows_a(k, ko, b, h, j0, a.tk, a.d, ka);
    m16_rows_a(v, vo, b, h, j0, a.tk, a.dv, va);
    float gk[8][4], gv[8][4];
    m16_zero(gk);
    m16_zero(gv);
    // Causal: no query before the block's first key has a weight on it.
    const int istart = a.causal ? blk0 : 0;
    const int tiles = a.tq > istart ? (a.tq - istart + BM - 1) / BM : 0;
    auto issue = [&](int tile, int buf) {
        const int i0 = istart + tile * BM;
        tc_issue_tile<In, M16_LD, BM>(q, qo, b, h, i0, a.tq, a.d, qs[buf]);
        tc_issue_tile<In, M16_LD, BM>(dout, go, b, h, i0, a.tq, a.dv, gs[buf]);
        if (threadIdx.x < BM) {
            const int i = i0 + threadIdx.x;
            const bool ok = i < a.tq;
            cp_async4(&ls[buf][threadIdx.x], ok ? lse + at(lo, b, h, i, 0) : lse, ok);
            cp_async4(&dls[buf][threadIdx.x], ok ? delta + (i64)bh * a.tq + i : delta, ok);
        }
    };
    tc_pipeline_start(tiles, issue);
    for (int it = 0; it < tiles; ++it) {
        const int i0 = istart + it * BM, buf = it & 1;
        tc_pipeline_step(it, tiles, issue);
        float st[BM / 8][4], dpt[BM / 8][4];
        m16_times_rows(ka, qs[buf], st);
        m16_times_rows(va, gs[buf], dpt);
        if (a.dropout_on) m16_kv_weights<true>(a, mask, mo, b, h, bh, j0, i0, ls[buf], dls[buf], st, dpt);
        else m16_kv_weights<false>(a, mask, mo, b, h, bh, j0, i0, ls[buf], dls[buf], st, dpt);
        m16_accumulate(st, gs[buf], gv);
        m16_accumulate(dpt, qs[buf], gk);
        // Every warp is done with this buffer before the next iteration refills it.
        __syncthreads();
    }
    tc_store_rows(gk, dk, dko, b, h, j0, a.tk, a.d, a.scale);
    tc_store_rows(gv, dv, dvo, b, h, j0, a.tk, a.dv, 1.0f);
}

// dq: a warp's 16 query rows (q and dout as A fragments, dq in registers) against key tiles
// of 64 (k, v): S and dP on the tensor cores, dS in registers, dq += dS k.
template <typename In>
__device__ __forceinline__ void attention_bwd_q_m16_body(const In* __restrict__ q, Op4 qo, const In* __restrict__ k,
                                                         Op4 ko, const In* __restrict__ v, Op4 vo,
                                                         const float* __restrict__ mask, Op4 mo,
                                                         const float* __restrict__ lse, Op4 lo,
                                                         const In* __restrict__ dout, Op4 go,
                                                         const float* __restrict__ delta, In* __restrict__ dq,
                                                         Op4 dqo, AttnArgs a) {
    constexpr int BN = 64;
    __shared__ __align__(16) In ks[2][BN][M16_LD];
    __shared__ __align__(16) In vs[2][BN][M16_LD];
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int blk0 = (gridDim.y - 1 - blockIdx.y) * 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
    const int i0 = blk0 + warp * 16;
    u32 qa[4][4], ga[4][4];
    m16_rows_a(q, qo, b, h, i0, a.tq, a.d, qa);
    m16_rows_a(dout, go, b, h, i0, a.tq, a.dv, ga);
    float li[2], di[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = i0 + g + r * 8;
        li[r] = i < a.tq ? lse[at(lo, b, h, i, 0)] : -INFINITY;
        di[r] = i < a.tq ? delta[(i64)bh * a.tq + i] : 0.0f;
    }
    float gq[8][4];
    m16_zero(gq);
    tc_for_key_tiles(k, ko, v, vo, a, b, h, blk0, ks, vs, [&](int j0, int buf) {
        float s[8][4], dp[8][4];
        m16_times_rows(qa, ks[buf], s);
        m16_times_rows(ga, vs[buf], dp);
        m16_scores(a, mask, mo, b, h, i0, j0, s);
        if (a.dropout_on) m16_q_grads<true>(a, bh, i0, j0, li, di, s, dp);
        else m16_q_grads<false>(a, bh, i0, j0, li, di, s, dp);
        m16_accumulate(dp, ks[buf], gq);
    });
    tc_store_rows(gq, dq, dqo, b, h, i0, a.tq, a.d, a.scale);
}

// The 16-bit kernels (attention_tc.cuh's TC_KERNELS: the same names and launch bounds as the
// f32 ones, with the type's suffix).
TC_KERNELS(bf16_t, _bf16, attention_fwd_m16_body, attention_bwd_kv_m16_body, attention_bwd_q_m16_body)
TC_KERNELS(f16_t, _f16, attention_fwd_m16_body, attention_bwd_kv_m16_body, attention_bwd_q_m16_body)
