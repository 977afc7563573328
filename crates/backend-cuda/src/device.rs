//! The device: context, stream, kernel modules, cuBLAS handle, the fault record, and the launch
//! helper. Everything here talks to the driver; `lib.rs` builds primitives on it.

use crate::alloc::{Block, Pool};
use crate::profile::Profiler;
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{CudaContext, DriverError, result, sys};
use hal::{Error, Result};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The committed PTX of each file in `cuda/` (`cargo xtask ptx` writes them).
pub(crate) const MODULES: [(&str, &str); 12] = [
    ("norm", include_str!("../ptx/norm.ptx")),
    ("attention", include_str!("../ptx/attention.ptx")),
    ("elementwise", include_str!("../ptx/elementwise.ptx")),
    ("reduce", include_str!("../ptx/reduce.ptx")),
    ("matmul", include_str!("../ptx/matmul.ptx")),
    ("index", include_str!("../ptx/index.ptx")),
    ("conv", include_str!("../ptx/conv.ptx")),
    ("cluster", include_str!("../ptx/cluster.ptx")),
    ("segment", include_str!("../ptx/segment.ptx")),
    ("optim", include_str!("../ptx/optim.ptx")),
    ("random", include_str!("../ptx/random.ptx")),
    ("topk", include_str!("../ptx/topk.ptx")),
];

/// The compute-capability-9.0 builds of files in `MODULES` (xtask's `DUAL_TARGET`), loaded in
/// their place on Hopper and newer: their kernels open with `GRID_DEPENDENCY`
/// (`cuda/common.cuh`) and are launched with programmatic dependent launch.
const HOPPER_MODULES: [(&str, &str); 2] = [
    ("elementwise", include_str!("../ptx/elementwise.sm90.ptx")),
    ("random", include_str!("../ptx/random.sm90.ptx")),
];

/// Threads per block of the one-dimensional kernels.
pub(crate) const BLOCK: u32 = 256;

pub(crate) fn driver_error(what: &str, e: DriverError) -> Error {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Error::OutOfMemory { requested_bytes: 0 };
    }
    let name = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    Error::Backend {
        backend: "cuda",
        detail: format!("{what}: {name}"),
    }
}

pub(crate) fn blas_error(what: &str, e: blas::CublasError) -> Error {
    Error::Backend {
        backend: "cuda",
        detail: format!("{what}: cuBLAS status {:?}", e.0),
    }
}

/// A kernel handle (a raw driver pointer, usable from any thread).
#[derive(Clone, Copy)]
pub(crate) struct Func {
    pub raw: sys::CUfunction,
    /// What profiles call it (see [`crate::profile`]).
    pub name: &'static str,
    /// The kernel waits for its predecessors itself (`GRID_DEPENDENCY`), so it may be
    /// launched before they finish (programmatic stream serialization).
    pub grid_dependency: bool,
}

impl Func {
    /// A kernel launched in plain stream order.
    pub fn plain(raw: sys::CUfunction, name: &'static str) -> Func {
        Func {
            raw,
            name,
            grid_dependency: false,
        }
    }
}
// SAFETY: CUfunction handles are immutable and the driver API is thread-safe.
unsafe impl Send for Func {}
unsafe impl Sync for Func {}

/// Kernel arguments: each value copied into its own 8-byte-aligned slot, so the pointers the
/// driver reads stay valid until the launch call returns (the driver copies them then).
#[derive(Default)]
pub(crate) struct Args {
    slots: Vec<Vec<u64>>,
}

impl Args {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn arg<T: Copy>(mut self, v: T) -> Self {
        let size = std::mem::size_of::<T>();
        let mut slot = vec![0u64; size.div_ceil(8).max(1)];
        // SAFETY: the slot has at least `size` bytes; T is plain data (Copy).
        unsafe {
            std::ptr::copy_nonoverlapping(
                &v as *const T as *const u8,
                slot.as_mut_ptr() as *mut u8,
                size,
            )
        };
        self.slots.push(slot);
        self
    }
    /// A buffer operand as the kernels take it: its device address, then its dtype's code
    /// (`dtype_code`, mirrored by `cuda/common.cuh`).
    pub fn operand(self, buffer: &crate::CudaBuffer) -> Self {
        self.arg(buffer.ptr())
            .arg(crate::dtype_code(hal::DeviceBuffer::dtype(buffer)))
    }
    fn pointers(&mut self) -> Vec<*mut c_void> {
        self.slots
            .iter_mut()
            .map(|s| s.as_mut_ptr() as *mut c_void)
            .collect()
    }
}

