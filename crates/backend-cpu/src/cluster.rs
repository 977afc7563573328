//! Nearest-centroid search and segment sums: the two primitives of k-means.

use crate::elementwise;
use crate::storage::{Dst, Src};
use hal::{DType, Layout};
use rayon::prelude::*;

/// Centroids per register block: the accumulators of one block stay in vector registers.
const CBLOCK: usize = 32;

/// The view as a contiguous f32 slice: borrowed when it already is one, copied otherwise.
fn f32_rows(src: Src, l: &Layout) -> std::borrow::Cow<'static, [f32]> {
    if src.dtype == DType::F32 && l.is_contiguous() {
        // SAFETY: the view was checked to lie inside its buffer, which outlives the call (the
        // execution lock is held), and f32 buffers are 4-byte aligned.
        let s =
            unsafe { std::slice::from_raw_parts((src.ptr as *const f32).add(l.offset), l.numel()) };
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(contiguous_f32(src, l))
}

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

/// Whether `nearest_centroid` ranks by a GEMM (`|c|^2 - 2 x.c`) rather than summing each
/// distance: worth it once the product is large enough to run at GEMM speed.
fn by_gemm(d: usize, m: usize) -> bool {
    d >= 16 && m >= 64
}

/// Distances of `x` to centroids `a` and `b` summed in the reference order (fma, by `k`).
#[inline(always)]
fn exact_distance(x: &[f32], c: &[f32]) -> f32 {
    x.iter().zip(c).fold(0f32, |acc, (&xv, &cv)| {
        let t = xv - cv;
        t.mul_add(t, acc)
    })
}

