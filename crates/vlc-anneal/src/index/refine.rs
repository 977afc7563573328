//! Re-ranking: an index may keep its vectors beside their codes (in f16, as its metric
//! prepares them: unit length for cosine), so that a search can gather more candidates than
//! it returns by their codes and then order them by their exact distances to the query, as
//! FAISS's `IndexRefineFlat` does. Codes bound recall (a few bytes per vector cannot tell the
//! tenth nearest from the twentieth); exact scores of a few hundred candidates recover what
//! the probed lists hold, at the price of `2 d` bytes per vector.

use super::Index;
use super::search::{OrdF32, dot, parallel_indices, sq};
use crate::error::{Result, input};
use crate::vectors::{Matrix, MatrixRef};
use hal::Backend;
use half::f16;

/// `x`'s values in f16 (the caller has prepared them for the metric); a value beyond f16's
/// range is an error, since its distances could not be recovered.
pub(super) fn to_f16(x: MatrixRef<'_>) -> Result<Vec<f16>> {
    let out: Vec<f16> = x.data.iter().map(|&v| f16::from_f32(v)).collect();
    if let Some(at) = out.iter().position(|v| !v.is_finite()) {
        return Err(input(format!(
            "vector {} holds {} at dimension {}, beyond f16's range (65504) where the index \
             keeps vectors for re-ranking: scale the vectors down",
            at / x.cols.max(1),
            x.data[at],
            at % x.cols.max(1)
        )));
    }
    Ok(out)
}

impl Index {
    /// The same index keeping `x` (its `n` vectors, in the order they were compressed or
    /// added) for re-ranking ([`Index::rerank`], [`Index::search_reranked`]): `2 d` more
    /// bytes per vector in the file. `x` goes through the metric's preparation as the
    /// compressed vectors did.
    pub fn with_refine(&self, x: &Matrix) -> Result<Index> {
        self.with_refine_rows(x.view())
    }

    /// [`Self::with_refine`] of borrowed rows.
    pub fn with_refine_rows(&self, x: MatrixRef<'_>) -> Result<Index> {
        let (n, d) = (self.header.n, self.header.d);
        if x.rows != n || x.cols != d {
            return Err(input(format!(
                "the index holds {n} x {d} vectors; {} x {} were given to keep for re-ranking",
                x.rows, x.cols
            )));
        }
        let unit = self.header.metric.normalised(x)?;
        let mut parts = self.parts();
        parts.refine = Some(to_f16(unit.as_ref().map_or(x, Matrix::view))?);
        Index::from_bytes(parts.to_bytes(), "(index with refine vectors)")
    }

    /// The same index without its refine vectors (codes only).
    pub fn without_refine(&self) -> Result<Index> {
        let mut parts = self.parts();
        parts.refine = None;
        Index::from_bytes(parts.to_bytes(), "(index without refine vectors)")
    }

    /// Whether the index keeps its vectors for re-ranking.
    pub fn has_refine(&self) -> bool {
        self.refine.is_some()
    }

    /// The refine section's bytes (`n x d` f16, little-endian).
    pub(super) fn refine_bytes(&self) -> Option<&[u8]> {
        self.refine.clone().map(|r| &self.storage[r])
    }

    /// The refine vectors, decoded (for the parts of an edited index).
    pub(crate) fn refine_values(&self) -> Option<Vec<f16>> {
        self.refine_bytes().map(|b| {
            b.chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]))
                .collect()
        })
    }

    /// Vector `i`'s refine values in f32 (`bytes`: [`Index::refine_bytes`]).
    pub(super) fn refine_row(&self, bytes: &[u8], i: usize, out: &mut [f32]) {
        let d = self.header.d;
        for (o, c) in out
            .iter_mut()
            .zip(bytes[2 * d * i..2 * d * (i + 1)].chunks_exact(2))
        {
            *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
        }
    }

    /// Orders each query's candidates (`found[q]`, vectors by position as a search returns
    /// them) by their exact distances to the query, computed from the refine vectors, and
    /// keeps the `k` nearest: `(vector, distance)` in the metric's terms, as
    /// [`Index::search`] reports them (ties to the lower position). An index without refine
    /// vectors, a candidate beyond the index or a count of rows other than the queries' is
    /// an error.
    pub fn rerank(
        &self,
        queries: &Matrix,
        found: &[Vec<(u32, f32)>],
        k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        let (n, d) = (self.header.n, self.header.d);
        let bytes = self.refine_bytes().ok_or_else(|| {
            input("this index keeps no vectors to re-rank with (compress or add with refine)")
        })?;
        if queries.cols != d || queries.rows != found.len() {
            return Err(input(format!(
                "{} x {} queries for {} candidate lists of dimension-{d} vectors",
                queries.rows,
                queries.cols,
                found.len()
            )));
        }
        if let Some((q, &(v, _))) = found
            .iter()
            .enumerate()
            .find_map(|(q, f)| f.iter().find(|(v, _)| *v as usize >= n).map(|c| (q, c)))
        {
            return Err(input(format!(
                "candidate {v} of query {q} is beyond the index's {n} vectors"
            )));
        }
        let metric = self.header.metric;
        let prepared = metric.prepare(queries)?;
        let queries: &Matrix = &prepared;
        let ip = metric == crate::Metric::InnerProduct;
        let one = |qi: usize| -> Vec<(u32, f32)> {
            let q = queries.row(qi);
            let mut row = vec![0f32; d];
            let mut scored: Vec<(OrdF32, u32)> = found[qi]
                .iter()
                .map(|&(v, _)| {
                    self.refine_row(bytes, v as usize, &mut row);
                    let s = if ip { -dot(q, &row) } else { sq(q, &row) };
                    (OrdF32(s), v)
                })
                .collect();
            scored.sort_unstable();
            scored.dedup_by_key(|c| c.1);
            scored
                .into_iter()
                .take(k)
                .map(|(s, v)| (v, metric.reported(s.0)))
                .collect()
        };
        Ok(parallel_indices(queries.rows, &one))
    }

    /// [`Index::search_batch`] for `candidates` results per query (at least `k`), then
    /// [`Index::rerank`] to the `k` nearest by exact distance.
    pub fn search_reranked<B: Backend>(
        &self,
        backend: &B,
        queries: &Matrix,
        k: usize,
        nprobe: usize,
        candidates: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        if !self.has_refine() {
            return Err(input(
                "re-ranking needs an index that keeps its vectors (compress or add with refine)",
            ));
        }
        let found = self.search_batch(backend, queries, candidates.max(k), nprobe)?;
        self.rerank(queries, &found, k)
    }
}
