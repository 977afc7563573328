// hal::attention: scaled dot-product attention, fused (flash attention's plan: tiles of keys
// in shared memory, an online softmax, nothing tq x tk in memory; the backward pass recomputes
// the weights from the row log-sum-exps). One thread owns one query row (forward, dq) or one
// key row (dk, dv), so every sum runs in a fixed order: deterministic, no atomics.
//
// Each kernel is a template over the element type T (float or double) and DMAX, the widest
// row it holds (f32: 32, 64 or 128; f64: 64; narrower rows are zero-padded in registers and
// shared memory).
// Tile sizes follow the row's bytes so every block's static shared memory stays near 33 KiB.
#include "common.cuh"

// A rank-4 operand [b, h, t, c]: its element offset and strides (in elements).
struct Op4 {
    i64 off, sb, sh, st, sc;
};

// What every pass reads besides the operands.
struct AttnArgs {
    int heads, tq, tk, d, dv, causal, has_mask, dropout_on;
    float scale, keep_scale;
    u32 seed_lo, seed_hi, threshold, pad_;
    u64 offset;
};

__device__ __forceinline__ i64 at(const Op4& o, int b, int h, i64 t, i64 c) {
    return o.off + b * o.sb + h * o.sh + t * o.st + c * o.sc;
}

// The dropout factor of weight (bh, i, j): keep_scale where hal::attention::keeps, else 0.
// Out of line: the forward pass's unrolled chunks would otherwise hold sixteen Philox copies.
template <typename T>
__device__ __noinline__ T drop_philox(const AttnArgs& a, int bh, int i, int j) {
    u64 idx = a.offset + ((u64)bh * a.tq + i) * a.tk + j;
    u32 c[4] = {(u32)idx, (u32)(idx >> 32), 0u, 0u};
    philox(c, a.seed_lo, a.seed_hi);
    return (c[0] >> 8) >= a.threshold ? (T)a.keep_scale : (T)0;
}

template <typename T>
__device__ __forceinline__ T drop_factor(const AttnArgs& a, int bh, int i, int j) {
    return a.dropout_on ? drop_philox<T>(a, bh, i, j) : (T)1;
}

// Score (i, j) from a raw dot product: scaled, masked, causal.
template <typename T>
__device__ __forceinline__ T score(const AttnArgs& a, const T* mask, const Op4& mo, int b, int h, int i, int j,
                                   T dot) {
    if (a.causal && j > i) return -INFINITY;
    T s = (T)a.scale * dot;
    if (a.has_mask) s += mask[at(mo, b, h, i, j)];
    return s;
}

template <typename T> __device__ __forceinline__ T exp_t(T x);
template <> __device__ __forceinline__ float exp_t<float>(float x) { return __expf(x); }
template <> __device__ __forceinline__ double exp_t<double>(double x) { return exp(x); }

