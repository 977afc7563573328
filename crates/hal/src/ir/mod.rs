//! The scalar program IR: the open door for kernels that are not primitives (residuals and
//! their Jacobians, fused elementwise chains).
//!
//! A [`Program`] is straight-line typed SSA run once per launch index `i` in `0..n`: each
//! instruction defines at most one value, whose id is the instruction's position. Buffers are
//! declared up front with a dtype and an access mode and bound at launch. Conditionals are
//! expressed with [`Inst::Select`]; there are no loops or branches, which keeps every backend's
//! lowering trivial and the program hashable.
//!
//! ```
//! use hal::ir::{Access, ProgramBuilder, IrBinary};
//! use hal::DType;
//! // y[i] = a[i] * x[i] + y[i]
//! let mut b = ProgramBuilder::new("axpy");
//! let a = b.buffer(DType::F32, Access::Read);
//! let x = b.buffer(DType::F32, Access::Read);
//! let y = b.buffer(DType::F32, Access::ReadWrite);
//! let i = b.index();
//! let (av, xv, yv) = (b.load(a, i), b.load(x, i), b.load(y, i));
//! let r = b.fma(av, xv, yv);
//! b.store(y, i, r);
//! let program = b.build().unwrap();
//! assert_eq!(program.insts.len(), 6);
//! # let _ = IrBinary::Add;
//! ```
//!
//! Launch semantics (every backend): instructions run in order for each index; a load or store
//! outside its buffer is an error ([`Error::IndexOutOfRange`]) — the CPU backend reports it
//! when the launch returns, device backends when it is detected (a load then yields 0 and a
//! store is dropped); two indices storing to one element leave one of the values, unspecified
//! which; [`Inst::AtomicAdd`]s to one element all land, in an unspecified order. Nothing
//! orders one index's instructions against another's: a backend may run several indices in one
//! thread with their instructions interleaved (CUDA does, for short programs), so a program
//! whose index reads an element another index writes gets either value.

use crate::{DType, Error, Result};
use std::fmt;
use std::hash::{Hash, Hasher};

pub mod expr;
pub mod render;

/// The type of an SSA value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarType {
    F32,
    I32,
    U32,
    Bool,
    /// Double precision: loaded from and stored to `f64` buffers only, and converted to and
    /// from the other types by [`Inst::Cast`]. A backend whose device has no `f64` refuses a
    /// program that uses it ([`Error::UnsupportedDType`]).
    F64,
}

impl ScalarType {
    /// The value type a load from a buffer of `dtype` yields (16-bit float storage loads as
    /// `F32`).
    pub fn of_dtype(dtype: DType) -> ScalarType {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => ScalarType::F32,
            DType::F64 => ScalarType::F64,
            DType::I32 => ScalarType::I32,
            DType::U32 => ScalarType::U32,
        }
    }

    /// `F32` or `F64`.
    pub fn is_float(self) -> bool {
        matches!(self, ScalarType::F32 | ScalarType::F64)
    }
}

/// A value: the id of the instruction that defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub u32);

/// A buffer parameter: its position in the launch arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferId(pub u32);

/// How a program uses a buffer. Atomic adds need `ReadWrite`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

/// A declared buffer parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferParam {
    pub dtype: DType,
    pub access: Access,
}

/// A constant. Floats are stored as bits so programs hash and compare exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Constant {
    F32(u32),
    I32(i32),
    U32(u32),
    Bool(bool),
    F64(u64),
}

impl Constant {
    pub fn ty(self) -> ScalarType {
        match self {
            Constant::F32(_) => ScalarType::F32,
            Constant::F64(_) => ScalarType::F64,
            Constant::I32(_) => ScalarType::I32,
            Constant::U32(_) => ScalarType::U32,
            Constant::Bool(_) => ScalarType::Bool,
        }
    }
}

