// Nearest-centroid search, exact mode: distances by a register-tiled f32 GEMM (128 points x 128
// centroids per block, 8 x 8 per thread) fused with the argmin, so no n x m matrix is written.
// The argmin compares |c|^2 - 2 x.c (|x|^2 is the same for every centroid); the winner's
// distance is then recomputed directly as sum_k (x_k - c_k)^2.
#include "common.cuh"

// norms[j] = sum_k c[j, k]^2.
extern "C" __global__ void row_norms(const float* c, i64 m, i64 d, i64 rs, i64 cs, float* norms) {
    i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
    for (i64 j = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; j < m; j += warps) {
        float acc = 0.0f;
        for (i64 k = threadIdx.x & 31; k < d; k += 32) {
            float v = c[j * rs + k * cs];
            acc = fmaf(v, v, acc);
        }
        acc = warp_sum(acc);
        if ((threadIdx.x & 31) == 0) norms[j] = acc;
    }
}

#define BM 128
#define BN 128
#define BK 8

// x: [n, d] at strides (xr, xc); c: [m, d] at (cr, cc), both f32. 256 threads: ty = tid / 16
// owns rows ty*4 + {0..3} and 64 + ty*4 + {0..3} of the tile, tx = tid % 16 owns columns
// likewise, so the 16 threads of a row group are 16 consecutive lanes of one warp.
extern "C" __global__ void __launch_bounds__(256) nearest_exact(const float* x, i64 n, i64 xr, i64 xc, const float* c,
                                                                i64 m, i64 cr, i64 cc, i64 d, const float* cnorm,
                                                                u32* out_index, i64 ioff, i64 is, float* out_dist,
                                                                i64 doff, i64 ds) {
    __shared__ __align__(16) float As[2][BK][BM];
    __shared__ __align__(16) float Bs[2][BK][BN];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const i64 m0 = (i64)blockIdx.x * BM;
    // Loader mapping: thread loads 4 consecutive k of one row: row = tid / 2, k = (tid % 2) * 4.
    const int lr = tid / 2, lk = (tid % 2) * 4;

    float best[8];
    int bidx[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) { best[i] = __int_as_float(0x7f800000); bidx[i] = 0x7fffffff; }

    for (i64 n0 = 0; n0 < m; n0 += BN) {
        float acc[8][8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
        float ra[4], rb[4];
        auto load = [&](i64 k0) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                i64 k = k0 + lk + q;
                i64 row = m0 + lr, col = n0 + lr;
                ra[q] = (row < n && k < d) ? x[row * xr + k * xc] : 0.0f;
                rb[q] = (col < m && k < d) ? c[col * cr + k * cc] : 0.0f;
            }
        };
        auto stash = [&](int buf) {
#pragma unroll
            for (int q = 0; q < 4; ++q) { As[buf][lk + q][lr] = ra[q]; Bs[buf][lk + q][lr] = rb[q]; }
        };
        load(0);
        stash(0);
        __syncthreads();
        int buf = 0;
        for (i64 k0 = 0; k0 < d; k0 += BK) {
            bool more = k0 + BK < d;
            if (more) load(k0 + BK);
#pragma unroll
            for (int k = 0; k < BK; ++k) {
                float4 a0 = *(const float4*)&As[buf][k][ty * 4];
                float4 a1 = *(const float4*)&As[buf][k][64 + ty * 4];
                float4 b0 = *(const float4*)&Bs[buf][k][tx * 4];
                float4 b1 = *(const float4*)&Bs[buf][k][64 + tx * 4];
                float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            }
            if (more) {
                stash(buf ^ 1);
                __syncthreads();
                buf ^= 1;
            }
        }
        // Scores of this tile's centroids; keep the best per row (ties: lowest index).
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            i64 col = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
            if (col < m) {
                float cn = cnorm[col];
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    float s = fmaf(-2.0f, acc[i][j], cn);
                    if (s < best[i] || (s == best[i] && (int)col < bidx[i])) { best[i] = s; bidx[i] = (int)col; }
                }
            }
        }
        __syncthreads();
    }
    // The 16 threads of a row group hold candidates for the same rows.
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        for (int o = 1; o < 16; o <<= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best[i], o);
            int oi = __shfl_xor_sync(0xffffffffu, bidx[i], o);
            if (ob < best[i] || (ob == best[i] && oi < bidx[i])) { best[i] = ob; bidx[i] = oi; }
        }
    }
    // The winner's exact distance, the row group's 16 threads splitting the coordinates.
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        i64 row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
        int j = bidx[i] == 0x7fffffff ? 0 : bidx[i];
        float acc = 0.0f;
        if (row < n)
            for (i64 k = tx; k < d; k += 16) {
                float diff = x[row * xr + k * xc] - c[(i64)j * cr + k * cc];
                acc = fmaf(diff, diff, acc);
            }
        for (int o = 1; o < 16; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (row < n && tx == 0) {
            out_index[ioff + row * is] = (u32)j;
            out_dist[doff + row * ds] = acc;
        }
    }
}