// Forward: a block of 64 threads owns 64 query rows of one batch-head; key/value tiles of
// BC rows stream through shared memory. Scores are taken 16 keys at a time so the running
// maximum rescales the accumulator once per chunk.
template <typename T, int DMAX>
__device__ void attention_fwd(const T* __restrict__ q, Op4 qo, const T* __restrict__ k, Op4 ko,
                              const T* __restrict__ v, Op4 vo, const T* __restrict__ mask, Op4 mo,
                              T* __restrict__ out, Op4 oo, T* __restrict__ lse, Op4 lo, AttnArgs a) {
    constexpr int BR = 64;
    constexpr int BC = 16384 / (int)(sizeof(T) * DMAX);
    constexpr int CH = 16;
    __shared__ T ks[BC][DMAX];
    __shared__ T vs[BC][DMAX];
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int tile = gridDim.y - 1 - blockIdx.y;  // the longest causal rows first
    const int i0 = tile * BR, i = i0 + threadIdx.x;
    const bool live = i < a.tq;
    T qr[DMAX], acc[DMAX];
#pragma unroll
    for (int c = 0; c < DMAX; ++c) {
        qr[c] = (live && c < a.d) ? q[at(qo, b, h, i, c)] : (T)0;
        acc[c] = (T)0;
    }
    T m = -INFINITY, l = (T)0;
    int kend = a.tk;
    if (a.causal) kend = min(kend, i0 + BR);
    for (int j0 = 0; j0 < kend; j0 += BC) {
        __syncthreads();
        for (int e = threadIdx.x; e < BC * DMAX; e += BR) {
            int r = e / DMAX, c = e % DMAX, j = j0 + r;
            ks[r][c] = (j < a.tk && c < a.d) ? k[at(ko, b, h, j, c)] : (T)0;
            vs[r][c] = (j < a.tk && c < a.dv) ? v[at(vo, b, h, j, c)] : (T)0;
        }
        __syncthreads();
        if (!live) continue;
        for (int jc = 0; jc < BC && j0 + jc < kend; jc += CH) {
            T s[CH];
            T cmax = -INFINITY;
#pragma unroll
            for (int u = 0; u < CH; ++u) {
                int j = j0 + jc + u;
                if (jc + u < BC && j < a.tk) {
                    T dot = (T)0;
#pragma unroll
                    for (int c = 0; c < DMAX; ++c) dot = fma(qr[c], ks[jc + u][c], dot);
                    s[u] = score<T>(a, mask, mo, b, h, i, j, dot);
                } else {
                    s[u] = -INFINITY;
                }
                cmax = fmax(cmax, s[u]);
            }
            if (cmax == -INFINITY) continue;
            if (cmax > m) {
                T corr = exp_t<T>(m - cmax);
                l *= corr;
#pragma unroll
                for (int c = 0; c < DMAX; ++c) acc[c] *= corr;
                m = cmax;
            }
#pragma unroll
            for (int u = 0; u < CH; ++u) {
                if (s[u] == -INFINITY) continue;
                T p = exp_t<T>(s[u] - m);
                l += p;
                T w = p * drop_factor<T>(a, bh, i, j0 + jc + u);
#pragma unroll
                for (int c = 0; c < DMAX; ++c) acc[c] = fma(w, vs[jc + u][c], acc[c]);
            }
        }
    }
    if (!live) return;
    T inv = l > (T)0 ? (T)1 / l : (T)0;
#pragma unroll
    for (int c = 0; c < DMAX; ++c)
        if (c < a.dv) out[at(oo, b, h, i, c)] = acc[c] * inv;
    lse[at(lo, b, h, i, 0)] = l > (T)0 ? m + log(l) : (T)(-INFINITY);
}

// delta_i = dout_i . out_i, read straight from global memory.
template <typename T>
__device__ __forceinline__ T row_delta(const T* dout, Op4 go, const T* out, Op4 oo, int b, int h, int i, int dv) {
    T s = (T)0;
    for (int c = 0; c < dv; ++c) s = fma(dout[at(go, b, h, i, c)], out[at(oo, b, h, i, c)], s);
    return s;
}

// The weight (i, j) recomputed: exp(s - lse_i), 0 where masked or lse_i = -inf.
template <typename T>
__device__ __forceinline__ T recompute(T s, T l) {
    return (s == -INFINITY || l == -INFINITY) ? (T)0 : exp_t<T>(s - l);
}