/// One-operand IR functions. Float-only (`F32` or `F64`, the result of the operand's type)
/// unless noted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IrUnary {
    /// Any numeric type (wrapping for integers).
    Neg,
    /// Any numeric type (wrapping for `i32::MIN`).
    Abs,
    Sqrt,
    Rsqrt,
    Recip,
    Exp,
    Exp2,
    Log,
    Log2,
    Sin,
    Cos,
    Tan,
    Tanh,
    Floor,
    Ceil,
    /// Bool or integer: logical / bitwise not.
    Not,
}

/// Two-operand IR functions; both operands have the same type, as does the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IrBinary {
    /// Numeric types; integers wrap.
    Add,
    Sub,
    Mul,
    /// Integer division truncates toward zero; division by zero gives 0 for integers.
    Div,
    /// Remainder with the sign of the dividend (C's `%`, `fmod` for floats); 0 for integer
    /// division by zero.
    Rem,
    /// Numeric; for floats the result with a NaN operand is unspecified.
    Min,
    Max,
    /// Float only.
    Pow,
    /// Float only: `atan2(a, b)`.
    Atan2,
    /// Bool or integer.
    And,
    Or,
    Xor,
    /// Integers: shift by `b mod 32`.
    Shl,
    Shr,
}

/// Comparisons; both operands have the same numeric type; the result is `Bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IrCmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl IrCmp {
    /// The infix operator of the comparison in C-family source (WGSL, CUDA C): `==`, `<`, ...
    pub fn operator(self) -> &'static str {
        match self {
            IrCmp::Eq => "==",
            IrCmp::Ne => "!=",
            IrCmp::Lt => "<",
            IrCmp::Le => "<=",
            IrCmp::Gt => ">",
            IrCmp::Ge => ">=",
        }
    }
}

/// One instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Inst {
    /// The launch index `i` (`U32`).
    Index,
    Const(Constant),
    /// Loads element `index` (`U32`) of a buffer.
    Load {
        buffer: BufferId,
        index: Value,
    },
    Unary {
        op: IrUnary,
        x: Value,
    },
    Binary {
        op: IrBinary,
        a: Value,
        b: Value,
    },
    Cmp {
        op: IrCmp,
        a: Value,
        b: Value,
    },
    /// `a * b + c` with one rounding (`F32` or `F64`, all three of one type).
    Fma {
        a: Value,
        b: Value,
        c: Value,
    },
    /// `cond ? a : b`.
    Select {
        cond: Value,
        a: Value,
        b: Value,
    },
    /// Numeric conversion: float to int truncates toward zero and saturates (NaN gives 0);
    /// `Bool` converts to and from 0/1.
    Cast {
        to: ScalarType,
        x: Value,
    },
    /// Stores `value` at element `index` (rounding floats to the buffer's dtype), only where
    /// `when` (a bool) is true if given: an index out of range is then a fault only where the
    /// store happens. Defines no value.
    Store {
        buffer: BufferId,
        index: Value,
        value: Value,
        when: Option<Value>,
    },
    /// Word 0 of Philox4x32-10 with counter `(counter[0], counter[1], 0, 0)` and key `key`
    /// (all `U32`; the result `U32`): [`crate::random::philox_words`]`(seed, position)[0]`
    /// for `key` = `seed`'s low and high words and `counter` = `position`'s, the bits
    /// [`crate::Backend::random`] draws a uniform from. So a program can make the random
    /// stream's decisions (a dropout mask, say) where it uses them, bit for bit as the
    /// `random` primitive would have. Key and counter are values (loaded from a buffer, say),
    /// not constants, so one compiled program serves every seed and position.
    RandomBits {
        key: [Value; 2],
        counter: [Value; 2],
    },
    /// Atomically adds `value` to element `index` of an `F32`, `F64`, `I32` or `U32` buffer
    /// (`F64` where the device has 64-bit float atomics). Defines no value.
    AtomicAdd {
        buffer: BufferId,
        index: Value,
        value: Value,
    },
}

