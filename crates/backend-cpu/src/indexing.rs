//! gather, scatter-add, im2col and col2im.

use crate::storage::{Dst, Src};
use crate::walk::Walk;
use hal::{Conv2dGeometry, Layout};
use rayon::prelude::*;

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
    walk.par_runs(|_, [o, i, b], [so, si, sb], len| unsafe {
        for j in 0..len as isize {
            let idx = index.load_index(i + j * si) as isize;
            out.store(o + j * so, x.load(b + j * sb + idx * step));
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
    // SAFETY: validate::scatter_add proved the views inside their buffers and check_indices
    // every index below the output's `axis` size; each thread owns whole lines of the output.
    walk.par_runs(|_, [s0, i0, o0], [ds, di, dout], len| unsafe {
        for j in 0..len as isize {
            let (s, i, o) = (s0 + j * ds, i0 + j * di, o0 + j * dout);
            for t in 0..line {
                let idx = index.load_index(i + t * si) as isize;
                let at = o + idx * so;
                out.store(at, out.src().load(at) + src.load(s + t * ss));
            }
        }
    });
}

fn rows_of(g: &Conv2dGeometry) -> (usize, usize) {
    g.output_size().expect("geometry validated by the caller")
}

pub(crate) fn im2col(x: Src, xl: &Layout, g: &Conv2dGeometry, out: Dst, ol: &Layout) {
    let (oh, ow) = rows_of(g);
    let (kh, kw) = g.kernel;
    let rows = g.batch * g.channels * kh * kw;
    (0..rows).into_par_iter().for_each(|r| {
        let n = r / (g.channels * kh * kw);
        let c = (r / (kh * kw)) % g.channels;
        let (i, j) = ((r / kw) % kh, r % kw);
        let row = r % (g.channels * kh * kw);
        for oy in 0..oh {
            let iy = (oy * g.stride.0 + i * g.dilation.0) as isize - g.padding.0 as isize;
            for ox in 0..ow {
                let ix = (ox * g.stride.1 + j * g.dilation.1) as isize - g.padding.1 as isize;
                let inside =
                    iy >= 0 && ix >= 0 && (iy as usize) < g.height && (ix as usize) < g.width;
                // SAFETY: views checked by the caller; rows are disjoint between threads.
                unsafe {
                    let v = if inside {
                        x.load(xl.index_of(&[n, c, iy as usize, ix as usize]) as isize)
                    } else {
                        0.0
                    };
                    out.store(ol.index_of(&[n, row, oy * ow + ox]) as isize, v);
                }
            }
        }
    });
}

pub(crate) fn col2im(cols: Src, cl: &Layout, g: &Conv2dGeometry, out: Dst, ol: &Layout) {
    let (oh, ow) = rows_of(g);
    let (kh, kw) = g.kernel;
    (0..g.batch * g.channels).into_par_iter().for_each(|plane| {
        let (n, c) = (plane / g.channels, plane % g.channels);
        let mut acc = vec![0f32; g.height * g.width];
        for i in 0..kh {
            for j in 0..kw {
                let row = (c * kh + i) * kw + j;
                for oy in 0..oh {
                    let iy = (oy * g.stride.0 + i * g.dilation.0) as isize - g.padding.0 as isize;
                    if iy < 0 || iy as usize >= g.height {
                        continue;
                    }
                    for ox in 0..ow {
                        let ix =
                            (ox * g.stride.1 + j * g.dilation.1) as isize - g.padding.1 as isize;
                        if ix < 0 || ix as usize >= g.width {
                            continue;
                        }
                        // SAFETY: views checked by the caller.
                        acc[iy as usize * g.width + ix as usize] +=
                            unsafe { cols.load(cl.index_of(&[n, row, oy * ow + ox]) as isize) };
                    }
                }
            }
        }
        for y in 0..g.height {
            for x in 0..g.width {
                // SAFETY: each plane is written by one thread.
                unsafe { out.store(ol.index_of(&[n, c, y, x]) as isize, acc[y * g.width + x]) };
            }
        }
    });
}
