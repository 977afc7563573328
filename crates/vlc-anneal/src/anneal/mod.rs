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
//! [`Mode::Exact`] runs on a [`hal::Precision::Reproducible`] handle: assignments and sums in
//! one fixed order with fused multiply-adds, and every other step exact IEEE arithmetic, so
//! CPU, wgpu and CUDA give identical assignments and anchors.

use crate::error::{Result, input};
use crate::vectors::Matrix;
use hal::ir::expr::{Expr, Scope};
use hal::ir::{Access, IrCmp, ProgramBuilder};
use hal::{Backend, BackendExt, DType, Layout, Precision, View};
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
    /// geometrically in between.
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
    /// Wait for every iteration and report it as it finishes (per-iteration timings, live
    /// progress). Otherwise an iteration's energy is read back only when something needs it
    /// (the tolerance test, maintenance, the end), or every iteration once iterations take
    /// 10 ms or more.
    pub report_each_iteration: bool,
}

impl Config {
    pub fn new(anchors: usize) -> Self {
        Self {
            anchors,
            iterations: 25,
            seed: 0,
            mode: Mode::Fast,
            tolerance: 0.0,
            temperature: (1.0, 0.7),
            momentum: 0.3,
            huber: 3.0,
            polish_huber: 8.0,
            maintain_every: 5,
            merge_distance: 0.05,
            split_factor: 4.0,
            pq_bytes: 8,
            pq_iterations: 12,
            report_each_iteration: false,
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

/// Huber weights: `w[i] = 1` where `r2[i] <= delta2`, `sqrt(delta2 / r2[i])` beyond;
/// `delta2 = params[0] * total[0]` (the squared Huber multiple over `n`, times the sum of
/// squared distances: the multiple squared times the energy).
fn huber_program() -> Result<hal::ir::Program> {
    let s = Scope::new("vlc_huber_weights");
    let r2 = s.buffer(DType::F32, Access::Read);
    let params = s.buffer(DType::F32, Access::Read);
    let total = s.buffer(DType::F32, Access::Read);
    let w = s.buffer(DType::F32, Access::Write);
    let i = s.index();
    let first = s.u32(0);
    let delta2 = s.load(params, first) * s.load(total, first);
    let r = s.load(r2, i);
    let shrink = (delta2 / r).sqrt();
    s.store(w, i, r.le(delta2).select(s.f32(1.0), shrink));
    Ok(s.build()?)
}

/// Anchor update over `m * d` elements (`d` baked in): with `cnt = counts[i / d]`,
/// `mean = cnt > 0 ? sums[i] / cnt : anchor[i]`, `v = momentum * v + T * (mean - anchor)`,
/// `anchor += v`; `params = [huber^2 / n, T, momentum, 0]`. Separate multiplies and adds (no fused
/// multiply-add), so every backend rounds the same way.
fn update_program(d: usize) -> Result<hal::ir::Program> {
    let s = Scope::new("vlc_anchor_update");
    let sums = s.buffer(DType::F32, Access::Read);
    let counts = s.buffer(DType::F32, Access::Read);
    let params = s.buffer(DType::F32, Access::Read);
    let anchors = s.buffer(DType::F32, Access::ReadWrite);
    let vel = s.buffer(DType::F32, Access::ReadWrite);
    let i = s.index();
    let (mean, a) = mean_of_members(&s, [sums, counts, anchors], i, d);
    let v = s.load(vel, i);
    let (t, momentum) = (s.load(params, s.u32(1)), s.load(params, s.u32(2)));
    let v2 = momentum * v + t * (mean - a);
    s.store(vel, i, v2);
    s.store(anchors, i, a + v2);
    Ok(s.build()?)
}

/// Whether a maintenance round can have anything to do, decided on the device so that a
/// round that would change nothing reads nothing back. Over `m * m` threads, thread `t = i m + j`
/// flags (adds 1 to `flags[0]`) when anchor `i` has no members (`i = j`, `counts[i] = 0`) or
/// when `i < j` and the squared distance between anchors `i` and `j` (in f32, `d` baked in) is
/// at most `scale * max(total[0], floor)`; every other thread adds 0 to one of 1,024 spare
/// slots (`flags` has 1,025), so that only flagging threads contend for `flags[0]`.
/// `scale = merge_distance^2 / n * (1 + 2^-8)` and `floor = n * f32::MIN_POSITIVE` make the
/// test conservative: whatever [`State::maintain`] would merge (squared distance below
/// `merge_distance^2 * max(total / n, f64::MIN_POSITIVE)`, summed in f64) is flagged, whatever
/// the f32 rounding.
fn maintenance_check_program(
    m: usize,
    d: usize,
    scale: f32,
    floor: f32,
) -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new("vlc_maintenance_check");
    let anchors = p.buffer(DType::F32, Access::Read);
    let counts = p.buffer(DType::F32, Access::Read);
    let total = p.buffer(DType::F32, Access::Read);
    let flags = p.buffer(DType::F32, Access::ReadWrite);
    let t = p.index();
    let mm = p.const_u32(m as u32);
    let i = p.div(t, mm);
    let i_m = p.mul(i, mm);
    let j = p.sub(t, i_m);
    let dd = p.const_u32(d as u32);
    let row_i = p.mul(i, dd);
    let row_j = p.mul(j, dd);
    let mut d2 = p.const_f32(0.0);
    for k in 0..d {
        let k = p.const_u32(k as u32);
        let at_i = p.add(row_i, k);
        let at_j = p.add(row_j, k);
        let a = p.load(anchors, at_i);
        let b = p.load(anchors, at_j);
        let diff = p.sub(a, b);
        d2 = p.fma(diff, diff, d2);
    }
    let zero_u = p.const_u32(0);
    let sum = p.load(total, zero_u);
    let floor = p.const_f32(floor);
    let sum = p.binary(hal::ir::IrBinary::Max, sum, floor);
    let scale = p.const_f32(scale);
    let limit = p.mul(scale, sum);
    let below = p.cmp(IrCmp::Le, d2, limit);
    let later = p.cmp(IrCmp::Lt, i, j);
    let close = p.binary(hal::ir::IrBinary::And, later, below);
    let cnt = p.load(counts, i);
    let zero = p.const_f32(0.0);
    let none = p.cmp(IrCmp::Eq, cnt, zero);
    let same = p.cmp(IrCmp::Eq, i, j);
    let empty = p.binary(hal::ir::IrBinary::And, same, none);
    let flagged = p.binary(hal::ir::IrBinary::Or, close, empty);
    let one = p.const_f32(1.0);
    let value = p.select(flagged, one, zero);
    let spread = p.const_u32(1023);
    let spare = p.binary(hal::ir::IrBinary::And, t, spread);
    let one_u = p.const_u32(1);
    let spare = p.add(spare, one_u);
    let at = p.select(flagged, zero_u, spare);
    p.atomic_add(flags, at, value);
    Ok(p.build()?)
}

/// Anchors up to which a GPU decides on the device whether a maintenance round has work
/// (its check runs over `m * m` pairs).
const DEVICE_CHECK_ANCHORS: usize = 4096;

/// IR for element `i` of an `m x width` centre matrix: `(mean, old)` where `old` is the
/// centre's current value and `mean` is `sums[i] / counts[i / width]`, or `old` for a centre
/// with no weight. Buffers: `[sums, counts, centres]`.
pub(crate) fn mean_of_members<'s>(
    s: &'s Scope,
    [sums, counts, centres]: [hal::ir::BufferId; 3],
    i: Expr<'s>,
    width: usize,
) -> (Expr<'s>, Expr<'s>) {
    let cnt = s.load(counts, i / s.u32(width as u32));
    let old = s.load(centres, i);
    let mean = s.load(sums, i) / cnt;
    (cnt.gt(s.f32(0.0)).select(mean, old), old)
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
    Ok(anneal_on_device(&b, data, cfg, progress)?.0)
}

/// [`anneal`] on a handle already set to the mode's precision; also returns the device
/// buffers (the vectors, the final assignment), which residual coding goes on with.
pub(crate) fn anneal_on_device<B: Backend>(
    b: &B,
    data: &Matrix,
    cfg: &Config,
    progress: &mut dyn FnMut(&IterationReport),
) -> Result<(Clustering, State<B>)> {
    let (n, d, m) = (data.rows, data.cols, cfg.anchors);
    cfg.check(n, d)?;
    let start = Instant::now();
    let x = b.upload(&data.data)?;
    // Seeding draws from a seeded sample of at most max(16 m, 8192) points: k-means++ is m
    // passes over its points, and a sample that size already places the seeds well.
    let sample = (16 * m).max(8192);
    let anchors = if n > sample {
        // The sample's rows gathered on the device from the vectors already there.
        let rows: Vec<u32> = sample_rows(n, sample, cfg.seed)
            .into_iter()
            .map(|r| r as u32)
            .collect();
        let rows = b.upload(&rows)?;
        let xs = b.alloc(DType::F32, sample * d)?;
        crate::gather_rows(
            b,
            View::new(&x, &Layout::contiguous(&[n, d])),
            &rows,
            0,
            View::new(&xs, &Layout::contiguous(&[sample, d])),
        )?;
        kmeans_pp(b, &xs, sample, d, m, cfg.seed)?
    } else {
        kmeans_pp(b, &x, n, d, m, cfg.seed)?
    };
    b.synchronize()?;
    let seeding_seconds = start.elapsed().as_secs_f64();
    let mut state = State::new(b, x, anchors, n, d, m, cfg)?;
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
            if merged + split + reseeded == 0 {
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
        assignments: b.read::<u32>(&state.pass.assign)?,
        distances: b.read::<f32>(&state.pass.dist)?,
        energy,
        history,
        seeding_seconds,
    };
    Ok((clustering, state))
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

/// The device buffers of one run.
pub(crate) struct State<B: Backend> {
    b: B,
    /// Assignments enqueued so far (the device's `Pass::slot` counter holds the same).
    assignments: usize,
    /// On a GPU, the maintenance check and its flags (see [`maintenance_check_program`]);
    /// the verdict is copied into the last slot of `totals`, so it comes back with the
    /// energies.
    check: Option<(B::Kernel, B::Buffer)>,
    /// The slot of `totals` that holds the check's verdict (after every assignment's).
    verdict_slot: usize,
    /// The schedule's temperatures on the host, for the reports.
    temperatures: Vec<f32>,
    /// The device buffers and the work of an update and of an assignment, shared with the
    /// recording.
    pub(crate) pass: std::sync::Arc<Pass<B>>,
    /// An update followed by a fast assignment, recorded at first use (see
    /// [`State::update_and_assign`]).
    recorded: Option<B::Graph>,
}

/// The device work of one annealing iteration, as calls that depend on no host value: the
/// schedule row and the energy slot come from counters on the device, which the calls
/// advance. So an update followed by an assignment can be recorded once and replayed every
/// iteration (on CUDA one graph launch where it was about fifteen launches, whose host cost
/// left the device idle for a third of the annealing on an H200).
pub(crate) struct Pass<B: Backend> {
    n: usize,
    d: usize,
    m: usize,
    pub(crate) x: B::Buffer,
    anchors: B::Buffer,
    velocity: B::Buffer,
    pub(crate) assign: B::Buffer,
    dist: B::Buffer,
    weights: B::Buffer,
    sums: B::Buffer,
    weight_sums: B::Buffer,
    /// Each anchor's sum of squared distances, and its member count, at the last per-anchor
    /// assignment.
    sse: B::Buffer,
    counts: B::Buffer,
    /// The sum of squared distances at the last assignment, and at every assignment so far
    /// (`totals`, one slot per assignment, then the maintenance check's verdict), read back
    /// for the energies.
    total: B::Buffer,
    totals: B::Buffer,
    /// Zeros: every anchor's segment in the sum of `sse`.
    zero_ids: B::Buffer,
    /// Row `t`: update `t`'s `[huber^2 / n, temperature, momentum, 0]`, taken into `params`
    /// by `take_row` (so no update waits for the host).
    schedule: B::Buffer,
    params: B::Buffer,
    huber: B::Kernel,
    update: B::Kernel,
    /// `[updates so far]` and `[assignments so far]`.
    step: B::Buffer,
    slot: B::Buffer,
    /// Copies schedule row `step` into `params` and advances `step`.
    take_row: B::Kernel,
    /// Copies `total` into `totals[slot]` and advances `slot`.
    keep_total: B::Kernel,
}

impl<B: Backend> Pass<B> {
    /// Assigns every point and sums the squared distances in all (see [`State::assign`]),
    /// keeping the total in the next slot of `totals`.
    fn assign(&self, b: &B, per_anchor: bool) -> hal::Result<()> {
        let (n, d, m) = (self.n, self.d, self.m);
        let ln = Layout::contiguous(&[n]);
        b.nearest_centroid(
            View::new(&self.x, &Layout::contiguous(&[n, d])),
            View::new(&self.anchors, &Layout::contiguous(&[m, d])),
            View::new(&self.assign, &ln),
            View::new(&self.dist, &ln),
        )?;
        let one = Layout::contiguous(&[1]);
        if !per_anchor && b.precision() != Precision::Reproducible {
            b.reduce(
                hal::ReduceOp::Sum,
                View::new(&self.dist, &ln),
                &[0],
                View::new(&self.total, &one),
            )?;
        } else {
            b.segment_sum(
                View::new(&self.dist, &Layout::contiguous(&[n, 1])),
                View::new(&self.assign, &ln),
                None,
                View::new(&self.sse, &Layout::contiguous(&[m, 1])),
                View::new(&self.counts, &Layout::contiguous(&[m])),
            )?;
            // The total in anchor order (one fixed order under Precision::Reproducible, so
            // the same on every backend in exact mode); its count output is discarded into
            // `weight_sums`, which the next update overwrites.
            b.segment_sum(
                View::new(&self.sse, &Layout::contiguous(&[m, 1])),
                View::new(&self.zero_ids, &Layout::contiguous(&[m])),
                None,
                View::new(&self.total, &Layout::contiguous(&[1, 1])),
                View::new(&self.weight_sums, &one),
            )?;
        }
        b.launch(
            &self.keep_total,
            &[&self.total, &self.slot, &self.totals],
            1,
        )
    }

    /// The next update of the schedule, from the last assignment.
    fn update(&self, b: &B) -> hal::Result<()> {
        let (n, d, m) = (self.n, self.d, self.m);
        b.launch(
            &self.take_row,
            &[&self.schedule, &self.step, &self.params],
            1,
        )?;
        b.launch(
            &self.huber,
            &[&self.dist, &self.params, &self.total, &self.weights],
            n,
        )?;
        let ln = Layout::contiguous(&[n]);
        b.segment_sum(
            View::new(&self.x, &Layout::contiguous(&[n, d])),
            View::new(&self.assign, &ln),
            Some(View::new(&self.weights, &ln)),
            View::new(&self.sums, &Layout::contiguous(&[m, d])),
            View::new(&self.weight_sums, &Layout::contiguous(&[m])),
        )?;
        b.launch(
            &self.update,
            &[
                &self.sums,
                &self.weight_sums,
                &self.params,
                &self.anchors,
                &self.velocity,
            ],
            m * d,
        )
    }
}

/// `params[k] = schedule[4 step[0] + k]` for `k < 4`, then `step[0] += 1` (one thread).
fn take_row_program() -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new("vlc_take_schedule_row");
    let schedule = p.buffer(DType::F32, Access::Read);
    let step = p.buffer(DType::U32, Access::ReadWrite);
    let params = p.buffer(DType::F32, Access::Write);
    let zero = p.const_u32(0);
    let s = p.load(step, zero);
    let four = p.const_u32(4);
    let base = p.mul(s, four);
    for k in 0..4u32 {
        let kk = p.const_u32(k);
        let at = p.add(base, kk);
        let v = p.load(schedule, at);
        p.store(params, kk, v);
    }
    advance(&mut p, step, s);
    Ok(p.build()?)
}

/// `totals[slot[0]] = total[0]`, then `slot[0] += 1` (one thread).
fn keep_total_program() -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new("vlc_keep_total");
    let total = p.buffer(DType::F32, Access::Read);
    let slot = p.buffer(DType::U32, Access::ReadWrite);
    let totals = p.buffer(DType::F32, Access::Write);
    let zero = p.const_u32(0);
    let at = p.load(slot, zero);
    let t = p.load(total, zero);
    p.store(totals, at, t);
    advance(&mut p, slot, at);
    Ok(p.build()?)
}

