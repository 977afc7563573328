//! IR programs written as formulas: [`Scope`] hands out [`Expr`] values that combine with
//! Rust's operators, each operation appending its instruction, so a kernel reads like the
//! update it computes:
//!
//! ```
//! use hal::ir::{Access, expr::Scope};
//! use hal::DType;
//! // v = momentum * v + t * (mean - anchor), as an IR program over one element a thread.
//! let s = Scope::new("momentum_step");
//! let (mean, anchor) = (s.buffer(DType::F32, Access::Read), s.buffer(DType::F32, Access::Read));
//! let v = s.buffer(DType::F32, Access::ReadWrite);
//! let i = s.index();
//! let step = s.load(v, i) * 0.9 + (s.load(mean, i) - s.load(anchor, i)) * 0.1;
//! s.store(v, i, step);
//! let program = s.build().unwrap();
//! assert_eq!(program.buffers.len(), 3);
//! ```
//!
//! Types are checked when the program is built ([`Program::validate`]), as with
//! [`ProgramBuilder`]; a float literal on either side of an operator is a constant of the
//! other operand's float type: `F32`, or `F64` holding the literal as written (`0.1` is
//! `0.1f64`, not the `f32` nearest to it widened).

use super::{
    Access, BufferId, Inst, IrBinary, IrCmp, IrUnary, Program, ProgramBuilder, ScalarType, Value,
};
use crate::{DType, Result};
use std::cell::RefCell;
use std::ops;

/// A program under construction whose values are [`Expr`]s.
#[derive(Debug)]
pub struct Scope {
    builder: RefCell<ProgramBuilder>,
}

/// A value of a program under construction, tied to its [`Scope`].
#[derive(Clone, Copy, Debug)]
pub struct Expr<'s> {
    scope: &'s Scope,
    value: Value,
}

impl Scope {
    pub fn new(name: impl Into<String>) -> Self {
        Scope {
            builder: RefCell::new(ProgramBuilder::new(name)),
        }
    }

    /// Declares the next buffer parameter.
    pub fn buffer(&self, dtype: DType, access: Access) -> BufferId {
        self.builder.borrow_mut().buffer(dtype, access)
    }

    /// The value `v` defined through [`Scope::with_builder`].
    pub fn expr(&self, value: Value) -> Expr<'_> {
        Expr { scope: self, value }
    }

    /// Runs `f` on the underlying builder, for helpers written against [`ProgramBuilder`].
    pub fn with_builder<R>(&self, f: impl FnOnce(&mut ProgramBuilder) -> R) -> R {
        f(&mut self.builder.borrow_mut())
    }

    fn push(&self, inst: Inst) -> Expr<'_> {
        let value = self.builder.borrow_mut().push(inst);
        self.expr(value)
    }

    /// The launch index (`U32`).
    pub fn index(&self) -> Expr<'_> {
        self.push(Inst::Index)
    }
    pub fn f32(&self, v: f32) -> Expr<'_> {
        let value = self.builder.borrow_mut().const_f32(v);
        self.expr(value)
    }
    pub fn f64(&self, v: f64) -> Expr<'_> {
        let value = self.builder.borrow_mut().const_f64(v);
        self.expr(value)
    }
    /// `v` as a constant of float type `ty` (`F32`: rounded to nearest; `F64`: exactly).
    pub fn float(&self, ty: ScalarType, v: f64) -> Expr<'_> {
        let value = self.builder.borrow_mut().const_float(ty, v);
        self.expr(value)
    }
    /// The literal `v` as a constant of `like`'s type (`F64`: the decimal `v` is written as).
    fn literal(&self, like: Value, v: f32) -> Expr<'_> {
        let ty = self.builder.borrow().type_of(like);
        match ty {
            Some(ScalarType::F64) => self.f64(v.to_string().parse().unwrap_or(v as f64)),
            _ => self.f32(v),
        }
    }
    pub fn u32(&self, v: u32) -> Expr<'_> {
        let value = self.builder.borrow_mut().const_u32(v);
        self.expr(value)
    }
    pub fn i32(&self, v: i32) -> Expr<'_> {
        let value = self.builder.borrow_mut().const_i32(v);
        self.expr(value)
    }
    pub fn bool(&self, v: bool) -> Expr<'_> {
        let value = self.builder.borrow_mut().const_bool(v);
        self.expr(value)
    }
    /// Element `index` of `buffer`.
    pub fn load<'s>(&'s self, buffer: BufferId, index: Expr<'s>) -> Expr<'s> {
        self.push(Inst::Load {
            buffer,
            index: index.value,
        })
    }
    /// Stores `value` at element `index` of `buffer`.
    pub fn store(&self, buffer: BufferId, index: Expr<'_>, value: Expr<'_>) {
        self.builder
            .borrow_mut()
            .store(buffer, index.value, value.value);
    }
    /// Stores `value` at element `index` of `buffer` where `when` is true.
    pub fn store_if(&self, when: Expr<'_>, buffer: BufferId, index: Expr<'_>, value: Expr<'_>) {
        self.builder
            .borrow_mut()
            .store_if(when.value, buffer, index.value, value.value);
    }
    /// Adds `value` to element `index` of `buffer` atomically.
    pub fn atomic_add(&self, buffer: BufferId, index: Expr<'_>, value: Expr<'_>) {
        self.builder
            .borrow_mut()
            .atomic_add(buffer, index.value, value.value);
    }
    /// Validates and returns the program.
    pub fn build(self) -> Result<Program> {
        self.builder.into_inner().build()
    }
}

