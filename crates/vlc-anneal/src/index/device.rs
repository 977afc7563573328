//! Search on a device: the index's lists, codes and tables uploaded once ([`DeviceSearch`]),
//! then every step of a round of queries enqueued on the backend with one read at the end:
//! the coarse product and `top_k` pick each query's probes, the query tables come from
//! matrix products, and `ivf_scan` scores the probed lists' codes and keeps each query's `k`
//! best (hal's `topk` family).
//!
//! With refine vectors ([`Index::with_refine`]), [`DeviceSearch::search_reranked`] keeps more
//! candidates than it returns and orders them on the device by their exact distances: the
//! candidates scored against their vectors by hal's `candidate_scores`, `top_k` again
//! (`device_refine.rs`).
//!
//! A probe's base distance here is `|q|^2 + (|a|^2 - 2 q . a)` from the product, where
//! [`Index::search`] and [`Index::search_batch`] recompute `|q - a|^2` exactly, so
//! distances differ from theirs by the rounding of that expansion (about `2^-24 |q|^2`), and
//! near-ties may order differently.

use super::Index;
use super::search::{check_rows, dot};
use crate::Metric;
use crate::vectors::Matrix;
use hal::topk::GPU_MAX_K;
use hal::{Backend, BackendExt, BinaryOp, DType, IvfScanInputs, Layout, View};

/// The most bytes one round's largest buffer (its tables or its coarse scores) may take (or
/// the device's largest buffer, where smaller).
const ROUND_BYTES: usize = 256 << 20;

/// An index's search structures on a backend: made once by [`Index::device_search`], used for
/// any number of searches of that index (unchanged: after [`Index::add`] or
/// [`Index::remove`], make a new one). It keeps the last search's round buffers (at most a
/// few hundred MB, the largest within the device's largest buffer) for the next.
pub struct DeviceSearch<B: Backend> {
    pub(super) backend: B,
    anchors: B::Buffer,
    /// `|a|^2` per anchor (L2 and cosine).
    norms: B::Buffer,
    books: B::Buffer,
    /// `|c|^2 + 2 a_j . c` per anchor, subspace and codeword (L2 and cosine); none for inner
    /// products.
    list_tables: Option<B::Buffer>,
    offsets: B::Buffer,
    codes: B::Buffer,
    positions: B::Buffer,
    /// What the structures were made from: vectors, anchors, bytes.
    shape: [usize; 3],
    /// The refine vectors on the device, uploaded by the first re-ranked search.
    pub(super) refine: std::sync::OnceLock<super::device_refine::Refine<B>>,
    /// The last search's round buffers (searches of one `DeviceSearch` take turns).
    rounds: std::sync::Mutex<Option<Rounds<B>>>,
}

/// A search's round buffers and what they were made for.
struct Rounds<B: Backend> {
    /// Queries a round holds.
    cap: usize,
    /// `[pool, nprobe, k, re-ranked]`.
    sizes: [usize; 4],
    bufs: Round<B>,
    refine: Option<super::device_refine::RefineRound<B>>,
}

impl Index {
    /// Uploads what [`DeviceSearch::search`] reads to `backend`, or `None` where the device
    /// search does not apply: an index without residual codes, or an L2 or cosine index whose
    /// precomputed tables exceed [`super::PRECOMPUTED_MAX_BYTES`].
    pub fn device_search<B: Backend>(&self, backend: &B) -> crate::Result<Option<DeviceSearch<B>>> {
        let ip = self.header.metric == Metric::InnerProduct;
        let bytes = self.pq.bytes();
        if bytes == 0 || self.header.n > u32::MAX as usize {
            return Ok(None);
        }
        let list_tables = if ip {
            None
        } else {
            match self.precomputed() {
                Some(pre) => Some(backend.upload(pre)?),
                None => return Ok(None),
            }
        };
        let lists = self.inverted();
        let words = bytes.div_ceil(4);
        let mut offsets = Vec::with_capacity(self.header.m + 1);
        let mut codes = Vec::with_capacity(self.header.n * words);
        let mut positions = Vec::with_capacity(self.header.n);
        offsets.push(0u32);
        for (ids, list) in lists.ids.iter().zip(&lists.codes) {
            for code in list.chunks_exact(bytes) {
                codes.extend(code.chunks(4).map(|w| {
                    w.iter()
                        .enumerate()
                        .fold(0u32, |acc, (t, &c)| acc | (c as u32) << (8 * t))
                }));
            }
            positions.extend_from_slice(ids);
            offsets.push(positions.len() as u32);
        }
        let d = self.header.d;
        let norms: Vec<f32> = self
            .anchors
            .chunks_exact(d.max(1))
            .map(|a| dot(a, a))
            .collect();
        Ok(Some(DeviceSearch {
            backend: backend.clone(),
            anchors: backend.upload(&self.anchors)?,
            norms: backend.upload(&norms)?,
            books: backend.upload(&self.pq.codebooks)?,
            list_tables,
            offsets: backend.upload(&offsets)?,
            codes: backend.upload(&codes)?,
            positions: backend.upload(&positions)?,
            shape: [self.header.n, self.header.m, bytes],
            refine: std::sync::OnceLock::new(),
            rounds: std::sync::Mutex::new(None),
        }))
    }
}

