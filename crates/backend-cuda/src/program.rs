//! The scalar program IR lowered to CUDA C and compiled by NVRTC to a CUBIN for the device's
//! architecture. One statement per SSA value; loads and stores are bounds-checked against the
//! buffer lengths passed with the pointers (an out-of-range load reads 0, an out-of-range store
//! writes nothing), and the first out-of-range access of any launch is written to the device's
//! fault record (op code 0) and reported at the next synchronize. A thread notes its first
//! failed check in registers and reports it once, after its element: a report call (an atomic)
//! at every check would keep the compiler from issuing the loads together, which cost an
//! edge-length residual kernel half its speed.
//!
//! **Store runs**: stores of f32 values to a write-only f32 buffer at `base + 0, base + 1, ...,
//! base + K - 1` (one base value, every constant offset once; a residual kernel's Jacobian
//! entries) are held back to the end of the element and, where the warp's 32 lanes are all
//! live and their bases are `base_0 + lane * K`, written through shared memory as 32 x K
//! consecutive floats a lane at a time: one thread's K stores at a stride of K floats filled
//! each 32-byte sector a few bytes at a time (the same kernel's Jacobian stores took 0.52 ms of
//! 0.79; staged, the kernel took 0.36). Otherwise the stores go out one by one as before.
//!
//! **Copies**: a short program without store runs (an elementwise pass) runs several launch
//! indices a thread, `blockDim.x` apart so that a warp's accesses stay consecutive, with the
//! copies' statements interleaved one by one so that all their loads issue before any use.
//! One index a thread keeps too few bytes in flight to cover the memory's latency (GPT-2's
//! bf16 step: 35.4 -> 34.6 ms on an H200 with four). Indices are independent (the IR orders
//! only one index's instructions), so the interleaving changes no result.
//!
//! Kernel signature: `(i64 n, u32* fault, T0* b0, i64 len0, T1* b1, i64 len1, ...)`.

use crate::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::device::Args;
use crate::device::{self, Device, Func, driver_error};
use cudarc::driver::result as drv;
use cudarc::nvrtc::{result as rtc, sys as rtc_sys};
use hal::ir::render::{Dialect, render_body, render_statements};
use hal::ir::{Constant, Inst, IrBinary, IrUnary, Program, ScalarType};
use hal::{DType, Error, Result};
use hal::{DeviceBuffer, validate};
use std::ffi::{CString, c_void};
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// `cuda/common.cuh`, the prelude of every generated kernel (it includes no toolkit header, so
/// NVRTC needs none).
const PRELUDE: &str = include_str!("../../../cuda/common.cuh");

/// A compiled program.
#[derive(Clone)]
pub struct CudaKernel {
    pub(crate) program: Arc<Program>,
    /// Launch indices a thread runs ([`copies_per_thread`]).
    copies: u32,
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

/// CUDA C's spelling of the IR (see [`hal::ir::render`]).
struct CudaC;

fn ty(t: ScalarType) -> &'static str {
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
const F64_HELPERS: &str = "__device__ __forceinline__ int d2i(double v) { return v != v ? 0 : v >= 2147483647.0 ? 2147483647 : v <= -2147483648.0 ? (int)0x80000000u : (int)v; }
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

fn storage(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 | DType::BF16 => "u16",
        DType::I32 => "int",
        DType::U32 => "u32",
        DType::F64 => "double",
    }
}

/// The longest store run combined through shared memory (8 warps x 32 lanes x this many
/// floats of staging: 48 KiB; half as many doubles).
const MAX_RUN: usize = 48;

/// The staged element type of a program's store runs: every run is of the element type of
/// the program's first run (f32 or f64), so one staging array serves them all.
fn staged_type(runs: &[StoreRun]) -> Option<DType> {
    runs.first().map(|r| r.dtype)
}
/// Threads per block the staging is sized for (`device::BLOCK`).
const STAGED_BLOCK: usize = 256;

