//! The scalar program IR lowered to WGSL: one `let` per SSA value, bounds-checked loads and
//! stores, float atomic adds as compare-and-swap loops on the bits.
//!
//! Binding 0 holds the launch parameters (the length of each buffer in the scalar slots),
//! bindings `1..=k` the program's buffers, binding `k+1` the device's fault record: the first
//! out-of-range access of any launch stores `(1, index, bound, 0)` there, the access
//! itself yields 0 or is dropped, and the backend reports it as
//! [`hal::Error::IndexOutOfRange`] at the next synchronize or read (one read for all launches).

use crate::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::pipeline::Params;
use crate::wgsl::{self, Access};
use hal::ir::{Access as IrAccess, Constant, Inst, IrBinary, IrUnary, Program, ScalarType};
use hal::{DType, Error, Result};
use hal::{DeviceBuffer, validate};
use std::fmt::Write;
use std::sync::Arc;

/// A compiled program: its pipeline and the WGSL it came from.
#[derive(Clone)]
pub struct WgpuKernel {
    pub(crate) program: Arc<Program>,
    pub(crate) pipeline: Arc<crate::pipeline::Kernel>,
    pub(crate) source: Arc<String>,
}

impl WgpuKernel {
    /// The generated WGSL, for inspection and for `xtask wgsl`.
    pub fn wgsl(&self) -> &str {
        &self.source
    }
}

impl std::fmt::Debug for WgpuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuKernel({})", self.program.name)
    }
}

fn ty(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F32 => "f32",
        ScalarType::I32 => "i32",
        ScalarType::U32 => "u32",
        ScalarType::Bool => "bool",
    }
}

fn zero(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F32 => "0.0",
        ScalarType::I32 => "0",
        ScalarType::U32 => "0u",
        ScalarType::Bool => "false",
    }
}

