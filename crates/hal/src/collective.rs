//! Collectives: several devices (ranks) reducing and exchanging buffers together.
//!
//! A [`Communicator`] is one rank's handle on a group of `size` ranks, each with its own
//! backend handle (a device). Every rank calls the same collectives, in the same order, with
//! the same element counts, dtype, operation and root; each call then does its part of one
//! group-wide operation:
//!
//! | call | `send` (n elements) | `recv` |
//! |---|---|---|
//! | [`Communicator::all_reduce`] | this rank's values | `n`: `op` over all ranks' `send`, elementwise |
//! | [`Communicator::broadcast`] | read on `root` only | `n`: `root`'s `send` |
//! | [`Communicator::all_gather`] | this rank's part | `size * n`: rank `r`'s `send` at `r * n` |
//! | [`Communicator::reduce_scatter`] | `size * m` values | `m`: part `rank` of `op` over all ranks' `send` |
//!
//! **Operands.** Contiguous views (any offset) of one dtype: `f32`, `f64`, `f16`, `bf16`,
//! `i32`, `u32`. In place is allowed in the forms NCCL defines: `recv` the same view as
//! `send` (all-reduce, broadcast), `send` this rank's part of `recv` (all-gather), `recv`
//! this rank's part of `send` (reduce-scatter); any other overlap of the two is an error.
//!
//! **Ordering.** A collective is enqueued on the rank's backend queue, in order with its
//! kernels: work enqueued before it has produced `send` when it reads it, and work enqueued
//! after it sees `recv`. The one exception is asked for by name:
//! [`Communicator::all_reduce_overlapped`] runs beside the kernels that follow it, until
//! [`Communicator::wait_overlapped`]. On a GPU the call returns once enqueued; on the CPU reference it
//! returns when every rank has called it (it is the rendezvous). Each rank must be driven by
//! its own thread or process: a rank's call may wait for its peers to arrive.
//!
//! **Values.** [`CollectiveOp::Sum`] and [`CollectiveOp::Mean`] add in an order the backend
//! chooses (NCCL: a ring or a tree; the CPU reference in `f64`, rounded once), so results may
//! differ from the reference by the rounding of `size - 1` additions in the dtype (`f16`,
//! `bf16`: each partial sum rounded to it); every rank receives the same bits; a backend
//! gives the same bits run to run for the same sizes and group. Integers wrap
//! (two's complement); `Mean` of integers truncates toward zero. `Max` and `Min` are exact:
//! a NaN is ignored unless every rank holds one there (IEEE `maxNum`, as `f64::max`), and
//! `-0.0` and `+0.0` compare equal (either may result). Infinities add as IEEE says
//! (`+inf + -inf` is NaN).
//!
//! **Errors.** Operands are checked on every rank before anything is enqueued
//! ([`crate::validate::collective`]), and a check that fails fails on that rank only: the
//! others then wait for it. The CPU reference compares the calls of all ranks and fails every
//! rank with [`crate::Error::InvalidArgument`] when they disagree (counts, dtype, operation,
//! root); NCCL cannot see a disagreement, which is undefined behaviour there (a hang, most
//! often): [`Communicator::synchronize`] waits with a deadline and reports
//! [`crate::Error::Backend`] when it passes, after which the communicator is unusable.

use crate::{Backend, Result, View};
use std::time::Duration;

/// The elementwise operation of [`Communicator::all_reduce`] and
/// [`Communicator::reduce_scatter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveOp {
    Sum,
    /// The sum divided by the number of ranks.
    Mean,
    Max,
    Min,
}

impl CollectiveOp {
    pub const ALL: [CollectiveOp; 4] = [Self::Sum, Self::Mean, Self::Max, Self::Min];
}

/// One rank's handle on a group of devices (see the module docs for the contract).
pub trait Communicator: Send {
    type Backend: Backend;

    /// This rank's device.
    fn backend(&self) -> &Self::Backend;
    /// This rank's index, `0..size`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;

    /// `recv = op(send of rank 0, ..., send of rank size - 1)`, elementwise.
    fn all_reduce(
        &self,
        op: CollectiveOp,
        send: View<'_, <Self::Backend as Backend>::Buffer>,
        recv: View<'_, <Self::Backend as Backend>::Buffer>,
    ) -> Result<()>;

    /// `recv = send of rank root`; `send` is read on `root` only (other ranks may pass
    /// `recv` as `send`).
    fn broadcast(
        &self,
        root: usize,
        send: View<'_, <Self::Backend as Backend>::Buffer>,
        recv: View<'_, <Self::Backend as Backend>::Buffer>,
    ) -> Result<()>;

    /// `recv[r * n .. (r + 1) * n] = send of rank r` for every rank `r` (`n` = `send`'s
    /// elements).
    fn all_gather(
        &self,
        send: View<'_, <Self::Backend as Backend>::Buffer>,
        recv: View<'_, <Self::Backend as Backend>::Buffer>,
    ) -> Result<()>;

    /// `recv = (op over all ranks' send)[rank * m .. (rank + 1) * m]` (`m` = `recv`'s
    /// elements).
    fn reduce_scatter(
        &self,
        op: CollectiveOp,
        send: View<'_, <Self::Backend as Backend>::Buffer>,
        recv: View<'_, <Self::Backend as Backend>::Buffer>,
    ) -> Result<()>;

    /// An all-reduce of `buf` in place that may run beside this rank's kernels: it starts
    /// after the work enqueued so far (which produced `buf`), and its result is ready for the
    /// work enqueued after the next [`Communicator::wait_overlapped`]; kernels enqueued in
    /// between run alongside it and must not read or write `buf` (they would race with it).
    /// The communicator keeps `buf`'s memory alive until then. Overlapped all-reduces are
    /// part of the rank's sequence of collectives like any other (every rank calls them in
    /// the same order). Data-parallel training averages gradient buckets this way while the
    /// backward pass goes on. The default is [`Communicator::all_reduce`] in order, which
    /// satisfies the contract without overlap (the CPU reference's).
    fn all_reduce_overlapped(
        &self,
        op: CollectiveOp,
        buf: View<'_, <Self::Backend as Backend>::Buffer>,
    ) -> Result<()> {
        self.all_reduce(op, buf, buf)
    }

    /// Orders the work enqueued from now on after every overlapped all-reduce so far (see
    /// [`Communicator::all_reduce_overlapped`]). Enqueues a wait; does not block the host.
    fn wait_overlapped(&self) -> Result<()> {
        Ok(())
    }

    /// Waits until this rank's enqueued work, collectives included, has finished, or fails
    /// once `timeout` has passed (a peer that never called, say); a failure leaves the
    /// communicator unusable.
    fn synchronize(&self, timeout: Duration) -> Result<()>;
}
