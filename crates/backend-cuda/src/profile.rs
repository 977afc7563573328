//! Per-launch GPU timing, for tuning: set `HAL_CUDA_PROFILE=1` and every kernel launch, cuBLAS
//! product and memset is bracketed by a pair of events on the stream. The events are read at
//! each synchronize (and when many are pending) and summed per kernel name;
//! [`crate::CudaBackend::take_profile`] reports the totals so far and clears them.
//!
//! Recordings are not captured while profiling: a replay runs the recorded calls one by one,
//! so that each launch is timed. Events between launches keep kernels from overlapping
//! (programmatic dependent launch), so the figures find hot spots; they are not the speed
//! to report.

use crate::device::driver_error;
use cudarc::driver::{result, sys};
use hal::Result;
use hal::profile::KernelTimes;

/// Whether `HAL_CUDA_PROFILE` asks for profiling.
pub(crate) fn requested() -> bool {
    hal::profile::requested("HAL_CUDA_PROFILE")
}

/// Launches timed before the events are read back whatever happens (bounds the events alive).
pub(crate) const MAX_PENDING: usize = 4096;

/// The events of launches not yet read, spare events, and the totals so far.
#[derive(Default)]
pub(crate) struct Profiler {
    pending: Vec<(String, sys::CUevent, sys::CUevent)>,
    spare: Vec<sys::CUevent>,
    times: KernelTimes,
}

// SAFETY: events are plain driver handles, used under the profiler's mutex.
unsafe impl Send for Profiler {}

impl Profiler {
    /// Records a fresh event on `stream`.
    pub(crate) fn mark(&mut self, stream: sys::CUstream) -> Result<sys::CUevent> {
        let event = match self.spare.pop() {
            Some(e) => e,
            None => result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| driver_error("cuEventCreate", e))?,
        };
        // SAFETY: a live event and the backend's stream.
        unsafe { result::event::record(event, stream) }
            .map_err(|e| driver_error("cuEventRecord", e))?;
        Ok(event)
    }

    /// Files the launch of `name` between events `start` and `end`.
    pub(crate) fn file(&mut self, name: &str, start: sys::CUevent, end: sys::CUevent) {
        self.pending.push((name.to_string(), start, end));
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Adds the pending launches to the totals (the stream must have drained).
    pub(crate) fn collect(&mut self) -> Result<()> {
        let (Some(first), Some(last)) = (self.pending.first(), self.pending.last()) else {
            return Ok(());
        };
        // SAFETY: recorded events of a drained stream.
        let span = unsafe { result::event::elapsed(first.1, last.2) }
            .map_err(|e| driver_error("cuEventElapsedTime", e))?;
        self.times.add_span(span as f64 * 1e6);
        for (name, start, end) in std::mem::take(&mut self.pending) {
            // SAFETY: as above.
            let ms = unsafe { result::event::elapsed(start, end) }
                .map_err(|e| driver_error("cuEventElapsedTime", e))?;
            self.times.add(&name, ms as f64 * 1e6);
            self.spare.extend([start, end]);
        }
        Ok(())
    }

    /// The totals divided by `runs`, then cleared.
    pub(crate) fn take_report(&mut self, runs: usize) -> String {
        self.times.take_report("cuda", runs)
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        let events = self.pending.iter().flat_map(|p| [p.1, p.2]);
        for e in events.chain(self.spare.iter().copied()).collect::<Vec<_>>() {
            // SAFETY: our events, no longer used.
            unsafe {
                let _ = result::event::destroy(e);
            }
        }
    }
}
