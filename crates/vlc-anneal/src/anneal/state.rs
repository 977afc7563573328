//! The loop's device state: one assignment pass, the update, the energies.

use hal::ir::ProgramBuilder;
use hal::{Backend, Layout, Precision, View};

/// How a sharded run combines its shards' per-anchor sums (`None`: a run alone).
pub(crate) type Reduce<'r, B> = Option<Shards<'r, B>>;

/// Sums a buffer's first `len` elements over the shards, in place.
pub(crate) type SumFn<'r, B> = dyn Fn(&<B as Backend>::Buffer, usize) -> hal::Result<()> + 'r;

/// Runs `step` on each rank in rank order; after each rank's step, that rank's `(buffer,
/// len)` outputs are broadcast to every rank (the next rank's carry, and the last rank's the
/// result everywhere). Before rank 0's step the outputs are zeroed.
pub(crate) type ChainFn<'r, B> = dyn Fn(
        &mut dyn FnMut() -> hal::Result<()>,
        [(&<B as Backend>::Buffer, usize); 2],
    ) -> hal::Result<()>
    + 'r;

/// How the shards' sums become the whole run's.
pub(crate) enum Shards<'r, B: Backend> {
    /// Fast mode: each shard sums its points, and the sums are added over the shards.
    Sum(&'r SumFn<'r, B>),
    /// Exact mode: one chain of additions through the shards in rank order, each shard's
    /// segment sums starting from the previous shard's (its `carry` rows), so the sums are a
    /// single device's bit for bit ([`hal::Precision::Reproducible`]'s order: each segment's
    /// rows in ascending order).
    Chain(&'r ChainFn<'r, B>),
}

impl<B: Backend> Clone for Shards<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for Shards<'_, B> {}

