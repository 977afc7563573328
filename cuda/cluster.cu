// Nearest-centroid search, exact mode: distances by a register-tiled f32 GEMM (128 points x 128
// centroids per block, 8 x 8 per thread) fused with the argmin, so no n x m matrix is written.
// The argmin compares |c|^2 - 2 x.c (|x|^2 is the same for every centroid); the winner's
// distance is then recomputed directly as sum_k (x_k - c_k)^2.
#include "common.cuh"
#include "tf32.cuh"

// norms[j] = sum_k c[j, k]^2 for j < m, and NaN (all-ones bits) for the padding rows
// m <= j < padded, which no score can win with. Also sets the `clear_words` words at `clear`
// to 0: the scales that the absmax passes after it raise (one launch fewer than a memset).
extern "C" __global__ void row_norms(const float* c, i64 m, i64 d, i64 rs, i64 cs, float* norms, i64 padded, u32* clear,
                                     int clear_words) {
    if (blockIdx.x == 0 && (int)threadIdx.x < clear_words) clear[threadIdx.x] = 0u;
    i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
    for (i64 j = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; j < padded; j += warps) {
        if (j >= m) {
            if ((threadIdx.x & 31) == 0) norms[j] = __uint_as_float(0xffffffffu);
            continue;
        }
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
// accumulated, which ranks as accurately as f32 arithmetic. Exact mode where a device cannot
// lend the split f16 kernels below their shared memory (they run the same three passes at
// about three times the rate; docs/PERF.md, tuning evidence).
// Needs contiguous rows (unit column stride, row stride and d multiples of 4, 16-byte aligned);
// the host falls back to nearest_exact otherwise. The entry points take nearest_exact's
// parameters, the column strides (1 here) included, so the host passes one list to either.
#define TBM 128
#define TBN 128
#define TBK 32
#define TLD (TBK + 4)

// A warp tile's accumulators to zero; a thread's four rows' top-2 to empty.
__device__ __forceinline__ void zero_acc(float (&acc)[2][8][4]) {
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[a][b][q] = 0.0f;
}
__device__ __forceinline__ void top2_init(float (&b1)[4], int (&i1)[4], float (&b2)[4], int (&i2)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        b1[r] = __int_as_float(0x7f800000); b2[r] = b1[r]; i1[r] = 0x7fffffff; i2[r] = 0x7fffffff;
    }
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
// the two candidates of each row are then compared by their f32 distance, a warp per 16 rows
// reading the rows whole (float4 a lane: these kernels have d % 4 == 0 and aligned rows). A
// row with no candidate (every score NaN) gets centroid 0 and its distance, as the reference
// would.
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
    // Rows warp*16 .. +15, four at a time: candidate a (the best, or centroid 0 when there is
    // none) and candidate b (the second best, when there is one).
#pragma unroll 1
    for (int r0 = warp * 16; r0 < warp * 16 + 16; r0 += 4) {
        int ja[4], jb[4];
        float da[4], db[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int row = r0 + q;
            float s1 = cand_s[row][0][0], s2 = cand_s[row][0][1];
            int j1 = cand_i[row][0][0], j2 = cand_i[row][0][1];
            top2_insert(cand_s[row][1][0], cand_i[row][1][0], s1, j1, s2, j2);
            top2_insert(cand_s[row][1][1], cand_i[row][1][1], s1, j1, s2, j2);
            ja[q] = j1 < m ? j1 : 0;
            jb[q] = j2;
            da[q] = 0.0f;
            db[q] = 0.0f;
        }
        // The four rows' coordinates in one sweep, so their loads are in flight together.
        for (i64 k = lane * 4; k < d; k += 128) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const i64 grow = m0 + r0 + q;
                if (grow >= n) continue;
                float4 xv = *(const float4*)&x[grow * xr + k];
                float4 ca = *(const float4*)&c[(i64)ja[q] * cr + k];
                float4 cb = jb[q] < m ? *(const float4*)&c[(i64)jb[q] * cr + k] : ca;
                float e0 = xv.x - ca.x, e1 = xv.y - ca.y, e2 = xv.z - ca.z, e3 = xv.w - ca.w;
                da[q] = fmaf(e0, e0, fmaf(e1, e1, fmaf(e2, e2, fmaf(e3, e3, da[q]))));
                e0 = xv.x - cb.x, e1 = xv.y - cb.y, e2 = xv.z - cb.z, e3 = xv.w - cb.w;
                db[q] = fmaf(e0, e0, fmaf(e1, e1, fmaf(e2, e2, fmaf(e3, e3, db[q]))));
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            for (int o = 16; o > 0; o >>= 1) {
                da[q] += __shfl_xor_sync(0xffffffffu, da[q], o);
                db[q] += __shfl_xor_sync(0xffffffffu, db[q], o);
            }
            const i64 grow = m0 + r0 + q;
            if (lane == 0 && grow < n) {
                int j = ja[q];
                float dist = da[q];
                const float od = jb[q] < m ? db[q] : INF;
                const int oj = jb[q];
                // A NaN distance is replaced by any number (the reference's rule).
                if (oj < m && (od < dist || (od == dist && oj < j) || (dist != dist && od == od))) {
                    dist = od;
                    j = oj;
                }
                out_index[ioff + grow * is] = (u32)j;
                out_dist[doff + grow * ds] = dist;
            }
        }
    }
}

