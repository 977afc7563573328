//! Search over an index: IVF lists probed with asymmetric distance tables, and recall for
//! evaluation (exact k-NN, its ground truth, is `exact.rs`).

use super::Index;
use crate::vectors::Matrix;

/// Checks that every query is finite and that no squared distance between it and a vector
/// whose norm is at most `reach` can overflow f32 (so the ranking is exact, not a tie of
/// infinities): `(|q| + reach)^2`, with a margin for rounding, stays below `f32::MAX`. Rows
/// are checked on every core (a batch of 10,000 384-d queries took milliseconds on one), the
/// first bad one reported.
pub(crate) fn check_queries(queries: &Matrix, reach: f64) -> crate::Result<()> {
    check_rows(&queries.data, queries.cols, reach).map(drop)
}

/// [`check_queries`] of `d`-wide rows held in a slice; returns each row's `|q|^2` (f32, as
/// [`dot`] sums it), which the device search adds to its distances.
pub(crate) fn check_rows(data: &[f32], d: usize, reach: f64) -> crate::Result<Vec<f32>> {
    const LIMIT: f64 = f32::MAX as f64 / 4.0;
    let d = d.max(1);
    let check = |i: usize| -> crate::Result<f32> {
        let q = &data[i * d..(i + 1) * d];
        // The fast path: |q|^2 in f32 lanes is finite exactly when every value is and the sum
        // does not overflow (then the f64 bound below decides).
        let n2 = dot(q, q);
        if n2.is_finite() && (n2 as f64).sqrt() + reach <= LIMIT.sqrt() {
            return Ok(n2);
        }
        if let Some(j) = q.iter().position(|v| !v.is_finite()) {
            return Err(crate::error::input(format!(
                "query {i} holds a non-finite value ({}) at dimension {j}",
                q[j]
            )));
        }
        let norm = q.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
        if (norm + reach).powi(2) > LIMIT {
            return Err(crate::error::input(format!(
                "query {i} (norm {norm:.3e}) is too large: its squared distances to the indexed \
                 vectors (norms up to {reach:.3e}) overflow f32; scale the vectors down"
            )));
        }
        Ok(n2)
    };
    const CHUNK: usize = 512;
    let rows = data.len() / d;
    if rows <= CHUNK {
        // A thread's start costs more than these rows.
        return (0..rows).map(check).collect();
    }
    let parts = parallel_indices(rows.div_ceil(CHUNK), &|c| {
        (c * CHUNK..((c + 1) * CHUNK).min(rows))
            .map(check)
            .collect::<crate::Result<Vec<f32>>>()
    });
    Ok(parts
        .into_iter()
        .collect::<crate::Result<Vec<_>>>()?
        .concat())
}

/// Threads the host-side search and exact k-NN run on; 0 (the default) takes every core.
static THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sets the threads host-side search and exact k-NN run on (0: every core).
pub fn set_threads(threads: usize) {
    THREADS.store(threads, std::sync::atomic::Ordering::Relaxed);
}

/// The most memory search's precomputed tables may take (beyond it, each probed list's table
/// is computed from the query's residual instead).
pub const PRECOMPUTED_MAX_BYTES: usize = 256 << 20;

/// `sum_i f(a_i, b_i)` in eight interleaved partial sums (one SIMD register's lanes: a
/// single running sum is one dependent add after another, four cycles each, which left the
/// coarse step of a search at a quarter of the machine's speed), then the tail.
#[inline(always)]
fn lanes(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += f(x[l], y[l]);
        }
    }
    let mut total =
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (&x, &y) in at.iter().zip(bt) {
        total += f(x, y);
    }
    total
}

#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    lanes(a, b, |x, y| x * y)
}

#[inline]
pub(crate) fn sq(a: &[f32], b: &[f32]) -> f32 {
    lanes(a, b, |x, y| (x - y) * (x - y))
}

