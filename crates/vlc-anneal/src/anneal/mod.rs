//! The annealing loop: k-means++ seeding, robust (Huber-weighted) anchor updates scaled by a
//! cooling temperature with momentum, and maintenance (merge, split, re-seed), every
//! per-point step on the device.
//!
//! One iteration, all enqueued on the device:
//! 1. assignment: `nearest_centroid(x, anchors)` gives each point's anchor and squared
//!    distance `r^2`;
//! 2. the total squared distance, kept on the device in a slot per assignment: one `reduce`
//!    of `r^2` in fast mode; where a maintenance round needs per-anchor statistics, and always
//!    in exact mode, `segment_sum` of `r^2` gives each anchor's member count and sum of squared
//!    distances and a one-segment `segment_sum` of those (anchor order, so one fixed order) the
//!    total. The host reads the totals (energies) only when it needs them (tolerance test,
//!    maintenance, the end, live progress); the schedule (threshold, temperature, momentum) is
//!    uploaded once and read at a device counter;
//! 3. Huber weights (an IR kernel): `w = 1` where `r <= delta`, `delta / r` beyond, with
//!    `delta = huber * sqrt(energy)`: the data's own scale, the root-mean-square distance of a
//!    point to its anchor, so a point counts fully unless it lies more than `huber` times
//!    farther out than is typical;
//! 4. weighted sums: `segment_sum(x, assignment, w)`;
//! 5. update (an IR kernel): `v = momentum * v + T * (mean - anchor)`, `anchor += v`, where
//!    `mean` is the weighted mean of the members and `T` the temperature, cooling
//!    geometrically from `temperature.0` to `temperature.1`. An anchor with no members stays.
//!    By default the temperature starts at 1.5 and cools to 1: the early steps overshoot
//!    the mean (over-relaxed Lloyd steps), which moves anchors across the flat stretches of
//!    the energy faster than plain steps do; in 20 updates the final energy was lower than
//!    with plain or damped steps on every set tried (GloVe 50-d, two Gaussian mixtures, 256
//!    and 1,024 anchors; a start of 1 cooling to 0.7, the earlier default, was the highest).
//!
//! Nothing in steps 1-5 depends on a host value, so an update and the next assignment are
//! recorded once and replayed (one graph launch an iteration on CUDA), except around
//! maintenance.
//!
//! The last 30% of the updates polish: temperature 1, no momentum, and the Huber threshold
//! widened to `polish_huber` times the RMS distance, so that only far outliers stay
//! down-weighted while the anchors settle where the mean squared distance is lowest.
//!
//! Maintenance runs every `maintain_every` updates until 70% of them are done, on the
//! statistics it reads back then (assignments, distances, anchors): anchors closer than
//! `merge_distance * rms` merge (count-weighted), empty anchors are freed, and each freed slot
//! takes half of the anchor with the largest sum of squared distances (split along its
//! members' principal direction, found by power iteration) or, when no anchor is worth
//! splitting, the point farthest from its anchor. These decisions run on the host, in a fixed
//! order, so they are the same on every backend.
//!
//! [`anneal_sharded`] (`sharded.rs`) runs the loop over points split between the devices of a
//! [`hal::Communicator`], the sums added over the shards before each update.
//!
//! [`Mode::Exact`] runs on a [`hal::Precision::Reproducible`] handle: assignments and sums in
//! one fixed order with fused multiply-adds, and every other step exact IEEE arithmetic, so
//! CPU, wgpu and CUDA give identical assignments and anchors.

mod maintain;
pub(crate) mod programs;
mod sharded;
mod state;
#[cfg(test)]
mod tests;

use crate::error::{Result, input};
use crate::vectors::{Matrix, MatrixRef};
use hal::{Backend, BackendExt, DType, Layout, Precision, View};
use programs::{
    DEVICE_CHECK_ANCHORS, huber_program, keep_total_program, maintenance_check_program,
    maintenance_limits, take_row_program, update_program,
};
pub use sharded::anneal_sharded;
pub(crate) use sharded::{anneal_sharded_on, shard_sizes};
use state::{Pass, Reduce, Shards, State};
use std::time::Instant;

