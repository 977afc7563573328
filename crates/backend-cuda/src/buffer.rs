//! Buffers: allocation from the pool, uploads and read-backs.

use crate::CudaBackend;
use crate::alloc::{Block, PoolStats};
use crate::device::driver_error;
use cudarc::driver::result as drv;
use hal::{Backend, DType, DeviceBuffer, Error, Result, validate};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A buffer in device memory. Clones share the memory; the block returns to the backend's
/// pool when the last clone drops.
#[derive(Clone)]
pub struct CudaBuffer {
    pub(crate) block: Arc<Block>,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuffer({} x {})", self.len, self.dtype)
    }
}

impl DeviceBuffer for CudaBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn same_memory(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.block, &other.block)
    }
}

impl CudaBuffer {
    pub(crate) fn ptr(&self) -> u64 {
        self.block.ptr
    }
    pub(crate) fn bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }
}

pub(crate) fn alloc(gpu: &CudaBackend, dtype: DType, len: usize) -> Result<CudaBuffer> {
    gpu.scratch(dtype, len)
}

pub(crate) fn alloc_for_write(gpu: &CudaBackend, dtype: DType, len: usize) -> Result<CudaBuffer> {
    let b = gpu.new_buffer(dtype, len)?;
    if gpu.dev.poison_for_write.load(Ordering::Relaxed) {
        gpu.dev.memset(b.ptr(), 0xff, b.bytes())?;
    }
    Ok(b)
}

pub(crate) fn upload_bytes(gpu: &CudaBackend, dtype: DType, bytes: &[u8]) -> Result<CudaBuffer> {
    gpu.refuse_in_capture("upload_bytes")?;
    let len = validate::upload(dtype, bytes)?;
    let b = gpu.new_buffer(dtype, len)?;
    if !bytes.is_empty() {
        // SAFETY: the block holds at least `bytes.len()` bytes; a copy from pageable memory
        // has read the host data when it returns.
        unsafe { drv::memcpy_htod_async(b.ptr(), bytes, gpu.dev.stream) }
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
    }
    Ok(b)
}

pub(crate) fn write_bytes(gpu: &CudaBackend, dst: &CudaBuffer, bytes: &[u8]) -> Result<()> {
    gpu.refuse_in_capture("write_bytes")?;
    validate::write(dst, bytes)?;
    gpu.dev.bind()?;
    if !bytes.is_empty() {
        // SAFETY: as in upload_bytes; the size was validated.
        unsafe { drv::memcpy_htod_async(dst.ptr(), bytes, gpu.dev.stream) }
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
    }
    Ok(())
}

pub(crate) fn read_bytes(gpu: &CudaBackend, src: &CudaBuffer) -> Result<Vec<u8>> {
    gpu.refuse_in_capture("read_bytes")?;
    gpu.synchronize()?;
    let mut out = vec![0u8; src.bytes()];
    if !out.is_empty() {
        // SAFETY: the block holds the buffer's bytes; the stream has drained.
        unsafe { drv::memcpy_dtoh_sync(&mut out, src.ptr()) }
            .map_err(|e| driver_error("cuMemcpyDtoH", e))?;
    }
    Ok(out)
}

impl CudaBackend {
    /// For tests of code that allocates with `alloc_for_write`: from now on (on every clone of
    /// this handle) such buffers start as all-ones bits, NaN in every float dtype, so that an
    /// element the next call fails to write shows up instead of passing as a leftover zero.
    pub fn poison_for_write(&self, on: bool) {
        self.dev.poison_for_write.store(on, Ordering::Relaxed);
    }

    /// The allocator's figures: memory taken from the driver and in use, and how many times it
    /// called `cuMemAlloc`.
    pub fn pool_stats(&self) -> PoolStats {
        self.dev.pool.stats()
    }

    /// The driver's device-to-device copy of a whole buffer (`cuMemcpyDtoDAsync`): the copy
    /// bandwidth the bench compares elementwise kernels with.
    pub fn copy_whole_buffer(&self, src: &CudaBuffer, dst: &CudaBuffer) -> Result<()> {
        if src.bytes() != dst.bytes() {
            return Err(Error::InvalidArgument {
                op: "copy_whole_buffer",
                detail: format!("{} bytes into {} bytes", src.bytes(), dst.bytes()),
            });
        }
        self.dev.bind()?;
        // SAFETY: both blocks hold the stated bytes.
        unsafe { drv::memcpy_dtod_async(dst.ptr(), src.ptr(), src.bytes(), self.dev.stream) }
            .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
    }

    pub(crate) fn new_buffer(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .filter(|&b| (b as u64) <= self.dev.memory_total)
            .ok_or_else(|| Error::AllocationTooLarge {
                requested_bytes: len as u128 * dtype.size_in_bytes() as u128,
                limit_bytes: self.dev.memory_total,
                what: format!("a buffer of {len} x {dtype}"),
            })?;
        self.dev.bind()?;
        Ok(CudaBuffer {
            block: self.dev.pool.alloc(bytes)?,
            dtype,
            len,
        })
    }

    /// A zeroed scratch buffer for one call (back to the pool when dropped).
    pub(crate) fn scratch(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        let b = self.new_buffer(dtype, len)?;
        self.dev.memset(b.ptr(), 0, b.bytes())?;
        Ok(b)
    }
}
