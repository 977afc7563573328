//! Segment sums: k-means' centroid update.

use crate::ops::cluster::f32_rows;
use crate::storage::{CpuBuffer, Dst, Src};
use hal::{Layout, View};
use rayon::prelude::*;

/// Segment sums: the rows as contiguous f32 (borrowed when they already are; f64 rows as
/// f64), threads owning disjoint column blocks and adding rows in index order in f64:
/// deterministic, whatever the thread count.
#[allow(clippy::too_many_arguments)]
pub(crate) fn segment_sum(
    x: Src,
    xl: &Layout,
    seg: &[u32],
    weights: Option<&[f64]>,
    sums: Dst,
    sl: &Layout,
    counts: Dst,
    cl: &Layout,
) {
    if x.dtype == hal::DType::F64 {
        let mut rows = vec![0f64; xl.numel()];
        let dst = Dst {
            ptr: rows.as_mut_ptr() as *mut u8,
            dtype: hal::DType::F64,
        };
        crate::ops::elementwise::copy(x, xl, dst, &Layout::contiguous(&xl.shape));
        let (d, n) = (xl.shape[1], xl.shape[0]);
        return segment_sum_rows(&rows, d, &seg[..n], weights, sums, sl, counts, cl);
    }
    let xs = f32_rows(x, xl);
    segment_sum_rows(
        &xs,
        xl.shape[1],
        &seg[..xl.shape[0]],
        weights,
        sums,
        sl,
        counts,
        cl,
    );
}

/// `segment_sum` of contiguous rows (f32 or f64), summed in f64.
#[allow(clippy::too_many_arguments)]
fn segment_sum_rows<T: hal::Element>(
    xs: &[T],
    d: usize,
    seg: &[u32],
    weights: Option<&[f64]>,
    sums: Dst,
    sl: &Layout,
    counts: Dst,
    cl: &Layout,
) {
    let m = sl.shape[0];
    let block = d.div_ceil(2 * rayon::current_num_threads()).max(8);
    #[cfg(target_arch = "x86_64")]
    let avx2 = crate::has_avx2_fma();
    (0..d.div_ceil(block)).into_par_iter().for_each(|b| {
        let (k0, k1) = (b * block, ((b + 1) * block).min(d));
        let bw = k1 - k0;
        let mut acc = vec![0f64; m * bw];
        let cols = (d, k0, k1);
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the CPU supports the enabled features (checked above).
            unsafe { accumulate_avx2(xs, cols, seg, weights, &mut acc) };
        } else {
            accumulate(xs, cols, seg, weights, &mut acc);
        }
        #[cfg(not(target_arch = "x86_64"))]
        accumulate(xs, cols, seg, weights, &mut acc);
        for s in 0..m {
            for kk in 0..bw {
                // SAFETY: threads own disjoint columns; the view was checked by the caller.
                unsafe { sums.store_f64(sl.index_of(&[s, k0 + kk]) as isize, acc[s * bw + kk]) };
            }
        }
    });
    let mut cnt = vec![0f64; m];
    for (i, &s) in seg.iter().enumerate() {
        cnt[s as usize] += weights.map_or(1.0, |w| w[i]);
    }
    for (s, &c) in cnt.iter().enumerate() {
        // SAFETY: the view was checked by the caller.
        unsafe { counts.store_f64(cl.index_of(&[s]) as isize, c) };
    }
}

/// Columns `k0..k1` of every row of `xs` (`d` wide) added in f64 into its segment's row of
/// `acc` (`k1 - k0` wide), times its weight where there are weights, rows in index order.
#[inline(always)]
fn accumulate<T: hal::Element>(
    xs: &[T],
    (d, k0, k1): (usize, usize, usize),
    seg: &[u32],
    weights: Option<&[f64]>,
    acc: &mut [f64],
) {
    let bw = k1 - k0;
    for (i, &s) in seg.iter().enumerate() {
        let row = &xs[i * d + k0..i * d + k1];
        let a = &mut acc[s as usize * bw..(s as usize + 1) * bw];
        match weights {
            Some(w) => {
                let wi = w[i];
                for (slot, &v) in a.iter_mut().zip(row) {
                    *slot += wi * v.to_f64();
                }
            }
            None => {
                for (slot, &v) in a.iter_mut().zip(row) {
                    *slot += v.to_f64();
                }
            }
        }
    }
}

/// [`accumulate`] in 256-bit vectors: the widening and the adds of a k-means update took a
/// fifth of its iteration in the baseline build's two-lane SSE2 (the same operations, so the
/// same sums: Rust does not fuse the multiply and the add). AVX-512 measured no faster.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_avx2<T: hal::Element>(
    xs: &[T],
    cols: (usize, usize, usize),
    seg: &[u32],
    weights: Option<&[f64]>,
    acc: &mut [f64],
) {
    accumulate(xs, cols, seg, weights, acc)
}

/// [`hal::Precision::Reproducible`]'s segment sum: each segment's rows added in ascending row
/// order in f32 with fused multiply-adds, the order every backend follows.
pub(crate) fn segment_sum_ordered(
    x: Src,
    xl: &Layout,
    seg: &[u32],
    weights: Option<&[f64]>,
    sums: Dst,
    sl: &Layout,
    counts: Dst,
    cl: &Layout,
) {
    let (n, d, m) = (xl.shape[0], xl.shape[1], sl.shape[0]);
    // (f32 weights, widened exactly by the caller.)
    let w = |i: usize| weights.map_or(1.0, |w| w[i] as f32);
    let mut acc = vec![0f32; m * d];
    let mut cnt = vec![0f32; m];
    for (i, &s) in seg.iter().enumerate().take(n) {
        let (s, wi) = (s as usize, w(i));
        let base = xl.offset as isize + i as isize * xl.strides[0];
        for (k, slot) in acc[s * d..(s + 1) * d].iter_mut().enumerate() {
            // SAFETY: the view was checked by the caller.
            let v = unsafe { x.load(base + k as isize * xl.strides[1]) };
            *slot = wi.mul_add(v, *slot);
        }
        cnt[s] += wi;
    }
    for s in 0..m {
        for k in 0..d {
            // SAFETY: the view was checked by the caller.
            unsafe { sums.store(sl.index_of(&[s, k]) as isize, acc[s * d + k]) };
        }
        // SAFETY: as above.
        unsafe { counts.store(cl.index_of(&[s]) as isize, cnt[s]) };
    }
}

/// The segment sums of validated views, `segment`'s ids already checked: in index order in
/// f64, or under `reproducible` in the one f32 order every backend shares.
pub(crate) fn segment_sum_views(
    x: View<'_, CpuBuffer>,
    segment: View<'_, CpuBuffer>,
    weights: Option<View<'_, CpuBuffer>>,
    [sums, counts]: [View<'_, CpuBuffer>; 2],
    reproducible: bool,
) {
    let seg: Vec<u32> = crate::contiguous(segment);
    let w: Option<Vec<f64>> = weights.map(crate::contiguous);
    // f64 operands have no f32 order to share: their sums take the f64 path.
    let wide = [x.dtype(), sums.dtype(), counts.dtype()].contains(&hal::DType::F64);
    let sum = if reproducible && !wide {
        segment_sum_ordered
    } else {
        segment_sum
    };
    sum(
        x.buffer.src(),
        x.layout,
        &seg,
        w.as_deref(),
        sums.buffer.dst(),
        sums.layout,
        counts.buffer.dst(),
        counts.layout,
    );
}