/// The `k` smallest `(distance, id)` pairs seen (ties to the lower id).
pub(crate) struct TopK {
    pub(crate) k: usize,
    pub(crate) heap: std::collections::BinaryHeap<(OrdF32, u32)>,
    /// The largest distance kept once `k` are (+inf before): a candidate farther than it
    /// cannot enter, which [`TopK::push`] settles without touching the heap (most of a scan's
    /// candidates, once the first `k` are in).
    bound: f32,
}

#[derive(Clone, Copy)]
pub(crate) struct OrdF32(pub(crate) f32);

impl PartialEq for OrdF32 {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for OrdF32 {}

impl PartialOrd for OrdF32 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdF32 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl TopK {
    pub(crate) fn new(k: usize) -> Self {
        Self {
            k,
            // Grows as results come: `k` may exceed what the probed lists hold.
            heap: std::collections::BinaryHeap::with_capacity(k.min(1024) + 1),
            bound: f32::INFINITY,
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, dist: f32, id: u32) {
        // Numerically farther is farther in the total order too; NaN, ties and signed zeros
        // take the exact path.
        if dist > self.bound {
            return;
        }
        self.push_exact(dist, id);
    }

    #[inline(never)]
    fn push_exact(&mut self, dist: f32, id: u32) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push((OrdF32(dist), id));
        } else if let Some(mut top) = self.heap.peek_mut()
            && (OrdF32(dist), id) < *top
        {
            // Replaced in place: one sift down where a pop and a push take two.
            *top = (OrdF32(dist), id);
        }
        if self.heap.len() == self.k
            && let Some((worst, _)) = self.heap.peek()
        {
            self.bound = worst.0;
        }
    }
    pub(crate) fn into_sorted(self) -> Vec<(u32, f32)> {
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|(d, i)| (i, d.0))
            .collect()
    }
}

/// `f` of every row of `queries`, spread over the machine's threads.
pub(crate) fn parallel_map<T: Send>(queries: &Matrix, f: &(dyn Fn(&[f32]) -> T + Sync)) -> Vec<T> {
    parallel_indices(queries.rows, &|i| f(queries.row(i)))
}

/// `f(i)` for `i` in `0..count`, in order, spread over the threads [`set_threads`] allows.
pub(crate) fn parallel_indices<T: Send>(count: usize, f: &(dyn Fn(usize) -> T + Sync)) -> Vec<T> {
    let threads = match THREADS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let per = count.div_ceil(threads).max(1);
    let mut out: Vec<T> = Vec::with_capacity(count);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..count)
            .step_by(per)
            .map(|start| {
                let end = (start + per).min(count);
                s.spawn(move || (start..end).map(f).collect::<Vec<T>>())
            })
            .collect();
        for h in handles {
            out.extend(h.join().expect("search threads do not panic"));
        }
    });
    out
}

/// Mean fraction of each query's true `k` nearest found among its returned `k`.
pub fn recall_at(truth: &[Vec<u32>], found: &[Vec<(u32, f32)>], k: usize) -> f64 {
    if truth.is_empty() {
        return 0.0;
    }
    let mut total = 0.0;
    for (t, f) in truth.iter().zip(found) {
        let t: std::collections::HashSet<u32> = t.iter().take(k).copied().collect();
        let hits = f.iter().take(k).filter(|(i, _)| t.contains(i)).count();
        total += hits as f64 / t.len().max(1) as f64;
    }
    total / truth.len() as f64
}

/// The inverted lists: each anchor's members in ascending order, and their residual codes
/// laid out list by list, so a probed list's codes stream from one place.
pub(crate) struct Lists {
    pub(crate) ids: Vec<Vec<u32>>,
    pub(crate) codes: Vec<Vec<u8>>,
}

impl Index {
    pub(super) fn inverted(&self) -> &Lists {
        self.lists.get_or_init(|| {
            let mut ids = vec![Vec::new(); self.header.m];
            for i in 0..self.header.n {
                ids[self.assignment(i) as usize].push(i as u32);
            }
            let codes = ids
                .iter()
                .map(|list| {
                    list.iter()
                        .flat_map(|&i| self.code(i as usize).iter().copied())
                        .collect()
                })
                .collect();
            Lists { ids, codes }
        })
    }