/// A run of stores `buffer[base + 0..len]`, each offset's value.
struct StoreRun {
    buffer: u32,
    base: u32,
    values: Vec<u32>,
    /// `F32` or `F64`.
    dtype: DType,
}

/// The store runs of `program` (see the module docs), and for each store instruction that
/// belongs to one, its run.
fn store_runs(
    program: &Program,
    types: &[Option<ScalarType>],
) -> (Vec<StoreRun>, Vec<Option<usize>>) {
    use std::collections::BTreeMap;
    /// Offset -> the (store instruction, value) pairs at it.
    type Offsets = BTreeMap<u32, Vec<(usize, u32)>>;
    // (buffer, base) -> its stores by offset.
    let mut groups: BTreeMap<(u32, u32), Offsets> = BTreeMap::new();
    for (n, inst) in program.insts.iter().enumerate() {
        // (Conditional stores stay where they are.)
        let Inst::Store {
            buffer,
            index,
            value,
            when: None,
        } = *inst
        else {
            continue;
        };
        let decl = program.buffers[buffer.0 as usize];
        let float = match decl.dtype {
            DType::F32 => ScalarType::F32,
            DType::F64 => ScalarType::F64,
            _ => continue,
        };
        if decl.access != hal::ir::Access::Write || types[value.0 as usize] != Some(float) {
            continue;
        }
        let Inst::Binary {
            op: IrBinary::Add,
            a,
            b,
        } = program.insts[index.0 as usize]
        else {
            continue;
        };
        let Inst::Const(Constant::U32(offset)) = program.insts[b.0 as usize] else {
            continue;
        };
        groups
            .entry((buffer.0, a.0))
            .or_default()
            .entry(offset)
            .or_default()
            .push((n, value.0));
    }
    // Deferring a store is safe where nothing else writes its buffer: one run per buffer,
    // covering every store to it (write-only buffers are never loaded).
    let mut writes: BTreeMap<u32, usize> = BTreeMap::new();
    for inst in &program.insts {
        if let Inst::Store { buffer, .. } | Inst::AtomicAdd { buffer, .. } = inst {
            *writes.entry(buffer.0).or_default() += 1;
        }
    }
    let mut bases: BTreeMap<u32, usize> = BTreeMap::new();
    for &(buffer, _) in groups.keys() {
        *bases.entry(buffer).or_default() += 1;
    }
    let mut runs = Vec::new();
    let mut member = vec![None; program.insts.len()];
    for ((buffer, base), offsets) in groups {
        let k = offsets.len();
        if bases[&buffer] != 1 || writes[&buffer] != k {
            continue;
        }
        let dtype = program.buffers[buffer as usize].dtype;
        let longest = MAX_RUN * 4 / dtype.size_in_bytes();
        if runs.first().is_some_and(|r: &StoreRun| r.dtype != dtype) {
            continue;
        }
        let whole = (2..=longest).contains(&k)
            && offsets.keys().copied().eq(0..k as u32)
            && offsets.values().all(|v| v.len() == 1);
        if !whole {
            continue;
        }
        for (n, _) in offsets.values().flatten() {
            member[*n] = Some(runs.len());
        }
        runs.push(StoreRun {
            buffer,
            base,
            values: offsets.values().map(|v| v[0].1).collect(),
            dtype,
        });
    }
    (runs, member)
}

