// Matrix products cuBLAS does not serve well: small products, a thread or a warp per output,
// and the CSR mat-vec with its structure check (which writes the fault record and a verdict the
// mat-vec reads, as the index checks do).
#include "common.cuh"

// A small matrix product, out[b,i,j] = alpha * sum_k a[b,i,k] * bm[b,k,j] (+ beta * out[b,i,j]
// where beta is not 0), for products too small to fill the device through cuBLAS, whose
// set-up costs many times the work of, say, a 10 x 128 weight gradient over k = 256 (docs/
// PERF.md, tuning evidence). Every operand is strided (batch, row, column strides; a batch stride of 0
// broadcasts). Sums run in a fixed order: deterministic.
struct SmallMat {
    i64 off, sb, sr, sc;
};

__device__ __forceinline__ float small_gemm_dot(const void* a, int adt, SmallMat am, const void* b, int bdt, SmallMat bm,
                                                i64 bi, i64 i, i64 j, i64 k0, i64 k, i64 step) {
    const i64 ab = am.off + bi * am.sb + i * am.sr;
    const i64 bb = bm.off + bi * bm.sb + j * bm.sc;
    float acc = 0.0f;
    i64 q = k0;
    for (; q + 3 * step < k; q += 4 * step) {
        float x[4], y[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            x[u] = load_f(a, adt, ab + (q + u * step) * am.sc);
            y[u] = load_f(b, bdt, bb + (q + u * step) * bm.sr);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) acc = fmaf(x[u], y[u], acc);
    }
    for (; q < k; q += step) acc = fmaf(load_f(a, adt, ab + q * am.sc), load_f(b, bdt, bb + q * bm.sr), acc);
    return acc;
}

__device__ __forceinline__ void small_gemm_store(void* out, int odt, SmallMat om, i64 bi, i64 i, i64 j, float acc,
                                                 float alpha, float beta) {
    const i64 o = om.off + bi * om.sb + i * om.sr + j * om.sc;
    float v = alpha * acc;
    if (beta != 0.0f) v = fmaf(beta, load_f(out, odt, o), v);
    store_f(out, odt, o, v);
}

// One thread per output element (short k).
extern "C" __global__ void small_gemm_thread(i64 batch, i64 m, i64 n, i64 k, const void* a, int adt, SmallMat am,
                                             const void* b, int bdt, SmallMat bm, void* out, int odt, SmallMat om,
                                             float alpha, float beta) {
    GRID_STRIDE(e, batch * m * n) {
        const i64 j = e % n, i = (e / n) % m, bi = e / (n * m);
        const float acc = small_gemm_dot(a, adt, am, b, bdt, bm, bi, i, j, 0, k, 1);
        small_gemm_store(out, odt, om, bi, i, j, acc, alpha, beta);
    }
}

// One warp per output element: the lanes split k, then add their sums in a fixed tree.
extern "C" __global__ void small_gemm_warp(i64 batch, i64 m, i64 n, i64 k, const void* a, int adt, SmallMat am,
                                           const void* b, int bdt, SmallMat bm, void* out, int odt, SmallMat om,
                                           float alpha, float beta) {
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x / 32);
    for (i64 e = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; e < batch * m * n; e += warps) {
        const i64 j = e % n, i = (e / n) % m, bi = e / (n * m);
        float acc = small_gemm_dot(a, adt, am, b, bdt, bm, bi, i, j, lane, k, 32);
        for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
        if (lane == 0) small_gemm_store(out, odt, om, bi, i, j, acc, alpha, beta);
    }
}

// CSR structure: offsets start at 0, never decrease, end at nnz; columns below ncols.
extern "C" __global__ void check_csr(const u32* offsets, i64 rows, const u32* cols, i64 nnz, i64 ncols, u32 op_offsets,
                                     u32 op_cols, u32* fault, u32* verdict) {
    GRID_STRIDE(i, rows + 1) {
        u32 o = offsets[i];
        bool bad = (i == 0 && o != 0u) || (i > 0 && o < offsets[i - 1]) || (i64)o > nnz || (i == rows && (i64)o != nnz);
        if (bad) {
            report_fault(fault, o, nnz, op_offsets);
            atomicOr(verdict, 1u);
        }
    }
    GRID_STRIDE(k, nnz) {
        if ((i64)cols[k] >= ncols) {
            report_fault(fault, cols[k], ncols, op_cols);
            atomicOr(verdict, 1u);
        }
    }
}

// y = alpha A x + beta y, one warp per row (beta == 0 ignores y's old value).
extern "C" __global__ void spmv_kernel(i64 rows, const u32* offsets, const u32* cols, const float* vals, const float* x,
                                       float* y, float alpha, float beta, const u32* verdict) {
    if (*verdict) return;
    i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
    for (i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
        float acc = 0.0f;
        for (u32 k = offsets[r] + (threadIdx.x & 31); k < offsets[r + 1]; k += 32) acc = fmaf(vals[k], x[cols[k]], acc);
        acc = warp_sum(acc);
        if ((threadIdx.x & 31) == 0) y[r] = beta == 0.0f ? alpha * acc : fmaf(beta, y[r], alpha * acc);
    }
}

// spmv_kernel in f64: f64 values, x and y; one warp per row, products fused and the warp's
// partial sums combined in double.
extern "C" __global__ void spmv_wide_kernel(i64 rows, const u32* offsets, const u32* cols, const double* vals,
                                            const double* x, double* y, float alpha, float beta, const u32* verdict) {
    if (*verdict) return;
    i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
    for (i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
        double acc = 0.0;
        for (u32 k = offsets[r] + (threadIdx.x & 31); k < offsets[r + 1]; k += 32) acc = fma(vals[k], x[cols[k]], acc);
        for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
        if ((threadIdx.x & 31) == 0) y[r] = beta == 0.0f ? (double)alpha * acc : fma((double)beta, y[r], (double)alpha * acc);
    }
}
