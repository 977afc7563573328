//! CUDA C's spelling of the IR: types, constants, math, and the bounds-checked loads and
//! stores that note a thread's first fault.

use hal::DType;
use hal::ir::render::Dialect;
use hal::ir::{Constant, IrBinary, IrUnary, ScalarType};

/// CUDA C's spelling of the IR (see [`hal::ir::render`]).
pub(super) struct CudaC;

/// The CUDA C name of a scalar type.
pub(super) fn ty(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F32 => "float",
        ScalarType::I32 => "int",
        ScalarType::U32 => "u32",
        ScalarType::Bool => "bool",
        ScalarType::F64 => "double",
    }
}

/// Helpers of `F64` programs, after the prelude: conversions to integers that truncate toward
/// zero and saturate, NaN to 0 (as the IR specifies and `f2i`/`f2u` do for `float`).
pub(super) const F64_HELPERS: &str = "__device__ __forceinline__ int d2i(double v) { return v != v ? 0 : v >= 2147483647.0 ? 2147483647 : v <= -2147483648.0 ? (int)0x80000000u : (int)v; }
__device__ __forceinline__ u32 d2u(double v) { return v != v ? 0u : v >= 4294967295.0 ? 4294967295u : v <= 0.0 ? 0u : (u32)v; }
";

/// The name of C's double-precision form of a `float` math function (`expf` -> `exp`).
fn double_math(call: String, t: ScalarType) -> String {
    if t != ScalarType::F64 {
        return call;
    }
    // `name(args)` or `1.0f / name(args)`: drop the `f` suffix of the function and of literals.
    call.replacen("f(", "(", 1).replace("1.0f", "1.0")
}

impl CudaC {
    /// The spelling for `float` and the integer types (`F64` takes its double forms from it,
    /// [`double_math`]).
    fn unary_f32(&self, op: IrUnary, t: ScalarType, a: &str) -> String {
        match (op, t) {
            (IrUnary::Neg, ScalarType::U32) => format!("0u - {a}"),
            (IrUnary::Neg, ScalarType::I32) => format!("(int)(0u - (u32){a})"),
            (IrUnary::Neg, _) => format!("-{a}"),
            (IrUnary::Abs, ScalarType::U32) => a.to_string(),
            (IrUnary::Abs, ScalarType::I32) => format!("({a} < 0 ? (int)(0u - (u32){a}) : {a})"),
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

    fn binary_f32(&self, op: IrBinary, t: ScalarType, x: &str, y: &str) -> String {
        use ScalarType::*;
        match (op, t) {
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

    fn cast_narrow(&self, from: ScalarType, to: ScalarType, a: &str) -> String {
        use ScalarType::*;
        match (from, to) {
            (F32, I32) => format!("f2i({a})"),
            (F32, U32) => format!("f2u({a})"),
            (F32, Bool) | (I32, Bool) | (U32, Bool) => format!("{a} != 0"),
            (I32, F32) | (U32, F32) => format!("(float){a}"),
            (Bool, F32) => format!("({a} ? 1.0f : 0.0f)"),
            (Bool, I32) => format!("({a} ? 1 : 0)"),
            (Bool, U32) => format!("({a} ? 1u : 0u)"),
            (I32, U32) => format!("(u32){a}"),
            (U32, I32) => format!("(int){a}"),
            _ => unreachable!("every pair of different types is covered"),
        }
    }
}

impl Dialect for CudaC {
    fn ty(&self, t: ScalarType) -> &'static str {
        ty(t)
    }

    fn constant(&self, c: Constant) -> String {
        match c {
            Constant::F32(bits) => format!("__uint_as_float({bits}u)"),
            Constant::I32(x) => format!("(int){}u", x as u32),
            Constant::U32(x) => format!("{x}u"),
            Constant::Bool(x) => x.to_string(),
            Constant::F64(bits) => format!("__longlong_as_double({bits}ll)", bits = bits as i64),
        }
    }

    fn unary(&self, op: IrUnary, t: ScalarType, a: &str) -> String {
        double_math(self.unary_f32(op, t, a), t)
    }

    fn binary(&self, op: IrBinary, t: ScalarType, x: &str, y: &str) -> String {
        use ScalarType::*;
        match (op, t) {
            (
                IrBinary::Rem | IrBinary::Min | IrBinary::Max | IrBinary::Pow | IrBinary::Atan2,
                F64,
            ) => double_math(self.binary_f32(op, F32, x, y), F64),
            _ => self.binary_f32(op, t, x, y),
        }
    }

    fn fma(&self, a: &str, b: &str, c: &str) -> String {
        // C++ overloads `fma` for float and double alike; `fmaf` would narrow a double.
        format!("fma({a}, {b}, {c})")
    }

    fn select(&self, cond: &str, a: &str, b: &str) -> String {
        format!("{cond} ? {a} : {b}")
    }

    fn random_bits(&self, [k0, k1]: [&str; 2], [c0, c1]: [&str; 2]) -> String {
        format!("random_bits({k0}, {k1}, {c0}, {c1})")
    }

    fn cast(&self, from: ScalarType, to: ScalarType, a: &str) -> String {
        use ScalarType::*;
        match (from, to) {
            (F64, I32) => format!("d2i({a})"),
            (F64, U32) => format!("d2u({a})"),
            (F64, Bool) => format!("{a} != 0.0"),
            (F64, F32) => format!("(float){a}"),
            (F32 | I32 | U32, F64) => format!("(double){a}"),
            (Bool, F64) => format!("({a} ? 1.0 : 0.0)"),
            _ => self.cast_narrow(from, to, a),
        }
    }

    fn define(&self, name: &str, t: ScalarType, expr: &str) -> String {
        format!("{} {name} = {expr};", ty(t))
    }

    fn load(&self, name: &str, t: ScalarType, buffer: u32, dtype: DType, index: &str) -> String {
        let (b, i, tt) = (buffer, index, ty(t));
        let load = match dtype {
            DType::F16 => format!("f16_to_f32(b{b}[{i}])"),
            DType::BF16 => format!("bf16_to_f32(b{b}[{i}])"),
            _ => format!("b{b}[{i}]"),
        };
        format!(
            "{tt} {name} = ({tt})0; if ((i64){i} < len{b}) {name} = {load}; else {};",
            note_fault(i, b)
        )
    }

    fn store(&self, buffer: u32, dtype: DType, index: &str, value: &str, atomic: bool) -> String {
        let (b, i, x) = (buffer, index, value);
        let op = match (atomic, dtype) {
            (true, DType::F16 | DType::BF16) => {
                format!(
                    "atomic_add_f(b{b}, {}, {i}, {x});",
                    crate::dtype_code(dtype)
                )
            }
            (true, _) => format!("atomicAdd(&b{b}[{i}], {x});"),
            (false, DType::F16) => format!("b{b}[{i}] = (u16)f32_to_f16({x});"),
            (false, DType::BF16) => format!("b{b}[{i}] = (u16)f32_to_bf16({x});"),
            (false, _) => format!("b{b}[{i}] = {x};"),
        };
        format!(
            "if ((i64){i} < len{b}) {{ {op} }} else {};",
            note_fault(i, b)
        )
    }
}

pub(super) fn storage(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 | DType::BF16 => "u16",
        DType::I32 => "int",
        DType::U32 => "u32",
        DType::F64 => "double",
    }
}

/// The statement that notes a failed bounds check of index `i` against buffer `b`, unless the
/// thread already noted one.
pub(super) fn note_fault(i: &str, b: u32) -> String {
    format!("if (!bad_) {{ bad_ = true; bad_at_ = (i64){i}; bad_len_ = len{b}; }}")
}
