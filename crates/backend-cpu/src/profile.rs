//! Per-call timing, for tuning: set `HAL_CPU_PROFILE=1` and every primitive call's wall time
//! (taken under the backend's execution lock, so calls never overlap) is summed per
//! primitive, IR programs by their names; [`crate::CpuBackend::take_profile`] reports the
//! totals so far and clears them. Time between calls (the caller's own work, autograd's
//! bookkeeping) is the gap between the busy time and the span.

use hal::profile::KernelTimes;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The totals, and the first start and last end since the last report.
#[derive(Default)]
struct Profile {
    times: KernelTimes,
    span: Option<(Instant, Instant)>,
}

static PROFILE: Mutex<Option<Profile>> = Mutex::new(None);

/// Whether `HAL_CPU_PROFILE` asks for profiling (read once).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| hal::profile::requested("HAL_CPU_PROFILE"))
}

/// Files one call of `what` that started at `start` and ends now.
pub(crate) fn add(what: &str, start: Instant) {
    let end = Instant::now();
    let mut p = PROFILE.lock().unwrap_or_else(|e| e.into_inner());
    let p = p.get_or_insert_with(Profile::default);
    p.times.add(what, (end - start).as_secs_f64() * 1e9);
    p.span = Some((p.span.map_or(start, |s| s.0), end));
}

/// The totals divided by `runs`, then cleared; `None` when not profiling.
pub(crate) fn take_report(runs: usize) -> Option<String> {
    if !enabled() {
        return None;
    }
    let mut p = PROFILE.lock().unwrap_or_else(|e| e.into_inner());
    let p = p.get_or_insert_with(Profile::default);
    if let Some((first, last)) = p.span.take() {
        p.times.add_span((last - first).as_secs_f64() * 1e9);
    }
    Some(p.times.take_report("cpu", runs))
}
