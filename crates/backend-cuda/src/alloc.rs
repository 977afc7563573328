//! The caching allocator: device memory is taken from the driver once and reused.
//!
//! A freed block goes back to a free list of its size class instead of to the driver, so a
//! steady-state loop calls `cuMemAlloc` never and device memory in use stays flat. Reuse is
//! safe without events because every kernel runs on the backend's one stream: work that used a
//! block is ordered before work that reuses it. When the driver runs out of memory, the cached
//! blocks are returned to it (after the stream drains) and the allocation is retried once.
//!
//! While a graph is being captured, blocks freed by the captured work are held by the graph
//! instead of the free list, and blocks allocated during capture are shared with the graph: a
//! replay may touch them, so none returns to the pool before the graph is dropped.

use cudarc::driver::{result, sys};
use hal::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Process-wide: CUDA invalidates a stream capture under way when any thread of the process
/// makes a call that synchronizes the device implicitly (`cuMemFree`, `cuModuleUnload`, ...):
/// one backend dropped while another records fails that recording ("operation failed due to
/// a previous error during capture"; seen when tests ran side by side). A capture holds this
/// for reading ([`capture_gate`]); those calls take it for writing ([`sync_gate`]), so they
/// wait for every capture to end.
static IMPLICIT_SYNC_GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// Captures under way on this thread (each holding the gate for reading).
    static CAPTURES_HERE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Held while a capture runs: [`IMPLICIT_SYNC_GATE`] for reading (once per thread: a second
/// read lock could wait behind a waiting writer and never return).
pub(crate) struct CaptureGate {
    _read: Option<RwLockReadGuard<'static, ()>>,
}

pub(crate) fn capture_gate() -> CaptureGate {
    let first = CAPTURES_HERE.with(|c| c.replace(c.get() + 1)) == 0;
    CaptureGate {
        _read: first.then(|| IMPLICIT_SYNC_GATE.read().unwrap_or_else(|e| e.into_inner())),
    }
}

impl Drop for CaptureGate {
    fn drop(&mut self) {
        CAPTURES_HERE.with(|c| c.set(c.get() - 1));
    }
}

/// Held around a call that synchronizes the device implicitly: waits for other threads'
/// captures to end. `None` on a thread that is itself capturing (waiting would never end;
/// the call spoils that capture, whose end then reports it).
pub(crate) fn sync_gate(wait: bool) -> Option<RwLockWriteGuard<'static, ()>> {
    if CAPTURES_HERE.with(|c| c.get()) > 0 {
        return None;
    }
    match wait {
        true => Some(
            IMPLICIT_SYNC_GATE
                .write()
                .unwrap_or_else(|e| e.into_inner()),
        ),
        false => IMPLICIT_SYNC_GATE.try_write().ok(),
    }
}

/// Rounds a request to its size class: 512 bytes below 1 MiB, 2 MiB above, so blocks of
/// nearby sizes are interchangeable and fragmentation stays bounded.
fn size_class(bytes: usize) -> usize {
    const SMALL: usize = 512;
    const LARGE: usize = 2 << 20;
    if bytes <= 1 << 20 {
        bytes.div_ceil(SMALL) * SMALL
    } else {
        bytes.div_ceil(LARGE) * LARGE
    }
}

#[derive(Default)]
struct PoolState {
    free: HashMap<usize, Vec<sys::CUdeviceptr>>,
    /// Bytes taken from the driver (in use or cached).
    reserved: usize,
    /// Bytes in live blocks.
    in_use: usize,
    /// Calls to `cuMemAlloc` so far (a steady-state loop adds none).
    driver_allocs: u64,
    capture: Option<CaptureHold>,
}

/// What a capture in progress keeps from the pool.
#[derive(Default)]
pub(crate) struct CaptureHold {
    /// Blocks freed during capture: (pointer, class bytes).
    pub freed: Vec<(sys::CUdeviceptr, usize)>,
    /// Blocks allocated during capture.
    pub allocated: Vec<Arc<Block>>,
}

pub(crate) struct Pool {
    state: Mutex<PoolState>,
    /// Drains the stream before cached blocks go back to the driver.
    stream: sys::CUstream,
}

// SAFETY: the stream handle is only passed to the driver, which is thread-safe.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

/// Memory figures the bench prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    pub reserved_bytes: usize,
    pub in_use_bytes: usize,
    pub driver_allocs: u64,
}