/// Fast or bit-reproducible arithmetic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The backend's fastest paths ([`hal::Precision::Fast`]): GEMM-style distances, on
    /// matrix units where the backend has them (candidates ranked in f16 or TF32, the chosen
    /// anchor's distance recomputed in f32), parallel sums.
    #[default]
    Fast,
    /// Identical results on every backend ([`hal::Precision::Reproducible`]); slower.
    Exact,
}

/// Parameters of a compression run. [`Config::new`] gives the defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Number of anchors `m` (`1 <= m <= n`).
    pub anchors: usize,
    /// Anchor updates; an assignment follows each, so the result is consistent.
    pub iterations: usize,
    pub seed: u64,
    pub mode: Mode,
    /// Stop early when the energy's relative change falls below this (0: never).
    pub tolerance: f64,
    /// Temperature at the first and the last annealed update (the first 70%), cooled
    /// geometrically in between: the fraction of the way to its members' mean an anchor
    /// steps (above 1 it overshoots; see the module docs).
    pub temperature: (f32, f32),
    pub momentum: f32,
    /// Huber threshold as a multiple of the root-mean-square point-to-anchor distance.
    pub huber: f32,
    /// The Huber multiple in the final polishing updates (at least `huber`).
    pub polish_huber: f32,
    /// Updates between maintenance rounds (0: no maintenance).
    pub maintain_every: usize,
    /// Anchors closer than this multiple of the RMS distance merge.
    pub merge_distance: f32,
    /// An anchor splits when its sum of squared distances exceeds this multiple of the mean.
    pub split_factor: f32,
    /// Bytes of product-quantised residual code per vector (0: anchors only).
    pub pq_bytes: usize,
    /// k-means iterations for each residual codebook.
    pub pq_iterations: usize,
    /// At most this many vectors (a seeded sample, where there are more) train the residual
    /// codebooks; every vector is then coded with them, a bounded chunk at a time, so the
    /// coding needs little memory beside the vectors themselves. FAISS's product quantiser
    /// samples 256 vectors per codeword (65,536); the default is four times that.
    pub pq_train_rows: usize,
    /// Wait for every iteration and report it as it finishes (per-iteration timings, live
    /// progress). Otherwise an iteration's energy is read back only when something needs it
    /// (the tolerance test, maintenance, the end), or every iteration once iterations take
    /// 10 ms or more.
    pub report_each_iteration: bool,
    /// How the index compares vectors ([`crate::Metric`]): a cosine index normalises the
    /// vectors before anything else.
    pub metric: crate::Metric,
}

impl Config {
    pub fn new(anchors: usize) -> Self {
        Self {
            anchors,
            iterations: 25,
            seed: 0,
            mode: Mode::Fast,
            tolerance: 0.0,
            temperature: (1.5, 1.0),
            momentum: 0.3,
            huber: 3.0,
            polish_huber: 8.0,
            maintain_every: 5,
            merge_distance: 0.05,
            split_factor: 4.0,
            pq_bytes: 8,
            pq_iterations: 12,
            pq_train_rows: 262_144,
            report_each_iteration: false,
            metric: crate::Metric::L2,
        }
    }

    /// The temperature of update `t` of `iterations`.
    pub fn temperature_at(&self, t: usize) -> f32 {
        let (hot, cold) = self.temperature;
        if self.iterations <= 1 || hot <= 0.0 || cold <= 0.0 {
            return hot;
        }
        let annealed = (self.iterations * 7 / 10).max(2);
        let f = (t as f64 / (annealed - 1) as f64).min(1.0);
        (hot as f64 * (cold as f64 / hot as f64).powf(f)) as f32
    }