// Scores |c|^2 + scale x.c (scale -2, or -2 undoing operand scales) of a 128 x 128 tile's
// centroids (from n0) into each of the thread's four rows' top-2, from the mma accumulators
// (warp tile wr, wc as in nearest_3xtf32; accumulator (mt, nt, q): row mt*16 + g + (q/2)*8,
// column nt*8 + 2t + q%2). `norm_at(column in tile)` gives |c|^2, NaN past the last centroid
// (a NaN score never enters). Branch-free: a thread meets its columns in rising order, so
// strict comparisons leave a tie to the lower index; selects rather than branches, because
// across a warp some lane nearly always has a score to insert.
template <typename NormAt>
__device__ __forceinline__ void score_tile(const float (&acc)[2][8][4], float scale, i64 n0, NormAt norm_at,
                                           float (&b1)[4], int (&i1)[4], float (&b2)[4], int (&i2)[4]) {
    const int lane = threadIdx.x & 31, wc = (threadIdx.x >> 5) & 1, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int cl = wc * 64 + nt * 8 + 2 * t + e;
            const float cn = norm_at(cl);
            const int col = (int)n0 + cl;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = mt * 2 + h;
                    const float s = fmaf(scale, acc[mt][nt][h * 2 + e], cn);
                    const bool lt1 = s < b1[r], lt2 = s < b2[r];
                    b2[r] = lt1 ? b1[r] : (lt2 ? s : b2[r]);
                    i2[r] = lt1 ? i1[r] : (lt2 ? col : i2[r]);
                    b1[r] = lt1 ? s : b1[r];
                    i1[r] = lt1 ? col : i1[r];
                }
        }
}

// norm_at for the kernels that read the norms from global memory.
struct GlobalNorms {
    const float* cnorm;
    i64 n0, m;
    __device__ __forceinline__ float operator()(int cl) const {
        return n0 + cl < m ? cnorm[n0 + cl] : __uint_as_float(0x7fc00000u);
    }
};

