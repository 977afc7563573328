//! The collectives over threads of one process: the reference NCCL is checked against.
//!
//! [`CpuCommunicator::group`] makes the handles of one group; each rank's thread calls the
//! collectives on its own handle. A call deposits its operands and waits; the last rank to
//! arrive checks that every rank asked for the same thing, computes the result for all of
//! them (under the backend's execution lock, like any kernel) and wakes them. Sums are taken
//! in `f64` in rank order and rounded once, so the result is exact where `f64` is and the
//! same bits on every rank and every run.
//!
//! A rank whose handle is dropped leaves the group: calls on the others then fail rather than
//! wait for it, and a peer that does not arrive within the group's timeout fails the call too.

use crate::storage::CpuBuffer;
use crate::{CpuBackend, exec};
use hal::collective::{CollectiveOp, Communicator};
use hal::validate::{CollectiveKind, collective};
use hal::{DType, DeviceBuffer, Error, Result, View, bf16, f16};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How long a rank waits for its peers by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Elements handled at a time: the scratch of one step stays in cache.
const CHUNK: usize = 1 << 14;

/// What one rank asked for.
#[derive(Clone)]
struct Call {
    kind: CollectiveKind,
    op: Option<CollectiveOp>,
    dtype: DType,
    counts: (usize, usize),
    send: (CpuBuffer, usize),
    recv: (CpuBuffer, usize),
}

impl Call {
    fn agrees(&self, other: &Call) -> bool {
        self.kind == other.kind
            && self.op == other.op
            && self.dtype == other.dtype
            && self.counts == other.counts
    }

    fn describe(&self) -> String {
        format!(
            "{}{} of {} x {} -> {}",
            self.kind.name(),
            self.op.map(|o| format!(" ({o:?})")).unwrap_or_default(),
            self.dtype,
            self.counts.0,
            self.counts.1
        )
    }
}

#[derive(Default)]
struct Round {
    calls: Vec<Option<Call>>,
    arrived: usize,
    /// The outcome of the finished round, while its ranks collect it.
    outcome: Option<std::result::Result<(), String>>,
    departed: usize,
    /// Bumped when a round finishes.
    generation: u64,
    /// Ranks whose handles were dropped.
    left: Vec<usize>,
}

struct Group {
    size: usize,
    timeout: Duration,
    round: Mutex<Round>,
    changed: Condvar,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One rank of a group of threads (see the module docs).
pub struct CpuCommunicator {
    backend: CpuBackend,
    rank: usize,
    group: Arc<Group>,
}

impl CpuCommunicator {
    /// The `size` handles of one group, rank `r` at index `r`, each with its own
    /// [`CpuBackend`] handle; peers wait for each other at most [`DEFAULT_TIMEOUT`].
    pub fn group(size: usize) -> Result<Vec<CpuCommunicator>> {
        Self::group_with_timeout(size, DEFAULT_TIMEOUT)
    }

    /// As [`CpuCommunicator::group`], with how long a call waits for the other ranks.
    pub fn group_with_timeout(size: usize, timeout: Duration) -> Result<Vec<CpuCommunicator>> {
        if size == 0 {
            return Err(Error::InvalidArgument {
                op: "CpuCommunicator::group",
                detail: "a group needs at least one rank".into(),
            });
        }
        let group = Arc::new(Group {
            size,
            timeout,
            round: Mutex::new(Round {
                calls: vec![None; size],
                ..Round::default()
            }),
            changed: Condvar::new(),
        });
        Ok((0..size)
            .map(|rank| CpuCommunicator {
                backend: CpuBackend::new(),
                rank,
                group: group.clone(),
            })
            .collect())
    }