/// `counter[0] = value + 1`: a device counter moved on past `value`, the count it held.
fn advance(p: &mut ProgramBuilder, counter: hal::ir::BufferId, value: hal::ir::Value) {
    let one = p.const_u32(1);
    let next = p.add(value, one);
    let zero = p.const_u32(0);
    p.store(counter, zero, next);
}

impl<B: Backend> State<B> {
    fn new(
        b: &B,
        x: B::Buffer,
        anchors: B::Buffer,
        n: usize,
        d: usize,
        m: usize,
        cfg: &Config,
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
            schedule.extend_from_slice(&[(k * k / n as f64) as f32, t, momentum, 0.0]);
            temperatures.push(t);
        }
        // An assignment per update and one to begin, and at most one more per maintenance
        // round.
        let slots = 2 * cfg.iterations + 2;
        let check = match b.info().kind != hal::DeviceKind::Cpu
            && cfg.maintain_every > 0
            && m <= DEVICE_CHECK_ANCHORS
        {
            true => {
                let merge = cfg.merge_distance as f64;
                let scale = (merge * merge / n as f64 * (1.0 + 2f64.powi(-8))) as f32;
                let floor = n as f32 * f32::MIN_POSITIVE;
                Some((
                    b.compile(&maintenance_check_program(m, d, scale, floor)?)?,
                    b.alloc(DType::F32, 1025)?,
                ))
            }
            false => None,
        };
        let pass = Pass {
            n,
            d,
            m,
            x: x.clone(),
            anchors: anchors.clone(),
            velocity: b.alloc(DType::F32, m * d)?,
            assign: b.alloc(DType::U32, n)?,
            dist: b.alloc(DType::F32, n)?,
            weights: b.alloc(DType::F32, n)?,
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
    /// its total cost 23 us an iteration on an H200, the reduction a few).
    fn assign(&mut self, per_anchor: bool) -> Result<usize> {
        self.pass.assign(&self.b, per_anchor)?;
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
        Ok(self.pass.update(&self.b)?)
    }

    /// The next update, then a fast assignment to the updated anchors (the next iteration's),
    /// replayed from a recording made at the first call; returns the assignment's slot.
    fn update_and_assign(&mut self) -> Result<usize> {
        if self.recorded.is_none() {
            let pass = self.pass.clone();
            self.recorded = Some(self.b.record(std::sync::Arc::new(move |b: &B| {
                pass.update(b)?;
                pass.assign(b, false)
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
            .map(|&t| t as f64 / self.pass.n as f64)
            .collect();
        Ok((energies, totals.last().is_some_and(|&v| v > 0.0)))
    }

    /// On a GPU, enqueues the check whether a maintenance round on the current assignment and
    /// anchors has work (its verdict comes back with the next energies); false where there is
    /// no check (the round then always reads the state back).
    fn check_maintenance(&self) -> Result<bool> {
        let Some((kernel, flags)) = &self.check else {
            return Ok(false);
        };
        let b = &self.b;
        let one = Layout::contiguous(&[1]);
        b.fill(View::new(flags, &one), 0.0)?;
        b.launch(
            kernel,
            &[
                &self.pass.anchors,
                &self.pass.counts,
                &self.pass.total,
                flags,
            ],
            self.pass.m * self.pass.m,
        )?;
        let verdict = Layout {
            shape: vec![1],
            strides: vec![1],
            offset: self.verdict_slot,
        };
        b.copy(
            View::new(flags, &one),
            View::new(&self.pass.totals, &verdict),
        )?;
        Ok(true)
    }

    /// One maintenance round on the read-back assignment (see the module docs). Returns
    /// (merged, split, re-seeded) counts.
    fn maintain(
        &mut self,
        data: &Matrix,
        cfg: &Config,
        energy: f64,
    ) -> Result<(usize, usize, usize)> {
        let (d, m) = (self.pass.d, self.pass.m);
        let b = &self.b;
        let mut anchors = b.read::<f32>(&self.pass.anchors)?;
        let mut counts = b.read::<f32>(&self.pass.counts)?;
        let mut sse: Vec<f64> = b
            .read::<f32>(&self.pass.sse)?
            .iter()
            .map(|&v| v as f64)
            .collect();
        let rms2 = energy.max(f64::MIN_POSITIVE);
        let merge2 = (cfg.merge_distance as f64).powi(2) * rms2;
        let mut free: Vec<usize> = (0..m).filter(|&j| counts[j] == 0.0).collect();
        // Merges: for each anchor in order, its nearest later anchor if within the threshold.
        let mut merged = 0;
        let mut gone = vec![false; m];
        for &j in &free {
            gone[j] = true;
        }
        if merge2 > 0.0 && m > 1 {
            merged = merge_close(
                &mut anchors,
                d,
                &mut counts,
                &mut sse,
                &mut gone,
                &mut free,
                merge2,
            );
        }
        if free.is_empty() {
            return Ok((0, 0, 0));
        }
        // The per-point state, needed only now that there are slots to fill.
        let assign = b.read::<u32>(&self.pass.assign)?;
        let dist = b.read::<f32>(&self.pass.dist)?;
        // Members of each anchor (ascending point order).
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); m];
        for (i, &a) in assign.iter().enumerate() {
            members[a as usize].push(i as u32);
        }
        let mean_sse = sse.iter().sum::<f64>() / (m - free.len()).max(1) as f64;
        let mut candidates: Vec<usize> = (0..m)
            .filter(|&j| !gone[j] && members[j].len() >= 2)
            .filter(|&j| sse[j] > cfg.split_factor as f64 * mean_sse)
            .collect();
        candidates.sort_by(|&a, &b| sse[b].total_cmp(&sse[a]).then(a.cmp(&b)));
        let mut split = 0;
        let mut reseeded = 0;
        let mut taken = vec![false; data.rows];
        // Farthest points first, for re-seeding (sorted when first needed).
        let mut far: Vec<u32> = Vec::new();
        let mut far_at = 0;
        for (slot_index, &slot) in free.iter().enumerate() {
            if let Some(&j) = candidates.get(slot_index) {
                let (dir, sigma) =
                    principal_direction(data, &members[j], &anchors[j * d..(j + 1) * d], cfg.seed);
                for k in 0..d {
                    let c = anchors[j * d + k];
                    let off = (sigma * dir[k]) as f32;
                    anchors[slot * d + k] = c + off;
                    anchors[j * d + k] = c - off;
                }
                split += 1;
            } else {
                if far.is_empty() {
                    far = (0..data.rows as u32).collect();
                    far.sort_by(|&a, &b| {
                        dist[b as usize]
                            .total_cmp(&dist[a as usize])
                            .then(a.cmp(&b))
                    });
                }
                while far_at < far.len() && taken[far[far_at] as usize] {
                    far_at += 1;
                }
                let Some(&p) = far.get(far_at) else { break };
                taken[p as usize] = true;
                anchors[slot * d..(slot + 1) * d].copy_from_slice(data.row(p as usize));
                reseeded += 1;
            }
        }
        b.write(&self.pass.anchors, &anchors)?;
        // Momentum restarts after anchors moved by hand.
        b.fill(
            View::new(&self.pass.velocity, &Layout::contiguous(&[m * d])),
            0.0,
        )?;
        Ok((merged, split, reseeded))
    }
}

/// Merges, for each live anchor in index order, its nearest later live anchor closer than
/// `merge2` (squared; the lower index on ties) into it, count-weighted; the merged one is
/// marked gone and freed. Returns the number of merges.
///
/// Only anchors whose coordinate `axis` lies within the merge radius can be within it (a
/// squared distance summed in f64 is at least each of its terms), so each anchor's search
/// scans its neighbours in that coordinate's sorted order: the pairs of comparing every two,
/// without the O(m^2 d) cost. An anchor changes only after its own search, when it can no
/// longer be a candidate (candidates come later), so the order stays valid.
fn merge_close(
    anchors: &mut [f32],
    d: usize,
    counts: &mut [f32],
    sse: &mut [f64],
    gone: &mut [bool],
    free: &mut Vec<usize>,
    merge2: f64,
) -> usize {
    let m = counts.len();
    let axis = widest_coordinate(anchors, d, gone);
    let keys: Vec<f64> = (0..m).map(|j| anchors[j * d + axis] as f64).collect();
    let mut order: Vec<usize> = (0..m).filter(|&j| !gone[j]).collect();
    order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]).then(a.cmp(&b)));
    let mut position = vec![0; m];
    for (p, &j) in order.iter().enumerate() {
        position[j] = p;
    }
    let mut merged = 0;
    for i in 0..m {
        if gone[i] {
            continue;
        }
        let within = |j: &&usize| (keys[**j] - keys[i]) * (keys[**j] - keys[i]) < merge2;
        let below = order[..position[i]].iter().rev().take_while(within);
        let above = order[position[i] + 1..].iter().take_while(within);
        let ai = &anchors[i * d..(i + 1) * d];
        let mut best: Option<(usize, f64)> = None;
        for &j in below.chain(above) {
            if j <= i || gone[j] {
                continue;
            }
            let Some(dj) = sq_dist_below(ai, &anchors[j * d..(j + 1) * d], merge2) else {
                continue;
            };
            let better = best.is_none_or(|(bj, bd)| dj < bd || (dj == bd && j < bj));
            if better {
                best = Some((j, dj));
            }
        }
        if let Some((j, _)) = best {
            let (ci, cj) = (counts[i] as f64, counts[j] as f64);
            for k in 0..d {
                let v =
                    (anchors[i * d + k] as f64 * ci + anchors[j * d + k] as f64 * cj) / (ci + cj);
                anchors[i * d + k] = v as f32;
            }
            counts[i] += counts[j];
            sse[i] += sse[j];
            counts[j] = 0.0;
            gone[j] = true;
            free.push(j);
            merged += 1;
        }
    }
    merged
}

/// The coordinate along which the live anchors spread most (the first on ties).
fn widest_coordinate(anchors: &[f32], d: usize, gone: &[bool]) -> usize {
    let mut lo = vec![f32::INFINITY; d];
    let mut hi = vec![f32::NEG_INFINITY; d];
    for (row, _) in anchors.chunks_exact(d).zip(gone).filter(|(_, g)| !**g) {
        for k in 0..d {
            lo[k] = lo[k].min(row[k]);
            hi[k] = hi[k].max(row[k]);
        }
    }
    (0..d).fold(0, |best, k| {
        if (hi[k] as f64 - lo[k] as f64) > (hi[best] as f64 - lo[best] as f64) {
            k
        } else {
            best
        }
    })
}

/// The squared distance of `a` and `b` (summed in f64, in coordinate order) when it is below
/// `limit`; `None` as soon as a partial sum reaches it. Anchors to be merged are rare and most
/// pairs pass the limit within a few coordinates, so a round's merge search stays short even
/// when the sorted sweep finds nearly every pair within its band (high `d`).
fn sq_dist_below(a: &[f32], b: &[f32], limit: f64) -> Option<f64> {
    let mut sum = 0.0;
    for (ca, cb) in a.chunks(8).zip(b.chunks(8)) {
        for (&x, &y) in ca.iter().zip(cb) {
            let t = x as f64 - y as f64;
            sum += t * t;
        }
        if sum >= limit {
            return None;
        }
    }
    Some(sum)
}

#[cfg(test)]
fn sq_dist(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let t = x as f64 - y as f64;
            t * t
        })
        .sum()
}

