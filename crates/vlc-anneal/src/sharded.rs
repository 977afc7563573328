//! Compression with the vectors split over the ranks of a [`hal::Communicator`]: each rank
//! anneals, codes and reports its own rows, and every rank ends with the whole index.
//!
//! 1. [`crate::anneal_sharded`]: the anchors, the same on every rank.
//! 2. Residual codebooks trained by rank 0 on its own rows' residuals (a sample of the set,
//!    as FAISS trains on a sample) and broadcast; every rank codes its rows with them.
//! 3. The shards' assignments and codes gathered on every rank (each padded to the largest
//!    shard, then trimmed), the squared errors summed: the index of the whole set, rows in
//!    rank order.

use crate::anneal::{anneal_sharded_on, handle_for, shard_sizes};
use crate::error::{Result, input};
use crate::pq::{self, ProductQuantizer};
use crate::{
    Coded, Compressed, Config, Matrix, Progress, annealing_reports, assemble, round_anchors,
};
use hal::collective::{CollectiveOp, Communicator};
use hal::{Backend, BackendExt, DType, Layout, View};
use std::time::Instant;

/// [`crate::compress`] over the ranks of `comm`: `shard` is this rank's rows of the set (rank
/// 0's first, then rank 1's, ...; rank 0's shard trains the residual codebooks). Every rank
/// returns the same index; the clustering is this rank's (its assignments are its rows').
/// The annealing is [`crate::anneal_sharded`]'s: no maintenance rounds; in exact mode one device's
/// anchors bit for bit (the codebooks, trained on rank 0's rows, are not one device's).
pub fn compress_sharded<C: Communicator>(
    comm: &C,
    shard: &Matrix,
    cfg: &Config,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Compressed> {
    cfg.check_codes(shard.cols)?;
    let prepared = cfg.metric.prepare(shard)?;
    let data: &Matrix = &prepared;
    let start = Instant::now();
    let b = handle_for(comm.backend(), cfg.mode);
    progress(Progress::Phase {
        name: "seeding",
        steps: 0,
    });
    // The vectors go to the device once: the annealing and the residuals read them there.
    let x = b.upload(&data.data)?;
    let uploaded = start.elapsed().as_secs_f64();
    let mut clustering = anneal_sharded_on(
        comm,
        data,
        Some(x.clone()),
        cfg,
        &mut annealing_reports(cfg, progress),
    )?;
    // As in `compress`, the upload counts as seeding.
    clustering.seeding_seconds += uploaded;
    let annealed = start.elapsed().as_secs_f64();
    let (n, d) = (data.rows, data.cols);
    let anchors16 = round_anchors(&clustering.anchors)?;
    progress(Progress::Phase {
        name: "coding",
        steps: cfg.pq_iterations,
    });
    let sizes = shard_sizes(comm, &b, n)?;
    let n_total: usize = sizes.iter().sum();
    let (pq, codes, squared_error) = if cfg.pq_bytes > 0 {
        let rounded: Vec<f32> = anchors16.iter().map(|v| v.to_f32()).collect();
        let a = b.upload(&rounded)?;
        let assign = b.upload(&clustering.assignments)?;
        let src = pq::Residuals {
            x: &x,
            anchors: &a,
            assign: &assign,
            n,
            d,
        };
        let trained = if comm.rank() == 0 {
            Some(pq::learn(
                &b,
                &src,
                &clustering.assignments,
                cfg.pq_bytes,
                cfg.pq_iterations,
                cfg.pq_train_rows,
                cfg.seed,
                &mut |done| progress(Progress::Step(done)),
            )?)
        } else {
            None
        };
        let pq = broadcast_codebooks(comm, &b, d, cfg.pq_bytes, trained.as_ref().map(|t| &t.0))?;
        let (codes, error) = match trained.and_then(|t| t.1) {
            Some(coded) => coded,
            None => pq.code_all(&b, &src)?,
        };
        (pq, codes, error)
    } else {
        let pq = ProductQuantizer {
            dim: d,
            codewords: 0,
            bounds: vec![0],
            codebooks: Vec::new(),
        };
        let error = crate::reconstruction_error(data.view(), &anchors16, &clustering.assignments);
        (pq, Vec::new(), error)
    };
    let squared_error = {
        let e = b.upload(&[squared_error])?;
        let l = Layout::contiguous(&[1]);
        comm.all_reduce(CollectiveOp::Sum, View::new(&e, &l), View::new(&e, &l))?;
        b.read::<f64>(&e)?[0]
    };
    let assignments = gather_rows_of(comm, &b, &clustering.assignments, &sizes, 1)?;
    let codes = gather_codes(comm, &b, &codes, &sizes, cfg.pq_bytes)?;
    let coded = start.elapsed().as_secs_f64();
    let index = assemble(
        cfg,
        (n_total, d),
        clustering.energy,
        Coded {
            anchors: anchors16,
            assignments,
            pq,
            codes,
            squared_error,
        },
    )?;
    Ok(Compressed::timed(index, clustering, start, annealed, coded))
}

/// Rank 0's codebooks on every rank: their count first, then their values.
fn broadcast_codebooks<C: Communicator>(
    comm: &C,
    b: &C::Backend,
    d: usize,
    bytes: usize,
    trained: Option<&ProductQuantizer>,
) -> Result<ProductQuantizer> {
    let one = Layout::contiguous(&[1]);
    let count = b.upload(&[trained.map_or(0.0, |p| p.codewords as f64)])?;
    comm.broadcast(0, View::new(&count, &one), View::new(&count, &one))?;
    let codewords = b.read::<f64>(&count)?[0] as usize;
    let len = codewords * d;
    let values = match trained {
        Some(p) if p.codebooks.len() == len => b.upload(&p.codebooks)?,
        Some(_) => {
            return Err(input(
                "internal: the codebooks' size disagrees with their count",
            ));
        }
        None => b.alloc_for_write(DType::F32, len)?,
    };
    let l = Layout::contiguous(&[len]);
    comm.broadcast(0, View::new(&values, &l), View::new(&values, &l))?;
    Ok(ProductQuantizer {
        dim: d,
        codewords,
        bounds: pq::subspace_bounds(d, bytes),
        codebooks: b.read::<f32>(&values)?,
    })
}

/// Every rank's `per_row` words a row (`rows` this rank's), gathered in rank order.
fn gather_rows_of<C: Communicator>(
    comm: &C,
    b: &C::Backend,
    rows: &[u32],
    sizes: &[usize],
    per_row: usize,
) -> Result<Vec<u32>> {
    let widest = sizes.iter().copied().max().unwrap_or(0) * per_row;
    let mut padded = rows.to_vec();
    padded.resize(widest, 0);
    let mine = b.upload(&padded)?;
    let all = b.alloc(DType::U32, widest * sizes.len())?;
    comm.all_gather(
        View::new(&mine, &Layout::contiguous(&[widest])),
        View::new(&all, &Layout::contiguous(&[widest * sizes.len()])),
    )?;
    let all = b.read::<u32>(&all)?;
    Ok(sizes
        .iter()
        .enumerate()
        .flat_map(|(r, &n)| all[r * widest..r * widest + n * per_row].iter().copied())
        .collect())
}

/// Every rank's codes (`bytes` a row), gathered in rank order: packed four to a word for the
/// collective, unpacked after.
fn gather_codes<C: Communicator>(
    comm: &C,
    b: &C::Backend,
    codes: &[u8],
    sizes: &[usize],
    bytes: usize,
) -> Result<Vec<u8>> {
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let widest = sizes.iter().copied().max().unwrap_or(0) * bytes;
    let words = widest.div_ceil(4);
    let mut packed = vec![0u32; words];
    bytemuck::cast_slice_mut::<u32, u8>(&mut packed)[..codes.len()].copy_from_slice(codes);
    let all = gather_rows_of(comm, b, &packed, &vec![words; sizes.len()], 1)?;
    let all: &[u8] = bytemuck::cast_slice(&all);
    Ok(sizes
        .iter()
        .enumerate()
        .flat_map(|(r, &n)| {
            all[r * words * 4..r * words * 4 + n * bytes]
                .iter()
                .copied()
        })
        .collect())
}

impl crate::Index {
    /// Rows `rank * n / size .. (rank + 1) * n / size` as an index of their own, for
    /// [`search_sharded`]: the same anchors and codebooks, the rows' codes, refine vectors
    /// and ids (their positions here where this index has no ids, so results name the same
    /// vectors).
    pub fn shard(&self, rank: usize, size: usize) -> Result<crate::Index> {
        if size == 0 || rank >= size {
            return Err(input(format!("shard {rank} of {size}")));
        }
        let n = self.header.n;
        let rows = n * rank / size..n * (rank + 1) / size;
        let mut parts = self.parts();
        let (bytes, d) = (self.header.pq_bytes, self.header.d);
        parts.header.n = rows.len();
        parts.assignments = parts.assignments[rows.clone()].to_vec();
        parts.codes = parts.codes[rows.start * bytes..rows.end * bytes].to_vec();
        parts.refine = parts
            .refine
            .map(|r| r[rows.start * d..rows.end * d].to_vec());
        parts.ids = Some(rows.map(|i| self.id(i)).collect());
        crate::Index::from_bytes(parts.to_bytes(), "(shard of an index)")
    }
}

/// Searches an index split over the ranks of `comm` ([`crate::Index::shard`] of one index on
/// every rank, its own shard on each): each rank searches its rows on its device
/// ([`crate::index::DeviceSearch`], or on the host where that does not apply) for every
/// query, the `k` best of each rank are gathered on every rank, and merged. Returns, per
/// query, the `k` best `(id, distance)` over the whole index, best first (ties to the
/// smaller id), the same on every rank: the unsplit index's results, since each vector's
/// distance does not depend on where it is held. `candidates` > 0 re-ranks by the refine
/// vectors, as [`crate::index::DeviceSearch::search_reranked`], each rank its own
/// `candidates`: the pool is the union of the ranks' (it holds the unsplit index's pool), so
/// the results are at least as near as the unsplit index's.
pub fn search_sharded<C: Communicator>(
    comm: &C,
    shard: &crate::Index,
    queries: &Matrix,
    k: usize,
    nprobe: usize,
    candidates: usize,
) -> Result<Vec<Vec<(u64, f32)>>> {
    let b = comm.backend();
    let q = queries.rows;
    let found = match shard.device_search(b)? {
        Some(device) => device.search_reranked(shard, queries, k, nprobe, candidates)?,
        None if candidates > 0 => shard.search_reranked(b, queries, k, nprobe, candidates)?,
        None => shard.search(queries, k, nprobe)?,
    };
    // Larger is better for inner products; smaller for the other metrics.
    let larger = shard.header.metric == crate::Metric::InnerProduct;
    let worst = if larger {
        f32::NEG_INFINITY
    } else {
        f32::INFINITY
    };
    let mut distances = vec![worst; q * k];
    let mut ids = vec![u32::MAX; q * k * 2];
    for (i, hits) in found.iter().enumerate() {
        for (j, &(pos, dist)) in hits.iter().take(k).enumerate() {
            let id = shard.id(pos as usize);
            distances[i * k + j] = dist;
            ids[(i * k + j) * 2] = id as u32;
            ids[(i * k + j) * 2 + 1] = (id >> 32) as u32;
        }
    }
    let size = comm.size();
    let gather = |local: Vec<u32>| -> Result<Vec<u32>> {
        let mine = b.upload(&local)?;
        let all = b.alloc(DType::U32, local.len() * size)?;
        comm.all_gather(
            View::new(&mine, &Layout::contiguous(&[local.len()])),
            View::new(&all, &Layout::contiguous(&[local.len() * size])),
        )?;
        Ok(b.read::<u32>(&all)?)
    };
    let all_distances = gather(distances.iter().map(|d| d.to_bits()).collect())?;
    let all_ids = gather(ids)?;
    let mut out = Vec::with_capacity(q);
    for i in 0..q {
        let mut hits: Vec<(u64, f32)> = (0..size)
            .flat_map(|r| (0..k).map(move |j| r * q * k + i * k + j))
            .filter(|&at| all_ids[at * 2] != u32::MAX || all_ids[at * 2 + 1] != u32::MAX)
            .map(|at| {
                let id = all_ids[at * 2] as u64 | (all_ids[at * 2 + 1] as u64) << 32;
                (id, f32::from_bits(all_distances[at]))
            })
            .collect();
        hits.sort_by(|a, b| {
            let by = if larger {
                b.1.total_cmp(&a.1)
            } else {
                a.1.total_cmp(&b.1)
            };
            by.then(a.0.cmp(&b.0))
        });
        hits.truncate(k);
        out.push(hits);
    }
    Ok(out)
}