/// A file of `cuda/` as this device runs it: its PTX (the `HOPPER_MODULES` build where one
/// applies) and, once one of its kernels is first asked for, the module the driver made of
/// it. Modules load on first use because the driver compiles PTX to machine code as it
/// loads it: all eleven files take about 25 s on a fresh H200 (the driver's cache spares
/// later processes on that machine), where a workload uses a few.
struct ModuleSlot {
    name: &'static str,
    ptx: &'static str,
    hopper: bool,
    /// Loaded under `Device::functions`' lock; never unloaded before the device drops.
    loaded: Option<sys::CUmodule>,
}

/// The modules, and each kernel name's module (from the PTX's `.entry` lines).
struct Modules {
    slots: Vec<ModuleSlot>,
    entries: HashMap<&'static str, usize>,
    functions: HashMap<&'static str, Func>,
}

/// The kernel names a PTX file defines (`.entry NAME(`).
fn entry_names(ptx: &'static str) -> impl Iterator<Item = &'static str> {
    ptx.split(".entry ").skip(1).filter_map(|rest| {
        let rest = rest.trim_start();
        let end = rest.find(|c: char| c == '(' || c.is_whitespace())?;
        Some(&rest[..end])
    })
}

pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: sys::CUstream,
    /// The kernel modules (loaded on first use) and the functions found so far.
    modules: Mutex<Modules>,
    pub pool: Arc<Pool>,
    pub cublas: Mutex<blas_sys::cublasHandle_t>,
    /// cuBLAS's workspace, set once so a captured GEMM allocates nothing.
    _blas_workspace: Arc<Block>,
    /// The fault record `[claimed, index, bound, op]` (`cuda/common.cuh`, `report_fault`).
    pub fault: Arc<Block>,
    /// A word that the last block of a split reduction finds by counting blocks in
    /// (`arg_reduce_split`); zero between launches, each such launch leaving it so.
    pub ticket: Arc<Block>,
    /// True when a launch that can fault ran since the record was last read.
    pub fault_pending: AtomicBool,
    /// True while a recording captures the stream.
    pub capturing: AtomicBool,
    /// `alloc_for_write` fills its buffers with all-ones bits (see `poison_for_write`).
    pub poison_for_write: AtomicBool,
    pub name: String,
    pub sms: u32,
    /// The most shared memory one block may ask for (opting in beyond the default 48 KiB).
    pub shared_optin: usize,
    pub compute_capability: (i32, i32),
    pub memory_total: u64,
    /// Per-launch timing under `HAL_CUDA_PROFILE` (see [`crate::profile`]).
    pub profiler: Option<Mutex<Profiler>>,
}

// SAFETY: the raw handles (stream, modules, cuBLAS handle) are used through the thread-safe
// driver API; the cuBLAS handle is only used under its mutex.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

fn unavailable(reason: String) -> Error {
    Error::Unavailable {
        backend: "cuda",
        reason,
    }
}

