// hal::random on the device: Philox (common.cuh) at each element's position. Built twice, as
// elementwise.cu is (xtask's DUAL_TARGET): on Hopper it opens with GRID_DEPENDENCY.
#include "common.cuh"

// hal::random: element i of the output's row-major order gets random_value(dist, seed, offset + i).
extern "C" __global__ void random_kernel(Walk w, void* out, int odt, u32 seed_lo, u32 seed_hi, u64 offset, int normal,
                                         float p0, float p1) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[1];
        walk_offsets<1>(w, i, o);
        u64 idx = offset + (u64)i;
        u32 c[4] = {(u32)idx, (u32)(idx >> 32), 0u, 0u};
        philox(c, seed_lo, seed_hi);
        float v;
        if (normal) {
            float u1 = (float)((c[0] >> 8) + 1u) * (1.0f / 16777216.0f);
            float u2 = (float)(c[1] >> 8) * (1.0f / 16777216.0f);
            float z = sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958648f * u2);
            v = fmaf(p1, z, p0);
        } else {
            v = fmaf(p1 - p0, (float)(c[0] >> 8) * (1.0f / 16777216.0f), p0);
        }
        store_f(out, odt, o[0], v);
    }
}

// hal::random_value_f64 for f64 outputs: 53-bit uniforms from two Philox words, the
// distribution's parameters widened from f32.
__device__ __forceinline__ double unit_uniform_f64(u32 hi, u32 lo) {
    return (double)(((u64)hi << 21) | (u64)(lo >> 11)) * (1.0 / 9007199254740992.0);
}

extern "C" __global__ void random_wide_kernel(Walk w, double* out, u32 seed_lo, u32 seed_hi, u64 offset,
                                              int normal, double p0, double p1) {
    GRID_DEPENDENCY();
    GRID_STRIDE(i, w.n) {
        i64 o[1];
        walk_offsets<1>(w, i, o);
        u64 idx = offset + (u64)i;
        u32 c[4] = {(u32)idx, (u32)(idx >> 32), 0u, 0u};
        philox(c, seed_lo, seed_hi);
        double u = unit_uniform_f64(c[0], c[1]);
        double v;
        if (normal) {
            double u1 = u + 1.0 / 9007199254740992.0;
            double u2 = unit_uniform_f64(c[2], c[3]);
            double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
            v = fma(p1, z, p0);
        } else {
            v = fma(p1 - p0, u, p0);
        }
        out[o[0]] = v;
    }
}