/// The end-of-element code of a store run: combined through shared memory where the warp
/// allows, else one checked store at a time. Each warp owns `32 * longest` elements of the
/// staging (`longest`: the program's longest run), whatever the run's own length: slices
/// sized per run would let one warp's short run overlap another warp's long one.
fn emit_store_run(src: &mut String, run: &StoreRun, longest: usize) {
    let (b, base, k) = (run.buffer, run.base, run.values.len());
    let _ = writeln!(
        src,
        "  {{ const unsigned m_ = __activemask(); const u32 lane_ = threadIdx.x & 31u;"
    );
    let _ = writeln!(
        src,
        "    const u32 base_ = (u32)v{base}; const u32 first_ = __shfl_sync(m_, base_, 0);"
    );
    let _ = writeln!(
        src,
        "    if (m_ == 0xffffffffu && blockDim.x <= {STAGED_BLOCK}u && __all_sync(m_, base_ == first_ + lane_ * {k}u) && (i64)first_ + {} <= len{b}) {{",
        32 * k
    );
    let _ = writeln!(
        src,
        "      {}* st_ = stage_ + (threadIdx.x >> 5) * {};",
        storage(run.dtype),
        32 * longest
    );
    for (o, v) in run.values.iter().enumerate() {
        let _ = writeln!(src, "      st_[lane_ * {k}u + {o}u] = v{v};");
    }
    let _ = writeln!(src, "      __syncwarp();");
    let _ = writeln!(
        src,
        "      for (u32 j_ = 0; j_ < {k}u; ++j_) b{b}[first_ + j_ * 32u + lane_] = st_[j_ * 32u + lane_];"
    );
    let _ = writeln!(src, "      __syncwarp();\n    }} else {{");
    for (o, v) in run.values.iter().enumerate() {
        let i = format!("(base_ + {o}u)");
        let _ = writeln!(
            src,
            "      if ((i64){i} < len{b}) {{ b{b}[{i}] = v{v}; }} else {};",
            note_fault(&i, b)
        );
    }
    let _ = writeln!(src, "    }}\n  }}");
}

/// The most buffers a program declares: each takes a pointer and a length (16 bytes) of a
/// kernel's 4 KiB of parameters, after the count and the fault words.
pub(crate) const MAX_BUFFERS: usize = 240;

/// CUDA C source of `program`, whose kernel is named `program` (what `compile` hands NVRTC;
/// public as `backend_cuda::cuda_source`, for inspection without a GPU).
pub fn lower(program: &Program) -> Result<String> {
    lower_copies(program, copies_per_thread(program))
}

/// Launch indices a thread runs: [`COPIES`] for a short program without store runs (an
/// elementwise pass, memory-bound: one index a thread keeps too few loads in flight to cover
/// the memory's latency, most of all for 16-bit elements), else one.
fn copies_per_thread(program: &Program) -> u32 {
    let Ok(types) = program.validate() else {
        return 1;
    };
    if program.insts.len() <= MAX_COPIED_INSTS && store_runs(program, &types).0.is_empty() {
        copies_setting()
    } else {
        1
    }
}

/// See [`copies_per_thread`].
const COPIES: u32 = 4;

