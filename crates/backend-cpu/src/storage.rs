//! Buffer memory and typed element access.
//!
//! A [`CpuBuffer`] is an `Arc` over one 64-byte-aligned allocation. Kernels reach it through
//! raw pointers ([`Src`], [`Dst`]) because an in-place elementwise op legitimately reads and
//! writes one buffer; every access happens while the backend's execution lock is held (see
//! `lib.rs`), so no two operations touch memory at once, and inside one operation the threads
//! write disjoint elements.

use hal::{DType, DeviceBuffer, Element, bf16, f16};
use std::alloc::{Layout as AllocLayout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;

pub(crate) const ALIGN: usize = 64;

/// Allocations at least this large are rounded up to whole pages and, when freed, kept for
/// reuse: a training step frees and re-allocates the same sizes every step, and fresh large
/// allocations come from the kernel page by page (a fault and a kernel zeroing each), which
/// cost more than clearing a kept one.
const REUSE_MIN: usize = 64 << 10;
const PAGE: usize = 4 << 10;
/// The most memory kept for reuse; beyond it freed allocations go back to the system.
const REUSE_LIMIT: usize = 512 << 20;

/// Freed large allocations (addresses) by capacity, and their total.
struct Kept {
    by_capacity: std::collections::BTreeMap<usize, Vec<usize>>,
    bytes: usize,
}

static KEPT: std::sync::Mutex<Kept> = std::sync::Mutex::new(Kept {
    by_capacity: std::collections::BTreeMap::new(),
    bytes: 0,
});

fn kept() -> std::sync::MutexGuard<'static, Kept> {
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct Storage {
    pub dtype: DType,
    pub len: usize,
    ptr: NonNull<u8>,
    bytes: usize,
    /// The allocation's size (`bytes`, or rounded up to pages when it may be kept).
    capacity: usize,
}

// SAFETY: the storage is plain memory; all access is serialised by the backend's execution lock
// and disjoint between the threads of one operation.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    /// Zeroed storage, or `None` when the allocator refuses.
    pub fn zeroed(dtype: DType, len: usize) -> Option<Self> {
        Self::new(dtype, len, true)
    }

    /// Storage whose contents are unspecified but initialised: a kept allocation as its last
    /// owner left it (not cleared), or fresh zeroed memory. For outputs written whole.
    pub fn for_write(dtype: DType, len: usize) -> Option<Self> {
        Self::new(dtype, len, false)
    }

    fn new(dtype: DType, len: usize, zero: bool) -> Option<Self> {
        let bytes = len.checked_mul(dtype.size_in_bytes())?;
        if bytes == 0 {
            let ptr = NonNull::new(ALIGN as *mut u8)?; // dangling, aligned, never dereferenced
            return Some(Self {
                dtype,
                len,
                ptr,
                bytes,
                capacity: 0,
            });
        }
        let capacity = if bytes >= REUSE_MIN {
            bytes.checked_next_multiple_of(PAGE)?
        } else {
            bytes
        };
        if capacity >= REUSE_MIN {
            let reused = {
                let mut kept = kept();
                let found = kept.by_capacity.get_mut(&capacity).and_then(|v| v.pop());
                if found.is_some() {
                    kept.bytes -= capacity;
                }
                found
            };
            if let Some(addr) = reused {
                if zero {
                    // SAFETY: a live allocation of `capacity >= bytes` bytes that nothing else
                    // refers to; only the first `bytes` are ever read.
                    unsafe { std::ptr::write_bytes(addr as *mut u8, 0, bytes) };
                }
                return Some(Self {
                    dtype,
                    len,
                    ptr: NonNull::new(addr as *mut u8)?,
                    bytes,
                    capacity,
                });
            }
        }
        let layout = AllocLayout::from_size_align(capacity, ALIGN).ok()?;
        // SAFETY: layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(Self {
            dtype,
            len,
            ptr,
            bytes,
            capacity,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if self.capacity == 0 {
            return;
        }
        if self.capacity >= REUSE_MIN {
            let mut kept = kept();
            if kept.bytes + self.capacity <= REUSE_LIMIT {
                kept.bytes += self.capacity;
                let addr = self.ptr.as_ptr() as usize;
                kept.by_capacity
                    .entry(self.capacity)
                    .or_default()
                    .push(addr);
                return;
            }
        }
        // SAFETY: allocated in `zeroed` with this exact layout.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                AllocLayout::from_size_align_unchecked(self.capacity, ALIGN),
            )
        }
    }
}