impl<B: Backend> DeviceSearch<B> {
    /// [`Index::search`] on the device: the `k` nearest of each query among the members of
    /// its `nprobe` nearest anchors, as `(vector, distance)` nearest first (the metric's
    /// distances, inner products largest first). `index` must be the index this was made
    /// from. Where the device cannot run it (`k` or `nprobe` above [`GPU_MAX_K`], tables
    /// beyond a GPU's on-chip memory) this is [`Index::search_batch`] with the backend's
    /// products.
    pub fn search(
        &self,
        index: &Index,
        queries: &Matrix,
        k: usize,
        nprobe: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        self.search_reranked(index, queries, k, nprobe, 0)
    }

    /// [`DeviceSearch::search`] keeping `candidates` (at least `k`) per query by their codes,
    /// then the `k` of them nearest by exact distance to their refine vectors, on the device
    /// ([`Index::search_reranked`] on the host; 0 candidates: no re-ranking). An index
    /// without refine vectors is an error. Distances are the metric's, computed as
    /// `|q|^2 + |v|^2 - 2 q . v` (so within `2^-22 |q|^2` or so of the host's).
    pub fn search_reranked(
        &self,
        index: &Index,
        queries: &Matrix,
        k: usize,
        nprobe: usize,
        candidates: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        self.made_for(index)?;
        let rerank = candidates > 0;
        if queries.cols != index.header.d || nprobe == 0 || (rerank && !index.has_refine()) {
            // The errors of the host search.
            return match rerank {
                true => index.search_reranked(&self.backend, queries, k, nprobe, candidates),
                false => index.search_batch(&self.backend, queries, k, nprobe),
            };
        }
        let prepared = index.header.metric.prepare(queries)?;
        self.run(index, &prepared.data, k, nprobe, candidates)
    }

    /// An error unless `index` is (still) the index this was made from.
    fn made_for(&self, index: &Index) -> crate::Result<()> {
        let h = &index.header;
        if self.shape != [h.n, h.m, index.pq.bytes()] {
            return Err(crate::error::input(
                "this device search was made for another index (or before vectors were added \
                 or removed): make a new one",
            ));
        }
        Ok(())
    }

    /// [`DeviceSearch::search_reranked`] of queries held in a slice (`n x d` values, row
    /// after row), read in place where the metric leaves them as they are (L2 and inner
    /// product): a batch of 10,000 384-d queries copied into a [`Matrix`] first cost
    /// milliseconds of page faults and copying.
    pub fn search_rows(
        &self,
        index: &Index,
        data: &[f32],
        k: usize,
        nprobe: usize,
        candidates: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        let h = &index.header;
        let whole = h.d > 0 && data.len() % h.d == 0;
        let refined = candidates == 0 || index.has_refine();
        if !whole || h.metric == Metric::Cosine || nprobe == 0 || !refined {
            // The checks and their errors, and the normalised copy of cosine queries.
            let (rows, cols) = match whole {
                true => (data.len() / h.d, h.d),
                false => (1, data.len()),
            };
            let q = Matrix::from_slice(rows, cols, data)?;
            return self.search_reranked(index, &q, k, nprobe, candidates);
        }
        self.made_for(index)?;
        self.run(index, data, k, nprobe, candidates)
    }