impl Inst {
    /// The values this instruction reads.
    pub fn operands(&self) -> impl Iterator<Item = Value> {
        let ops: [Option<Value>; 3] = match *self {
            Inst::Index | Inst::Const(_) => [None, None, None],
            Inst::Load { index, .. } => [Some(index), None, None],
            Inst::Unary { x, .. } | Inst::Cast { x, .. } => [Some(x), None, None],
            // The fourth operand is chained on below.
            Inst::RandomBits { key, counter } => [Some(key[0]), Some(key[1]), Some(counter[0])],
            Inst::Binary { a, b, .. } | Inst::Cmp { a, b, .. } => [Some(a), Some(b), None],
            Inst::Fma { a, b, c } => [Some(a), Some(b), Some(c)],
            Inst::Select { cond, a, b } => [Some(cond), Some(a), Some(b)],
            Inst::Store {
                index, value, when, ..
            } => [Some(index), Some(value), when],
            Inst::AtomicAdd { index, value, .. } => [Some(index), Some(value), None],
        };
        let fourth = match *self {
            Inst::RandomBits { counter, .. } => Some(counter[1]),
            _ => None,
        };
        ops.into_iter().flatten().chain(fourth)
    }
}

/// A validated program: plain data, hashable, printable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Program {
    /// A name for reports and errors; not part of the structural hash.
    pub name: String,
    pub buffers: Vec<BufferParam>,
    pub insts: Vec<Inst>,
}

/// FNV-1a, 64-bit: a hasher whose output is the same in every process and on every machine,
/// so structural hashes can name cached kernels on disk too.
struct Fnv1a(u64);

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

impl Program {
    /// Checks that every operand is defined before use and that types, buffer ids and access
    /// modes agree; returns the type of each instruction's value (`None` for stores).
    pub fn validate(&self) -> Result<Vec<Option<ScalarType>>> {
        let err = |at: usize, detail: String| Error::InvalidProgram {
            program: self.name.clone(),
            detail: format!("instruction {at} ({:?}): {detail}", self.insts.get(at)),
        };
        let mut types: Vec<Option<ScalarType>> = Vec::with_capacity(self.insts.len());
        for (at, inst) in self.insts.iter().enumerate() {
            for v in inst.operands() {
                if v.0 as usize >= at || types[v.0 as usize].is_none() {
                    return Err(err(
                        at,
                        format!("operand %{} is not a value defined earlier", v.0),
                    ));
                }
            }
            let t = self.type_of(inst, &types).map_err(|d| err(at, d))?;
            types.push(t);
        }
        Ok(types)
    }

    /// The type of `inst`'s value (`None` for a store), its operands being of `types`; or
    /// what is wrong with it.
    fn type_of(
        &self,
        inst: &Inst,
        types: &[Option<ScalarType>],
    ) -> std::result::Result<Option<ScalarType>, String> {
        use ScalarType::*;
        let ty = |v: Value| types[v.0 as usize].expect("operands checked first");
        Ok(match *inst {
            Inst::Index => Some(U32),
            Inst::Const(c) => Some(c.ty()),
            Inst::Load { buffer: id, index } => {
                let p = self.buffer_param(id)?;
                if p.access == Access::Write {
                    return Err("load from a write-only buffer".into());
                }
                if ty(index) != U32 {
                    return Err("index must be u32".into());
                }
                Some(ScalarType::of_dtype(p.dtype))
            }
            Inst::Unary { op, x } => {
                let t = ty(x);
                let ok = match op {
                    IrUnary::Neg | IrUnary::Abs => t != Bool,
                    IrUnary::Not => !t.is_float(),
                    _ => t.is_float(),
                };
                if !ok {
                    return Err(format!("{op:?} does not take {t:?}"));
                }
                Some(t)
            }
            Inst::Binary { op, a, b } => {
                let (ta, tb) = (ty(a), ty(b));
                if ta != tb {
                    return Err(format!("operand types differ: {ta:?} and {tb:?}"));
                }
                let ok = match op {
                    IrBinary::Add
                    | IrBinary::Sub
                    | IrBinary::Mul
                    | IrBinary::Div
                    | IrBinary::Rem
                    | IrBinary::Min
                    | IrBinary::Max => ta != Bool,
                    IrBinary::Pow | IrBinary::Atan2 => ta.is_float(),
                    IrBinary::And | IrBinary::Or | IrBinary::Xor => !ta.is_float(),
                    IrBinary::Shl | IrBinary::Shr => ta == I32 || ta == U32,
                };
                if !ok {
                    return Err(format!("{op:?} does not take {ta:?}"));
                }
                Some(ta)
            }
            Inst::Cmp { a, b, .. } => {
                if ty(a) != ty(b) || ty(a) == Bool {
                    return Err(format!("cannot compare {:?} with {:?}", ty(a), ty(b)));
                }
                Some(Bool)
            }
            Inst::Fma { a, b, c } => {
                let t = ty(a);
                if !t.is_float() || ty(b) != t || ty(c) != t {
                    return Err("fma takes three f32 or three f64 operands".into());
                }
                Some(t)
            }
            Inst::Select { cond, a, b } => {
                if ty(cond) != Bool || ty(a) != ty(b) {
                    return Err("select needs a bool condition and operands of one type".into());
                }
                Some(ty(a))
            }
            Inst::Cast { to, .. } => Some(to),
            Inst::RandomBits { key, counter } => {
                if key.iter().chain(&counter).any(|&v| ty(v) != U32) {
                    return Err("random bits take a u32 key and counter".into());
                }
                Some(U32)
            }
            Inst::Store { .. } | Inst::AtomicAdd { .. } => {
                self.check_store(inst, ty)?;
                None
            }
        })
    }