/// A CPU buffer handle. Clones share memory.
#[derive(Clone)]
pub struct CpuBuffer(pub(crate) Arc<Storage>);

impl std::fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuBuffer({} x {})", self.0.len, self.0.dtype)
    }
}

impl DeviceBuffer for CpuBuffer {
    fn dtype(&self) -> DType {
        self.0.dtype
    }
    fn len(&self) -> usize {
        self.0.len
    }
    fn same_memory(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl CpuBuffer {
    pub(crate) fn src(&self) -> Src {
        Src {
            ptr: self.0.as_ptr(),
            dtype: self.0.dtype,
        }
    }
    pub(crate) fn dst(&self) -> Dst {
        Dst {
            ptr: self.0.as_ptr(),
            dtype: self.0.dtype,
        }
    }
    /// The memory as a typed pointer; the caller has checked the dtype.
    pub(crate) fn typed<T: Element>(&self) -> *mut T {
        debug_assert_eq!(self.0.dtype, T::DTYPE);
        self.0.as_ptr() as *mut T
    }
}

/// A kernel's temporary array of `T` (dense copies of strided operands, per-head partials),
/// from the same allocations as buffers: large ones are kept and reused across calls rather
/// than faulted in from the kernel page by page each time, as a `Vec` of that size is.
pub(crate) struct Scratch<T> {
    storage: Storage,
    _element: std::marker::PhantomData<T>,
}

impl<T: Element> Scratch<T> {
    /// `len` zeros; panics where the allocator refuses, as `Vec` does.
    pub fn zeroed(len: usize) -> Self {
        let storage = Storage::zeroed(T::DTYPE, len)
            .unwrap_or_else(|| panic!("out of memory: a scratch array of {len} x {}", T::DTYPE));
        Self {
            storage,
            _element: std::marker::PhantomData,
        }
    }
}

impl<T: Element> Scratch<T> {
    /// Zeroed room for `count` results of `each` elements, and the chunk length that splits
    /// it into exactly `count` chunks, even where `each` is 0 (chunks of 0 elements would end
    /// a zip of chunk iterators before it starts, leaving the other outputs of a row or head
    /// unwritten). The results are the first `count * each` elements.
    pub fn chunked(count: usize, each: usize) -> (Self, usize) {
        (Self::zeroed(count * each.max(1)), each.max(1))
    }
}

impl<T: Element> std::ops::Deref for Scratch<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` elements of `T` (the storage's dtype is `T::DTYPE`), initialised
        // (zeroed at creation), aligned to 64 bytes; owned by `self`.
        unsafe { std::slice::from_raw_parts(self.storage.as_ptr() as *const T, self.storage.len) }
    }
}

impl<T: Element> std::ops::DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.storage.as_ptr() as *mut T, self.storage.len) }
    }
}

/// Read access to elements of any dtype, as `f32` (or `f64`, [`Src::load_f64`]).
#[derive(Clone, Copy)]
pub(crate) struct Src {
    pub ptr: *const u8,
    pub dtype: DType,
}

/// Write access to elements of any dtype, from `f32`.
#[derive(Clone, Copy)]
pub(crate) struct Dst {
    pub ptr: *mut u8,
    pub dtype: DType,
}

// SAFETY: see the module documentation.
unsafe impl Send for Src {}
unsafe impl Sync for Src {}
unsafe impl Send for Dst {}
unsafe impl Sync for Dst {}

impl Src {
    /// The buffer as `f32`s, for kernels that checked the dtype (a method, so closures
    /// capture the whole `Sync` handle).
    #[inline(always)]
    pub fn as_f32(self) -> *const f32 {
        self.ptr as *const f32
    }

    /// Element `i` as `f32`. `i` lies inside the buffer (views are checked up front).
    #[inline(always)]
    pub unsafe fn load(self, i: isize) -> f32 {
        // SAFETY: the caller guarantees `i` in bounds (views are checked by hal::validate).
        unsafe {
            match self.dtype {
                DType::F32 => *(self.ptr as *const f32).offset(i),
                DType::F16 => (*(self.ptr as *const f16).offset(i)).to_f32(),
                DType::BF16 => (*(self.ptr as *const bf16).offset(i)).to_f32(),
                DType::I32 => *(self.ptr as *const i32).offset(i) as f32,
                DType::U32 => *(self.ptr as *const u32).offset(i) as f32,
                DType::F64 => *(self.ptr as *const f64).offset(i) as f32,
            }
        }
    }

    /// Element `i` as `f64` (exact for every dtype).
    #[inline(always)]
    pub unsafe fn load_f64(self, i: isize) -> f64 {
        // SAFETY: as for `load`.
        unsafe {
            match self.dtype {
                DType::F64 => *(self.ptr as *const f64).offset(i),
                DType::I32 => *(self.ptr as *const i32).offset(i) as f64,
                DType::U32 => *(self.ptr as *const u32).offset(i) as f64,
                _ => self.load(i) as f64,
            }
        }
    }

    /// Element `i` of an integer buffer as `i64` (for indices).
    #[inline(always)]
    pub unsafe fn load_index(self, i: isize) -> i64 {
        // SAFETY: as for `load`.
        unsafe {
            match self.dtype {
                DType::I32 => *(self.ptr as *const i32).offset(i) as i64,
                DType::U32 => *(self.ptr as *const u32).offset(i) as i64,
                DType::F64 => *(self.ptr as *const f64).offset(i) as i64,
                _ => self.load(i) as i64,
            }
        }
    }
}

impl Dst {
    #[inline(always)]
    pub unsafe fn store(self, i: isize, v: f32) {
        // SAFETY: the caller guarantees `i` in bounds and no other thread at `i` (output views
        // are checked for self-overlap by hal::validate).
        unsafe {
            match self.dtype {
                DType::F32 => *(self.ptr as *mut f32).offset(i) = v,
                DType::F16 => *(self.ptr as *mut f16).offset(i) = f16::from_f32(v),
                DType::BF16 => *(self.ptr as *mut bf16).offset(i) = bf16::from_f32(v),
                DType::I32 => *(self.ptr as *mut i32).offset(i) = v as i32,
                DType::U32 => *(self.ptr as *mut u32).offset(i) = v as u32,
                DType::F64 => *(self.ptr as *mut f64).offset(i) = v as f64,
            }
        }
    }

    /// Stores `v` at element `i`: exactly into `f64`, otherwise as [`Dst::store`] stores
    /// `v` rounded to `f32` (so narrow outputs round as they always have).
    #[inline(always)]
    pub unsafe fn store_f64(self, i: isize, v: f64) {
        // SAFETY: as for `store`.
        unsafe {
            match self.dtype {
                DType::F64 => *(self.ptr as *mut f64).offset(i) = v,
                DType::I32 => *(self.ptr as *mut i32).offset(i) = v as i32,
                DType::U32 => *(self.ptr as *mut u32).offset(i) = v as u32,
                _ => self.store(i, v as f32),
            }
        }
    }
    #[inline(always)]
    pub fn as_u32(self) -> *mut u32 {
        self.ptr as *mut u32
    }
    pub fn src(self) -> Src {
        Src {
            ptr: self.ptr,
            dtype: self.dtype,
        }
    }
}
