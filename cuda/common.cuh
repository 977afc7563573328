// Shared by every kernel file: dtype codes and conversions, the strided walk, fault reporting,
// Philox. No CUDA headers are included, so the same text also serves as NVRTC's prelude
// (crates/backend-cuda/src/program.rs), where no toolkit headers exist.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;
typedef unsigned long long u64;

// Programmatic dependent launch (Hopper and newer; compiled only into the compute_90 PTX of the
// files xtask builds for both targets). The first statement of each kernel there: let the next
// kernel in the stream begin launching now (`launch_dependents`), then wait until the kernels
// before this one have finished and their writes are visible (`wait`) before touching memory.
// The backend launches only those kernels with the programmatic-serialization attribute, so a
// chain of small kernels overlaps each launch with the previous kernel's run.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_DEPENDENCY() asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;" ::: "memory")
#else
#define GRID_DEPENDENCY()
#endif

// Dtype codes: the order of hal::DType as the backend numbers it (lib.rs, `dtype_code`).
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_I32 3
#define DT_U32 4

__device__ __forceinline__ bool is_nan_f(float v) { return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ float nan_f() { return __uint_as_float(0x7fc00000u); }

// f16 and bf16 in integer arithmetic, bit for bit as the `half` crate on the CPU (NaN payloads
// included), so copies agree exactly with the reference.
__device__ __forceinline__ float f16_to_f32(u32 h) {
    u32 sign = (h & 0x8000u) << 16;
    u32 e = (h >> 10) & 0x1fu;
    u32 m = h & 0x3ffu;
    if (e == 0u) {
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (e == 31u) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ u32 f32_to_f16(float v) {
    u32 x = __float_as_uint(v);
    u32 sign = (x >> 16) & 0x8000u;
    int e = (int)((x >> 23) & 0xffu);
    u32 m = x & 0x7fffffu;
    if (e == 255) return m ? (sign | 0x7e00u | (m >> 13)) : (sign | 0x7c00u);
    int ne = e - 112;
    if (ne >= 31) return sign | 0x7c00u;
    if (ne <= 0) {
        if (ne < -10) return sign;
        u32 mm = m | 0x800000u;
        u32 shift = (u32)(14 - ne);
        u32 half = 1u << (shift - 1u);
        u32 rest = mm & ((1u << shift) - 1u);
        u32 r = mm >> shift;
        if (rest > half || (rest == half && (r & 1u))) r += 1u;
        return sign | r;
    }
    u32 r = ((u32)ne << 10) | (m >> 13);
    u32 rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) r += 1u;
    return sign | r;
}
// f16 widened in one instruction, for arithmetic: exact for every value, but NaN payloads
// are not kept (copies use the integer form above), at a dozen instructions less.
__device__ __forceinline__ float f16_widen(u32 h) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"((unsigned short)h));
    return r;
}
__device__ __forceinline__ float bf16_to_f32(u32 h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ u32 f32_to_bf16(float v) {
    u32 b = __float_as_uint(v);
    if (is_nan_f(v)) return (b >> 16) | 0x40u;
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

// Float to integer as Rust's `as`: truncate toward zero, saturate, NaN gives 0.
__device__ __forceinline__ int f2i(float v) {
    if (is_nan_f(v)) return 0;
    if (v >= 2147483647.0f) return 2147483647;
    if (v <= -2147483648.0f) return (-2147483647 - 1);
    return (int)v;
}
__device__ __forceinline__ u32 f2u(float v) {
    if (is_nan_f(v) || v <= 0.0f) return 0u;
    if (v >= 4294967295.0f) return 4294967295u;
    return (u32)v;
}

__device__ __forceinline__ float load_f(const void* p, int dt, i64 i) {
    switch (dt) {
        case DT_F32: return ((const float*)p)[i];
        case DT_F16: return f16_to_f32(((const u16*)p)[i]);
        case DT_BF16: return bf16_to_f32(((const u16*)p)[i]);
        case DT_I32: return (float)((const int*)p)[i];
        default: return (float)((const u32*)p)[i];
    }
}
__device__ __forceinline__ void store_f(void* p, int dt, i64 i, float v) {
    switch (dt) {
        case DT_F32: ((float*)p)[i] = v; break;
        case DT_F16: ((u16*)p)[i] = (u16)f32_to_f16(v); break;
        case DT_BF16: ((u16*)p)[i] = (u16)f32_to_bf16(v); break;
        case DT_I32: ((int*)p)[i] = f2i(v); break;
        default: ((u32*)p)[i] = f2u(v); break;
    }
}
// An index operand (i32 or u32) as a signed 64-bit value.
__device__ __forceinline__ i64 load_index(const void* p, int dt, i64 i) {
    return dt == DT_I32 ? (i64)((const int*)p)[i] : (i64)((const u32*)p)[i];
}

// A strided walk over an output shape for up to four operands: element `i` of the row-major
// order sits at `off[k] + sum_d coord_d * st[k][d]` in operand k. The host merges dimensions
// first (lib.rs, `Walk`), so contiguous operands arrive as rank 1.
#define MAXR 8
struct Walk {
    int rank;
    int pad_;
    i64 n;
    i64 shape[MAXR];
    i64 st[4][MAXR];
    i64 off[4];
};

template <int K>
__device__ __forceinline__ void walk_offsets(const Walk& w, i64 i, i64* o) {
#pragma unroll
    for (int k = 0; k < K; ++k) o[k] = w.off[k];
    if (w.n <= 0x7fffffff) {
        // Every index of the walk fits in 32 bits: 32-bit quotients, as a 64-bit division
        // costs several times more (a broadcast add over the 6.4M elements of a LeNet
        // convolution's output spent most of its time on them).
        u32 r = (u32)i;
        for (int d = w.rank - 1; d >= 0; --d) {
            const u32 s = (u32)w.shape[d], q = r / s, c = r - q * s;
            r = q;
#pragma unroll
            for (int k = 0; k < K; ++k) o[k] += (i64)c * w.st[k][d];
        }
        return;
    }
    for (int d = w.rank - 1; d >= 0; --d) {
        i64 s = w.shape[d];
        i64 c = i % s;
        i /= s;
#pragma unroll
        for (int k = 0; k < K; ++k) o[k] += c * w.st[k][d];
    }
}

// Division by a divisor fixed for a launch, as a multiply-high, an add and a shift (the host
// makes `m` and `s`: `FastDiv::new` in backend-cuda's walk.rs); exact for n < 2^31.
struct FastDiv {
    u32 d, m, s, pad_;
};
__device__ __forceinline__ u32 fast_div(const FastDiv& f, u32 n) { return (__umulhi(n, f.m) + n) >> f.s; }

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// The device's fault record: [claimed, index, bound, op code]. The first fault claims it; the
// host reads it at the next synchronize and turns it into hal::Error (`hal::fault::FAULT_OPS`).
__device__ __forceinline__ void report_fault(u32* fault, i64 index, i64 bound, u32 op) {
    if (atomicExch(&fault[0], 1u) == 0u) {
        fault[1] = (u32)index;
        fault[2] = (u32)bound;
        fault[3] = op;
        __threadfence();
    }
}

// Philox 4x32-10, as hal::random.
__device__ __forceinline__ void philox(u32 c[4], u32 k0, u32 k1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        u32 hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        u32 hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        u32 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

// Word 0 of Philox under key (k0, k1) at counter (c0, c1, 0, 0), for the IR's RandomBits.
__device__ __forceinline__ u32 random_bits(u32 k0, u32 k1, u32 c0, u32 c1) {
    u32 c[4] = {c0, c1, 0u, 0u};
    philox(c, k0, k1);
    return c[0];
}

__device__ __forceinline__ float erf_approx(float x) {
    float t = 1.0f / (1.0f + 0.3275911f * fabsf(x));
    float poly = t * (0.2548296f + t * (-0.28449674f + t * (1.4214137f + t * (-1.4531521f + t * 1.0614054f))));
    float r = 1.0f - poly * expf(-x * x);
    return x < 0.0f ? -r : r;
}

// An atomic float add at element i of a buffer of dtype dt; 16-bit dtypes by compare-and-swap
// on the aligned word that holds the element (the buffer's base is 256-byte aligned).
__device__ __forceinline__ void atomic_add_f(void* p, int dt, i64 i, float v) {
    if (dt == DT_F32) {
        atomicAdd(((float*)p) + i, v);
        return;
    }
    u16* h = ((u16*)p) + i;
    u32* word = (u32*)((u64)h & ~(u64)3);
    u32 shift = ((u64)h & 2) ? 16u : 0u;
    u32 old = *word, assumed;
    do {
        assumed = old;
        u32 bits = (assumed >> shift) & 0xffffu;
        float cur = dt == DT_F16 ? f16_to_f32(bits) : bf16_to_f32(bits);
        u32 nb = dt == DT_F16 ? f32_to_f16(cur + v) : f32_to_bf16(cur + v);
        u32 next = (assumed & ~(0xffffu << shift)) | (nb << shift);
        old = atomicCAS(word, assumed, next);
    } while (old != assumed);
}

// Warp sums.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Adds `part` to `total` with Kahan compensation (`comp` carries what the last add lost), in
// explicitly rounded operations so the compiler can neither fuse nor reassociate them away.
__device__ __forceinline__ void kahan_add(float& total, float& comp, float part) {
    const float y = __fsub_rn(part, comp);
    const float t = __fadd_rn(total, y);
    comp = __fsub_rn(__fsub_rn(t, total), y);
    total = t;
}

// f64 operands (DT_F64): element i as a double (every dtype widened exactly), and a double
// stored into any dtype (rounded once to a narrower float; integers truncated toward zero
// and saturated, NaN as 0).
#define DT_F64 5
__device__ __forceinline__ double load_d(const void* p, int dt, i64 i) {
    switch (dt) {
        case DT_F64: return ((const double*)p)[i];
        case DT_I32: return (double)((const int*)p)[i];
        case DT_U32: return (double)((const u32*)p)[i];
        default: return (double)load_f(p, dt, i);
    }
}
__device__ __forceinline__ void store_d(void* p, int dt, i64 i, double v) {
    switch (dt) {
        case DT_F64: ((double*)p)[i] = v; break;
        case DT_I32: ((int*)p)[i] = v != v ? 0 : v >= 2147483647.0 ? 2147483647 : v <= -2147483648.0 ? (int)0x80000000u : (int)v; break;
        case DT_U32: ((u32*)p)[i] = v != v || v <= 0.0 ? 0u : v >= 4294967295.0 ? 4294967295u : (u32)v; break;
        default: store_f(p, dt, i, (float)v);
    }
}
