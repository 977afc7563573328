//! Exact k-nearest neighbours, the ground truth of recall: the result is that of scanning
//! every row with [`sq`] (squared Euclidean distance in f32, ties to the lower index).
//!
//! A plain scan spends most of its time per pair (a horizontal sum and a comparison for
//! every row and query). Instead, a shortlist pass computes `|x|^2 + |q|^2 - 2 x.q` for eight
//! queries against tiles of 16 rows stored dimension-major, one vector multiply-add per
//! dimension and query, with a bound `E` on how far that can be from [`sq`]'s value. A row
//! whose lower bound exceeds the k-th smallest upper bound cannot be among the k nearest;
//! the rest are scored by [`sq`] itself, so the answer is the scan's to the bit. The inner
//! product (largest first) goes the same way, `x.q` bounded against [`dot`]'s. Data or
//! queries holding a value that is not finite, or norms near f32's range, take the scan.

use super::search::{TopK, dot, parallel_indices, parallel_map, sq};
use crate::vectors::Matrix;

/// Rows a tile holds, dimension-major.
const TILE: usize = 16;
/// Queries that go through the tiles together.
const QUERIES: usize = 8;
/// Below this many rows the scan is as quick.
const SHORTLIST_MIN_ROWS: usize = 4096;

/// The exact `k` nearest rows of `data` for each query (squared Euclidean distance, ties to
/// the lower index): the ground truth for recall. Where the shortlist applies it holds a
/// transposed copy of `data` while it runs (as much memory again).
pub fn exact_knn(data: &Matrix, queries: &Matrix, k: usize) -> Vec<Vec<u32>> {
    nearest(data, queries, k, Score::Squared)
}

/// What orders the rows: [`sq`], or the inner product's negation (largest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Score {
    Squared,
    Inner,
}

impl Score {
    #[inline]
    fn of(self, q: &[f32], x: &[f32]) -> f32 {
        match self {
            Score::Squared => sq(q, x),
            Score::Inner => -dot(q, x),
        }
    }
}

/// The `k` rows of least `score` for each query, ties to the lower index.
fn nearest(data: &Matrix, queries: &Matrix, k: usize, score: Score) -> Vec<Vec<u32>> {
    let k = k.min(data.rows);
    match Tiles::new(data, queries, k) {
        Some(tiles) => {
            let job = Job {
                data,
                queries,
                k,
                score,
            };
            let blocks = queries.rows.div_ceil(QUERIES);
            parallel_indices(blocks, &|b| tiles.block(&job, b))
                .into_iter()
                .flatten()
                .collect()
        }
        None => scan(data, queries, k, score),
    }
}

/// The exact `k` nearest of each query by `metric` (cosine: of the unit vectors; inner
/// product: the largest), nearest first.
pub fn exact_knn_by(
    data: &Matrix,
    queries: &Matrix,
    k: usize,
    metric: crate::Metric,
) -> crate::Result<Vec<Vec<u32>>> {
    if metric != crate::Metric::InnerProduct {
        let (d, q) = (metric.prepare(data)?, metric.prepare(queries)?);
        return Ok(exact_knn(&d, &q, k));
    }
    Ok(nearest(data, queries, k, Score::Inner))
}

/// Every row scored.
fn scan(data: &Matrix, queries: &Matrix, k: usize, score: Score) -> Vec<Vec<u32>> {
    parallel_map(queries, &|q: &[f32]| {
        let mut best = TopK::new(k);
        for i in 0..data.rows {
            best.push(score.of(q, data.row(i)), i as u32);
        }
        best.into_sorted().into_iter().map(|(i, _)| i).collect()
    })
}

/// One search through the tiles: the data, the queries, how many rows each wants and what
/// orders them.
struct Job<'a> {
    data: &'a Matrix,
    queries: &'a Matrix,
    k: usize,
    score: Score,
}

