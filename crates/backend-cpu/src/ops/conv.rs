//! im2col and col2im.

use crate::storage::{Dst, Src};
use hal::{Conv2dGeometry, Layout};
use rayon::prelude::*;

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
                    // Through f64: exact for every dtype (narrower outputs round as from f32).
                    let v = if inside {
                        x.load_f64(xl.index_of(&[n, c, iy as usize, ix as usize]) as isize)
                    } else {
                        0.0
                    };
                    out.store_f64(ol.index_of(&[n, row, oy * ow + ox]) as isize, v);
                }
            }
        }
    });
}

pub(crate) fn col2im(cols: Src, cl: &Layout, g: &Conv2dGeometry, out: Dst, ol: &Layout) {
    if cols.dtype == hal::DType::F64 || out.dtype == hal::DType::F64 {
        return col2im_sum::<f64>(cols, cl, g, out, ol);
    }
    col2im_sum::<f32>(cols, cl, g, out, ol)
}

/// The sums of `col2im` in `T` (`f32`, or `f64` where either side is `f64`).
fn col2im_sum<T: Accumulator>(cols: Src, cl: &Layout, g: &Conv2dGeometry, out: Dst, ol: &Layout) {
    let (oh, ow) = rows_of(g);
    let (kh, kw) = g.kernel;
    (0..g.batch * g.channels).into_par_iter().for_each(|plane| {
        let (n, c) = (plane / g.channels, plane % g.channels);
        let mut acc = vec![T::default(); g.height * g.width];
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
                            unsafe { T::load(cols, cl.index_of(&[n, row, oy * ow + ox]) as isize) };
                    }
                }
            }
        }
        for y in 0..g.height {
            for x in 0..g.width {
                // SAFETY: each plane is written by one thread.
                unsafe { acc[y * g.width + x].store(out, ol.index_of(&[n, c, y, x]) as isize) };
            }
        }
    });
}

/// An accumulation type: `f32` (loads and stores as [`Src::load`] and [`Dst::store`]) or
/// `f64` (exact loads, one rounding on store).
pub(crate) trait Accumulator: Copy + Default + std::ops::AddAssign + Send + Sync {
    /// # Safety
    /// As [`Src::load`].
    unsafe fn load(src: Src, i: isize) -> Self;
    /// # Safety
    /// As [`Dst::store`].
    unsafe fn store(self, dst: Dst, i: isize);
}

impl Accumulator for f32 {
    unsafe fn load(src: Src, i: isize) -> f32 {
        // SAFETY: the caller's.
        unsafe { src.load(i) }
    }
    unsafe fn store(self, dst: Dst, i: isize) {
        // SAFETY: the caller's.
        unsafe { dst.store(i, self) }
    }
}

impl Accumulator for f64 {
    unsafe fn load(src: Src, i: isize) -> f64 {
        // SAFETY: the caller's.
        unsafe { src.load_f64(i) }
    }
    unsafe fn store(self, dst: Dst, i: isize) {
        // SAFETY: the caller's.
        unsafe { dst.store_f64(i, self) }
    }
}