    fn call(
        &self,
        kind: CollectiveKind,
        op: Option<CollectiveOp>,
        send: View<'_, CpuBuffer>,
        recv: View<'_, CpuBuffer>,
    ) -> Result<()> {
        let name = kind.name();
        let counts = collective(kind, self.rank, self.group.size, send, recv)?;
        let call = Call {
            kind,
            op,
            dtype: send.dtype(),
            counts,
            send: (send.buffer.clone(), send.layout.offset),
            recv: (recv.buffer.clone(), recv.layout.offset),
        };
        let g = &*self.group;
        let failed = |detail: String| Error::InvalidArgument { op: name, detail };
        let timed_out = || Error::Backend {
            backend: "cpu",
            detail: format!(
                "{name}: rank {} waited {:?} for its peers (a rank that never called?)",
                self.rank, g.timeout
            ),
        };
        let mut round = g.lock();
        // Wait until the previous round's ranks have all collected its outcome.
        let (guard, wait) = g
            .changed
            .wait_timeout_while(round, g.timeout, |r| {
                r.outcome.is_some() && r.left.is_empty()
            })
            .unwrap_or_else(|e| e.into_inner());
        round = guard;
        if let Some(&r) = round.left.first() {
            return Err(failed(format!("rank {r} has left the group")));
        }
        if wait.timed_out() {
            return Err(timed_out());
        }
        round.calls[self.rank] = Some(call);
        round.arrived += 1;
        if round.arrived == g.size {
            let calls: Vec<Call> = round.calls.iter_mut().map(|c| c.take().unwrap()).collect();
            round.arrived = 0;
            round.outcome = Some(run(&calls));
            round.departed = 0;
            round.generation += 1;
            g.changed.notify_all();
        } else {
            let generation = round.generation;
            let (guard, wait) = g
                .changed
                .wait_timeout_while(round, g.timeout, |r| {
                    r.generation == generation && r.left.is_empty()
                })
                .unwrap_or_else(|e| e.into_inner());
            round = guard;
            if round.generation == generation {
                // Withdraw the call: the round will never run.
                round.calls[self.rank] = None;
                round.arrived -= 1;
                if let Some(&r) = round.left.first() {
                    return Err(failed(format!("rank {r} has left the group")));
                }
                debug_assert!(wait.timed_out());
                return Err(timed_out());
            }
        }
        let outcome = round
            .outcome
            .clone()
            .expect("a finished round has an outcome");
        round.departed += 1;
        if round.departed == g.size {
            round.outcome = None;
            g.changed.notify_all();
        }
        outcome.map_err(failed)
    }
}

impl Drop for CpuCommunicator {
    fn drop(&mut self) {
        let mut round = self.group.lock();
        round.left.push(self.rank);
        self.group.changed.notify_all();
    }
}

/// Checks that the ranks agree and computes the round (under the execution lock).
fn run(calls: &[Call]) -> std::result::Result<(), String> {
    if let Some((r, c)) = calls.iter().enumerate().find(|(_, c)| !c.agrees(&calls[0])) {
        return Err(format!(
            "the ranks disagree: rank 0 called {}, rank {r} {}",
            calls[0].describe(),
            c.describe()
        ));
    }
    for (r, c) in calls.iter().enumerate() {
        for (q, d) in calls.iter().enumerate().skip(r + 1) {
            let shared = [&c.send.0, &c.recv.0]
                .iter()
                .any(|a| a.same_memory(&d.send.0) || a.same_memory(&d.recv.0));
            if shared {
                return Err(format!(
                    "ranks {r} and {q} pass the same buffer: each rank's operands are its own"
                ));
            }
        }
    }
    let _g = exec("collective");
    let first = &calls[0];
    let dtype = first.dtype;
    let size = calls.len();
    let (n_send, n_recv) = first.counts;
    match first.kind {
        CollectiveKind::AllReduce => {
            reduce_parts(calls, first.op.unwrap(), dtype, n_send, |_| 0, |_| 0..size)
        }
        CollectiveKind::ReduceScatter => reduce_parts(
            calls,
            first.op.unwrap(),
            dtype,
            n_recv,
            |p| p * n_recv,
            |p| p..p + 1,
        ),
        CollectiveKind::Broadcast { root } => {
            let src = &calls[root].send;
            for c in calls {
                copy_elements(dtype, src, 0, &c.recv, 0, n_send);
            }
        }
        CollectiveKind::AllGather => {
            for (q, c) in calls.iter().enumerate() {
                for d in calls {
                    copy_elements(dtype, &c.send, 0, &d.recv, q * n_send, n_send);
                }
            }
        }
    }
    Ok(())
}

/// For each part `p` (one for all-reduce, one per rank for reduce-scatter): `n` elements
/// reduced from every rank's `send` at `source(p)`, written to the `recv` of the ranks in
/// `targets(p)`.
fn reduce_parts(
    calls: &[Call],
    op: CollectiveOp,
    dtype: DType,
    n: usize,
    source: impl Fn(usize) -> usize,
    targets: impl Fn(usize) -> std::ops::Range<usize>,
) {
    let parts = if n == 0 {
        0
    } else if calls[0].kind == CollectiveKind::AllReduce {
        1
    } else {
        calls.len()
    };
    let mut acc = vec![0f64; CHUNK.min(n)];
    for p in 0..parts {
        for start in (0..n).step_by(CHUNK) {
            let len = CHUNK.min(n - start);
            let acc = &mut acc[..len];
            for (r, c) in calls.iter().enumerate() {
                let base = c.send.1 + source(p) + start;
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: validated inside the buffer; the execution lock is held.
                    let v = unsafe { load(dtype, &c.send.0, base + i) };
                    *a = if r == 0 {
                        v
                    } else {
                        match op {
                            CollectiveOp::Sum | CollectiveOp::Mean => *a + v,
                            CollectiveOp::Max => a.max(v),
                            CollectiveOp::Min => a.min(v),
                        }
                    };
                }
            }
            for c in &calls[targets(p)] {
                let base = c.recv.1 + start;
                for (i, &a) in acc.iter().enumerate() {
                    let v = finish(dtype, op, a, calls.len());
                    // SAFETY: as above.
                    unsafe { store(dtype, &c.recv.0, base + i, v) };
                }
            }
        }
    }
}