/// The data in dimension-major tiles, with each row's `|x|^2` and `|x|`.
struct Tiles {
    cols: usize,
    /// Tile `t` holds rows `16 t..16 t + 16` (zeros past the last), dimension by dimension.
    values: Vec<f32>,
    norms: Vec<f32>,
    roots: Vec<f32>,
    /// `E = slack (|x| + |q|)^2` bounds `|(|x|^2 + |q|^2 - 2 x.q) - sq(x, q)|`, and
    /// `slack |x| |q|` bounds the tiles' `x.q` against [`dot`]'s.
    slack: f32,
}

impl Tiles {
    /// `None` where the scan is the better (few rows, no query or k) or the only (values
    /// that are not finite, norms that could overflow) way.
    fn new(data: &Matrix, queries: &Matrix, k: usize) -> Option<Self> {
        let cols = data.cols;
        if k == 0 || data.rows < SHORTLIST_MIN_ROWS || queries.rows == 0 || queries.cols != cols {
            return None;
        }
        // Squared norms (and so every term below) at most 2^100: far from f32's range.
        let bounded = |m: &Matrix| {
            (0..m.rows).all(|i| {
                let n: f64 = m.row(i).iter().map(|&v| (v as f64) * (v as f64)).sum();
                n.is_finite() && n < 2f64.powi(100)
            })
        };
        if !bounded(data) || !bounded(queries) {
            return None;
        }
        let tiles = data.rows.div_ceil(TILE);
        let mut values = vec![0f32; tiles * TILE * cols];
        for i in 0..data.rows {
            let (t, lane) = (i / TILE, i % TILE);
            for (d, &v) in data.row(i).iter().enumerate() {
                values[(t * cols + d) * TILE + lane] = v;
            }
        }
        // Padded to whole tiles (the padding's bounds are computed, never offered).
        let mut norms: Vec<f32> = (0..data.rows)
            .map(|i| dot(data.row(i), data.row(i)))
            .collect();
        norms.resize(tiles * TILE, 0.0);
        let roots = norms.iter().map(|n| n.sqrt()).collect();
        // Each of |x|^2, |q|^2, x.q and sq is a sum of `cols` rounded products, within
        // gamma = (cols + 2) u of the exact value's magnitude sum (u = 2^-24), and the
        // combination adds three roundings: all told below 4 (cols + 5) u (|x| + |q|)^2.
        // Doubled for the rounding of E itself and of the square roots.
        let slack = (8.0 * (cols as f64 + 5.0) * 2f64.powi(-24)) as f32;
        Some(Self {
            cols,
            values,
            norms,
            roots,
            slack,
        })
    }