/// Nearest centroids by blocks of rows: one GEMM per block gives `-2 x.c` for every centroid
/// (no n x m matrix: a block's products are `ROWS x m`), the lowest `|c|^2 - 2 x.c` wins
/// (lowest index on ties), and its distance is recomputed with the reference's exact sum, so
/// the returned distance is an exact one; the ranking's rounding is what `hal`'s tolerance
/// allows. Rows run in parallel.
fn nearest_by_gemm(xs: &[f32], cs: &[f32], d: usize, m: usize, idx: &mut [u32], dist: &mut [f32]) {
    // Blocks of 256 rows, one per task: measured faster here than larger blocks with the GEMM
    // itself parallel (143 against 152 ms at 100,000 x 128 against 1024 on 2 cores).
    const ROWS: usize = 256;
    thread_local! {
        static TILE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let norms: Vec<f32> = cs
        .chunks_exact(d)
        .map(|c| c.iter().map(|v| v * v).sum())
        .collect();
    #[cfg(target_arch = "x86_64")]
    let fma =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    idx.par_chunks_mut(ROWS)
        .zip(dist.par_chunks_mut(ROWS))
        .enumerate()
        .for_each(|(blk, (ib, db))| {
            let rows = ib.len();
            let x = &xs[blk * ROWS * d..(blk * ROWS + rows) * d];
            TILE.with(|tile| {
                let mut tile = tile.borrow_mut();
                tile.resize(rows * m, 0.0);
                // tile = -2 x c^T, row-major rows x m (faer's kernels: AVX-512 where present).
                faer::linalg::matmul::matmul(
                    faer::MatMut::from_row_major_slice_mut(&mut tile[..rows * m], rows, m),
                    faer::Accum::Replace,
                    faer::MatRef::from_row_major_slice(x, rows, d),
                    faer::MatRef::from_row_major_slice(cs, m, d).transpose(),
                    -2.0f32,
                    faer::Par::Seq,
                );
                #[cfg(target_arch = "x86_64")]
                if fma {
                    // SAFETY: the CPU supports the enabled features (checked above).
                    unsafe { pick_rows_fma(&tile, x, cs, &norms, d, ib, db) };
                    return;
                }
                pick_rows(&tile, x, cs, &norms, d, ib, db);
            });
        });
}

/// For each row of a block: the centroid of lowest score (`tile` holds `-2 x.c`), then its
/// exact distance. Rows go eight at a time through the exact sums, each in the reference
/// order, so their fused multiply-add chains overlap.
#[inline(always)]
fn pick_rows(
    tile: &[f32],
    xs: &[f32],
    cs: &[f32],
    norms: &[f32],
    d: usize,
    ib: &mut [u32],
    db: &mut [f32],
) {
    let m = norms.len();
    for (r, i) in ib.iter_mut().enumerate() {
        let x = &xs[r * d..(r + 1) * d];
        *i = match lowest(&tile[r * m..(r + 1) * m], norms) {
            Some(j) => j as u32,
            None => {
                // NaN scores: the reference scan decides this row.
                let mut bj = (0usize, f32::NAN);
                for j in 0..m {
                    let v = exact_distance(x, &cs[j * d..(j + 1) * d]);
                    if v < bj.1 || bj.1.is_nan() && !v.is_nan() {
                        bj = (j, v);
                    }
                }
                bj.0 as u32
            }
        };
    }
    // Always eight chains (a short last group repeats its first row), so the accumulators
    // stay in registers.
    const LANES: usize = 8;
    let mut r0 = 0;
    while r0 < ib.len() {
        let lanes = LANES.min(ib.len() - r0);
        let lane_row = |l: usize| r0 + if l < lanes { l } else { 0 };
        let rows: [&[f32]; LANES] =
            std::array::from_fn(|l| &xs[lane_row(l) * d..(lane_row(l) + 1) * d]);
        let centroids: [&[f32]; LANES] = std::array::from_fn(|l| {
            let j = ib[lane_row(l)] as usize;
            &cs[j * d..(j + 1) * d]
        });
        let mut acc = [0f32; LANES];
        for k in 0..d {
            for l in 0..LANES {
                let t = rows[l][k] - centroids[l][k];
                acc[l] = t.mul_add(t, acc[l]);
            }
        }
        db[r0..r0 + lanes].copy_from_slice(&acc[..lanes]);
        r0 += lanes;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pick_rows_fma(
    tile: &[f32],
    xs: &[f32],
    cs: &[f32],
    norms: &[f32],
    d: usize,
    ib: &mut [u32],
    db: &mut [f32],
) {
    pick_rows(tile, xs, cs, norms, d, ib, db)
}

/// The index of the first smallest `minus_two_dot[j] + norms[j]`, or `None` when one is NaN.
/// Two passes, each a loop over sixteen lanes the compiler vectorises: the minimum, then the
/// first chunk of sixteen that holds it.
#[inline(always)]
fn lowest(minus_two_dot: &[f32], norms: &[f32]) -> Option<usize> {
    const LANES: usize = 16;
    let mut lanes = [f32::INFINITY; LANES];
    let mut nan = false;
    let chunks = || {
        minus_two_dot
            .chunks_exact(LANES)
            .zip(norms.chunks_exact(LANES))
    };
    for (t, c) in chunks() {
        for ((l, &a), &b) in lanes.iter_mut().zip(t).zip(c) {
            let v = a + b;
            nan |= v.is_nan();
            *l = if v < *l { v } else { *l };
        }
    }
    let mut min = lanes.iter().copied().fold(f32::INFINITY, f32::min);
    let done = minus_two_dot.len() / LANES * LANES;
    for (&a, &b) in minus_two_dot[done..].iter().zip(&norms[done..]) {
        let v = a + b;
        nan |= v.is_nan();
        min = min.min(v);
    }
    if nan {
        return None;
    }
    for (c, (t, n)) in chunks().enumerate() {
        let mut hit = false;
        for (&a, &b) in t.iter().zip(n) {
            hit |= a + b == min;
        }
        if hit {
            let within = t.iter().zip(n).position(|(&a, &b)| a + b == min);
            return Some(c * LANES + within.unwrap_or(0));
        }
    }
    minus_two_dot[done..]
        .iter()
        .zip(&norms[done..])
        .position(|(&a, &b)| a + b == min)
        .map(|j| done + j)
        .or(Some(0))
}

/// `reference`: the CPU reference's order of operations (always under
/// [`hal::Precision::Reproducible`]); otherwise large searches rank by GEMM and re-check.
#[allow(clippy::too_many_arguments)]
pub(crate) fn nearest_centroid(
    x: Src,
    xl: &Layout,
    c: Src,
    cl: &Layout,
    out_i: Dst,
    il: &Layout,
    out_d: Dst,
    dl: &Layout,
    reference: bool,
) {
    let (n, d, m) = (xl.shape[0], xl.shape[1], cl.shape[0]);
    if n == 0 {
        return;
    }
    let xs = f32_rows(x, xl);
    let mut idx = vec![0u32; n];
    let mut dist = vec![0f32; n];
    if !reference && by_gemm(d, m) {
        let cs = f32_rows(c, cl);
        nearest_by_gemm(&xs, &cs, d, m, &mut idx, &mut dist);
        store_results(&idx, &dist, out_i, il, out_d, dl);
        return;
    }
    let ct = contiguous_f32(c, &cl.transpose(0, 1).expect("rank 2"));
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
    store_results(&idx, &dist, out_i, il, out_d, dl);
}

fn store_results(idx: &[u32], dist: &[f32], out_i: Dst, il: &Layout, out_d: Dst, dl: &Layout) {
    let n = idx.len();
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

/// Segment sums: the rows as contiguous f32 (borrowed when they already are), threads owning
/// disjoint column blocks and adding rows in index order in f64: deterministic, whatever the
/// thread count.
#[allow(clippy::too_many_arguments)]
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

/// `segment_sum` of contiguous f32 rows.
#[allow(clippy::too_many_arguments)]
fn segment_sum_rows(
    xs: &[f32],
    d: usize,
    seg: &[u32],
    weights: Option<&[f32]>,
    sums: Dst,
    sl: &Layout,
    counts: Dst,
    cl: &Layout,
) {
    let m = sl.shape[0];
    let block = d.div_ceil(2 * rayon::current_num_threads()).max(8);
    (0..d.div_ceil(block)).into_par_iter().for_each(|b| {
        let (k0, k1) = (b * block, ((b + 1) * block).min(d));
        let bw = k1 - k0;
        let mut acc = vec![0f64; m * bw];
        for (i, &s) in seg.iter().enumerate() {
            let row = &xs[i * d + k0..i * d + k1];
            let a = &mut acc[s as usize * bw..(s as usize + 1) * bw];
            match weights {
                Some(w) => {
                    let wi = w[i] as f64;
                    for (slot, &v) in a.iter_mut().zip(row) {
                        *slot += wi * v as f64;
                    }
                }
                None => {
                    for (slot, &v) in a.iter_mut().zip(row) {
                        *slot += v as f64;
                    }
                }
            }
        }
        for s in 0..m {
            for kk in 0..bw {
                // SAFETY: threads own disjoint columns; the view was checked by the caller.
                unsafe { sums.store(sl.index_of(&[s, k0 + kk]) as isize, acc[s * bw + kk] as f32) };
            }
        }
    });
    let mut cnt = vec![0f64; m];
    for (i, &s) in seg.iter().enumerate() {
        cnt[s as usize] += weights.map_or(1.0, |w| w[i] as f64);
    }
    for (s, &c) in cnt.iter().enumerate() {
        // SAFETY: the view was checked by the caller.
        unsafe { counts.store(cl.index_of(&[s]) as isize, c as f32) };
    }
}

/// [`hal::Precision::Reproducible`]'s segment sum: each segment's rows added in ascending row
/// order in f32 with fused multiply-adds, the order every backend follows.
pub(crate) fn segment_sum_ordered(
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
    let w = |i: usize| weights.map_or(1.0, |w| w[i]);
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
