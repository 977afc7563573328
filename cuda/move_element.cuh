// One element from x[xi] to out[oi]: the bits as they are where the dtypes agree, else
// through f32, or f64 where either is f64 (gather and the image copies move elements; they
// never compute).
#pragma once
#include "common.cuh"

__device__ __forceinline__ void move_element(void* out, int odt, i64 oi, const void* x, int xdt, i64 xi) {
    if (odt == DT_F64 || xdt == DT_F64) {
        store_d(out, odt, oi, load_d(x, xdt, xi));
    } else if (odt == xdt) {
        if (odt == DT_F16 || odt == DT_BF16) ((u16*)out)[oi] = ((const u16*)x)[xi];
        else ((u32*)out)[oi] = ((const u32*)x)[xi];
    } else {
        store_f(out, odt, oi, load_f(x, xdt, xi));
    }
}