// dk, dv: a block owns BK key rows (one per thread, kept in padded shared rows so each
// thread's reads hit distinct banks); tiles of BQ query rows (q, dout, lse, delta) stream
// through shared memory, read by every thread at once.
template <typename T, int DMAX>
__device__ void attention_bwd_kv(const T* __restrict__ q, Op4 qo, const T* __restrict__ k, Op4 ko,
                                 const T* __restrict__ v, Op4 vo, const T* __restrict__ mask, Op4 mo,
                                 const T* __restrict__ out, Op4 oo, const T* __restrict__ lse, Op4 lo,
                                 const T* __restrict__ dout, Op4 go, T* __restrict__ dk, Op4 dko,
                                 T* __restrict__ dv, Op4 dvo, AttnArgs a) {
    constexpr int ROWB = (int)sizeof(T) * DMAX;
    constexpr int BK = 16384 / ROWB < 64 ? 16384 / ROWB : 64;
    constexpr int BQ = 4096 / ROWB;
    __shared__ T kp[BK][DMAX + 1];
    __shared__ T vp[BK][DMAX + 1];
    __shared__ T qs[BQ][DMAX];
    __shared__ T gs[BQ][DMAX];
    __shared__ T ls[BQ], ds_[BQ];
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int j0 = (gridDim.y - 1 - blockIdx.y) * BK, t = threadIdx.x, j = j0 + t;
    const bool live = j < a.tk;
    for (int c = 0; c < DMAX; ++c) {
        kp[t][c] = (live && c < a.d) ? k[at(ko, b, h, j, c)] : (T)0;
        vp[t][c] = (live && c < a.dv) ? v[at(vo, b, h, j, c)] : (T)0;
    }
    T gk[DMAX], gv[DMAX];
#pragma unroll
    for (int c = 0; c < DMAX; ++c) gk[c] = gv[c] = (T)0;
    const int istart = a.causal ? (j0 / BQ) * BQ : 0;
    for (int i0 = istart; i0 < a.tq; i0 += BQ) {
        __syncthreads();
        for (int e = t; e < BQ * DMAX; e += BK) {
            int r = e / DMAX, c = e % DMAX, i = i0 + r;
            qs[r][c] = (i < a.tq && c < a.d) ? q[at(qo, b, h, i, c)] : (T)0;
            gs[r][c] = (i < a.tq && c < a.dv) ? dout[at(go, b, h, i, c)] : (T)0;
        }
        for (int r = t; r < BQ; r += BK) {
            int i = i0 + r;
            ls[r] = i < a.tq ? lse[at(lo, b, h, i, 0)] : (T)(-INFINITY);
            ds_[r] = i < a.tq ? row_delta<T>(dout, go, out, oo, b, h, i, a.dv) : (T)0;
        }
        __syncthreads();
        if (!live) continue;
        for (int r = 0; r < BQ && i0 + r < a.tq; ++r) {
            int i = i0 + r;
            if (a.causal && j > i) continue;
            T dot = (T)0;
#pragma unroll
            for (int c = 0; c < DMAX; ++c) dot = fma(qs[r][c], kp[t][c], dot);
            T p = recompute<T>(score<T>(a, mask, mo, b, h, i, j, dot), ls[r]);
            if (p == (T)0) continue;
            T z = drop_factor<T>(a, bh, i, j);
            T dp = (T)0;
#pragma unroll
            for (int c = 0; c < DMAX; ++c) dp = fma(gs[r][c], vp[t][c], dp);
            T ds = (T)a.scale * (p * (z * dp - ds_[r]));
            T pz = p * z;
#pragma unroll
            for (int c = 0; c < DMAX; ++c) {
                gv[c] = fma(pz, gs[r][c], gv[c]);
                gk[c] = fma(ds, qs[r][c], gk[c]);
            }
        }
    }
    if (!live) return;
#pragma unroll
    for (int c = 0; c < DMAX; ++c) {
        if (c < a.d) dk[at(dko, b, h, j, c)] = gk[c];
        if (c < a.dv) dv[at(dvo, b, h, j, c)] = gv[c];
    }
}