    pub(crate) fn check(&self, n: usize, d: usize) -> Result<()> {
        if d == 0 {
            return Err(input("vectors have dimension 0"));
        }
        if n == 0 {
            return Err(input("no vectors to compress"));
        }
        if self.anchors == 0 {
            return Err(input("at least one anchor is needed"));
        }
        if self.anchors > n {
            return Err(input(format!(
                "{} anchors for {n} vectors: m must not exceed n",
                self.anchors
            )));
        }
        if n > u32::MAX as usize {
            return Err(input(format!("{n} vectors exceed 2^32")));
        }
        let finite = [
            self.temperature.0,
            self.temperature.1,
            self.momentum,
            self.huber,
            self.polish_huber,
            self.merge_distance,
            self.split_factor,
        ];
        if finite.iter().any(|v| !v.is_finite() || *v < 0.0)
            || self.tolerance.is_nan()
            || self.tolerance < 0.0
        {
            return Err(input(
                "temperatures, momentum, huber, merge distance, split factor and tolerance must be finite and non-negative",
            ));
        }
        if self.momentum >= 1.0 {
            return Err(input("momentum must be below 1"));
        }
        Ok(())
    }

    /// The residual-code parameters, checked by [`crate::compress`] before it anneals.
    pub(crate) fn check_codes(&self, d: usize) -> Result<()> {
        if self.pq_bytes > 0 && self.pq_train_rows == 0 {
            return Err(input(
                "pq_train_rows is 0: the residual codebooks need at least one vector to learn from",
            ));
        }
        if self.pq_bytes > d {
            return Err(input(format!(
                "{} residual bytes per vector for dimension {d}: at most one byte per dimension",
                self.pq_bytes
            )));
        }
        Ok(())
    }
}

/// What one iteration did, for progress reports.
#[derive(Clone, Debug, PartialEq)]
pub struct IterationReport {
    /// 0 for the assignment to the seeds, then one per update.
    pub iteration: usize,
    /// Mean squared distance of a point to its anchor, after this iteration's assignment.
    pub energy: f64,
    /// Temperature of the update that followed (0 after the last assignment).
    pub temperature: f32,
    pub merged: usize,
    pub split: usize,
    pub reseeded: usize,
    /// Seconds since the run started.
    pub elapsed: f64,
}

/// The outcome of [`anneal`]: anchors and the assignment consistent with them.
#[derive(Clone, Debug)]
pub struct Clustering {
    /// `m x d` anchors.
    pub anchors: Matrix,
    pub assignments: Vec<u32>,
    /// Squared distance of each point to its anchor.
    pub distances: Vec<f32>,
    /// Final mean squared distance.
    pub energy: f64,
    pub history: Vec<IterationReport>,
    /// Seconds spent seeding (k-means++).
    pub seeding_seconds: f64,
}

/// The device handle a mode runs on.
pub fn handle_for<B: Backend>(backend: &B, mode: Mode) -> B {
    match mode {
        Mode::Fast => backend.with_precision(Precision::Fast),
        Mode::Exact => backend.with_precision(Precision::Reproducible),
    }
}

/// Seeded k-means++ over `x` (`n x d`, contiguous): the first anchor uniformly, each next
/// one with probability proportional to the squared distance `D^2` to the nearest anchor so
/// far, sampled on the device by the backend's [`Backend::kmeans_pp`] (an exponential race:
/// the point minimising `-ln(u) / D^2` wins). Nothing is read back.
///
/// Drawing several anchors per step against the same `D^2` (k-means||-like batches) would
/// take far fewer steps, but was measured to place them much worse: on 20K x 64 points in 200
/// clusters with 0.5% outliers (the bench's first set), batches of a quarter of the anchors
/// still to draw ended at energy 3.61 against 2.04 one at a time (FAISS: 3.14).
pub fn kmeans_pp<B: Backend>(
    b: &B,
    x: &B::Buffer,
    n: usize,
    d: usize,
    m: usize,
    seed: u64,
) -> Result<B::Buffer> {
    let anchors = b.alloc_for_write(DType::F32, m * d)?;
    b.kmeans_pp(
        View::new(x, &Layout::contiguous(&[n, d])),
        View::new(&anchors, &Layout::contiguous(&[m, d])),
        seed,
    )?;
    Ok(anchors)
}

