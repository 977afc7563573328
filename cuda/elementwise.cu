// Elementwise primitives over strided, broadcast views: fill, copy (and cast), unary, binary,
// ternary; contiguous f32 fast paths with 16-byte loads; an empty kernel for launch timing.
// Op codes follow hal's enums in declaration order (lib.rs, `unary_code`, `BinaryOp::ALL`).
// Built twice (xtask's DUAL_TARGET): the compute_90 PTX has every kernel open with
// GRID_DEPENDENCY, and the backend launches it with programmatic dependent launch on Hopper.
#include "common.cuh"

// `op` applied to each of N values, the operation chosen once for all of them (a switch per
// element is an indirect branch per element).
#define EACH(...)                                                   \
    {                                                               \
        _Pragma("unroll") for (int j = 0; j < N; ++j) {             \
            const float x = v[j];                                   \
            v[j] = (__VA_ARGS__);                                   \
        }                                                           \
    }                                                               \
    break
template <int N> __device__ __forceinline__ void unary_apply_n(int op, float (&v)[N], float p0, float p1) {
    switch (op) {
        case 0: EACH(-x);
        case 1: EACH(fabsf(x));
        case 2: EACH(expf(x));
        case 3: EACH(exp2f(x));
        case 4: EACH(logf(x));
        case 5: EACH(log2f(x));
        case 6: EACH(sqrtf(x));
        case 7: EACH(1.0f / sqrtf(x));
        case 8: EACH(1.0f / x);
        case 9: EACH(sinf(x));
        case 10: EACH(cosf(x));
        case 11: EACH(tanhf(x));
        case 12: EACH(1.0f / (1.0f + expf(-x)));
        case 13: EACH(x < 0.0f ? 0.0f : x);
        case 14: EACH(x < 0.0f ? p0 * x : x);
        case 15: EACH(0.5f * x * (1.0f + erf_approx(x * 0.70710678118654752f)));
        case 16: EACH(x / (1.0f + expf(-x)));
        case 17: EACH(floorf(x));
        case 18: EACH(ceilf(x));
        case 19: EACH(rintf(x));
        case 20: EACH(x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x));
        case 21: EACH(x * x);
        case 22: EACH(fmaf(p0, x, p1));
        case 24: EACH(0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))));
        default: EACH(is_nan_f(x) ? x : fminf(fmaxf(x, p0), p1));  // 23: clamp
    }
}
#undef EACH

__device__ __forceinline__ float unary_apply(int op, float x, float p0, float p1) {
    float v[1] = {x};
    unary_apply_n<1>(op, v, p0, p1);
    return v[0];
}
__device__ __forceinline__ float4 unary4(int op, float4 v, float p0, float p1) {
    float e[4] = {v.x, v.y, v.z, v.w};
    unary_apply_n<4>(op, e, p0, p1);
    return make_float4(e[0], e[1], e[2], e[3]);
}

__device__ __forceinline__ float binary_apply(int op, float a, float b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: {
            float r = fmodf(a, b);
            return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
        }
        case 5: return powf(a, b);
        case 6: return (is_nan_f(a) || is_nan_f(b)) ? nan_f() : fmaxf(a, b);
        case 7: return (is_nan_f(a) || is_nan_f(b)) ? nan_f() : fminf(a, b);
        case 8: return atan2f(a, b);
        case 9: return a == b ? 1.0f : 0.0f;
        case 10: return a != b ? 1.0f : 0.0f;
        case 11: return a < b ? 1.0f : 0.0f;
        case 12: return a <= b ? 1.0f : 0.0f;
        case 13: return a > b ? 1.0f : 0.0f;
        default: return a >= b ? 1.0f : 0.0f;
    }
}

__device__ __forceinline__ float ternary_apply(int op, float a, float b, float c) {
    switch (op) {
        case 0: return a != 0.0f ? b : c;
        case 1: return fmaf(a, b, c);
        default: return fmaf(a, c - b, b);
    }
}

extern "C" __global__ void empty_kernel() { GRID_DEPENDENCY(); }

extern "C" __global__ void fill_kernel(Walk w, void* out, int esize, u32 bits) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[1];
        walk_offsets<1>(w, i, o);
        if (esize == 4) ((u32*)out)[o[0]] = bits;
        else ((u16*)out)[o[0]] = (u16)bits;
    }
}

