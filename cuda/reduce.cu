// Reductions: reduce (sum, mean, max, min) and arg_reduce over strided views, one warp or one
// block per output element; and the deterministic segment sum (a stable counting sort of the
// rows by segment, then in-order sums over sub-ranges of each segment, then the sub-ranges'
// sums in order): integer atomics only, no float atomics, no single hot address.
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
// time (one at a time, a block's reduction of 50,176 elements waited on each: 107 us on an
// H200).
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
// leave all but a few lanes idle (434 us for the 1.6M windows of 4 of a LeNet pooling layer on
// an H200). Scanning in order keeps the rules: ties go to the lower index, the first NaN wins.
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

// (arg_reduce_kernel, arg_reduce_short, arg_reduce_block and arg_reduce_split share their loops by copy, not through device
// helpers: factored into helpers, nvcc compiled this file's unchanged segment kernels
// differently and the sorted weighted segment sum of 100,000 x 768 went from 0.54 to 0.83 ms
// on an H200.)
// One block per output, for few outputs along a long axis (a warp each would walk it with one
// load in flight: 116 us for one row of 8,192 on an H200). Each thread keeps the best of its
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
// output, then resets the ticket. One launch, where a single block walked 10,000 keys in
// 9 us on an H200 (k-means++ asks for one such argmin per anchor). The result does not depend
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

// ----- segment sums -----
// Rows are split into `chunks` consecutive chunks. counts[c * m + s] = rows of chunk c in segment s.
extern "C" __global__ void segment_histogram(const u32* seg, i64 n, i64 m, i64 chunk_len, u32* counts, const u32* verdict) {
    if (*verdict) return;
    GRID_STRIDE(i, n) {
        u32 s = seg[i];
        i64 c = i / chunk_len;
        // Lanes of a warp with the same (chunk, segment) add once.
        u64 key = ((u64)c << 32) | s;
        u32 peers = __match_any_sync(__activemask(), key);
        int leader = __ffs(peers) - 1;
        if ((int)(threadIdx.x & 31) == leader) atomicAdd(&counts[c * m + s], (u32)__popc(peers));
    }
}

