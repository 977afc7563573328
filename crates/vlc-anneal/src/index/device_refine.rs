//! The device search's re-ranking step: each query's pool of candidates (the labels
//! `ivf_scan` left, `u32::MAX` where the probed lists held fewer) scored against their refine
//! vectors by hal's `candidate_scores` (`|q|^2 + |v|^2 - 2 q . v` for L2 and cosine, `-q . v`
//! for inner products; no candidate scores `+inf`), `top_k` of the scores, and the winners'
//! labels gathered from the pool.

use super::Index;
use super::device::{DeviceSearch, Round};
use super::search::dot;
use crate::Metric;
use hal::{Backend, BackendExt, CandidateInputs, DType, Layout, View};

/// An index's refine vectors on a device.
pub(super) struct Refine<B: Backend> {
    /// `n x d` f16, as the index keeps them.
    vectors: B::Buffer,
    /// `|v|^2` per vector (L2 and cosine); none for inner products.
    norms: Option<B::Buffer>,
}

/// A re-ranked search's round buffers beyond [`Round`]'s (made once for `cap` queries).
pub(super) struct RefineRound<B: Backend> {
    /// `[pool, k, d]`.
    sizes: [usize; 3],
    scores: B::Buffer,
    dist: B::Buffer,
    picks: B::Buffer,
    label: B::Buffer,
    pub(super) dist_host: Vec<f32>,
    pub(super) label_host: Vec<u32>,
}

impl<B: Backend> RefineRound<B> {
    pub(super) fn new(b: &B, cap: usize, [pool, k, d]: [usize; 3]) -> crate::Result<Self> {
        Ok(RefineRound {
            sizes: [pool, k, d],
            scores: b.alloc_for_write(DType::F32, cap * pool)?,
            dist: b.alloc_for_write(DType::F32, cap * k)?,
            picks: b.alloc_for_write(DType::U32, cap * k)?,
            label: b.alloc_for_write(DType::U32, cap * k)?,
            dist_host: vec![0.0; cap * k],
            label_host: vec![0; cap * k],
        })
    }
}

impl<B: Backend> DeviceSearch<B> {
    /// The refine vectors on the device, uploaded on first use.
    fn refine_state(&self, index: &Index) -> crate::Result<&Refine<B>> {
        if let Some(r) = self.refine.get() {
            return Ok(r);
        }
        let b = &self.backend;
        let (n, d) = (index.header.n, index.header.d);
        let size = 2 * n as u64 * d as u64;
        let most = b.capabilities().max_buffer_bytes;
        if size > most {
            // The caller searches on the host instead.
            return Err(hal::Error::Unsupported {
                op: "re-ranking",
                detail: format!(
                    "{n} x {d} f16 refine vectors take {size} bytes; this device's largest \
                     buffer holds {most}"
                ),
            }
            .into());
        }
        let bytes = index
            .refine_bytes()
            .ok_or_else(|| crate::error::input("this index keeps no vectors to re-rank with"))?;
        let norms = match index.header.metric {
            Metric::InnerProduct => None,
            _ => {
                let mut row = vec![0f32; d];
                let squares: Vec<f32> = (0..n)
                    .map(|i| {
                        index.refine_row(bytes, i, &mut row);
                        dot(&row, &row)
                    })
                    .collect();
                Some(b.upload(&squares)?)
            }
        };
        let state = Refine {
            // The file's f16 values as they are: little-endian, as on every host we build for.
            vectors: b.upload_bytes(DType::F16, bytes)?,
            norms,
        };
        // A search racing this one may have set it first: either upload serves.
        let _ = self.refine.set(state);
        Ok(self.refine.get().expect("set above"))
    }

    /// The re-ranking of one round: `bufs` holds each query's pool (its labels), `qb` the
    /// `rows` prepared queries and `qn` their `|q|^2` (L2 and cosine); the `k` best by exact
    /// distance are read into `r`'s host vectors.
    pub(super) fn refine_round(
        &self,
        index: &Index,
        qb: &B::Buffer,
        qn: Option<&B::Buffer>,
        rows: usize,
        bufs: &Round<B>,
        r: &mut RefineRound<B>,
    ) -> crate::Result<()> {
        let st = self.refine_state(index)?;
        let b = &self.backend;
        let [pool, k, d] = r.sizes;
        let n = index.header.n;
        let (lq, lv, lp, lk) = (
            Layout::contiguous(&[rows, d]),
            Layout::contiguous(&[n, d]),
            Layout::contiguous(&[rows, pool]),
            Layout::contiguous(&[rows, k]),
        );
        let (ln, lr) = (Layout::contiguous(&[n]), Layout::contiguous(&[rows]));
        // |q|^2 for L2 and cosine (the round's), beside the vectors' |v|^2.
        debug_assert_eq!(qn.is_some(), st.norms.is_some());
        b.candidate_scores(
            CandidateInputs {
                queries: View::new(qb, &lq),
                vectors: View::new(&st.vectors, &lv),
                labels: View::new(&bufs.label, &lp),
                query_bias: qn.map(|v| View::new(v, &lr)),
                vector_bias: st.norms.as_ref().map(|v| View::new(v, &ln)),
            },
            if st.norms.is_some() { -2.0 } else { -1.0 },
            View::new(&r.scores, &lp),
        )?;
        b.top_k(
            View::new(&r.scores, &lp),
            View::new(&r.dist, &lk),
            View::new(&r.picks, &lk),
            false,
        )?;
        b.gather(
            View::new(&bufs.label, &lp),
            1,
            View::new(&r.picks, &lk),
            View::new(&r.label, &lk),
        )?;
        b.read_into(&r.dist, &mut r.dist_host)?;
        b.read_into(&r.label, &mut r.label_host)?;
        Ok(())
    }
}