/// WGSL source for `program` (already validated).
pub fn lower(program: &Program, features: wgsl::Features) -> Result<String> {
    let types = program.validate()?;
    let k = program.buffers.len();
    if k > 14 {
        return Err(Error::InvalidProgram {
            program: program.name.clone(),
            detail: format!("{k} buffers; the wgpu backend binds at most 14"),
        });
    }
    let atomic_target: Vec<bool> = (0..k)
        .map(|b| {
            program
                .insts
                .iter()
                .any(|i| matches!(i, Inst::AtomicAdd { buffer, .. } if buffer.0 as usize == b))
        })
        .collect();
    let mut src = if features.immediate_words > 0 {
        wgsl::prelude(&[wgsl::immediate_params(features.immediate_words)])
    } else {
        wgsl::prelude(&[])
    };
    for (b, p) in program.buffers.iter().enumerate() {
        let access = match p.access {
            IrAccess::Read => Access::Read,
            _ if atomic_target[b] => Access::Atomic,
            _ => Access::Write,
        };
        src += &wgsl::binding(b as u32 + 1, p.dtype, access, features.native_f16);
    }
    let f = k + 1;
    let _ = writeln!(
        src,
        "@group(0) @binding({f}) var<storage, read_write> F: array<atomic<u32>>;"
    );
    // The first fault claims the record; op code 0 says an IR program's (see lib.rs).
    src += "fn fault(b: u32, i: u32) { if (atomicExchange(&F[0], 1u) == 0u) { atomicStore(&F[1], i); atomicStore(&F[2], s(b)); atomicStore(&F[3], 0u); } }\n";
    let mut body = wgsl::touch(k) + "    _ = arrayLength(&F);\n";
    let v = |x: hal::ir::Value| format!("v{}", x.0);
    for (n, inst) in program.insts.iter().enumerate() {
        let t = types[n];
        let line = match *inst {
            Inst::Index => "t".to_string(),
            Inst::Const(c) => match c {
                Constant::F32(bits) => format!("bitcast<f32>({bits}u)"),
                Constant::I32(x) => format!("bitcast<i32>({}u)", x as u32),
                Constant::U32(x) => format!("{x}u"),
                Constant::Bool(x) => x.to_string(),
            },
            Inst::Load { buffer, index } => {
                let b = buffer.0 + 1;
                let dt = program.buffers[buffer.0 as usize].dtype;
                let load = match dt {
                    DType::F32 | DType::F16 | DType::BF16 => format!("ld{b}(i32({}))", v(index)),
                    DType::I32 => format!("bitcast<i32>(bits{b}(i32({})))", v(index)),
                    DType::U32 => format!("bits{b}(i32({}))", v(index)),
                };
                let tt = t.expect("loads define a value");
                let _ = writeln!(body, "    var v{n}: {} = {};", ty(tt), zero(tt));
                let _ = writeln!(
                    body,
                    "    if ({} < s({}u)) {{ v{n} = {load}; }} else {{ fault({}u, {}); }}",
                    v(index),
                    buffer.0,
                    buffer.0,
                    v(index)
                );
                continue;
            }
            Inst::Store {
                buffer,
                index,
                value,
                ..
            }
            | Inst::AtomicAdd {
                buffer,
                index,
                value,
            } => {
                let b = buffer.0 + 1;
                let dt = program.buffers[buffer.0 as usize].dtype;
                let (i, x) = (v(index), v(value));
                let op = if matches!(inst, Inst::AtomicAdd { .. }) {
                    match dt {
                        DType::F32 => format!(
                            "loop {{ let old = atomicLoad(&B{b}[{i}]); let r = atomicCompareExchangeWeak(&B{b}[{i}], old, bitcast<u32>(bitcast<f32>(old) + {x})); if (r.exchanged) {{ break; }} }}"
                        ),
                        DType::I32 => format!("atomicAdd(&B{b}[{i}], bitcast<u32>({x}));"),
                        _ => format!("atomicAdd(&B{b}[{i}], {x});"),
                    }
                } else {
                    match dt {
                        DType::F32 | DType::F16 | DType::BF16 => format!("st{b}(i32({i}), {x});"),
                        DType::I32 => format!("stbits{b}(i32({i}), bitcast<u32>({x}));"),
                        DType::U32 => format!("stbits{b}(i32({i}), {x});"),
                    }
                };
                let guarded = format!(
                    "if ({i} < s({}u)) {{ {op} }} else {{ fault({}u, {i}); }}",
                    buffer.0, buffer.0
                );
                let _ = match *inst {
                    Inst::Store { when: Some(w), .. } => {
                        writeln!(body, "    if ({}) {{ {guarded} }}", v(w))
                    }
                    _ => writeln!(body, "    {guarded}"),
                };
                continue;
            }
            Inst::Unary { op, x } => {
                let (a, xt) = (v(x), types[x.0 as usize].expect("typed"));
                match (op, xt) {
                    (IrUnary::Neg, ScalarType::U32) => format!("0u - {a}"),
                    (IrUnary::Neg, _) => format!("-{a}"),
                    (IrUnary::Abs, ScalarType::U32) => a,
                    (IrUnary::Abs, _) => format!("abs({a})"),
                    (IrUnary::Not, ScalarType::Bool) => format!("!{a}"),
                    (IrUnary::Not, _) => format!("~{a}"),
                    (IrUnary::Sqrt, _) => format!("sqrt({a})"),
                    (IrUnary::Rsqrt, _) => format!("1.0 / sqrt({a})"),
                    (IrUnary::Recip, _) => format!("1.0 / {a}"),
                    (IrUnary::Exp, _) => format!("exp({a})"),
                    (IrUnary::Exp2, _) => format!("exp2({a})"),
                    (IrUnary::Log, _) => format!("log_ref({a})"),
                    (IrUnary::Log2, _) => format!("log2_ref({a})"),
                    (IrUnary::Sin, _) => format!("sin({a})"),
                    (IrUnary::Cos, _) => format!("cos({a})"),
                    (IrUnary::Tan, _) => format!("tan({a})"),
                    (IrUnary::Tanh, _) => format!("tanh_ref({a})"),
                    (IrUnary::Floor, _) => format!("floor({a})"),
                    (IrUnary::Ceil, _) => format!("ceil({a})"),
                }
            }
            Inst::Binary { op, a, b } => {
                let (x, y, at) = (v(a), v(b), types[a.0 as usize].expect("typed"));
                let int = matches!(at, ScalarType::I32 | ScalarType::U32);
                let zero = zero(at);
                match op {
                    IrBinary::Add => format!("{x} + {y}"),
                    IrBinary::Sub => format!("{x} - {y}"),
                    IrBinary::Mul => format!("{x} * {y}"),
                    IrBinary::Div if int => format!("select({x} / {y}, {zero}, {y} == {zero})"),
                    // As BinaryOp::Div in wgsl/ops.rs: a huge divisor is scaled first.
                    IrBinary::Div => format!(
                        "select({x} / {y}, ({x} * 0.25) / ({y} * 0.25), abs({y}) > 8.507059e37)"
                    ),
                    IrBinary::Rem if int => format!("select({x} % {y}, {zero}, {y} == {zero})"),
                    IrBinary::Rem => format!("fmod({x}, {y})"),
                    IrBinary::Min => format!("min({x}, {y})"),
                    IrBinary::Max => format!("max({x}, {y})"),
                    IrBinary::Pow => format!("pow_ref({x}, {y})"),
                    IrBinary::Atan2 => format!("atan2_ref({x}, {y})"),
                    IrBinary::And => format!("{x} & {y}"),
                    IrBinary::Or => format!("{x} | {y}"),
                    IrBinary::Xor if at == ScalarType::Bool => format!("{x} != {y}"),
                    IrBinary::Xor => format!("{x} ^ {y}"),
                    IrBinary::Shl => format!("{x} << (u32({y}) & 31u)"),
                    IrBinary::Shr => format!("{x} >> (u32({y}) & 31u)"),
                }
            }
            // WGSL's float `!=` is ordered (false with a NaN); C's, and the reference's, is
            // not: written as the negation of `==`.
            Inst::Cmp {
                op: hal::ir::IrCmp::Ne,
                a,
                b,
            } if types[a.0 as usize] == Some(ScalarType::F32) => {
                format!("!({} == {})", v(a), v(b))
            }
            Inst::Cmp { op, a, b } => format!("{} {} {}", v(a), op.operator(), v(b)),
            Inst::Fma { a, b, c } => format!("fma({}, {}, {})", v(a), v(b), v(c)),
            Inst::Select { cond, a, b } => format!("select({}, {}, {})", v(b), v(a), v(cond)),
            Inst::Cast { to, x } => {
                use ScalarType::*;
                let (a, from) = (v(x), types[x.0 as usize].expect("typed"));
                match (from, to) {
                    (p, q) if p == q => a,
                    (F32, I32) => format!("f2i({a})"),
                    (F32, U32) => format!("f2u({a})"),
                    // A NaN is true, as in C (see Cmp above).
                    (F32, Bool) => format!("!({a} == 0.0)"),
                    (I32, Bool) | (U32, Bool) => format!("{a} != {}", zero(from)),
                    (I32, F32) | (U32, F32) => format!("f32({a})"),
                    (Bool, F32) => format!("select(0.0, 1.0, {a})"),
                    (Bool, I32) => format!("select(0, 1, {a})"),
                    (Bool, U32) => format!("select(0u, 1u, {a})"),
                    (I32, U32) => format!("bitcast<u32>({a})"),
                    (U32, I32) => format!("bitcast<i32>({a})"),
                    _ => unreachable!("every pair is covered"),
                }
            }
        };
        let _ = writeln!(body, "    let v{n}: {} = {line};", ty(t.expect("value")));
    }
    src += &wgsl::entry(&body);
    // Enable directives come before everything else.
    src.insert_str(0, wgsl::enable_directives(&src));
    Ok(src)
}