    fn buffer_param(&self, id: BufferId) -> std::result::Result<BufferParam, String> {
        self.buffers
            .get(id.0 as usize)
            .copied()
            .ok_or_else(|| format!("buffer {} is not declared", id.0))
    }

    /// What is wrong with store or atomic add `inst`, if anything (`ty`: its operands'
    /// types).
    fn check_store(
        &self,
        inst: &Inst,
        ty: impl Fn(Value) -> ScalarType,
    ) -> std::result::Result<(), String> {
        let (Inst::Store {
            buffer: id,
            index,
            value,
            ..
        }
        | Inst::AtomicAdd {
            buffer: id,
            index,
            value,
        }) = *inst
        else {
            unreachable!("called on stores only")
        };
        let p = self.buffer_param(id)?;
        let atomic = matches!(inst, Inst::AtomicAdd { .. });
        if p.access == Access::Read || (atomic && p.access != Access::ReadWrite) {
            return Err(format!("buffer {} is declared {:?}", id.0, p.access));
        }
        if atomic && !matches!(p.dtype, DType::F32 | DType::F64 | DType::I32 | DType::U32) {
            return Err(format!("atomic add into {} is not supported", p.dtype));
        }
        if let Inst::Store { when: Some(w), .. } = *inst
            && ty(w) != ScalarType::Bool
        {
            return Err("a store's condition must be a bool".into());
        }
        if ty(index) != ScalarType::U32 {
            return Err("index must be u32".into());
        }
        if ty(value) != ScalarType::of_dtype(p.dtype) {
            return Err(format!(
                "a {:?} value cannot be stored into a {} buffer",
                ty(value),
                p.dtype
            ));
        }
        Ok(())
    }

    /// A hash of the program's structure (buffers and instructions, not its name), stable
    /// across processes: the key under which backends cache compiled kernels.
    pub fn structural_hash(&self) -> u64 {
        let mut h = Fnv1a(0xcbf2_9ce4_8422_2325);
        self.buffers.hash(&mut h);
        self.insts.hash(&mut h);
        h.finish()
    }

    /// For each instruction, the index of the last instruction that reads its value (itself
    /// when nothing does). Backends use it to reuse registers.
    pub fn last_uses(&self) -> Vec<usize> {
        let mut last: Vec<usize> = (0..self.insts.len()).collect();
        for (at, inst) in self.insts.iter().enumerate() {
            for v in inst.operands() {
                last[v.0 as usize] = at;
            }
        }
        last
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "program {} {{", self.name)?;
        for (i, p) in self.buffers.iter().enumerate() {
            writeln!(f, "  buffer b{i}: {} {:?}", p.dtype, p.access)?;
        }
        for (i, inst) in self.insts.iter().enumerate() {
            match inst {
                Inst::Store { .. } | Inst::AtomicAdd { .. } => writeln!(f, "  {inst:?}")?,
                _ => writeln!(f, "  %{i} = {inst:?}")?,
            }
        }
        write!(f, "}}")
    }
}