/// A block of device memory; back to the pool when the last handle drops.
pub(crate) struct Block {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.pool.release(self.ptr, self.bytes);
        }
    }
}

fn lock(m: &Mutex<PoolState>) -> std::sync::MutexGuard<'_, PoolState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    pub fn new(stream: sys::CUstream) -> Arc<Pool> {
        Arc::new(Pool {
            state: Mutex::new(PoolState::default()),
            stream,
        })
    }

    /// A block of at least `bytes` (contents undefined).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<Arc<Block>> {
        if bytes == 0 {
            return Ok(Arc::new(Block {
                ptr: 0,
                bytes: 0,
                pool: self.clone(),
            }));
        }
        let class = size_class(bytes);
        let mut st = lock(&self.state);
        let ptr = match st.free.get_mut(&class).and_then(Vec::pop) {
            Some(p) => p,
            None => {
                // SAFETY: a plain allocation; the context is current (the caller bound it).
                let fresh = match unsafe { result::malloc_sync(class) } {
                    Ok(p) => p,
                    Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                        self.trim(&mut st);
                        // SAFETY: as above, after the pool gave its idle blocks back.
                        unsafe { result::malloc_sync(class) }.map_err(|_| Error::OutOfMemory {
                            requested_bytes: bytes as u128,
                        })?
                    }
                    Err(e) => return Err(crate::device::driver_error("cuMemAlloc", e)),
                };
                st.reserved += class;
                st.driver_allocs += 1;
                fresh
            }
        };
        st.in_use += class;
        let block = Arc::new(Block {
            ptr,
            bytes: class,
            pool: self.clone(),
        });
        if let Some(hold) = st.capture.as_mut() {
            hold.allocated.push(block.clone());
        }
        Ok(block)
    }

    fn release(&self, ptr: sys::CUdeviceptr, bytes: usize) {
        let mut st = lock(&self.state);
        st.in_use -= bytes;
        if let Some(hold) = st.capture.as_mut() {
            hold.freed.push((ptr, bytes));
            return;
        }
        st.free.entry(bytes).or_default().push(ptr);
    }

    /// Returns blocks a dropped graph held.
    pub fn give_back(&self, freed: Vec<(sys::CUdeviceptr, usize)>) {
        let mut st = lock(&self.state);
        for (ptr, bytes) in freed {
            st.free.entry(bytes).or_default().push(ptr);
        }
    }

    /// Returns every cached block to the driver, once queued work that may use them is done.
    fn trim(&self, st: &mut PoolState) {
        // Not while a capture is under way (here, when an allocation inside a recording runs
        // out, or on another thread): the cache stays and the allocation fails.
        let Some(_gate) = sync_gate(false) else {
            return;
        };
        // SAFETY: the stream belongs to the backend and outlives the pool's use of it.
        let _ = unsafe { result::stream::synchronize(self.stream) };
        for (bytes, ptrs) in st.free.drain() {
            for p in ptrs {
                // SAFETY: the block came from cuMemAlloc and nothing references it.
                let _ = unsafe { result::free_sync(p) };
                st.reserved -= bytes;
            }
        }
    }

    pub fn begin_capture(&self) {
        lock(&self.state).capture = Some(CaptureHold::default());
    }

    pub fn end_capture(&self) -> CaptureHold {
        lock(&self.state).capture.take().unwrap_or_default()
    }

    pub fn stats(&self) -> PoolStats {
        let st = lock(&self.state);
        PoolStats {
            reserved_bytes: st.reserved,
            in_use_bytes: st.in_use,
            driver_allocs: st.driver_allocs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{capture_gate, size_class, sync_gate};

    #[test]
    fn implicit_syncs_wait_for_other_threads_captures_only() {
        let outer = capture_gate();
        // This thread's own calls never wait on its captures (nested ones included).
        let inner = capture_gate();
        assert!(sync_gate(true).is_none());
        drop(inner);
        let elsewhere = || {
            std::thread::spawn(|| sync_gate(false).is_some())
                .join()
                .unwrap()
        };
        assert!(!elsewhere(), "another thread got past a capture under way");
        drop(outer);
        assert!(elsewhere(), "the gate stayed shut after the capture ended");
        assert!(sync_gate(true).is_some());
    }

    #[test]
    fn size_classes_round_up() {
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), 2 << 20);
        assert_eq!(size_class(5 << 20), 6 << 20);
    }
}
