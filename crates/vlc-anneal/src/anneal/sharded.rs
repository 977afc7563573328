//! The annealing loop over points split between devices: each rank of a
//! [`hal::Communicator`] holds a shard of the points, assigns them and sums them, and the
//! per-anchor sums, weights and energies are summed over the ranks before every update, so
//! every rank computes the same anchors from the same totals (every rank receives the same
//! bits from an all-reduce).
//!
//! The seeds are the ones a single device would draw from all the points: the seeding sample
//! (`seed_anchors`'s rows of the whole set) is assembled on every rank, each rank adding the
//! rows it holds (zeros elsewhere, so the sum is exact), and rank 0's k-means++ over it is
//! broadcast. What differs from a run on one device: maintenance rounds (merge, split, re-seed) do not run, since they read every
//! point's assignment on the host; and the sums add the shards' partial sums, a different
//! order from one device's, so [`super::Mode::Exact`] is refused (its promise is the same bits
//! on every backend, which a different summation order breaks).

use super::{Clustering, Config, IterationReport, Mode, Sharding, anneal_run, handle_for};
use crate::error::{Result, input};
use crate::vectors::Matrix;
use hal::collective::{CollectiveOp, Communicator};
use hal::{Backend, BackendExt, DType, Layout, View};

/// Anneals `shard` (this rank's points; every rank's must have the same dimension) together
/// with the other ranks of `comm`. Every rank returns the same anchors, energies and history;
/// the assignments and distances are its own shard's. Maintenance is off whatever
/// `cfg.maintain_every` says (see the module docs). The shards are the whole set's rows in rank
/// order (rank 0's first), which decides which rows the seeding sample takes.
pub fn anneal_sharded<C: Communicator>(
    comm: &C,
    shard: &Matrix,
    cfg: &Config,
    progress: &mut dyn FnMut(&IterationReport),
) -> Result<Clustering> {
    if cfg.mode == Mode::Exact {
        return Err(input(
            "exact mode runs on one device: a sharded run adds the shards' sums in another order",
        ));
    }
    let b = handle_for(comm.backend(), cfg.mode);
    let (n, d, m) = (shard.rows, shard.cols, cfg.anchors);
    // The shards' sizes and dimensions, agreed by all ranks before anything else runs.
    let sizes = b.upload(&[n as f64])?;
    let dims = b.upload(&[d as f64, -(d as f64)])?;
    let one = Layout::contiguous(&[1]);
    let two = Layout::contiguous(&[2]);
    comm.all_reduce(
        CollectiveOp::Sum,
        View::new(&sizes, &one),
        View::new(&sizes, &one),
    )?;
    comm.all_reduce(
        CollectiveOp::Max,
        View::new(&dims, &two),
        View::new(&dims, &two),
    )?;
    let n_total = b.read::<f64>(&sizes)?[0] as usize;
    let dims = b.read::<f64>(&dims)?;
    if dims[0] != -dims[1] {
        return Err(input(format!(
            "the shards' dimensions differ: from {} to {}",
            -dims[1], dims[0]
        )));
    }
    let mut cfg = cfg.clone();
    cfg.maintain_every = 0;
    cfg.check(n_total, d)?;
    // Where this shard's rows start in the whole set.
    let size = comm.size();
    let mine = b.upload(&[n as f64])?;
    let all = b.alloc(DType::F64, size)?;
    comm.all_gather(
        View::new(&mine, &one),
        View::new(&all, &Layout::contiguous(&[size])),
    )?;
    let first: usize = b.read::<f64>(&all)?[..comm.rank()]
        .iter()
        .map(|&v| v as usize)
        .sum();
    let reduce = |buf: &<C::Backend as Backend>::Buffer, len: usize| {
        let l = Layout::contiguous(&[len]);
        comm.all_reduce(CollectiveOp::Sum, View::new(buf, &l), View::new(buf, &l))
    };
    let seeds = |x: &<C::Backend as Backend>::Buffer| {
        let rows: Vec<usize> = match super::seeding_rows(n_total, m, cfg.seed) {
            Some(rows) => rows,
            None => (0..n_total).collect(),
        };
        let k = rows.len();
        let sample = b.alloc(DType::F32, k * d)?;
        // This shard's rows of the sample: a contiguous run of it, rows ascending.
        let at = rows.partition_point(|&r| r < first);
        let local: Vec<u32> = rows[at..]
            .iter()
            .take_while(|&&r| r < first + n)
            .map(|&r| (r - first) as u32)
            .collect();
        if !local.is_empty() {
            let index = b.upload(&local)?;
            let mut place = Layout::contiguous(&[local.len(), d]);
            place.offset = at * d;
            crate::gather_rows(
                &b,
                View::new(x, &Layout::contiguous(&[n, d])),
                &index,
                0,
                View::new(&sample, &place),
            )?;
        }
        let whole = Layout::contiguous(&[k * d]);
        comm.all_reduce(
            CollectiveOp::Sum,
            View::new(&sample, &whole),
            View::new(&sample, &whole),
        )?;
        let anchors = if comm.rank() == 0 {
            super::kmeans_pp(&b, &sample, k, d, m, cfg.seed)?
        } else {
            b.alloc_for_write(DType::F32, m * d)?
        };
        let l = Layout::contiguous(&[m * d]);
        comm.broadcast(0, View::new(&anchors, &l), View::new(&anchors, &l))?;
        Ok(anchors)
    };
    let sharding = Sharding {
        n_total,
        reduce: &reduce,
        seeds: &seeds,
    };
    Ok(anneal_run(&b, shard, &cfg, progress, Some(sharding))?.0)
}
