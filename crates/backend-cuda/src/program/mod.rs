//! The scalar program IR lowered to CUDA C and compiled by NVRTC to a CUBIN for the device's
//! architecture. One statement per SSA value; loads and stores are bounds-checked against the
//! buffer lengths passed with the pointers (an out-of-range load reads 0, an out-of-range store
//! writes nothing), and the first out-of-range access of any launch is written to the device's
//! fault record (op code 0) and reported at the next synchronize. A thread notes its first
//! failed check in registers and reports it once, after its element: a report call (an atomic)
//! at every check would keep the compiler from issuing the loads together, which cost an
//! edge-length residual kernel half its speed.
//!
//! Two refinements have modules of their own: [`store_runs`] (a residual kernel's Jacobian
//! entries written through shared memory) and [`copies`] (several launch indices a thread for
//! short elementwise programs, as 16-byte vector accesses where the program allows).
//!
//! Kernel signature: `(i64 n, u32* fault, T0* b0, i64 len0, T1* b1, i64 len1, ...)`.

use crate::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::device::Args;
use crate::device::{self, Device, Func, driver_error};
use cudarc::driver::result as drv;
use cudarc::nvrtc::{result as rtc, sys as rtc_sys};
use hal::ir::render::render_body;
use hal::ir::{Program, ScalarType};
use hal::{DeviceBuffer, validate};
use hal::{Error, Result};
use std::ffi::{CString, c_void};
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

mod copies;
mod dialect;
mod store_runs;

use copies::Layout;
use dialect::{CudaC, F64_HELPERS, storage};
use store_runs::{STAGED_BLOCK, emit_store_run, staged_type, store_runs};

/// `cuda/common.cuh`, the prelude of every generated kernel (it includes no toolkit header, so
/// NVRTC needs none).
const PRELUDE: &str = include_str!("../../../../cuda/common.cuh");

/// A compiled program.
#[derive(Clone)]
pub struct CudaKernel {
    pub(crate) program: Arc<Program>,
    /// Launch indices a thread runs (its [`Layout`]'s).
    per_thread: u32,
    pub(crate) function: Func,
    source: Arc<String>,
}

impl CudaKernel {
    /// The generated CUDA C, for inspection.
    pub fn source(&self) -> &str {
        &self.source
    }
}

impl std::fmt::Debug for CudaKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaKernel({})", self.program.name)
    }
}

/// The most buffers a program declares: each takes a pointer and a length (16 bytes) of a
/// kernel's 4 KiB of parameters, after the count and the fault words.
pub(crate) const MAX_BUFFERS: usize = 240;

/// CUDA C source of `program`, whose kernel is named `program` (what `compile` hands NVRTC;
/// public as `backend_cuda::cuda_source`, for inspection without a GPU).
pub fn lower(program: &Program) -> Result<String> {
    lower_as(program, &layout_of(program))
}

/// The layout [`lower`] gives `program` (one index a thread for a program that fails to
/// validate: lowering reports that).
fn layout_of(program: &Program) -> Layout {
    match program.validate() {
        Ok(types) => copies::layout(program, !store_runs(program, &types).0.is_empty()),
        Err(_) => Layout::One,
    }
}

/// [`lower`] in layout `layout` (which must be [`Layout::One`] for a program with store
/// runs).
fn lower_as(program: &Program, layout: &Layout) -> Result<String> {
    let types = program.validate()?;
    if program.buffers.len() > MAX_BUFFERS {
        return Err(Error::InvalidProgram {
            program: program.name.clone(),
            detail: format!(
                "{} buffers; a CUDA kernel's parameters hold at most {MAX_BUFFERS}",
                program.buffers.len()
            ),
        });
    }
    let (runs, run_of) = store_runs(program, &types);
    let mut src = String::from(PRELUDE);
    if types.contains(&Some(ScalarType::F64)) {
        src += F64_HELPERS;
    }
    src += "\nextern \"C\" __global__ void program(i64 n, u32* fault";
    for (b, p) in program.buffers.iter().enumerate() {
        let _ = write!(src, ", {}* b{b}, i64 len{b}", storage(p.dtype));
    }
    src += ") {\n";
    let longest = runs.iter().map(|r| r.values.len()).max().unwrap_or(0);
    if let Some(dtype) = staged_type(&runs) {
        let _ = writeln!(
            src,
            "  __shared__ {} stage_[{}];",
            storage(dtype),
            STAGED_BLOCK * longest
        );
    }
    if *layout == Layout::One || !runs.is_empty() {
        src += "  GRID_STRIDE(t_, n) {\n  u32 t = (u32)t_;\n";
        // The thread's first failed bounds check: (index, bound), reported after the element.
        src += "  bool bad_ = false; i64 bad_at_ = 0, bad_len_ = 0;\n";
        src += &render_body(program, &types, &CudaC, "  ", |n| run_of[n].is_some());
        for run in &runs {
            emit_store_run(&mut src, run, longest);
        }
    } else {
        copies::emit(&mut src, program, &types, layout);
    }
    src += "  if (bad_) report_fault(fault, bad_at_, bad_len_, 0u);\n  }\n}\n";
    Ok(src)
}