/// Runs the whole annealing loop on `backend` and returns anchors and assignments.
/// `progress` hears about every iteration.
pub fn anneal<B: Backend>(
    backend: &B,
    data: &Matrix,
    cfg: &Config,
    progress: &mut dyn FnMut(&IterationReport),
) -> Result<Clustering> {
    let b = handle_for(backend, cfg.mode);
    Ok(anneal_on_device(&b, data.view(), cfg, progress)?.0)
}

/// [`anneal`] on a handle already set to the mode's precision; also returns the device
/// buffers (the vectors, the final assignment), which residual coding goes on with.
pub(crate) fn anneal_on_device<'r, B: Backend>(
    b: &B,
    data: MatrixRef<'_>,
    cfg: &Config,
    progress: &mut dyn FnMut(&IterationReport),
) -> Result<(Clustering, State<'r, B>)> {
    anneal_run(b, data, None, cfg, progress, None)
}

/// What makes a run one shard of a sharded run (`sharded.rs`): the points in all, the sums
/// over the shards, and the seeds every shard starts from (from this shard's vectors).
pub(crate) struct Sharding<'r, B: Backend> {
    pub n_total: usize,
    pub shards: Shards<'r, B>,
    pub seeds: &'r (dyn Fn(&B::Buffer) -> Result<B::Buffer> + 'r),
}

/// The loop, alone or as one shard.
/// `x`: `data`'s vectors where the caller has them on the device already.
pub(crate) fn anneal_run<'r, B: Backend>(
    b: &B,
    data: MatrixRef<'_>,
    x: Option<B::Buffer>,
    cfg: &Config,
    progress: &mut dyn FnMut(&IterationReport),
    sharding: Option<Sharding<'r, B>>,
) -> Result<(Clustering, State<'r, B>)> {
    let (n, d, m) = (data.rows, data.cols, cfg.anchors);
    let start = Instant::now();
    let x = match x {
        Some(x) => x,
        None => b.upload(data.data)?,
    };
    let (anchors, n_total, reduce): (B::Buffer, usize, Reduce<'r, B>) = match &sharding {
        None => {
            cfg.check(n, d)?;
            (seed_anchors(b, &x, [n, d, m], cfg.seed)?, n, None)
        }
        Some(s) => ((s.seeds)(&x)?, s.n_total, Some(s.shards)),
    };
    b.synchronize()?;
    let seeding_seconds = start.elapsed().as_secs_f64();
    let mut state = State::new(b, x, anchors, n, d, m, cfg, (n_total, reduce))?;
    let last_maintenance = cfg.iterations * 7 / 10;
    // Reports wait for their energies, which are read back only when something needs them:
    // the tolerance test, a maintenance round, the end, or live progress (every iteration
    // when asked, or once an iteration is seen to take 10 ms or more, so that a read-back
    // costs a small fraction of it). Short runs thus make no host round trip per iteration.
    let mut pending: Vec<(IterationReport, usize)> = Vec::new();
    let mut history: Vec<IterationReport> = Vec::new();
    let mut live = cfg.report_each_iteration;
    let mut first_read: Option<(usize, Instant)> = None;
    // The history row of an assignment still current (a maintenance round that changed
    // nothing), so the next iteration need not assign again.
    let mut current: Option<usize> = None;
    for it in 0..=cfg.iterations {
        let row = match current.take() {
            Some(r) => r,
            None => state.assign(false)?,
        };
        let mut report = IterationReport {
            iteration: it,
            energy: f64::NAN,
            temperature: 0.0,
            merged: 0,
            split: 0,
            reseeded: 0,
            elapsed: 0.0,
        };
        let last = it == cfg.iterations;
        // Whether this report's energy has been read (otherwise it waits in `pending`).
        let known = cfg.tolerance > 0.0 || last || live;
        if known {
            let energies = state.energies()?;
            report.energy = energies[row];
            let converged = it > 0 && cfg.tolerance > 0.0 && {
                let p = last_energy(&history, &pending, &energies);
                (p - report.energy).abs() <= cfg.tolerance * p
            };
            flush(&mut pending, &mut history, &energies, start, progress);
            if !live {
                match first_read {
                    None => first_read = Some((it, Instant::now())),
                    Some((at, when)) if it > at => {
                        let per = when.elapsed().as_secs_f64() / (it - at) as f64;
                        live = per >= 0.010;
                    }
                    Some(_) => {}
                }
            }
            if last || converged {
                report.elapsed = start.elapsed().as_secs_f64();
                progress(&report);
                history.push(report);
                break;
            }
        }
        // The last 30% of updates polish: a full step, no momentum, and a wider Huber
        // threshold (`polish_huber`), so only far outliers stay down-weighted. The annealed
        // phase has placed the anchors by then; these steps settle them where the mean
        // squared distance is lowest.
        report.temperature = state.temperatures[it];
        let maintenance = cfg.maintain_every > 0
            && (it + 1) % cfg.maintain_every == 0
            && it + 1 < last_maintenance;
        if !maintenance {
            // The update and the next iteration's assignment, as one replay.
            current = Some(state.update_and_assign()?);
        } else {
            let (after, changed) = maintenance_round(&mut state, data, cfg, &mut report)?;
            if !changed {
                current = Some(after);
            }
        }
        if known {
            report.elapsed = start.elapsed().as_secs_f64();
            progress(&report);
            history.push(report);
        } else {
            pending.push((report, row));
        }
    }
    let energy = history.last().map_or(0.0, |r| r.energy);
    let anchors = Matrix::new(m, d, b.read::<f32>(&state.pass.anchors)?)?;
    let clustering = Clustering {
        anchors,
        assignments: b.read::<u32>(&state.pass.assign)?[state.pass.pre..].to_vec(),
        distances: b.read::<f32>(&state.pass.dist)?[state.pass.pre..].to_vec(),
        energy,
        history,
        seeding_seconds,
    };
    Ok((clustering, state))
}