// ----- tensor-core search, exact mode -----
// Distances by TF32 tensor-core MMAs (mma.sync m16n8k8), fused with a running top-2 per point;
// the two candidates are then re-checked with an f32 distance and the better one kept. Each
// operand is split into a TF32 high part and a TF32 remainder, and hi*hi + hi*lo + lo*hi
// accumulated, which ranks as accurately as f32 arithmetic. (A single TF32 pass served
// Precision::Fast until the f16 kernel below: 23.3 ms against 9.0 ms at 1M x 128 against
// 4096 on an H200.)
// Needs contiguous rows (unit column stride, row stride and d multiples of 4, 16-byte aligned);
// the host falls back to nearest_exact otherwise. The entry points take nearest_exact's
// parameters, the column strides (1 here) included, so the host passes one list to either.
#define TBM 128
#define TBN 128
#define TBK 32
#define TLD (TBK + 4)

__device__ __forceinline__ u32 to_tf32(float v) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ void mma_tf32(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Keeps the two best (score, index) pairs; ties go to the lower index.
__device__ __forceinline__ void top2_insert(float s, int j, float& b1, int& i1, float& b2, int& i2) {
    if (s < b1 || (s == b1 && j < i1)) {
        b2 = b1; i2 = i1; b1 = s; i1 = j;
    } else if ((s < b2 || (s == b2 && j < i2)) && j != i1) {
        b2 = s; i2 = j;
    }
}

// The end of a tensor-core search (256 threads, 8 warps as 4 x 2 over a 128 x 128 tile): each
// thread's top-2 for its four rows (mt, half) -> rows wr*32 + mt*16 + g + half*8 merged across
// the four lanes that share them, then across the two column halves through shared memory;
// the two candidates of each row are then compared by their f32 distance. A row with no
// candidate (every score NaN) gets centroid 0 and its distance, as the reference would.
__device__ void top2_finish(float (&b1)[4], float (&b2)[4], int (&i1)[4], int (&i2)[4], const float* x, i64 n,
                            i64 xr, const float* c, i64 m, i64 cr, i64 d, i64 m0, u32* out_index, i64 ioff,
                            i64 is, float* out_dist, i64 doff, i64 ds) {
    __shared__ float cand_s[TBM][2][2];
    __shared__ int cand_i[TBM][2][2];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wr = warp >> 1, wc = warp & 1;
    const float INF = __int_as_float(0x7f800000);
    // Merge the four lanes (t) that share rows, then the two column halves through shared memory.
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        for (int o = 1; o < 4; o <<= 1) {
            float ob1 = __shfl_xor_sync(0xffffffffu, b1[r], o), ob2 = __shfl_xor_sync(0xffffffffu, b2[r], o);
            int oi1 = __shfl_xor_sync(0xffffffffu, i1[r], o), oi2 = __shfl_xor_sync(0xffffffffu, i2[r], o);
            top2_insert(ob1, oi1, b1[r], i1[r], b2[r], i2[r]);
            top2_insert(ob2, oi2, b1[r], i1[r], b2[r], i2[r]);
        }
        if (t == 0) {
            int row = wr * 32 + (r >> 1) * 16 + g + (r & 1) * 8;
            cand_s[row][wc][0] = b1[r];
            cand_s[row][wc][1] = b2[r];
            cand_i[row][wc][0] = i1[r];
            cand_i[row][wc][1] = i2[r];
        }
    }
    __syncthreads();
    // Two threads per row, one per candidate: the f32 distance decides.
    int row = tid >> 1, which = tid & 1;
    float s1 = cand_s[row][0][0], s2 = cand_s[row][0][1];
    int j1 = cand_i[row][0][0], j2 = cand_i[row][0][1];
    top2_insert(cand_s[row][1][0], cand_i[row][1][0], s1, j1, s2, j2);
    top2_insert(cand_s[row][1][1], cand_i[row][1][1], s1, j1, s2, j2);
    int j = which == 0 ? j1 : j2;
    if (which == 0 && j1 >= m) j = 0;
    i64 grow = m0 + row;
    float dist = INF;
    if (grow < n && j < m) {
        float a = 0.0f;
        for (i64 k = 0; k < d; ++k) {
            float diff = x[grow * xr + k] - c[(i64)j * cr + k];
            a = fmaf(diff, diff, a);
        }
        dist = a;
    }
    float od = __shfl_xor_sync(0xffffffffu, dist, 1);
    int oj = __shfl_xor_sync(0xffffffffu, j, 1);
    // A NaN distance is replaced by any number (the reference's rule).
    if (oj < m && (od < dist || (od == dist && oj < j) || (dist != dist && od == od))) { dist = od; j = oj; }
    if (grow < n && which == 0) {
        out_index[ioff + grow * is] = (u32)j;
        out_dist[doff + grow * ds] = dist;
    }
}

