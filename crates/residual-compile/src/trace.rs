//! The scalar autograd front end: [`Var`]s record the operations a residual closure performs
//! on a [`Tape`], once per residual instance.
//!
//! A `Var` is a node id plus a reference to the tape it lives on, so it is `Copy` and the usual
//! operators work on it (`a + b`, `2.0 * x`, `x.sqrt()`). Nothing is computed while tracing:
//! the tape is plain data ([`Node`]s in topological order) that [`crate::graph`] hashes into a
//! topology signature, differentiates symbolically and lowers to the `hal` IR.

use std::cell::RefCell;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// One-operand functions of the front end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unary {
    Neg,
    Sqrt,
    Rsqrt,
    Exp,
    Log,
    Sin,
    Cos,
    Tan,
    /// The arctangent, in `(-pi/2, pi/2)`.
    Atan,
    Tanh,
    Abs,
    Sigmoid,
    Relu,
    /// `ln(1 + e^x)`, evaluated without overflow.
    Softplus,
    /// `x^n` for a whole `n` fixed at trace time (part of the signature).
    PowI(i32),
}

/// Two-operand functions of the front end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    /// `a^b` for real `b` (`a > 0` for a finite derivative in `b`).
    Pow,
    /// `atan2(a, b)`: the angle of the point `(b, a)`.
    Atan2,
    Min,
    Max,
}

/// Comparisons for [`Cond::select`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cmp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Cmp {
    pub fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
        }
    }
}

/// One recorded operation. Operands are ids of earlier nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// The `k`-th scalar parameter of the residual block (its parameter blocks, flattened):
    /// read from the problem's parameters and differentiated (Jacobian column `k`).
    Param(u32),
    /// Jacobian column `k` of a block on a manifold: a tangent coordinate, differentiated,
    /// whose value is 0 (see [`crate::manifold`]).
    Delta(u32),
    /// Slot `k` (after the differentiated slots) of a block on a manifold: a stored parameter
    /// read but not differentiated (its block moves through its [`Node::Delta`]s).
    Ambient(u32),
    /// The `k`-th per-instance constant (data that differs between instances of one topology).
    Const(u32),
    /// A literal written in the closure (`2.0 * x`): part of the topology signature. Stored as
    /// `f64` bits so nodes hash and compare exactly.
    Lit(u64),
    Unary(Unary, u32),
    Binary(Binary, u32, u32),
    /// `if a <cmp> b { t } else { f }`.
    Select {
        cmp: Cmp,
        a: u32,
        b: u32,
        t: u32,
        f: u32,
    },
}

impl Node {
    pub fn lit(v: f64) -> Node {
        Node::Lit(v.to_bits())
    }
}

/// The recording of one residual instance. Reused between instances (cleared, not freed).
#[derive(Debug, Default)]
pub struct Tape {
    nodes: RefCell<Vec<Node>>,
}

impl Tape {
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn push(&self, node: Node) -> Var<'_> {
        let mut nodes = self.nodes.borrow_mut();
        nodes.push(node);
        Var {
            tape: self,
            id: nodes.len() as u32 - 1,
        }
    }

    /// A handle to node `id` (which must exist).
    pub(crate) fn var(&self, id: u32) -> Var<'_> {
        Var { tape: self, id }
    }

    /// A literal on this tape.
    pub fn lit(&self, v: f64) -> Var<'_> {
        self.push(Node::lit(v))
    }

    pub(crate) fn clear(&self) {
        self.nodes.borrow_mut().clear();
    }

    pub(crate) fn nodes(&self) -> std::cell::Ref<'_, Vec<Node>> {
        self.nodes.borrow()
    }
}

/// A traced scalar.
#[derive(Clone, Copy)]
pub struct Var<'t> {
    tape: &'t Tape,
    id: u32,
}

impl std::fmt::Debug for Var<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Var(%{})", self.id)
    }
}