/// The k-means++ seeds of `m` anchors for the `n x d` vectors `x` (on the device): drawn from
/// a seeded sample of at most max(16 m, 8192) points, since k-means++ is m passes over its
/// points and a sample that size already places the seeds well.
fn seed_anchors<B: Backend>(
    b: &B,
    x: &B::Buffer,
    [n, d, m]: [usize; 3],
    seed: u64,
) -> Result<B::Buffer> {
    let Some(rows) = seeding_rows(n, m, seed) else {
        return kmeans_pp(b, x, n, d, m, seed);
    };
    let sample = rows.len();
    // The sample's rows gathered on the device from the vectors already there.
    let rows: Vec<u32> = rows.into_iter().map(|r| r as u32).collect();
    let rows = b.upload(&rows)?;
    let xs = b.alloc(DType::F32, sample * d)?;
    crate::gather_rows(
        b,
        View::new(x, &Layout::contiguous(&[n, d])),
        &rows,
        0,
        View::new(&xs, &Layout::contiguous(&[sample, d])),
    )?;
    kmeans_pp(b, &xs, sample, d, m, seed)
}

/// The rows of `n` that seeding draws `m` anchors from, ascending, or `None` for all of them.
fn seeding_rows(n: usize, m: usize, seed: u64) -> Option<Vec<usize>> {
    let sample = (16 * m).max(8192);
    (n > sample).then(|| sample_rows(n, sample, seed))
}

/// An update followed by a maintenance round (merge, split, re-seed), its counts in
/// `report`: the history row of the assignment to the updated anchors, and whether the round
/// changed the anchors (if not, that assignment is still current).
fn maintenance_round<B: Backend>(
    state: &mut State<'_, B>,
    data: MatrixRef<'_>,
    cfg: &Config,
    report: &mut IterationReport,
) -> Result<(usize, bool)> {
    state.update()?;
    // Maintenance needs the assignment to the updated anchors.
    let after = state.assign(true)?;
    let checked = state.check_maintenance()?;
    let (energies, work) = state.energies_and_verdict()?;
    let (merged, split, reseeded) = match checked && !work {
        // Nothing to merge, nothing empty: the round would change nothing.
        true => (0, 0, 0),
        false => state.maintain(data, cfg, energies[after])?,
    };
    report.merged = merged;
    report.split = split;
    report.reseeded = reseeded;
    Ok((after, merged + split + reseeded > 0))
}