fn nvrtc_error(program: &Program, what: &str, detail: String) -> Error {
    Error::InvalidProgram {
        program: program.name.clone(),
        detail: format!("NVRTC {what}: {detail}"),
    }
}

/// Lowers, compiles for the device's architecture and loads `program`.
pub(crate) fn compile(dev: &Device, program: &Program) -> Result<CudaKernel> {
    // SAFETY: only tries to open the library.
    if !unsafe { rtc_sys::is_culib_present() } {
        return Err(Error::Unavailable {
            backend: "cuda",
            reason: "NVRTC (libnvrtc.so.13) was not found; scalar programs need it".into(),
        });
    }
    // The layout is decided once: the source and the launch's grid must agree on it.
    let layout = layout_of(program);
    let source = lower_as(program, &layout)?;
    let per_thread = layout.per_thread();
    let (major, minor) = dev.compute_capability;
    let opts = [
        format!("--gpu-architecture=sm_{major}{minor}"),
        "--std=c++17".to_string(),
        // The IR rounds each operation once (a fused multiply-add only where the program says
        // Fma): NVRTC must not contract a multiply and an add on its own.
        "--fmad=false".to_string(),
    ];
    // The on-disk cache's identity: the source, the options, NVRTC's version.
    let identity = crate::cubin_cache::folder().map(|_| {
        let (mut v0, mut v1) = (0i32, 0i32);
        // SAFETY: writes two integers.
        let _ = unsafe { rtc_sys::nvrtcVersion(&mut v0, &mut v1) };
        let version = format!("nvrtc {v0}.{v1}");
        let mut parts: Vec<&[u8]> = vec![source.as_bytes(), version.as_bytes()];
        parts.extend(opts.iter().map(|o| o.as_bytes()));
        crate::cubin_cache::identity(&parts)
    });
    if let (Some(dir), Some(id)) = (crate::cubin_cache::folder(), &identity) {
        if let Some(cubin) = crate::cubin_cache::load(dir, id) {
            // An image the driver refuses is compiled again below.
            if let Ok(kernel) = load_cubin(program, &source, &cubin, per_thread) {
                return Ok(kernel);
            }
        }
    }
    let csrc = CString::new(source.clone()).expect("generated source has no NUL");
    let prog = rtc::create_program(&csrc, None)
        .map_err(|e| nvrtc_error(program, "create", format!("{e:?}")))?;
    // SAFETY: a live program; options are plain strings.
    let compiled = unsafe { rtc::compile_program(prog, &opts) };
    if let Err(e) = compiled {
        // SAFETY: a live program.
        let log = unsafe { rtc::get_program_log(prog) }
            .map(|l| {
                let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        // SAFETY: a live program, destroyed once; nothing uses it after.
        unsafe {
            let _ = rtc::destroy_program(prog);
        }
        return Err(nvrtc_error(program, "compile", format!("{e:?}\n{log}")));
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; the buffer is sized by the first call.
    let cubin = unsafe {
        rtc_sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .and_then(|_| {
                let mut buf = vec![0u8; size];
                rtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _)
                    .result()
                    .map(|_| buf)
            })
    };
    // SAFETY: a live program, destroyed once; the CUBIN was copied out above.
    unsafe {
        let _ = rtc::destroy_program(prog);
    }
    let cubin = cubin.map_err(|e| nvrtc_error(program, "CUBIN", format!("{e:?}")))?;
    if let (Some(dir), Some(id)) = (crate::cubin_cache::folder(), &identity) {
        crate::cubin_cache::store(dir, id, &cubin);
    }
    load_cubin(program, &source, &cubin, per_thread)
}

/// Loads a CUBIN compiled from `source` (the lowering of `program`, `per_thread` launch
/// indices a thread) as its kernel.
fn load_cubin(
    program: &Program,
    source: &str,
    cubin: &[u8],
    per_thread: u32,
) -> Result<CudaKernel> {
    // SAFETY: a CUBIN image for this device; the module is never unloaded (kernels are cached
    // for the backend's lifetime).
    let module = unsafe { drv::module::load_data(cubin.as_ptr() as *const c_void) }
        .map_err(|e| driver_error("loading an NVRTC module", e))?;
    // SAFETY: the module loaded above holds the entry point `program` (the lowering names it).
    let function =
        unsafe { drv::module::get_function(module, CString::new("program").expect("name")) }
            .map_err(|e| driver_error("cuModuleGetFunction", e))?;
    Ok(CudaKernel {
        program: Arc::new(program.clone()),
        per_thread,
        function: Func::plain(function, profile_name(&program.name)),
        source: Arc::new(source.to_string()),
    })
}

/// An IR kernel's name in profiles: its program's, kept for the life of the process (once per
/// compiled program, and only while profiling; otherwise one shared name).
fn profile_name(program: &str) -> &'static str {
    if crate::profile::requested() {
        Box::leak(format!("ir {program}").into_boxed_str())
    } else {
        "ir"
    }
}

pub(crate) fn compile_cached(gpu: &CudaBackend, program: &Program) -> Result<CudaKernel> {
    gpu.kernels.get_or_compile(program, |p| {
        gpu.dev.bind()?;
        compile(&gpu.dev, p)
    })
}

pub(crate) fn launch(
    gpu: &CudaBackend,
    kernel: &CudaKernel,
    args: &[&CudaBuffer],
    n: usize,
) -> Result<()> {
    validate::launch(&kernel.program, args, n)?;
    gpu.dev.bind()?;
    if n == 0 {
        return Ok(());
    }
    let mut a = Args::new().arg(n as i64).arg(gpu.dev.fault.ptr);
    for b in args {
        a = a.arg(b.ptr()).arg(b.len() as i64);
    }
    gpu.dev.fault_pending.store(true, Ordering::Release);
    // A thread per element or per `copies` of them (the kernel's grid-stride loop runs
    // once): for these kernels that measured faster than a capped grid looping; the loop
    // covers grids beyond the hardware limit.
    let per_block = device::BLOCK as usize * kernel.per_thread as usize;
    gpu.dev.launch_raw(
        kernel.function,
        (n.div_ceil(per_block).min(i32::MAX as usize) as u32, 1, 1),
        device::BLOCK,
        a,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use hal::DType;
    use hal::ir::{Access, ProgramBuilder};

    #[test]
    fn lowering_declares_every_buffer_and_checks_bounds() {
        let mut b = ProgramBuilder::new("axpy");
        let a = b.buffer(DType::F32, Access::Read);
        let x = b.buffer(DType::F16, Access::Read);
        let y = b.buffer(DType::F32, Access::ReadWrite);
        let i = b.index();
        let (av, xv, yv) = (b.load(a, i), b.load(x, i), b.load(y, i));
        let r = b.fma(av, xv, yv);
        b.store(y, i, r);
        let program = b.build().unwrap();
        let src = lower_as(&program, &Layout::One).unwrap();
        assert!(src.contains("float* b0, i64 len0, u16* b1, i64 len1, float* b2, i64 len2"));
        assert!(src.contains("f16_to_f32(b1["));
        // Four checks, each noting its failure; one report per element.
        assert_eq!(src.matches("if (!bad_)").count(), 4, "{src}");
        assert_eq!(src.matches("report_fault(fault").count(), 1, "{src}");
        // A short program runs several indices a thread: each copy's checks, and the tail's
        // (here all three accesses at the index are vectors, unchecked in the whole case).
        let layout = layout_of(&program);
        assert!(matches!(layout, Layout::Vector(_)), "{layout:?}");
        let src = lower(&program).unwrap();
        assert_eq!(src.matches("if (!bad_)").count(), 4, "{src}");
        assert_eq!(src.matches("report_fault(fault").count(), 1, "{src}");
    }
}