extern "C" __global__ void copy_kernel(Walk w, void* out, int odt, const void* src, int sdt) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[2];
        walk_offsets<2>(w, i, o);
        if (odt == sdt) {
            if (odt == DT_F16 || odt == DT_BF16) ((u16*)out)[o[0]] = ((const u16*)src)[o[1]];
            else ((u32*)out)[o[0]] = ((const u32*)src)[o[1]];
        } else if ((odt == DT_I32 || odt == DT_U32) && (sdt == DT_I32 || sdt == DT_U32)) {
            i64 v = load_index(src, sdt, o[1]);
            if (odt == DT_I32) ((int*)out)[o[0]] = (int)(v > 2147483647LL ? 2147483647LL : v);
            else ((u32*)out)[o[0]] = (u32)(v < 0 ? 0 : v);
        } else {
            store_f(out, odt, o[0], load_f(src, sdt, o[1]));
        }
    }
}

extern "C" __global__ void unary_kernel(Walk w, void* out, int odt, const void* x, int xdt, int op, float p0, float p1) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[2];
        walk_offsets<2>(w, i, o);
        store_f(out, odt, o[0], unary_apply(op, load_f(x, xdt, o[1]), p0, p1));
    }
}

extern "C" __global__ void binary_kernel(Walk w, void* out, int odt, const void* a, int adt, const void* b, int bdt, int op) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[3];
        walk_offsets<3>(w, i, o);
        store_f(out, odt, o[0], binary_apply(op, load_f(a, adt, o[1]), load_f(b, bdt, o[2])));
    }
}

extern "C" __global__ void ternary_kernel(Walk w, void* out, int odt, const void* a, int adt, const void* b, int bdt,
                                          const void* c, int cdt, int op) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[4];
        walk_offsets<4>(w, i, o);
        store_f(out, odt, o[0],
                ternary_apply(op, load_f(a, adt, o[1]), load_f(b, bdt, o[2]), load_f(c, cdt, o[3])));
    }
}

// Contiguous f32 operands whose addresses are 16-byte aligned: four elements per load and store.
// The tail (n % 4 elements) is done by the first block.
extern "C" __global__ void unary_f32_vec4(i64 n, float* out, const float* x, int op, float p0, float p1) {
    GRID_DEPENDENCY();
    i64 quads = n / 4;
    GRID_STRIDE(q, quads) {
        float4 v = ((const float4*)x)[q];
        v = unary4(op, v, p0, p1);
        ((float4*)out)[q] = v;
    }
    if (blockIdx.x == 0 && threadIdx.x < n - quads * 4) {
        i64 i = quads * 4 + threadIdx.x;
        out[i] = unary_apply(op, x[i], p0, p1);
    }
}

extern "C" __global__ void binary_f32_vec4(i64 n, float* out, const float* a, const float* b, int op) {
    GRID_DEPENDENCY();
    i64 quads = n / 4;
    GRID_STRIDE(q, quads) {
        float4 u = ((const float4*)a)[q];
        float4 v = ((const float4*)b)[q];
        u.x = binary_apply(op, u.x, v.x);
        u.y = binary_apply(op, u.y, v.y);
        u.z = binary_apply(op, u.z, v.z);
        u.w = binary_apply(op, u.w, v.w);
        ((float4*)out)[q] = u;
    }
    if (blockIdx.x == 0 && threadIdx.x < n - quads * 4) {
        i64 i = quads * 4 + threadIdx.x;
        out[i] = binary_apply(op, a[i], b[i]);
    }
}

// Contiguous float operands of any narrow dtype (f32, f16, bf16), each view starting on a
// four-element boundary: four elements per load and store (16 bytes of f32, 8 of a 16-bit
// type), converted through f32 as `load_f`/`store_f` do. The tail is done by the first block.
__device__ __forceinline__ float4 unpack4(uint2 h, int dt) {
    if (dt == DT_BF16)
        return make_float4(bf16_to_f32(h.x & 0xffff), bf16_to_f32(h.x >> 16), bf16_to_f32(h.y & 0xffff),
                           bf16_to_f32(h.y >> 16));
    return make_float4(f16_to_f32(h.x & 0xffff), f16_to_f32(h.x >> 16), f16_to_f32(h.y & 0xffff),
                       f16_to_f32(h.y >> 16));
}
__device__ __forceinline__ uint2 pack4(float4 v, int dt) {
    u32 a, b, c, d;
    if (dt == DT_BF16) {
        a = f32_to_bf16(v.x), b = f32_to_bf16(v.y), c = f32_to_bf16(v.z), d = f32_to_bf16(v.w);
    } else {
        a = f32_to_f16(v.x), b = f32_to_f16(v.y), c = f32_to_f16(v.z), d = f32_to_f16(v.w);
    }
    return make_uint2(a | (b << 16), c | (d << 16));
}
__device__ __forceinline__ float4 load4(const void* p, int dt, i64 q) {
    if (dt == DT_F32) return ((const float4*)p)[q];
    return unpack4(((const uint2*)p)[q], dt);
}
__device__ __forceinline__ void store4(void* p, int dt, i64 q, float4 v) {
    if (dt == DT_F32) {
        ((float4*)p)[q] = v;
        return;
    }
    ((uint2*)p)[q] = pack4(v, dt);
}