// dq: a block owns BQ query rows (q and dout in padded shared rows, one per thread); tiles of
// BK key rows (k, v) stream through shared memory.
template <typename T, int DMAX>
__device__ void attention_bwd_q(const T* __restrict__ q, Op4 qo, const T* __restrict__ k, Op4 ko,
                                const T* __restrict__ v, Op4 vo, const T* __restrict__ mask, Op4 mo,
                                const T* __restrict__ out, Op4 oo, const T* __restrict__ lse, Op4 lo,
                                const T* __restrict__ dout, Op4 go, T* __restrict__ dq, Op4 dqo, AttnArgs a) {
    constexpr int ROWB = (int)sizeof(T) * DMAX;
    constexpr int BQ = 16384 / ROWB < 64 ? 16384 / ROWB : 64;
    constexpr int BK = 4096 / ROWB;
    __shared__ T qp[BQ][DMAX + 1];
    __shared__ T gp[BQ][DMAX + 1];
    __shared__ T ks[BK][DMAX];
    __shared__ T vs[BK][DMAX];
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int i0 = (gridDim.y - 1 - blockIdx.y) * BQ, t = threadIdx.x, i = i0 + t;
    const bool live = i < a.tq;
    for (int c = 0; c < DMAX; ++c) {
        qp[t][c] = (live && c < a.d) ? q[at(qo, b, h, i, c)] : (T)0;
        gp[t][c] = (live && c < a.dv) ? dout[at(go, b, h, i, c)] : (T)0;
    }
    const T li = live ? lse[at(lo, b, h, i, 0)] : (T)(-INFINITY);
    const T delta = live ? row_delta<T>(dout, go, out, oo, b, h, i, a.dv) : (T)0;
    T gq[DMAX];
#pragma unroll
    for (int c = 0; c < DMAX; ++c) gq[c] = (T)0;
    int kend = a.tk;
    if (a.causal) kend = min(kend, i0 + BQ);
    for (int j0 = 0; j0 < kend; j0 += BK) {
        __syncthreads();
        for (int e = t; e < BK * DMAX; e += BQ) {
            int r = e / DMAX, c = e % DMAX, j = j0 + r;
            ks[r][c] = (j < a.tk && c < a.d) ? k[at(ko, b, h, j, c)] : (T)0;
            vs[r][c] = (j < a.tk && c < a.dv) ? v[at(vo, b, h, j, c)] : (T)0;
        }
        __syncthreads();
        if (!live || li == -INFINITY) continue;
        for (int r = 0; r < BK && j0 + r < kend; ++r) {
            int j = j0 + r;
            if (a.causal && j > i) break;
            T dot = (T)0;
#pragma unroll
            for (int c = 0; c < DMAX; ++c) dot = fma(qp[t][c], ks[r][c], dot);
            T p = recompute<T>(score<T>(a, mask, mo, b, h, i, j, dot), li);
            if (p == (T)0) continue;
            T z = drop_factor<T>(a, bh, i, j);
            T dp = (T)0;
#pragma unroll
            for (int c = 0; c < DMAX; ++c) dp = fma(gp[t][c], vs[r][c], dp);
            T ds = (T)a.scale * (p * (z * dp - delta));
#pragma unroll
            for (int c = 0; c < DMAX; ++c) gq[c] = fma(ds, ks[r][c], gq[c]);
        }
    }
    if (!live) return;
#pragma unroll
    for (int c = 0; c < DMAX; ++c)
        if (c < a.d) dq[at(dqo, b, h, i, c)] = gq[c];
}

#include "attention_tc.cuh"
#include "attention_mma16.cuh"

#define ATTENTION_KERNELS(T, NAME, DMAX)                                                                          \
    extern "C" __global__ void __launch_bounds__(64) attention_fwd_##NAME##_##DMAX(                              \
        const T* q, Op4 qo, const T* k, Op4 ko, const T* v, Op4 vo, const T* mask, Op4 mo, T* out, Op4 oo,        \
        T* lse, Op4 lo, AttnArgs a) {                                                                             \
        attention_fwd<T, DMAX>(q, qo, k, ko, v, vo, mask, mo, out, oo, lse, lo, a);                              \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(64) attention_bwd_kv_##NAME##_##DMAX(                           \
        const T* q, Op4 qo, const T* k, Op4 ko, const T* v, Op4 vo, const T* mask, Op4 mo, const T* out, Op4 oo,  \
        const T* lse, Op4 lo, const T* dout, Op4 go, T* dk, Op4 dko, T* dv, Op4 dvo, AttnArgs a) {                \
        attention_bwd_kv<T, DMAX>(q, qo, k, ko, v, vo, mask, mo, out, oo, lse, lo, dout, go, dk, dko, dv, dvo, a); \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(64) attention_bwd_q_##NAME##_##DMAX(                            \
        const T* q, Op4 qo, const T* k, Op4 ko, const T* v, Op4 vo, const T* mask, Op4 mo, const T* out, Op4 oo,  \
        const T* lse, Op4 lo, const T* dout, Op4 go, T* dq, Op4 dqo, AttnArgs a) {                               \
        attention_bwd_q<T, DMAX>(q, qo, k, ko, v, vo, mask, mo, out, oo, lse, lo, dout, go, dq, dqo, a);         \
    }

ATTENTION_KERNELS(float, f32, 32)
ATTENTION_KERNELS(float, f32, 64)
ATTENTION_KERNELS(float, f32, 128)
ATTENTION_KERNELS(double, f64, 64)
