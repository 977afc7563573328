//! Nearest-centroid search: k-means' assignment step.

use crate::ops::elementwise;
use crate::storage::{CpuBuffer, Dst, Src};
use hal::{DType, Layout, View};
use rayon::prelude::*;

/// Centroids per register block: the accumulators of one block stay in vector registers.
const CBLOCK: usize = 32;

/// The view as a contiguous f32 slice: borrowed when it already is one, copied otherwise.
pub(crate) fn f32_rows(src: Src, l: &Layout) -> std::borrow::Cow<'static, [f32]> {
    if src.dtype == DType::F32 && l.is_contiguous() {
        // SAFETY: the view was checked to lie inside its buffer, which outlives the call (the
        // execution lock is held), and f32 buffers are 4-byte aligned.
        let s = unsafe { std::slice::from_raw_parts(src.as_f32().add(l.offset), l.numel()) };
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
    if m < FEW_CENTROIDS {
        search_rows_few(xs, d, ct, m, idx, dist)
    } else {
        search_rows_blocked(xs, d, ct, m, idx, dist)
    }
}

/// The reference search vectorised across blocks of `CBLOCK` centroids.
#[inline(always)]
fn search_rows_blocked(
    xs: &[f32],
    d: usize,
    ct: &[f32],
    m: usize,
    idx: &mut [u32],
    dist: &mut [f32],
) {
    let mut acc = [0f32; CBLOCK];
    for (r, x) in xs.chunks_exact(d.max(1)).enumerate().take(idx.len()) {
        let x = if d == 0 { &[][..] } else { x };
        let (mut best_j, mut best_d) = (0usize, f32::NAN);
        let mut j0 = 0;
        while j0 < m {
            let width = CBLOCK.min(m - j0);
            block_distances(x, ct, m, j0, width, &mut acc);
            for (jj, &v) in acc[..width].iter().enumerate() {
                if closer(v, best_d) {
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

/// Below this many centroids, vectorising across them leaves most lanes idle (k-means++
/// searches one centroid at a time): `search_rows_few` vectorises across rows instead.
const FEW_CENTROIDS: usize = 16;
const ROW_LANES: usize = 8;

/// The reference search for few centroids: eight rows at a time, their coordinates transposed
/// so that one vector operation advances all eight sums. Each row's distance is still summed
/// over `k` in order with fused multiply-adds, and the first strictly smaller one kept, so the
/// results are the same bits as `block_distances`'s.
#[inline(always)]
fn search_rows_few(xs: &[f32], d: usize, ct: &[f32], m: usize, idx: &mut [u32], dist: &mut [f32]) {
    let mut xt = vec![0f32; d * ROW_LANES];
    let mut r0 = 0;
    while r0 < idx.len() {
        let lanes = ROW_LANES.min(idx.len() - r0);
        for l in 0..ROW_LANES {
            // A short last group repeats its first row in the spare lanes.
            let r = r0 + if l < lanes { l } else { 0 };
            for k in 0..d {
                xt[k * ROW_LANES + l] = xs[r * d + k];
            }
        }
        let mut best_j = [0usize; ROW_LANES];
        let mut best_d = [f32::NAN; ROW_LANES];
        for j in 0..m {
            let mut acc = [0f32; ROW_LANES];
            for k in 0..d {
                let c = ct[k * m + j];
                let x = &xt[k * ROW_LANES..(k + 1) * ROW_LANES];
                for l in 0..ROW_LANES {
                    let t = x[l] - c;
                    acc[l] = t.mul_add(t, acc[l]);
                }
            }
            for l in 0..ROW_LANES {
                let v = acc[l];
                if closer(v, best_d[l]) {
                    best_d[l] = v;
                    best_j[l] = j;
                }
            }
        }
        for l in 0..lanes {
            idx[r0 + l] = best_j[l] as u32;
            dist[r0 + l] = best_d[l];
        }
        r0 += lanes;
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

/// Whether distance `v` replaces the best so far in the reference's scan: strictly smaller
/// (so the lowest index wins ties), or a number where the best is NaN.
#[inline(always)]
fn closer(v: f32, best: f32) -> bool {
    v < best || best.is_nan() && !v.is_nan()
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
/// (no n x m matrix: a block's products are `ROWS x m`), and the scores `|c|^2 - 2 x.c` pick
/// the candidates: every centroid whose score is within the rounding error bound of the
/// lowest (`score_slack`). Candidates are ranked by the reference's exact distance (lowest
/// index on ties), so the answer is the reference's own, at GEMM speed; a second candidate is
/// rare (a point about equally far from two centroids). Rows run in parallel.
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
    let largest_norm = norms.iter().fold(0f32, |m, &n| m.max(n)).sqrt();
    #[cfg(target_arch = "x86_64")]
    let fma = crate::has_avx2_fma();
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
                crate::math::clear_upper();
                #[cfg(target_arch = "x86_64")]
                if fma {
                    // SAFETY: the CPU supports the enabled features (checked above).
                    unsafe { pick_rows_fma(&tile, x, cs, d, &norms, largest_norm, ib, db) };
                    return;
                }
                pick_rows(&tile, x, cs, d, &norms, largest_norm, ib, db, hit_mask);
            });
        });
}

/// How far above the lowest computed score the exact nearest centroid's computed score can
/// be, for a point of norm `x_norm` and centroids of norm at most `c_norm` in dimension `d`.
/// Each score `|c|^2 - 2 x.c` is within `(d + 1) u (|x| + |c|)^2` of its true value (a sum of
/// `d` products and one more addition; `u = 2^-24`), and the reference's distance within
/// `d u (|x| + |c|)^2` of the true distance; the exact winner's score is at most the lowest
/// score plus two of each. Doubled for the f32 arithmetic of the bound itself.
#[inline(always)]
fn score_slack(d: usize, x_norm: f32, c_norm: f32) -> f32 {
    let u = f32::EPSILON / 2.0;
    let reach = x_norm + c_norm;
    8.0 * (d as f32 + 2.0) * u * reach * reach
}

/// For each row of a block: the candidates by score (`tile` holds `-2 x.c`), ranked by exact
/// distance; then the winners' exact distances, eight rows at a time so that their fused
/// multiply-add chains overlap (each summed in the reference order).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pick_rows(
    tile: &[f32],
    xs: &[f32],
    cs: &[f32],
    d: usize,
    norms: &[f32],
    largest_norm: f32,
    ib: &mut [u32],
    db: &mut [f32],
    hit_mask: impl Fn(&[f32], &[f32], f32) -> u32,
) {
    let m = norms.len();
    let mut found: Vec<u32> = Vec::new();
    for (r, i) in ib.iter_mut().enumerate() {
        let x = &xs[r * d..(r + 1) * d];
        let scores = &tile[r * m..(r + 1) * m];
        // None for NaN scores: every centroid is a candidate (the reference scan decides).
        let candidates =
            lowest_score(scores, norms).map(|low| low + score_slack(d, norm(x), largest_norm));
        // The candidates' indices, ascending; with one, no distance is needed here (the
        // winner's is computed below with the others).
        found.clear();
        match candidates {
            Some(limit) => {
                // Sixteen scores a step into a bit mask, its set bits the hits.
                let chunks = scores.chunks_exact(16).zip(norms.chunks_exact(16));
                for (c, (t, n)) in chunks.enumerate() {
                    let mut mask = hit_mask(t, n, limit);
                    while mask != 0 {
                        found.push((c * 16) as u32 + mask.trailing_zeros());
                        mask &= mask - 1;
                    }
                }
                let done = m / 16 * 16;
                found.extend(
                    (done..m)
                        .filter(|&j| scores[j] + norms[j] <= limit)
                        .map(|j| j as u32),
                );
            }
            None => found.extend(0..m as u32),
        }
        if found.len() <= 1 {
            *i = found.first().copied().unwrap_or(0);
            continue;
        }
        let mut best = (0u32, f32::NAN);
        for &j in &found {
            let v = exact_distance(x, &cs[j as usize * d..(j as usize + 1) * d]);
            if closer(v, best.1) {
                best = (j, v);
            }
        }
        *i = best.0;
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
    d: usize,
    norms: &[f32],
    largest_norm: f32,
    ib: &mut [u32],
    db: &mut [f32],
) {
    // SAFETY: this function runs only where AVX2 is present (its caller checks).
    let hit = |t: &[f32], n: &[f32], limit: f32| unsafe { hit_mask_avx(t, n, limit) };
    pick_rows(tile, xs, cs, d, norms, largest_norm, ib, db, hit)
}

/// [`hit_mask`] in two AVX compares of eight scores (the candidate scan's inner step: half
/// the instructions of the four SSE compares).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn hit_mask_avx(t: &[f32], n: &[f32], limit: f32) -> u32 {
    use std::arch::x86_64::{
        _CMP_LE_OQ, _mm256_add_ps, _mm256_cmp_ps, _mm256_loadu_ps, _mm256_movemask_ps,
        _mm256_set1_ps,
    };
    let (t, n): (&[f32; 16], &[f32; 16]) = (t.try_into().expect("16"), n.try_into().expect("16"));
    let limit = _mm256_set1_ps(limit);
    let mut mask = 0u32;
    for h in 0..2 {
        // SAFETY: the loads read t[8h..8h + 8] and n[8h..8h + 8], inside the arrays. The
        // ordered compare is false for NaN, as the SSE one is.
        let bits = unsafe {
            let v = _mm256_add_ps(
                _mm256_loadu_ps(t.as_ptr().add(8 * h)),
                _mm256_loadu_ps(n.as_ptr().add(8 * h)),
            );
            _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(v, limit))
        };
        mask |= (bits as u32) << (8 * h);
    }
    mask
}

/// Bit `j` set where `t[j] + n[j] <= limit`, for sixteen scores: four SSE compares and their
/// sign masks (baseline x86-64; the loop the compiler was given instead became sixteen
/// scalar shifts).
#[inline(always)]
fn hit_mask(t: &[f32], n: &[f32], limit: f32) -> u32 {
    let (t, n): (&[f32; 16], &[f32; 16]) = (t.try_into().expect("16"), n.try_into().expect("16"));
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            _mm_add_ps, _mm_cmple_ps, _mm_loadu_ps, _mm_movemask_ps, _mm_set1_ps,
        };
        let mut mask = 0u32;
        for q in 0..4 {
            // SAFETY: SSE is part of x86-64's baseline; the loads read t[4q..4q + 4] and
            // n[4q..4q + 4], inside the sixteen-element arrays.
            let bits = unsafe {
                let v = _mm_add_ps(
                    _mm_loadu_ps(t.as_ptr().add(4 * q)),
                    _mm_loadu_ps(n.as_ptr().add(4 * q)),
                );
                _mm_movemask_ps(_mm_cmple_ps(v, _mm_set1_ps(limit)))
            };
            mask |= (bits as u32) << (4 * q);
        }
        mask
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut mask = 0u32;
        for (j, (&a, &b)) in t.iter().zip(n).enumerate() {
            mask |= u32::from(a + b <= limit) << j;
        }
        mask
    }
}

