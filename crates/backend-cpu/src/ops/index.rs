//! gather and scatter-add.

use crate::storage::{Dst, Src};
use crate::walk::Walk;
use hal::{DType, Layout};

/// `x`'s strides on `shape` (the index's shape), with `axis` masked to stride 0: the offset of
/// `x[p with p[axis] = 0]` for each position `p`.
fn masked(x: &Layout, shape: &[usize], axis: usize) -> Layout {
    let mut l = Layout {
        shape: shape.to_vec(),
        strides: x.strides.clone(),
        offset: x.offset,
    };
    l.strides[axis] = 0;
    l
}

pub(crate) fn gather(
    x: Src,
    xl: &Layout,
    axis: usize,
    index: Src,
    il: &Layout,
    out: Dst,
    ol: &Layout,
) {
    let xm = masked(xl, &il.shape, axis);
    let step = xl.strides[axis];
    let walk = Walk::new(&il.shape, [ol, il, &xm]);
    // SAFETY: validate::gather proved the views inside their buffers; check_indices proved
    // every index below the data's `axis` size, so `b + idx * step` stays inside `xl`'s range;
    // the output reaches each element once.
    // f32 data with u32 indices (an embedding lookup) copies elements as they are; every other
    // combination goes through f64 per element.
    let plain = x.dtype == DType::F32 && out.dtype == DType::F32 && index.dtype == DType::U32;
    walk.par_runs(|_, [o, i, b], [so, si, sb], len| unsafe {
        if plain {
            let (xp, op, ip) = (
                x.ptr as *const f32,
                out.ptr as *mut f32,
                index.ptr as *const u32,
            );
            for j in 0..len as isize {
                let idx = *ip.offset(i + j * si) as isize;
                *op.offset(o + j * so) = *xp.offset(b + j * sb + idx * step);
            }
            return;
        }
        for j in 0..len as isize {
            let idx = index.load_index(i + j * si) as isize;
            // Through f64: exact for every dtype (a narrower output rounds as from f32).
            out.store_f64(o + j * so, x.load_f64(b + j * sb + idx * step));
        }
    });
}

pub(crate) fn scatter_add(
    src: Src,
    sl: &Layout,
    axis: usize,
    index: Src,
    il: &Layout,
    out: Dst,
    ol: &Layout,
) {
    // Threads own disjoint "lines" (all positions but `axis`), so every output element is
    // written by one thread, in index order: deterministic, no atomics.
    let mut outer = il.shape.clone();
    outer[axis] = 1;
    let line = il.shape[axis] as isize;
    let (ss, si, so) = (sl.strides[axis], il.strides[axis], ol.strides[axis]);
    let om = masked(ol, &outer, axis);
    let walk = Walk::new(&outer, [sl, il, &om]);
    // Sums in f64 where either side is f64.
    let wide = src.dtype == hal::DType::F64 || out.dtype == hal::DType::F64;
    // SAFETY: validate::scatter_add proved the views inside their buffers and check_indices
    // every index below the output's `axis` size; each thread owns whole lines of the output.
    let plain = src.dtype == DType::F32 && out.dtype == DType::F32 && index.dtype == DType::U32;
    walk.par_runs(|_, [s0, i0, o0], [ds, di, dout], len| unsafe {
        for j in 0..len as isize {
            let (s, i, o) = (s0 + j * ds, i0 + j * di, o0 + j * dout);
            if plain {
                // f32 sums with u32 indices (an embedding's gradient): typed, no dtype match
                // per element; the same additions in the same order.
                let (sp, op) = (src.ptr as *const f32, out.ptr as *mut f32);
                let ip = index.ptr as *const u32;
                for t in 0..line {
                    let at = o + *ip.offset(i + t * si) as isize * so;
                    *op.offset(at) += *sp.offset(s + t * ss);
                }
                continue;
            }
            for t in 0..line {
                let idx = index.load_index(i + t * si) as isize;
                let at = o + idx * so;
                if wide {
                    out.store_f64(at, out.src().load_f64(at) + src.load_f64(s + t * ss));
                } else {
                    out.store(at, out.src().load(at) + src.load(s + t * ss));
                }
            }
        }
    });
}
