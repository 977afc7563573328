//! Recording calls into a CUDA graph and replaying it.

use crate::alloc::Block;
use crate::device::{Device, driver_error};
use crate::{CudaBackend, alloc};
use cudarc::driver::result as drv;
use hal::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A recorded CUDA graph: the instantiated executable and the memory it uses.
pub struct CudaGraph {
    /// Under `HAL_CUDA_PROFILE`: nothing was captured and a replay makes the calls anew (so
    /// that each launch is timed); `exec` and `graph` are null.
    pub(crate) eager: Option<Arc<hal::RecordedSteps<CudaBackend>>>,
    pub(crate) exec: cudarc::driver::sys::CUgraphExec,
    pub(crate) graph: cudarc::driver::sys::CUgraph,
    /// Blocks allocated during capture (kept alive with the graph).
    pub(crate) _allocated: Vec<Arc<Block>>,
    /// Blocks freed during capture, returned to the pool when the graph drops.
    pub(crate) freed: Vec<(u64, usize)>,
    pub(crate) dev: Arc<Device>,
    /// A launch in the graph can fault (index checks, IR bounds).
    pub(crate) can_fault: bool,
}

// SAFETY: the graph handles are only used under the device's stream order; launching a graph
// exec from several threads is serialised by the driver.
unsafe impl Send for CudaGraph {}

unsafe impl Sync for CudaGraph {}

impl std::fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaGraph({} blocks held)",
            self._allocated.len() + self.freed.len()
        )
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if self.eager.is_some() {
            return;
        }
        let _ = self.dev.bind();
        // SAFETY: the handles are ours; the stream orders any replay still running before the
        // freed blocks are reused.
        unsafe {
            let _ = drv::graph::exec_destroy(self.exec);
            let _ = drv::graph::destroy(self.graph);
        }
        self.dev.pool.give_back(std::mem::take(&mut self.freed));
    }
}

pub(crate) fn record(
    gpu: &CudaBackend,
    steps: Arc<hal::RecordedSteps<CudaBackend>>,
) -> Result<CudaGraph> {
    use cudarc::driver::sys;
    gpu.refuse_in_capture("record")?;
    gpu.dev.bind()?;
    if gpu.dev.profiler.is_some() {
        return Ok(CudaGraph {
            eager: Some(steps),
            exec: std::ptr::null_mut(),
            graph: std::ptr::null_mut(),
            _allocated: Vec::new(),
            freed: Vec::new(),
            dev: gpu.dev.clone(),
            can_fault: false,
        });
    }
    let pending_before = gpu.dev.fault_pending.swap(false, Ordering::AcqRel);
    // No implicit device synchronization from another backend while this captures.
    let _gate = alloc::capture_gate();
    gpu.dev.pool.begin_capture();
    gpu.dev.capturing.store(true, Ordering::Release);
    // SAFETY: the backend's stream; relaxed mode lets other threads use the driver meanwhile.
    let begun = unsafe {
        drv::stream::begin_capture(
            gpu.dev.stream,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    };
    let ran = begun
        .map_err(|e| driver_error("cuStreamBeginCapture", e))
        .and_then(|_| steps(gpu));
    // SAFETY: ends the capture begun above (also after a failed step, to leave the stream usable).
    let ended = unsafe { drv::stream::end_capture(gpu.dev.stream) };
    gpu.dev.capturing.store(false, Ordering::Release);
    let hold = gpu.dev.pool.end_capture();
    let can_fault = gpu.dev.fault_pending.swap(pending_before, Ordering::AcqRel);
    let graph = match (ran, ended) {
        (Err(e), ended) => {
            if let Ok(g) = ended {
                // SAFETY: an unused graph from the aborted capture.
                unsafe {
                    let _ = drv::graph::destroy(g);
                }
            }
            gpu.dev.pool.give_back(hold.freed);
            return Err(e);
        }
        (Ok(()), Err(e)) => {
            gpu.dev.pool.give_back(hold.freed);
            return Err(driver_error("cuStreamEndCapture", e));
        }
        (Ok(()), Ok(g)) => g,
    };
    // SAFETY: a graph captured above.
    let exec = unsafe { drv::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
        .map_err(|e| driver_error("cuGraphInstantiate", e));
    let exec = match exec {
        Ok(x) => x,
        Err(e) => {
            // SAFETY: the graph captured above, not instantiated, destroyed once.
            unsafe {
                let _ = drv::graph::destroy(graph);
            }
            gpu.dev.pool.give_back(hold.freed);
            return Err(e);
        }
    };
    // Upload now so the first replay pays no setup.
    // SAFETY: a live executable graph on the backend's stream.
    unsafe { drv::graph::upload(exec, gpu.dev.stream) }
        .map_err(|e| driver_error("cuGraphUpload", e))?;
    Ok(CudaGraph {
        eager: None,
        exec,
        graph,
        _allocated: hold.allocated,
        freed: hold.freed,
        dev: gpu.dev.clone(),
        can_fault,
    })
}

pub(crate) fn replay(gpu: &CudaBackend, graph: &CudaGraph) -> Result<()> {
    if !Arc::ptr_eq(&graph.dev, &gpu.dev) {
        return Err(Error::InvalidArgument {
            op: "replay",
            detail: "the graph was recorded on another device".into(),
        });
    }
    gpu.dev.bind()?;
    if let Some(steps) = &graph.eager {
        return steps(gpu);
    }
    if graph.can_fault {
        gpu.dev.fault_pending.store(true, Ordering::Release);
    }
    // SAFETY: a live executable graph on the backend's stream.
    unsafe { drv::graph::launch(graph.exec, gpu.dev.stream) }
        .map_err(|e| driver_error("cuGraphLaunch", e))
}
