//! k-means++ seeding built from other primitives: [`Backend::kmeans_pp`]'s default, which
//! the CPU reference uses and the GPU backends keep for [`Precision::Reproducible`] (wgpu
//! also where it cannot encode its fused form: no immediates, or `m n` past 2^32).
//!
//! Each step is four device calls: the newest anchor's distances (`nearest_centroid` with one
//! centroid, which backends search in one light pass without the set-up of their GEMM-style
//! paths), the race with the `D^2` update fused in (IR), the argmin, and the winner's row
//! copied into the anchors (IR). On a GPU outside [`Precision::Reproducible`] a step is
//! three: an IR kernel copies the last winner's row into the anchors and computes the squared
//! distances to it over slices of `SLICE` (16) coordinates, a thread per point and slice (so
//! that no thread waits on a long row's loads one after another), the race adds each point's
//! slices in order, then the argmin (each device call costs several microseconds whatever its
//! work, and a step's work is small). The CPU keeps the four calls (its IR interpreter would
//! walk the distances one coordinate at a time), and so does the reproducible precision (its
//! distances are `nearest_centroid`'s reference order on every backend).
//!
//! The step number lives on the device, in two counters that steps take turns reading (the
//! copy writes the other one, one more than the one it read, so no launch reads and advances
//! the same word). Steps run as replays of one recording of `STEPS_AT_ONCE` (8) steps where they
//! fit (on a capturing backend, one device-graph launch each), else as direct calls. The
//! race's uniform draws are made for a block of steps at a time, each step reading its own
//! row, so the stream is the same as one draw of `n` per step at offset `step * n`. Nothing is
//! read back.

use crate::ir::{
    Access, BufferId, IrBinary, IrCmp, IrUnary, Program, ProgramBuilder, ScalarType, Value,
};
use crate::{ArgReduceOp, Backend, DType, Distribution, Layout, Precision, Result, View, validate};

/// The lanes the fused forms (CUDA's, wgpu's) give each point's distance: a power of two up
/// to 32, about 16 coordinates a lane, so a step's loads are spread over many threads.
pub fn lanes_per_point(d: usize) -> usize {
    1 << d.div_ceil(16).max(1).ilog2().min(5)
}

/// [`Backend::kmeans_pp`] by the steps above.
pub fn kmeans_pp_steps<B: Backend>(
    b: &B,
    x: View<'_, B::Buffer>,
    anchors: View<'_, B::Buffer>,
    seed: u64,
) -> Result<()> {
    let [n, d, m] = validate::kmeans_pp(x, anchors)?;
    // Draws for this many steps at once: all of them while they fit in 2^22 floats.
    kmeans_pp_in_blocks(
        b,
        x.buffer,
        anchors.buffer,
        [n, d, m],
        seed,
        DRAWS_AT_ONCE / n.max(1),
    )
}