impl<'t> Var<'t> {
    /// The node id on the tape.
    pub fn id(self) -> u32 {
        self.id
    }
    fn unary(self, op: Unary) -> Self {
        self.tape.push(Node::Unary(op, self.id))
    }
    fn binary(self, op: Binary, other: Var<'t>) -> Self {
        self.tape.push(Node::Binary(op, self.id, other.id))
    }
    /// A literal on the same tape.
    pub fn lit(self, v: f64) -> Self {
        self.tape.lit(v)
    }
    pub fn sqrt(self) -> Self {
        self.unary(Unary::Sqrt)
    }
    pub fn rsqrt(self) -> Self {
        self.unary(Unary::Rsqrt)
    }
    pub fn exp(self) -> Self {
        self.unary(Unary::Exp)
    }
    /// The natural logarithm.
    pub fn ln(self) -> Self {
        self.unary(Unary::Log)
    }
    pub fn sin(self) -> Self {
        self.unary(Unary::Sin)
    }
    pub fn cos(self) -> Self {
        self.unary(Unary::Cos)
    }
    pub fn tan(self) -> Self {
        self.unary(Unary::Tan)
    }
    /// The arctangent (`atan2(self, 1)`).
    pub fn atan(self) -> Self {
        self.unary(Unary::Atan)
    }
    pub fn tanh(self) -> Self {
        self.unary(Unary::Tanh)
    }
    pub fn abs(self) -> Self {
        self.unary(Unary::Abs)
    }
    pub fn sigmoid(self) -> Self {
        self.unary(Unary::Sigmoid)
    }
    pub fn relu(self) -> Self {
        self.unary(Unary::Relu)
    }
    pub fn softplus(self) -> Self {
        self.unary(Unary::Softplus)
    }
    pub fn powi(self, n: i32) -> Self {
        self.unary(Unary::PowI(n))
    }
    pub fn powf(self, e: f64) -> Self {
        let e = self.lit(e);
        self.binary(Binary::Pow, e)
    }
    pub fn pow(self, e: Var<'t>) -> Self {
        self.binary(Binary::Pow, e)
    }
    /// `atan2(self, x)`: the angle of the point `(x, self)`.
    pub fn atan2(self, x: Var<'t>) -> Self {
        self.binary(Binary::Atan2, x)
    }
    pub fn min(self, other: Var<'t>) -> Self {
        self.binary(Binary::Min, other)
    }
    pub fn max(self, other: Var<'t>) -> Self {
        self.binary(Binary::Max, other)
    }
    /// `1 / sqrt(max(self, eps))`: finite at 0, with derivative 0 below `eps`.
    pub fn safe_rsqrt(self, eps: f64) -> Self {
        let floor = self.lit(eps);
        self.ge(floor).select(self.rsqrt(), floor.rsqrt())
    }
    pub fn lt(self, other: Var<'t>) -> Cond<'t> {
        Cond::new(Cmp::Lt, self, other)
    }
    pub fn le(self, other: Var<'t>) -> Cond<'t> {
        Cond::new(Cmp::Le, self, other)
    }
    pub fn gt(self, other: Var<'t>) -> Cond<'t> {
        Cond::new(Cmp::Gt, self, other)
    }
    pub fn ge(self, other: Var<'t>) -> Cond<'t> {
        Cond::new(Cmp::Ge, self, other)
    }
    pub fn eq_to(self, other: Var<'t>) -> Cond<'t> {
        Cond::new(Cmp::Eq, self, other)
    }
    pub fn ne_to(self, other: Var<'t>) -> Cond<'t> {
        Cond::new(Cmp::Ne, self, other)
    }
}

/// A comparison, waiting for the two values to choose between.
#[derive(Clone, Copy, Debug)]
pub struct Cond<'t> {
    cmp: Cmp,
    a: Var<'t>,
    b: Var<'t>,
}

impl<'t> Cond<'t> {
    fn new(cmp: Cmp, a: Var<'t>, b: Var<'t>) -> Self {
        Self { cmp, a, b }
    }
    /// `if cond { t } else { f }`; the derivative follows the branch taken.
    pub fn select(self, t: Var<'t>, f: Var<'t>) -> Var<'t> {
        self.a.tape.push(Node::Select {
            cmp: self.cmp,
            a: self.a.id,
            b: self.b.id,
            t: t.id,
            f: f.id,
        })
    }
}

macro_rules! binary_operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl<'t> $trait for Var<'t> {
            type Output = Var<'t>;
            fn $method(self, rhs: Var<'t>) -> Var<'t> {
                self.binary(Binary::$op, rhs)
            }
        }
        impl<'t> $trait<f64> for Var<'t> {
            type Output = Var<'t>;
            fn $method(self, rhs: f64) -> Var<'t> {
                let rhs = self.lit(rhs);
                self.binary(Binary::$op, rhs)
            }
        }
        impl<'t> $trait<Var<'t>> for f64 {
            type Output = Var<'t>;
            fn $method(self, rhs: Var<'t>) -> Var<'t> {
                rhs.lit(self).binary(Binary::$op, rhs)
            }
        }
    };
}

binary_operator!(Add, add, Add);
binary_operator!(Sub, sub, Sub);
binary_operator!(Mul, mul, Mul);
binary_operator!(Div, div, Div);

impl<'t> Neg for Var<'t> {
    type Output = Var<'t>;
    fn neg(self) -> Var<'t> {
        self.unary(Unary::Neg)
    }
}

/// A 2-vector of traced scalars.
#[derive(Clone, Copy, Debug)]
pub struct Vec2<'t> {
    pub x: Var<'t>,
    pub y: Var<'t>,
}

impl<'t> Vec2<'t> {
    pub fn new(x: Var<'t>, y: Var<'t>) -> Self {
        Self { x, y }
    }
    /// The first two of `v`.
    pub fn from_slice(v: &[Var<'t>]) -> Self {
        Self::new(v[0], v[1])
    }
    pub fn dot(self, o: Self) -> Var<'t> {
        self.x * o.x + self.y * o.y
    }
    /// The z component of the 3-d cross product.
    pub fn cross(self, o: Self) -> Var<'t> {
        self.x * o.y - self.y * o.x
    }
    pub fn norm_squared(self) -> Var<'t> {
        self.dot(self)
    }
    pub fn norm(self) -> Var<'t> {
        self.norm_squared().sqrt()
    }
    /// `self / |self|`, finite at 0 (see [`Var::safe_rsqrt`]).
    pub fn normalize(self) -> Self {
        self * self.norm_squared().safe_rsqrt(1e-30)
    }
}

