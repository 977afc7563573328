// Reductions: reduce (sum, mean, max, min) and arg_reduce over strided views, one warp or one
// block per output element.
#include "common.cuh"

// Combines two partial results of reduction `op` (0 sum, 1 mean, 2 max, 3 min); a NaN wins
// max and min.
__device__ __forceinline__ float reduce_combine(int op, float a, float b) {
    if (op <= 1) return a + b;
    if (is_nan_f(a) || is_nan_f(b)) return nan_f();
    return op == 2 ? fmaxf(a, b) : fminf(a, b);
}

// The starting value of reduction `op`: 0, or -inf for max and +inf for min.
__device__ __forceinline__ float reduce_identity(int op) {
    return op <= 1 ? 0.0f : (op == 2 ? -__int_as_float(0x7f800000) : __int_as_float(0x7f800000));
}

// Combines into `acc`, in order, the reduced elements j = first, first + step, ... below `end`
// of the output whose x offset is `base` (`red` walks them). Four loads are in flight at a
// time (one at a time, a block's reduction of 50,176 elements waited on each).
__device__ __forceinline__ float reduce_walked(const Walk& red, const void* x, int xdt, i64 base, i64 first, i64 end,
                                               i64 step, int op, float acc) {
    i64 j = first;
    for (; j + 3 * step < end; j += 4 * step) {
        i64 r[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) walk_offsets<1>(red, j + q * step, &r[q]);
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = load_f(x, xdt, base + r[q]);
#pragma unroll
        for (int q = 0; q < 4; ++q) acc = reduce_combine(op, acc, v[q]);
    }
    for (; j < end; j += step) {
        i64 r[1];
        walk_offsets<1>(red, j, r);
        acc = reduce_combine(op, acc, load_f(x, xdt, base + r[0]));
    }
    return acc;
}

// `kept` walks the outputs (operand 0 out, 1 x); `red` walks the reduced elements (operand 0 x).
template <int TPO>
__device__ void reduce_impl(const Walk& kept, const Walk& red, void* out, int odt, const void* x, int xdt, int op) {
    __shared__ float part[32];
    const int groups = blockDim.x / TPO;
    const int lane = threadIdx.x % TPO;
    for (i64 g0 = (i64)blockIdx.x * groups; g0 < kept.n; g0 += (i64)gridDim.x * groups) {
        i64 g = g0 + threadIdx.x / TPO;
        bool live = g < kept.n;
        i64 o[2] = {0, 0};
        if (live) walk_offsets<2>(kept, g, o);
        float acc = reduce_identity(op);
        if (live) {
            acc = reduce_walked(red, x, xdt, o[1], lane, red.n, TPO, op, acc);
        }
        for (int s = 16; s > 0; s >>= 1) acc = reduce_combine(op, acc, __shfl_xor_sync(0xffffffffu, acc, s));
        if (TPO > 32) {
            if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = acc;
            __syncthreads();
            if (threadIdx.x == 0) {
                for (int k = 1; k < TPO / 32; ++k) acc = reduce_combine(op, acc, part[k]);
            }
            __syncthreads();
        }
        if (live && lane == 0) {
            if (op == 1) acc = acc / (float)red.n;
            store_f(out, odt, o[0], acc);
        }
    }
}

// Pass 1 of a split reduction, for few outputs with long reductions: output g's reduced
// elements fall into `chunks` consecutive ranges, one block each, whose results go to
// partial[g * chunks + c] (f32). Mean partials are divided by the whole length here, so pass 2
// (reduce_warp over the partials) sums them.
extern "C" __global__ void reduce_partial(Walk kept, Walk red, float* partial, i64 chunks, const void* x, int xdt, int op) {
    __shared__ float part[32];
    for (i64 b = blockIdx.x; b < kept.n * chunks; b += gridDim.x) {
        i64 g = b / chunks, c = b % chunks;
        i64 o[2];
        walk_offsets<2>(kept, g, o);
        i64 lo = red.n * c / chunks, hi = red.n * (c + 1) / chunks;
        float acc = reduce_identity(op);
        if (red.rank == 1) {
            // The common case (one reduced axis) without a division per element.
            // Four loads issued before they are combined (in the same order as one at a time),
            // so a thread has several in flight.
            const i64 st = red.st[0][0], base = o[1] + red.off[0], step = blockDim.x;
            i64 j = lo + threadIdx.x;
            for (; j + 3 * step < hi; j += 4 * step) {
                const float v0 = load_f(x, xdt, base + j * st), v1 = load_f(x, xdt, base + (j + step) * st);
                const float v2 = load_f(x, xdt, base + (j + 2 * step) * st);
                const float v3 = load_f(x, xdt, base + (j + 3 * step) * st);
                acc = reduce_combine(op, reduce_combine(op, reduce_combine(op, reduce_combine(op, acc, v0), v1), v2), v3);
            }
            for (; j < hi; j += step) acc = reduce_combine(op, acc, load_f(x, xdt, base + j * st));
        } else {
            acc = reduce_walked(red, x, xdt, o[1], lo + threadIdx.x, hi, blockDim.x, op, acc);
        }
        for (int s = 16; s > 0; s >>= 1) acc = reduce_combine(op, acc, __shfl_xor_sync(0xffffffffu, acc, s));
        if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int k = 1; k < (int)(blockDim.x / 32); ++k) acc = reduce_combine(op, acc, part[k]);
            if (op == 1) acc = acc / (float)red.n;
            partial[b] = acc;
        }
        __syncthreads();
    }
}