impl<'s> Expr<'s> {
    /// The underlying IR value.
    pub fn value(self) -> Value {
        self.value
    }
    /// The value's type (`None` where the program is already ill-typed).
    pub fn ty(self) -> Option<ScalarType> {
        self.scope.builder.borrow().type_of(self.value)
    }
    fn unary(self, op: IrUnary) -> Self {
        self.scope.push(Inst::Unary { op, x: self.value })
    }
    fn binary(self, op: IrBinary, other: Self) -> Self {
        self.scope.push(Inst::Binary {
            op,
            a: self.value,
            b: other.value,
        })
    }
    fn cmp(self, op: IrCmp, other: Self) -> Self {
        self.scope.push(Inst::Cmp {
            op,
            a: self.value,
            b: other.value,
        })
    }
    pub fn sqrt(self) -> Self {
        self.unary(IrUnary::Sqrt)
    }
    pub fn rsqrt(self) -> Self {
        self.unary(IrUnary::Rsqrt)
    }
    pub fn recip(self) -> Self {
        self.unary(IrUnary::Recip)
    }
    pub fn exp(self) -> Self {
        self.unary(IrUnary::Exp)
    }
    pub fn log(self) -> Self {
        self.unary(IrUnary::Log)
    }
    pub fn tanh(self) -> Self {
        self.unary(IrUnary::Tanh)
    }
    pub fn abs(self) -> Self {
        self.unary(IrUnary::Abs)
    }
    pub fn floor(self) -> Self {
        self.unary(IrUnary::Floor)
    }
    pub fn min(self, other: Self) -> Self {
        self.binary(IrBinary::Min, other)
    }
    pub fn max(self, other: Self) -> Self {
        self.binary(IrBinary::Max, other)
    }
    pub fn pow(self, other: Self) -> Self {
        self.binary(IrBinary::Pow, other)
    }
    pub fn eq(self, other: Self) -> Self {
        self.cmp(IrCmp::Eq, other)
    }
    pub fn ne(self, other: Self) -> Self {
        self.cmp(IrCmp::Ne, other)
    }
    pub fn lt(self, other: Self) -> Self {
        self.cmp(IrCmp::Lt, other)
    }
    pub fn le(self, other: Self) -> Self {
        self.cmp(IrCmp::Le, other)
    }
    pub fn gt(self, other: Self) -> Self {
        self.cmp(IrCmp::Gt, other)
    }
    pub fn ge(self, other: Self) -> Self {
        self.cmp(IrCmp::Ge, other)
    }
    /// `self * b + c` with one rounding.
    pub fn fma(self, b: Self, c: Self) -> Self {
        self.scope.push(Inst::Fma {
            a: self.value,
            b: b.value,
            c: c.value,
        })
    }
    /// `self ? a : b` (`self` a bool).
    pub fn select(self, a: Self, b: Self) -> Self {
        self.scope.push(Inst::Select {
            cond: self.value,
            a: a.value,
            b: b.value,
        })
    }
    /// `self` converted to `to`.
    pub fn cast(self, to: ScalarType) -> Self {
        self.scope.push(Inst::Cast { to, x: self.value })
    }
}