/// [`COPIES`], or `BACKEND_CUDA_IR_COPIES` (1 to 16) where set: for timing the choice.
fn copies_setting() -> u32 {
    static SETTING: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SETTING.get_or_init(|| {
        std::env::var("BACKEND_CUDA_IR_COPIES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|k| (1..=16).contains(k))
            .unwrap_or(COPIES)
    })
}
/// The longest program run [`COPIES`] times a thread: longer ones compute more than they move.
const MAX_COPIED_INSTS: usize = 64;

/// [`lower`] with `copies` launch indices a thread (1: one; more only for a program without
/// store runs).
pub(crate) fn lower_copies(program: &Program, copies: u32) -> Result<String> {
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
    let k = if runs.is_empty() { copies.max(1) } else { 1 };
    if k == 1 {
        src += "  GRID_STRIDE(t_, n) {\n  u32 t = (u32)t_;\n";
        // The thread's first failed bounds check: (index, bound), reported after the element.
        src += "  bool bad_ = false; i64 bad_at_ = 0, bad_len_ = 0;\n";
        src += &render_body(program, &types, &CudaC, "  ", |n| run_of[n].is_some());
        for run in &runs {
            emit_store_run(&mut src, run, longest);
        }
    } else {
        // A block covers `k` blocks' worth of consecutive indices, a thread every
        // `blockDim.x`-th of them; the copies' statements interleaved, so that their loads
        // issue together. A thread short of `k` indices runs the ones it has one by one.
        let _ = writeln!(
            src,
            "  const i64 step_ = (i64)gridDim.x * blockDim.x * {k};\n  \
             for (i64 t0_ = (i64)blockIdx.x * blockDim.x * {k} + threadIdx.x; t0_ < n; t0_ += step_) {{\n  \
             bool bad_ = false; i64 bad_at_ = 0, bad_len_ = 0;\n  \
             if (t0_ + {} * (i64)blockDim.x < n) {{",
            k - 1
        );
        let copies: Vec<Vec<String>> = (0..k)
            .map(|c| {
                let _ = writeln!(src, "  u32 t_{c} = (u32)(t0_ + {c} * (i64)blockDim.x);");
                render_statements(program, &types, &CudaC, &format!("_{c}"), |_| false)
            })
            .collect();
        for statement in 0..copies[0].len() {
            for copy in &copies {
                let _ = writeln!(src, "  {}", copy[statement]);
            }
        }
        src += "  } else {\n  for (i64 t_ = t0_; t_ < n; t_ += blockDim.x) {\n  u32 t = (u32)t_;\n";
        src += &render_body(program, &types, &CudaC, "  ", |_| false);
        src += "  }\n  }\n";
    }
    src += "  if (bad_) report_fault(fault, bad_at_, bad_len_, 0u);\n  }\n}\n";
    Ok(src)
}

/// The statement that notes a failed bounds check of index `i` against buffer `b`, unless the
/// thread already noted one.
fn note_fault(i: &str, b: u32) -> String {
    format!("if (!bad_) {{ bad_ = true; bad_at_ = (i64){i}; bad_len_ = len{b}; }}")
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
            if let Ok(kernel) = load_cubin(program, &source, &cubin) {
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
    load_cubin(program, &source, &cubin)
}

/// Loads a CUBIN compiled from `source` (the lowering of `program`) as its kernel.
fn load_cubin(program: &Program, source: &str, cubin: &[u8]) -> Result<CudaKernel> {
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
        copies: copies_per_thread(program),
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
    let per_block = device::BLOCK as usize * kernel.copies as usize;
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
        let src = lower_copies(&program, 1).unwrap();
        assert!(src.contains("float* b0, i64 len0, u16* b1, i64 len1, float* b2, i64 len2"));
        assert!(src.contains("f16_to_f32(b1["));
        // Four checks, each noting its failure; one report per element.
        assert_eq!(src.matches("if (!bad_)").count(), 4, "{src}");
        assert_eq!(src.matches("report_fault(fault").count(), 1, "{src}");
        // A short program runs several indices a thread: each copy's checks, and the tail's.
        let k = copies_per_thread(&program) as usize;
        assert!(k > 1);
        let src = lower(&program).unwrap();
        assert_eq!(src.matches("if (!bad_)").count(), 4 * (k + 1), "{src}");
        assert_eq!(src.matches("report_fault(fault").count(), 1, "{src}");
    }

    /// With several indices a thread, the copies' statements alternate (the loads of every
    /// copy come before any copy's arithmetic), each copy named apart; a thread short of its
    /// indices runs the plain body per index.
    #[test]
    fn copies_are_interleaved_statement_by_statement() {
        let mut b = ProgramBuilder::new("scale");
        let x = b.buffer(DType::BF16, Access::Read);
        let y = b.buffer(DType::BF16, Access::Write);
        let i = b.index();
        let v = b.load(x, i);
        let two = b.const_f32(2.0);
        let r = b.mul(v, two);
        b.store(y, i, r);
        let src = lower_copies(&b.build().unwrap(), 3).unwrap();
        let at = |needle: &str| {
            src.find(needle)
                .unwrap_or_else(|| panic!("{needle}: {src}"))
        };
        assert!(at("u32 t_2 = (u32)(t0_ + 2 * (i64)blockDim.x);") < at("float v1_0 = "));
        assert!(at("float v1_2 = ") < at("float v3_0 = v1_0 * v2_0;"));
        assert!(at("b1[v0_2] = ") < at("for (i64 t_ = t0_; t_ < n; t_ += blockDim.x)"));
        assert!(src.contains("t0_ + 2 * (i64)blockDim.x < n"), "{src}");
        assert!(src.contains("float v3 = v1 * v2;"), "{src}");
    }

    /// An f64 run is staged in doubles; runs longer than 24 doubles (48 KiB of staging) are
    /// stored one by one.
    #[test]
    fn f64_store_runs_are_staged_in_doubles() {
        let program = |k: u32| {
            let mut b = ProgramBuilder::new("wide");
            let x = b.buffer(DType::F64, Access::Read);
            let out = b.buffer(DType::F64, Access::Write);
            let i = b.index();
            let v = b.load(x, i);
            let kk = b.const_u32(k);
            let base = b.mul(i, kk);
            for o in 0..k {
                let oo = b.const_u32(o);
                let at = b.add(base, oo);
                b.store(out, at, v);
            }
            lower(&b.build().unwrap()).unwrap()
        };
        let six = program(6);
        assert!(six.contains("__shared__ double stage_[1536];"), "{six}");
        assert!(six.contains("double* st_ = stage_"), "{six}");
        assert!(!program(25).contains("stage_"));
    }

    /// `out[3 i + 0..3]` written as a run: combined through shared memory where the warp
    /// allows; with one more store to the same buffer, no run.
    #[test]
    fn store_runs_are_staged_only_where_nothing_else_writes_the_buffer() {
        let program = |extra: bool| {
            let mut b = ProgramBuilder::new("triple");
            let x = b.buffer(DType::F32, Access::Read);
            let out = b.buffer(DType::F32, Access::Write);
            let i = b.index();
            let v = b.load(x, i);
            let three = b.const_u32(3);
            let base = b.mul(i, three);
            for k in 0..3 {
                let kk = b.const_u32(k);
                let at = b.add(base, kk);
                b.store(out, at, v);
            }
            if extra {
                b.store(out, i, v);
            }
            lower_copies(&b.build().unwrap(), 1).unwrap()
        };
        let staged = program(false);
        assert!(staged.contains("__shared__ float stage_[768];"), "{staged}");
        assert!(
            staged.contains("__all_sync(m_, base_ == first_ + lane_ * 3u)"),
            "{staged}"
        );
        // Fallback: three checked stores; staged: one loop.
        assert_eq!(staged.matches("b1[(base_ + ").count(), 3, "{staged}");
        let plain = program(true);
        assert!(!plain.contains("stage_"), "{plain}");
        assert_eq!(plain.matches("{ b1[").count(), 4, "{plain}");

        // Two runs of different lengths: every warp's slice is sized for the longer, in both
        // (per-run slices once overlapped across warps and gave wrong values on a GPU).
        let mut b = ProgramBuilder::new("two_runs");
        let x = b.buffer(DType::F32, Access::Read);
        let (short, long) = (
            b.buffer(DType::F32, Access::Write),
            b.buffer(DType::F32, Access::Write),
        );
        let i = b.index();
        let v = b.load(x, i);
        for (out, k) in [(short, 2u32), (long, 5)] {
            let kk = b.const_u32(k);
            let base = b.mul(i, kk);
            for o in 0..k {
                let oo = b.const_u32(o);
                let at = b.add(base, oo);
                b.store(out, at, v);
            }
        }
        let two = lower(&b.build().unwrap()).unwrap();
        assert!(two.contains("__shared__ float stage_[1280];"), "{two}");
        assert_eq!(
            two.matches("stage_ + (threadIdx.x >> 5) * 160;").count(),
            2,
            "{two}"
        );
    }
}