// Column reductions: one reduced axis whose elements lie far apart in x while neighbouring
// outputs lie next to each other (a bias gradient, [rows, cols] summed over rows). A warp per
// output there reads one word per row, each from another line; here a block's 32 lanes of x
// are 32 neighbouring outputs, so each row's load is one line, and the block's 32 rows of
// threads each take every 32nd row, combined in shared memory in a fixed order.
#define COLUMN_W 32
#define COLUMN_H 32
extern "C" __global__ void __launch_bounds__(COLUMN_W * COLUMN_H)
    reduce_columns(Walk kept, Walk red, void* out, int odt, const void* x, int xdt, int op) {
    __shared__ float part[COLUMN_H][COLUMN_W + 1];
    const int tx = threadIdx.x % COLUMN_W, ty = threadIdx.x / COLUMN_W;
    for (i64 g0 = (i64)blockIdx.x * COLUMN_W; g0 < kept.n; g0 += (i64)gridDim.x * COLUMN_W) {
        const i64 g = g0 + tx;
        const bool live = g < kept.n;
        i64 o[2] = {0, 0};
        if (live) walk_offsets<2>(kept, g, o);
        float acc = reduce_identity(op);
        if (live) {
            const i64 st = red.st[0][0], base = o[1] + red.off[0];
            i64 j = ty;
            // Four rows' loads in flight, combined in row order.
            for (; j + 3 * COLUMN_H < red.n; j += 4 * COLUMN_H) {
                const float v0 = load_f(x, xdt, base + j * st), v1 = load_f(x, xdt, base + (j + COLUMN_H) * st);
                const float v2 = load_f(x, xdt, base + (j + 2 * COLUMN_H) * st);
                const float v3 = load_f(x, xdt, base + (j + 3 * COLUMN_H) * st);
                acc = reduce_combine(op, reduce_combine(op, reduce_combine(op, reduce_combine(op, acc, v0), v1), v2), v3);
            }
            for (; j < red.n; j += COLUMN_H) acc = reduce_combine(op, acc, load_f(x, xdt, base + j * st));
        }
        part[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && live) {
            float a = part[0][tx];
            for (int k = 1; k < COLUMN_H; ++k) a = reduce_combine(op, a, part[k][tx]);
            if (op == 1) a = a / (float)red.n;
            store_f(out, odt, o[0], a);
        }
        __syncthreads();
    }
}

extern "C" __global__ void reduce_warp(Walk kept, Walk red, void* out, int odt, const void* x, int xdt, int op) {
    reduce_impl<32>(kept, red, out, odt, x, xdt, op);
}
extern "C" __global__ void reduce_block(Walk kept, Walk red, void* out, int odt, const void* x, int xdt, int op) {
    reduce_impl<256>(kept, red, out, odt, x, xdt, op);
}
extern "C" __global__ void __launch_bounds__(1024)
    reduce_block_wide(Walk kept, Walk red, void* out, int odt, const void* x, int xdt, int op) {
    reduce_impl<1024>(kept, red, out, odt, x, xdt, op);
}

// True when (v, i) beats (bv, bi): a NaN is the extreme (the first NaN wins), ties go to the
// lower index.
__device__ __forceinline__ bool arg_better(bool is_max, float v, i64 i, float bv, i64 bi) {
    bool vn = is_nan_f(v), bn = is_nan_f(bv);
    if (vn || bn) return vn && (!bn || i < bi);
    if (v == bv) return i < bi;
    return is_max ? v > bv : v < bv;
}