extern "C" __global__ void __launch_bounds__(256)
nearest_3xtf32(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit, i64 d,
               const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds) {
    __shared__ __align__(16) float As[TBM * TLD];
    __shared__ __align__(16) float Bs[TBN * TLD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wr = warp >> 1, wc = warp & 1;  // warp tile: rows wr*32.., cols wc*64..
    const i64 m0 = (i64)blockIdx.x * TBM;

    // Top-2 for the thread's four rows: (mt, half) -> rows wr*32 + mt*16 + g + half*8.
    float b1[4], b2[4];
    int i1[4], i2[4];
    top2_init(b1, i1, b2, i2);

    for (i64 n0 = 0; n0 < m; n0 += TBN) {
        float acc[2][8][4];
        zero_acc(acc);
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
        score_tile(acc, -2.0f, n0, GlobalNorms{cnorm, n0, m}, b1, i1, b2, i2);
    }
    top2_finish(b1, b2, i1, i2, x, n, xr, c, m, cr, d, m0, out_index, ioff, is, out_dist, doff, ds);
}

// ----- f16 tensor-core search (Precision::Fast) -----
// As the TF32 search, with operands rounded to f16 while they are staged (once per element and
// block, not per fragment) and mma.sync m16n8k16: twice the products per instruction and half
// the shared memory. f16's range is made to fit: each operand is scaled by a power of two that
// brings its largest finite magnitude just under 2^15 (absmax_rows_pair measured it first; 1 where
// it is 0), and the scores undo the scales exactly. Non-finite coordinates stay non-finite and
// make their scores NaN or infinite, as in f32.
#define HLD (TBK + 8)

// The largest finite |v| of a [rows, cols] matrix (strides rs, cs) into *out as float bits
// (atomicMax on the bits orders non-negative floats), over blocks `block` of `blocks`. *out
// must start at 0. Non-finite values are passed over, so one NaN or infinity does not cost
// every other value its scaling.
__device__ __forceinline__ void absmax_impl(const float* v, i64 rows, i64 cols, i64 rs, i64 cs, u32* out, i64 block,
                                            i64 blocks) {
    __shared__ float part[32];
    float mx = 0.0f;
    const i64 total = rows * cols;
    // Contiguous rows need no division per element.
    const bool flat = cs == 1 && rs == cols;
    for (i64 i = block * blockDim.x + threadIdx.x; i < total; i += blocks * blockDim.x) {
        float a = fabsf(v[flat ? i : (i / cols) * rs + (i % cols) * cs]);
        if (a > mx && a < __int_as_float(0x7f800000)) mx = a;
    }
    // One atomic per block (one per warp on a single word was most of this kernel's time).
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = mx;
    __syncthreads();
    if (threadIdx.x < 32) {
        mx = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (threadIdx.x == 0) atomicMax(out, __float_as_uint(mx));
    }
}

// absmax_rows of two matrices in one launch (the points' and the centroids' scales of a
// search): the first `first_blocks` blocks take the first, the rest the second, each into its
// own word.
extern "C" __global__ void absmax_rows_pair(const float* v0, i64 rows0, i64 cols0, i64 rs0, i64 cs0, u32* out0,
                                            const float* v1, i64 rows1, i64 cols1, i64 rs1, i64 cs1, u32* out1,
                                            i64 first_blocks) {
    if ((i64)blockIdx.x < first_blocks)
        absmax_impl(v0, rows0, cols0, rs0, cs0, out0, blockIdx.x, first_blocks);
    else
        absmax_impl(v1, rows1, cols1, rs1, cs1, out1, blockIdx.x - first_blocks, gridDim.x - first_blocks);
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

// nearest_3xtf32's parameters, then `scales`: absmax_rows_pair's words for x and for c. Any d; the
// operands are staged through registers (rounded to f16 there) one k-step at a time, in 24 KiB
// of static shared memory: the fast mode of devices that cannot lend the held or streamed
// kernels below their dynamic shared memory (the host's NearestPlan decides).
__device__ __forceinline__ void nearest_f16_impl(const float* x, i64 n, i64 xr, const float* c, i64 m, i64 cr,
                                                 i64 d, const float* cnorm, u32* out_index, i64 ioff, i64 is,
                                                 float* out_dist, i64 doff, i64 ds, const u32* scales) {
    // Rows of TBK halves padded to HLD: the fragment loads of a lane group (rows g, words t)
    // fall in distinct banks.
    __shared__ __align__(16) u32 As[TBM * HLD / 2];
    __shared__ __align__(16) u32 Bs[TBN * HLD / 2];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wr = warp >> 1, wc = warp & 1;  // warp tile: rows wr*32.., cols wc*64..
    const i64 m0 = (i64)blockIdx.x * TBM;
    const float sx = f16_scale(scales[0]), sc = f16_scale(scales[1]);
    // score = |c|^2 - 2 x.c, with x.c = acc / (sx sc): exact, the scales being powers of two.
    const float back = -2.0f / (sx * sc);

    float b1[4], b2[4];
    int i1[4], i2[4];
    top2_init(b1, i1, b2, i2);
    // A tile of 128 rows by 32 of k (from k0), scaled and rounded to f16, into `dst`.
    auto stage = [&](u32* dst, const float* src, i64 rs, i64 row0, i64 rows, i64 k0, float sv) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int idx = q * 256 + tid;
            int r = idx >> 3, kq = (idx & 7) * 4;
            i64 k = k0 + kq;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row0 + r < rows && k < d) v = *(const float4*)&src[(row0 + r) * rs + k];
            *(uint2*)&dst[(r * HLD + kq) / 2] =
                make_uint2(pack_f16x2(v.x * sv, v.y * sv), pack_f16x2(v.z * sv, v.w * sv));
        }
    };

    for (i64 n0 = 0; n0 < m; n0 += TBN) {
        float acc[2][8][4];
        zero_acc(acc);
        for (i64 k0 = 0; k0 < d; k0 += TBK) {
            __syncthreads();
            stage(As, x, xr, m0, n, k0, sx);
            stage(Bs, c, cr, n0, m, k0, sc);
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < TBK; kk += 16) {
                u32 a[2][4], b[8][2];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    int r0 = wr * 32 + mt * 16 + g;
                    a[mt][0] = As[(r0 * HLD + kk) / 2 + t];
                    a[mt][1] = As[((r0 + 8) * HLD + kk) / 2 + t];
                    a[mt][2] = As[(r0 * HLD + kk) / 2 + t + 4];
                    a[mt][3] = As[((r0 + 8) * HLD + kk) / 2 + t + 4];
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
        score_tile(acc, back, n0, GlobalNorms{cnorm, n0, m}, b1, i1, b2, i2);
    }
    top2_finish(b1, b2, i1, i2, x, n, xr, c, m, cr, d, m0, out_index, ioff, is, out_dist, doff, ds);
}

// Two blocks per multiprocessor (at most 128 registers a thread).
extern "C" __global__ void __launch_bounds__(256, 2)
nearest_f16(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit, i64 d,
            const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds,
            const u32* scales) {
    nearest_f16_impl(x, n, xr, c, m, cr, d, cnorm, out_index, ioff, is, out_dist, doff, ds, scales);
}

// ----- held searches: d <= HOLD_D, points held, centroids packed and copied ahead -----
// A block's 128 points are staged once (scaled, rounded to f16) and held in shared memory for
// the whole sweep; the centroids come packed beforehand (pack_f16_scaled: f16, scaled, rows of
// `dp` halves, padded to whole tiles) and each next 128-centroid tile is copied in whole by
// cp.async while the current one is multiplied, so a tile costs two barriers and no register
// staging. Fragments are read with ldmatrix. SPLIT (exact mode): every operand is also held
// as an f16 remainder (v - hi, rounded), and hi*hi + hi*lo + lo*hi are accumulated: 22
// significant bits a product, as three TF32 passes give, at f16's rate; the two best
// candidates are re-checked in f32 in both modes.
// Dynamic shared memory: (1 + SPLIT) x (points + two centroid tiles) of 128 rows of dp + 8
// halves (rows padded so ldmatrix's eight row reads fall in distinct banks). `cnorm` must hold
// whole tiles, NaN past the last centroid, and be 16-byte aligned: it is copied with the tiles.
#define HOLD_D 128

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// f16 of v and of its remainder v - f16(v).
__device__ __forceinline__ void split_f16(float v, u16& hi, u16& lo) {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hi) : "f"(v));
    float back;
    asm("cvt.f32.f16 %0, %1;" : "=f"(back) : "h"(hi));
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(lo) : "f"(v - back));
}

