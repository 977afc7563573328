//! The annealing loop over points split between devices: each rank of a
//! [`hal::Communicator`] holds a shard of the points, assigns them and sums them, and the
//! per-anchor sums, weights and energies are summed over the ranks before every update, so
//! every rank computes the same anchors from the same totals (every rank receives the same
//! bits from an all-reduce).
//!
//! The seeds are the ones a single device would draw from all the points: the seeding sample
//! (`seed_anchors`'s rows of the whole set) is assembled on every rank, each rank adding the
//! bits of the rows it holds (zeros elsewhere, so the sum is exact), and rank 0's k-means++
//! over it is broadcast.
//!
//! In fast mode the shards' partial sums are added over the ranks (an all-reduce a buffer).
//! In [`Mode::Exact`] the sums must be one device's bit for bit, and a device adds each
//! anchor's members in ascending order: so the shards take turns, in rank order, each
//! continuing the previous shard's chains from carry rows placed before its points
//! (`state::Carry`), and the last shard's sums are broadcast. The turns serialise the segment
//! sums (not the assignment), and the anchors are one device's.
//!
//! What differs from a run on one device: maintenance rounds (merge, split, re-seed) do not
//! run, since they read every point's assignment on the host.

use super::state::Shards;
use super::{Clustering, Config, IterationReport, Mode, Sharding, anneal_run, handle_for};
use crate::error::{Result, input};
use crate::vectors::Matrix;
use hal::collective::{CollectiveOp, Communicator};
use hal::{Backend, BackendExt, DType, Layout, View};

/// Anneals `shard` (this rank's points; every rank's must have the same dimension) together
/// with the other ranks of `comm`. Every rank returns the same anchors, energies and history;
/// the assignments and distances are its own shard's. Maintenance is off whatever
/// `cfg.maintain_every` says (see the module docs). The shards are the whole set's rows in rank
/// order (rank 0's first), which decides which rows the seeding sample takes. In
/// [`Mode::Exact`] the anchors, energies and assignments are a single device's run with
/// maintenance off, bit for bit.
pub fn anneal_sharded<C: Communicator>(
    comm: &C,
    shard: &Matrix,
    cfg: &Config,
    progress: &mut dyn FnMut(&IterationReport),
) -> Result<Clustering> {
    anneal_sharded_on(comm, shard, None, cfg, progress)
}

/// [`anneal_sharded`] with `shard`'s vectors already on this rank's device where given (the
/// sharded compression codes its residuals from them afterwards).
pub(crate) fn anneal_sharded_on<C: Communicator>(
    comm: &C,
    shard: &Matrix,
    x: Option<<C::Backend as Backend>::Buffer>,
    cfg: &Config,
    progress: &mut dyn FnMut(&IterationReport),
) -> Result<Clustering> {
    let b = handle_for(comm.backend(), cfg.mode);
    let (n, d, m) = (shard.rows, shard.cols, cfg.anchors);
    // The shards' sizes and dimensions, agreed by all ranks before anything else runs.
    let sizes = shard_sizes(comm, &b, n)?;
    let (n_total, first): (usize, usize) = (sizes.iter().sum(), sizes[..comm.rank()].iter().sum());
    let dims = b.upload(&[d as f64, -(d as f64)])?;
    let two = Layout::contiguous(&[2]);
    comm.all_reduce(
        CollectiveOp::Max,
        View::new(&dims, &two),
        View::new(&dims, &two),
    )?;
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
    let reduce = |buf: &<C::Backend as Backend>::Buffer, len: usize| {
        let l = Layout::contiguous(&[len]);
        comm.all_reduce(CollectiveOp::Sum, View::new(buf, &l), View::new(buf, &l))
    };
    let chain = |step: &mut dyn FnMut() -> hal::Result<()>,
                 outputs: [(&<C::Backend as Backend>::Buffer, usize); 2]| {
        for (buf, len) in outputs {
            b.fill(View::new(buf, &Layout::contiguous(&[len])), 0.0)?;
        }
        for r in 0..comm.size() {
            if comm.rank() == r {
                step()?;
            }
            for (buf, len) in outputs {
                let l = Layout::contiguous(&[len]);
                comm.broadcast(r, View::new(buf, &l), View::new(buf, &l))?;
            }
        }
        Ok(())
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
        // Added over the ranks as bits (each row is one rank's, zeros elsewhere), so every
        // value, negative zeros too, arrives unchanged.
        let bits: Vec<u32> = b
            .read::<f32>(&sample)?
            .iter()
            .map(|v| v.to_bits())
            .collect();
        let bits = b.upload(&bits)?;
        let whole = Layout::contiguous(&[k * d]);
        comm.all_reduce(
            CollectiveOp::Sum,
            View::new(&bits, &whole),
            View::new(&bits, &whole),
        )?;
        let values: Vec<f32> = b
            .read::<u32>(&bits)?
            .into_iter()
            .map(f32::from_bits)
            .collect();
        let sample = b.upload(&values)?;
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
        shards: match cfg.mode {
            Mode::Fast => Shards::Sum(&reduce),
            Mode::Exact => Shards::Chain(&chain),
        },
        seeds: &seeds,
    };
    Ok(anneal_run(&b, shard.view(), x, &cfg, progress, Some(sharding))?.0)
}

/// Every rank's row count, in rank order.
pub(crate) fn shard_sizes<C: Communicator>(
    comm: &C,
    b: &C::Backend,
    n: usize,
) -> Result<Vec<usize>> {
    let size = comm.size();
    let mine = b.upload(&[n as f64])?;
    let all = b.alloc(DType::F64, size)?;
    comm.all_gather(
        View::new(&mine, &Layout::contiguous(&[1])),
        View::new(&all, &Layout::contiguous(&[size])),
    )?;
    Ok(b.read::<f64>(&all)?.iter().map(|&v| v as usize).collect())
}
