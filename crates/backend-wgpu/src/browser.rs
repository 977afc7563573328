//! Reading back without blocking, for WebGPU in a browser (wasm32).
//!
//! A page's main thread cannot wait for the GPU: the browser maps a buffer for reading only
//! once control has returned to its event loop. So on wasm32 [`hal::Backend::read_bytes`]
//! is refused with a message naming [`hal::Backend::read_bytes_async`], which this module
//! implements: the copy is encoded and submitted as natively, and the mapping awaited as a
//! future the page's executor (`wasm-bindgen-futures`) drives. Natively reads block as they
//! always did and this module is not built.
//!
//! Index faults (see `fault.rs`) travel with the read: when a launch may have written the
//! fault record since the last check, the record is copied into the same staging buffer
//! ahead of the data, so a bad index is reported by the read that follows it, as natively.

use crate::buffer::WgpuBuffer;
use crate::{WgpuBackend, backend_error, lock};
use hal::fault::fault_error;
use hal::{DeviceBuffer, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// Bytes of the fault record (four words).
const FAULT_BYTES: u64 = 16;

/// The browser's read of `src`: the device's deferred error, then a fault an earlier launch
/// recorded, then the bytes.
pub(crate) async fn read_bytes_async(gpu: &WgpuBackend, src: &WgpuBuffer) -> Result<Vec<u8>> {
    gpu.refuse_in_capture("read_bytes_async")?;
    gpu.take_deferred()?;
    let faults = gpu
        .0
        .faults_unread
        .swap(false, std::sync::atomic::Ordering::AcqRel);
    let head = if faults { FAULT_BYTES } else { 0 };
    let size = src.0.buffer.size();
    let fault_record = &gpu.0.faults.0.buffer;
    let staging = gpu.stage_read(head + size, |e, staging| {
        if faults {
            e.copy_buffer_to_buffer(fault_record, 0, staging, 0, FAULT_BYTES);
        }
        e.copy_buffer_to_buffer(&src.0.buffer, 0, staging, head, size);
    });
    // The device is idle once the read is back: the next commands go out in a small batch.
    gpu.lock_batch().limit = 0;
    let slice = staging.slice(..);
    MapRead::new(slice).await.map_err(backend_error)?;
    let mapped = slice.get_mapped_range().map_err(backend_error)?.to_vec();
    staging.unmap();
    if faults {
        let w: Vec<u32> = bytemuck::pod_collect_to_vec(&mapped[..FAULT_BYTES as usize]);
        if w[0] != 0 {
            gpu.write_after_batch(&gpu.0.faults.0.buffer, &[0u8; 16]);
            return Err(
                fault_error("wgpu", [w[0], w[1], w[2], w[3]]).expect("the record is claimed")
            );
        }
    }
    gpu.take_deferred()?;
    let mut bytes = mapped[head as usize..].to_vec();
    bytes.truncate(src.len() * src.dtype().size_in_bytes());
    Ok(bytes)
}

/// What the map callback and the future share.
#[derive(Default)]
struct Shared {
    done: Option<std::result::Result<(), wgpu::BufferAsyncError>>,
    waker: Option<Waker>,
}

/// A `map_async(MapMode::Read)` of a whole slice, as a future.
struct MapRead(Arc<Mutex<Shared>>);

impl MapRead {
    fn new(slice: wgpu::BufferSlice<'_>) -> Self {
        let shared: Arc<Mutex<Shared>> = Arc::default();
        let sink = shared.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let mut s = lock(&sink);
            s.done = Some(r);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
        Self(shared)
    }
}

impl Future for MapRead {
    type Output = std::result::Result<(), wgpu::BufferAsyncError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = lock(&self.0);
        match s.done.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