    /// The search of prepared queries of the index's dimension (`nprobe` at least 1; refine
    /// vectors present if `candidates` > 0).
    fn run(
        &self,
        index: &Index,
        data: &[f32],
        k: usize,
        nprobe: usize,
        candidates: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        let h = &index.header;
        let (d, m, len) = (h.d, h.m, index.pq.bytes() * index.pq.codewords);
        let rows_total = data.len() / d;
        let rerank = candidates > 0;
        let host = |data: &[f32]| -> crate::Result<Vec<Vec<(u32, f32)>>> {
            let queries = Matrix::from_slice(data.len() / d, d, data)?;
            match rerank {
                true => index.search_reranked(&self.backend, &queries, k, nprobe, candidates),
                false => index.search_batch(&self.backend, &queries, k, nprobe),
            }
        };
        let norms = check_rows(data, d, index.reach())?;
        let (nprobe, k) = (nprobe.min(m), k.min(h.n));
        // Candidates scored by the codes: `k`, or the re-ranked search's pool.
        let pool = if rerank {
            candidates.max(k).min(h.n)
        } else {
            k
        };
        if pool > GPU_MAX_K || nprobe > GPU_MAX_K {
            return host(data);
        }
        let ip = h.metric == Metric::InnerProduct;
        let scale = if ip { -1.0 } else { -2.0 };
        // Within the device's largest buffer too (lavapipe binds at most 128 MiB).
        let most = (self.backend.capabilities().max_buffer_bytes as usize).min(ROUND_BYTES);
        let per_round = (most / (4 * len.max(m).max(1))).clamp(1, 1 << 16);
        let cap = per_round.min(rows_total);
        // The round buffers of the last search, where they serve (as large, the same sizes):
        // allocating them took about half a millisecond a search.
        let mut held = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |r: &Rounds<B>| r.cap >= cap && r.sizes == [pool, nprobe, k, rerank as usize];
        if !held.as_ref().is_some_and(fits) {
            *held = None;
            let bufs = Round::new(&self.backend, index, cap, [pool, nprobe])?;
            let refine = match rerank {
                true => Some(super::device_refine::RefineRound::new(
                    &self.backend,
                    cap,
                    [pool, k, d],
                )?),
                false => None,
            };
            *held = Some(Rounds {
                cap,
                sizes: [pool, nprobe, k, rerank as usize],
                bufs,
                refine,
            });
        }
        let Rounds { bufs, refine, .. } = held.as_mut().expect("made above");
        let mut out = Vec::with_capacity(rows_total);
        for start in (0..rows_total).step_by(per_round) {
            let rows = per_round.min(rows_total - start);
            let q = &data[start * d..(start + rows) * d];
            let qn = &norms[start..start + rows];
            let ran = self
                .round(index, q, qn, rows, bufs, scale)
                .and_then(|(qb, qn)| match refine.as_mut() {
                    Some(r) => self.refine_round(index, &qb, qn.as_ref(), rows, bufs, r),
                    None => {
                        let b = &self.backend;
                        b.read_into(&bufs.dist, &mut bufs.dist_host)?;
                        Ok(b.read_into(&bufs.label, &mut bufs.label_host)?)
                    }
                });
            match ran {
                Ok(()) => {}
                // A device whose kernels cannot hold this index's tables (wgpu's workgroup
                // memory and 64-byte codes, say): the host search, whole.
                Err(crate::Error::Hal(hal::Error::Unsupported { .. })) if start == 0 => {
                    return host(data);
                }
                Err(e) => return Err(e),
            };
            let (dist, label) = match &refine {
                Some(r) => (&r.dist_host, &r.label_host),
                None => (&bufs.dist_host, &bufs.label_host),
            };
            for r in 0..rows {
                let found = (0..k)
                    .map(|c| (label[r * k + c], dist[r * k + c]))
                    .take_while(|&(l, _)| l != u32::MAX)
                    // Rounding can take an L2 distance below 0; inner products report -v.
                    .map(|(l, v)| (l, h.metric.reported(if ip { v } else { v.max(0.0) })))
                    .collect();
                out.push(found);
            }
        }
        Ok(out)
    }