    /// The results of queries `QUERIES b..QUERIES (b + 1)`, in AVX2 where the CPU has it (the
    /// build targets baseline x86-64, whose vectors are four lanes wide).
    fn block(&self, job: &Job<'_>, b: usize) -> Vec<Vec<u32>> {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { self.block_avx2(job, b) };
        }
        self.block_body(job, b)
    }

    /// [`Tiles::block`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn block_avx2(&self, job: &Job<'_>, b: usize) -> Vec<Vec<u32>> {
        self.block_body(job, b)
    }

    #[inline(always)]
    fn block_body(&self, job: &Job<'_>, b: usize) -> Vec<Vec<u32>> {
        let Job {
            data,
            queries,
            k,
            score,
        } = *job;
        let first = b * QUERIES;
        let count = QUERIES.min(queries.rows - first);
        // A short block repeats its last query (those results are dropped).
        let q: [&[f32]; QUERIES] = std::array::from_fn(|j| queries.row(first + j.min(count - 1)));
        let qn: [f32; QUERIES] = std::array::from_fn(|j| dot(q[j], q[j]));
        let qr: [f32; QUERIES] = std::array::from_fn(|j| qn[j].sqrt());
        let mut lists: [Shortlist; QUERIES] = std::array::from_fn(|_| Shortlist::new(k));
        let cols = self.cols;
        for t in 0..data.rows.div_ceil(TILE) {
            let tile = &self.values[t * cols * TILE..(t + 1) * cols * TILE];
            let mut acc = [[0f32; TILE]; QUERIES];
            for d in 0..cols {
                let column: &[f32; TILE] = tile[d * TILE..(d + 1) * TILE]
                    .try_into()
                    .expect("a tile's column");
                for j in 0..QUERIES {
                    let v = q[j][d];
                    for lane in 0..TILE {
                        acc[j][lane] += v * column[lane];
                    }
                }
            }
            let rows = TILE.min(data.rows - t * TILE);
            let norms: &[f32; TILE] = self.norms[t * TILE..(t + 1) * TILE]
                .try_into()
                .expect("a tile's norms");
            let roots: &[f32; TILE] = self.roots[t * TILE..(t + 1) * TILE]
                .try_into()
                .expect("a tile's roots");
            for j in 0..count {
                // The tile's bounds in vectors; a row is looked at alone only where some
                // lower bound is within the threshold (padding lanes never are offered).
                let (mut lower, mut upper) = ([0f32; TILE], [0f32; TILE]);
                let threshold = lists[j].threshold;
                let mut any = false;
                for lane in 0..TILE {
                    let (approx, e) = match score {
                        Score::Squared => {
                            let reach = roots[lane] + qr[j];
                            let e = self.slack * reach * reach;
                            (norms[lane] + qn[j] - 2.0 * acc[j][lane], e)
                        }
                        Score::Inner => (-acc[j][lane], self.slack * roots[lane] * qr[j]),
                    };
                    lower[lane] = approx - e;
                    upper[lane] = approx + e;
                    any |= lower[lane] <= threshold;
                }
                if any {
                    for lane in 0..rows {
                        lists[j].offer(lower[lane], upper[lane], (t * TILE + lane) as u32);
                    }
                }
            }
        }
        lists
            .into_iter()
            .take(count)
            .enumerate()
            .map(|(j, list)| list.finish(data, q[j], k, score))
            .collect()
    }
}

/// One query's candidates: rows whose lower bound is within the k-th smallest upper bound
/// seen so far. The upper bounds are a plain heap rather than a [`TopK`] (which would keep the
/// same bound): with `TopK` the tile loop compiled to half the speed (GloVe, inner product:
/// 6.4 s against 13.4).
struct Shortlist {
    k: usize,
    /// The `k` smallest upper bounds (a max-heap), and the largest of them once there are `k`.
    uppers: std::collections::BinaryHeap<super::search::OrdF32>,
    threshold: f32,
    candidates: Vec<(f32, u32)>,
}

impl Shortlist {
    fn new(k: usize) -> Self {
        Self {
            k,
            uppers: std::collections::BinaryHeap::with_capacity(k + 1),
            threshold: f32::INFINITY,
            candidates: Vec::new(),
        }
    }

    #[inline]
    fn offer(&mut self, lower: f32, upper: f32, i: u32) {
        if lower > self.threshold {
            return;
        }
        self.candidates.push((lower, i));
        self.uppers.push(super::search::OrdF32(upper));
        if self.uppers.len() > self.k {
            self.uppers.pop();
        }
        if self.uppers.len() == self.k {
            self.threshold = self.uppers.peek().map_or(f32::INFINITY, |u| u.0);
        }
    }