// One k-step of 16 of a warp's 32 x 64 tile from shared memory: the A fragments of its two
// 16-row blocks and the B fragments of its eight 8-centroid blocks by ldmatrix (addresses as
// set up by the callers, rows of `ld` halves, `kk` halves in), then the products. SPLIT: the
// remainders' planes lie `lo` halves after the high parts; the cross terms go first (they are
// the small ones).
__device__ __forceinline__ void load_fragments(u32 (&a)[2][4], u32 (&b)[8][2], u32 a_base, u32 b_base, int ld,
                                               int kk) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) ldmatrix_x4(a[mt], a_base + 2 * (mt * 16 * ld + kk));
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        u32 r[4];
        ldmatrix_x4(r, b_base + 2 * (p * 16 * ld + kk));
        b[2 * p][0] = r[0]; b[2 * p][1] = r[1]; b[2 * p + 1][0] = r[2]; b[2 * p + 1][1] = r[3];
    }
}

template <bool SPLIT>
__device__ __forceinline__ void mma_step(float (&acc)[2][8][4], u32 a_base, u32 b_base, int ld, int lo, int kk) {
    u32 a[2][4], b[8][2];
    load_fragments(a, b, a_base, b_base, ld, kk);
    if (SPLIT) {
        u32 al[2][4], bl[8][2];
        load_fragments(al, bl, a_base + 2 * lo, b_base + 2 * lo, ld, kk);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                mma_f16(acc[mt][nt], al[mt], b[nt]);
                mma_f16(acc[mt][nt], a[mt], bl[nt]);
            }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) mma_f16(acc[mt][nt], a[mt], b[nt]);
}

