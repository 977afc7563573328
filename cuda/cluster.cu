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

// ----- tensor-core search -----
// Distances by TF32 tensor-core MMAs (mma.sync m16n8k8), fused with a running top-2 per point;
// the two candidates are then re-checked with an f32 distance and the better one kept.
// PASSES = 1 (hal's Precision::Fast): operands rounded to TF32 (10-bit mantissa).
// PASSES = 3 (exact mode): each operand split into a TF32 high part and a TF32 remainder, and
// hi*hi + hi*lo + lo*hi accumulated, which ranks as accurately as f32 arithmetic.
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

template <int PASSES>
__device__ void nearest_tc_impl(const float* x, i64 n, i64 xr, const float* c, i64 m, i64 cr, i64 d,
                                const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff,
                                i64 ds) {
    __shared__ __align__(16) float As[TBM * TLD];
    __shared__ __align__(16) float Bs[TBN * TLD];
    __shared__ float cand_s[TBM][2][2];
    __shared__ int cand_i[TBM][2][2];
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
                        if (PASSES > 1) al[mt][q] = to_tf32(v[q] - __uint_as_float(ah[mt][q]));
                    }
                }
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    int c0 = wc * 64 + nt * 8 + g;
                    float v[2] = {Bs[c0 * TLD + kk + t], Bs[c0 * TLD + kk + t + 4]};
#pragma unroll
                    for (int q = 0; q < 2; ++q) {
                        bh[nt][q] = to_tf32(v[q]);
                        if (PASSES > 1) bl[nt][q] = to_tf32(v[q] - __uint_as_float(bh[nt][q]));
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 8; ++nt) {
                        if (PASSES > 1) {
                            mma_tf32(acc[mt][nt], al[mt], bh[nt]);
                            mma_tf32(acc[mt][nt], ah[mt], bl[nt]);
                        }
                        mma_tf32(acc[mt][nt], ah[mt], bh[nt]);
                    }
            }
        }
        // Scores |c|^2 - 2 x.c of this tile's centroids into each row's top-2.
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
                            float s = fmaf(-2.0f, acc[mt][nt][h * 2 + e], cn);
                            top2_insert(s, (int)col, b1[r], i1[r], b2[r], i2[r]);
                        }
                }
            }
    }
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
    if (od < dist || (od == dist && oj < j)) { dist = od; j = oj; }
    if (grow < n && which == 0) {
        out_index[ioff + grow * is] = (u32)j;
        out_dist[doff + grow * ds] = dist;
    }
}

extern "C" __global__ void __launch_bounds__(256)
nearest_tf32(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit, i64 d,
             const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds) {
    nearest_tc_impl<1>(x, n, xr, c, m, cr, d, cnorm, out_index, ioff, is, out_dist, doff, ds);
}

extern "C" __global__ void __launch_bounds__(256)
nearest_3xtf32(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit, i64 d,
             const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds) {
    nearest_tc_impl<3>(x, n, xr, c, m, cr, d, cnorm, out_index, ioff, is, out_dist, doff, ds);
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