pub(crate) fn compile(gpu: &WgpuBackend, program: &Program) -> Result<WgpuKernel> {
    gpu.0.kernels.get_or_compile(program, |program| {
        let features = gpu.module_features();
        let words = features.immediate_words;
        let source = lower(program, features)?;
        // The kernel cache is this pipeline's cache: no string key to collide on.
        let module = wgsl::Module::generated("<ir program>", source.clone());
        let pipeline = gpu.build_pipeline(&program.name, &module, false, words, None)?;
        Ok(WgpuKernel {
            program: Arc::new(program.clone()),
            pipeline,
            source: Arc::new(source),
        })
    })
}

pub(crate) fn launch(
    gpu: &WgpuBackend,
    kernel: &WgpuKernel,
    args: &[&WgpuBuffer],
    n: usize,
) -> Result<()> {
    let prog = &kernel.program;
    validate::launch(prog, args, n)?;
    if n == 0 {
        return Ok(());
    }
    let mut p = Params::default();
    for (i, a) in args.iter().enumerate().take(15) {
        p = p.scalar(i, a.len() as u32);
    }
    let mut bufs: Vec<(&WgpuBuffer, bool)> = args
        .iter()
        .zip(&prog.buffers)
        .map(|(a, d)| (*a, d.access != hal::ir::Access::Read))
        .collect();
    bufs.push((&gpu.0.faults, true));
    gpu.dispatch(&kernel.pipeline, &p, &bufs, n)?;
    gpu.faults_may_be_written();
    Ok(())
}