template <bool SPLIT>
__device__ __forceinline__ void nearest_held_impl(const float* x, i64 n, i64 xr, const float* c, i64 m, i64 cr,
                                                  i64 d, const float* cnorm, u32* out_index, i64 ioff, i64 is,
                                                  float* out_dist, i64 doff, i64 ds, const u32* scales,
                                                  const u16* ch, i64 dp) {
    extern __shared__ __align__(16) u16 held[];
    const int ld = (int)dp + 8;                     // halves a row
    const int plane = TBM * ld;                     // halves a 128-row tile
    u16* xs = held;                                 // points: hi, then lo (SPLIT)
    u16* cs = held + (SPLIT ? 2 : 1) * plane;       // centroid buffer s at cs + s * (1 + SPLIT) * plane
    const int cstride = (SPLIT ? 2 : 1) * plane;
    const i64 cplane = (m + TBN - 1) / TBN * TBN * dp;  // halves of one packed plane (hi or lo)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wr = warp >> 1, wc = warp & 1;  // warp tile: rows wr*32.., cols wc*64..
    const i64 m0 = (i64)blockIdx.x * TBM;
    const float sx = f16_scale(scales[0]), sc = f16_scale(scales[1]);
    const float back = -2.0f / (sx * sc);

    // The next centroid tile (rows n0..n0+127 of the packed planes) into buffer `s`.
    const int chunks = TBN * (int)dp / 8;  // 16-byte pieces a plane
    const int row_chunks = (int)dp / 8;
    __shared__ __align__(16) float norms_s[2][TBN];
    auto fetch = [&](i64 n0, int s) {
        if (tid < TBN / 4) cp_async16(smem_addr(&norms_s[s][tid * 4]), cnorm + n0 + tid * 4);
        for (int i = tid; i < chunks; i += 256) {
            int r = i / row_chunks, q = i - r * row_chunks;
            const u16* src = ch + (n0 + r) * dp + q * 8;
            u16* dst = cs + s * cstride + r * ld + q * 8;
            cp_async16(smem_addr(dst), src);
            if (SPLIT) cp_async16(smem_addr(dst + plane), src + cplane);
        }
    };
    fetch(0, 0);
    cp_async_commit();
    // The points, scaled and rounded (and split), four coordinates a thread at a time.
    for (int i = tid; i < TBM * (int)dp / 4; i += 256) {
        int r = i / ((int)dp / 4), k = (i - r * ((int)dp / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (m0 + r < n && k < d) v = *(const float4*)&x[(m0 + r) * xr + k];
        float e[4] = {v.x * sx, v.y * sx, v.z * sx, v.w * sx};
        u16 hi[4], lo[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) split_f16(e[q], hi[q], lo[q]);
        *(uint2*)&xs[r * ld + k] = make_uint2(hi[0] | ((u32)hi[1] << 16), hi[2] | ((u32)hi[3] << 16));
        if (SPLIT)
            *(uint2*)&xs[plane + r * ld + k] = make_uint2(lo[0] | ((u32)lo[1] << 16), lo[2] | ((u32)lo[3] << 16));
    }

    float b1[4], b2[4];
    int i1[4], i2[4];
    top2_init(b1, i1, b2, i2);
    // ldmatrix addresses: lane l names row (l % 8) + 8 ((l / 8) % 2) of a 16-row A fragment at
    // column 8 (l / 16); for B, row (l % 8) + 8 (l / 16) of a 16-centroid pair at column
    // 8 ((l / 8) % 2), which yields b[nt][0], b[nt][1], b[nt+1][0], b[nt+1][1].
    const u32 a_base = smem_addr(xs + (wr * 32 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8);
    const int b_off = (wc * 64 + (lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8;

    int s = 0;
    for (i64 n0 = 0; n0 < m; n0 += TBN, s ^= 1) {
        if (n0 + TBN < m) fetch(n0 + TBN, s ^ 1);
        cp_async_commit();
        cp_async_wait_one();
        __syncthreads();
        const u32 b_base = smem_addr(cs + s * cstride + b_off);
        float acc[2][8][4];
        zero_acc(acc);
#pragma unroll 2
        for (int kk = 0; kk < (int)dp; kk += 16) mma_step<SPLIT>(acc, a_base, b_base, ld, plane, kk);
        const float* tile_norms = norms_s[s];
        score_tile(acc, back, n0, [&](int cl) { return tile_norms[cl]; }, b1, i1, b2, i2);
        // Every warp is done with buffer s before the next iteration's fetch overwrites it.
        __syncthreads();
    }
    top2_finish(b1, b2, i1, i2, x, n, xr, c, m, cr, d, m0, out_index, ioff, is, out_dist, doff, ds);
}

// Fast mode: two blocks per multiprocessor (at most 128 registers a thread; 104 KiB of shared
// memory each at d = 128).
extern "C" __global__ void __launch_bounds__(256, 2)
nearest_f16_held(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit, i64 d,
                 const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds,
                 const u32* scales, const u16* ch, i64 dp) {
    nearest_held_impl<false>(x, n, xr, c, m, cr, d, cnorm, out_index, ioff, is, out_dist, doff, ds, scales, ch,
                             dp);
}

// Exact mode: one block per multiprocessor (208 KiB of shared memory at d = 128).
extern "C" __global__ void __launch_bounds__(256, 1)
nearest_f16x3_held(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit,
                   i64 d, const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds,
                   const u32* scales, const u16* ch, i64 dp) {
    nearest_held_impl<true>(x, n, xr, c, m, cr, d, cnorm, out_index, ioff, is, out_dist, doff, ds, scales, ch,
                            dp);
}

// ----- streamed searches: any d, both operands packed, k-chunks copied STAGES - 1 ahead -----
// For d beyond HOLD_D (the points no longer fit in shared memory): the points are packed like
// the centroids (pack_f16_scaled: rows of dp halves, dp a multiple of SK, rows padded to whole
// tiles), and the block walks (centroid tile, k-chunk) steps in order, each step's 128 x SK
// slices of points and centroids copied by cp.async STAGES - 1 steps ahead: one barrier a
// step. The accumulators of a centroid tile are scored after its last chunk. Layout of a
// plane: rows of `dp` halves; SPLIT: the remainders' plane follows (at rows_p * dp halves).
#define SK 32
#define SLD (SK + 8)

template <bool SPLIT, int STAGES>
__device__ __forceinline__ void nearest_stream_impl(const float* x, i64 n, i64 xr, const float* c, i64 m, i64 cr,
                                                    i64 d, const float* cnorm, u32* out_index, i64 ioff, i64 is,
                                                    float* out_dist, i64 doff, i64 ds, const u32* scales,
                                                    const u16* xh, const u16* ch, i64 dp) {
    extern __shared__ __align__(16) u16 streamed[];
    const int slice = TBM * SLD;                        // halves of one 128 x SK slice
    const int stage_halves = (SPLIT ? 4 : 2) * slice;   // points (hi, lo), centroids (hi, lo)
    const i64 xplane = (n + TBM - 1) / TBM * TBM * dp, cplane = (m + TBN - 1) / TBN * TBN * dp;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wr = warp >> 1, wc = warp & 1;
    const i64 m0 = (i64)blockIdx.x * TBM;
    const float back = -2.0f / (f16_scale(scales[0]) * f16_scale(scales[1]));
    const int chunks = (int)(dp / SK);
    const int tiles = (int)((m + TBN - 1) / TBN);
    const int steps = tiles * chunks;

    // Step `st` (tile st / chunks, chunk st % chunks) into stage `buf`: 128 rows x SK halves of
    // each operand plane, 16 bytes a copy, two copies a thread a plane.
    auto fetch = [&](int st, int buf) {
        if (st < steps) {
            const i64 n0 = (i64)(st / chunks) * TBN, k0 = (i64)(st % chunks) * SK;
            u16* dst = streamed + buf * stage_halves;
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const int i = q * 256 + tid, r = i >> 2, kq = (i & 3) * 8;
                const u16* xs = xh + (m0 + r) * dp + k0 + kq;
                const u16* cs = ch + (n0 + r) * dp + k0 + kq;
                cp_async16(smem_addr(dst + r * SLD + kq), xs);
                cp_async16(smem_addr(dst + (SPLIT ? 2 : 1) * slice + r * SLD + kq), cs);
                if (SPLIT) {
                    cp_async16(smem_addr(dst + slice + r * SLD + kq), xs + xplane);
                    cp_async16(smem_addr(dst + 3 * slice + r * SLD + kq), cs + cplane);
                }
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) fetch(st, st);

    float b1[4], b2[4];
    int i1[4], i2[4];
    top2_init(b1, i1, b2, i2);
    float acc[2][8][4];
    zero_acc(acc);
    // ldmatrix lanes as in nearest_held_impl, rows of SLD halves.
    const int a_off = (wr * 32 + (lane & 7) + ((lane >> 3) & 1) * 8) * SLD + (lane >> 4) * 8;
    const int b_off = (wc * 64 + (lane & 7) + (lane >> 4) * 8) * SLD + ((lane >> 3) & 1) * 8;

    for (int st = 0; st < steps; ++st) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
        __syncthreads();
        // The stage read one step ago is free: every warp has passed the barrier.
        fetch(st + STAGES - 1, (st + STAGES - 1) % STAGES);
        const u16* stage = streamed + (st % STAGES) * stage_halves;
        const u32 a_base = smem_addr(stage + a_off);
        const u32 b_base = smem_addr(stage + (SPLIT ? 2 : 1) * slice + b_off);
#pragma unroll
        for (int kk = 0; kk < SK; kk += 16) mma_step<SPLIT>(acc, a_base, b_base, SLD, slice, kk);
        if (st % chunks == chunks - 1) {
            const i64 n0 = (i64)(st / chunks) * TBN;
            score_tile(acc, back, n0, GlobalNorms{cnorm, n0, m}, b1, i1, b2, i2);
            zero_acc(acc);
        }
    }
    top2_finish(b1, b2, i1, i2, x, n, xr, c, m, cr, d, m0, out_index, ioff, is, out_dist, doff, ds);
}

// Fast mode, any d: four stages of 20 KiB, two blocks per multiprocessor.
extern "C" __global__ void __launch_bounds__(256, 2)
nearest_f16_stream(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit, i64 d,
                   const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds,
                   const u32* scales, const u16* ch, i64 dp, const u16* xh) {
    nearest_stream_impl<false, 4>(x, n, xr, c, m, cr, d, cnorm, out_index, ioff, is, out_dist, doff, ds, scales,
                                  xh, ch, dp);
}

// Exact mode, any d: three stages of 40 KiB.
extern "C" __global__ void __launch_bounds__(256, 1)
nearest_f16x3_stream(const float* x, i64 n, i64 xr, i64 xc_unit, const float* c, i64 m, i64 cr, i64 cc_unit,
                     i64 d, const float* cnorm, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff,
                     i64 ds, const u32* scales, const u16* ch, i64 dp, const u16* xh) {
    nearest_stream_impl<true, 3>(x, n, xr, c, m, cr, d, cnorm, out_index, ioff, is, out_dist, doff, ds, scales,
                                 xh, ch, dp);
}

// v [rows, cols] (strides rs, cs) times the power of two f16_scale(*scale) makes of the word, to
// f16 rows of `cols_p` halves, `rows_p` of them (the padding zero), two halves per word. With
// `split`, a second plane of rows_p * cols_p halves follows, holding each value's remainder
// (v - f16(v), rounded to f16).
extern "C" __global__ void pack_f16_scaled(const float* v, i64 rows, i64 cols, i64 rs, i64 cs, const u32* scale,
                                           i64 rows_p, i64 cols_p, u32* out, i64 split) {
    const float sv = f16_scale(*scale);
    const i64 words = rows_p * cols_p / 2;
    for (i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += (i64)gridDim.x * blockDim.x) {
        i64 r = (2 * w) / cols_p, k = (2 * w) % cols_p;
        float a = 0.0f, b = 0.0f;
        if (r < rows && k < cols) a = v[r * rs + k * cs] * sv;
        if (r < rows && k + 1 < cols) b = v[r * rs + (k + 1) * cs] * sv;
        u16 ah, al, bh, bl;
        split_f16(a, ah, al);
        split_f16(b, bh, bl);
        out[w] = ah | ((u32)bh << 16);
        if (split) out[words + w] = al | ((u32)bl << 16);
    }
}

// nearest_centroid under hal::Precision::Reproducible: one thread per point, each distance
// summed over k in order with fused multiply-adds from 0, the first strictly smaller distance
// kept (a NaN best is replaced by any number): the CPU reference's order of operations, so the
// result is bit-identical to it. Centroids pass through shared memory in tiles of RT rows;
// each thread keeps RT sums, so a search among a few centroids takes the narrow tiles (with
// 32, one centroid cost 32 times its arithmetic), and
// coordinates in slices of RD. A batch of searches (rank-3 views) takes one grid row per
// group: blockIdx.y moves every operand by its group stride (xg, cg, ig, dg).
template <int RT, int BT, int NT, int RD>
__device__ __forceinline__ void nearest_ordered_impl(const float* x, i64 n, i64 xr, i64 xc, const float* c, i64 m,
                                                     i64 cr, i64 cc, i64 d, u32* out_index, i64 ioff, i64 is,
                                                     float* out_dist, i64 doff, i64 ds, i64 xg, i64 cg, i64 ig,
                                                     i64 dg) {
    x += blockIdx.y * xg;
    c += blockIdx.y * cg;
    ioff += blockIdx.y * ig;
    doff += blockIdx.y * dg;
    __shared__ float tile[RT][RD];
    // The block's BT points pass through shared memory too, a slice of RD coordinates at a
    // time, loaded by all NT threads with their loads issued together (a thread walking its
    // own row waited on one load after another); rows padded by one word, so the BT threads
    // that compute, one per point, read without bank conflicts.
    __shared__ float points[BT][RD + 1];
    const i64 first = (i64)blockIdx.x * BT;
    const i64 row = first + threadIdx.x;
    const bool live = threadIdx.x < BT && row < n;
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
            for (int e = threadIdx.x; e < RT * RD; e += NT) {
                int jj = e / RD, kk = e % RD;
                tile[jj][kk] = (jj < width && kk < depth) ? c[(j0 + jj) * cr + (k0 + kk) * cc] : 0.0f;
            }
#pragma unroll 8
            for (int q = 0; q < BT * RD / NT; ++q) {
                const int e = threadIdx.x + q * NT;
                const int p = e / RD, kk = e % RD;
                points[p][kk] = (first + p < n && kk < depth) ? x[(first + p) * xr + (k0 + kk) * xc] : 0.0f;
            }
            __syncthreads();
            if (live) {
                for (int kk = 0; kk < depth; ++kk) {
                    const float xv = points[threadIdx.x][kk];
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

// Stages centroids j0 .. j0 + width (of TILE) into `tile` as rows of D (zeros past d and
// past width), between barriers; shared by the short-row kernels below.
template <int D, int TILE>
__device__ __forceinline__ void stage_short_tile(float4* tile, const float* c, i64 j0, int width, i64 d, i64 cr,
                                                 i64 cc) {
    __syncthreads();
    float* flat = reinterpret_cast<float*>(tile);
    for (int e = threadIdx.x; e < TILE * D; e += blockDim.x) {
        const int jj = e / D, kk = e % D;
        flat[e] = (jj < width && kk < d) ? c[(j0 + jj) * cr + kk * cc] : 0.0f;
    }
    __syncthreads();
}

// The reference order for short rows (d <= D, D a multiple of 4; a product quantiser's
// subspaces): each of the 256 threads of a block holds its point's coordinates in registers
// (zeros past d, whose terms add exactly nothing) and sweeps the group's centroids, staged in
// shared memory in tiles of 256 rows of D, reading each centroid as D / 4 broadcast vector
// loads. The tile-of-sums kernels above read shared memory once per multiply-add and would
// stage mostly padding here. blockIdx.y is the group (see nearest_ordered_impl).
template <int D>
__device__ __forceinline__ void nearest_short_impl(const float* x, i64 n, i64 xr, i64 xc, const float* c, i64 m,
                                                   i64 cr, i64 cc, i64 d, u32* out_index, i64 ioff, i64 is,
                                                   float* out_dist, i64 doff, i64 ds, i64 xg, i64 cg, i64 ig,
                                                   i64 dg) {
    constexpr int TILE = 256;
    __shared__ float4 tile[TILE * D / 4];
    x += blockIdx.y * xg;
    c += blockIdx.y * cg;
    ioff += blockIdx.y * ig;
    doff += blockIdx.y * dg;
    const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    float xv[D];
#pragma unroll
    for (int k = 0; k < D; ++k) xv[k] = (row < n && k < d) ? x[row * xr + k * xc] : 0.0f;
    float best = nan_f();
    i64 best_j = 0;
    for (i64 j0 = 0; j0 < m; j0 += TILE) {
        const int width = (int)min((i64)TILE, m - j0);
        stage_short_tile<D, TILE>(tile, c, j0, width, d, cr, cc);
#pragma unroll 4
        for (int jj = 0; jj < width; ++jj) {
            float acc = 0.0f;
#pragma unroll
            for (int q = 0; q < D / 4; ++q) {
                const float4 cv = tile[jj * (D / 4) + q];
                float t = __fsub_rn(xv[4 * q], cv.x);
                acc = __fmaf_rn(t, t, acc);
                t = __fsub_rn(xv[4 * q + 1], cv.y);
                acc = __fmaf_rn(t, t, acc);
                t = __fsub_rn(xv[4 * q + 2], cv.z);
                acc = __fmaf_rn(t, t, acc);
                t = __fsub_rn(xv[4 * q + 3], cv.w);
                acc = __fmaf_rn(t, t, acc);
            }
            if (acc < best || (is_nan_f(best) && !is_nan_f(acc))) {
                best = acc;
                best_j = j0 + jj;
            }
        }
    }
    if (row < n) {
        out_index[ioff + row * is] = (u32)best_j;
        out_dist[doff + row * ds] = best;
    }
}

#define NEAREST_SHORT(NAME, D)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        NAME(const float* x, i64 n, i64 xr, i64 xc, const float* c, i64 m, i64 cr, i64 cc, i64 d, u32* out_index, \
             i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds, i64 xg, i64 cg, i64 ig, i64 dg) {               \
        nearest_short_impl<D>(x, n, xr, xc, c, m, cr, cc, d, out_index, ioff, is, out_dist, doff, ds, xg, cg, ig,   \
                              dg);                                                                                \
    }
NEAREST_SHORT(nearest_short_4, 4)
NEAREST_SHORT(nearest_short_8, 8)
NEAREST_SHORT(nearest_short_16, 16)

// nearest_short_impl outside hal::Precision::Reproducible: the distance expanded as
// |c|^2 - 2 x.c (+ |x|^2 once, at the end), which hal allows, so each centroid costs one
// multiply-add per coordinate instead of a subtraction and a multiply-add (a product
// quantiser's search, 16 groups of 10,000 points against 256 centroids of 8, was bound by
// that arithmetic in the reference order). Each tile's |c|^2 are staged with it. Same launch
// shape.
template <int D>
__device__ __forceinline__ void nearest_short_expanded_impl(const float* x, i64 n, i64 xr, i64 xc, const float* c,
                                                            i64 m, i64 cr, i64 cc, i64 d, u32* out_index, i64 ioff,
                                                            i64 is, float* out_dist, i64 doff, i64 ds, i64 xg, i64 cg,
                                                            i64 ig, i64 dg) {
    constexpr int TILE = 256;
    __shared__ float4 tile[TILE * D / 4];
    __shared__ float norms[TILE];
    x += blockIdx.y * xg;
    c += blockIdx.y * cg;
    ioff += blockIdx.y * ig;
    doff += blockIdx.y * dg;
    const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    // -2 x, and |x|^2.
    float xm[D];
    float xn = 0.0f;
#pragma unroll
    for (int k = 0; k < D; ++k) {
        const float v = (row < n && k < d) ? x[row * xr + k * xc] : 0.0f;
        xn = __fmaf_rn(v, v, xn);
        xm[k] = -2.0f * v;
    }
    float best = nan_f();
    i64 best_j = 0;
    for (i64 j0 = 0; j0 < m; j0 += TILE) {
        const int width = (int)min((i64)TILE, m - j0);
        stage_short_tile<D, TILE>(tile, c, j0, width, d, cr, cc);
        const float* flat = reinterpret_cast<const float*>(tile);
        for (int jj = threadIdx.x; jj < width; jj += blockDim.x) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < D; ++k) s = __fmaf_rn(flat[jj * D + k], flat[jj * D + k], s);
            norms[jj] = s;
        }
        __syncthreads();
#pragma unroll 4
        for (int jj = 0; jj < width; ++jj) {
            float acc = norms[jj];
#pragma unroll
            for (int q = 0; q < D / 4; ++q) {
                const float4 cv = tile[jj * (D / 4) + q];
                acc = __fmaf_rn(xm[4 * q], cv.x, acc);
                acc = __fmaf_rn(xm[4 * q + 1], cv.y, acc);
                acc = __fmaf_rn(xm[4 * q + 2], cv.z, acc);
                acc = __fmaf_rn(xm[4 * q + 3], cv.w, acc);
            }
            if (acc < best || (is_nan_f(best) && !is_nan_f(acc))) {
                best = acc;
                best_j = j0 + jj;
            }
        }
    }
    if (row < n) {
        out_index[ioff + row * is] = (u32)best_j;
        // NaN stays NaN; rounding may leave a tiny negative where the point is a centroid.
        out_dist[doff + row * ds] = is_nan_f(best) ? best : fmaxf(best + xn, 0.0f);
    }
}

#define NEAREST_SHORT_EXPANDED(NAME, D)                                                                            \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        NAME(const float* x, i64 n, i64 xr, i64 xc, const float* c, i64 m, i64 cr, i64 cc, i64 d, u32* out_index, \
             i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds, i64 xg, i64 cg, i64 ig, i64 dg) {               \
        nearest_short_expanded_impl<D>(x, n, xr, xc, c, m, cr, cc, d, out_index, ioff, is, out_dist, doff, ds, xg,  \
                                       cg, ig, dg);                                                               \
    }
NEAREST_SHORT_EXPANDED(nearest_short_expanded_4, 4)
NEAREST_SHORT_EXPANDED(nearest_short_expanded_8, 8)
NEAREST_SHORT_EXPANDED(nearest_short_expanded_16, 16)

// nearest_centroid among a few centroids outside hal::Precision::Reproducible: a warp per
// point, its lanes splitting the coordinates (coalesced loads), the sums combined by shuffles,
// so no thread walks a row alone (k-means++ asks for one centroid at a time).
extern "C" __global__ void nearest_few(const float* x, i64 n, i64 xr, i64 xc, const float* c, i64 m, i64 cr, i64 cc,
                                       i64 d, u32* out_index, i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds) {
    const int lane = threadIdx.x & 31;
    const i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
    for (i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < n; row += warps) {
        float best = nan_f();
        i64 best_j = 0;
        for (i64 j = 0; j < m; ++j) {
            float acc = 0.0f;
            for (i64 k = lane; k < d; k += 32) {
                const float t = x[row * xr + k * xc] - c[j * cr + k * cc];
                acc = fmaf(t, t, acc);
            }
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (acc < best || (is_nan_f(best) && !is_nan_f(acc))) {
                best = acc;
                best_j = j;
            }
        }
        if (lane == 0) {
            out_index[ioff + row * is] = (u32)best_j;
            out_dist[doff + row * ds] = best;
        }
    }
}

// Launched with NT threads per block, BT points each, and a grid row per group.
#define NEAREST_ORDERED(NAME, RT, BT, NT, RD)                                                                      \
    extern "C" __global__ void __launch_bounds__(NT)                                                              \
        NAME(const float* x, i64 n, i64 xr, i64 xc, const float* c, i64 m, i64 cr, i64 cc, i64 d, u32* out_index, \
             i64 ioff, i64 is, float* out_dist, i64 doff, i64 ds, i64 xg, i64 cg, i64 ig, i64 dg) {               \
        nearest_ordered_impl<RT, BT, NT, RD>(x, n, xr, xc, c, m, cr, cc, d, out_index, ioff, is, out_dist, doff, ds, \
                                             xg, cg, ig, dg);                                                     \
    }
NEAREST_ORDERED(nearest_ordered, 32, 128, 256, 64)
NEAREST_ORDERED(nearest_ordered_8, 8, 64, 256, 64)
NEAREST_ORDERED(nearest_ordered_1, 1, 64, 256, 64)

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
// at the end. As separate calls a step took three launches.
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