/// Compiled kernels keyed by structure: a program structurally equal to one compiled before
/// (same buffers and instructions, any name) gets the earlier kernel. Hash collisions are
/// resolved by comparing the programs. Backends keep one per device.
#[derive(Debug)]
pub struct KernelCache<K> {
    entries: std::sync::Mutex<std::collections::HashMap<u64, Vec<(Program, K)>>>,
}

impl<K> Default for KernelCache<K> {
    fn default() -> Self {
        Self {
            entries: Default::default(),
        }
    }
}

impl<K: Clone> KernelCache<K> {
    /// The cached kernel for `program`, or the one `compile` makes (then cached). The cache
    /// is not locked while `compile` runs, so threads compile different programs at once (two
    /// threads compiling one program both compile it; the first to finish is kept).
    pub fn get_or_compile(
        &self,
        program: &Program,
        compile: impl FnOnce(&Program) -> Result<K>,
    ) -> Result<K> {
        let hash = program.structural_hash();
        let find = |entries: &std::collections::HashMap<u64, Vec<(Program, K)>>| {
            entries.get(&hash).and_then(|bucket| {
                bucket
                    .iter()
                    .find(|(p, _)| p.buffers == program.buffers && p.insts == program.insts)
                    .map(|(_, k)| k.clone())
            })
        };
        if let Some(k) = find(&self.entries.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(k);
        }
        let kernel = compile(program)?;
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = find(&entries) {
            return Ok(k);
        }
        entries
            .entry(hash)
            .or_default()
            .push((program.clone(), kernel.clone()));
        Ok(kernel)
    }