/// `Expr op Expr`, `Expr op f32` and `f32 op Expr` for each arithmetic operator.
macro_rules! binary_operators {
    ($($trait:ident $method:ident $op:ident),* $(,)?) => {$(
        impl<'s> ops::$trait for Expr<'s> {
            type Output = Expr<'s>;
            fn $method(self, other: Expr<'s>) -> Expr<'s> {
                self.binary(IrBinary::$op, other)
            }
        }
        impl<'s> ops::$trait<f32> for Expr<'s> {
            type Output = Expr<'s>;
            fn $method(self, other: f32) -> Expr<'s> {
                let other = self.scope.literal(self.value, other);
                self.binary(IrBinary::$op, other)
            }
        }
        impl<'s> ops::$trait<Expr<'s>> for f32 {
            type Output = Expr<'s>;
            fn $method(self, other: Expr<'s>) -> Expr<'s> {
                other.scope.literal(other.value, self).binary(IrBinary::$op, other)
            }
        }
    )*};
}

binary_operators!(Add add Add, Sub sub Sub, Mul mul Mul, Div div Div, Rem rem Rem);

/// Bitwise (integers) or logical (bools) operators between two values.
macro_rules! bit_operators {
    ($($trait:ident $method:ident $op:ident),* $(,)?) => {$(
        impl<'s> ops::$trait for Expr<'s> {
            type Output = Expr<'s>;
            fn $method(self, other: Expr<'s>) -> Expr<'s> {
                self.binary(IrBinary::$op, other)
            }
        }
    )*};
}

bit_operators!(BitAnd bitand And, BitOr bitor Or, BitXor bitxor Xor, Shl shl Shl, Shr shr Shr);

impl<'s> ops::Neg for Expr<'s> {
    type Output = Expr<'s>;
    fn neg(self) -> Expr<'s> {
        self.unary(IrUnary::Neg)
    }
}

impl<'s> ops::Not for Expr<'s> {
    type Output = Expr<'s>;
    fn not(self) -> Expr<'s> {
        self.unary(IrUnary::Not)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same formula through both interfaces gives the same program, instruction for
    /// instruction.
    #[test]
    fn formulas_build_what_the_builder_builds() {
        let s = Scope::new("f");
        let (x, out) = (
            s.buffer(DType::F32, Access::Read),
            s.buffer(DType::F32, Access::Write),
        );
        let i = s.index();
        let a = s.load(x, i);
        let y = (a * 2.0 - 1.0).max(-a).sqrt();
        s.store(out, i, y);
        let formula = s.build().unwrap();

        let mut p = ProgramBuilder::new("f");
        let (x, out) = (
            p.buffer(DType::F32, Access::Read),
            p.buffer(DType::F32, Access::Write),
        );
        let i = p.index();
        let a = p.load(x, i);
        let two = p.const_f32(2.0);
        let doubled = p.mul(a, two);
        let one = p.const_f32(1.0);
        let shifted = p.sub(doubled, one);
        let neg = p.unary(IrUnary::Neg, a);
        let m = p.binary(IrBinary::Max, shifted, neg);
        let y = p.unary(IrUnary::Sqrt, m);
        p.store(out, i, y);
        assert_eq!(formula, p.build().unwrap());
    }

    /// Literals take the float type of the value they meet: an `f64` formula stays `f64`,
    /// holding each literal as written.
    #[test]
    fn literals_follow_the_operand_type() {
        let s = Scope::new("f64");
        let (x, out) = (
            s.buffer(DType::F64, Access::Read),
            s.buffer(DType::F64, Access::Write),
        );
        let i = s.index();
        let y = 0.1 * s.load(x, i) + 1.0;
        assert_eq!(y.ty(), Some(ScalarType::F64));
        s.store(out, i, y);
        let p = s.build().unwrap();
        assert!(
            p.insts
                .contains(&Inst::Const(super::super::Constant::F64(0.1f64.to_bits())))
        );
    }

    /// A type error in a formula is reported when the program is built.
    #[test]
    fn type_errors_surface_at_build() {
        let s = Scope::new("bad");
        let out = s.buffer(DType::F32, Access::Write);
        let i = s.index();
        s.store(out, i, i * 2.0);
        assert!(s.build().is_err());
    }
}