/// `|x|`, summed in sixteen lanes the compiler vectorises (one running sum was a chain of
/// dependent adds per row); only the candidate slack takes it.
#[inline(always)]
fn norm(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    for c in x.chunks_exact(LANES) {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v * v;
        }
    }
    let tail: f32 = x
        .chunks_exact(LANES)
        .remainder()
        .iter()
        .map(|v| v * v)
        .sum();
    (lanes.iter().sum::<f32>() + tail).sqrt()
}

/// The smallest `minus_two_dot[j] + norms[j]`, or `None` when one is NaN: sixteen lanes the
/// compiler vectorises (NaN noted per lane too: a flag or-ed per element made a scalar test
/// of every step).
#[inline(always)]
fn lowest_score(minus_two_dot: &[f32], norms: &[f32]) -> Option<f32> {
    const LANES: usize = 16;
    let mut lanes = [f32::INFINITY; LANES];
    let mut nan_lanes = [0u32; LANES];
    let chunks = minus_two_dot
        .chunks_exact(LANES)
        .zip(norms.chunks_exact(LANES));
    for (t, c) in chunks {
        for (((l, f), &a), &b) in lanes.iter_mut().zip(&mut nan_lanes).zip(t).zip(c) {
            let v = a + b;
            *f |= u32::from(v.is_nan());
            *l = if v < *l { v } else { *l };
        }
    }
    let mut nan = nan_lanes.iter().any(|&f| f != 0);
    let mut min = lanes.iter().copied().fold(f32::INFINITY, f32::min);
    let done = minus_two_dot.len() / LANES * LANES;
    for (&a, &b) in minus_two_dot[done..].iter().zip(&norms[done..]) {
        let v = a + b;
        nan |= v.is_nan();
        min = min.min(v);
    }
    if nan { None } else { Some(min) }
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
    let fma = crate::has_avx2_fma();
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

/// [`nearest_centroid`] on validated rank-2 views `[x, centroids, out_index, out_distance]`.
pub(crate) fn nearest_centroid_views(
    [x, c, out_index, out_distance]: [View<'_, CpuBuffer>; 4],
    reproducible: bool,
) {
    nearest_centroid(
        x.buffer.src(),
        x.layout,
        c.buffer.src(),
        c.layout,
        out_index.buffer.dst(),
        out_index.layout,
        out_distance.buffer.dst(),
        out_distance.layout,
        reproducible,
    );
}

#[cfg(test)]
mod tests {
    use crate::CpuBackend;

    /// With few centroids the reference search runs across rows instead of centroids; the
    /// answers must be the same bits (odd row counts, ties included).
    #[test]
    fn few_centroid_search_matches_the_blocked_one() {
        let mut counter = 0u64;
        let mut uniform = || {
            counter += 1;
            let range = hal::Distribution::Uniform {
                low: -4.0,
                high: 4.0,
            };
            hal::random::random_value(range, 0x1234_5678_9abc_def1u64, counter)
        };
        for (n, d, m) in [
            (37usize, 19usize, 1usize),
            (101, 64, 3),
            (9, 128, 15),
            (17, 5, 7),
        ] {
            let xs: Vec<f32> = (0..n * d).map(|_| uniform()).collect();
            let mut cs: Vec<f32> = (0..m * d).map(|_| uniform()).collect();
            if m > 2 {
                // A duplicated centroid: ties must go to the lower index.
                let (a, b) = cs.split_at_mut(d);
                b[..d].copy_from_slice(a);
            }
            let mut ct = vec![0f32; d * m];
            for j in 0..m {
                for k in 0..d {
                    ct[k * m + j] = cs[j * d + k];
                }
            }
            let (mut i1, mut d1) = (vec![0u32; n], vec![0f32; n]);
            let (mut i2, mut d2) = (vec![0u32; n], vec![0f32; n]);
            super::search_rows_few(&xs, d, &ct, m, &mut i1, &mut d1);
            super::search_rows_blocked(&xs, d, &ct, m, &mut i2, &mut d2);
            assert_eq!(i1, i2, "n {n} d {d} m {m}");
            assert!(
                d1.iter().zip(&d2).all(|(a, b)| a.to_bits() == b.to_bits()),
                "n {n} d {d} m {m}"
            );
        }
    }
    use hal::{Backend, BackendExt, DType, Layout, Precision, View};

    /// The GEMM search re-ranks its candidates by the reference's exact distance, so its
    /// answers are the reference's own, also where centroids come in nearly equal pairs and
    /// points sit halfway between them (where a ranking by `|c|^2 - 2 x.c` alone flips).
    #[test]
    fn gemm_search_answers_like_the_reference_on_near_ties() {
        let (n, d, pairs) = (2000usize, 96usize, 40usize);
        let mut counter = 0u64;
        let mut uniform = || {
            counter += 1;
            let range = hal::Distribution::Uniform {
                low: -0.5,
                high: 0.5,
            };
            hal::random::random_value(range, 0x2545_f491_4f6c_dd1du64, counter)
        };
        let mut centroids = Vec::with_capacity(2 * pairs * d);
        for _ in 0..pairs {
            let base: Vec<f32> = (0..d).map(|_| 10.0 * uniform()).collect();
            let twin: Vec<f32> = base.iter().map(|&v| v + 1e-4 * uniform()).collect();
            centroids.extend_from_slice(&base);
            centroids.extend_from_slice(&twin);
        }
        let m = 2 * pairs;
        // Points: midpoints of a pair, nudged by a few ulps' worth, plus plain random ones.
        let mut points = Vec::with_capacity(n * d);
        for i in 0..n {
            let p = i % pairs;
            for k in 0..d {
                let (a, b) = (centroids[2 * p * d + k], centroids[(2 * p + 1) * d + k]);
                let v = if i % 4 == 3 {
                    10.0 * uniform()
                } else {
                    0.5 * (a + b) + 1e-6 * uniform()
                };
                points.push(v);
            }
        }
        let cpu = CpuBackend::new();
        let x = cpu.upload(&points).unwrap();
        let c = cpu.upload(&centroids).unwrap();
        let search = |b: &CpuBackend| {
            let (index, distance) = (
                b.alloc(DType::U32, n).unwrap(),
                b.alloc(DType::F32, n).unwrap(),
            );
            b.nearest_centroid(
                View::new(&x, &Layout::contiguous(&[n, d])),
                View::new(&c, &Layout::contiguous(&[m, d])),
                View::new(&index, &Layout::contiguous(&[n])),
                View::new(&distance, &Layout::contiguous(&[n])),
            )
            .unwrap();
            (
                b.read::<u32>(&index).unwrap(),
                b.read::<f32>(&distance).unwrap(),
            )
        };
        let (fast_index, fast_distance) = search(&cpu.with_precision(Precision::Fast));
        let (exact_index, exact_distance) = search(&cpu.with_precision(Precision::Reproducible));
        assert!(super::by_gemm(d, m), "the test must exercise the GEMM path");
        let differ = fast_index
            .iter()
            .zip(&exact_index)
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(
            differ, 0,
            "{differ} of {n} assignments differ from the reference"
        );
        assert!(
            fast_distance
                .iter()
                .zip(&exact_distance)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }
}
