//! The loop's device state: one assignment pass, the update, the energies.

use hal::ir::ProgramBuilder;
use hal::{Backend, Layout, Precision, View};

/// Sums a buffer's first `len` elements over the shards of a sharded run, in place (every
/// shard then holds the whole run's sums).
pub(crate) type Reduce<'r, B> =
    Option<&'r (dyn Fn(&<B as Backend>::Buffer, usize) -> hal::Result<()> + 'r)>;

/// The device buffers of one run.
pub(crate) struct State<'r, B: Backend> {
    pub(crate) b: B,
    /// A sharded run's sums over the shards (`None` alone).
    pub(crate) reduce: Reduce<'r, B>,
    /// The points of the whole run (this shard's are `pass.n`).
    pub(crate) n_total: usize,
    /// Assignments enqueued so far (the device's `Pass::slot` counter holds the same).
    pub(crate) assignments: usize,
    /// On a GPU, the maintenance check, its flags and its limits (see
    /// [`maintenance_check_program`]); the verdict is copied into the last slot of `totals`,
    /// so it comes back with the energies.
    pub(crate) check: Option<(B::Kernel, B::Buffer, B::Buffer)>,
    /// The slot of `totals` that holds the check's verdict (after every assignment's).
    pub(crate) verdict_slot: usize,
    /// The schedule's temperatures on the host, for the reports.
    pub(crate) temperatures: Vec<f32>,
    /// The device buffers and the work of an update and of an assignment, shared with the
    /// recording.
    pub(crate) pass: std::sync::Arc<Pass<B>>,
    /// An update followed by a fast assignment, recorded at first use (see
    /// [`State::update_and_assign`]).
    pub(crate) recorded: Option<B::Graph>,
}

/// The device work of one annealing iteration, as calls that depend on no host value: the
/// schedule row and the energy slot come from counters on the device, which the calls
/// advance. So an update followed by an assignment can be recorded once and replayed every
/// iteration (on CUDA one graph launch where it was about fifteen launches, whose host cost
/// left the device idle for much of the annealing).
pub(crate) struct Pass<B: Backend> {
    pub(crate) n: usize,
    pub(crate) d: usize,
    pub(crate) m: usize,
    pub(crate) x: B::Buffer,
    pub(crate) anchors: B::Buffer,
    pub(crate) velocity: B::Buffer,
    pub(crate) assign: B::Buffer,
    pub(crate) dist: B::Buffer,
    pub(crate) weights: B::Buffer,
    pub(crate) sums: B::Buffer,
    pub(crate) weight_sums: B::Buffer,
    /// Each anchor's sum of squared distances, and its member count, at the last per-anchor
    /// assignment.
    pub(crate) sse: B::Buffer,
    pub(crate) counts: B::Buffer,
    /// The sum of squared distances at the last assignment, and at every assignment so far
    /// (`totals`, one slot per assignment, then the maintenance check's verdict), read back
    /// for the energies.
    pub(crate) total: B::Buffer,
    pub(crate) totals: B::Buffer,
    /// Zeros: every anchor's segment in the sum of `sse`.
    pub(crate) zero_ids: B::Buffer,
    /// Row `t`: update `t`'s `[huber^2 / n, temperature, momentum, 0]`, taken into `params`
    /// by `take_row` (so no update waits for the host).
    pub(crate) schedule: B::Buffer,
    pub(crate) params: B::Buffer,
    pub(crate) huber: B::Kernel,
    pub(crate) update: B::Kernel,
    /// `[updates so far]` and `[assignments so far]`.
    pub(crate) step: B::Buffer,
    pub(crate) slot: B::Buffer,
    /// Copies schedule row `step` into `params` and advances `step`.
    pub(crate) take_row: B::Kernel,
    /// Copies `total` into `totals[slot]` and advances `slot`.
    pub(crate) keep_total: B::Kernel,
}

impl<B: Backend> Pass<B> {
    /// Assigns every point and sums the squared distances in all (see [`State::assign`]),
    /// keeping the total in the next slot of `totals`.
    pub(crate) fn assign(&self, b: &B, per_anchor: bool, reduce: Reduce<'_, B>) -> hal::Result<()> {
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
            if let Some(r) = reduce {
                r(&self.total, 1)?;
            }
        } else {
            b.segment_sum(
                View::new(&self.dist, &Layout::contiguous(&[n, 1])),
                View::new(&self.assign, &ln),
                None,
                View::new(&self.sse, &Layout::contiguous(&[m, 1])),
                View::new(&self.counts, &Layout::contiguous(&[m])),
            )?;
            if let Some(r) = reduce {
                r(&self.sse, m)?;
                r(&self.counts, m)?;
            }
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
    pub(crate) fn update(&self, b: &B, reduce: Reduce<'_, B>) -> hal::Result<()> {
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
        if let Some(r) = reduce {
            r(&self.sums, m * d)?;
            r(&self.weight_sums, m)?;
        }
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

/// `counter[0] = value + 1`: a device counter moved on past `value`, the count it held.
pub(crate) fn advance(p: &mut ProgramBuilder, counter: hal::ir::BufferId, value: hal::ir::Value) {
    let one = p.const_u32(1);
    let next = p.add(value, one);
    let zero = p.const_u32(0);
    p.store(counter, zero, next);
}
