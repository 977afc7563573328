//! Search of many queries at once: the coarse step (every query against every anchor) and the
//! queries' distance tables (every query against every subspace's codewords) as matrix
//! products on a backend, then the probed lists scanned on the host as [`Index::search`]
//! scans them. One query at a time, those two steps are `m d + 256 d` multiply-adds in
//! dot products (over 0.4 million at 1,024 anchors of 384 dimensions), which dominate a
//! search that probes few lists; as products over thousands of queries they run at the
//! backend's GEMM speed.

use super::Index;
use super::search::{check_queries, dot, parallel_indices, smallest, sq};
use crate::vectors::Matrix;
use hal::{Backend, BackendExt, DType, Layout, View};

/// Queries per round of products: small enough that a round's scores and tables (512
/// queries' 16 x 256 table entries are 8 MiB) stay in the caches between the product that
/// writes them and the scan that reads them.
const ROUND: usize = 512;

impl Index {
    /// [`Index::search`] of every query at once, its matrix products on `backend` (the CPU
    /// backend's GEMM, say): the same lists are probed and scored, and the results agree with
    /// [`Index::search`]'s up to f32 rounding (a product sums in another order than a dot
    /// product; each probed anchor's own distance is recomputed exactly). Falls back to
    /// [`Index::search`] for an index without residual codes or whose precomputed tables
    /// would be too large ([`super::search::PRECOMPUTED_MAX_BYTES`]).
    pub fn search_batch<B: Backend>(
        &self,
        backend: &B,
        queries: &Matrix,
        k: usize,
        nprobe: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        let (d, m) = (self.header.d, self.header.m);
        let ip = self.header.metric == crate::Metric::InnerProduct;
        let pre = self.precomputed();
        if queries.cols != d || nprobe == 0 || self.pq.bytes() == 0 || (pre.is_none() && !ip) {
            // The checks and their errors, or the per-query path.
            return self.search(queries, k, nprobe);
        }
        let prepared = self.header.metric.prepare(queries)?;
        let queries: &Matrix = &prepared;
        check_queries(queries, self.reach())?;
        let nprobe = nprobe.min(m);
        let k = k.min(self.header.n);
        let lists = self.inverted();
        let pq = &self.pq;
        let len = pq.bytes() * pq.codewords;
        let anchors = backend.upload(&self.anchors)?;
        let books = backend.upload(&pq.codebooks)?;
        let norms: Vec<f32> = (0..m)
            .map(|a| dot(self.anchor(a), self.anchor(a)))
            .collect();
        // The products come scaled as the scan uses them: `-2 q . a` and `-2 q_j . c` (L2),
        // `-q . a` and `-q_j . c` (inner product).
        let scale = if ip { -1.0 } else { -2.0 };
        // One round's scores and tables, on the device and on the host, made once: a short
        // last round fills the first rows and the rest are not read.
        let cap = ROUND.min(queries.rows);
        let outs = [
            backend.alloc(DType::F32, cap * m)?,
            backend.alloc(DType::F32, cap * len)?,
        ];
        let (mut scores, mut tables) = (vec![0f32; cap * m], vec![0f32; cap * len]);
        let mut out = Vec::with_capacity(queries.rows);
        for start in (0..queries.rows).step_by(ROUND) {
            let rows = ROUND.min(queries.rows - start);
            let q = backend.upload(&queries.data[start * d..(start + rows) * d])?;
            self.coarse_product(backend, &q, rows, &anchors, &outs[0], scale)?;
            self.table_product(backend, &q, rows, &books, &outs[1], scale)?;
            backend.read_into(&outs[0], &mut scores)?;
            backend.read_into(&outs[1], &mut tables)?;
            let (scores, tables) = (&scores, &tables);
            out.extend(parallel_indices(rows, &|r| {
                let qv = queries.row(start + r);
                let s = &scores[r * m..(r + 1) * m];
                let t = &tables[r * len..(r + 1) * len];
                // The coarse ranking from the product (|q|^2 is common to a query's anchors),
                // ties to the lower anchor as `probe` breaks them; then each probed anchor's
                // distance exactly.
                let rank = |a: usize| if ip { s[a] } else { norms[a] + s[a] };
                let mut near = smallest(m, nprobe, rank);
                for (base, a) in near.iter_mut() {
                    let anchor = self.anchor(*a as usize);
                    *base = if ip { -dot(qv, anchor) } else { sq(qv, anchor) };
                }
                match pre {
                    Some(pre) if !ip => self.scan_l2(lists, &near, pre, t, k),
                    _ => self.scan_ip(lists, &near, t, k),
                }
            }));
        }
        Ok(out)
    }

    /// `rows` queries' products with every anchor, times `scale`, into the first `rows x m`
    /// entries of `scores`.
    pub(super) fn coarse_product<B: Backend>(
        &self,
        b: &B,
        q: &B::Buffer,
        rows: usize,
        anchors: &B::Buffer,
        scores: &B::Buffer,
        scale: f32,
    ) -> crate::Result<()> {
        let (d, m) = (self.header.d, self.header.m);
        let a_t = Layout {
            shape: vec![d, m],
            strides: vec![1, d as isize],
            offset: 0,
        };
        b.matmul(
            View::new(q, &Layout::contiguous(&[rows, d])),
            View::new(anchors, &a_t),
            View::new(scores, &Layout::contiguous(&[rows, m])),
            scale,
            0.0,
        )?;
        Ok(())
    }

    /// `rows` queries' tables, `scale q_j . c` for every subspace `j` and codeword `c`
    /// (`rows x (bytes * codewords)`), one batched product per run of subspaces of one width.
    pub(super) fn table_product<B: Backend>(
        &self,
        b: &B,
        q: &B::Buffer,
        rows: usize,
        books: &B::Buffer,
        tables: &B::Buffer,
        scale: f32,
    ) -> crate::Result<()> {
        let d = self.header.d;
        let pq = &self.pq;
        let (bytes, kc) = (pq.bytes(), pq.codewords);
        let mut j = 0;
        while j < bytes {
            let w = pq.bounds[j + 1] - pq.bounds[j];
            let count = (j..bytes)
                .take_while(|&i| pq.bounds[i + 1] - pq.bounds[i] == w)
                .count();
            // Subspaces j..j+count: the queries' columns [bounds[j] + i w, + w) against each
            // codebook (`kc x w`, one after another), into columns (j + i) kc + c.
            let qs = Layout {
                shape: vec![count, rows, w],
                strides: vec![w as isize, d as isize, 1],
                offset: pq.bounds[j],
            };
            let cs = Layout {
                shape: vec![count, w, kc],
                strides: vec![(kc * w) as isize, 1, w as isize],
                offset: pq.codebook_offset(j),
            };
            let ts = Layout {
                shape: vec![count, rows, kc],
                strides: vec![kc as isize, (bytes * kc) as isize, 1],
                offset: j * kc,
            };
            b.matmul(
                View::new(q, &qs),
                View::new(books, &cs),
                View::new(tables, &ts),
                scale,
                0.0,
            )?;
            j += count;
        }
        Ok(())
    }
}