// Scores |c|^2 + scale x.c (scale -2, or -2 undoing operand scales) of a 128 x 128 tile's
// centroids (from n0) into each of the thread's four rows' top-2, from the mma accumulators
// (warp tile wr, wc as in nearest_3xtf32; accumulator (mt, nt, q): row mt*16 + g + (q/2)*8,
// column nt*8 + 2t + q%2). GATED: enter only strictly below the second best (columns rise,
// so a tie cannot win), one comparison for most scores.
template <bool GATED>
__device__ __forceinline__ void score_tile(const float (&acc)[2][8][4], float scale, i64 n0, i64 m,
                                           const float* cnorm, float (&b1)[4], int (&i1)[4], float (&b2)[4],
                                           int (&i2)[4]) {
    const int lane = threadIdx.x & 31, wc = (threadIdx.x >> 5) & 1, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            i64 col = n0 + wc * 64 + nt * 8 + 2 * t + e;
            if (col < m) {
                float cn = cnorm[col];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        int r = mt * 2 + h;
                        float s = fmaf(scale, acc[mt][nt][h * 2 + e], cn);
                        if (!GATED || s < b2[r]) top2_insert(s, (int)col, b1[r], i1[r], b2[r], i2[r]);
                    }
            }
        }
}

extern "C" __global__ void __launch_bounds__(256)
nearest_3xtf32(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit, i64 d,
               const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds) {
    __shared__ __align__(16) float As[TBM * TLD];
    __shared__ __align__(16) float Bs[TBN * TLD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wr = warp >> 1, wc = warp & 1;  // warp tile: rows wr*32.., cols wc*64..
    const i64 m0 = (i64)blockIdx.x * TBM;
    const float INF = __int_as_float(0x7f800000);

    // Top-2 for the thread's four rows: (mt, half) -> rows wr*32 + mt*16 + g + half*8.
    float b1[4], b2[4];
    int i1[4], i2[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) { b1[r] = INF; b2[r] = INF; i1[r] = 0x7fffffff; i2[r] = 0x7fffffff; }

    for (i64 n0 = 0; n0 < m; n0 += TBN) {
        float acc[2][8][4];
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int b = 0; b < 8; ++b)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[a][b][q] = 0.0f;
        for (i64 k0 = 0; k0 < d; k0 += TBK) {
            __syncthreads();
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                int idx = q * 256 + tid;
                int r = idx >> 3, kq = (idx & 7) * 4;
                i64 k = k0 + kq;
                float4 va = make_float4(0.f, 0.f, 0.f, 0.f), vb = va;
                if (m0 + r < n && k < d) va = *(const float4*)&x[(m0 + r) * xr + k];
                if (n0 + r < m && k < d) vb = *(const float4*)&c[(n0 + r) * cr + k];
                *(float4*)&As[r * TLD + kq] = va;
                *(float4*)&Bs[r * TLD + kq] = vb;
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < TBK; kk += 8) {
                u32 ah[2][4], al[2][4], bh[8][2], bl[8][2];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    int r0 = wr * 32 + mt * 16 + g;
                    float v[4] = {As[r0 * TLD + kk + t], As[(r0 + 8) * TLD + kk + t], As[r0 * TLD + kk + t + 4],
                                  As[(r0 + 8) * TLD + kk + t + 4]};
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        ah[mt][q] = to_tf32(v[q]);
                        al[mt][q] = to_tf32(v[q] - __uint_as_float(ah[mt][q]));
                    }
                }
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    int c0 = wc * 64 + nt * 8 + g;
                    float v[2] = {Bs[c0 * TLD + kk + t], Bs[c0 * TLD + kk + t + 4]};
#pragma unroll
                    for (int q = 0; q < 2; ++q) {
                        bh[nt][q] = to_tf32(v[q]);
                        bl[nt][q] = to_tf32(v[q] - __uint_as_float(bh[nt][q]));
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 8; ++nt) {
                        mma_tf32(acc[mt][nt], al[mt], bh[nt]);
                        mma_tf32(acc[mt][nt], ah[mt], bl[nt]);
                        mma_tf32(acc[mt][nt], ah[mt], bh[nt]);
                    }
            }
        }
        score_tile<false>(acc, -2.0f, n0, m, cnorm, b1, i1, b2, i2);
    }
    top2_finish(b1, b2, i1, i2, x, n, xr, c, m, cr, d, m0, out_index, ioff, is, out_dist, doff, ds);
}