    /// Builds what search builds on first use (the inverted lists, the precomputed tables),
    /// so that timing a search times the search.
    pub fn prepare_search(&self) {
        let _ = (self.inverted(), self.precomputed());
    }

    /// Members of each anchor, in ascending order (built on first use).
    pub fn lists(&self) -> &[Vec<u32>] {
        &self.inverted().ids
    }

    /// The `k` nearest vectors of each query by asymmetric distance: the query is compared
    /// with the `nprobe` nearest anchors, and those anchors' members are scored on their
    /// residual codes (a per-subspace table of squared distances for each probed anchor).
    /// Results are `(vector, distance)`, nearest first: the squared distance, for a cosine
    /// index ([`crate::Metric`]) the cosine distance to the (normalised) query, for an
    /// inner-product index the inner product (largest first). Queries run in parallel.
    pub fn search(
        &self,
        queries: &Matrix,
        k: usize,
        nprobe: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        let (d, m) = (self.header.d, self.header.m);
        if queries.cols != d {
            return Err(crate::error::input(format!(
                "queries have dimension {}, the index {d}",
                queries.cols
            )));
        }
        if nprobe == 0 {
            return Err(crate::error::input(
                "nprobe must be at least 1 (the number of anchors whose members are scored)",
            ));
        }
        let metric = self.header.metric;
        let prepared = metric.prepare(queries)?;
        let queries: &Matrix = &prepared;
        check_queries(queries, self.reach())?;
        let nprobe = nprobe.min(m);
        // More results than vectors cannot be returned.
        let k = k.min(self.header.n);
        let lists = self.inverted();
        let ip = metric == crate::Metric::InnerProduct;
        let search_one = |q: &[f32]| -> Vec<(u32, f32)> {
            if ip {
                return self.search_ip(q, k, nprobe, lists);
            }
            let near = self.probe(nprobe, |a| sq(q, a));
            if let Some(pre) = self.precomputed() {
                return self.scan_l2(lists, &near, pre, &self.query_table(q, -2.0), k);
            }
            let mut best = TopK::new(k);
            let mut table = vec![0f32; self.pq.codewords.max(1) * self.pq.bytes()];
            let mut rq = vec![0f32; d];
            for &(_, a) in &near {
                let c = self.anchor(a as usize);
                for (r, (&qv, &cv)) in rq.iter_mut().zip(q.iter().zip(c)) {
                    *r = qv - cv;
                }
                let base = self.fill_table(&rq, &mut table);
                self.scan(lists, a as usize, base, &table, &mut best);
            }
            let mut found = best.into_sorted();
            found.iter_mut().for_each(|(_, d)| *d = metric.reported(*d));
            found
        };
        Ok(parallel_map(queries, &search_one))
    }

    /// An upper bound on the norm of every reconstruction: the largest anchor norm plus the
    /// norm of the largest codeword of every subspace together (computed once).
    pub(crate) fn reach(&self) -> f64 {
        *self.reach.get_or_init(|| {
            let norm = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>();
            let d = self.header.d;
            let anchors = self
                .anchors
                .chunks_exact(d)
                .map(norm)
                .fold(0.0, f64::max)
                .sqrt();
            let pq = &self.pq;
            let residual: f64 = (0..pq.bytes())
                .map(|j| {
                    let w = pq.bounds[j + 1] - pq.bounds[j];
                    pq.codebooks[pq.codebook_offset(j)..][..pq.codewords * w]
                        .chunks_exact(w)
                        .map(norm)
                        .fold(0.0, f64::max)
                })
                .sum();
            anchors + residual.sqrt()
        })
    }

    /// Fills `table[j * codewords + c] = |rq_j - codeword_jc|^2` and returns the squared
    /// norm of `rq`'s dimensions no subspace covers (all of it without residual codes).
    /// One query of an inner-product index: the `nprobe` anchors with the largest `q . a`,
    /// their members scored by `-(q . a + sum_j q_j . c_j)` (smallest first), reported as the
    /// inner product.
    fn search_ip(&self, q: &[f32], k: usize, nprobe: usize, lists: &Lists) -> Vec<(u32, f32)> {
        let near = self.probe(nprobe, |a| -dot(q, a));
        // The residual's part, -q_j . c for every subspace's codewords: one table a query.
        self.scan_ip(lists, &near, &self.query_table(q, -1.0), k)
    }

