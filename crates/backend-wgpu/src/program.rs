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
struct Wgsl {
    /// IEEE f32 arithmetic ([`IEEE_F32`]): where the device's `fma()` is fused.
    ieee: bool,
}

/// IEEE f32 arithmetic for IR programs on devices whose `fma()` is fused (probed:
/// `WgpuBackend::fma_is_fused`), so that they agree bit for bit with the CPU reference and
/// CUDA where the IR asks for exact arithmetic (vlc's exact mode: means of cluster members,
/// Huber weights, anchor updates). A GPU's WGSL may compute `a / b` and `sqrt(x)` a few ulps
/// off (WGSL allows 2.5 and more) and may fuse a multiply into the add that consumes it.
///
/// - `div_rn`, `sqrt_rn`: the device's result refined by one Newton step to within an ulp,
///   whose residual (`a - q b`, `x - s^2`) an `fma` then computes exactly; the sign of the
///   residual at the midpoint between that result and its neighbour toward the true value
///   picks the correctly rounded one (neither a quotient nor a square root of floats is ever
///   a midpoint). Outside `2^-50 <= |a|, |b| <= 2^50` and `2^-60 <= x <= 2^60` (where a
///   residual could underflow or a product overflow), and for zeros, infinities and NaN,
///   the device's result stands; a huge divisor is scaled first, as `BinaryOp::Div` does (a
///   reciprocal of `|b| > 2^126` flushes to zero).
/// - `keep_ir`: every f32 product passes through an XOR with scalar 15 (always 0 in IR
///   launches), which no compiler can see through, so it is rounded before any add.
///
/// Where `fma()` is not fused (lavapipe: a multiply and an add) residuals are not exact, and
/// the plain operations are kept: lavapipe's arithmetic is the CPU's, correctly rounded.
const IEEE_F32: &str = "
fn keep_ir(v: f32) -> f32 { return bitcast<f32>(bitcast<u32>(v) ^ s(15u)); }
fn div_rn(a: f32, b: f32) -> f32 {
    let q0 = select(a / b, (a * 0.25) / (b * 0.25), abs(b) > 8.507059e37);
    let aa = abs(a);
    let ab = abs(b);
    if (!(aa >= 8.881784e-16 && aa <= 1.1258999e15 && ab >= 8.881784e-16 && ab <= 1.1258999e15)) {
        return q0;
    }
    let q1 = fma(fma(-q0, b, a), 1.0 / b, q0);
    let r1 = fma(-q1, b, a);
    if (r1 == 0.0) { return q1; }
    // a / b lies beyond |q1| (away from zero) when r1 / b has q1's sign.
    let away = ((r1 > 0.0) == (b > 0.0)) == (q1 > 0.0);
    let bits = bitcast<u32>(q1);
    let n = bitcast<f32>(select(bits - 1u, bits + 1u, away));
    let h = (n - q1) * 0.5;
    // a / b - (q1 + h) = (r1 - h b) / b: past the midpoint when that has h's sign.
    let t = fma(-h, b, r1);
    return select(q1, n, ((t > 0.0) == (b > 0.0)) == (h > 0.0));
}
fn sqrt_rn(x: f32) -> f32 {
    let s0 = sqrt(x);
    if (!(x >= 8.6736174e-19 && x <= 1.1529215e18)) { return s0; }
    let s1 = fma(fma(-s0, s0, x), 0.5 / s0, s0);
    let r1 = fma(-s1, s1, x);
    if (r1 == 0.0) { return s1; }
    let bits = bitcast<u32>(s1);
    let n = bitcast<f32>(select(bits - 1u, bits + 1u, r1 > 0.0));
    let h = (n - s1) * 0.5;
    // x - (s1 + h)^2 = (r1 - 2 h s1) - h^2; the first difference is exact wherever the
    // second could change its sign (Sterbenz), so the sign is right.
    let u = fma(-h, h, fma(-2.0 * h, s1, r1));
    return select(s1, n, (u > 0.0) == (h > 0.0));
}
";