impl Device {
    pub fn open(ordinal: usize) -> Result<Device> {
        // cudarc panics when a library cannot be loaded: check for each one first.
        // SAFETY: these only try to open the shared libraries.
        if !unsafe { sys::is_culib_present() } {
            return Err(unavailable(
                "the NVIDIA driver library (libcuda.so) was not found: no NVIDIA driver is installed"
                    .into(),
            ));
        }
        // SAFETY: only probes whether the library loads (no call into it).
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(unavailable(
                "cuBLAS (libcublas.so.13) was not found: install the CUDA 13 runtime libraries"
                    .into(),
            ));
        }
        let count = {
            result::init()
                .map_err(|e| unavailable(format!("the driver failed to start: {e:?}")))?;
            result::device::get_count().map_err(|e| unavailable(format!("no device: {e:?}")))?
        };
        if count as usize <= ordinal {
            return Err(unavailable(format!(
                "no CUDA device {ordinal} ({count} present)"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| unavailable(format!("cannot create a context: {e:?}")))?;
        let attribute = |a| {
            ctx.attribute(a)
                .map_err(|e| driver_error("device attribute", e))
        };
        let (name, sms, shared_optin, cc, memory_total) = (
            ctx.name().unwrap_or_else(|_| "NVIDIA GPU".into()),
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )? as usize,
            ctx.compute_capability()
                .map_err(|e| driver_error("compute capability", e))?,
            ctx.total_mem()
                .map_err(|e| driver_error("total memory", e))? as u64,
        );
        if cc.0 < 8 {
            return Err(unavailable(format!(
                "{name} has compute capability {}.{}; the kernels target 8.0 (Ampere) or newer",
                cc.0, cc.1
            )));
        }
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error("stream", e))?;
        // BACKEND_CUDA_NO_PDL=1 keeps the compute_80 builds (to compare, or to rule the
        // overlapped launches out when chasing a fault).
        let hopper = cc.0 >= 9 && std::env::var_os("BACKEND_CUDA_NO_PDL").is_none();
        let slots: Vec<ModuleSlot> = MODULES
            .iter()
            .map(|&(name, ptx)| {
                let hopper_ptx = HOPPER_MODULES
                    .iter()
                    .find(|(n, _)| hopper && *n == name)
                    .map(|(_, p)| *p);
                ModuleSlot {
                    name,
                    ptx: hopper_ptx.unwrap_or(ptx),
                    hopper: hopper_ptx.is_some(),
                    loaded: None,
                }
            })
            .collect();
        let mut entries = HashMap::new();
        for (i, slot) in slots.iter().enumerate() {
            for name in entry_names(slot.ptx) {
                entries.entry(name).or_insert(i);
            }
        }
        let modules = Mutex::new(Modules {
            slots,
            entries,
            functions: HashMap::new(),
        });
        let pool = Pool::new(stream);
        let handle = blas::create_handle().map_err(|e| blas_error("cublasCreate", e))?;
        // SAFETY: a fresh handle and the backend's stream.
        unsafe { blas::set_stream(handle, stream as _) }
            .map_err(|e| blas_error("cublasSetStream", e))?;
        let workspace = pool.alloc(32 << 20)?;
        // SAFETY: the workspace lives as long as the device.
        unsafe {
            blas_sys::cublasSetWorkspace_v2(handle, workspace.ptr as *mut c_void, workspace.bytes)
        }
        .result()
        .map_err(|e| blas_error("cublasSetWorkspace", e))?;
        let fault = pool.alloc(16)?;
        let ticket = pool.alloc(4)?;
        let dev = Device {
            ctx,
            stream,
            modules,
            pool,
            cublas: Mutex::new(handle),
            _blas_workspace: workspace,
            fault,
            ticket,
            fault_pending: AtomicBool::new(false),
            capturing: AtomicBool::new(false),
            poison_for_write: AtomicBool::new(false),
            name,
            sms,
            shared_optin,
            compute_capability: cc,
            memory_total,
            profiler: crate::profile::requested().then(|| Mutex::new(Profiler::default())),
        };
        dev.memset(dev.fault.ptr, 0, 16)?;
        dev.memset(dev.ticket.ptr, 0, 4)?;
        Ok(dev)
    }