    /// The `k` best members of the probed lists `near` (`(-q . a, anchor)`) of an
    /// inner-product index, scored with the query's table `-q_j . c`; reported as the inner
    /// product, largest first.
    pub(crate) fn scan_ip(
        &self,
        lists: &Lists,
        near: &[(f32, u32)],
        table: &[f32],
        k: usize,
    ) -> Vec<(u32, f32)> {
        let mut best = TopK::new(k);
        for &(base, a) in near {
            self.scan(lists, a as usize, base, table, &mut best);
        }
        let mut found = best.into_sorted();
        found.iter_mut().for_each(|(_, s)| *s = -*s);
        found
    }

    /// The `k` nearest members of the probed lists `near` (`(|q - a|^2, anchor)`), by
    /// `|q - a - c|^2 = |q - a|^2 + (|c|^2 + 2 a.c) - 2 q.c` subspace by subspace: the middle
    /// term is the anchor's row of the precomputed tables `pre`, the last the query's
    /// `qterm`, so each probed list's table is one addition per entry. Reported as the
    /// index's metric reports distances.
    pub(crate) fn scan_l2(
        &self,
        lists: &Lists,
        near: &[(f32, u32)],
        pre: &[f32],
        qterm: &[f32],
        k: usize,
    ) -> Vec<(u32, f32)> {
        let mut best = TopK::new(k);
        let len = qterm.len();
        // Built only for a list long enough to want it.
        let mut table = Vec::new();
        for &(base, a) in near {
            let a = a as usize;
            let row = &pre[a * len..(a + 1) * len];
            if 8 * lists.ids[a].len() * self.header.pq_bytes < len {
                // Far fewer lookups than the table has entries: add the two terms at each
                // code instead (the same sums, so the same distances). Only then: the
                // anchor's precomputed row is usually out of cache, and adding it to the
                // query's terms streams it in order, where lookups would read it at random
                // (building the table for lists of 100 10-byte codes searched GloVe 30-50%
                // faster at nprobe 8-64).
                self.scan_pair(lists, a, base, [row, qterm], &mut best);
                continue;
            }
            table.resize(len, 0.0);
            for ((t, &p), &qv) in table.iter_mut().zip(row).zip(qterm) {
                *t = p + qv;
            }
            self.scan(lists, a, base, &table, &mut best);
        }
        let mut found = best.into_sorted();
        let metric = self.header.metric;
        found
            .iter_mut()
            .for_each(|(_, d)| *d = metric.reported(d.max(0.0)));
        found
    }

    /// Scores list `a`'s members: `base` plus each subspace's table entry for its code.
    fn scan(&self, lists: &Lists, a: usize, base: f32, table: &[f32], best: &mut TopK) {
        if self.header.pq_bytes == 0 {
            lists.ids[a].iter().for_each(|&i| best.push(base, i));
            return;
        }
        self.scan_by(lists, a, base, |x| table[x], best);
    }

    /// [`Self::scan`] with the table `first + second`, added entry by entry where a code
    /// reads it.
    fn scan_pair(
        &self,
        lists: &Lists,
        a: usize,
        base: f32,
        [first, second]: [&[f32]; 2],
        best: &mut TopK,
    ) {
        self.scan_by(lists, a, base, |x| first[x] + second[x], best);
    }

