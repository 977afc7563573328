//! Per-dispatch GPU timing, for tuning: set `HAL_WGPU_PROFILE=1` and every dispatch runs in a
//! compute pass of its own with timestamps at its start and end (wgpu's `TIMESTAMP_QUERY`).
//! The timestamps are read back at each synchronize (and whenever the query set fills up) and
//! summed per kernel file. [`crate::WgpuBackend::take_profile`] reports the totals so far and
//! clears them (what is left is written to stderr when the device is dropped), together with
//! how busy the GPU was between the first and the last timed dispatch of each read-back (the
//! rest is idle time: the host not keeping up, or barriers).
//!
//! ncu does not see Vulkan work, so this is how one finds where wgpu's time goes. A pass per
//! dispatch changes the barriers a little; the figures are for finding hot spots, not for
//! reporting speed.

use hal::profile::KernelTimes;

/// Queries in the set: two per dispatch (wgpu's largest query set).
const QUERIES: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// Whether `HAL_WGPU_PROFILE` asks for profiling.
pub(crate) fn requested() -> bool {
    hal::profile::requested("HAL_WGPU_PROFILE")
}

/// The query set, the names of the dispatches whose timestamps it holds, and the totals so
/// far.
pub(crate) struct Profiler {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period: f64,
    /// Kernel name of the dispatch at query pair `i`.
    pending: Vec<String>,
    times: KernelTimes,
    /// What the dispatches of the current call are filed under, with their kernel file (a
    /// product names its shape, as the CUDA profile does).
    label: Option<String>,
}

impl Profiler {
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        Profiler {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile"),
                ty: wgpu::QueryType::Timestamp,
                count: QUERIES,
            }),
            resolved: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("profile timestamps"),
                size: QUERIES as u64 * 8,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            period: queue.get_timestamp_period() as f64,
            pending: Vec::new(),
            times: KernelTimes::default(),
            label: None,
        }
    }

    /// Files the following dispatches under `label` (with their kernel file) until it is
    /// set again; `None` goes back to the kernel file alone.
    pub(crate) fn set_label(&mut self, label: Option<String>) {
        self.label = label;
    }

    /// Sets the label `label()` where none is set; returns whether it did.
    pub(crate) fn set_label_if_none(&mut self, label: impl FnOnce() -> String) -> bool {
        let free = self.label.is_none();
        if free {
            self.label = Some(label());
        }
        free
    }

    /// Whether another dispatch's pair of queries fits before a read-back.
    pub(crate) fn full(&self) -> bool {
        (self.pending.len() as u32 + 1) * 2 > QUERIES
    }

    /// What a dispatch of kernel file `kernel` is filed under now (with the current label).
    pub(crate) fn name_of(&self, kernel: &str) -> String {
        match &self.label {
            Some(label) => format!("{label} ({kernel})"),
            None => kernel.to_string(),
        }
    }

    /// The timestamp writes for the next dispatch, filed under `name` (see [`Self::name_of`]).
    pub(crate) fn next(&mut self, name: String) -> wgpu::ComputePassTimestampWrites<'_> {
        let i = self.pending.len() as u32;
        self.pending.push(name);
        wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        }
    }

    /// Dispatches timed since the last read-back.
    pub(crate) fn pending_dispatches(&self) -> usize {
        self.pending.len()
    }

    /// Records the resolution of the pending queries into `staging` (16 bytes a dispatch).
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder, staging: &wgpu::Buffer) {
        let n = self.pending.len() as u32;
        encoder.resolve_query_set(&self.queries, 0..2 * n, &self.resolved, 0);
        encoder.copy_buffer_to_buffer(&self.resolved, 0, staging, 0, n as u64 * 16);
    }

    /// Adds the timestamps of the first `n` pending dispatches (read back as `ticks`) to the
    /// totals and forgets them.
    pub(crate) fn add(&mut self, n: usize, ticks: &[u64]) {
        let names: Vec<String> = self.pending.drain(..n).collect();
        let (mut first, mut last) = (u64::MAX, 0u64);
        for (i, name) in names.into_iter().enumerate() {
            let (start, end) = (ticks[2 * i], ticks[2 * i + 1]);
            let ns = end.saturating_sub(start) as f64 * self.period;
            self.times.add(&name, ns);
            first = first.min(start);
            last = last.max(end);
        }
        if last > first {
            self.times.add_span((last - first) as f64 * self.period);
        }
    }

    /// Whether nothing has been timed since the totals were last cleared.
    pub(crate) fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    /// The totals divided by `runs` (see [`KernelTimes::report`]), then forgotten (the
    /// pending queries stay).
    pub(crate) fn take_report(&mut self, runs: usize) -> String {
        self.times.take_report("wgpu", runs)
    }
}