// For each segment: its chunks' exclusive prefix (in place) and its total. A warp per
// segment scans 32 chunks at a time (a thread per segment walking every chunk in turn took
// 76 us for 4,096 segments over 489 chunks on an H200). Grid: ceil(m / 8) blocks of 256.
extern "C" __global__ void segment_chunk_prefix(u32* counts, i64 m, i64 chunks, u32* totals) {
    const i64 s = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (s >= m) return;
    const int lane = threadIdx.x & 31;
    u32 run = 0;
    for (i64 c0 = 0; c0 < chunks; c0 += 32) {
        const i64 c = c0 + lane;
        const u32 v = c < chunks ? counts[c * m + s] : 0u;
        u32 x = v;
        for (int o = 1; o < 32; o <<= 1) {
            const u32 y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (c < chunks) counts[c * m + s] = run + x - v;
        run += __shfl_sync(0xffffffffu, x, 31);
    }
    if (lane == 0) totals[s] = run;
}

// starts[s] = sum of totals[0..s), starts[m] = n. One block.
extern "C" __global__ void exclusive_scan_one_block(const u32* totals, i64 m, u32* starts) {
    __shared__ u32 warp_sums[32];
    __shared__ u32 carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (i64 base = 0; base < m; base += blockDim.x) {
        i64 i = base + threadIdx.x;
        u32 v = i < m ? totals[i] : 0u;
        u32 x = v;
        int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        for (int o = 1; o < 32; o <<= 1) {
            u32 y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) warp_sums[wid] = x;
        __syncthreads();
        if (wid == 0) {
            u32 t = lane < (int)(blockDim.x >> 5) ? warp_sums[lane] : 0u;
            for (int o = 1; o < 32; o <<= 1) {
                u32 y = __shfl_up_sync(0xffffffffu, t, o);
                if (lane >= o) t += y;
            }
            warp_sums[lane] = t;
        }
        __syncthreads();
        u32 before = carry + (wid > 0 ? warp_sums[wid - 1] : 0u) + x - v;
        if (i < m) starts[i] = before;
        __syncthreads();
        if (threadIdx.x == blockDim.x - 1) carry = before + v;
        __syncthreads();
    }
    if (threadIdx.x == 0) starts[m] = carry;
}

// Stable placement: one block per chunk writes its rows' indices to order[] at their segment's
// cursor, warp after warp, so rows of one segment keep their original order.
extern "C" __global__ void segment_place(const u32* seg, i64 n, i64 m, i64 chunk_len, const u32* starts, u32* cursors,
                                         u32* order, const u32* verdict) {
    if (*verdict) return;
    i64 c = blockIdx.x;
    u32* cur = cursors + c * m;
    i64 begin = c * chunk_len, end = min(n, begin + chunk_len);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (i64 tile = begin; tile < end; tile += blockDim.x) {
        i64 i = tile + threadIdx.x;
        bool live = i < end;
        u32 s = live ? seg[i] : 0xffffffffu;
        for (int w = 0; w < nw; ++w) {
            if (wid == w) {
                u32 peers = __match_any_sync(0xffffffffu, s);
                int leader = __ffs(peers) - 1;
                u32 base = 0;
                if (live && lane == leader) {
                    base = starts[s] + cur[s];
                    cur[s] += __popc(peers);
                }
                base = __shfl_sync(0xffffffffu, base, leader);
                if (live) order[base + __popc(peers & ((1u << lane) - 1u))] = (u32)i;
            }
            __syncthreads();
        }
    }
}

// partial[(s * parts + p) * (d + 1) + k]: the sum over sub-range p of segment s's rows (in
// order) of w * x[row, k]; column d holds the sum of weights. Grid (m, parts), threads over k.
// The sub-range's row numbers and weights pass through shared memory 64 at a time, so each
// thread's loads of x do not wait on them and can be in flight together.
#define PART_ROWS 64
extern "C" __global__ void segment_partial(const void* x, int xdt, i64 xoff, i64 xs0, i64 xs1, const void* wts, int wdt,
                                           i64 woff, i64 ws, int has_w, const u32* starts, const u32* order, i64 d,
                                           i64 parts, float* partial, const u32* verdict) {
    if (*verdict) return;
    __shared__ i64 rows_s[PART_ROWS];
    __shared__ float w_s[PART_ROWS];
    i64 s = blockIdx.x, p = blockIdx.y;
    u32 a = starts[s], b = starts[s + 1];
    u32 len = b - a;
    u32 per = (len + (u32)parts - 1u) / (u32)parts;
    u32 lo = a + min(len, (u32)p * per), hi = a + min(len, (u32)(p + 1) * per);
    for (i64 k0 = 0; k0 <= d; k0 += blockDim.x) {
        const i64 k = k0 + threadIdx.x;
        // Each tile's rows are added from 0 and folded into the part's total with Kahan
        // compensation: a part of one long segment can hold many thousands of rows.
        float acc = 0.0f, comp = 0.0f;
        for (u32 q0 = lo; q0 < hi; q0 += PART_ROWS) {
            __syncthreads();
            if (threadIdx.x < PART_ROWS && q0 + threadIdx.x < hi) {
                i64 row = order[q0 + threadIdx.x];
                rows_s[threadIdx.x] = row;
                w_s[threadIdx.x] = has_w ? load_f(wts, wdt, woff + row * ws) : 1.0f;
            }
            __syncthreads();
            const int count = (int)min((u32)PART_ROWS, hi - q0);
            float tile = 0.0f;
            if (k < d) {
#pragma unroll 4
                for (int j = 0; j < count; ++j) tile += w_s[j] * load_f(x, xdt, xoff + rows_s[j] * xs0 + k * xs1);
            } else if (k == d) {
                for (int j = 0; j < count; ++j) tile += w_s[j];
            }
            kahan_add(acc, comp, tile);
        }
        if (k <= d) partial[(s * parts + p) * (d + 1) + k] = acc;
    }
}

// Rows one compensated run adds from 0 in the segment sums outside Precision::Reproducible
// (see segment_scan).
#define SEGMENT_RUN 32

// segment_sum under hal::Precision::Reproducible (runs = 0), and under the other precisions
// (runs = 1) for segments of few rows on average: segment s's rows, in ascending row order
// (`order` is the stable counting sort), summed in f32 with one fused multiply-add per term
// (the count column with plain adds). Reproducible: one chain from 0, the order every backend
// follows, so the sums are bit-identical to the CPU's. Otherwise runs of SEGMENT_RUN rows,
// each from 0, folded together with Kahan compensation (one segment may still hold most of
// the rows). One block per segment, threads over the columns k <= d.
extern "C" __global__ void segment_ordered(const void* x, int xdt, i64 xoff, i64 xs0, i64 xs1, const void* wts, int wdt,
                                           i64 woff, i64 ws, int has_w, const u32* starts, const u32* order, i64 d,
                                           void* sums, int sdt, i64 soff, i64 ss0, i64 ss1, void* counts, int cdt,
                                           i64 coff, i64 cs, const u32* verdict, int runs) {
    if (*verdict) return;
    i64 s = blockIdx.x;
    u32 a = starts[s], b = starts[s + 1];
    for (i64 k = threadIdx.x; k <= d; k += blockDim.x) {
        float total = 0.0f, comp = 0.0f;
        for (u32 q = a; q < b;) {
            const u32 end = runs ? min(b, q + SEGMENT_RUN) : b;
            float acc = 0.0f;
            // Four rows' loads in flight at a time; the adds stay in row order.
            for (; q + 4 <= end; q += 4) {
                float wv[4], xv[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const i64 row = order[q + j];
                    wv[j] = has_w ? load_f(wts, wdt, woff + row * ws) : 1.0f;
                    xv[j] = k < d ? load_f(x, xdt, xoff + row * xs0 + k * xs1) : 0.0f;
                }
#pragma unroll
                for (int j = 0; j < 4; ++j) acc = k < d ? __fmaf_rn(wv[j], xv[j], acc) : __fadd_rn(acc, wv[j]);
            }
            for (; q < end; ++q) {
                i64 row = order[q];
                float wv = has_w ? load_f(wts, wdt, woff + row * ws) : 1.0f;
                acc = k < d ? __fmaf_rn(wv, load_f(x, xdt, xoff + row * xs0 + k * xs1), acc) : __fadd_rn(acc, wv);
            }
            if (runs)
                kahan_add(total, comp, acc);
            else
                total = acc;
        }
        if (k < d)
            store_f(sums, sdt, soff + s * ss0 + k * ss1, total);
        else
            store_f(counts, cdt, coff + s * cs, total);
    }
}

// segment_sum outside Precision::Reproducible for narrow rows (d < 32) in segments of few rows
// on average (a product quantiser's codewords: 4,096 segments of about 40 rows of 8): a warp
// per segment, lane l adding the segment's rows l, l + 32, ... in order with Kahan
// compensation, column after column, then the lanes' totals combined by a fixed shuffle tree:
// the same result on every run. (segment_ordered's block per segment walks the rows one after
// another with most of its threads idle: 39 us there, against a few here.) Grid: ceil(m / 8)
// blocks of 256 threads.
extern "C" __global__ void segment_warp(const void* x, int xdt, i64 xoff, i64 xs0, i64 xs1, const void* wts, int wdt,
                                        i64 woff, i64 ws, int has_w, const u32* starts, const u32* order, i64 d,
                                        i64 m, void* sums, int sdt, i64 soff, i64 ss0, i64 ss1, void* counts, int cdt,
                                        i64 coff, i64 cs, const u32* verdict) {
    if (*verdict) return;
    const i64 s = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (s >= m) return;
    const int lane = threadIdx.x & 31;
    const u32 a = starts[s], b = starts[s + 1];
    for (i64 k = 0; k <= d; ++k) {
        float acc = 0.0f, comp = 0.0f;
        for (u32 q = a + lane; q < b; q += 32) {
            const i64 row = order[q];
            const float wv = has_w ? load_f(wts, wdt, woff + row * ws) : 1.0f;
            kahan_add(acc, comp, k < d ? wv * load_f(x, xdt, xoff + row * xs0 + k * xs1) : wv);
        }
        for (int o = 16; o > 0; o >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
        if (lane == 0) {
            if (k < d)
                store_f(sums, sdt, soff + s * ss0 + k * ss1, acc);
            else
                store_f(counts, cdt, coff + s * cs, acc);
        }
    }
}

// segment_sum for small problems (segments x rows within 2^24): one block per segment finds
// its rows by scanning every segment id (two per thread per step; a block-wide exclusive
// scan keeps them in ascending order in a shared list), and sums them as segment_ordered does,
// with the same `runs` choice: under Precision::Reproducible (runs = 0) the same terms in the
// same order from 0, one fused multiply-add per term, the count with plain adds, so the result
// is bit-identical to segment_ordered's; otherwise runs of SEGMENT_RUN rows from 0 folded
// together with Kahan compensation (a single chain over hundreds of equal rows, a broadcast
// view, drifted past the Sum tolerance of 2^-17 sum|x|). One launch where the counting sort
// takes five. The list is flushed into the per-column accumulators (dynamic shared memory,
// d + 1 floats, then d + 1 compensations with runs) whenever it could overflow.
#define SCAN_THREADS 1024
#define SCAN_LIST 4096
#define SCAN_TILE 2048
#define SCAN_TILE_ROWS 512
static_assert(SCAN_THREADS == 1024, "segment_scan: warp 0 scans one warp total per lane");
// Two blocks per multiprocessor (at most 32 registers a thread): with one, the 256 segments of
// a 10,000 x 128 sum took two waves on an H200's 132.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS, 2)
    segment_scan(const void* x, int xdt, i64 xoff, i64 xs0, i64 xs1, const void* wts, int wdt, i64 woff, i64 ws,
                 int has_w, const u32* seg, i64 n, i64 d, void* sums, int sdt, i64 soff, i64 ss0, i64 ss1,
                 void* counts, int cdt, i64 coff, i64 cs, const u32* verdict, int runs, u32* fault, u32 fault_op) {
    extern __shared__ float acc[];
    float* comp = acc + d + 1;
    __shared__ u32 list[SCAN_LIST];
    __shared__ int warp_total[SCAN_THREADS / 32];
    __shared__ int round_total;
    __shared__ float tile_x[SCAN_TILE];
    __shared__ float tile_w[SCAN_TILE_ROWS];
    // Every block reads every id, so it checks them itself (no separate check launch, so
    // `verdict`, which the segment kernels share in their parameters, is unused here): an id
    // past the last segment (gridDim.x) is reported, and no block writes its sums.
    (void)verdict;
    const u32 s = blockIdx.x;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    bool bad = false;
    for (i64 k = t; k <= d; k += SCAN_THREADS) {
        acc[k] = 0.0f;
        if (runs) comp[k] = 0.0f;
    }
    int listed = 0;
    // Two ids per thread, adjacent, so the list stays in ascending order; the next pair is
    // loaded while this one is listed (each round otherwise began by waiting on its loads).
    u32 next0 = 2 * t < n ? seg[2 * t] : 0u, next1 = 2 * t + 1 < n ? seg[2 * t + 1] : 0u;
    for (i64 base = 0; base < n; base += 2 * SCAN_THREADS) {
        i64 i0 = base + 2 * t;
        const u32 id0 = next0, id1 = next1;
        const i64 ahead = i0 + 2 * SCAN_THREADS;
        if (ahead < n) next0 = seg[ahead];
        if (ahead + 1 < n) next1 = seg[ahead + 1];
        const bool hit0 = i0 < n && id0 == s;
        const bool hit1 = i0 + 1 < n && id1 == s;
        const bool bad0 = i0 < n && id0 >= gridDim.x, bad1 = i0 + 1 < n && id1 >= gridDim.x;
        if (bad0 || bad1) {
            bad = true;
            report_fault(fault, bad0 ? id0 : id1, gridDim.x, fault_op);
        }
        // Places in the list: the hits of the lanes below within the warp (ballots), after
        // those of the warps below (warp 0 scans the warps' totals once; every thread walking
        // all 32 totals made the scan compute-bound).
        const u32 m0 = __ballot_sync(0xffffffffu, hit0), m1 = __ballot_sync(0xffffffffu, hit1);
        const u32 below = (1u << lane) - 1u;
        int pos = __popc(m0 & below) + __popc(m1 & below);
        if (lane == 0) warp_total[warp] = __popc(m0) + __popc(m1);
        __syncthreads();
        if (warp == 0) {
            const int v = warp_total[lane];
            int incl = v;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off) incl += y;
            }
            warp_total[lane] = incl - v;
            if (lane == 31) round_total = incl;
        }
        __syncthreads();
        pos += listed + warp_total[warp];
        if (hit0) list[pos++] = (u32)i0;
        if (hit1) list[pos] = (u32)(i0 + 1);
        listed += round_total;
        __syncthreads();
        if (listed > SCAN_LIST - 2 * SCAN_THREADS || base + 2 * SCAN_THREADS >= n) {
            // The listed rows pass through shared memory a tile at a time, loaded by every
            // thread at once; then each column's thread adds them up in row order from there.
            // (Walking global memory directly, a column's thread waited on one load after
            // another: 34 us for one segment of 256 rows on an H200.) Rows too wide for a
            // tile are read directly.
            const int tile_rows = d <= SCAN_TILE ? (int)min((i64)SCAN_TILE_ROWS, SCAN_TILE / d) : 0;
            int q = 0;
            while (tile_rows > 0 && q < listed) {
                const int rows = min(tile_rows, listed - q);
                for (int e = t; e < rows * (int)d; e += SCAN_THREADS) {
                    const int r = e / (int)d, k = e - r * (int)d;
                    tile_x[e] = load_f(x, xdt, xoff + (i64)list[q + r] * xs0 + k * xs1);
                }
                for (int r = t; r < rows; r += SCAN_THREADS)
                    tile_w[r] = has_w ? load_f(wts, wdt, woff + (i64)list[q + r] * ws) : 1.0f;
                __syncthreads();
                for (i64 k = t; k <= d; k += SCAN_THREADS) {
                    float a = acc[k], c = runs ? comp[k] : 0.0f;
                    const int span = runs ? SEGMENT_RUN : rows;
                    for (int r0 = 0; r0 < rows; r0 += span) {
                        const int r1 = min(rows, r0 + span);
                        float p = runs ? 0.0f : a;
                        // Unrolled, so the shared loads are issued ahead of the chain of adds.
                        if (k < d) {
#pragma unroll 8
                            for (int r = r0; r < r1; ++r) p = __fmaf_rn(tile_w[r], tile_x[r * d + k], p);
                        } else {
#pragma unroll 8
                            for (int r = r0; r < r1; ++r) p = __fadd_rn(p, tile_w[r]);
                        }
                        if (runs)
                            kahan_add(a, c, p);
                        else
                            a = p;
                    }
                    acc[k] = a;
                    if (runs) comp[k] = c;
                }
                __syncthreads();
                q += rows;
            }
            // Only under Precision::Reproducible (the backend takes rows this wide with runs
            // to the sorted path): one chain continued.
            for (i64 k = t; k <= d && q < listed; k += SCAN_THREADS) {
                float a = acc[k];
                int qq = q;
                // Four rows' loads in flight at a time; the adds stay in row order.
                for (; qq + 4 <= listed; qq += 4) {
                    i64 r[4];
                    float wv[4], xv[4];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        r[j] = list[qq + j];
                        wv[j] = has_w ? load_f(wts, wdt, woff + r[j] * ws) : 1.0f;
                        xv[j] = k < d ? load_f(x, xdt, xoff + r[j] * xs0 + k * xs1) : 0.0f;
                    }
#pragma unroll
                    for (int j = 0; j < 4; ++j) a = k < d ? __fmaf_rn(wv[j], xv[j], a) : __fadd_rn(a, wv[j]);
                }
                for (; qq < listed; ++qq) {
                    i64 row = list[qq];
                    float wv = has_w ? load_f(wts, wdt, woff + row * ws) : 1.0f;
                    a = k < d ? __fmaf_rn(wv, load_f(x, xdt, xoff + row * xs0 + k * xs1), a) : __fadd_rn(a, wv);
                }
                acc[k] = a;
            }
            listed = 0;
            __syncthreads();
        }
    }
    if (__syncthreads_or(bad)) return;
    for (i64 k = t; k <= d; k += SCAN_THREADS) {
        if (k < d)
            store_f(sums, sdt, soff + s * ss0 + k * ss1, acc[k]);
        else
            store_f(counts, cdt, coff + s * cs, acc[k]);
    }
}

