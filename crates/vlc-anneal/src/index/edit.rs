//! Changing an index without retraining it: vectors added (assigned to the current anchors,
//! coded with the current codebooks by [`crate::pq::ProductQuantizer::encode`]), vectors
//! removed by id, ids set. Each gives a new index; the one it came from is untouched (save the
//! new one over its file: the write is atomic).

use super::{Header, Index, IndexParts};
use crate::error::{Result, input};
use crate::vectors::{MAX_ID, Matrix};
use hal::{Backend, BackendExt, DType, Layout, View};
use half::f16;

impl Index {
    /// The index's parts, as [`IndexParts::to_bytes`] writes them.
    pub fn parts(&self) -> IndexParts {
        let n = self.header.n;
        IndexParts {
            header: self.header.clone(),
            anchors: self.anchors.iter().map(|&v| f16::from_f32(v)).collect(),
            assignments: (0..n).map(|i| self.assignment(i)).collect(),
            pq: self.pq.clone(),
            codes: self.storage[self.codes.clone()].to_vec(),
            ids: self.has_ids().then(|| (0..n).map(|i| self.id(i)).collect()),
            refine: self.refine_values(),
        }
    }

    /// The same index with `ids` (one per vector, each at most 2^63 - 1) as its vectors' ids.
    pub fn with_ids(&self, ids: Vec<u64>) -> Result<Index> {
        check_ids(&ids, self.header.n, "vectors in the index")?;
        let mut parts = self.parts();
        parts.ids = Some(ids);
        Index::from_bytes(parts.to_bytes(), "(index with ids)")
    }

    /// The index with `x`'s vectors added: each assigned to its nearest anchor (by the
    /// index's metric) and its residual coded with the current codebooks, on `backend`. Their
    /// ids are `ids` where given; otherwise positions, or where the index stores ids, the ids
    /// after its largest. The anchors and codebooks do not change (the header's energy is the
    /// training's still; its reconstruction error counts the new vectors too).
    pub fn add<B: Backend>(&self, backend: &B, x: &Matrix, ids: Option<&[u64]>) -> Result<Index> {
        let h = &self.header;
        let (n0, d, m) = (h.n, h.d, h.m);
        if x.cols != d {
            return Err(input(format!(
                "the vectors have dimension {}, the index {d}",
                x.cols
            )));
        }
        let n1 = x.rows;
        if n1 == 0 {
            return Err(input("there are no vectors to add"));
        }
        if n0 + n1 > super::MAX_VECTORS {
            return Err(input(format!(
                "an index holds at most {} vectors",
                super::MAX_VECTORS
            )));
        }
        if let Some(ids) = ids {
            check_ids(ids, n1, "vectors added")?;
        }
        let prepared = h.metric.prepare(x)?;
        let x: &Matrix = &prepared;
        // Nearest anchors.
        let b = backend;
        let xs = b.upload(&x.data)?;
        let anchors = b.upload(&self.anchors)?;
        let (assign, dist) = (
            b.alloc(DType::U32, n1.max(1))?,
            b.alloc(DType::F32, n1.max(1))?,
        );
        b.nearest_centroid(
            View::new(&xs, &Layout::contiguous(&[n1, d])),
            View::new(&anchors, &Layout::contiguous(&[m, d])),
            View::new(&assign, &Layout::contiguous(&[n1])),
            View::new(&dist, &Layout::contiguous(&[n1])),
        )?;
        let assignments: Vec<u32> = b.read::<u32>(&assign)?[..n1].to_vec();
        let (codes, squared_error) = self.code_residuals(b, x, &assignments)?;
        let mut parts = self.parts();
        if let Some(refine) = &mut parts.refine {
            refine.extend(super::refine::to_f16(x.view())?);
        }
        parts.header.mse = (h.mse * n0 as f64 + squared_error) / (n0 + n1) as f64;
        parts.header.n = n0 + n1;
        parts.assignments.extend_from_slice(&assignments);
        parts.codes.extend_from_slice(&codes);
        parts.ids = match (parts.ids.take(), ids) {
            (None, None) => None,
            (old, new) => {
                let mut all = old.unwrap_or_else(|| (0..n0 as u64).collect());
                let next = all.iter().max().map_or(0, |&v| v + 1);
                match new {
                    Some(new) => all.extend_from_slice(new),
                    None => {
                        if next.saturating_add(n1 as u64) > MAX_ID {
                            return Err(input("the ids after the largest run past 2^63 - 1"));
                        }
                        all.extend(next..next + n1 as u64);
                    }
                }
                Some(all)
            }
        };
        Index::from_bytes(parts.to_bytes(), "(index with vectors added)")
    }

    /// `x`'s residuals to their anchors coded with the index's codebooks (one byte per
    /// subspace), and the squared error left, summed over the vectors.
    fn code_residuals<B: Backend>(
        &self,
        b: &B,
        x: &Matrix,
        assignments: &[u32],
    ) -> Result<(Vec<u8>, f64)> {
        let (n, d) = (x.rows, x.cols);
        let mut residuals = x.data.clone();
        for (row, &a) in residuals.chunks_exact_mut(d).zip(assignments) {
            for (r, c) in row.iter_mut().zip(self.anchor(a as usize)) {
                *r -= c;
            }
        }
        self.pq.encode(b, &residuals, n)
    }

    /// The index without the vectors whose ids are in `ids` (and how many went). An index
    /// without stored ids gets its remaining vectors' positions as ids, so they keep the ids
    /// they had. At least as many vectors as anchors must remain.
    pub fn remove(&self, ids: &[u64]) -> Result<(Index, usize)> {
        let gone: std::collections::HashSet<u64> = ids.iter().copied().collect();
        let keep: Vec<usize> = (0..self.header.n)
            .filter(|&i| !gone.contains(&self.id(i)))
            .collect();
        let removed = self.header.n - keep.len();
        if keep.len() < self.header.m {
            return Err(input(format!(
                "removing {removed} of {} vectors would leave fewer than the {} anchors",
                self.header.n, self.header.m
            )));
        }
        let bytes = self.header.pq_bytes;
        let old = self.parts();
        let mut parts = IndexParts {
            header: Header {
                n: keep.len(),
                ..old.header
            },
            anchors: old.anchors,
            assignments: keep.iter().map(|&i| old.assignments[i]).collect(),
            pq: old.pq,
            codes: keep
                .iter()
                .flat_map(|&i| old.codes[i * bytes..(i + 1) * bytes].iter().copied())
                .collect(),
            ids: Some(keep.iter().map(|&i| self.id(i)).collect()),
            refine: old.refine.map(|all| {
                let d = self.header.d;
                keep.iter()
                    .flat_map(|&i| all[i * d..(i + 1) * d].iter().copied())
                    .collect()
            }),
        };
        // The reconstruction error of what remains is not known without the vectors: the
        // header keeps the last one measured.
        parts.header.mse = self.header.mse;
        Ok((
            Index::from_bytes(parts.to_bytes(), "(index with vectors removed)")?,
            removed,
        ))
    }
}

fn check_ids(ids: &[u64], n: usize, what: &str) -> Result<()> {
    if ids.len() != n {
        return Err(input(format!("{} ids for {n} {what}", ids.len())));
    }
    if let Some((i, v)) = ids.iter().enumerate().find(|(_, v)| **v > MAX_ID) {
        return Err(input(format!("id {v} at {i} is above 2^63 - 1")));
    }
    Ok(())
}