/// A 3-vector of traced scalars.
#[derive(Clone, Copy, Debug)]
pub struct Vec3<'t> {
    pub x: Var<'t>,
    pub y: Var<'t>,
    pub z: Var<'t>,
}

impl<'t> Vec3<'t> {
    pub fn new(x: Var<'t>, y: Var<'t>, z: Var<'t>) -> Self {
        Self { x, y, z }
    }
    /// The first three of `v`.
    pub fn from_slice(v: &[Var<'t>]) -> Self {
        Self::new(v[0], v[1], v[2])
    }
    pub fn dot(self, o: Self) -> Var<'t> {
        self.x * o.x + self.y * o.y + self.z * o.z
    }
    pub fn cross(self, o: Self) -> Self {
        Self::new(
            self.y * o.z - self.z * o.y,
            self.z * o.x - self.x * o.z,
            self.x * o.y - self.y * o.x,
        )
    }
    pub fn norm_squared(self) -> Var<'t> {
        self.dot(self)
    }
    pub fn norm(self) -> Var<'t> {
        self.norm_squared().sqrt()
    }
    /// `self / |self|`, finite at 0 (see [`Var::safe_rsqrt`]).
    pub fn normalize(self) -> Self {
        self * self.norm_squared().safe_rsqrt(1e-30)
    }
    pub fn to_array(self) -> [Var<'t>; 3] {
        [self.x, self.y, self.z]
    }
}

macro_rules! vector_arithmetic {
    ($vec:ident, $($c:ident),+) => {
        impl<'t> Add for $vec<'t> {
            type Output = Self;
            fn add(self, o: Self) -> Self {
                Self { $($c: self.$c + o.$c),+ }
            }
        }
        impl<'t> Sub for $vec<'t> {
            type Output = Self;
            fn sub(self, o: Self) -> Self {
                Self { $($c: self.$c - o.$c),+ }
            }
        }
        impl<'t> Mul<Var<'t>> for $vec<'t> {
            type Output = Self;
            fn mul(self, s: Var<'t>) -> Self {
                Self { $($c: self.$c * s),+ }
            }
        }
        impl<'t> Mul<f64> for $vec<'t> {
            type Output = Self;
            fn mul(self, s: f64) -> Self {
                Self { $($c: self.$c * s),+ }
            }
        }
    };
}

vector_arithmetic!(Vec2, x, y);
vector_arithmetic!(Vec3, x, y, z);
