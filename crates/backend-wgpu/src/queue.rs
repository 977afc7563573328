//! Command batching: encoding dispatches and copies, submitting, waiting.

use crate::buffer::WgpuBuffer;
use crate::knob::knob;
use crate::pipeline::Prepared;
use crate::{WgpuBackend, capture, lock, profile};
use hal::{DeviceBuffer, Error, Result};

/// How long `synchronize` polls before it blocks.
#[cfg(not(target_arch = "wasm32"))]
const SPIN_BEFORE_SLEEP: std::time::Duration = std::time::Duration::from_micros(500);

/// Commands go to the queue in batches of at most this many by default: a submission costs
/// tens of microseconds on the host (fences, tracking), several times a dispatch's encoding,
/// so a chain of small launches submitted one by one was bound by it.
pub(crate) const BATCH_COMMANDS: usize = 32;

/// The batch size in use: [`BATCH_COMMANDS`], or `HAL_WGPU_BATCH` (a tuning knob, at least 1).
pub(crate) fn batch_commands() -> usize {
    static BATCH: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    knob(&BATCH, "HAL_WGPU_BATCH", BATCH_COMMANDS)
}

/// After a wait for the device, the first batch goes to the queue once it holds this many
/// commands, and each next batch may hold twice as many as the last, up to
/// [`batch_commands`]: an idle GPU then starts on the first commands while the host encodes
/// the rest, instead of waiting for a whole batch (a recorded MLP training step is 19
/// dispatches). Chosen against 2 and 32 (no ramp) with `HAL_WGPU_FIRST_BATCH`: 8 gave the
/// fastest recorded MLP step, and 2 slowed single short calls that are waited for
/// (docs/PERF.md, tuning evidence).
pub(crate) const FIRST_BATCH: usize = 8;

/// [`FIRST_BATCH`], or `HAL_WGPU_FIRST_BATCH` (a tuning knob, at least 1).
pub(crate) fn first_batch() -> usize {
    static FIRST: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    knob(&FIRST, "HAL_WGPU_FIRST_BATCH", FIRST_BATCH)
}

/// The command encoder that dispatches and copies are appended to, submitted when it holds
/// its limit of commands (see [`FIRST_BATCH`]) and before anything that must see their
/// effects or must not be overtaken by them: a wait, a read, a queue write (`write_buffer`
/// lands before the next submission's commands, so the batch goes first), a dispatch reading
/// the shared parameter buffer. Work therefore still runs in the order it was asked for.
/// Consecutive dispatches share one compute pass (WebGPU orders and synchronises the
/// dispatches of a pass); a copy or clear closes it.
#[derive(Default)]
pub(crate) struct Batch {
    /// Declared first, so dropped before the encoder it records into.
    pub(crate) pass: Option<wgpu::ComputePass<'static>>,
    pub(crate) encoder: Option<wgpu::CommandEncoder>,
    pub(crate) commands: usize,
    /// The size at which this batch is submitted; 0 after a wait (then [`first_batch`]).
    pub(crate) limit: usize,
    /// A recording under way ([`capture`]): dispatches, copies and clears go here instead.
    pub(crate) capture: Option<capture::Capture>,
}

impl Batch {
    /// The size at which this batch is submitted.
    pub(crate) fn due_at(&self) -> usize {
        match self.limit {
            0 => first_batch(),
            n => n,
        }
        .min(batch_commands())
    }

    /// Whether the batch is due for submission.
    pub(crate) fn full(&self) -> bool {
        self.commands >= self.due_at()
    }

    /// After a submission: the next batch may be twice as large.
    pub(crate) fn grow(&mut self) {
        self.limit = (2 * self.due_at()).min(batch_commands());
    }

    /// The open encoder (a new one if there is none). Its compute pass, if open, must have
    /// been closed before the encoder records anything else.
    pub(crate) fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.encoder
            .get_or_insert_with(|| device.create_command_encoder(&Default::default()))
    }

    /// The open compute pass (opened on the encoder if there is none).
    pub(crate) fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder(device)
                .begin_compute_pass(&Default::default())
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("opened above")
    }
}

pub(crate) fn synchronize(gpu: &WgpuBackend) -> Result<()> {
    gpu.refuse_in_capture("synchronize")?;
    gpu.flush();
    wait_for_queue(gpu)?;
    // The device is idle: the next commands go out in a small batch.
    gpu.lock_batch().limit = 0;
    gpu.read_profile()?;
    gpu.check_deferred()
}