// One warp per output; `len` elements along the axis at `stride`.
extern "C" __global__ void arg_reduce_kernel(Walk kept, i64 len, i64 stride, u32* out, const void* x, int xdt, int is_max) {
    i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
    int lane = threadIdx.x & 31;
    for (i64 g = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; g < kept.n; g += warps) {
        i64 o[2];
        walk_offsets<2>(kept, g, o);
        float best = 0.0f;
        i64 bi = -1;
        i64 j = lane;
        // Four loads in flight, then compared in order.
        for (; j + 96 < len; j += 128) {
            float v[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) v[q] = load_f(x, xdt, o[1] + (j + 32 * q) * stride);
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (bi < 0 || arg_better(is_max, v[q], j + 32 * q, best, bi)) { best = v[q]; bi = j + 32 * q; }
        }
        for (; j < len; j += 32) {
            float v = load_f(x, xdt, o[1] + j * stride);
            if (bi < 0 || arg_better(is_max, v, j, best, bi)) { best = v; bi = j; }
        }
        for (int s = 16; s > 0; s >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, s);
            i64 oi = __shfl_xor_sync(0xffffffffu, bi, s);
            if (oi >= 0 && (bi < 0 || arg_better(is_max, ov, oi, best, bi))) { best = ov; bi = oi; }
        }
        if (lane == 0) out[o[0]] = (u32)bi;
    }
}

// One thread per output, for short axes (a pooling window's argmax): a warp per output would
// leave all but a few lanes idle (the 1.6M windows of 4 of a LeNet pooling layer). Scanning in
// order keeps the rules: ties go to the lower index, the first NaN wins.
extern "C" __global__ void arg_reduce_short(Walk kept, i64 len, i64 stride, u32* out, const void* x, int xdt, int is_max) {
    GRID_STRIDE(g, kept.n) {
        i64 o[2];
        walk_offsets<2>(kept, g, o);
        float best = load_f(x, xdt, o[1]);
        i64 bi = 0;
        for (i64 j = 1; j < len; ++j) {
            const float v = load_f(x, xdt, o[1] + j * stride);
            if (arg_better(is_max, v, j, best, bi)) { best = v; bi = j; }
        }
        out[o[0]] = (u32)bi;
    }
}

// arg_better for f64 values.
__device__ __forceinline__ bool arg_better_d(bool is_max, double v, i64 i, double bv, i64 bi) {
    bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bi);
    if (v == bv) return i < bi;
    return is_max ? v > bv : v < bv;
}

// arg_reduce over f64 values: one warp per output, each lane the best of its strided share,
// then the warp's best (the same rules: ties to the lower index, the first NaN wins).
extern "C" __global__ void arg_reduce_wide(Walk kept, i64 len, i64 stride, u32* out, const double* x, int is_max) {
    i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
    int lane = threadIdx.x & 31;
    for (i64 g = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; g < kept.n; g += warps) {
        i64 o[2];
        walk_offsets<2>(kept, g, o);
        double best = 0.0;
        i64 bi = -1;
        for (i64 j = lane; j < len; j += 32) {
            double v = x[o[1] + j * stride];
            if (bi < 0 || arg_better_d(is_max, v, j, best, bi)) { best = v; bi = j; }
        }
        for (int s = 16; s > 0; s >>= 1) {
            double ov = __shfl_xor_sync(0xffffffffu, best, s);
            i64 oi = __shfl_xor_sync(0xffffffffu, bi, s);
            if (oi >= 0 && (bi < 0 || arg_better_d(is_max, ov, oi, best, bi))) { best = ov; bi = oi; }
        }
        if (lane == 0) out[o[0]] = (u32)bi;
    }
}