    /// Makes the context current on the calling thread (cheap when it already is).
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("binding the context", e))
    }

    pub fn function(&self, name: &'static str) -> Result<Func> {
        let mut guard = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let modules = &mut *guard;
        if let Some(f) = modules.functions.get(name) {
            return Ok(*f);
        }
        let missing = || Error::Backend {
            backend: "cuda",
            detail: format!("kernel {name} is not in the committed PTX (run cargo xtask ptx)"),
        };
        let &index = modules.entries.get(name).ok_or_else(missing)?;
        let slot = &mut modules.slots[index];
        let module = match slot.loaded {
            Some(m) => m,
            None => {
                self.bind()?;
                let image = CString::new(slot.ptx).expect("PTX has no NUL bytes");
                // SAFETY: a NUL-terminated PTX image; the context is current.
                let m = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
                    .map_err(|e| {
                        driver_error(&format!("loading the PTX of cuda/{}.cu", slot.name), e)
                    })?;
                slot.loaded = Some(m);
                m
            }
        };
        let cname = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: the module is loaded; a missing name is an error, not UB.
        let raw = unsafe { result::module::get_function(module, cname) }.map_err(|_| missing())?;
        let f = Func {
            raw,
            name,
            grid_dependency: slot.hopper,
        };
        modules.functions.insert(name, f);
        Ok(f)
    }

    /// Launches `f` on the backend's stream.
    pub fn launch_raw(&self, f: Func, grid: (u32, u32, u32), block: u32, args: Args) -> Result<()> {
        self.launch_shared(f, grid, block, 0, args)
    }

    /// Launches `f` with `shared` bytes of dynamic shared memory (beyond 48 KiB the function
    /// is first allowed that much; callers keep `shared` within [`Device::shared_optin`]).
    pub fn launch_shared(
        &self,
        f: Func,
        grid: (u32, u32, u32),
        block: u32,
        shared: usize,
        args: Args,
    ) -> Result<()> {
        self.timed(f.name, || self.launch_now(f, grid, block, shared, args))
    }

    /// Runs `work` (which enqueues one launch, product or memset on the stream); under
    /// `HAL_CUDA_PROFILE`, outside a capture, brackets it with events filed under `name`.
    pub fn timed(&self, name: &str, work: impl FnOnce() -> Result<()>) -> Result<()> {
        let Some(profiler) = &self.profiler else {
            return work();
        };
        if self.capturing.load(Ordering::Acquire) {
            return work();
        }
        let lock = || profiler.lock().unwrap_or_else(|e| e.into_inner());
        if lock().pending() >= crate::profile::MAX_PENDING {
            self.synchronize_stream()?;
            lock().collect()?;
        }
        let start = lock().mark(self.stream)?;
        work()?;
        let mut p = lock();
        let end = p.mark(self.stream)?;
        p.file(name, start, end);
        Ok(())
    }

    /// [`Device::launch_shared`] without the profiler.
    fn launch_now(
        &self,
        f: Func,
        grid: (u32, u32, u32),
        block: u32,
        shared: usize,
        mut args: Args,
    ) -> Result<()> {
        if shared > 48 << 10 {
            // SAFETY: a function of a loaded module; the size is the device's to refuse.
            unsafe {
                result::function::set_function_attribute(
                    f.raw,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared as i32,
                )
            }
            .map_err(|e| driver_error("cuFuncSetAttribute (dynamic shared memory)", e))?;
        }
        let mut ptrs = args.pointers();
        if f.grid_dependency {
            // SAFETY: a zeroed attribute is a valid "ignore" value before id and value are set.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: shared as u32,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below; the kernel opens with griddepcontrol.wait, so starting before
            // its predecessors finish cannot let it read or write memory early.
            return unsafe {
                sys::cuLaunchKernelEx(&config, f.raw, ptrs.as_mut_ptr(), std::ptr::null_mut())
            }
            .result()
            .map_err(|e| driver_error("cuLaunchKernelEx", e));
        }
        // SAFETY: the argument list matches the kernel's signature (each call site mirrors the
        // kernel's declaration in cuda/*.cu); device pointers come from live blocks.
        unsafe {
            result::launch_kernel(
                f.raw,
                grid,
                (block, 1, 1),
                shared as u32,
                self.stream,
                &mut ptrs,
            )
        }
        .map_err(|e| driver_error("cuLaunchKernel", e))
    }

    /// Launches `f` cooperatively: the driver starts every block at once or refuses the
    /// launch (too large a grid for the device), so the kernel's blocks may wait for each other.
    pub fn launch_cooperative(&self, f: Func, grid: u32, block: u32, mut args: Args) -> Result<()> {
        self.timed(f.name, || {
            let mut ptrs = args.pointers();
            // SAFETY: a zeroed attribute is a valid "ignore" value before id and value are set.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            attr.value.cooperative = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as in `launch_now`: the arguments mirror the kernel's declaration and
            // point into live blocks.
            unsafe {
                sys::cuLaunchKernelEx(&config, f.raw, ptrs.as_mut_ptr(), std::ptr::null_mut())
            }
            .result()
            .map_err(|e| driver_error("cuLaunchKernelEx (cooperative)", e))
        })
    }

    /// Launches kernel `name` with enough blocks of [`BLOCK`] threads for `work` items (the
    /// kernels loop, so the grid is capped at a few waves).
    pub fn launch(&self, name: &'static str, work: usize, args: Args) -> Result<()> {
        if work == 0 {
            return Ok(());
        }
        self.launch_raw(
            self.function(name)?,
            (self.blocks_for(work), 1, 1),
            BLOCK,
            args,
        )
    }

    /// The blocks of [`BLOCK`] threads [`Self::launch`] gives `work` items: one per item for
    /// each thread, at most 16 per multiprocessor (the kernels loop), at least one.
    pub fn blocks_for(&self, work: usize) -> u32 {
        work.div_ceil(BLOCK as usize)
            .min(self.sms as usize * 16)
            .max(1) as u32
    }

    pub fn memset(&self, ptr: sys::CUdeviceptr, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.timed("memset", || {
            // SAFETY: the range lies in a live block.
            unsafe { result::memset_d8_async(ptr, value, bytes, self.stream) }
                .map_err(|e| driver_error("cuMemsetD8Async", e))
        })
    }

    pub fn synchronize_stream(&self) -> Result<()> {
        // SAFETY: the backend's stream.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| driver_error("cuStreamSynchronize", e))?;
        if let Some(p) = &self.profiler {
            p.lock().unwrap_or_else(|e| e.into_inner()).collect()?;
        }
        Ok(())
    }

    /// Reads and clears the fault record when a launch that can fault ran (after a sync).
    pub fn take_fault(&self) -> Result<Option<[u32; 4]>> {
        if !self.fault_pending.swap(false, Ordering::AcqRel) {
            return Ok(None);
        }
        let mut words = [0u32; 4];
        // SAFETY: the record is 16 bytes; the stream has drained.
        unsafe { result::memcpy_dtoh_sync(&mut words, self.fault.ptr) }
            .map_err(|e| driver_error("reading the fault record", e))?;
        if words[0] == 0 {
            return Ok(None);
        }
        self.memset(self.fault.ptr, 0, 16)?;
        self.synchronize_stream()?;
        Ok(Some(words))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Unloading the modules would spoil another backend's capture under way.
        let _gate = crate::alloc::sync_gate(true);
        let _ = self.bind();
        let _ = self.synchronize_stream();
        let handle = *self.cublas.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the handle and modules are ours and no longer used.
        unsafe {
            let _ = blas::destroy_handle(handle);
            let modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            for m in modules.slots.iter().filter_map(|s| s.loaded) {
                let _ = result::module::unload(m);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed PTX file names its kernels in `.entry` lines that `entry_names`
    /// finds, and no kernel name is in two files (a name picks one module to load).
    #[test]
    fn each_kernel_name_belongs_to_one_module() {
        let sample = ".visible .entry row_norms(\n\t.param .u64 a\n)\n.weak .entry pick_one (\n";
        assert_eq!(
            entry_names(sample).collect::<Vec<_>>(),
            ["row_norms", "pick_one"]
        );
        let mut owner: HashMap<&str, &str> = HashMap::new();
        for (file, ptx) in MODULES {
            let names: Vec<&str> = entry_names(ptx).collect();
            assert!(!names.is_empty(), "{file}.ptx defines no kernel");
            for name in names {
                if let Some(other) = owner.insert(name, file) {
                    panic!("kernel {name} is in both {other}.ptx and {file}.ptx");
                }
            }
        }
        for (file, ptx) in HOPPER_MODULES {
            let plain = MODULES
                .iter()
                .find(|(n, _)| *n == file)
                .expect("a plain build");
            let mut a: Vec<&str> = entry_names(ptx).collect();
            let mut b: Vec<&str> = entry_names(plain.1).collect();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{file}: the sm90 build defines other kernels");
        }
    }
}
