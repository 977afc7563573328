//! Buffers: the pool they come from and go back to, uploads and read-backs.

use crate::{WgpuBackend, backend_error, capture, lock};
use hal::{Backend, DType, DeviceBuffer, Error, Result, validate};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A wgpu buffer: storage memory, rounded up to whole 4-byte words.
#[derive(Clone)]
pub struct WgpuBuffer(pub(crate) Arc<BufferInner>);

pub(crate) struct BufferInner {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    /// Where the buffer goes when the last handle drops.
    pub(crate) pool: Arc<Mutex<Pool>>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        lock(&self.pool).put(self.buffer.clone());
    }
}

/// Freed buffers by size, reused by later allocations of the same size class, so a loop that
/// allocates and drops the same shapes each iteration creates no device buffers after the
/// first. Reuse is safe without waiting: the queue runs work in submission order, so work
/// submitted with the old owner finishes before any work of the new one starts.
#[derive(Default)]
pub(crate) struct Pool {
    /// Per size class, the free buffers with the order they were freed in.
    pub(crate) free: HashMap<u64, Vec<(u64, wgpu::Buffer)>>,
    pub(crate) bytes: u64,
    /// Buffers freed so far (the next one's place in that order).
    pub(crate) freed: u64,
}

/// The most bytes of freed buffers the pool keeps; beyond it, the buffers freed longest ago
/// are released. (Keeping the first ones instead left a later loop whose working set did not
/// fit beside them creating and clearing its large buffers every iteration: a wgpu
/// nearest-centroid iteration at 100,000 x 768 took 7.6-8.7 ms instead of 2.7 ms after a
/// seeding that left other buffers in the pool.)
pub(crate) const POOL_MAX_BYTES: u64 = 1 << 30;

impl Pool {
    /// The size class of an allocation: four classes per power of two (at most 25% spare).
    pub(crate) fn class(bytes: u64, limit: u64) -> u64 {
        let bytes = bytes.max(16);
        let top = bytes.next_power_of_two();
        let step = (top / 8).max(4);
        let class = bytes.div_ceil(step) * step;
        if class > limit {
            bytes.div_ceil(4) * 4
        } else {
            class
        }
    }
    pub(crate) fn take(&mut self, size: u64) -> Option<wgpu::Buffer> {
        let (_, b) = self.free.get_mut(&size)?.pop()?;
        self.bytes -= size;
        Some(b)
    }
    pub(crate) fn put(&mut self, b: wgpu::Buffer) {
        let size = b.size();
        if size > POOL_MAX_BYTES {
            return;
        }
        while self.bytes + size > POOL_MAX_BYTES {
            // Each class's list is in the order freed, so its first is its oldest.
            let Some(oldest) = self
                .free
                .iter()
                .filter_map(|(&class, list)| list.first().map(|&(at, _)| (at, class)))
                .min()
                .map(|(_, class)| class)
            else {
                break;
            };
            let list = self.free.get_mut(&oldest).expect("found above");
            list.remove(0);
            if list.is_empty() {
                self.free.remove(&oldest);
            }
            self.bytes -= oldest;
        }
        self.bytes += size;
        self.freed += 1;
        self.free.entry(size).or_default().push((self.freed, b));
    }
}

impl std::fmt::Debug for WgpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuBuffer({} x {})", self.0.len, self.0.dtype)
    }
}

impl DeviceBuffer for WgpuBuffer {
    fn dtype(&self) -> DType {
        self.0.dtype
    }
    fn len(&self) -> usize {
        self.0.len
    }
    fn same_memory(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
    /// Kernels index elements in 32 bits (`u32` positions, `i32` offsets and strides).
    fn index_limit(&self) -> usize {
        i32::MAX as usize
    }
}

pub(crate) fn alloc(gpu: &WgpuBackend, dtype: DType, len: usize) -> Result<WgpuBuffer> {
    let (buf, reused) = gpu.pooled_buffer(dtype, len)?;
    // A reused buffer holds its last owner's data; the contract is zeros. So does a buffer
    // allocated inside a recording once a replay has written it.
    if reused || gpu.capturing() {
        let clear = capture::Command::Clear(buf.0.buffer.clone());
        gpu.transfer(&mut gpu.lock_batch(), clear, &[&buf]);
    }
    Ok(buf)
}

pub(crate) fn alloc_for_write(gpu: &WgpuBackend, dtype: DType, len: usize) -> Result<WgpuBuffer> {
    let buffer = gpu.scratch(dtype, len)?;
    if gpu
        .0
        .poison_for_write
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        gpu.write_after_batch(
            &buffer.0.buffer,
            &vec![0xff; buffer.0.buffer.size() as usize],
        );
    }
    Ok(buffer)
}

pub(crate) fn upload_bytes(gpu: &WgpuBackend, dtype: DType, bytes: &[u8]) -> Result<WgpuBuffer> {
    gpu.refuse_in_capture("upload_bytes")?;
    let (buf, _) = gpu.pooled_buffer(dtype, validate::upload(dtype, bytes)?)?;
    gpu.write_bytes(&buf, bytes)?;
    Ok(buf)
}

pub(crate) fn write_bytes(gpu: &WgpuBackend, dst: &WgpuBuffer, bytes: &[u8]) -> Result<()> {
    gpu.refuse_in_capture("write_bytes")?;
    validate::write(dst, bytes)?;
    let mut padded = bytes.to_vec();
    padded.resize(dst.0.buffer.size() as usize, 0);
    gpu.write_after_batch(&dst.0.buffer, &padded);
    Ok(())
}

