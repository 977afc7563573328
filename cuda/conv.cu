// im2col and col2im: the image copies a convolution is a product over.
#include "common.cuh"
#include "move_element.cuh"

// A zero at element i of any dtype (f64 included).
__device__ __forceinline__ void store_zero(void* out, int odt, i64 i) {
    if (odt == DT_F64) ((double*)out)[i] = 0.0;
    else store_f(out, odt, i, 0.0f);
}

// col2im's running sum: in f64 where the columns or the image are f64, else in f32.
struct ImageSum {
    bool wide;
    float f;
    double d;
    __device__ explicit ImageSum(bool w) : wide(w), f(0.0f), d(0.0) {}
    __device__ __forceinline__ void add(const void* cols, int cdt, i64 i) {
        if (wide) d += load_d(cols, cdt, i);
        else f += load_f(cols, cdt, i);
    }
    __device__ __forceinline__ void store(void* out, int odt, i64 i) const {
        if (wide) store_d(out, odt, i, d);
        else store_f(out, odt, i, f);
    }
};

struct Geo {
    i64 n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
    i64 xs[4];
    i64 xoff;
    i64 cs[3];
    i64 coff;
};

// im2col and col2im exist twice: with i64 index arithmetic, and for launches whose every
// position fits in 31 bits with u32 quotients by precomputed multipliers (`FastDiv`): the
// hardware has no integer divider, and the LeNet bench's convolution and pooling spent most
// of each call on 64-bit divisions.
extern "C" __global__ void im2col_kernel(Geo g, const void* x, int xdt, void* out, int odt) {
    i64 total = g.n * g.c * g.kh * g.kw * g.oh * g.ow;
    GRID_STRIDE(t, total) {
        i64 p = t % (g.oh * g.ow);
        i64 row = (t / (g.oh * g.ow)) % (g.c * g.kh * g.kw);
        i64 b = t / (g.oh * g.ow * g.c * g.kh * g.kw);
        i64 j = row % g.kw, i = (row / g.kw) % g.kh, ch = row / (g.kw * g.kh);
        i64 oy = p / g.ow, ox = p % g.ow;
        i64 y = oy * g.sh - g.ph + i * g.dh, xx = ox * g.sw - g.pw + j * g.dw;
        i64 oi = g.coff + b * g.cs[0] + row * g.cs[1] + p * g.cs[2];
        if (y >= 0 && y < g.h && xx >= 0 && xx < g.w) {
            move_element(out, odt, oi, x, xdt, g.xoff + b * g.xs[0] + ch * g.xs[1] + y * g.xs[2] + xx * g.xs[3]);
        } else {
            store_zero(out, odt, oi);
        }
    }
}

// The divisors of im2col_kernel32: oh*ow, c, ow.
struct Im2colDivs {
    FastDiv ohw, c, ow;
};
// A thread per (image, channel, output position), writing that position's kh*kw column entries
// (a quotient per entry dominated the LeNet bench's second convolution).
extern "C" __global__ void im2col_kernel32(Geo g, Im2colDivs v, const void* x, int xdt, void* out, int odt) {
    const u32 total = (u32)(g.n * g.c * g.oh * g.ow);
    const int kh = (int)g.kh, kw = (int)g.kw, h = (int)g.h, w = (int)g.w;
    for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        const u32 q = fast_div(v.ohw, t), p = t - q * v.ohw.d;
        const u32 b = fast_div(v.c, q), ch = q - b * v.c.d;
        const u32 oy = fast_div(v.ow, p), ox = p - oy * v.ow.d;
        const i64 xbase = g.xoff + (i64)b * g.xs[0] + (i64)ch * g.xs[1];
        i64 oi = g.coff + (i64)b * g.cs[0] + (i64)ch * (kh * kw) * g.cs[1] + (i64)p * g.cs[2];
        const int y0 = (int)oy * (int)g.sh - (int)g.ph, x0 = (int)ox * (int)g.sw - (int)g.pw;
        for (int i = 0; i < kh; ++i) {
            const int y = y0 + i * (int)g.dh;
            const bool row_inside = y >= 0 && y < h;
            for (int j = 0; j < kw; ++j, oi += g.cs[1]) {
                const int xx = x0 + j * (int)g.dw;
                if (row_inside && xx >= 0 && xx < w) {
                    move_element(out, odt, oi, x, xdt, xbase + (i64)y * g.xs[2] + (i64)xx * g.xs[3]);
                } else {
                    store_zero(out, odt, oi);
                }
            }
        }
    }
}