    /// One round of `rows` queries (at most the round's capacity, their `|q|^2` in `qn`) in
    /// the first rows of `bufs`: every step enqueued, each query's `k` best by their codes
    /// left in `bufs.dist` and `bufs.label`. Returns the queries' buffer and, for L2 and
    /// cosine, their norms' (which a re-ranking adds too).
    fn round(
        &self,
        index: &Index,
        q: &[f32],
        qn: &[f32],
        rows: usize,
        bufs: &mut Round<B>,
        scale: f32,
    ) -> crate::Result<(B::Buffer, Option<B::Buffer>)> {
        let b = &self.backend;
        let h = &index.header;
        let m = h.m;
        let (bytes, cw) = (index.pq.bytes(), index.pq.codewords);
        let [k, nprobe] = bufs.sizes;
        let qb = b.upload(q)?;
        index.coarse_product(b, &qb, rows, &self.anchors, &bufs.scores, scale)?;
        let ls = Layout::contiguous(&[rows, m]);
        if self.list_tables.is_some() {
            // |a|^2 - 2 q . a: the ranking of |q - a|^2.
            let norms = Layout::contiguous(&[m]).broadcast_to(&[rows, m])?;
            b.binary(
                BinaryOp::Add,
                View::new(&bufs.scores, &ls),
                View::new(&self.norms, &norms),
                View::new(&bufs.scores, &ls),
            )?;
        }
        let lp = Layout::contiguous(&[rows, nprobe]);
        let (bases, probes) = (&bufs.bases, &bufs.probes);
        b.top_k(
            View::new(&bufs.scores, &ls),
            View::new(bases, &lp),
            View::new(probes, &lp),
            false,
        )?;
        let qn = match self.list_tables {
            Some(_) => {
                let qn = b.upload(qn)?;
                let ln = Layout::contiguous(&[rows, 1]).broadcast_to(&[rows, nprobe])?;
                b.binary(
                    BinaryOp::Add,
                    View::new(bases, &lp),
                    View::new(&qn, &ln),
                    View::new(bases, &lp),
                )?;
                Some(qn)
            }
            None => None,
        };
        index.table_product(b, &qb, rows, &self.books, &bufs.tables, scale)?;
        let [n, lists] = [h.n, m];
        let (lt, ll) = (
            Layout::contiguous(&[rows, bytes, cw]),
            Layout::contiguous(&[lists, bytes, cw]),
        );
        let lo = Layout::contiguous(&[lists + 1]);
        let (lc, li) = (
            Layout::contiguous(&[n, bytes.div_ceil(4)]),
            Layout::contiguous(&[n]),
        );
        let lk = Layout::contiguous(&[rows, k]);
        let (tables, dist, label) = (&bufs.tables, &bufs.dist, &bufs.label);
        b.ivf_scan(
            IvfScanInputs {
                tables: View::new(tables, &lt),
                list_tables: self.list_tables.as_ref().map(|t| View::new(t, &ll)),
                probes: View::new(probes, &lp),
                bases: View::new(bases, &lp),
                offsets: View::new(&self.offsets, &lo),
                codes: View::new(&self.codes, &lc),
                ids: View::new(&self.positions, &li),
            },
            View::new(dist, &lk),
            View::new(label, &lk),
        )?;
        Ok((qb, qn))
    }
}

/// A search's round buffers, made once for its largest round (`cap` queries): a short last
/// round uses their first rows.
pub(super) struct Round<B: Backend> {
    /// `[k, nprobe]`.
    sizes: [usize; 2],
    scores: B::Buffer,
    bases: B::Buffer,
    probes: B::Buffer,
    tables: B::Buffer,
    pub(super) dist: B::Buffer,
    pub(super) label: B::Buffer,
    dist_host: Vec<f32>,
    label_host: Vec<u32>,
}

impl<B: Backend> Round<B> {
    fn new(b: &B, index: &Index, cap: usize, [k, nprobe]: [usize; 2]) -> crate::Result<Self> {
        let len = index.pq.bytes() * index.pq.codewords;
        Ok(Round {
            sizes: [k, nprobe],
            scores: b.alloc_for_write(DType::F32, cap * index.header.m)?,
            bases: b.alloc_for_write(DType::F32, cap * nprobe)?,
            probes: b.alloc_for_write(DType::U32, cap * nprobe)?,
            tables: b.alloc_for_write(DType::F32, cap * len)?,
            dist: b.alloc_for_write(DType::F32, cap * k)?,
            label: b.alloc_for_write(DType::U32, cap * k)?,
            dist_host: vec![0.0; cap * k],
            label_host: vec![0; cap * k],
        })
    }
}