// A small matrix product, out[b,i,j] = alpha * sum_k a[b,i,k] * bm[b,k,j] (+ beta * out[b,i,j]
// where beta is not 0), for products too small to fill the device through cuBLAS: there, a
// 10 x 128 weight gradient over k = 256 took 57 us on an H200 where the work is a few
// microseconds. Every operand is strided (batch, row, column strides; a batch stride of 0
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

// hal::Backend::kmeans_pp in one cooperative launch (every block resident at once, so blocks
// can wait for each other). For each anchor j: the points' squared distances to anchor j - 1
// (a group of `lanes` lanes per point, each lane summing every lanes-th coordinate in order
// with fused multiply-adds, the group then combined by shuffles: a fixed order, so the result
// is deterministic), folded into D^2, and each point's race key drawn from hal::random's
// stream at offset j n + i. A key is packed above its point's index into one 64-bit word
// whose unsigned minimum is the race's winner (keys are never negative, so their bits order
// as the floats do; equal keys go to the lower index); each block's minimum goes into
// `slot[j]` by an atomic minimum, then the block counts itself in at `arrived[j]` and waits
// until every block has, and reads the winner. The winners' rows are copied into the anchors
// at the end. As separate calls a step took three launches (about 9.5 us on an H200).
//
// `slot` and `arrived` (m words each) start as all ones (one memset): a slot is then larger
// than any packed key, and a count wraps to blocks - 1 once every block has added one.
#define KPP_BLOCK 256