// (arg_reduce_kernel, arg_reduce_short, arg_reduce_block and arg_reduce_split share their loops by copy, not through device
// helpers: factored into helpers, nvcc compiled the segment kernels, then in this file,
// differently, and the sorted weighted segment sum of 100,000 x 768 ran half again as long.)
// One block per output, for few outputs along a long axis (a warp each would walk it with one
// load in flight). Each thread keeps the best of its
// strided share, four loads in flight; the block then combines them (the result does not
// depend on the order: ties go to the lower index, the first NaN wins).
#define ARG_BLOCK 1024
extern "C" __global__ void __launch_bounds__(ARG_BLOCK)
    arg_reduce_block(Walk kept, i64 len, i64 stride, u32* out, const void* x, int xdt, int is_max) {
    __shared__ float wbest[ARG_BLOCK / 32];
    __shared__ i64 windex[ARG_BLOCK / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (i64 g = blockIdx.x; g < kept.n; g += gridDim.x) {
        i64 o[2];
        walk_offsets<2>(kept, g, o);
        float best = 0.0f;
        i64 bi = -1;
        const i64 step = blockDim.x;
        i64 j = threadIdx.x;
        for (; j + 3 * step < len; j += 4 * step) {
            float v[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) v[q] = load_f(x, xdt, o[1] + (j + q * step) * stride);
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (bi < 0 || arg_better(is_max, v[q], j + q * step, best, bi)) { best = v[q]; bi = j + q * step; }
        }
        for (; j < len; j += step) {
            float v = load_f(x, xdt, o[1] + j * stride);
            if (bi < 0 || arg_better(is_max, v, j, best, bi)) { best = v; bi = j; }
        }
        for (int s = 16; s > 0; s >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, s);
            i64 oi = __shfl_xor_sync(0xffffffffu, bi, s);
            if (oi >= 0 && (bi < 0 || arg_better(is_max, ov, oi, best, bi))) { best = ov; bi = oi; }
        }
        if (lane == 0) { wbest[warp] = best; windex[warp] = bi; }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < (int)(blockDim.x / 32); ++w) {
                i64 oi = windex[w];
                if (oi >= 0 && (bi < 0 || arg_better(is_max, wbest[w], oi, best, bi))) { best = wbest[w]; bi = oi; }
            }
            out[o[0]] = (u32)bi;
        }
        __syncthreads();
    }
}

// One output along a long axis, split over the grid: block b keeps the best of its contiguous
// share (threads striding, four loads in flight) and writes it to part_v/part_i[b]; the block
// that finishes last (counted on `ticket`) combines the gridDim.x partials and writes the
// output, then resets the ticket. One launch, where a single block walked every key in turn
// (k-means++ asks for one such argmin per anchor). The result does not depend
// on the order (see arg_better).
#define ARG_SPLIT 256
extern "C" __global__ void __launch_bounds__(ARG_SPLIT)
    arg_reduce_split(Walk kept, i64 len, i64 stride, u32* out, const void* x, int xdt, int is_max, float* part_v,
                     i64* part_i, u32* ticket) {
    __shared__ float wbest[ARG_SPLIT / 32];
    __shared__ i64 windex[ARG_SPLIT / 32];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    i64 o[2];
    walk_offsets<2>(kept, 0, o);
    const i64 share = (len + gridDim.x - 1) / gridDim.x;
    const i64 lo = (i64)blockIdx.x * share, hi = min(len, lo + share);
    float best = 0.0f;
    i64 bi = -1;
    i64 j = lo + threadIdx.x;
    for (; j + 3 * ARG_SPLIT < hi; j += 4 * ARG_SPLIT) {
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = load_f(x, xdt, o[1] + (j + q * ARG_SPLIT) * stride);
#pragma unroll
        for (int q = 0; q < 4; ++q)
            if (bi < 0 || arg_better(is_max, v[q], j + q * ARG_SPLIT, best, bi)) { best = v[q]; bi = j + q * ARG_SPLIT; }
    }
    for (; j < hi; j += ARG_SPLIT) {
        float v = load_f(x, xdt, o[1] + j * stride);
        if (bi < 0 || arg_better(is_max, v, j, best, bi)) { best = v; bi = j; }
    }
    for (int s = 16; s > 0; s >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, s);
        i64 oi = __shfl_xor_sync(0xffffffffu, bi, s);
        if (oi >= 0 && (bi < 0 || arg_better(is_max, ov, oi, best, bi))) { best = ov; bi = oi; }
    }
    if (lane == 0) { wbest[warp] = best; windex[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARG_SPLIT / 32; ++w) {
            i64 oi = windex[w];
            if (oi >= 0 && (bi < 0 || arg_better(is_max, wbest[w], oi, best, bi))) { best = wbest[w]; bi = oi; }
        }
        part_v[blockIdx.x] = best;
        part_i[blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || warp != 0) return;
    // The last block: its first warp combines the partials (read past the L1, which may hold
    // none of them but must not serve stale ones).
    best = 0.0f;
    bi = -1;
    for (int b = lane; b < (int)gridDim.x; b += 32) {
        float v = __ldcg(part_v + b);
        i64 i = __ldcg(part_i + b);
        if (i >= 0 && (bi < 0 || arg_better(is_max, v, i, best, bi))) { best = v; bi = i; }
    }
    for (int s = 16; s > 0; s >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, s);
        i64 oi = __shfl_xor_sync(0xffffffffu, bi, s);
        if (oi >= 0 && (bi < 0 || arg_better(is_max, ov, oi, best, bi))) { best = ov; bi = oi; }
    }
    if (lane == 0) {
        out[o[0]] = (u32)bi;
        *ticket = 0;
    }
}