// ----- f16 tensor-core search (Precision::Fast) -----
// As the TF32 search, with operands rounded to f16 while they are staged (once per element and
// block, not per fragment) and mma.sync m16n8k16: twice the products per instruction and half
// the shared memory. f16's range is made to fit: each operand is scaled by a power of two that
// brings its largest magnitude just under 2^15 (absmax_rows measured it first; 1 where it is 0
// or not finite), and the scores undo the scales exactly.
#define HLD (TBK + 8)

// The largest |v| of a [rows, cols] matrix (strides rs, cs) into *out as float bits (atomicMax
// on the bits orders non-negative floats; NaN wins). *out must start at 0.
extern "C" __global__ void absmax_rows(const float* v, i64 rows, i64 cols, i64 rs, i64 cs, u32* out) {
    float mx = 0.0f;
    i64 total = rows * cols;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        float a = fabsf(v[(i / cols) * rs + (i % cols) * cs]);
        mx = (a > mx || a != a) ? a : mx;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = (other > mx || other != other) ? other : mx;
    }
    if ((threadIdx.x & 31) == 0) atomicMax(out, __float_as_uint(mx));
}

// The power of two that maps magnitudes up to `bits` (a float's bits) under 2^15.
__device__ __forceinline__ float f16_scale(u32 bits) {
    float mx = __uint_as_float(bits);
    if (!(mx > 0.0f) || !(mx < __int_as_float(0x7f800000))) return 1.0f;
    int e;
    frexpf(mx, &e);  // mx < 2^e
    return ldexpf(1.0f, max(-126, min(127, 15 - e)));
}

// Two floats to f16 (round to nearest even), a in the low half.
__device__ __forceinline__ u32 pack_f16x2(float a, float b) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}

