//! The scalar program IR lowered to CUDA C and compiled by NVRTC to a CUBIN for the device's
//! architecture. One statement per SSA value; loads and stores are bounds-checked against the
//! buffer lengths passed with the pointers, and the first out-of-range access of any launch is
//! written to the device's fault record (op code 0) and reported at the next synchronize.
//!
//! Kernel signature: `(i64 n, u32* fault, T0* b0, i64 len0, T1* b1, i64 len1, ...)`.

use crate::device::{Device, Func, driver_error};
use cudarc::driver::result as drv;
use cudarc::nvrtc::{result as rtc, sys as rtc_sys};
use hal::ir::{Constant, Inst, IrBinary, IrUnary, Program, ScalarType};
use hal::{DType, Error, Result};
use std::ffi::{CString, c_void};
use std::fmt::Write;
use std::sync::Arc;

/// `cuda/common.cuh`, the prelude of every generated kernel (it includes no toolkit header, so
/// NVRTC needs none).
const PRELUDE: &str = include_str!("../../../cuda/common.cuh");

/// A compiled program.
#[derive(Clone)]
pub struct CudaKernel {
    pub(crate) program: Arc<Program>,
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

fn ty(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F32 => "float",
        ScalarType::I32 => "int",
        ScalarType::U32 => "u32",
        ScalarType::Bool => "bool",
    }
}

fn storage(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 | DType::BF16 => "u16",
        DType::I32 => "int",
        DType::U32 => "u32",
    }
}

