//! Nearest-centroid search and segment sums: the two primitives of k-means.

use crate::elementwise;
use crate::storage::{Dst, Src};
use hal::{DType, Layout};
use rayon::prelude::*;

/// Centroids per register block: the accumulators of one block stay in vector registers.
const CBLOCK: usize = 32;

fn contiguous_f32(src: Src, l: &Layout) -> Vec<f32> {
    let mut v = vec![0f32; l.numel()];
    elementwise::copy(
        src,
        l,
        Dst {
            ptr: v.as_mut_ptr() as *mut u8,
            dtype: DType::F32,
        },
        &Layout::contiguous(&l.shape),
    );
    v
}

/// Distances from one row to centroids `j0..j0+CBLOCK` (`ct` is the transposed centroid
/// matrix, `[d, m]`), each summed over `k` in order with fused multiply-adds, which is the
/// reference order: vectorising across centroids keeps it.
#[inline(always)]
fn block_distances(
    x: &[f32],
    ct: &[f32],
    m: usize,
    j0: usize,
    width: usize,
    acc: &mut [f32; CBLOCK],
) {
    *acc = [0.0; CBLOCK];
    for (k, &xv) in x.iter().enumerate() {
        let row = &ct[k * m + j0..k * m + j0 + width];
        for (a, &c) in acc.iter_mut().zip(row) {
            let t = xv - c;
            *a = t.mul_add(t, *a);
        }
    }
}

#[inline(always)]
fn search_rows(xs: &[f32], d: usize, ct: &[f32], m: usize, idx: &mut [u32], dist: &mut [f32]) {
    let mut acc = [0f32; CBLOCK];
    for (r, x) in xs.chunks_exact(d.max(1)).enumerate().take(idx.len()) {
        let x = if d == 0 { &[][..] } else { x };
        let (mut best_j, mut best_d) = (0usize, f32::NAN);
        let mut j0 = 0;
        while j0 < m {
            let width = CBLOCK.min(m - j0);
            block_distances(x, ct, m, j0, width, &mut acc);
            for (jj, &v) in acc[..width].iter().enumerate() {
                // Strict `<` keeps the lowest index on ties; a NaN best is replaced by anything.
                if v < best_d || best_d.is_nan() && !v.is_nan() {
                    best_d = v;
                    best_j = j0 + jj;
                }
            }
            j0 += width;
        }
        idx[r] = best_j as u32;
        dist[r] = best_d;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn search_rows_fma(
    xs: &[f32],
    d: usize,
    ct: &[f32],
    m: usize,
    idx: &mut [u32],
    dist: &mut [f32],
) {
    search_rows(xs, d, ct, m, idx, dist)
}

pub(crate) fn nearest_centroid(
    x: Src,
    xl: &Layout,
    c: Src,
    cl: &Layout,
    out_i: Dst,
    il: &Layout,
    out_d: Dst,
    dl: &Layout,
) {
    let (n, d, m) = (xl.shape[0], xl.shape[1], cl.shape[0]);
    if n == 0 {
        return;
    }
    let xs = contiguous_f32(x, xl);
    let ct = contiguous_f32(c, &cl.transpose(0, 1).expect("rank 2"));
    let mut idx = vec![0u32; n];
    let mut dist = vec![0f32; n];
    #[cfg(target_arch = "x86_64")]
    let fma =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    const ROWS: usize = 64;
    idx.par_chunks_mut(ROWS)
        .zip(dist.par_chunks_mut(ROWS))
        .enumerate()
        .for_each(|(b, (ib, db))| {
            let rows = &xs[b * ROWS * d..((b * ROWS + ib.len()) * d)];
            #[cfg(target_arch = "x86_64")]
            if fma {
                // SAFETY: the CPU supports the enabled features (checked above).
                unsafe { search_rows_fma(rows, d, &ct, m, ib, db) };
                return;
            }
            search_rows(rows, d, &ct, m, ib, db);
        });
    let contiguous = Layout::contiguous(&[n]);
    elementwise::copy(
        Src {
            ptr: idx.as_ptr() as *const u8,
            dtype: DType::U32,
        },
        &contiguous,
        out_i,
        il,
    );
    elementwise::copy(
        Src {
            ptr: dist.as_ptr() as *const u8,
            dtype: DType::F32,
        },
        &contiguous,
        out_d,
        dl,
    );
}

pub(crate) fn segment_sum(
    x: Src,
    xl: &Layout,
    seg: &[u32],
    weights: Option<&[f32]>,
    sums: Dst,
    sl: &Layout,
    counts: Dst,
    cl: &Layout,
) {
    let (n, d, m) = (xl.shape[0], xl.shape[1], sl.shape[0]);
    let w = |i: usize| weights.map_or(1.0, |w| w[i] as f64);
    // Threads own disjoint column blocks and add rows in index order: deterministic.
    let block = d.div_ceil(2 * rayon::current_num_threads()).max(8);
    (0..d.div_ceil(block)).into_par_iter().for_each(|b| {
        let (k0, k1) = (b * block, ((b + 1) * block).min(d));
        let bw = k1 - k0;
        let mut acc = vec![0f64; m * bw];
        for (i, &s) in seg.iter().enumerate().take(n) {
            let wi = w(i);
            let base = xl.offset as isize + i as isize * xl.strides[0];
            let a = &mut acc[s as usize * bw..(s as usize + 1) * bw];
            for (kk, slot) in a.iter_mut().enumerate() {
                // SAFETY: the view was checked by the caller.
                *slot += wi * unsafe { x.load(base + (k0 + kk) as isize * xl.strides[1]) } as f64;
            }
        }
        for s in 0..m {
            for kk in 0..bw {
                // SAFETY: disjoint columns per thread.
                unsafe { sums.store(sl.index_of(&[s, k0 + kk]) as isize, acc[s * bw + kk] as f32) };
            }
        }
    });
    let mut cnt = vec![0f64; m];
    for (i, &s) in seg.iter().enumerate().take(n) {
        cnt[s as usize] += w(i);
    }
    for (s, &c) in cnt.iter().enumerate() {
        // SAFETY: the view was checked by the caller.
        unsafe { counts.store(cl.index_of(&[s]) as isize, c as f32) };
    }
}