/// The reduced value as the dtype will hold it: integers wrapped to 32 bits (and, for the
/// mean, divided afterwards, truncating), floats divided for the mean.
fn finish(dtype: DType, op: CollectiveOp, acc: f64, size: usize) -> f64 {
    let wrapped = |v: f64| (v as i128).rem_euclid(1 << 32) as u32;
    match (dtype, op) {
        (DType::I32, CollectiveOp::Sum) => wrapped(acc) as i32 as f64,
        (DType::U32, CollectiveOp::Sum) => wrapped(acc) as f64,
        (DType::I32, CollectiveOp::Mean) => (wrapped(acc) as i32 / size as i32) as f64,
        (DType::U32, CollectiveOp::Mean) => (wrapped(acc) / size as u32) as f64,
        (_, CollectiveOp::Mean) => acc / size as f64,
        _ => acc,
    }
}

/// Element `i` of `buf` as `f64` (exact for every dtype).
///
/// # Safety
/// `i` is inside the buffer and no other thread writes it.
unsafe fn load(dtype: DType, buf: &CpuBuffer, i: usize) -> f64 {
    let p = buf.0.as_ptr();
    // SAFETY: the caller's; the allocation is 64-byte aligned and `i` indexes whole elements.
    unsafe {
        match dtype {
            DType::F32 => *(p as *const f32).add(i) as f64,
            DType::F64 => *(p as *const f64).add(i),
            DType::F16 => (*(p as *const f16).add(i)).to_f64(),
            DType::BF16 => (*(p as *const bf16).add(i)).to_f64(),
            DType::I32 => *(p as *const i32).add(i) as f64,
            DType::U32 => *(p as *const u32).add(i) as f64,
        }
    }
}

/// Writes `v` (already in the dtype's range for integers) to element `i`, rounding floats to
/// nearest.
///
/// # Safety
/// As [`load`].
unsafe fn store(dtype: DType, buf: &CpuBuffer, i: usize, v: f64) {
    let p = buf.0.as_ptr();
    // SAFETY: the caller's.
    unsafe {
        match dtype {
            DType::F32 => *(p as *mut f32).add(i) = v as f32,
            DType::F64 => *(p as *mut f64).add(i) = v,
            DType::F16 => *(p as *mut f16).add(i) = f16::from_f64(v),
            DType::BF16 => *(p as *mut bf16).add(i) = bf16::from_f64(v),
            DType::I32 => *(p as *mut i32).add(i) = v as i32,
            DType::U32 => *(p as *mut u32).add(i) = v as u32,
        }
    }
}

/// Copies `n` elements' bytes (exactly: NaN payloads and signed zeros kept).
fn copy_elements(
    dtype: DType,
    src: &(CpuBuffer, usize),
    src_at: usize,
    dst: &(CpuBuffer, usize),
    dst_at: usize,
    n: usize,
) {
    let e = dtype.size_in_bytes();
    // SAFETY: both ranges were validated inside their buffers; the execution lock is held;
    // `copy` allows the in-place forms' identical ranges.
    unsafe {
        std::ptr::copy(
            src.0.0.as_ptr().add((src.1 + src_at) * e),
            dst.0.0.as_ptr().add((dst.1 + dst_at) * e),
            n * e,
        )
    }
}

impl Communicator for CpuCommunicator {
    type Backend = CpuBackend;

    fn backend(&self) -> &CpuBackend {
        &self.backend
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.group.size
    }

    fn all_reduce(
        &self,
        op: CollectiveOp,
        send: View<'_, CpuBuffer>,
        recv: View<'_, CpuBuffer>,
    ) -> Result<()> {
        self.call(CollectiveKind::AllReduce, Some(op), send, recv)
    }

    fn broadcast(
        &self,
        root: usize,
        send: View<'_, CpuBuffer>,
        recv: View<'_, CpuBuffer>,
    ) -> Result<()> {
        self.call(CollectiveKind::Broadcast { root }, None, send, recv)
    }

    fn all_gather(&self, send: View<'_, CpuBuffer>, recv: View<'_, CpuBuffer>) -> Result<()> {
        self.call(CollectiveKind::AllGather, None, send, recv)
    }

    fn reduce_scatter(
        &self,
        op: CollectiveOp,
        send: View<'_, CpuBuffer>,
        recv: View<'_, CpuBuffer>,
    ) -> Result<()> {
        self.call(CollectiveKind::ReduceScatter, Some(op), send, recv)
    }

    /// Calls finish before they return here: nothing to wait for.
    fn synchronize(&self, _timeout: Duration) -> Result<()> {
        Ok(())
    }
}
