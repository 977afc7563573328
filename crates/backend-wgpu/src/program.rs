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
use hal::ir::render::{Dialect, render_body};
use hal::ir::{Access as IrAccess, Constant, Inst, IrBinary, IrCmp, IrUnary, Program, ScalarType};
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

/// WGSL's spelling of the IR (see [`hal::ir::render`]).
struct Wgsl;

fn zero(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F32 => "0.0",
        ScalarType::I32 => "0",
        ScalarType::U32 => "0u",
        ScalarType::Bool => "false",
        ScalarType::F64 => "0.0lf",
    }
}

/// An `f64` constant: a literal that parses to exactly these bits (Rust prints the shortest
/// such decimal), or a widened `f32` for infinities and NaN, which have no literal.
fn f64_literal(bits: u64) -> String {
    let v = f64::from_bits(bits);
    if v.is_finite() {
        format!("{v:e}lf")
    } else {
        let narrow = (v as f32).to_bits();
        format!("f64(bitcast<f32>({narrow}u))")
    }
}

/// What in `program` the backend cannot run in `f64` here (see [`hal::F64Support`]).
fn refuse_f64(program: &Program, types: &[Option<ScalarType>], f64: bool) -> Result<()> {
    if !types.contains(&Some(ScalarType::F64)) {
        return Ok(());
    }
    let refuse = |detail: String| Error::UnsupportedDType {
        op: "compile",
        dtype: DType::F64,
        detail: format!(" here: program `{}`: {detail}", program.name),
    };
    if !f64 {
        return Err(refuse(
            "the adapter does not offer shader-f64 and shader-int64".into(),
        ));
    }
    let wide = |v: hal::ir::Value| types[v.0 as usize] == Some(ScalarType::F64);
    for inst in &program.insts {
        if let Inst::AtomicAdd { value, .. } = *inst
            && wide(value)
        {
            return Err(refuse("WGSL has no 64-bit atomics".into()));
        }
    }
    Ok(())
}