__device__ __forceinline__ void mma_f16(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The longest d for which nearest_f16 keeps its block's points in shared memory (staged once,
// not once per block of centroids), and their padded row length in halves.
#define HOLD_D 128
#define XLD (HOLD_D + 8)

// nearest_3xtf32's parameters, then `scales`: absmax_rows' words for x and for c. HOLD: d is at
// most HOLD_D and the block's points are staged once.
// With HOLD, the centroids come packed (pack_f16_scaled: f16, scaled, rows padded to whole
// tiles and to `dp` halves, a multiple of TBK), and each next tile is read into registers while
// the current one is multiplied.
template <bool HOLD>
__device__ __forceinline__ void nearest_f16_impl(const float* x, i64 n, i64 xr, const float* c, i64 m, i64 cr,
                                                 i64 d, const float* cnorm, u32* out_index, i64 ioff, i64 is,
                                                 float* out_dist, i64 doff, i64 ds, const u32* scales,
                                                 const u32* ch, i64 dp) {
    // Rows of TBK halves padded to HLD: the fragment loads of a lane group (rows g, words t)
    // fall in distinct banks.
    __shared__ __align__(16) u32 As[TBM * (HOLD ? XLD : HLD) / 2];
    __shared__ __align__(16) u32 Bs[TBN * HLD / 2];
    const int ald = HOLD ? XLD : HLD;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wr = warp >> 1, wc = warp & 1;  // warp tile: rows wr*32.., cols wc*64..
    const i64 m0 = (i64)blockIdx.x * TBM;
    const float INF = __int_as_float(0x7f800000);
    const float sx = f16_scale(scales[0]), sc = f16_scale(scales[1]);
    // score = |c|^2 - 2 x.c, with x.c = acc / (sx sc): exact, the scales being powers of two.
    const float back = -2.0f / (sx * sc);

    float b1[4], b2[4];
    int i1[4], i2[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) { b1[r] = INF; b2[r] = INF; i1[r] = 0x7fffffff; i2[r] = 0x7fffffff; }
    // A tile of 128 rows by 32 of k (from k0), scaled and rounded to f16, into `dst` at column
    // `col` of rows of `ld` halves.
    auto stage = [&](u32* dst, int ld, int col, const float* src, i64 rs, i64 row0, i64 rows, i64 k0, float sv) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int idx = q * 256 + tid;
            int r = idx >> 3, kq = (idx & 7) * 4;
            i64 k = k0 + kq;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row0 + r < rows && k < d) v = *(const float4*)&src[(row0 + r) * rs + k];
            *(uint2*)&dst[(r * ld + col + kq) / 2] =
                make_uint2(pack_f16x2(v.x * sv, v.y * sv), pack_f16x2(v.z * sv, v.w * sv));
        }
    };
    // The packed centroids' tile at (n0, k0): eight halves a thread, twice.
    uint4 nb[2];
    auto load_b = [&](i64 n0, i64 k0) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            int idx = q * 256 + tid;
            nb[q] = *(const uint4*)&ch[((n0 + (idx >> 2)) * dp + k0 + (idx & 3) * 8) / 2];
        }
    };
    if (HOLD) {
        for (i64 k0 = 0; k0 < d; k0 += TBK) stage(As, XLD, (int)k0, x, xr, m0, n, k0, sx);
        load_b(0, 0);
    }
    const i64 kend = HOLD ? dp : d;

    for (i64 n0 = 0; n0 < m; n0 += TBN) {
        float acc[2][8][4];
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int b = 0; b < 8; ++b)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[a][b][q] = 0.0f;
        for (i64 k0 = 0; k0 < kend; k0 += TBK) {
            __syncthreads();
            if (HOLD) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    int idx = q * 256 + tid;
                    *(uint4*)&Bs[((idx >> 2) * HLD + (idx & 3) * 8) / 2] = nb[q];
                }
            } else {
                stage(As, HLD, 0, x, xr, m0, n, k0, sx);
                stage(Bs, HLD, 0, c, cr, n0, m, k0, sc);
            }
            __syncthreads();
            if (HOLD) {
                if (k0 + TBK < kend) load_b(n0, k0 + TBK);
                else if (n0 + TBN < m) load_b(n0 + TBN, 0);
            }
            const int ak = HOLD ? (int)k0 : 0;
#pragma unroll
            for (int kk = 0; kk < TBK; kk += 16) {
                u32 a[2][4], b[8][2];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    int r0 = wr * 32 + mt * 16 + g;
                    a[mt][0] = As[(r0 * ald + ak + kk) / 2 + t];
                    a[mt][1] = As[((r0 + 8) * ald + ak + kk) / 2 + t];
                    a[mt][2] = As[(r0 * ald + ak + kk) / 2 + t + 4];
                    a[mt][3] = As[((r0 + 8) * ald + ak + kk) / 2 + t + 4];
                }
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    int c0 = wc * 64 + nt * 8 + g;
                    b[nt][0] = Bs[(c0 * HLD + kk) / 2 + t];
                    b[nt][1] = Bs[(c0 * HLD + kk) / 2 + t + 4];
                }
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 8; ++nt) mma_f16(acc[mt][nt], a[mt], b[nt]);
            }
        }
        score_tile<true>(acc, back, n0, m, cnorm, b1, i1, b2, i2);
    }
    top2_finish(b1, b2, i1, i2, x, n, xr, c, m, cr, d, m0, out_index, ioff, is, out_dist, doff, ds);
}