// f64 reductions (an f64 operand, DT_F64): doubles throughout. Block b takes output
// b / chunks and the c = b % chunks-th of its `chunks` consecutive ranges of reduced elements;
// with several chunks it writes its double to partial slot b of `out` (a second launch with
// one chunk reduces those), with one it stores the result, a mean divided by `count`.
__device__ __forceinline__ double reduce_combine_d(int op, double a, double b) {
    if (op <= 1) return a + b;
    if (a != a || b != b) return __longlong_as_double(0x7ff8000000000000ll);
    return op == 2 ? fmax(a, b) : fmin(a, b);
}
extern "C" __global__ void reduce_wide(Walk kept, Walk red, void* out, int odt, const void* x, int xdt, int op,
                                       i64 chunks, i64 count) {
    __shared__ double part[32];
    const double inf = __longlong_as_double(0x7ff0000000000000ll);
    for (i64 b = blockIdx.x; b < kept.n * chunks; b += gridDim.x) {
        i64 g = b / chunks, c = b % chunks;
        i64 o[2];
        walk_offsets<2>(kept, g, o);
        i64 lo = red.n * c / chunks, hi = red.n * (c + 1) / chunks;
        double acc = op <= 1 ? 0.0 : (op == 2 ? -inf : inf);
        if (red.rank == 1) {
            const i64 st = red.st[0][0], base = o[1] + red.off[0];
            for (i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) acc = reduce_combine_d(op, acc, load_d(x, xdt, base + j * st));
        } else {
            for (i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
                i64 r[1];
                walk_offsets<1>(red, j, r);
                acc = reduce_combine_d(op, acc, load_d(x, xdt, o[1] + r[0]));
            }
        }
        for (int s = 16; s > 0; s >>= 1) acc = reduce_combine_d(op, acc, __shfl_xor_sync(0xffffffffu, acc, s));
        if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int k = 1; k < (int)(blockDim.x / 32); ++k) acc = reduce_combine_d(op, acc, part[k]);
            if (chunks > 1) {
                ((double*)out)[b] = acc;
            } else {
                if (op == 1) acc = acc / (double)count;
                store_d(out, odt, o[0], acc);
            }
        }
        __syncthreads();
    }
}

// ReduceOp::LogSumExp along rows whose reduced elements are one contiguous run (the host
// checks: red.rank == 1, stride 1), for f32 and the 16-bit floats: a block per output, each
// thread keeping an online pair (m, s), s = sum exp(v - m) over its elements with m the
// largest finite one so far (rescaled when it grows). NaN and +inf elements only set flags
// (the result is then NaN, else +inf); -inf elements add nothing. Rows are read in 16-byte
// vectors where the row is aligned so, element by element otherwise.
struct LsePart {
    float m, s;
    int flags;  // 1: a NaN, 2: a +inf
};
__device__ __forceinline__ void lse_push(LsePart& p, float v) {
    const float inf = __int_as_float(0x7f800000);
    if (v != v) {
        p.flags |= 1;
    } else if (v == inf) {
        p.flags |= 2;
    } else if (v > p.m) {
        p.s = p.s * expf(p.m - v) + 1.0f;
        p.m = v;
    } else if (v > -inf) {
        p.s += expf(v - p.m);
    }
}
__device__ __forceinline__ LsePart lse_merge(LsePart a, LsePart b) {
    const float m = fmaxf(a.m, b.m);
    LsePart r;
    r.m = m;
    r.flags = a.flags | b.flags;
    r.s = m == -__int_as_float(0x7f800000) ? 0.0f : a.s * expf(a.m - m) + b.s * expf(b.m - m);
    return r;
}
// Element i of a row of dtype DT.
template <int DT> __device__ __forceinline__ float lse_load(const void* x, i64 i) {
    if (DT == DT_F32) return ((const float*)x)[i];
    const u32 h = ((const u16*)x)[i];
    return DT == DT_BF16 ? bf16_to_f32(h) : f16_widen(h);
}
// Pushes the elements of one 16-byte vector: their largest value first, so that the pair is
// rescaled at most once, then one exp per element. A vector holding a NaN or +inf takes the
// element-by-element path (which sets the flags).
template <int DT> __device__ __forceinline__ void lse_push_vector(LsePart& p, uint4 v) {
    constexpr int per = DT == DT_F32 ? 4 : 8;
    const u32 w[4] = {v.x, v.y, v.z, v.w};
    float e[per];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (DT == DT_F32) {
            e[k] = __uint_as_float(w[k]);
        } else if (DT == DT_BF16) {
            e[2 * k] = bf16_to_f32(w[k] & 0xffffu);
            e[2 * k + 1] = bf16_to_f32(w[k] >> 16);
        } else {
            e[2 * k] = f16_widen(w[k] & 0xffffu);
            e[2 * k + 1] = f16_widen(w[k] >> 16);
        }
    }
    const float inf = __int_as_float(0x7f800000);
    float top = e[0];
    bool odd = e[0] != e[0];