/// [`kmeans_pp_steps`] drawing the uniforms for `block` steps at a time, into `anchors`
/// (contiguous `m x d`) from the rows of `x` (contiguous `n x d`). Public for the tests that
/// check the blocks do not change the anchors.
#[doc(hidden)]
pub fn kmeans_pp_in_blocks<B: Backend>(
    b: &B,
    x: &B::Buffer,
    anchors: &B::Buffer,
    [n, d, m]: [usize; 3],
    seed: u64,
    block: usize,
) -> Result<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let block = block.clamp(1, m);
    let sliced = b.info().kind != crate::DeviceKind::Cpu
        && b.precision() != Precision::Reproducible
        && d > 0
        && n * d.next_multiple_of(SLICE) < u32::MAX as usize;
    let slices = sliced.then(|| d.div_ceil(SLICE));
    let steps = std::sync::Arc::new(Steps::new(b, x, anchors, [n, d], block, slices)?);
    b.fill(
        View::new(&steps.d2, &Layout::contiguous(&[n])),
        f64::INFINITY,
    )?;
    let draws = steps.u.clone();
    let draw = |first: usize| {
        let len = (block * n).min((m - first) * n);
        b.random(
            View::new(&draws, &Layout::contiguous(&[len])),
            Distribution::Uniform {
                low: 0.0,
                high: 1.0,
            },
            seed,
            (first * n) as u64,
        )
    };
    draw(0)?;
    // The first anchor: the smallest draw.
    b.arg_reduce(
        ArgReduceOp::ArgMin,
        View::new(&steps.u, &Layout::contiguous(&[1, n])),
        1,
        View::new(&steps.winner, &Layout::contiguous(&[1, 1])),
    )?;
    // Step j reads counter j mod 2; a sliced step j commits the winner of step j - 1 first,
    // so it reads counter (j - 1) mod 2, and the last winner is committed after the loop.
    let lag = usize::from(sliced);
    if !sliced {
        steps.commit(b, 0)?;
    }
    if m > 1 {
        // One recording of STEPS_AT_ONCE steps (a capturing backend then launches one graph
        // for that many steps, where each launch leaves the device a gap to fill), replayed
        // wherever the steps left fit inside the current block of draws; other steps are
        // direct calls. The recording starts from the counter that step 1 reads, and as it
        // takes an even number of steps every replay starts there too (steps in between come
        // in pairs). One recording: one per counter and size cost more in recording time,
        // with the device idle meanwhile, than the replays saved.
        let first = (1 - lag) % 2;
        let many = match m > STEPS_AT_ONCE && block >= STEPS_AT_ONCE {
            true => {
                let recorded = steps.clone();
                Some(b.record(std::sync::Arc::new(move |b: &B| {
                    (0..STEPS_AT_ONCE).try_for_each(|q| recorded.next(b, (first + q) % 2))
                }))?)
            }
            // (Not recorded where no replay could use it.)
            false => None,
        };
        let mut j = 1;
        while j < m {
            if j % block == 0 {
                draw(j)?;
            }
            let end = j + STEPS_AT_ONCE;
            match &many {
                Some(graph)
                    if end <= m && (end - 1) / block == j / block && (j - lag) % 2 == first =>
                {
                    b.replay(graph)?;
                    j = end;
                }
                _ => {
                    steps.next(b, (j - lag) % 2)?;
                    j += 1;
                }
            }
        }
    }
    if sliced {
        steps.commit(b, (m - 1) % 2)?;
    }
    Ok(())
}

/// The k-means++ steps replayed as one recording (even, so a recording ends on the counter
/// it started from).
const STEPS_AT_ONCE: usize = 8;

/// The uniform draws k-means++ makes at once, at most (16 MiB of f32).
const DRAWS_AT_ONCE: usize = 1 << 22;

/// The device state of k-means++ (see [`kmeans_pp_steps`]).
struct Steps<B: Backend> {
    x: B::Buffer,
    anchors: B::Buffer,
    /// Uniform draws, a row of `n` per step of the current block.
    u: B::Buffer,
    d2: B::Buffer,
    key: B::Buffer,
    /// The step's winning point, and its row.
    winner: B::Buffer,
    newest: B::Buffer,
    /// The number of anchors placed so far, in the counter the next step reads (see
    /// [`kmeans_pp_steps`]); both start at 0.
    counters: [B::Buffer; 2],
    race: B::Kernel,
    commit: B::Kernel,
    distances: Distances<B>,
    n: usize,
    d: usize,
}

/// How a k-means++ step finds the distances to the newest anchor (see [`kmeans_pp_steps`]).
enum Distances<B: Backend> {
    /// `nearest_centroid` against the committed row (`newest`), into `near` (`near_i` takes
    /// the indices, all 0).
    Search { near: B::Buffer, near_i: B::Buffer },
    /// The three-call step: the IR kernel that also commits the last winner, the points it
    /// reads coordinate after coordinate (`d x n`, so neighbouring threads read neighbouring
    /// words), and its output, `slices x n` partial squared distances.
    Sliced {
        kernel: B::Kernel,
        by_coordinate: B::Buffer,
        partial: B::Buffer,
    },
}

/// Coordinates per thread in [`kmeans_pp_steps`]'s three-call step.
const SLICE: usize = 16;

