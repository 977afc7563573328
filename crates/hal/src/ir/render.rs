//! One lowering of the IR to C-family source, shared by the WGSL and CUDA C backends.
//!
//! [`render_body`] walks a validated program once, one statement per instruction, each value
//! named `v{n}` after the instruction that defines it; a [`Dialect`] supplies every spelling
//! (types, constants, operators, casts) and the bounds-checked loads and stores. A backend
//! adds what only it has around the body: bindings or a kernel signature, the fault record,
//! the entry point. The CPU backend interprets programs instead and is the reference the
//! spellings are checked against.

use super::{Constant, Inst, IrBinary, IrCmp, IrUnary, Program, ScalarType, Value};
use crate::DType;

/// How a C-family target spells the IR.
pub trait Dialect {
    /// The name of a scalar type.
    fn ty(&self, t: ScalarType) -> &'static str;
    /// A constant as an expression.
    fn constant(&self, c: Constant) -> String;
    /// `op` applied to `a`, of type `t`.
    fn unary(&self, op: IrUnary, t: ScalarType, a: &str) -> String;
    /// `op` applied to `x` and `y`, both of type `t`.
    fn binary(&self, op: IrBinary, t: ScalarType, x: &str, y: &str) -> String;
    /// The comparison of `x` and `y`, both of type `t` (C's infix operators unless a target
    /// says otherwise).
    fn cmp(&self, op: IrCmp, t: ScalarType, x: &str, y: &str) -> String {
        let _ = t;
        format!("{x} {} {y}", op.operator())
    }
    /// `a * b + c` with one rounding.
    fn fma(&self, a: &str, b: &str, c: &str) -> String;
    /// [`Dialect::fma`] for operands of type `t` (a target whose `f64` fma needs its own
    /// spelling says so here).
    fn fma_typed(&self, t: ScalarType, a: &str, b: &str, c: &str) -> String {
        let _ = t;
        self.fma(a, b, c)
    }
    /// `cond ? a : b`.
    fn select(&self, cond: &str, a: &str, b: &str) -> String;
    /// Word 0 of Philox under key `(k0, k1)` at counter `(c0, c1, 0, 0)`
    /// ([`Inst::RandomBits`]).
    fn random_bits(&self, key: [&str; 2], counter: [&str; 2]) -> String;
    /// `a` converted from `from` to `to` (never the same type).
    fn cast(&self, from: ScalarType, to: ScalarType, a: &str) -> String;
    /// The statement that defines `name`, of type `t`, as `expr`.
    fn define(&self, name: &str, t: ScalarType, expr: &str) -> String;
    /// The statements that define `name`, of type `t`, as element `index` of buffer `buffer`
    /// (of `dtype`), or as 0 with the fault noted where `index` is out of range.
    fn load(&self, name: &str, t: ScalarType, buffer: u32, dtype: DType, index: &str) -> String;
    /// The statement that stores `value` at element `index` of buffer `buffer` (of `dtype`),
    /// or adds it atomically, or notes the fault where `index` is out of range.
    fn store(&self, buffer: u32, dtype: DType, index: &str, value: &str, atomic: bool) -> String;
}

/// The body of `program` in dialect `d`: a line per instruction, each starting with
/// `indent`, but for those `skip` leaves out (a target that emits them elsewhere). `types`:
/// what [`Program::validate`] returned. The launch index is the variable `t`.
pub fn render_body(
    program: &Program,
    types: &[Option<ScalarType>],
    d: &impl Dialect,
    indent: &str,
    skip: impl Fn(usize) -> bool,
) -> String {
    let mut out = String::new();
    for statement in render_statements(program, types, d, "", skip) {
        for l in statement.lines() {
            out.push_str(indent);
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// [`render_body`]'s statements one by one, in program order, with every name ending in
/// `suffix`: the values are `v{n}{suffix}` and the launch index `t{suffix}`. A target that
/// runs several launch indices in one thread renders a copy per index and may interleave
/// them statement by statement (indices are independent: the launch semantics order only
/// the instructions of one index).
pub fn render_statements(
    program: &Program,
    types: &[Option<ScalarType>],
    d: &impl Dialect,
    suffix: &str,
    skip: impl Fn(usize) -> bool,
) -> Vec<String> {
    let v = |x: Value| format!("v{}{suffix}", x.0);
    let ty = |x: Value| types[x.0 as usize].expect("validated: every operand has a type");
    let mut out = Vec::new();
    for (n, inst) in program.insts.iter().enumerate() {
        if skip(n) {
            continue;
        }
        let name = format!("v{n}{suffix}");
        let line = match *inst {
            Inst::Load { buffer, index } => {
                let dtype = program.buffers[buffer.0 as usize].dtype;
                let t = types[n].expect("loads define a value");
                d.load(&name, t, buffer.0, dtype, &v(index))
            }
            Inst::Store {
                buffer,
                index,
                value,
                when,
            } => {
                let dtype = program.buffers[buffer.0 as usize].dtype;
                let store = d.store(buffer.0, dtype, &v(index), &v(value), false);
                match when {
                    Some(w) => format!("if ({}) {{ {store} }}", v(w)),
                    None => store,
                }
            }
            Inst::AtomicAdd {
                buffer,
                index,
                value,
            } => {
                let dtype = program.buffers[buffer.0 as usize].dtype;
                d.store(buffer.0, dtype, &v(index), &v(value), true)
            }
            _ => {
                let expr = match *inst {
                    Inst::Index => format!("t{suffix}"),
                    Inst::Const(c) => d.constant(c),
                    Inst::Unary { op, x } => d.unary(op, ty(x), &v(x)),
                    Inst::Binary { op, a, b } => d.binary(op, ty(a), &v(a), &v(b)),
                    Inst::Cmp { op, a, b } => d.cmp(op, ty(a), &v(a), &v(b)),
                    Inst::Fma { a, b, c } => d.fma_typed(ty(a), &v(a), &v(b), &v(c)),
                    Inst::Select { cond, a, b } => d.select(&v(cond), &v(a), &v(b)),
                    Inst::Cast { to, x } if ty(x) == to => v(x),
                    Inst::Cast { to, x } => d.cast(ty(x), to, &v(x)),
                    Inst::RandomBits { key, counter } => {
                        d.random_bits([&v(key[0]), &v(key[1])], [&v(counter[0]), &v(counter[1])])
                    }
                    Inst::Load { .. } | Inst::Store { .. } | Inst::AtomicAdd { .. } => {
                        unreachable!("handled above")
                    }
                };
                d.define(&name, types[n].expect("defines a value"), &expr)
            }
        };
        out.push(line);
    }
    out
}