impl Dialect for Wgsl {
    fn ty(&self, t: ScalarType) -> &'static str {
        match t {
            ScalarType::F32 => "f32",
            ScalarType::I32 => "i32",
            ScalarType::U32 => "u32",
            ScalarType::Bool => "bool",
            ScalarType::F64 => "f64",
        }
    }

    fn constant(&self, c: Constant) -> String {
        match c {
            Constant::F32(bits) => format!("bitcast<f32>({bits}u)"),
            Constant::I32(x) => format!("bitcast<i32>({}u)", x as u32),
            Constant::U32(x) => format!("{x}u"),
            Constant::Bool(x) => x.to_string(),
            Constant::F64(bits) => f64_literal(bits),
        }
    }

    fn unary(&self, op: IrUnary, t: ScalarType, a: &str) -> String {
        match (op, t) {
            (IrUnary::Sqrt, ScalarType::F64) => format!("sqrt_f64({a})"),
            (IrUnary::Rsqrt, ScalarType::F64) => format!("div_f64(1.0lf, sqrt_f64({a}))"),
            (IrUnary::Recip, ScalarType::F64) => format!("div_f64(1.0lf, {a})"),
            // math_wide.wgsl: GLSL.std.450 has none of these for 64-bit floats.
            (IrUnary::Exp, ScalarType::F64) => format!("exp_f64({a})"),
            (IrUnary::Exp2, ScalarType::F64) => format!("exp2_f64({a})"),
            (IrUnary::Log, ScalarType::F64) => format!("log_f64({a})"),
            (IrUnary::Log2, ScalarType::F64) => format!("log2_f64({a})"),
            (IrUnary::Sin, ScalarType::F64) => format!("sin_f64({a})"),
            (IrUnary::Cos, ScalarType::F64) => format!("cos_f64({a})"),
            (IrUnary::Tan, ScalarType::F64) => format!("tan_f64({a})"),
            (IrUnary::Tanh, ScalarType::F64) => format!("tanh_f64({a})"),
            (IrUnary::Neg, ScalarType::U32) => format!("0u - {a}"),
            (IrUnary::Neg, _) => format!("-{a}"),
            (IrUnary::Abs, ScalarType::U32) => a.to_string(),
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

    fn binary(&self, op: IrBinary, t: ScalarType, x: &str, y: &str) -> String {
        let int = matches!(t, ScalarType::I32 | ScalarType::U32);
        let zero = zero(t);
        match op {
            IrBinary::Add => format!("{x} + {y}"),
            IrBinary::Sub => format!("{x} - {y}"),
            IrBinary::Mul => format!("{x} * {y}"),
            IrBinary::Div if int => format!("select({x} / {y}, {zero}, {y} == {zero})"),
            IrBinary::Div if t == ScalarType::F64 => format!("div_f64({x}, {y})"),
            // As BinaryOp::Div in wgsl/ops.rs: a huge divisor is scaled first.
            IrBinary::Div => {
                format!("select({x} / {y}, ({x} * 0.25) / ({y} * 0.25), abs({y}) > 8.507059e37)")
            }
            IrBinary::Rem if int => format!("select({x} % {y}, {zero}, {y} == {zero})"),
            IrBinary::Rem if t == ScalarType::F64 => format!("fmod_f64({x}, {y})"),
            IrBinary::Pow if t == ScalarType::F64 => format!("pow_f64({x}, {y})"),
            IrBinary::Atan2 if t == ScalarType::F64 => format!("atan2_f64({x}, {y})"),
            IrBinary::Rem => format!("fmod({x}, {y})"),
            IrBinary::Min => format!("min({x}, {y})"),
            IrBinary::Max => format!("max({x}, {y})"),
            IrBinary::Pow => format!("pow_ref({x}, {y})"),
            IrBinary::Atan2 => format!("atan2_ref({x}, {y})"),
            IrBinary::And => format!("{x} & {y}"),
            IrBinary::Or => format!("{x} | {y}"),
            IrBinary::Xor if t == ScalarType::Bool => format!("{x} != {y}"),
            IrBinary::Xor => format!("{x} ^ {y}"),
            IrBinary::Shl => format!("{x} << (u32({y}) & 31u)"),
            IrBinary::Shr => format!("{x} >> (u32({y}) & 31u)"),
        }
    }

    /// WGSL's float `!=` is ordered (false with a NaN); C's, and the reference's, is not:
    /// written as the negation of `==`.
    fn cmp(&self, op: IrCmp, t: ScalarType, x: &str, y: &str) -> String {
        match (op, t) {
            (IrCmp::Ne, ScalarType::F32 | ScalarType::F64) => format!("!({x} == {y})"),
            _ => format!("{x} {} {y}", op.operator()),
        }
    }

    fn fma(&self, a: &str, b: &str, c: &str) -> String {
        format!("fma({a}, {b}, {c})")
    }

    fn fma_typed(&self, t: ScalarType, a: &str, b: &str, c: &str) -> String {
        match t {
            ScalarType::F64 => format!("fma_f64({a}, {b}, {c})"),
            _ => self.fma(a, b, c),
        }
    }

    fn select(&self, cond: &str, a: &str, b: &str) -> String {
        format!("select({b}, {a}, {cond})")
    }

    fn random_bits(&self, [k0, k1]: [&str; 2], [c0, c1]: [&str; 2]) -> String {
        format!("philox(vec4<u32>({c0}, {c1}, 0u, 0u), vec2<u32>({k0}, {k1})).x")
    }

    fn cast(&self, from: ScalarType, to: ScalarType, a: &str) -> String {
        use ScalarType::*;
        match (from, to) {
            (F64, I32) => format!("d2i({a})"),
            (F64, U32) => format!("d2u({a})"),
            (F64, Bool) => format!("!({a} == 0.0lf)"),
            (F64, F32) => format!("f32({a})"),
            (F32 | I32 | U32, F64) => format!("f64({a})"),
            (Bool, F64) => format!("select(0.0lf, 1.0lf, {a})"),
            (F32, I32) => format!("f2i({a})"),
            (F32, U32) => format!("f2u({a})"),
            // A NaN is true, as in C (see `cmp`).
            (F32, Bool) => format!("!({a} == 0.0)"),
            (I32, Bool) | (U32, Bool) => format!("{a} != {}", zero(from)),
            (I32, F32) | (U32, F32) => format!("f32({a})"),
            (Bool, F32) => format!("select(0.0, 1.0, {a})"),
            (Bool, I32) => format!("select(0, 1, {a})"),
            (Bool, U32) => format!("select(0u, 1u, {a})"),
            (I32, U32) => format!("bitcast<u32>({a})"),
            (U32, I32) => format!("bitcast<i32>({a})"),
            _ => unreachable!("every pair of different types is covered"),
        }
    }

    fn define(&self, name: &str, t: ScalarType, expr: &str) -> String {
        format!("let {name}: {} = {expr};", self.ty(t))
    }

    /// Binding `buffer + 1`, bounded by launch scalar `buffer` (its length).
    fn load(&self, name: &str, t: ScalarType, buffer: u32, dtype: DType, index: &str) -> String {
        let b = buffer + 1;
        let load = match dtype {
            DType::F32 | DType::F16 | DType::BF16 | DType::F64 => format!("ld{b}(i32({index}))"),
            DType::I32 => format!("bitcast<i32>(bits{b}(i32({index})))"),
            DType::U32 => format!("bits{b}(i32({index}))"),
        };
        format!(
            "var {name}: {} = {};\nif ({index} < s({buffer}u)) {{ {name} = {load}; }} else {{ fault({buffer}u, {index}); }}",
            self.ty(t),
            zero(t)
        )
    }

    fn store(&self, buffer: u32, dtype: DType, index: &str, value: &str, atomic: bool) -> String {
        let (b, i, x) = (buffer + 1, index, value);
        let op = match (atomic, dtype) {
            (true, DType::F32) => format!(
                "loop {{ let old = atomicLoad(&B{b}[{i}]); let r = atomicCompareExchangeWeak(&B{b}[{i}], old, bitcast<u32>(bitcast<f32>(old) + {x})); if (r.exchanged) {{ break; }} }}"
            ),
            (true, DType::I32) => format!("atomicAdd(&B{b}[{i}], bitcast<u32>({x}));"),
            (true, _) => format!("atomicAdd(&B{b}[{i}], {x});"),
            (false, DType::F32 | DType::F16 | DType::BF16 | DType::F64) => {
                format!("st{b}(i32({i}), {x});")
            }
            (false, DType::I32) => format!("stbits{b}(i32({i}), bitcast<u32>({x}));"),
            (false, DType::U32) => format!("stbits{b}(i32({i}), {x});"),
        };
        format!("if ({i} < s({buffer}u)) {{ {op} }} else {{ fault({buffer}u, {i}); }}")
    }
}

/// The most buffers a program binds (with its sizes buffer and fault words, within the
/// storage bindings a stage may use).
pub(crate) const MAX_BUFFERS: usize = 14;

/// WGSL source for `program` (already validated).
pub fn lower(program: &Program, features: wgsl::Features) -> Result<String> {
    let types = program.validate()?;
    refuse_f64(program, &types, features.f64)?;
    let k = program.buffers.len();
    if k > MAX_BUFFERS {
        return Err(Error::InvalidProgram {
            program: program.name.clone(),
            detail: format!("{k} buffers; the wgpu backend binds at most {MAX_BUFFERS}"),
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
    if types.contains(&Some(ScalarType::F64)) {
        src += wgsl::file("math_wide.wgsl").text;
    }
    let f = k + 1;
    let _ = writeln!(
        src,
        "@group(0) @binding({f}) var<storage, read_write> F: array<atomic<u32>>;"
    );
    // The first fault claims the record; op code 0 says an IR program's (see lib.rs).
    src += "fn fault(b: u32, i: u32) { if (atomicExchange(&F[0], 1u) == 0u) { atomicStore(&F[1], i); atomicStore(&F[2], s(b)); atomicStore(&F[3], 0u); } }\n";
    let mut body = wgsl::touch(k) + "    _ = arrayLength(&F);\n";
    body += &render_body(program, &types, &Wgsl, "    ", |_| false);
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
    // Scalar i is buffer i's length; scalar 15 stays 0 (`keep_f64` in math_wide.wgsl
    // multiplies by 1 - s(15)): a program binds at most 14 buffers (see `lower`).
    let mut p = Params::default();
    for (i, a) in args.iter().enumerate().take(14) {
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