impl<B: Backend> Steps<B> {
    /// The buffers and kernels of the steps for `n x d` points `x` into `anchors`, `block`
    /// steps' draws at a time; distances in `slices` slices of coordinates (`Some`: the
    /// sliced form, a transposed copy of `x` made here) or by `nearest_centroid` (`None`).
    fn new(
        b: &B,
        x: &B::Buffer,
        anchors: &B::Buffer,
        [n, d]: [usize; 2],
        block: usize,
        slices: Option<usize>,
    ) -> Result<Self> {
        Ok(Steps {
            x: x.clone(),
            anchors: anchors.clone(),
            // (Buffers written whole before they are read skip the zero fill.)
            u: b.alloc_for_write(DType::F32, block * n)?,
            // D^2 to the anchors so far (the first anchor's race is on the draws alone).
            d2: b.alloc_for_write(DType::F32, n)?,
            key: b.alloc_for_write(DType::F32, n)?,
            winner: b.alloc(DType::U32, 1)?,
            newest: b.alloc(DType::F32, d)?,
            counters: [b.alloc(DType::U32, 1)?, b.alloc(DType::U32, 1)?],
            race: b.compile(&race_program(
                n,
                block,
                slices.unwrap_or(1),
                b.capabilities().f64.program_math,
            )?)?,
            commit: b.compile(&commit_program(d)?)?,
            distances: match slices {
                Some(slices) => {
                    let by_coordinate = b.alloc_for_write(DType::F32, n * d)?;
                    let by_row = Layout::contiguous(&[n, d]).transpose(0, 1)?;
                    b.copy(
                        View::new(x, &by_row),
                        View::new(&by_coordinate, &Layout::contiguous(&[d, n])),
                    )?;
                    Distances::Sliced {
                        kernel: b.compile(&sliced_distance_program(n, d)?)?,
                        by_coordinate,
                        partial: b.alloc_for_write(DType::F32, slices * n)?,
                    }
                }
                None => Distances::Search {
                    near: b.alloc(DType::F32, n)?,
                    near_i: b.alloc(DType::U32, n)?,
                },
            },
            n,
            d,
        })
    }

    /// Copies the winner's row into the anchors at the count in counter `parity` and writes
    /// the count plus one into the other counter.
    fn commit(&self, b: &B, parity: usize) -> Result<()> {
        b.launch(
            &self.commit,
            &[
                &self.x,
                &self.winner,
                &self.counters[parity],
                &self.counters[1 - parity],
                &self.newest,
                &self.anchors,
            ],
            self.d,
        )
    }

    /// A step after the first, reading counter `parity`: the newest anchor's distances, the
    /// race, the winner.
    fn next(&self, b: &B, parity: usize) -> Result<()> {
        let (n, d) = (self.n, self.d);
        let ln = Layout::contiguous(&[n]);
        let (near, near_i) = match &self.distances {
            Distances::Search { near, near_i } => (near, near_i),
            Distances::Sliced {
                kernel,
                by_coordinate,
                partial,
            } => {
                b.launch(
                    kernel,
                    &[
                        &self.x,
                        by_coordinate,
                        &self.winner,
                        &self.counters[parity],
                        &self.counters[1 - parity],
                        &self.anchors,
                        partial,
                    ],
                    sliced_threads(n, d),
                )?;
                // The race reads the count the distance kernel wrote.
                b.launch(
                    &self.race,
                    &[
                        &self.u,
                        partial,
                        &self.counters[1 - parity],
                        &self.d2,
                        &self.key,
                    ],
                    n,
                )?;
                return self.argmin(b);
            }
        };
        b.nearest_centroid(
            View::new(&self.x, &Layout::contiguous(&[n, d])),
            View::new(&self.newest, &Layout::contiguous(&[1, d])),
            View::new(near_i, &ln),
            View::new(near, &ln),
        )?;
        b.launch(
            &self.race,
            &[&self.u, near, &self.counters[parity], &self.d2, &self.key],
            n,
        )?;
        self.argmin(b)?;
        self.commit(b, parity)
    }

    /// The race's winner: the smallest key.
    fn argmin(&self, b: &B) -> Result<()> {
        let n = self.n;
        b.arg_reduce(
            ArgReduceOp::ArgMin,
            View::new(&self.key, &Layout::contiguous(&[1, n])),
            1,
            View::new(&self.winner, &Layout::contiguous(&[1, 1])),
        )
    }
}