// Eight elements a thread where every operand starts on a 16-byte boundary: one 16-byte
// access of a 16-bit type (two of f32). Four a thread keep only 8 bytes of a 16-bit operand in
// flight per thread, too few to cover the memory's latency (GPT-2's bf16 GELU: 86 us at 1.75
// TB/s on an H200).
struct Float8 {
    float4 a, b;
};
__device__ __forceinline__ Float8 load8(const void* p, int dt, i64 o) {
    if (dt == DT_F32) return {((const float4*)p)[2 * o], ((const float4*)p)[2 * o + 1]};
    const uint4 h = ((const uint4*)p)[o];
    return {unpack4(make_uint2(h.x, h.y), dt), unpack4(make_uint2(h.z, h.w), dt)};
}
__device__ __forceinline__ void store8(void* p, int dt, i64 o, Float8 v) {
    if (dt == DT_F32) {
        ((float4*)p)[2 * o] = v.a;
        ((float4*)p)[2 * o + 1] = v.b;
        return;
    }
    const uint2 lo = pack4(v.a, dt), hi = pack4(v.b, dt);
    ((uint4*)p)[o] = make_uint4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ Float8 unary8(int op, Float8 v, float p0, float p1) {
    float e[8] = {v.a.x, v.a.y, v.a.z, v.a.w, v.b.x, v.b.y, v.b.z, v.b.w};
    unary_apply_n<8>(op, e, p0, p1);
    return {make_float4(e[0], e[1], e[2], e[3]), make_float4(e[4], e[5], e[6], e[7])};
}
__device__ __forceinline__ float4 binary4(int op, float4 u, float4 v) {
    return make_float4(binary_apply(op, u.x, v.x), binary_apply(op, u.y, v.y), binary_apply(op, u.z, v.z),
                       binary_apply(op, u.w, v.w));
}

// W (4 or 8) elements a thread; the tail (fewer than W) is done by the first block.
template <int W>
__device__ __forceinline__ void unary_narrow(i64 n, void* out, int odt, const void* x, int xdt, int op, float p0,
                                             float p1) {
    GRID_DEPENDENCY();
    const i64 groups = n / W;
    GRID_STRIDE(q, groups) {
        if (W == 8) {
            store8(out, odt, q, unary8(op, load8(x, xdt, q), p0, p1));
        } else {
            store4(out, odt, q, unary4(op, load4(x, xdt, q), p0, p1));
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < n - groups * W) {
        i64 i = groups * W + threadIdx.x;
        store_f(out, odt, i, unary_apply(op, load_f(x, xdt, i), p0, p1));
    }
}
template <int W>
__device__ __forceinline__ void binary_narrow(i64 n, void* out, int odt, const void* a, int adt, const void* b,
                                              int bdt, int op) {
    GRID_DEPENDENCY();
    const i64 groups = n / W;
    GRID_STRIDE(q, groups) {
        if (W == 8) {
            Float8 u = load8(a, adt, q), v = load8(b, bdt, q);
            store8(out, odt, q, {binary4(op, u.a, v.a), binary4(op, u.b, v.b)});
        } else {
            store4(out, odt, q, binary4(op, load4(a, adt, q), load4(b, bdt, q)));
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < n - groups * W) {
        i64 i = groups * W + threadIdx.x;
        store_f(out, odt, i, binary_apply(op, load_f(a, adt, i), load_f(b, bdt, i)));
    }
}
// A dtype conversion between contiguous narrow float views (same-dtype copies keep their bits
// in `copy_kernel`).
template <int W> __device__ __forceinline__ void convert_narrow(i64 n, void* out, int odt, const void* x, int xdt) {
    GRID_DEPENDENCY();
    const i64 groups = n / W;
    GRID_STRIDE(q, groups) {
        if (W == 8) {
            store8(out, odt, q, load8(x, xdt, q));
        } else {
            store4(out, odt, q, load4(x, xdt, q));
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < n - groups * W) {
        i64 i = groups * W + threadIdx.x;
        store_f(out, odt, i, load_f(x, xdt, i));
    }
}

#define NARROW_KERNELS(W)                                                                                         \
    extern "C" __global__ void unary_narrow_vec##W(i64 n, void* out, int odt, const void* x, int xdt, int op,    \
                                                   float p0, float p1) {                                          \
        unary_narrow<W>(n, out, odt, x, xdt, op, p0, p1);                                                         \
    }                                                                                                             \
    extern "C" __global__ void binary_narrow_vec##W(i64 n, void* out, int odt, const void* a, int adt,          \
                                                    const void* b, int bdt, int op) {                             \
        binary_narrow<W>(n, out, odt, a, adt, b, bdt, op);                                                        \
    }                                                                                                             \
    extern "C" __global__ void convert_narrow_vec##W(i64 n, void* out, int odt, const void* x, int xdt) {       \
        convert_narrow<W>(n, out, odt, x, xdt);                                                                   \
    }
NARROW_KERNELS(4)
NARROW_KERNELS(8)


// The f64 forms (any operand f64): the same op codes computed in double, operands widened
// exactly, the result rounded once on store (hal's apply_f64).
__device__ __forceinline__ double unary_apply_d(int op, double x, double p0, double p1) {
    switch (op) {
        case 0: return -x;
        case 1: return fabs(x);
        case 2: return exp(x);
        case 3: return exp2(x);
        case 4: return log(x);
        case 5: return log2(x);
        case 6: return sqrt(x);
        case 7: return 1.0 / sqrt(x);
        case 8: return 1.0 / x;
        case 9: return sin(x);
        case 10: return cos(x);
        case 11: return tanh(x);
        case 12: return 1.0 / (1.0 + exp(-x));
        case 13: return x < 0.0 ? 0.0 : x;
        case 14: return x < 0.0 ? p0 * x : x;
        case 15: return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
        case 16: return x / (1.0 + exp(-x));
        case 17: return floor(x);
        case 18: return ceil(x);
        case 19: return rint(x);
        case 20: return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : x);
        case 21: return x * x;
        case 22: return fma(p0, x, p1);
        case 24: return 0.5 * x * (1.0 + tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)));
        default: return x != x ? x : fmin(fmax(x, p0), p1);  // 23: clamp
    }
}