/// CUDA C source of `program`, whose kernel is named `program`.
pub fn lower(program: &Program) -> Result<String> {
    let types = program.validate()?;
    let mut src = String::from(PRELUDE);
    src += "\nextern \"C\" __global__ void program(i64 n, u32* fault";
    for (b, p) in program.buffers.iter().enumerate() {
        let _ = write!(src, ", {}* b{b}, i64 len{b}", storage(p.dtype));
    }
    src += ") {\n  GRID_STRIDE(t_, n) {\n  u32 t = (u32)t_;\n";
    let v = |x: hal::ir::Value| format!("v{}", x.0);
    for (n, inst) in program.insts.iter().enumerate() {
        let t = types[n];
        let line = match *inst {
            Inst::Index => "t".to_string(),
            Inst::Const(c) => match c {
                Constant::F32(bits) => format!("__uint_as_float({bits}u)"),
                Constant::I32(x) => format!("(int){}u", x as u32),
                Constant::U32(x) => format!("{x}u"),
                Constant::Bool(x) => x.to_string(),
            },
            Inst::Load { buffer, index } => {
                let b = buffer.0;
                let i = v(index);
                let load = match program.buffers[b as usize].dtype {
                    DType::F16 => format!("f16_to_f32(b{b}[{i}])"),
                    DType::BF16 => format!("bf16_to_f32(b{b}[{i}])"),
                    _ => format!("b{b}[{i}]"),
                };
                let tt = ty(t.expect("loads define a value"));
                let _ = writeln!(
                    src,
                    "  {tt} v{n} = ({tt})0; if ((i64){i} < len{b}) v{n} = {load}; else report_fault(fault, {i}, len{b}, 0u);"
                );
                continue;
            }
            Inst::Store {
                buffer,
                index,
                value,
            }
            | Inst::AtomicAdd {
                buffer,
                index,
                value,
            } => {
                let b = buffer.0;
                let dt = program.buffers[b as usize].dtype;
                let (i, x) = (v(index), v(value));
                let op = if matches!(inst, Inst::AtomicAdd { .. }) {
                    match dt {
                        DType::F16 | DType::BF16 => {
                            format!("atomic_add_f(b{b}, {}, {i}, {x});", crate::dtype_code(dt))
                        }
                        _ => format!("atomicAdd(&b{b}[{i}], {x});"),
                    }
                } else {
                    match dt {
                        DType::F16 => format!("b{b}[{i}] = (u16)f32_to_f16({x});"),
                        DType::BF16 => format!("b{b}[{i}] = (u16)f32_to_bf16({x});"),
                        _ => format!("b{b}[{i}] = {x};"),
                    }
                };
                let _ = writeln!(
                    src,
                    "  if ((i64){i} < len{b}) {{ {op} }} else report_fault(fault, {i}, len{b}, 0u);"
                );
                continue;
            }
            Inst::Unary { op, x } => {
                let (a, xt) = (v(x), types[x.0 as usize].expect("typed"));
                match (op, xt) {
                    (IrUnary::Neg, ScalarType::U32) => format!("0u - {a}"),
                    (IrUnary::Neg, ScalarType::I32) => format!("(int)(0u - (u32){a})"),
                    (IrUnary::Neg, _) => format!("-{a}"),
                    (IrUnary::Abs, ScalarType::U32) => a,
                    (IrUnary::Abs, ScalarType::I32) => {
                        format!("({a} < 0 ? (int)(0u - (u32){a}) : {a})")
                    }
                    (IrUnary::Abs, _) => format!("fabsf({a})"),
                    (IrUnary::Not, ScalarType::Bool) => format!("!{a}"),
                    (IrUnary::Not, _) => format!("~{a}"),
                    (IrUnary::Sqrt, _) => format!("sqrtf({a})"),
                    (IrUnary::Rsqrt, _) => format!("1.0f / sqrtf({a})"),
                    (IrUnary::Recip, _) => format!("1.0f / {a}"),
                    (IrUnary::Exp, _) => format!("expf({a})"),
                    (IrUnary::Exp2, _) => format!("exp2f({a})"),
                    (IrUnary::Log, _) => format!("logf({a})"),
                    (IrUnary::Log2, _) => format!("log2f({a})"),
                    (IrUnary::Sin, _) => format!("sinf({a})"),
                    (IrUnary::Cos, _) => format!("cosf({a})"),
                    (IrUnary::Tan, _) => format!("tanf({a})"),
                    (IrUnary::Tanh, _) => format!("tanhf({a})"),
                    (IrUnary::Floor, _) => format!("floorf({a})"),
                    (IrUnary::Ceil, _) => format!("ceilf({a})"),
                }
            }
            Inst::Binary { op, a, b } => {
                let (x, y, at) = (v(a), v(b), types[a.0 as usize].expect("typed"));
                use ScalarType::*;
                match (op, at) {
                    (IrBinary::Add, I32) => format!("(int)((u32){x} + (u32){y})"),
                    (IrBinary::Sub, I32) => format!("(int)((u32){x} - (u32){y})"),
                    (IrBinary::Mul, I32) => format!("(int)((u32){x} * (u32){y})"),
                    (IrBinary::Add, _) => format!("{x} + {y}"),
                    (IrBinary::Sub, _) => format!("{x} - {y}"),
                    (IrBinary::Mul, _) => format!("{x} * {y}"),
                    (IrBinary::Div, I32) => {
                        format!("({y} == 0 ? 0 : ({y} == -1 ? (int)(0u - (u32){x}) : {x} / {y}))")
                    }
                    (IrBinary::Div, U32) => format!("({y} == 0u ? 0u : {x} / {y})"),
                    (IrBinary::Div, _) => format!("{x} / {y}"),
                    (IrBinary::Rem, I32) => format!("(({y} == 0 || {y} == -1) ? 0 : {x} % {y})"),
                    (IrBinary::Rem, U32) => format!("({y} == 0u ? 0u : {x} % {y})"),
                    (IrBinary::Rem, _) => format!("fmodf({x}, {y})"),
                    (IrBinary::Min, F32) => format!("fminf({x}, {y})"),
                    (IrBinary::Max, F32) => format!("fmaxf({x}, {y})"),
                    (IrBinary::Min, _) => format!("({x} < {y} ? {x} : {y})"),
                    (IrBinary::Max, _) => format!("({x} > {y} ? {x} : {y})"),
                    (IrBinary::Pow, _) => format!("powf({x}, {y})"),
                    (IrBinary::Atan2, _) => format!("atan2f({x}, {y})"),
                    (IrBinary::And, Bool) => format!("{x} && {y}"),
                    (IrBinary::Or, Bool) => format!("{x} || {y}"),
                    (IrBinary::Xor, Bool) => format!("{x} != {y}"),
                    (IrBinary::And, _) => format!("{x} & {y}"),
                    (IrBinary::Or, _) => format!("{x} | {y}"),
                    (IrBinary::Xor, _) => format!("{x} ^ {y}"),
                    (IrBinary::Shl, I32) => format!("(int)((u32){x} << ((u32){y} & 31u))"),
                    (IrBinary::Shl, _) => format!("{x} << ((u32){y} & 31u)"),
                    (IrBinary::Shr, _) => format!("{x} >> ((u32){y} & 31u)"),
                }
            }
            Inst::Cmp { op, a, b } => format!("{} {} {}", v(a), op.operator(), v(b)),
            Inst::Fma { a, b, c } => format!("fmaf({}, {}, {})", v(a), v(b), v(c)),
            Inst::Select { cond, a, b } => format!("{} ? {} : {}", v(cond), v(a), v(b)),
            Inst::Cast { to, x } => {
                use ScalarType::*;
                let (a, from) = (v(x), types[x.0 as usize].expect("typed"));
                match (from, to) {
                    (p, q) if p == q => a,
                    (F32, I32) => format!("f2i({a})"),
                    (F32, U32) => format!("f2u({a})"),
                    (F32, Bool) | (I32, Bool) | (U32, Bool) => format!("{a} != 0"),
                    (I32, F32) | (U32, F32) => format!("(float){a}"),
                    (Bool, F32) => format!("({a} ? 1.0f : 0.0f)"),
                    (Bool, I32) => format!("({a} ? 1 : 0)"),
                    (Bool, U32) => format!("({a} ? 1u : 0u)"),
                    (I32, U32) => format!("(u32){a}"),
                    (U32, I32) => format!("(int){a}"),
                    _ => unreachable!("every pair is covered"),
                }
            }
        };
        let _ = writeln!(src, "  {} v{n} = {line};", ty(t.expect("value")));
    }
    src += "  }\n}\n";
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
    let source = lower(program)?;
    let csrc = CString::new(source.clone()).expect("generated source has no NUL");
    let prog = rtc::create_program(&csrc, None)
        .map_err(|e| nvrtc_error(program, "create", format!("{e:?}")))?;
    let (major, minor) = dev.compute_capability;
    let opts = [
        format!("--gpu-architecture=sm_{major}{minor}"),
        "--std=c++17".to_string(),
        // The IR rounds each operation once (a fused multiply-add only where the program says
        // Fma): NVRTC must not contract a multiply and an add on its own.
        "--fmad=false".to_string(),
    ];
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
    unsafe {
        let _ = rtc::destroy_program(prog);
    }
    let cubin = cubin.map_err(|e| nvrtc_error(program, "CUBIN", format!("{e:?}")))?;
    // SAFETY: a CUBIN image for this device; the module is never unloaded (kernels are cached
    // for the backend's lifetime).
    let module = unsafe { drv::module::load_data(cubin.as_ptr() as *const c_void) }
        .map_err(|e| driver_error("loading an NVRTC module", e))?;
    let function =
        unsafe { drv::module::get_function(module, CString::new("program").expect("name")) }
            .map_err(|e| driver_error("cuModuleGetFunction", e))?;
    Ok(CudaKernel {
        program: Arc::new(program.clone()),
        function: Func::plain(function),
        source: Arc::new(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let src = lower(&b.build().unwrap()).unwrap();
        assert!(src.contains("float* b0, i64 len0, u16* b1, i64 len1, float* b2, i64 len2"));
        assert!(src.contains("f16_to_f32(b1["));
        assert_eq!(src.matches("report_fault(fault").count(), 4, "{src}");
    }
}