pub(crate) fn read_bytes(gpu: &WgpuBackend, src: &WgpuBuffer) -> Result<Vec<u8>> {
    gpu.check_deferred()?;
    let mut bytes = gpu.read_words(&src.0.buffer)?;
    bytes.truncate(src.len() * src.dtype().size_in_bytes());
    gpu.check_deferred()?;
    Ok(bytes)
}

impl WgpuBackend {
    /// A buffer of `len` elements whose contents are unspecified (from the pool when one of its
    /// size class is free: then the flag is true). Checks the size against the adapter.
    pub(crate) fn pooled_buffer(&self, dtype: DType, len: usize) -> Result<(WgpuBuffer, bool)> {
        let bytes = len as u128 * dtype.size_in_bytes() as u128;
        let limit = self.max_binding_bytes();
        if bytes > limit as u128 {
            return Err(Error::AllocationTooLarge {
                requested_bytes: bytes,
                limit_bytes: limit,
                what: format!(
                    "{len} elements of {dtype}; the adapter's largest storage binding (max_storage_buffer_binding_size) is {limit} bytes"
                ),
            });
        }
        let size = Pool::class(bytes as u64, limit);
        let reused = lock(&self.0.pool).take(size);
        let fresh = reused.is_none();
        let buffer = match reused {
            Some(b) => b,
            None => {
                let d = &self.0.device;
                let (buffer, error) = crate::caught(d, wgpu::ErrorFilter::OutOfMemory, || {
                    self.create_buffer(&wgpu::BufferDescriptor {
                        label: None,
                        size,
                        usage: wgpu::BufferUsages::STORAGE
                            | wgpu::BufferUsages::COPY_SRC
                            | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                });
                if error.is_some() {
                    return Err(Error::OutOfMemory {
                        requested_bytes: bytes,
                    });
                }
                buffer
            }
        };
        let inner = BufferInner {
            buffer,
            dtype,
            len,
            pool: self.0.pool.clone(),
        };
        Ok((WgpuBuffer(Arc::new(inner)), !fresh))
    }

    /// Runs `f` with profiles filing its dispatches under `label()` (only when profiling,
    /// and only outside another labelled call, whose label the inner dispatches keep).
    pub(crate) fn labelled(
        &self,
        label: impl FnOnce() -> String,
        f: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let Some(profiler) = &self.0.profiler else {
            return f();
        };
        if !lock(profiler).set_label_if_none(label) {
            return f();
        }
        let result = f();
        lock(profiler).set_label(None);
        result
    }

    /// Scratch space a kernel overwrites completely (partials, unused dummies): no clearing.
    pub(crate) fn scratch(&self, dtype: DType, len: usize) -> Result<WgpuBuffer> {
        Ok(self.pooled_buffer(dtype, len)?.0)
    }

    /// For tests of code that allocates with `alloc_for_write`: from now on (on every clone of
    /// this handle) such buffers start as all-ones bits, NaN in every float dtype, so that an
    /// element the next call fails to write shows up instead of passing as a leftover zero.
    pub fn poison_for_write(&self, on: bool) {
        self.0
            .poison_for_write
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Storage buffers created since the backend was opened (allocations, scratch, staging
    /// copies of aliased operands); those served from the pool are not counted, nor are the
    /// staging buffers of read-backs the caller asks for. A steady-state loop that frees what
    /// it allocates leaves this unchanged.
    pub fn buffers_created(&self) -> u64 {
        self.0
            .buffers_created
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every storage buffer after construction is made here (through the pool), so
    /// [`Self::buffers_created`] counts them all.
    pub(crate) fn create_buffer(&self, desc: &wgpu::BufferDescriptor<'_>) -> wgpu::Buffer {
        self.0
            .buffers_created
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.device.create_buffer(desc)
    }

    /// Records `copy` into a new `MAP_READ` buffer of `size` bytes after everything encoded so
    /// far, submits it with them, and returns the buffer's contents once the device is done.
    pub(crate) fn read_back(
        &self,
        size: u64,
        copy: impl FnOnce(&mut wgpu::CommandEncoder, &wgpu::Buffer),
    ) -> Result<Vec<u8>> {
        self.refuse_in_capture("read_bytes")?;
        if cfg!(target_arch = "wasm32") {
            return Err(Error::Unsupported {
                op: "read_bytes",
                detail: "WebGPU in a browser cannot wait for a read-back: use \
                         Backend::read_bytes_async (or BackendExt::read_async) and await it"
                    .into(),
            });
        }
        let staging = self.stage_read(size, copy);
        let slice = staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.0
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(backend_error)?;
        self.lock_batch().limit = 0;
        rx.recv().map_err(backend_error)?.map_err(backend_error)?;
        let bytes = slice.get_mapped_range().map_err(backend_error)?.to_vec();
        staging.unmap();
        Ok(bytes)
    }

    /// A new `MAP_READ` buffer of `size` bytes that `copy` fills after everything encoded so
    /// far, submitted with it: what a read maps, blocking here or awaited in a browser.
    pub(crate) fn stage_read(
        &self,
        size: u64,
        copy: impl FnOnce(&mut wgpu::CommandEncoder, &wgpu::Buffer),
    ) -> wgpu::Buffer {
        let staging = self.0.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut batch = self.lock_batch();
        self.encode_locked(&mut batch, |e| copy(e, &staging));
        self.submit_batch(&mut batch);
        staging
    }

    pub(crate) fn read_words(&self, buffer: &wgpu::Buffer) -> Result<Vec<u8>> {
        let size = buffer.size();
        self.read_back(size, |e, staging| {
            e.copy_buffer_to_buffer(buffer, 0, staging, 0, size)
        })
    }
}