/// Whether `program` multiplies, divides or takes a square root or reciprocal: operations
/// lowered differently once the device's `fma()` is known to be fused.
fn uses_ieee(program: &Program) -> bool {
    program.insts.iter().any(|i| match i {
        Inst::Binary { op, .. } => matches!(op, IrBinary::Mul | IrBinary::Div),
        Inst::Unary { op, .. } => matches!(op, IrUnary::Sqrt | IrUnary::Rsqrt | IrUnary::Recip),
        _ => false,
    })
}

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
/// such decimal), or a widened `f32` for infinities and NaN, which have no literal (made at
/// run time, as [`Wgsl::constant`] makes them in `f32`).
fn f64_literal(bits: u64) -> String {
    let v = f64::from_bits(bits);
    if v.is_finite() {
        format!("{v:e}lf")
    } else {
        let narrow = (v as f32).to_bits();
        format!("f64(f32_bits({narrow}u))")
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
            // Infinities and NaN through the prelude's `f32_bits`: WGSL refuses them as
            // constant expressions.
            Constant::F32(bits) if !f32::from_bits(bits).is_finite() => {
                format!("f32_bits({bits}u)")
            }
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
            (IrUnary::Sqrt, _) if self.ieee => format!("sqrt_rn({a})"),
            (IrUnary::Rsqrt, _) if self.ieee => format!("div_rn(1.0, sqrt_rn({a}))"),
            (IrUnary::Recip, _) if self.ieee => format!("div_rn(1.0, {a})"),
            (IrUnary::Sqrt, _) => format!("sqrt({a})"),
            (IrUnary::Rsqrt, _) => format!("1.0 / sqrt({a})"),
            (IrUnary::Recip, _) => format!("1.0 / {a}"),
            (IrUnary::Exp, _) => format!("exp_ref({a})"),
            (IrUnary::Exp2, _) => format!("exp2_ref({a})"),
            (IrUnary::Log, _) => format!("log_ref({a})"),
            (IrUnary::Log2, _) => format!("log2_ref({a})"),
            (IrUnary::Sin, _) => format!("sin_ref({a})"),
            (IrUnary::Cos, _) => format!("cos_ref({a})"),
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
            IrBinary::Mul if self.ieee && t == ScalarType::F32 => format!("keep_ir({x} * {y})"),
            IrBinary::Mul => format!("{x} * {y}"),
            IrBinary::Div if int => format!("select({x} / {y}, {zero}, {y} == {zero})"),
            IrBinary::Div if t == ScalarType::F64 => format!("div_f64({x}, {y})"),
            IrBinary::Div if self.ieee => format!("div_rn({x}, {y})"),
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
/// storage bindings a stage may use); fewer where the device allows fewer
/// ([`WgpuBackend::program_buffers`]).
pub(crate) const MAX_BUFFERS: usize = 14;

impl WgpuBackend {
    /// The most buffers an IR program may declare here: [`MAX_BUFFERS`], or fewer where the
    /// device binds fewer storage buffers per stage than they and the launch parameters and
    /// fault record need (a browser's WebGPU may allow 8 to 10).
    pub(crate) fn program_buffers(&self) -> usize {
        let per_stage = self.0.limits.max_storage_buffers_per_shader_stage as usize;
        MAX_BUFFERS.min(per_stage.saturating_sub(2))
    }
}

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
    let ieee = features.fused_fma == Some(true) && uses_ieee(program);
    if ieee {
        src += IEEE_F32;
    }
    let f = k + 1;
    let _ = writeln!(
        src,
        "@group(0) @binding({f}) var<storage, read_write> F: array<atomic<u32>>;"
    );
    // The first fault claims the record; op code 0 says an IR program's (see lib.rs).
    src += "fn fault(b: u32, i: u32) { if (atomicExchange(&F[0], 1u) == 0u) { atomicStore(&F[1], i); atomicStore(&F[2], s(b)); atomicStore(&F[3], 0u); } }\n";
    let mut body = wgsl::touch(k) + "    _ = arrayLength(&F);\n";
    body += &render_body(program, &types, &Wgsl { ieee }, "    ", |_| false);
    src += &wgsl::entry(&body);
    // Enable directives come before everything else.
    src.insert_str(0, wgsl::enable_directives(&src));
    Ok(src)
}

pub(crate) fn compile(gpu: &WgpuBackend, program: &Program) -> Result<WgpuKernel> {
    if uses_ieee(program) {
        // These operations are lowered by whether the device's fma() is fused (IEEE_F32):
        // probe it first (once per device; the probe program uses none of them).
        gpu.fma_is_fused()?;
    }
    let limit = gpu.program_buffers();
    if program.buffers.len() > limit {
        return Err(Error::InvalidProgram {
            program: program.name.clone(),
            detail: format!(
                "{} buffers; this device binds at most {limit} in one program",
                program.buffers.len()
            ),
        });
    }
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