/// The unit principal direction of `members` around `center` (power iteration, a fixed seeded
/// start, 8 rounds, in float64) and the standard deviation of the members along it. At most
/// 64 members take part (every k-th, in order): a direction to split along needs no more, the
/// updates that follow place the two halves, and a round of maintenance may split dozens of
/// anchors. Their offsets from the centre
/// are gathered once, and each projection summed in four interleaved running sums (a fixed
/// order), which keeps the rounds from waiting on one chain of dependent adds.
fn principal_direction(
    data: &Matrix,
    members: &[u32],
    center: &[f32],
    seed: u64,
) -> (Vec<f64>, f64) {
    let d = center.len();
    let mut v: Vec<f64> = (0..d)
        .map(|k| {
            let h = crate::splitmix(seed ^ (k as u64).wrapping_mul(0x9e37_79b9));
            (h >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        })
        .collect();
    let norm = |v: &mut Vec<f64>| {
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if n > 0.0 {
            v.iter_mut().for_each(|x| *x /= n);
        }
        n
    };
    norm(&mut v);
    let members: Vec<u32> = members
        .iter()
        .copied()
        .step_by(members.len().div_ceil(64).max(1))
        .collect();
    let offsets: Vec<f64> = members
        .iter()
        .flat_map(|&i| {
            data.row(i as usize)
                .iter()
                .zip(center)
                .map(|(&x, &c)| x as f64 - c as f64)
        })
        .collect();
    let mut lambda = 0.0;
    for _ in 0..8 {
        let mut next = vec![0f64; d];
        for row in offsets.chunks_exact(d) {
            let mut lanes = [0f64; 4];
            for (r, w) in row.chunks(4).zip(v.chunks(4)) {
                for ((lane, &a), &b) in lanes.iter_mut().zip(r).zip(w) {
                    *lane += a * b;
                }
            }
            let proj = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
            for (nk, &a) in next.iter_mut().zip(row) {
                *nk += proj * a;
            }
        }
        lambda = norm(&mut next);
        if lambda == 0.0 {
            break;
        }
        v = next;
    }
    (v, (lambda / members.len().max(1) as f64).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's maintenance check flags every round the host would act on: an empty
    /// anchor, or a pair closer than the merge radius, including pairs a hair inside it
    /// (and it stays quiet when neither holds, with pairs a little outside).
    #[test]
    fn maintenance_check_flags_what_the_host_would_merge_or_refill() {
        let b = backend_cpu::CpuBackend::new();
        let (n, d, m, merge) = (1000usize, 7, 19, 0.05f64);
        let scale = (merge * merge / n as f64 * (1.0 + 2f64.powi(-8))) as f32;
        let floor = n as f32 * f32::MIN_POSITIVE;
        let kernel = b
            .compile(&maintenance_check_program(m, d, scale, floor).unwrap())
            .unwrap();
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut uniform = || {
            rng = crate::splitmix(rng);
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut seen = [0usize; 2];
        for case in 0..60 {
            let mut anchors: Vec<f32> =
                (0..m * d).map(|_| (uniform() * 4.0 - 2.0) as f32).collect();
            let mut counts = vec![3.0f32; m];
            let total = (uniform() * 50.0 + 1.0) as f32;
            let radius2 = merge * merge * (total as f64 / n as f64);
            match case % 4 {
                // An empty anchor.
                0 => counts[(uniform() * m as f64) as usize] = 0.0,
                // A pair just inside or just outside the radius, along one axis.
                1 | 2 => {
                    let (i, j) = (3, 11);
                    let factor = if case % 4 == 1 { 0.999 } else { 1.01 };
                    let gap = (radius2.sqrt() * factor) as f32;
                    for k in 0..d {
                        anchors[j * d + k] = anchors[i * d + k];
                    }
                    anchors[j * d] += gap;
                }
                _ => {}
            }
            let host_work = counts.contains(&0.0)
                || (0..m).any(|i| {
                    (i + 1..m).any(|j| {
                        sq_dist(&anchors[i * d..(i + 1) * d], &anchors[j * d..(j + 1) * d])
                            < merge * merge * (total as f64 / n as f64).max(f64::MIN_POSITIVE)
                    })
                });
            let flags = b.alloc(DType::F32, 1025).unwrap();
            let args = [
                b.upload(&anchors).unwrap(),
                b.upload(&counts).unwrap(),
                b.upload(&[total]).unwrap(),
            ];
            b.launch(&kernel, &[&args[0], &args[1], &args[2], &flags], m * m)
                .unwrap();
            let flagged = b.read::<f32>(&flags).unwrap()[0] > 0.0;
            assert_eq!(flagged, host_work, "case {case}");
            seen[host_work as usize] += 1;
        }
        assert!(seen[0] > 10 && seen[1] > 10, "{seen:?}");
    }

    /// k-means++ gives the same anchors whether its uniform draws come a step at a time, a
    /// few steps at a time (a partial last block) or all at once, and each anchor is one of
    /// the points.
    #[test]
    fn kmeans_pp_draw_blocks_do_not_change_the_anchors() {
        let b = backend_cpu::CpuBackend::new();
        let (n, d, m) = (300, 5, 23);
        let data = crate::synthetic::gaussian_mixture(n, d, 7, 0.3, 11);
        let x = b.upload(&data.data).unwrap();
        let run = |block| {
            let anchors = b.alloc(DType::F32, m * d).unwrap();
            hal::seeding::kmeans_pp_in_blocks(&b, &x, &anchors, [n, d, m], 5, block).unwrap();
            b.read::<f32>(&anchors).unwrap()
        };
        let whole = run(m);
        assert_eq!(run(1), whole);
        assert_eq!(run(4), whole);
        // Blocks that several-step recordings fit in, and some steps that are left over.
        assert_eq!(run(9), whole);
        for anchor in whole.chunks(d) {
            assert!(data.data.chunks(d).any(|p| p == anchor), "{anchor:?}");
        }
        // Distinct anchors: k-means++ never draws a point already taken (its D^2 is 0).
        for (i, a) in whole.chunks(d).enumerate() {
            assert!(whole.chunks(d).skip(i + 1).all(|c| c != a));
        }
    }

    /// The merge rule by comparing every two anchors, as `merge_close` must decide it.
    fn merge_all_pairs(
        anchors: &mut [f32],
        d: usize,
        counts: &mut [f32],
        gone: &mut [bool],
        merge2: f64,
    ) -> usize {
        let m = counts.len();
        let mut merged = 0;
        for i in 0..m {
            if gone[i] {
                continue;
            }
            let mut best: Option<(usize, f64)> = None;
            for j in i + 1..m {
                let dj = sq_dist(&anchors[i * d..(i + 1) * d], &anchors[j * d..(j + 1) * d]);
                if !gone[j] && dj < merge2 && best.is_none_or(|(_, bd)| dj < bd) {
                    best = Some((j, dj));
                }
            }
            if let Some((j, _)) = best {
                let (ci, cj) = (counts[i] as f64, counts[j] as f64);
                for k in 0..d {
                    let v = (anchors[i * d + k] as f64 * ci + anchors[j * d + k] as f64 * cj)
                        / (ci + cj);
                    anchors[i * d + k] = v as f32;
                }
                counts[i] += counts[j];
                counts[j] = 0.0;
                gone[j] = true;
                merged += 1;
            }
        }
        merged
    }

    #[test]
    fn merging_by_sorted_neighbours_matches_all_pairs() {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |t| t.as_nanos() as u64);
        eprintln!("anchor seed {seed}");
        for (round, (m, d, radius)) in [(300, 8, 0.3), (200, 3, 0.6), (64, 16, 5.0), (1, 4, 1.0)]
            .into_iter()
            .enumerate()
        {
            // Anchors on a coarse grid plus noise, so many pairs fall near the radius, and a
            // few exact duplicates for ties.
            let s = seed.wrapping_add(round as u64);
            let mut anchors: Vec<f32> = (0..m * d)
                .map(|i| {
                    let u = hal::random::random_value(
                        hal::Distribution::Uniform {
                            low: 0.0,
                            high: 1.0,
                        },
                        s,
                        i as u64,
                    );
                    (u * 4.0).floor() * 0.5 + u * 0.2
                })
                .collect();
            for j in (0..m).step_by(17).skip(1) {
                let (head, tail) = anchors.split_at_mut(j * d);
                tail[..d].copy_from_slice(&head[(j - 1) * d..j * d]);
            }
            let counts: Vec<f32> = (0..m).map(|j| 1.0 + (j % 5) as f32).collect();
            let gone: Vec<bool> = (0..m).map(|j| j % 11 == 3).collect();
            let merge2: f64 = radius * radius;
            let (mut a1, mut c1, mut g1) = (anchors.clone(), counts.clone(), gone.clone());
            let mut sse = vec![1.0; m];
            let mut free = Vec::new();
            let n1 = merge_close(&mut a1, d, &mut c1, &mut sse, &mut g1, &mut free, merge2);
            let (mut a2, mut c2, mut g2) = (anchors, counts, gone);
            let n2 = merge_all_pairs(&mut a2, d, &mut c2, &mut g2, merge2);
            assert_eq!(n1, n2, "seed {s}: merge counts");
            assert!(m < 10 || n1 > 0, "seed {s}: the case merges nothing");
            assert_eq!(g1, g2, "seed {s}");
            assert_eq!(c1, c2, "seed {s}");
            assert_eq!(a1, a2, "seed {s}");
            assert_eq!(free.len(), n1);
        }
    }
}
