// Segment sums, deterministic: for few segments times rows one launch that scans every id
// per segment (segment_scan); otherwise a stable counting sort of the rows by segment, then
// in-order sums over each segment (whole, or over sub-ranges whose sums are added in order):
// integer atomics only, no float atomics, no single hot address.
#include "common.cuh"

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
// segment scans 32 chunks at a time (a thread per segment walking every chunk in turn left
// the device waiting on 4,096 segments' serial walks over 489 chunks). Grid: ceil(m / 8)
// blocks of 256.
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

// segment_sum with f64 rows or sums: segment_ordered's walk (a block per segment, threads over
// the columns, the rows in ascending order) with one chain of f64 fused multiply-adds from 0
// per column, every dtype read through load_d and the totals stored once through store_d.
extern "C" __global__ void segment_ordered_wide(const void* x, int xdt, i64 xoff, i64 xs0, i64 xs1, const void* wts,
                                                int wdt, i64 woff, i64 ws, int has_w, const u32* starts,
                                                const u32* order, i64 d, void* sums, int sdt, i64 soff, i64 ss0,
                                                i64 ss1, void* counts, int cdt, i64 coff, i64 cs,
                                                const u32* verdict) {
    if (*verdict) return;
    i64 s = blockIdx.x;
    u32 a = starts[s], b = starts[s + 1];
    for (i64 k = threadIdx.x; k <= d; k += blockDim.x) {
        double acc = 0.0;
        for (u32 q = a; q < b; ++q) {
            const i64 row = order[q];
            const double wv = has_w ? load_d(wts, wdt, woff + row * ws) : 1.0;
            acc = k < d ? __fma_rn(wv, load_d(x, xdt, xoff + row * xs0 + k * xs1), acc) : __dadd_rn(acc, wv);
        }
        if (k < d)
            store_d(sums, sdt, soff + s * ss0 + k * ss1, acc);
        else
            store_d(counts, cdt, coff + s * cs, acc);
    }
}

// segment_sum outside Precision::Reproducible for narrow rows (d < 32) in segments of few rows
// on average (a product quantiser's codewords: 4,096 segments of about 40 rows of 8): a warp
// per segment, lane l adding the segment's rows l, l + 32, ... in order with Kahan
// compensation, column after column, then the lanes' totals combined by a fixed shuffle tree:
// the same result on every run. (segment_ordered's block per segment walks the rows one after
// another with most of its threads idle, several times slower there.) Grid: ceil(m / 8)
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
            // another.) Rows too wide for a
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