// One thread per image pixel, summing the column entries that read it (no atomics).
// Here `xs`/`xoff` describe the output image and `cs`/`coff` the columns.
extern "C" __global__ void col2im_kernel(Geo g, const void* cols, int cdt, void* out, int odt) {
    i64 total = g.n * g.c * g.h * g.w;
    GRID_STRIDE(t, total) {
        i64 xx = t % g.w, y = (t / g.w) % g.h, ch = (t / (g.w * g.h)) % g.c, b = t / (g.w * g.h * g.c);
        ImageSum sum(cdt == DT_F64 || odt == DT_F64);
        for (i64 i = 0; i < g.kh; ++i) {
            i64 ty = y + g.ph - i * g.dh;
            if (ty < 0 || ty % g.sh != 0) continue;
            i64 oy = ty / g.sh;
            if (oy >= g.oh) continue;
            for (i64 j = 0; j < g.kw; ++j) {
                i64 tx = xx + g.pw - j * g.dw;
                if (tx < 0 || tx % g.sw != 0) continue;
                i64 ox = tx / g.sw;
                if (ox >= g.ow) continue;
                i64 row = (ch * g.kh + i) * g.kw + j;
                sum.add(cols, cdt, g.coff + b * g.cs[0] + row * g.cs[1] + (oy * g.ow + ox) * g.cs[2]);
            }
        }
        sum.store(out, odt, g.xoff + b * g.xs[0] + ch * g.xs[1] + y * g.xs[2] + xx * g.xs[3]);
    }
}

// The divisors of col2im_kernel32: w, h, c, the strides sh and sw.
struct Col2imDivs {
    FastDiv w, h, c, sh, sw;
};
extern "C" __global__ void col2im_kernel32(Geo g, Col2imDivs v, const void* cols, int cdt, void* out, int odt) {
    const u32 total = (u32)(g.n * g.c * g.h * g.w);
    const int kh = (int)g.kh, kw = (int)g.kw, ph = (int)g.ph, pw = (int)g.pw, dh = (int)g.dh, dw = (int)g.dw;
    const u32 oh = (u32)g.oh, ow = (u32)g.ow;
    const bool unit = g.sh == 1 && g.sw == 1;
    for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        const u32 q = fast_div(v.w, t), xx = t - q * v.w.d;
        const u32 q2 = fast_div(v.h, q), y = q - q2 * v.h.d;
        const u32 b = fast_div(v.c, q2), ch = q2 - b * v.c.d;
        ImageSum sum(cdt == DT_F64 || odt == DT_F64);
        const i64 cbase = g.coff + (i64)b * g.cs[0] + (i64)ch * (kh * kw) * g.cs[1];
        for (int i = 0; i < kh; ++i) {
            const int ty = (int)y + ph - i * dh;
            if (ty < 0) continue;
            // Stride 1 (the common case) needs no quotient per window entry.
            const u32 oy = unit ? (u32)ty : fast_div(v.sh, (u32)ty);
            if (oy * v.sh.d != (u32)ty || oy >= oh) continue;
            for (int j = 0; j < kw; ++j) {
                const int tx = (int)xx + pw - j * dw;
                if (tx < 0) continue;
                const u32 ox = unit ? (u32)tx : fast_div(v.sw, (u32)tx);
                if (ox * v.sw.d != (u32)tx || ox >= ow) continue;
                sum.add(cols, cdt, cbase + (i64)(i * kw + j) * g.cs[1] + ((i64)oy * ow + ox) * g.cs[2]);
            }
        }
        sum.store(out, odt, g.xoff + (i64)b * g.xs[0] + (i64)ch * g.xs[1] + (i64)y * g.xs[2] + (i64)xx * g.xs[3]);
    }
}
