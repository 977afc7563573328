// hal::layer_norm: a warp per row for the statistics, the output and dx (the row read twice
// forward, both sums in one pass backward); the parameter gradients sum rows per column in
// fixed chunks, then the chunks in a fixed order (a warp a column), so every result is
// deterministic. Templates over float and double; for f32 rows of at most 1,024 columns, one
// kernel computes dx and the chunks' partials together.
#include "common.cuh"

// A rank-2 operand [rows, n] (or rank 1, s1 unused): its element offset and strides.
struct Op2 {
    i64 off, s0, s1;
};

template <typename T>
__device__ __forceinline__ T warp_total(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
__device__ __forceinline__ T rsqrt_t(T v);
template <>
__device__ __forceinline__ float rsqrt_t<float>(float v) { return 1.0f / sqrtf(v); }
template <>
__device__ __forceinline__ double rsqrt_t<double>(double v) { return 1.0 / sqrt(v); }

template <typename T>
__device__ void layer_norm_fwd(const T* __restrict__ x, Op2 xo, const T* __restrict__ w, Op2 wo, int has_w,
                               const T* __restrict__ b, Op2 bo, int has_b, T* __restrict__ out, Op2 oo,
                               T* __restrict__ mean, Op2 mo, T* __restrict__ rstd, Op2 ro, i64 rows, i64 n,
                               float eps) {
    const i64 r = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const T* xr = x + xo.off + r * xo.s0;
    T s = (T)0;
    for (i64 c = lane; c < n; c += 32) s += xr[c * xo.s1];
    const T m = warp_total(s) / (T)n;
    T q = (T)0;
    for (i64 c = lane; c < n; c += 32) {
        T d = xr[c * xo.s1] - m;
        q = fma(d, d, q);
    }
    const T rs = rsqrt_t<T>(warp_total(q) / (T)n + (T)eps);
    for (i64 c = lane; c < n; c += 32) {
        T y = (xr[c * xo.s1] - m) * rs;
        if (has_w) y *= w[wo.off + c * wo.s0];
        if (has_b) y += b[bo.off + c * bo.s0];
        out[oo.off + r * oo.s0 + c * oo.s1] = y;
    }
    if (lane == 0) {
        mean[mo.off + r * mo.s0] = m;
        rstd[ro.off + r * ro.s0] = rs;
    }
}

template <typename T>
__device__ void layer_norm_bwd_dx(const T* __restrict__ x, Op2 xo, const T* __restrict__ w, Op2 wo, int has_w,
                                  const T* __restrict__ mean, Op2 mo, const T* __restrict__ rstd, Op2 ro,
                                  const T* __restrict__ g, Op2 go, T* __restrict__ dx, Op2 dxo, i64 rows, i64 n) {
    const i64 r = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const T m = mean[mo.off + r * mo.s0], rs = rstd[ro.off + r * ro.s0];
    const T* xr = x + xo.off + r * xo.s0;
    const T* gr = g + go.off + r * go.s0;
    T a = (T)0, bs = (T)0;
    for (i64 c = lane; c < n; c += 32) {
        T gw = gr[c * go.s1] * (has_w ? w[wo.off + c * wo.s0] : (T)1);
        a += gw;
        bs = fma(gw, (xr[c * xo.s1] - m) * rs, bs);
    }
    a = warp_total(a) / (T)n;
    bs = warp_total(bs) / (T)n;
    for (i64 c = lane; c < n; c += 32) {
        T gw = gr[c * go.s1] * (has_w ? w[wo.off + c * wo.s0] : (T)1);
        dx[dxo.off + r * dxo.s0 + c * dxo.s1] = rs * (gw - a - (xr[c * xo.s1] - m) * rs * bs);
    }
}

// Per chunk of `per` rows and per column: sum g xhat and sum g, in row order, into
// partials[chunk, n] (two arrays).
template <typename T>
__device__ void layer_norm_bwd_partial(const T* __restrict__ x, Op2 xo, const T* __restrict__ mean, Op2 mo,
                                       const T* __restrict__ rstd, Op2 ro, const T* __restrict__ g, Op2 go,
                                       T* __restrict__ pw, T* __restrict__ pb, i64 rows, i64 n, i64 per) {
    const i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 chunk = blockIdx.y;
    if (c >= n) return;
    T sw = (T)0, sb = (T)0;
    const i64 end = min(rows, (chunk + 1) * per);
    for (i64 r = chunk * per; r < end; ++r) {
        T gv = g[go.off + r * go.s0 + c * go.s1];
        T xh = (x[xo.off + r * xo.s0 + c * xo.s1] - mean[mo.off + r * mo.s0]) * rstd[ro.off + r * ro.s0];
        sw = fma(gv, xh, sw);
        sb += gv;
    }
    pw[chunk * n + c] = sw;
    pb[chunk * n + c] = sb;
}

// The chunks' partials summed per column into dweight and dbias (where wanted): a warp a
// column, lane l adding chunks l, l + 32, ... in order, then the lanes' sums in a fixed tree.
template <typename T>
__device__ void layer_norm_bwd_params(const T* __restrict__ pw, const T* __restrict__ pb, i64 chunks, i64 n,
                                      T* __restrict__ dw, Op2 dwo, int want_w, T* __restrict__ db, Op2 dbo,
                                      int want_b) {
    const i64 c = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (c >= n) return;
    T sw = (T)0, sb = (T)0;
    for (i64 k = lane; k < chunks; k += 32) {
        sw += pw[k * n + c];
        sb += pb[k * n + c];
    }
    sw = warp_total(sw);
    sb = warp_total(sb);
    if (lane != 0) return;
    if (want_w) dw[dwo.off + c * dwo.s0] = sw;
    if (want_b) db[dbo.off + c * dbo.s0] = sb;
}

// dx and the parameter gradients' chunk partials in one pass, for f32 rows of at most
// 32 * PER unit-stride columns: block `chunk` takes rows chunk * per .. (chunk + 1) * per, a
// warp every eighth of them in order, each lane keeping its columns (lane, lane + 32, ...) of
// the row and of the running sums in registers; the warps' sums are then added in warp
// order. One read of x and g instead of two kernels' two (GPT-2's LayerNorm backward: 44 +
// 31 us a call on an H200). Deterministic: the order depends on the row count only.
template <int PER>
__device__ void layer_norm_bwd_fused(const float* __restrict__ x, Op2 xo, const float* __restrict__ w, Op2 wo,
                                     int has_w, const float* __restrict__ mean, Op2 mo,
                                     const float* __restrict__ rstd, Op2 ro, const float* __restrict__ g, Op2 go,
                                     float* __restrict__ dx, Op2 dxo, float* __restrict__ pw,
                                     float* __restrict__ pb, i64 rows, i64 n, i64 per) {
    __shared__ float sum_w[32 * PER], sum_b[32 * PER];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const i64 chunk = blockIdx.x, end = min(rows, (chunk + 1) * per);
    float wv[PER], sw[PER], sb[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const i64 c = lane + 32 * k;
        wv[k] = c < n && has_w ? w[wo.off + c * wo.s0] : 1.0f;
        sw[k] = 0.0f;
        sb[k] = 0.0f;
    }
    for (i64 r = chunk * per + warp; r < end; r += warps) {
        const float m = mean[mo.off + r * mo.s0], rs = rstd[ro.off + r * ro.s0];
        const float* xr = x + xo.off + r * xo.s0;
        const float* gr = g + go.off + r * go.s0;
        float xh[PER], gv[PER];
        float a = 0.0f, bs = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const i64 c = lane + 32 * k;
            const bool in = c < n;
            xh[k] = in ? (xr[c] - m) * rs : 0.0f;
            gv[k] = in ? gr[c] : 0.0f;
            const float gw = gv[k] * wv[k];
            a += gw;
            bs = fmaf(gw, xh[k], bs);
            sw[k] = fmaf(gv[k], xh[k], sw[k]);
            sb[k] += gv[k];
        }
        a = warp_total(a) / (float)n;
        bs = warp_total(bs) / (float)n;
        float* dr = dx + dxo.off + r * dxo.s0;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const i64 c = lane + 32 * k;
            if (c < n) dr[c] = rs * (gv[k] * wv[k] - a - xh[k] * bs);
        }
    }
    for (int v = 0; v < warps; ++v) {
        if (warp == v) {
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                const int c = lane + 32 * k;
                sum_w[c] = v == 0 ? sw[k] : sum_w[c] + sw[k];
                sum_b[c] = v == 0 ? sb[k] : sum_b[c] + sb[k];
            }
        }
        __syncthreads();
    }
    for (i64 c = threadIdx.x; c < n; c += blockDim.x) {
        pw[chunk * n + c] = sum_w[c];
        pb[chunk * n + c] = sum_b[c];
    }
}