/// Waits until the device has run everything submitted.
#[cfg(not(target_arch = "wasm32"))]
fn wait_for_queue(gpu: &WgpuBackend) -> Result<()> {
    // Short work is awaited by polling without blocking for a while: a blocking wait sleeps
    // in the driver and wakes up tens of microseconds after the GPU is done.
    let start = std::time::Instant::now();
    loop {
        let status = gpu
            .0
            .device
            .poll(wgpu::PollType::Poll)
            .map_err(crate::backend_error)?;
        if status.is_queue_empty() {
            break;
        }
        if start.elapsed() > SPIN_BEFORE_SLEEP {
            gpu.0
                .device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(crate::backend_error)?;
            break;
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// A browser runs the queue on its own and cannot be waited for from a synchronous call;
/// what is submitted later is ordered after the work anyway, and reads (asynchronous there)
/// see its results.
#[cfg(target_arch = "wasm32")]
fn wait_for_queue(_gpu: &WgpuBackend) -> Result<()> {
    Ok(())
}

impl WgpuBackend {
    /// Copies all of `src` into `dst` (same dtype and length) with the device's own buffer
    /// copy: no kernel, no view arithmetic. The bench uses it as the device's copy bandwidth.
    pub fn copy_whole_buffer(&self, src: &WgpuBuffer, dst: &WgpuBuffer) -> Result<()> {
        if src.dtype() != dst.dtype() || src.len() != dst.len() {
            return Err(Error::InvalidArgument {
                op: "copy_whole_buffer",
                detail: format!("{src:?} and {dst:?} differ"),
            });
        }
        let copy = capture::Command::Copy {
            src: src.0.buffer.clone(),
            dst: dst.0.buffer.clone(),
            bytes: src.0.buffer.size(),
        };
        self.transfer(&mut self.lock_batch(), copy, &[src, dst]);
        Ok(())
    }

    pub(crate) fn lock_batch(&self) -> std::sync::MutexGuard<'_, Batch> {
        lock(&self.0.batch)
    }

    /// Submits the batch's commands, if any.
    pub(crate) fn submit_batch(&self, batch: &mut Batch) {
        batch.pass = None;
        if let Some(encoder) = batch.encoder.take() {
            batch.commands = 0;
            batch.grow();
            self.0.queue.submit([encoder.finish()]);
        }
    }

    /// Submits every command encoded so far.
    pub(crate) fn flush(&self) {
        self.submit_batch(&mut self.lock_batch());
    }

    /// Writes `bytes` into `buffer` through the queue, after every command encoded so far.
    /// (Also inside a recording, where it happens once, when recording: the poison of
    /// `poison_for_write`, whose buffer nothing else uses yet.)
    pub(crate) fn write_after_batch(&self, buffer: &wgpu::Buffer, bytes: &[u8]) {
        let mut batch = self.lock_batch();
        self.submit_batch(&mut batch);
        self.0.queue.write_buffer(buffer, 0, bytes);
    }

    /// Whether a recording is under way (see [`capture`]). Takes the batch's lock: never call
    /// it holding that.
    pub(crate) fn capturing(&self) -> bool {
        self.lock_batch().capture.is_some()
    }

    /// `hal`'s contract for capturing backends: no waits, reads or queue writes inside a
    /// recording (they would happen once, when recording, rather than at each replay).
    pub(crate) fn refuse_in_capture(&self, op: &'static str) -> Result<()> {
        if self.capturing() {
            return Err(Error::inside_recording(op));
        }
        Ok(())
    }

    /// Appends a copy or clear (not a dispatch) to the batch, or to the capture under way,
    /// which then holds `buffers`.
    pub(crate) fn transfer(
        &self,
        batch: &mut Batch,
        command: capture::Command,
        buffers: &[&WgpuBuffer],
    ) {
        if let Some(c) = batch.capture.as_mut() {
            c.keep(buffers.iter().copied());
        }
        self.encode_command(batch, None, &command);
    }

    /// Appends one command to the batch (see [`Batch`]), or inside a recording to the capture
    /// (a dispatch filed under the profile name it would have now; the caller has the capture
    /// hold its buffers).
    pub(crate) fn encode_command(
        &self,
        batch: &mut Batch,
        profiler: Option<&mut profile::Profiler>,
        command: &capture::Command,
    ) {
        if let Some(c) = batch.capture.as_mut() {
            let mut kept = command.clone();
            if let capture::Command::Dispatch { kernel, name, .. } = &mut kept
                && name.is_none()
            {
                *name = profiler.map(|p| p.name_of(&kernel.name));
            }
            c.commands.push(kept);
            return;
        }
        match command {
            capture::Command::Dispatch {
                kernel,
                group,
                words,
                groups,
                name,
            } => self.encode_dispatch(
                batch,
                profiler,
                (kernel, name.as_deref()),
                group,
                words,
                *groups,
            ),
            capture::Command::Copy { src, dst, bytes } => {
                self.encode_locked(batch, |e| e.copy_buffer_to_buffer(src, 0, dst, 0, *bytes))
            }
            capture::Command::Clear(b) => self.encode_locked(batch, |e| e.clear_buffer(b, 0, None)),
            capture::Command::ClearWord { buffer, word } => {
                self.encode_locked(batch, |e| e.clear_buffer(buffer, *word as u64 * 4, Some(4)))
            }
        }
    }

    /// Encodes `commands` in order (one lock of the batch for all of them unless profiling,
    /// whose read-backs need it in between).
    pub(crate) fn encode_commands<'a>(
        &self,
        commands: impl IntoIterator<Item = &'a capture::Command>,
    ) -> Result<()> {
        if self.0.profiler.is_none() {
            let mut batch = self.lock_batch();
            for command in commands {
                self.encode_command(&mut batch, None, command);
            }
            return Ok(());
        }
        for command in commands {
            self.make_room_in_profile()?;
            let mut profiler = self.0.profiler.as_ref().map(lock);
            let mut batch = self.lock_batch();
            self.encode_command(&mut batch, profiler.as_deref_mut(), command);
        }
        Ok(())
    }

    pub(crate) fn encode_locked(
        &self,
        batch: &mut Batch,
        command: impl FnOnce(&mut wgpu::CommandEncoder),
    ) {
        batch.pass = None;
        command(batch.encoder(&self.0.device));
        batch.commands += 1;
        if batch.full() {
            self.submit_batch(batch);
        }
    }

    /// Encodes `sequence` `times` times over, in order.
    pub(crate) fn encode_repeated(&self, sequence: &[Prepared], times: usize) -> Result<()> {
        if let Some(c) = self.lock_batch().capture.as_mut() {
            c.keep(sequence.iter().flat_map(|p| &p.buffers));
        }
        self.encode_commands((0..times).flat_map(|_| sequence.iter().map(|p| &p.dispatch)))
    }
}