    /// How many structurally distinct programs have been compiled.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .map(|e| e.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Appends instructions and returns their values. Type errors are reported by
/// [`ProgramBuilder::build`], which validates the whole program.
#[derive(Debug)]
pub struct ProgramBuilder {
    program: Program,
    /// Each instruction's type so far (`None` for stores and ill-typed instructions).
    types: Vec<Option<ScalarType>>,
}

impl ProgramBuilder {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            program: Program {
                name: name.into(),
                buffers: Vec::new(),
                insts: Vec::new(),
            },
            types: Vec::new(),
        }
    }

    /// The type of `v` as far as the instructions so far determine it (`None` where they are
    /// ill-typed: [`ProgramBuilder::build`] says how).
    pub fn type_of(&self, v: Value) -> Option<ScalarType> {
        self.types.get(v.0 as usize).copied().flatten()
    }

    /// Declares the next buffer parameter.
    pub fn buffer(&mut self, dtype: DType, access: Access) -> BufferId {
        self.program.buffers.push(BufferParam { dtype, access });
        BufferId(self.program.buffers.len() as u32 - 1)
    }

    /// Appends any instruction; returns the value it defines (meaningless for stores).
    pub fn push(&mut self, inst: Inst) -> Value {
        let defined = inst.operands().all(|v| self.type_of(v).is_some());
        let t = if defined {
            self.program.type_of(&inst, &self.types).ok().flatten()
        } else {
            None
        };
        self.types.push(t);
        self.program.insts.push(inst);
        Value(self.program.insts.len() as u32 - 1)
    }

    pub fn index(&mut self) -> Value {
        self.push(Inst::Index)
    }
    pub fn const_f32(&mut self, v: f32) -> Value {
        self.push(Inst::Const(Constant::F32(v.to_bits())))
    }
    pub fn const_f64(&mut self, v: f64) -> Value {
        self.push(Inst::Const(Constant::F64(v.to_bits())))
    }
    /// `v` as a constant of float type `ty` (`F32`: rounded to nearest; `F64`: exactly).
    pub fn const_float(&mut self, ty: ScalarType, v: f64) -> Value {
        match ty {
            ScalarType::F64 => self.const_f64(v),
            _ => self.const_f32(v as f32),
        }
    }
    pub fn const_u32(&mut self, v: u32) -> Value {
        self.push(Inst::Const(Constant::U32(v)))
    }
    pub fn const_i32(&mut self, v: i32) -> Value {
        self.push(Inst::Const(Constant::I32(v)))
    }
    pub fn const_bool(&mut self, v: bool) -> Value {
        self.push(Inst::Const(Constant::Bool(v)))
    }
    pub fn load(&mut self, buffer: BufferId, index: Value) -> Value {
        self.push(Inst::Load { buffer, index })
    }
    pub fn unary(&mut self, op: IrUnary, x: Value) -> Value {
        self.push(Inst::Unary { op, x })
    }
    pub fn binary(&mut self, op: IrBinary, a: Value, b: Value) -> Value {
        self.push(Inst::Binary { op, a, b })
    }
    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.binary(IrBinary::Add, a, b)
    }
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.binary(IrBinary::Sub, a, b)
    }
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.binary(IrBinary::Mul, a, b)
    }
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.binary(IrBinary::Div, a, b)
    }
    pub fn cmp(&mut self, op: IrCmp, a: Value, b: Value) -> Value {
        self.push(Inst::Cmp { op, a, b })
    }
    pub fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        self.push(Inst::Fma { a, b, c })
    }
    pub fn select(&mut self, cond: Value, a: Value, b: Value) -> Value {
        self.push(Inst::Select { cond, a, b })
    }
    pub fn cast(&mut self, to: ScalarType, x: Value) -> Value {
        self.push(Inst::Cast { to, x })
    }
    /// Word 0 of Philox under `key` at `counter` (low and high words: [`Inst::RandomBits`]).
    pub fn random_bits(&mut self, key: [Value; 2], counter: [Value; 2]) -> Value {
        self.push(Inst::RandomBits { key, counter })
    }
    pub fn store(&mut self, buffer: BufferId, index: Value, value: Value) {
        self.push(Inst::Store {
            buffer,
            index,
            value,
            when: None,
        });
    }
    /// A store that happens only where `when` (a bool) is true.
    pub fn store_if(&mut self, when: Value, buffer: BufferId, index: Value, value: Value) {
        self.push(Inst::Store {
            buffer,
            index,
            value,
            when: Some(when),
        });
    }
    pub fn atomic_add(&mut self, buffer: BufferId, index: Value, value: Value) {
        self.push(Inst::AtomicAdd {
            buffer,
            index,
            value,
        });
    }

    /// Validates and returns the program.
    pub fn build(self) -> Result<Program> {
        self.program.validate()?;
        Ok(self.program)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_catches_type_and_access_errors() {
        let mut b = ProgramBuilder::new("bad");
        let x = b.buffer(DType::F32, Access::Read);
        let i = b.index();
        let v = b.load(x, i);
        b.store(x, i, v); // store into a read-only buffer
        assert!(matches!(b.build(), Err(Error::InvalidProgram { .. })));

        let mut b = ProgramBuilder::new("bad2");
        let x = b.buffer(DType::F32, Access::ReadWrite);
        let i = b.index();
        let one = b.const_u32(1);
        let v = b.load(x, i);
        let s = b.add(v, one); // f32 + u32
        b.store(x, i, s);
        assert!(b.build().is_err());
    }

    #[test]
    fn structural_hash_ignores_the_name() {
        let make = |name: &str, c: f32| {
            let mut b = ProgramBuilder::new(name);
            let x = b.buffer(DType::F32, Access::ReadWrite);
            let i = b.index();
            let v = b.load(x, i);
            let k = b.const_f32(c);
            let r = b.mul(v, k);
            b.store(x, i, r);
            b.build().unwrap()
        };
        assert_eq!(
            make("a", 2.0).structural_hash(),
            make("b", 2.0).structural_hash()
        );
        assert_ne!(
            make("a", 2.0).structural_hash(),
            make("a", 3.0).structural_hash()
        );
    }
}