#define FUSED_NORM_KERNEL(PER)                                                                                    \
    extern "C" __global__ void layer_norm_bwd_fused_f32_##PER(                                                  \
        const float* x, Op2 xo, const float* w, Op2 wo, int has_w, const float* mean, Op2 mo, const float* rstd, \
        Op2 ro, const float* g, Op2 go, float* dx, Op2 dxo, float* pw, float* pb, i64 rows, i64 n, i64 per) {    \
        layer_norm_bwd_fused<PER>(x, xo, w, wo, has_w, mean, mo, rstd, ro, g, go, dx, dxo, pw, pb, rows, n, per); \
    }
FUSED_NORM_KERNEL(4)
FUSED_NORM_KERNEL(8)
FUSED_NORM_KERNEL(12)
FUSED_NORM_KERNEL(16)
FUSED_NORM_KERNEL(24)
FUSED_NORM_KERNEL(32)

#define NORM_KERNELS(T, NAME)                                                                                       \
    extern "C" __global__ void layer_norm_fwd_##NAME(const T* x, Op2 xo, const T* w, Op2 wo, int has_w, const T* b, \
                                                     Op2 bo, int has_b, T* out, Op2 oo, T* mean, Op2 mo, T* rstd,   \
                                                     Op2 ro, i64 rows, i64 n, float eps) {                          \
        layer_norm_fwd<T>(x, xo, w, wo, has_w, b, bo, has_b, out, oo, mean, mo, rstd, ro, rows, n, eps);            \
    }                                                                                                               \
    extern "C" __global__ void layer_norm_bwd_dx_##NAME(const T* x, Op2 xo, const T* w, Op2 wo, int has_w,         \
                                                        const T* mean, Op2 mo, const T* rstd, Op2 ro, const T* g,   \
                                                        Op2 go, T* dx, Op2 dxo, i64 rows, i64 n) {                  \
        layer_norm_bwd_dx<T>(x, xo, w, wo, has_w, mean, mo, rstd, ro, g, go, dx, dxo, rows, n);                     \
    }                                                                                                               \
    extern "C" __global__ void layer_norm_bwd_partial_##NAME(const T* x, Op2 xo, const T* mean, Op2 mo,            \
                                                             const T* rstd, Op2 ro, const T* g, Op2 go, T* pw,      \
                                                             T* pb, i64 rows, i64 n, i64 per) {                     \
        layer_norm_bwd_partial<T>(x, xo, mean, mo, rstd, ro, g, go, pw, pb, rows, n, per);                          \
    }                                                                                                               \
    extern "C" __global__ void layer_norm_bwd_params_##NAME(const T* pw, const T* pb, i64 chunks, i64 n, T* dw,    \
                                                            Op2 dwo, int want_w, T* db, Op2 dbo, int want_b) {      \
        layer_norm_bwd_params<T>(pw, pb, chunks, n, dw, dwo, want_w, db, dbo, want_b);                              \
    }

NORM_KERNELS(float, f32)
NORM_KERNELS(double, f64)