__device__ __forceinline__ double binary_apply_d(int op, double a, double b) {
    const double qnan = __longlong_as_double(0x7ff8000000000000ll);
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: {
            double r = fmod(a, b);
            return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
        }
        case 5: return pow(a, b);
        case 6: return (a != a || b != b) ? qnan : fmax(a, b);
        case 7: return (a != a || b != b) ? qnan : fmin(a, b);
        case 8: return atan2(a, b);
        case 9: return a == b ? 1.0 : 0.0;
        case 10: return a != b ? 1.0 : 0.0;
        case 11: return a < b ? 1.0 : 0.0;
        case 12: return a <= b ? 1.0 : 0.0;
        case 13: return a > b ? 1.0 : 0.0;
        default: return a >= b ? 1.0 : 0.0;
    }
}

__device__ __forceinline__ double ternary_apply_d(int op, double a, double b, double c) {
    switch (op) {
        case 0: return a != 0.0 ? b : c;
        case 1: return fma(a, b, c);
        default: return fma(a, c - b, b);
    }
}

extern "C" __global__ void fill_wide_kernel(Walk w, unsigned long long* out, unsigned long long bits) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[1];
        walk_offsets<1>(w, i, o);
        out[o[0]] = bits;
    }
}

extern "C" __global__ void copy_wide_kernel(Walk w, void* out, int odt, const void* src, int sdt) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[2];
        walk_offsets<2>(w, i, o);
        store_d(out, odt, o[0], load_d(src, sdt, o[1]));
    }
}

extern "C" __global__ void unary_wide_kernel(Walk w, void* out, int odt, const void* x, int xdt, int op, float p0,
                                             float p1) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[2];
        walk_offsets<2>(w, i, o);
        store_d(out, odt, o[0], unary_apply_d(op, load_d(x, xdt, o[1]), (double)p0, (double)p1));
    }
}

extern "C" __global__ void binary_wide_kernel(Walk w, void* out, int odt, const void* a, int adt, const void* b,
                                              int bdt, int op) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[3];
        walk_offsets<3>(w, i, o);
        store_d(out, odt, o[0], binary_apply_d(op, load_d(a, adt, o[1]), load_d(b, bdt, o[2])));
    }
}

extern "C" __global__ void ternary_wide_kernel(Walk w, void* out, int odt, const void* a, int adt, const void* b,
                                               int bdt, const void* c, int cdt, int op) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[4];
        walk_offsets<4>(w, i, o);
        store_d(out, odt, o[0],
                ternary_apply_d(op, load_d(a, adt, o[1]), load_d(b, bdt, o[2]), load_d(c, cdt, o[3])));
    }
}