/// With `s = step[0]` and `near[i]` the sum over `slices` partial distances
/// `part[q n + i]` in order of `q` (one slice: the distance itself): `d2[i] = min(d2[i],
/// near[i])`, then `key[i] = -ln(u[t n + i]) / d2[i]` with `t = s mod block` (infinite where
/// `d2 = 0`: a point on an anchor never wins; `u = 0` is mapped to the smallest positive float
/// so the key stays finite). With `wide` the key is computed in f64 and rounded to f32 once:
/// backends' f32 logarithms and divisions differ in their last bits (WGSL's are approximate),
/// and a near-tie then picked different rows; f64's errors (an ulp or two of f64) move the
/// rounded key only where it lies within about 2^-50 of an f32 rounding boundary.
fn race_program(n: usize, block: usize, slices: usize, wide: bool) -> Result<Program> {
    let mut p = ProgramBuilder::new("vlc_kmeanspp_race");
    let u = p.buffer(DType::F32, Access::Read);
    let part = p.buffer(DType::F32, Access::Read);
    let step = p.buffer(DType::U32, Access::Read);
    let d2 = p.buffer(DType::F32, Access::ReadWrite);
    let key = p.buffer(DType::F32, Access::Write);
    let i = p.index();
    let zero_u = p.const_u32(0);
    let s = p.load(step, zero_u);
    let mut near = p.load(part, i);
    for q in 1..slices {
        let at = p.const_u32((q * n) as u32);
        let at = p.add(at, i);
        let v = p.load(part, at);
        near = p.add(near, v);
    }
    let block = p.const_u32(block as u32);
    let t = p.binary(IrBinary::Rem, s, block);
    let n = p.const_u32(n as u32);
    let row = p.mul(t, n);
    let at = p.add(row, i);
    let uv = p.load(u, at);
    let old = p.load(d2, i);
    let dv = p.binary(IrBinary::Min, old, near);
    p.store(d2, i, dv);
    let tiny = p.const_f32(f32::MIN_POSITIVE);
    let safe_u = p.binary(IrBinary::Max, uv, tiny);
    let k = if wide {
        let u64 = p.cast(ScalarType::F64, safe_u);
        let ln = p.unary(IrUnary::Log, u64);
        let e = p.unary(IrUnary::Neg, ln);
        let d64 = p.cast(ScalarType::F64, dv);
        let k = p.div(e, d64);
        p.cast(ScalarType::F32, k)
    } else {
        let ln = p.unary(IrUnary::Log, safe_u);
        let e = p.unary(IrUnary::Neg, ln);
        p.div(e, dv)
    };
    let zero = p.const_f32(0.0);
    let inf = p.const_f32(f32::INFINITY);
    let empty = p.cmp(IrCmp::Le, dv, zero);
    let k = p.select(empty, inf, k);
    p.store(key, i, k);
    p.build()
}

