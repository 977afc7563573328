// Indexing kernels: device-side index checks, gather, scatter-add. A check writes the device
// fault record and a per-launch verdict word; the kernel it guards reads the verdict and writes
// nothing after a failed check (hal's rule: a failed operation writes nothing).
#include "common.cuh"
#include "move_element.cuh"

// Every element of an index view must lie in 0..bound.
extern "C" __global__ void check_index(Walk w, const void* index, int idt, i64 bound, u32 op, u32* fault, u32* verdict) {
    GRID_STRIDE(i, w.n) {
        i64 o[1];
        walk_offsets<1>(w, i, o);
        i64 v = load_index(index, idt, o[0]);
        if (v < 0 || v >= bound) {
            report_fault(fault, v, bound, op);
            atomicOr(verdict, 1u);
        }
    }
}

// Walk operands: 0 out, 1 index, 2 x (with x's stride along the axis zeroed: the index supplies it).
extern "C" __global__ void gather_kernel(Walk w, void* out, int odt, const void* index, int idt, const void* x, int xdt,
                                         i64 x_axis_stride, const u32* verdict) {
    if (*verdict) return;
    GRID_STRIDE(i, w.n) {
        i64 o[3];
        walk_offsets<3>(w, i, o);
        i64 k = load_index(index, idt, o[1]);
        move_element(out, odt, o[0], x, xdt, o[2] + k * x_axis_stride);
    }
}

// Walk operands: 0 src, 1 index, 2 out (out's stride along the axis zeroed).
extern "C" __global__ void scatter_add_kernel(Walk w, const void* src, int sdt, const void* index, int idt, void* out,
                                              int odt, i64 out_axis_stride, const u32* verdict) {
    if (*verdict) return;
    GRID_STRIDE(i, w.n) {
        i64 o[3];
        walk_offsets<3>(w, i, o);
        i64 k = load_index(index, idt, o[1]);
        // (f64 operands add in f64: a double atomic into f64, a rounded one into narrower.)
        if (odt == DT_F64) atomicAdd((double*)out + o[2] + k * out_axis_stride, load_d(src, sdt, o[0]));
        else atomic_add_f(out, odt, o[2] + k * out_axis_stride, (float)load_d(src, sdt, o[0]));
    }
}