    /// The `k` nearest: every candidate still within the threshold scored exactly.
    fn finish(self, data: &Matrix, q: &[f32], k: usize, score: Score) -> Vec<u32> {
        let mut best = TopK::new(k);
        for (lower, i) in self.candidates {
            if lower <= self.threshold {
                best.push(score.of(q, data.row(i as usize)), i);
            }
        }
        best.into_sorted().into_iter().map(|(i, _)| i).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fresh values in [-1, 1) from a seed.
    fn values(count: usize, seed: u64) -> Vec<f32> {
        (0..count as u64)
            .map(|i| (crate::splitmix(seed ^ i) >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }

    /// The shortlist gives the scan's answer to the bit: on random data with rows repeated
    /// (exact ties, broken by index), rows equal to queries (distance zero), near-copies one
    /// ulp apart, large and tiny magnitudes, odd widths, a block of queries not a multiple
    /// of eight, and k from 1 to past the tiles.
    #[test]
    fn the_shortlist_gives_the_scan_to_the_bit() {
        let seed = hal_parity::fresh_seed("VLC_SEED");
        eprintln!("seed {seed} (VLC_SEED={seed} repeats it)");
        // The last case sits far from the origin: |x|^2 + |q|^2 - 2 x.q cancels to noise
        // larger than the distances themselves, and only the bound keeps the true nearest.
        for (case, &(rows, cols, nq, scale, offset)) in [
            (SHORTLIST_MIN_ROWS + 37, 37usize, 13usize, 1.0f32, 0.0f32),
            (SHORTLIST_MIN_ROWS * 2 + 5, 8, 9, 1e6, 0.0),
            (SHORTLIST_MIN_ROWS, 50, 8, 1e-6, 0.0),
            (SHORTLIST_MIN_ROWS + 3, 16, 11, 1e-3, 1e3),
        ]
        .iter()
        .enumerate()
        {
            let seed = seed ^ case as u64;
            let spread = |v: &f32| v * scale + offset;
            let mut data: Vec<f32> = values(rows * cols, seed).iter().map(spread).collect();
            let queries: Vec<f32> = values(nq * cols, !seed).iter().map(spread).collect();
            // Rows 0..40 repeat at 1000..1040; row 2000 is query 0; row 2001 is query 1 moved
            // by one ulp in one coordinate.
            for i in 0..40 {
                let (a, b) = (i * cols, (1000 + i) * cols);
                data.copy_within(a..a + cols, b);
            }
            data[2000 * cols..2001 * cols].copy_from_slice(&queries[..cols]);
            data[2001 * cols..2002 * cols].copy_from_slice(&queries[cols..2 * cols]);
            data[2001 * cols] = f32::from_bits(data[2001 * cols].to_bits() + 1);
            let data = Matrix::new(rows, cols, data).unwrap();
            let queries = Matrix::new(nq, cols, queries).unwrap();
            for k in [1, 10, 100] {
                assert!(Tiles::new(&data, &queries, k).is_some());
                for score in [Score::Squared, Score::Inner] {
                    assert_eq!(
                        nearest(&data, &queries, k, score),
                        scan(&data, &queries, k, score),
                        "case {case}, k {k}, {score:?}"
                    );
                }
            }
            // Queries near the repeated rows: the pairs tie, lower index first.
            let near = Matrix::new(2, cols, data.data[5 * cols..7 * cols].to_vec()).unwrap();
            let found = exact_knn(&data, &near, 2);
            assert_eq!(found[0], vec![5, 1005], "case {case}");
        }
    }

    /// What the shortlist does not take: values that are not finite, norms near f32's range,
    /// few rows, no k.
    #[test]
    fn the_scan_takes_what_the_shortlist_cannot() {
        let (rows, cols) = (SHORTLIST_MIN_ROWS, 4);
        let good = Matrix::new(rows, cols, values(rows * cols, 7)).unwrap();
        let q = Matrix::new(1, cols, values(cols, 8)).unwrap();
        assert!(Tiles::new(&good, &q, 3).is_some());
        assert!(Tiles::new(&good, &q, 0).is_none());
        let mut bad = good.clone();
        bad.data[17] = f32::NAN;
        assert!(Tiles::new(&bad, &q, 3).is_none());
        assert_eq!(exact_knn(&bad, &q, 3), scan(&bad, &q, 3, Score::Squared));
        bad.data[17] = 1e30;
        assert!(Tiles::new(&bad, &q, 3).is_none());
        let few = Matrix::new(rows - 1, cols, good.data[cols..].to_vec()).unwrap();
        assert!(Tiles::new(&few, &q, 3).is_none());
    }
}