__device__ __forceinline__ u64 warp_min_u64(u64 v) {
    for (int s = 16; s > 0; s >>= 1) {
        const u64 o = __shfl_xor_sync(0xffffffffu, v, s);
        v = o < v ? o : v;
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(KPP_BLOCK)
    kmeans_pp_race(const float* x, i64 n, i64 d, i64 m, float* anchors, float* d2, u64* slot, u32* arrived,
                   u32 seed_lo, u32 seed_hi, int lanes) {
    __shared__ u64 wbest[KPP_BLOCK / 32];
    __shared__ i64 winner;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane % lanes;
    const i64 thread = (i64)blockIdx.x * KPP_BLOCK + threadIdx.x;
    const i64 groups = (i64)gridDim.x * KPP_BLOCK / lanes;
    // Point p = group + r groups in round r; the warp's first group decides, for all its lanes
    // alike, whether the round runs (the shuffles need every lane).
    const i64 group = thread / lanes, warp_group = (thread - lane) / lanes;
    i64 w = -1;
    for (i64 j = 0; j < m; ++j) {
        u64 best = ~0ull;
        for (i64 r = 0; warp_group + r * groups < n; ++r) {
            const i64 p = group + r * groups;
            const bool live = p < n;
            // D^2 so far, loaded before the distance so that its latency overlaps.
            const float old = live && sub == 0 && j > 1 ? d2[p] : 0.0f;
            float acc = 0.0f;
            if (live && j > 0) {
                const float* xp = x + p * d;
                const float* c = x + w * d;
#pragma unroll 4
                for (i64 k = sub; k < d; k += lanes) {
                    const float t = xp[k] - c[k];
                    acc = fmaf(t, t, acc);
                }
            }
            for (int s = lanes / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
            if (live && sub == 0) {
                const u64 at = (u64)j * (u64)n + (u64)p;
                u32 ctr[4] = {(u32)at, (u32)(at >> 32), 0u, 0u};
                philox(ctr, seed_lo, seed_hi);
                const float u = (float)(ctr[0] >> 8) * (1.0f / 16777216.0f);
                float key = u;
                if (j > 0) {
                    const float nd = j == 1 ? acc : fminf(old, acc);
                    d2[p] = nd;
                    key = nd <= 0.0f ? __int_as_float(0x7f800000) : -logf(fmaxf(u, 1.17549435e-38f)) / nd;
                }
                const u64 packed = ((u64)__float_as_uint(key) << 32) | (u64)(u32)p;
                best = packed < best ? packed : best;
            }
        }
        best = warp_min_u64(best);
        if (lane == 0) wbest[warp] = best;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int k = 1; k < KPP_BLOCK / 32; ++k) best = wbest[k] < best ? wbest[k] : best;
            atomicMin((unsigned long long*)(slot + j), (unsigned long long)best);
            __threadfence();
            atomicAdd(arrived + j, 1u);
            volatile u32* count = arrived + j;
            while (*count != gridDim.x - 1) {}
            __threadfence();
            winner = (i64)(u32)(*(volatile u64*)(slot + j));
        }
        __syncthreads();
        w = winner;
    }
    // The anchors' rows, copied once every winner is known (each block a share of them).
    for (i64 t = thread; t < m * d; t += (i64)gridDim.x * KPP_BLOCK) {
        const i64 j = t / d;
        anchors[t] = x[(i64)(u32)__ldcg(slot + j) * d + (t - j * d)];
    }
}