/// An exact sharded run's carry rows: every per-point buffer starts with `m` rows that hold
/// the previous shard's per-anchor sums, one row per anchor (segment ids `0..m`), so a
/// segment sum over them and this shard's points continues that shard's chains.
pub(crate) struct Carry<B: Backend> {
    /// `[pre + n]` ones: the weights of the squared-distance sums.
    pub(crate) ones: B::Buffer,
    /// `[pre + n]`: the counts' weights (the carried counts, then the points').
    pub(crate) sse_counts_weights: B::Buffer,
    pub(crate) update_counts_weights: B::Buffer,
    /// Outputs a chain step computes and discards (`[m, max(d, 1)]` and `[m]`).
    pub(crate) scratch_sums: B::Buffer,
    pub(crate) scratch_counts: B::Buffer,
}

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
    /// Carry rows before the points in `x`, `assign`, `dist` and `weights`: `m` in an exact
    /// sharded run ([`Carry`]), else 0.
    pub(crate) pre: usize,
    pub(crate) carry: Option<Carry<B>>,
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
        let (n, d, m, pre) = (self.n, self.d, self.m, self.pre);
        let ln = Layout::contiguous(&[n]);
        let points = |shape: &[usize]| {
            let mut l = Layout::contiguous(shape);
            l.offset = pre * shape[1..].iter().product::<usize>();
            l
        };
        b.nearest_centroid(
            View::new(&self.x, &points(&[n, d])),
            View::new(&self.anchors, &Layout::contiguous(&[m, d])),
            View::new(&self.assign, &points(&[n])),
            View::new(&self.dist, &points(&[n])),
        )?;
        let one = Layout::contiguous(&[1]);
        if !per_anchor && b.precision() != Precision::Reproducible {
            b.reduce(
                hal::ReduceOp::Sum,
                View::new(&self.dist, &ln),
                &[0],
                View::new(&self.total, &one),
            )?;
            if let Some(Shards::Sum(r)) = reduce {
                r(&self.total, 1)?;
            }
        } else if let (Some(Shards::Chain(chain)), Some(c)) = (reduce, &self.carry) {
            let step = &mut || {
                self.chain_step(
                    b,
                    (&self.dist, 1),
                    &c.ones,
                    &c.sse_counts_weights,
                    [&self.sse, &self.counts],
                )
            };
            chain(step, [(&self.sse, m), (&self.counts, m)])?;
            self.total_in_anchor_order(b)?;
        } else {
            b.segment_sum(
                View::new(&self.dist, &Layout::contiguous(&[n, 1])),
                View::new(&self.assign, &ln),
                None,
                View::new(&self.sse, &Layout::contiguous(&[m, 1])),
                View::new(&self.counts, &Layout::contiguous(&[m])),
            )?;
            if let Some(Shards::Sum(r)) = reduce {
                r(&self.sse, m)?;
                r(&self.counts, m)?;
            }
            self.total_in_anchor_order(b)?;
        }
        b.launch(
            &self.keep_total,
            &[&self.total, &self.slot, &self.totals],
            1,
        )
    }

    /// The next update of the schedule, from the last assignment.
    pub(crate) fn update(&self, b: &B, reduce: Reduce<'_, B>) -> hal::Result<()> {
        let (n, d, m, pre) = (self.n, self.d, self.m, self.pre);
        b.launch(
            &self.take_row,
            &[&self.schedule, &self.step, &self.params],
            1,
        )?;
        // Over the carry rows too (their weights are set by each chain step).
        b.launch(
            &self.huber,
            &[&self.dist, &self.params, &self.total, &self.weights],
            pre + n,
        )?;
        if let (Some(Shards::Chain(chain)), Some(c)) = (reduce, &self.carry) {
            let step = &mut || {
                // The carry rows weigh 1 in the sums; the points their Huber weights.
                b.fill(View::new(&self.weights, &Layout::contiguous(&[m])), 1.0)?;
                let mut tail = Layout::contiguous(&[n]);
                tail.offset = pre;
                b.copy(
                    View::new(&self.weights, &tail),
                    View::new(&c.update_counts_weights, &tail),
                )?;
                self.chain_step(
                    b,
                    (&self.x, d),
                    &self.weights,
                    &c.update_counts_weights,
                    [&self.sums, &self.weight_sums],
                )
            };
            chain(step, [(&self.sums, m * d), (&self.weight_sums, m)])?;
        } else {
            let ln = Layout::contiguous(&[n]);
            b.segment_sum(
                View::new(&self.x, &Layout::contiguous(&[n, d])),
                View::new(&self.assign, &ln),
                Some(View::new(&self.weights, &ln)),
                View::new(&self.sums, &Layout::contiguous(&[m, d])),
                View::new(&self.weight_sums, &Layout::contiguous(&[m])),
            )?;
            if let Some(Shards::Sum(r)) = reduce {
                r(&self.sums, m * d)?;
                r(&self.weight_sums, m)?;
            }
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

impl<B: Backend> Pass<B> {
    /// The total of the per-anchor sums in anchor order (one fixed order under
    /// Precision::Reproducible, so the same on every backend in exact mode); its count output
    /// is discarded into `weight_sums`, which the next update overwrites.
    fn total_in_anchor_order(&self, b: &B) -> hal::Result<()> {
        let m = self.m;
        b.segment_sum(
            View::new(&self.sse, &Layout::contiguous(&[m, 1])),
            View::new(&self.zero_ids, &Layout::contiguous(&[m])),
            None,
            View::new(&self.total, &Layout::contiguous(&[1, 1])),
            View::new(&self.weight_sums, &Layout::contiguous(&[1])),
        )
    }

    /// This shard's turn in an exact sharded run's chain: `outputs` (`[sums [m, w], counts
    /// [m]]`) hold the previous shard's (zeros on rank 0); they go into the carry rows (the
    /// sums into `x`'s first `m` rows, the counts into `counts_weights`' first `m`), and two
    /// segment sums over the carry rows and the points continue the chains: the sums with
    /// `weights` (1 on the carry rows), the counts with `counts_weights` (over `dist`, whose
    /// values that pass ignores into a scratch).
    fn chain_step(
        &self,
        b: &B,
        (x, w): (&B::Buffer, usize),
        weights: &B::Buffer,
        counts_weights: &B::Buffer,
        [sums, counts]: [&B::Buffer; 2],
    ) -> hal::Result<()> {
        let (m, rows) = (self.m, self.pre + self.n);
        let c = self.carry.as_ref().expect("a chain has carry rows");
        let lm = Layout::contiguous(&[m]);
        b.copy(
            View::new(sums, &Layout::contiguous(&[m, w])),
            View::new(x, &Layout::contiguous(&[m, w])),
        )?;
        b.copy(View::new(counts, &lm), View::new(counts_weights, &lm))?;
        let all = Layout::contiguous(&[rows]);
        let ids = View::new(&self.assign, &all);
        b.segment_sum(
            View::new(x, &Layout::contiguous(&[rows, w])),
            ids,
            Some(View::new(weights, &Layout::contiguous(&[rows]))),
            View::new(sums, &Layout::contiguous(&[m, w])),
            View::new(&c.scratch_counts, &lm),
        )?;
        b.segment_sum(
            View::new(&self.dist, &Layout::contiguous(&[rows, 1])),
            ids,
            Some(View::new(counts_weights, &Layout::contiguous(&[rows]))),
            View::new(&c.scratch_sums, &Layout::contiguous(&[m, 1])),
            View::new(counts, &lm),
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
