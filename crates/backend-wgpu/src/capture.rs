//! Captured recordings: what `record` keeps of a sequence of calls, and what `replay` encodes
//! again.
//!
//! WebGPU has no device graphs (a compute pass cannot be kept and resubmitted), so the backend
//! captures one level below the calls: while a recording runs, every dispatch is kept with its
//! pipeline, its bind group and its launch parameters, and every copy and clear with its
//! buffers, instead of being encoded. A replay encodes that list again. It skips everything
//! a call does on the host before it encodes (checking views, choosing and looking up a kernel,
//! packing parameters, allocating from the pool, building bind groups: most of the ~10 us a
//! small dispatch cost), which is what bounds a training step of small kernels on wgpu.
//!
//! The contract is `hal`'s for capturing backends ([`hal::Backend::record`]): the same
//! launches with the same parameters on the same buffers, nothing run while recording, and no
//! waits, reads or queue writes inside. Every buffer a kept command touches is held by the
//! graph, so none goes back to the pool (and to another allocation) while a replay could still
//! write it.

use crate::WgpuBackend;
use crate::{WgpuBuffer, pipeline::Kernel};
use hal::{Error, Result};
use std::sync::Arc;

/// Whether recordings are captured: yes unless `HAL_WGPU_CAPTURE=0` (a knob for comparing
/// against running the steps again on each replay, as backends without capture do).
pub(crate) fn enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("HAL_WGPU_CAPTURE").as_deref() != Ok("0"))
}

/// One command of a capture, as it will be encoded on replay.
#[derive(Clone)]
pub(crate) enum Command {
    Dispatch {
        kernel: Arc<Kernel>,
        group: wgpu::BindGroup,
        /// The immediates, padded to the kernel's block (empty where it reads binding 0).
        words: Vec<u32>,
        groups: [u32; 3],
        /// The profile name it was captured under (its label and kernel file), when profiling.
        name: Option<String>,
    },
    /// A whole-buffer copy of `bytes` bytes.
    Copy {
        src: wgpu::Buffer,
        dst: wgpu::Buffer,
        bytes: u64,
    },
    /// Zeroes a whole buffer.
    Clear(wgpu::Buffer),
    /// Zeroes one word of a buffer (an index check's verdict word, so that each replay's
    /// check starts afresh: a check writes its serial only when it fails, and a replay
    /// repeats the serial).
    ClearWord { buffer: wgpu::Buffer, word: u32 },
}

/// A recording under way.
#[derive(Default)]
pub(crate) struct Capture {
    pub(crate) commands: Vec<Command>,
    pub(crate) keep: Vec<WgpuBuffer>,
    /// Whether a command may write the fault record (IR launches, index checks): a replay
    /// then has it read at the next synchronize, as the calls would have.
    pub(crate) writes_faults: bool,
}

impl Capture {
    /// Holds `buffers` for as long as the graph lives.
    pub(crate) fn keep<'a>(&mut self, buffers: impl IntoIterator<Item = &'a WgpuBuffer>) {
        self.keep.extend(buffers.into_iter().cloned());
    }
}

/// The graph of `WgpuBackend::record`: the captured commands, replayed by encoding
/// them again on the device they were captured on.
pub struct WgpuGraph {
    /// With capture turned off ([`enabled`]): the steps, run again on each replay.
    pub(crate) steps: Option<hal::Replay<crate::WgpuBackend>>,
    pub(crate) commands: Vec<Command>,
    pub(crate) keep: Vec<WgpuBuffer>,
    pub(crate) writes_faults: bool,
    /// The device's identity (its shared state's address), to refuse a replay elsewhere.
    pub(crate) device: usize,
}

impl std::fmt::Debug for WgpuGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.steps.is_some() {
            return f.write_str("WgpuGraph(steps run again on each replay)");
        }
        let dispatches = self
            .commands
            .iter()
            .filter(|c| matches!(c, Command::Dispatch { .. }))
            .count();
        write!(
            f,
            "WgpuGraph({dispatches} dispatches, {} copies and clears, {} buffers held)",
            self.commands.len() - dispatches,
            self.keep.len()
        )
    }
}

pub(crate) fn record(
    gpu: &WgpuBackend,
    steps: std::sync::Arc<hal::RecordedSteps<WgpuBackend>>,
) -> Result<WgpuGraph> {
    if !enabled() {
        return Ok(WgpuGraph {
            steps: Some(hal::Replay::new(steps)),
            commands: Vec::new(),
            keep: Vec::new(),
            writes_faults: false,
            device: Arc::as_ptr(&gpu.0) as usize,
        });
    }
    // Probed now: the first kernel that needs it would otherwise read inside the capture.
    gpu.fma_is_fused()?;
    {
        let mut batch = gpu.lock_batch();
        if batch.capture.is_some() {
            return Err(Error::InvalidArgument {
                op: "record",
                detail: "a recording inside a recording".into(),
            });
        }
        batch.capture = Some(Capture::default());
    }
    let result = steps(gpu);
    let captured = gpu.lock_batch().capture.take().unwrap_or_default();
    result?;
    Ok(WgpuGraph {
        steps: None,
        commands: captured.commands,
        keep: captured.keep,
        writes_faults: captured.writes_faults,
        device: Arc::as_ptr(&gpu.0) as usize,
    })
}

pub(crate) fn replay(gpu: &WgpuBackend, graph: &WgpuGraph) -> Result<()> {
    if graph.device != Arc::as_ptr(&gpu.0) as usize {
        return Err(Error::InvalidArgument {
            op: "replay",
            detail: "the graph was recorded on another wgpu device".into(),
        });
    }
    if let Some(steps) = &graph.steps {
        return steps.run(gpu);
    }
    if let Some(c) = gpu.lock_batch().capture.as_mut() {
        c.keep(&graph.keep);
    }
    gpu.encode_commands(&graph.commands)?;
    if graph.writes_faults {
        gpu.faults_may_be_written();
    }
    Ok(())
}
