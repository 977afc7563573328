//! Index checks on the device and the errors a later synchronize reports.

use crate::buffer::WgpuBuffer;
use crate::pipeline::{Params, Spec};
use crate::{V, WgpuBackend, backend_error, capture, lock};
use hal::Result;
use hal::fault::{fault_code, fault_error, index_fault};

/// The `guard` slot of a kernel file: the verdict words at binding `b`, and `skipped()`, true
/// when the check whose word and serial sit in scalar slots `[word, serial]` failed, or, with
/// `unless_failed`, when it passed (the f32 fallback of a range-checked product).
pub(crate) fn guard_slot(b: usize, [word, serial]: [u32; 2], unless_failed: bool) -> String {
    let test = if unless_failed { "!=" } else { "==" };
    format!(
        "@group(0) @binding({b}) var<storage, read> B{b}: array<u32>;\nfn skipped() -> bool {{ return B{b}[s({word}u)] {test} s({serial}u); }}"
    )
}

/// Verdict words of index checks, reused round robin. A word is reused only by a check
/// submitted after the kernel that read it, and the queue runs work in order.
pub(crate) const VERDICT_WORDS: u32 = 1024;

/// Where a kernel guarded by an index check finds the check's verdict.
#[derive(Clone, Copy)]
pub(crate) struct Guard {
    pub(crate) word: u32,
    pub(crate) serial: u32,
}

impl WgpuBackend {
    /// Notes that the fault record may be written by what was just encoded or captured, so
    /// the next synchronize or read checks it.
    pub(crate) fn faults_may_be_written(&self) {
        self.0
            .faults_unread
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(c) = self.lock_batch().capture.as_mut() {
            c.writes_faults = true;
        }
    }

    /// The first error the device reported on its own (validation, lost device), once.
    pub(crate) fn take_deferred(&self) -> Result<()> {
        match lock(&self.0.deferred).take() {
            Some(e) => Err(backend_error(e)),
            None => Ok(()),
        }
    }

    /// [`Self::take_deferred`], then the fault record where a launch may have written it. In
    /// a browser the record cannot be read synchronously: the next read checks it
    /// (`browser.rs`).
    pub(crate) fn check_deferred(&self) -> Result<()> {
        self.take_deferred()?;
        if cfg!(target_arch = "wasm32") {
            return Ok(());
        }
        // One read of the shared fault record, and only when an IR launch may have written it.
        if self
            .0
            .faults_unread
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            let w: Vec<u32> =
                bytemuck::pod_collect_to_vec(&self.read_words(&self.0.faults.0.buffer)?);
            if w[0] != 0 {
                self.write_after_batch(&self.0.faults.0.buffer, &[0u8; 16]);
                return Err(
                    fault_error("wgpu", [w[0], w[1], w[2], w[3]]).expect("the record is claimed")
                );
            }
        }
        Ok(())
    }

    /// A fresh verdict word and serial for an index check.
    pub(crate) fn next_guard(&self) -> Guard {
        use std::sync::atomic::Ordering::Relaxed;
        let mut serial = self.0.check_serial.fetch_add(1, Relaxed);
        if serial == 0 {
            // 0 is what unused verdict words hold: never a serial.
            serial = self.0.check_serial.fetch_add(1, Relaxed);
        }
        let word = serial % VERDICT_WORDS;
        if self.capturing() {
            // Each replay repeats the serial: its check must not find the verdict of the
            // replay before.
            let clear = capture::Command::ClearWord {
                buffer: self.0.verdicts.0.buffer.clone(),
                word,
            };
            self.transfer(&mut self.lock_batch(), clear, &[]);
        }
        Guard { word, serial }
    }

    /// Checks on the device that every index of `index` lies in `0..bound`, without waiting:
    /// a bad one is reported by the next synchronize or read (as [`Error::IndexOutOfRange`]
    /// naming `op`), and the kernel run with the returned guard writes nothing.
    pub(crate) fn check_indices(
        &self,
        op: &'static str,
        index: V<'_>,
        bound: usize,
    ) -> Result<Guard> {
        let p = Params::default()
            .block(index.layout)
            .scalar(0, bound.min(u32::MAX as usize) as u32)
            .scalar(1, fault_code(op, index_fault(index.dtype())));
        self.run_check(
            Spec::new("check_index.wgsl"),
            p,
            &[index.buffer],
            index.layout.numel(),
        )
    }

    /// Runs a check kernel (`check_*.wgsl`) over `inputs`, with the verdict words and the
    /// fault record bound after them and its verdict word and serial in scalars 14 and 15 (the
    /// slots the guarded kernel reads them from).
    pub(crate) fn run_check(
        &self,
        spec: Spec,
        params: Params,
        inputs: &[&WgpuBuffer],
        threads: usize,
    ) -> Result<Guard> {
        let guard = self.next_guard();
        let params = params.scalar(14, guard.word).scalar(15, guard.serial);
        let mut buffers: Vec<(&WgpuBuffer, bool)> = inputs.iter().map(|&b| (b, false)).collect();
        buffers.push((&self.0.verdicts, true));
        buffers.push((&self.0.faults, true));
        self.run(spec, params, &buffers, threads)?;
        self.faults_may_be_written();
        Ok(guard)
    }

    /// [`Self::run`] for a kernel with a `guard` slot: with a guard, it reads the verdict of
    /// that index check (bound after `buffers`, scalars 14 and 15) and writes nothing when the
    /// check failed.
    pub(crate) fn run_guarded(
        &self,
        spec: Spec,
        params: Params,
        buffers: &[(&WgpuBuffer, bool)],
        threads: usize,
        guard: Option<Guard>,
    ) -> Result<()> {
        let Some(g) = guard else {
            return self.run(spec, params, buffers, threads);
        };
        let (spec, params, buffers) = self.guarded(spec, params, buffers, g);
        self.run(spec, params, &buffers, threads)
    }

    /// A launch of a kernel with a `guard` slot made to read `guard`'s verdict: the slot
    /// filled (the verdict words bound after `buffers`), the serial in scalars 14 and 15.
    pub(crate) fn guarded<'a>(
        &'a self,
        spec: Spec,
        params: Params,
        buffers: &[(&'a WgpuBuffer, bool)],
        guard: Guard,
    ) -> (Spec, Params, Vec<(&'a WgpuBuffer, bool)>) {
        let spec = spec.slot("guard", guard_slot(buffers.len() + 1, [14, 15], false));
        let params = params.scalar(14, guard.word).scalar(15, guard.serial);
        let mut with_verdicts = buffers.to_vec();
        with_verdicts.push((&self.0.verdicts, false));
        (spec, params, with_verdicts)
    }
}