    /// Scores list `a`'s members: `base` plus `entry(j * codewords + code_j)` over the
    /// subspaces `j`. Four codes at a time: four independent chains of additions where one
    /// code's is a chain of `bytes` dependent ones (each code still adds its terms in subspace
    /// order, so the sums are the same bits as one code at a time).
    fn scan_by(
        &self,
        lists: &Lists,
        a: usize,
        base: f32,
        entry: impl Fn(usize) -> f32,
        best: &mut TopK,
    ) {
        let (k, bytes) = (self.pq.codewords, self.header.pq_bytes);
        let (ids, codes) = (&lists.ids[a], &lists.codes[a]);
        let quads = ids.len() / 4;
        for q in 0..quads {
            let block = &codes[4 * q * bytes..4 * (q + 1) * bytes];
            let mut dist = [base; 4];
            for j in 0..bytes {
                for (c, d) in dist.iter_mut().enumerate() {
                    *d += entry(j * k + block[c * bytes + j] as usize);
                }
            }
            for (c, &d) in dist.iter().enumerate() {
                best.push(d, ids[4 * q + c]);
            }
        }
        for (&i, code) in ids[4 * quads..]
            .iter()
            .zip(codes[4 * quads * bytes..].chunks_exact(bytes))
        {
            let mut dist = base;
            for (j, &c) in code.iter().enumerate() {
                dist += entry(j * k + c as usize);
            }
            best.push(dist, i);
        }
    }

    /// Per anchor `a`, subspace `j` and codeword `c`: `|c|^2 + 2 a_j . c`, the part of a
    /// squared distance to a reconstruction that does not depend on the query (`m x bytes x
    /// codewords`, FAISS's precomputed tables). Computed on first use; `None` without residual
    /// codes, or where the tables would take more than [`PRECOMPUTED_MAX_BYTES`].
    pub(crate) fn precomputed(&self) -> Option<&[f32]> {
        self.precomputed
            .get_or_init(|| {
                let pq = &self.pq;
                let (m, bytes, k) = (self.header.m, pq.bytes(), pq.codewords);
                let len = m.checked_mul(bytes)?.checked_mul(k)?;
                if bytes == 0 || len.saturating_mul(4) > PRECOMPUTED_MAX_BYTES {
                    return None;
                }
                let mut out = vec![0f32; len];
                out.chunks_mut(bytes * k).enumerate().for_each(|(a, row)| {
                    let anchor = self.anchor(a);
                    for j in 0..bytes {
                        let (lo, hi) = (pq.bounds[j], pq.bounds[j + 1]);
                        let w = hi - lo;
                        let book = &pq.codebooks[pq.codebook_offset(j)..][..k * w];
                        for (c, word) in book.chunks_exact(w).enumerate() {
                            let (mut norm, mut cross) = (0f32, 0f32);
                            for (&x, &y) in word.iter().zip(&anchor[lo..hi]) {
                                norm += x * x;
                                cross += x * y;
                            }
                            row[j * k + c] = norm + 2.0 * cross;
                        }
                    }
                });
                Some(out)
            })
            .as_deref()
    }

    /// The `nprobe` anchors of least `score(anchor)` (ties to the lower index), with their
    /// scores.
    fn probe(&self, nprobe: usize, score: impl Fn(&[f32]) -> f32) -> Vec<(f32, u32)> {
        smallest(self.header.m, nprobe, |a| score(self.anchor(a)))
    }

    /// `scale q_j . c` for every subspace `j` and codeword `c` (`bytes x codewords`).
    fn query_table(&self, q: &[f32], scale: f32) -> Vec<f32> {
        let pq = &self.pq;
        let k = pq.codewords;
        let mut out = vec![0f32; pq.bytes() * k];
        for j in 0..pq.bytes() {
            let (lo, hi) = (pq.bounds[j], pq.bounds[j + 1]);
            let w = hi - lo;
            let book = &pq.codebooks[pq.codebook_offset(j)..][..k * w];
            for (c, word) in book.chunks_exact(w).enumerate() {
                out[j * k + c] = scale * dot(&q[lo..hi], word);
            }
        }
        out
    }

    pub(crate) fn fill_table(&self, rq: &[f32], table: &mut [f32]) -> f32 {
        let pq = &self.pq;
        if pq.bytes() == 0 {
            return rq.iter().map(|v| v * v).sum();
        }
        for j in 0..pq.bytes() {
            let (lo, hi) = (pq.bounds[j], pq.bounds[j + 1]);
            let w = hi - lo;
            let book = &pq.codebooks[pq.codebook_offset(j)..][..pq.codewords * w];
            for (c, word) in book.chunks_exact(w).enumerate() {
                table[j * pq.codewords + c] = sq(&rq[lo..hi], word);
            }
        }
        0.0
    }
}

