//! Per-kernel time totals, kept by the backends' tuning profilers (`HAL_WGPU_PROFILE`,
//! `HAL_CUDA_PROFILE`: GPU time per kernel; `HAL_CPU_PROFILE`: wall time per call) and printed
//! by `bench`. Not part of any
//! primitive's contract: a tool for finding where a device's time goes.

use std::collections::HashMap;

/// Whether the environment variable `var` asks for profiling (set, not empty, not `0`).
pub fn requested(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| !v.is_empty() && v != "0")
}

#[derive(Default, Clone, Copy)]
struct Total {
    launches: u64,
    ns: f64,
}

/// GPU time summed per kernel name, and the spans the timed launches covered.
#[derive(Default)]
pub struct KernelTimes {
    totals: HashMap<String, Total>,
    /// Sum over read-backs of the span from the first timed start to the last timed end.
    span_ns: f64,
}

impl KernelTimes {
    /// Adds one launch of `name` that ran for `ns` nanoseconds.
    pub fn add(&mut self, name: &str, ns: f64) {
        let t = match self.totals.get_mut(name) {
            Some(t) => t,
            None => self.totals.entry(name.to_string()).or_default(),
        };
        t.launches += 1;
        t.ns += ns;
    }

    /// Adds the span (first start to last end) of one batch of timed launches.
    pub fn add_span(&mut self, ns: f64) {
        self.span_ns += ns;
    }

    /// Whether nothing has been timed since the totals were last cleared.
    pub fn is_empty(&self) -> bool {
        self.totals.is_empty()
    }

    pub fn clear(&mut self) {
        self.totals.clear();
        self.span_ns = 0.0;
    }

    /// [`KernelTimes::report`], then [`KernelTimes::clear`].
    pub fn take_report(&mut self, backend: &str, runs: usize) -> String {
        let report = self.report(backend, runs);
        self.clear();
        report
    }

    /// The totals divided by `runs` (the runs of some work they cover), heaviest first, as
    /// lines of text headed by `backend`. The busy time against the span shows how much of
    /// the span the device sat idle (the host not keeping up, or barriers; on the CPU, the
    /// caller's own work between calls).
    pub fn report(&self, backend: &str, runs: usize) -> String {
        let per = runs.max(1) as f64;
        let mut rows: Vec<(&String, &Total)> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1.ns.total_cmp(&a.1.ns));
        let busy_ns: f64 = rows.iter().map(|(_, t)| t.ns).sum();
        let mut out = format!(
            "{backend} profile, per run of {runs}: busy {:.3} ms in a {:.3} ms span (from the first timed start to the last timed end of each read-back)\n{:>10} {:>10} {:>10}  kernel\n",
            busy_ns / 1e6 / per,
            self.span_ns / 1e6 / per,
            "ms",
            "launches",
            "us each"
        );
        for (name, t) in rows {
            out.push_str(&format!(
                "{:>10.3} {:>10.1} {:>10.2}  {name}\n",
                t.ns / 1e6 / per,
                t.launches as f64 / per,
                t.ns / 1e3 / t.launches.max(1) as f64
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_sorts_by_time_and_divides_by_runs() {
        let mut k = KernelTimes::default();
        k.add("small", 1_000.0);
        k.add("big", 3_000_000.0);
        k.add("big", 1_000_000.0);
        k.add_span(8_000_000.0);
        let r = k.report("test", 2);
        assert!(r.contains("busy 2.001 ms in a 4.000 ms span"), "{r}");
        let big = r.find("big").unwrap();
        assert!(big < r.find("small").unwrap(), "{r}");
        // 2 ms per run, one launch per run, 2000 us each.
        assert!(r.contains("     2.000        1.0    2000.00  big"), "{r}");
        k.clear();
        assert!(k.is_empty());
    }
}