// Two blocks per multiprocessor (at most 128 registers a thread; a few spill; measured 11.3 ms
// at 1M x 128 against 4096 on an H200, against 15.6 ms for one block of 172 registers).
extern "C" __global__ void __launch_bounds__(256, 2)
nearest_f16(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit, i64 d,
            const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds,
            const u32* scales) {
    nearest_f16_impl<false>(x, n, xr, c, m, cr, d, cnorm, out_index, ioff, is, out_dist, doff, ds, scales,
                            nullptr, 0);
}

// For d <= HOLD_D: the block's points staged once, the centroids packed beforehand (`ch`,
// rows of `dp` halves).
extern "C" __global__ void __launch_bounds__(256, 2)
nearest_f16_held(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit, i64 d,
                 const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds,
                 const u32* scales, const u32* ch, i64 dp) {
    nearest_f16_impl<true>(x, n, xr, c, m, cr, d, cnorm, out_index, ioff, is, out_dist, doff, ds, scales, ch,
                           dp);
}

// v [rows, cols] (strides rs, cs) times the power of two f16_scale(*scale) makes of the word, to
// f16 rows of `cols_p` halves, `rows_p` of them (the padding zero), two halves per word.
extern "C" __global__ void pack_f16_scaled(const float* v, i64 rows, i64 cols, i64 rs, i64 cs, const u32* scale,
                                           i64 rows_p, i64 cols_p, u32* out) {
    const float sv = f16_scale(*scale);
    const i64 words = rows_p * cols_p / 2;
    for (i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += (i64)gridDim.x * blockDim.x) {
        i64 r = (2 * w) / cols_p, k = (2 * w) % cols_p;
        float a = 0.0f, b = 0.0f;
        if (r < rows && k < cols) a = v[r * rs + k * cs] * sv;
        if (r < rows && k + 1 < cols) b = v[r * rs + (k + 1) * cs] * sv;
        out[w] = pack_f16x2(a, b);
    }
}

// nearest_centroid under hal::Precision::Reproducible: one thread per point, each distance
// summed over k in order with fused multiply-adds from 0, the first strictly smaller distance
// kept (a NaN best is replaced by any number): the CPU reference's order of operations, so the
// result is bit-identical to it. Centroids pass through shared memory in tiles of RT rows.
#define RT 32
#define RD 64
extern "C" __global__ void __launch_bounds__(128) nearest_ordered(const float* x, i64 n, i64 xr, i64 xc, const float* c,
                                                                  i64 m, i64 cr, i64 cc, i64 d, u32* out_index,
                                                                  i64 ioff, i64 is, float* out_dist, i64 doff,
                                                                  i64 ds) {
    __shared__ float tile[RT][RD];
    const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = row < n;
    float best = nan_f();
    i64 best_j = 0;
    float acc[RT];
    for (i64 j0 = 0; j0 < m; j0 += RT) {
        const int width = (int)min((i64)RT, m - j0);
#pragma unroll
        for (int jj = 0; jj < RT; ++jj) acc[jj] = 0.0f;
        for (i64 k0 = 0; k0 < d; k0 += RD) {
            const int depth = (int)min((i64)RD, d - k0);
            __syncthreads();
            for (int e = threadIdx.x; e < RT * RD; e += blockDim.x) {
                int jj = e / RD, kk = e % RD;
                tile[jj][kk] = (jj < width && kk < depth) ? c[(j0 + jj) * cr + (k0 + kk) * cc] : 0.0f;
            }
            __syncthreads();
            if (live) {
                for (int kk = 0; kk < depth; ++kk) {
                    const float xv = x[row * xr + (k0 + kk) * xc];
#pragma unroll
                    for (int jj = 0; jj < RT; ++jj) {
                        const float t = __fsub_rn(xv, tile[jj][kk]);
                        acc[jj] = __fmaf_rn(t, t, acc[jj]);
                    }
                }
            }
        }
        for (int jj = 0; jj < width; ++jj) {
            if (acc[jj] < best || (is_nan_f(best) && !is_nan_f(acc[jj]))) {
                best = acc[jj];
                best_j = j0 + jj;
            }
        }
    }
    if (live) {
        out_index[ioff + row * is] = (u32)best_j;
        out_dist[doff + row * ds] = best;
    }
}