/// Probes at most this many lists by insertion into a short sorted list; more by selection.
const INSERTION_PROBES: usize = 16;

/// The `n` (at least 1) smallest of `score(a)` over `a < m` with their indices, ties to the
/// lower index, in no particular order: by one pass keeping a short sorted list where `n`
/// is small (a search probing a few lists: selection over every anchor built and
/// partitioned a vector of all `m` scores per query), else by selection.
pub(crate) fn smallest(m: usize, n: usize, score: impl Fn(usize) -> f32) -> Vec<(f32, u32)> {
    let before = |x: &(f32, u32), y: &(f32, u32)| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1));
    if n <= INSERTION_PROBES {
        let mut kept: Vec<(f32, u32)> = Vec::with_capacity(n + 1);
        for a in 0..m {
            let entry = (score(a), a as u32);
            if kept.len() == n && before(&entry, &kept[n - 1]).is_ge() {
                continue;
            }
            let at = kept.partition_point(|k| before(k, &entry).is_lt());
            kept.insert(at, entry);
            kept.truncate(n);
        }
        return kept;
    }
    let mut near: Vec<(f32, u32)> = (0..m).map(|a| (score(a), a as u32)).collect();
    near.select_nth_unstable_by(n - 1, before);
    near.truncate(n);
    near
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both paths of `smallest` (insertion and selection) pick the same set: the `n` least
    /// by score, ties to the lower index (scores drawn from a few values, so ties abound).
    #[test]
    fn smallest_picks_the_least_scores_ties_to_lower_indices() {
        let mut state = 0x5eedu64;
        for m in [1usize, 7, 64, 1000] {
            let scores: Vec<f32> = (0..m)
                .map(|_| {
                    state = crate::splitmix(state);
                    (state % 13) as f32 - 6.0
                })
                .collect();
            for n in 1..=m.min(40) {
                let mut got = smallest(m, n, |a| scores[a]);
                got.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
                let mut all: Vec<(f32, u32)> = scores
                    .iter()
                    .enumerate()
                    .map(|(a, &s)| (s, a as u32))
                    .collect();
                all.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
                assert_eq!(got, all[..n], "m {m}, n {n}");
            }
        }
    }

    /// `TopK` keeps the `k` least `(distance, id)` pairs in the total order (NaN after +inf,
    /// -0 before +0, ties to the lower id) whatever the order they come in, its early
    /// rejection of far candidates included.
    #[test]
    fn top_k_keeps_the_least_in_the_total_order() {
        let specials = [f32::NAN, f32::INFINITY, -0.0, 0.0, 1e-45, f32::MAX];
        let mut state = 0x70b0u64;
        for k in [0usize, 1, 3, 10, 64] {
            for round in 0..20 {
                let n = 1 + round * 13;
                let items: Vec<(f32, u32)> = (0..n)
                    .map(|i| {
                        state = crate::splitmix(state);
                        let d = match state % 5 {
                            0 => specials[(state >> 8) as usize % specials.len()],
                            _ => ((state >> 16) % 9) as f32 * 0.5,
                        };
                        (d, ((state >> 40) % 50) as u32 + i as u32 * 64)
                    })
                    .collect();
                let mut top = TopK::new(k);
                items.iter().for_each(|&(d, i)| top.push(d, i));
                let got: Vec<(u32, u32)> = top
                    .into_sorted()
                    .iter()
                    .map(|&(i, d)| (i, d.to_bits()))
                    .collect();
                let mut all = items.clone();
                all.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
                let want: Vec<(u32, u32)> =
                    all.iter().take(k).map(|&(d, i)| (i, d.to_bits())).collect();
                assert_eq!(got, want, "k {k}, {n} items");
            }
        }
    }
}