/// The three-call k-means++ step's distance kernel, over [`sliced_threads`] threads (`slices
/// x n`, `slices = ceil(d / SLICE)`, or `d` where that is more), with `w = winner[0]` and `s = step[0]` (the anchors placed before `w`):
/// thread `t = q n + i < slices n` writes `part[t]`, point `i`'s squared distance to row `w` over
/// coordinates `q SLICE ..` (up to `SLICE` of them, in order, with fused multiply-adds; `xt`
/// is `x` coordinate after coordinate); it also copies coordinate `min(t, d - 1)` of row `w`
/// into anchor `s` (the threads past `d` write what thread `d - 1` writes) and writes
/// `next[0] = s + 1`.
fn sliced_distance_program(n: usize, d: usize) -> Result<Program> {
    let mut p = ProgramBuilder::new("vlc_kmeanspp_distances");
    let x = p.buffer(DType::F32, Access::Read);
    let xt = p.buffer(DType::F32, Access::Read);
    let winner = p.buffer(DType::U32, Access::Read);
    let step = p.buffer(DType::U32, Access::Read);
    let next = p.buffer(DType::U32, Access::Write);
    let anchors = p.buffer(DType::F32, Access::Write);
    let part = p.buffer(DType::F32, Access::Write);
    let t = p.index();
    let zero = p.const_u32(0);
    let nn = p.const_u32(n as u32);
    let dd = p.const_u32(d as u32);
    let last = p.const_u32(d as u32 - 1);
    let q = p.div(t, nn);
    let q_n = p.mul(q, nn);
    let i = p.sub(t, q_n);
    let w = p.load(winner, zero);
    let s = p.load(step, zero);
    let from = p.mul(w, dd);
    let slice = p.const_u32(SLICE as u32);
    let first = p.mul(q, slice);
    let zero_f = p.const_f32(0.0);
    let mut acc = zero_f;
    for k in 0..SLICE {
        let k = p.const_u32(k as u32);
        let c = p.add(first, k);
        // Past the last coordinate (the last slice of a d that SLICE does not divide): a
        // term of zero, read at a coordinate that exists.
        let inside = p.cmp(IrCmp::Lt, c, dd);
        let c = p.binary(IrBinary::Min, c, last);
        let at = p.mul(c, nn);
        let at = p.add(at, i);
        let a = p.load(xt, at);
        let at = p.add(from, c);
        let b = p.load(x, at);
        let diff = p.sub(a, b);
        let diff = p.select(inside, diff, zero_f);
        acc = p.fma(diff, diff, acc);
    }
    // Threads past the partial distances (where d exceeds them) only copy coordinates.
    let partials = p.const_u32((n * d.div_ceil(SLICE)) as u32);
    let computes = p.cmp(IrCmp::Lt, t, partials);
    p.store_if(computes, part, t, acc);
    let k = p.binary(IrBinary::Min, t, last);
    copy_winner(&mut p, [x, anchors, next], k, from, s, d);
    p.build()
}

/// The launch size of [`sliced_distance_program`]: a thread per slice of each point, and at
/// least one per coordinate, since the same threads copy the last winner's row (with few
/// points and many coordinates, `n` slices of 16 are fewer than `d`: the row's tail was
/// never copied, and every anchor but the last lost its tail).
fn sliced_threads(n: usize, d: usize) -> usize {
    (n * d.div_ceil(SLICE)).max(d)
}

/// Stores coordinate `k` of the winner's row (starting at `from` in `x`) into anchor `s`, and
/// `next[0] = s + 1`; returns the coordinate's value.
fn copy_winner(
    p: &mut ProgramBuilder,
    [x, anchors, next]: [BufferId; 3],
    k: Value,
    from: Value,
    s: Value,
    d: usize,
) -> Value {
    let at = p.add(from, k);
    let v = p.load(x, at);
    let dd = p.const_u32(d as u32);
    let to = p.mul(s, dd);
    let to = p.add(to, k);
    p.store(anchors, to, v);
    // The count moved on past `s`.
    let one = p.const_u32(1);
    let count = p.add(s, one);
    let zero = p.const_u32(0);
    p.store(next, zero, count);
    v
}

/// Over `k < d`: `newest[k] = x[winner[0] d + k]` and `anchors[step[0] d + k]` the same;
/// `next[0] = step[0] + 1` (every thread writes the same value).
fn commit_program(d: usize) -> Result<Program> {
    let mut p = ProgramBuilder::new("vlc_kmeanspp_commit");
    let x = p.buffer(DType::F32, Access::Read);
    let winner = p.buffer(DType::U32, Access::Read);
    let step = p.buffer(DType::U32, Access::Read);
    let next = p.buffer(DType::U32, Access::Write);
    let newest = p.buffer(DType::F32, Access::Write);
    let anchors = p.buffer(DType::F32, Access::Write);
    let k = p.index();
    let zero = p.const_u32(0);
    let dd = p.const_u32(d as u32);
    let w = p.load(winner, zero);
    let s = p.load(step, zero);
    let from = p.mul(w, dd);
    let v = copy_winner(&mut p, [x, anchors, next], k, from, s, d);
    p.store(newest, k, v);
    p.build()
}
