//! The dense reduced solve: `S` formed on the device (`U` from the linearization, then per
//! solve `lambda D_c`, each instance's own `W_i M^-1 W_i'`, and each pair of instances that
//! read one block), read back, and factorised on the host by dense Cholesky.

use super::super::kernel::compile_all;
use super::layout::GroupLayout;
use super::{Shared, kernels};
use crate::Error;
use crate::dense::cholesky_solve;
use faer::dyn_stack::MemBuffer;
use faer::linalg::cholesky::llt::factor::cholesky_in_place_scratch;
use hal::{Backend, BackendExt, Layout, View};

/// The pairs of distinct instances (of groups `first` and `second`) that read one block.
struct Pairs<B: Backend> {
    first: usize,
    second: usize,
    /// `[count * 3]`: instance of `first`, instance of `second`, block.
    pairs: B::Buffer,
    count: usize,
    kernel: B::Kernel,
}

pub(super) struct Dense<B: Backend> {
    pairs: Vec<Pairs<B>>,
    /// `U` (written by the linearization) and `S`, `reduced x reduced`, column-major, lower.
    pub(super) u: B::Buffer,
    s: B::Buffer,
    s_host: Vec<f64>,
    scratch: MemBuffer,
}

impl<B: Backend> Dense<B> {
    pub(super) fn new(sh: &Shared<B>, layouts: &[GroupLayout]) -> Result<Self, Error> {
        let b = sh.backend();
        let precision = sh.compiled.precision;
        // Per eliminated block, the (group, instance) pairs that read it and some reduced
        // column (the others add nothing to `S`).
        let mut readers: Vec<Vec<(u32, u32)>> = vec![Vec::new(); sh.blocks];
        for (gi, l) in layouts.iter().enumerate() {
            if l.shape.eliminated.is_empty() || l.shape.reduced.is_empty() {
                continue;
            }
            for (i, &e) in l.blocks.iter().enumerate() {
                readers[e as usize].push((gi as u32, i as u32));
            }
        }
        // The pairs, bucketed by their groups (the first group's index not above the second's).
        let mut buckets: std::collections::BTreeMap<(u32, u32), Vec<u32>> = Default::default();
        for (e, list) in readers.iter().enumerate() {
            for (a, &(g1, i1)) in list.iter().enumerate() {
                for &(g2, i2) in &list[a + 1..] {
                    let (x, y) = if g1 <= g2 {
                        ((g1, i1), (g2, i2))
                    } else {
                        ((g2, i2), (g1, i1))
                    };
                    buckets
                        .entry((x.0, y.0))
                        .or_default()
                        .extend_from_slice(&[x.1, y.1, e as u32]);
                }
            }
        }
        drop(readers);
        let programs = buckets
            .keys()
            .map(|&(g1, g2)| {
                let (l1, l2) = (&layouts[g1 as usize].shape, &layouts[g2 as usize].shape);
                kernels::cross(precision, l1, l2)
            })
            .collect::<hal::Result<Vec<_>>>()?;
        let built = compile_all(b, &programs)?;
        let mut pairs = Vec::with_capacity(buckets.len());
        for (((g1, g2), list), kernel) in buckets.into_iter().zip(built) {
            pairs.push(Pairs {
                first: g1 as usize,
                second: g2 as usize,
                count: list.len() / 3,
                pairs: b.upload(&list)?,
                kernel,
            });
        }
        let n = sh.reduced;
        // The host's copy of S: refused, not an abort, where it cannot be had.
        let mut s_host: Vec<f64> = Vec::new();
        s_host.try_reserve_exact(n * n).map_err(|_| {
            Error::Solver(format!(
                "the dense Schur complement ({n} x {n} f64) does not fit in memory: use \
                 LinearSolver::IterativeSchur"
            ))
        })?;
        s_host.resize(n * n, 0.0);
        let scratch = MemBuffer::try_new(cholesky_in_place_scratch::<f64>(
            n,
            crate::all_cores(),
            Default::default(),
        ))
        .map_err(|_| Error::Solver("out of memory for the Schur scratch".into()))?;
        Ok(Self {
            pairs,
            u: b.alloc(precision.dtype(), n * n)?,
            s: b.alloc(precision.dtype(), n * n)?,
            s_host,
            scratch,
        })
    }

    /// Forms `S` and the right-hand side, factorises, and leaves the reduced step in `dc`.
    pub(super) async fn solve(&mut self, sh: &Shared<B>, lambda: f64) -> Result<(), Error> {
        let be = sh.backend();
        let n = sh.reduced;
        let l = Layout::contiguous(&[n * n]);
        be.copy(View::new(&self.u, &l), View::new(&self.s, &l))?;
        sh.eliminate(Some(&self.s))?;
        for p in &self.pairs {
            let (g1, g2) = (&sh.groups[p.first], &sh.groups[p.second]);
            let (w1, w2) = match (&g1.reads, &g2.reads) {
                (Some(a), Some(b)) => (&a.w, &b.w),
                _ => unreachable!("pairs are of groups that read blocks"),
            };
            be.launch(
                &p.kernel,
                &[
                    &sh.meta, &p.pairs, &g1.rcol, &g2.rcol, w1, w2, &sh.minv, &self.s,
                ],
                p.count,
            )?;
        }
        let mut rhs = be.read_f64_async(&sh.rhs).await?;
        if rhs[n] != 0.0 {
            return Err(Shared::<B>::not_positive(lambda, "an eliminated block"));
        }
        rhs.truncate(n);
        self.s_host = be.read_f64_async(&self.s).await?;
        super::super::schur::cholesky(&mut self.s_host, n, &mut self.scratch).map_err(|k| {
            Shared::<B>::not_positive(lambda, &format!("reduced system, pivot {k}"))
        })?;
        cholesky_solve(&self.s_host, n, &mut rhs);
        sh.compiled.write_floats(&sh.dc, &rhs)?;
        Ok(())
    }
}