/// The energy of the latest report, whether delivered or still waiting for its row.
fn last_energy(
    history: &[IterationReport],
    pending: &[(IterationReport, usize)],
    energies: &[f64],
) -> f64 {
    match pending.last() {
        Some((_, row)) => energies[*row],
        None => history.last().map_or(f64::NAN, |r| r.energy),
    }
}

/// Delivers the reports that waited for their energies, in order.
fn flush(
    pending: &mut Vec<(IterationReport, usize)>,
    history: &mut Vec<IterationReport>,
    energies: &[f64],
    start: Instant,
    progress: &mut dyn FnMut(&IterationReport),
) {
    let now = start.elapsed().as_secs_f64();
    for (mut report, row) in pending.drain(..) {
        report.energy = energies[row];
        report.elapsed = now;
        progress(&report);
        history.push(report);
    }
}

/// `k` distinct rows of `0..n`, ascending.
fn sample_rows(n: usize, k: usize, seed: u64) -> Vec<usize> {
    let mut rows = crate::partial_shuffle(n, k, seed ^ 0x2545_f491_4f6c_dd1d);
    rows.sort_unstable();
    rows
}

impl<'r, B: Backend> State<'r, B> {
    /// The state of a run over `n` points (this shard's, of `shards.0` in all; `shards.1`
    /// sums over the shards).
    #[allow(clippy::too_many_arguments)]
    fn new(
        b: &B,
        x: B::Buffer,
        anchors: B::Buffer,
        n: usize,
        d: usize,
        m: usize,
        cfg: &Config,
        (n_total, reduce): (usize, Reduce<'r, B>),
    ) -> Result<Self> {
        let last_maintenance = cfg.iterations * 7 / 10;
        let mut schedule = Vec::with_capacity(cfg.iterations.max(1) * 4);
        let mut temperatures = Vec::with_capacity(cfg.iterations);
        for it in 0..cfg.iterations.max(1) {
            let (t, momentum, k) = if it >= last_maintenance {
                (1.0, 0.0, cfg.polish_huber.max(cfg.huber) as f64)
            } else {
                (cfg.temperature_at(it), cfg.momentum, cfg.huber as f64)
            };
            schedule.extend_from_slice(&[(k * k / n_total as f64) as f32, t, momentum, 0.0]);
            temperatures.push(t);
        }
        // An assignment per update and one to begin, and at most one more per maintenance
        // round.
        let slots = 2 * cfg.iterations + 2;
        let check = match b.info().kind != hal::DeviceKind::Cpu
            && cfg.maintain_every > 0
            && m <= DEVICE_CHECK_ANCHORS
        {
            true => Some((
                b.compile(&maintenance_check_program(m, d)?)?,
                b.alloc(DType::F32, 1025)?,
                b.upload(&maintenance_limits(n, cfg.merge_distance))?,
            )),
            false => None,
        };
        // An exact sharded run's carry rows (see `state::Carry`) before the points.
        let chained = matches!(reduce, Some(Shards::Chain(_)));
        let pre = if chained { m } else { 0 };
        let (x, assign, carry) = if chained {
            let rows = pre + n;
            let wide = b.alloc(DType::F32, rows * d)?;
            let mut tail = Layout::contiguous(&[n, d]);
            tail.offset = pre * d;
            b.copy(
                View::new(&x, &Layout::contiguous(&[n, d])),
                View::new(&wide, &tail),
            )?;
            let ids: Vec<u32> = (0..m as u32).chain(std::iter::repeat_n(0, n)).collect();
            let ones = b.upload(&vec![1f32; rows])?;
            let carry = state::Carry {
                sse_counts_weights: b.upload(&vec![1f32; rows])?,
                update_counts_weights: b.alloc(DType::F32, rows)?,
                ones,
                scratch_sums: b.alloc(DType::F32, m * d.max(1))?,
                scratch_counts: b.alloc(DType::F32, m)?,
            };
            (wide, b.upload(&ids)?, Some(carry))
        } else {
            (x, b.alloc(DType::U32, n)?, None)
        };
        let pass = Pass {
            pre,
            carry,
            n,
            d,
            m,
            x: x.clone(),
            anchors: anchors.clone(),
            velocity: b.alloc(DType::F32, m * d)?,
            assign,
            dist: b.alloc(DType::F32, pre + n)?,
            weights: b.alloc(DType::F32, pre + n)?,
            sums: b.alloc(DType::F32, m * d)?,
            weight_sums: b.alloc(DType::F32, m)?,
            sse: b.alloc(DType::F32, m)?,
            counts: b.alloc(DType::F32, m)?,
            total: b.alloc(DType::F32, 1)?,
            // The last slot: the maintenance check's verdict.
            totals: b.alloc(DType::F32, slots + 1)?,
            zero_ids: b.alloc(DType::U32, m)?,
            schedule: b.upload(&schedule)?,
            params: b.alloc(DType::F32, 4)?,
            huber: b.compile(&huber_program()?)?,
            update: b.compile(&update_program(d)?)?,
            step: b.alloc(DType::U32, 1)?,
            slot: b.alloc(DType::U32, 1)?,
            take_row: b.compile(&take_row_program()?)?,
            keep_total: b.compile(&keep_total_program()?)?,
        };
        Ok(Self {
            check,
            verdict_slot: slots,
            b: b.clone(),
            reduce,
            n_total,
            assignments: 0,
            temperatures,
            pass: std::sync::Arc::new(pass),
            recorded: None,
        })
    }

    /// Assigns every point and sums the squared distances in all, on the device; returns the
    /// assignment's slot in [`Self::energies`]. With `per_anchor` (what a maintenance round
    /// reads), and always in exact mode (where the total is the per-anchor sums added in
    /// anchor order, the same on every backend), also each anchor's sum and member count;
    /// otherwise the total is one reduction of the distances (a per-anchor segment sum and
    /// its total cost several times the one reduction).
    fn assign(&mut self, per_anchor: bool) -> Result<usize> {
        self.pass.assign(&self.b, per_anchor, self.reduce)?;
        Ok(self.next_slot())
    }

    /// The slot of the assignment just enqueued.
    fn next_slot(&mut self) -> usize {
        self.assignments += 1;
        self.assignments - 1
    }

    /// The next update of the schedule (its row is the device's count of updates), from the
    /// last assignment.
    fn update(&mut self) -> Result<()> {
        Ok(self.pass.update(&self.b, self.reduce)?)
    }

    /// The next update, then a fast assignment to the updated anchors (the next iteration's),
    /// replayed from a recording made at the first call; returns the assignment's slot.
    fn update_and_assign(&mut self) -> Result<usize> {
        if self.reduce.is_some() {
            // A sharded run's collectives are not recorded.
            self.update()?;
            return self.assign(false);
        }
        if self.recorded.is_none() {
            let pass = self.pass.clone();
            self.recorded = Some(self.b.record(std::sync::Arc::new(move |b: &B| {
                pass.update(b, None)?;
                pass.assign(b, false, None)
            }))?);
        }
        self.b
            .replay(self.recorded.as_ref().expect("recorded above"))?;
        Ok(self.next_slot())
    }

    /// The energy (mean squared distance) of every assignment so far, by slot (waits for the
    /// device).
    fn energies(&self) -> Result<Vec<f64>> {
        Ok(self.energies_and_verdict()?.0)
    }

    /// [`Self::energies`], and whether the last maintenance check (if one ran since the
    /// verdict was last cleared) found work.
    fn energies_and_verdict(&self) -> Result<(Vec<f64>, bool)> {
        let totals = self.b.read::<f32>(&self.pass.totals)?;
        let energies = totals[..self.assignments]
            .iter()
            .map(|&t| t as f64 / self.n_total as f64)
            .collect();
        Ok((energies, totals.last().is_some_and(|&v| v > 0.0)))
    }
}