#pragma unroll
    for (int k = 1; k < per; ++k) {
        top = fmaxf(top, e[k]);
        odd |= e[k] != e[k];
    }
    if (odd || top == inf) {
#pragma unroll
        for (int k = 0; k < per; ++k) lse_push(p, e[k]);
        return;
    }
    const float m = fmaxf(p.m, top);
    if (m == -inf) return;  // every element so far -inf
    float s = p.s * expf(p.m - m);
#pragma unroll
    for (int k = 0; k < per; ++k) s += expf(e[k] - m);
    p.s = s;
    p.m = m;
}
template <int DT>
__device__ void lse_rows_impl(Walk kept, i64 len, void* out, int odt, const void* x) {
    __shared__ LsePart part[32];
    constexpr int size = DT == DT_F32 ? 4 : 2, per = 16 / size;
    const float inf = __int_as_float(0x7f800000);
    for (i64 g = blockIdx.x; g < kept.n; g += gridDim.x) {
        i64 o[2];
        walk_offsets<2>(kept, g, o);
        LsePart p = {-inf, 0.0f, 0};
        const char* row = (const char*)x + o[1] * size;
        // Elements before the first 16-byte boundary, the vectors, the elements after.
        const i64 head = ((u64)row & 15) % size != 0 ? len : min(len, (i64)((16 - ((u64)row & 15)) & 15) / size);
        const i64 vectors = (len - head) / per;
        for (i64 j = threadIdx.x; j < head; j += blockDim.x) lse_push(p, lse_load<DT>(x, o[1] + j));
        const uint4* body = (const uint4*)(row + head * size);
        i64 k = threadIdx.x;
        for (; k + blockDim.x < vectors; k += 2 * blockDim.x) {
            const uint4 a = body[k], b = body[k + blockDim.x];
            lse_push_vector<DT>(p, a);
            lse_push_vector<DT>(p, b);
        }
        for (; k < vectors; k += blockDim.x) lse_push_vector<DT>(p, body[k]);
        for (i64 j = head + vectors * per + threadIdx.x; j < len; j += blockDim.x) lse_push(p, lse_load<DT>(x, o[1] + j));
        for (int s = 16; s > 0; s >>= 1) {
            LsePart q;
            q.m = __shfl_xor_sync(0xffffffffu, p.m, s);
            q.s = __shfl_xor_sync(0xffffffffu, p.s, s);
            q.flags = __shfl_xor_sync(0xffffffffu, p.flags, s);
            p = lse_merge(p, q);
        }
        if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = p;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < (int)(blockDim.x / 32); ++w) p = lse_merge(p, part[w]);
            const float r = (p.flags & 1) ? nan_f() : (p.flags & 2) ? inf : p.m == -inf ? -inf : p.m + logf(p.s);
            store_f(out, odt, o[0], r);
        }
        __syncthreads();
    }
}
extern "C" __global__ void reduce_lse_rows(Walk kept, i64 len, void* out, int odt, const void* x, int xdt) {
    if (xdt == DT_F32) {
        lse_rows_impl<DT_F32>(kept, len, out, odt, x);
    } else if (xdt == DT_BF16) {
        lse_rows_impl<DT_BF16>(kept, len, out, odt, x);
    } else {
        lse_rows_impl<DT_F16>(kept, len, out, odt, x);
    }
}
