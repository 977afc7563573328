//! Elementwise operations: arithmetic with broadcasting, math functions, comparisons, `where`,
//! dtype casts. Forward passes are single `hal` primitives; backward passes are primitives or
//! one fused IR kernel per formula.

use super::{fused, promote};
use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::ir::{IrBinary, IrCmp, IrUnary, ProgramBuilder, ScalarType, Value};
use hal::{Backend, BinaryOp, DType, TernaryOp, UnaryOp};

impl<B: Backend> Tensor<B> {
    /// `op` applied to every element, with its derivative for backward.
    pub fn unary(&self, op: UnaryOp) -> Result<Self> {
        // PyTorch's autocast runs these in f32 (their range or accuracy suffers in 16 bits).
        let f32_policy = matches!(
            op,
            UnaryOp::Exp | UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Rsqrt | UnaryOp::Recip
        );
        if f32_policy && crate::autocast::widens(self) {
            return self.autocast_wide()?.unary(op);
        }
        if !self.dtype().is_float() {
            return Err(invalid(
                "unary",
                format!("{op:?} needs a float tensor, got {}", self.dtype()),
            ));
        }
        let out = self.new_output_like(self.dtype())?;
        self.backend().unary(op, self.view(), out.view())?;
        let x = self.clone();
        let y = out.detach();
        Ok(Tensor::from_op(out, "unary", &[self], move |g| {
            Ok(vec![Some(unary_backward(op, &x, &y, g)?)])
        }))
    }

    pub fn neg(&self) -> Result<Self> {
        self.unary(UnaryOp::Neg)
    }
    pub fn abs(&self) -> Result<Self> {
        self.unary(UnaryOp::Abs)
    }
    pub fn exp(&self) -> Result<Self> {
        self.unary(UnaryOp::Exp)
    }
    pub fn exp2(&self) -> Result<Self> {
        self.unary(UnaryOp::Exp2)
    }
    pub fn log(&self) -> Result<Self> {
        self.unary(UnaryOp::Log)
    }
    pub fn log2(&self) -> Result<Self> {
        self.unary(UnaryOp::Log2)
    }
    pub fn sqrt(&self) -> Result<Self> {
        self.unary(UnaryOp::Sqrt)
    }
    pub fn rsqrt(&self) -> Result<Self> {
        self.unary(UnaryOp::Rsqrt)
    }
    pub fn recip(&self) -> Result<Self> {
        self.unary(UnaryOp::Recip)
    }
    pub fn sin(&self) -> Result<Self> {
        self.unary(UnaryOp::Sin)
    }
    pub fn cos(&self) -> Result<Self> {
        self.unary(UnaryOp::Cos)
    }
    pub fn tanh(&self) -> Result<Self> {
        self.unary(UnaryOp::Tanh)
    }
    pub fn sigmoid(&self) -> Result<Self> {
        self.unary(UnaryOp::Sigmoid)
    }
    pub fn relu(&self) -> Result<Self> {
        self.unary(UnaryOp::Relu)
    }
    pub fn leaky_relu(&self, slope: f32) -> Result<Self> {
        self.unary(UnaryOp::LeakyRelu { slope })
    }
    /// The exact (erf) GELU.
    pub fn gelu(&self) -> Result<Self> {
        self.unary(UnaryOp::Gelu)
    }
    /// GELU's tanh approximation (GPT-2's `gelu_new`; PyTorch's `gelu(approximate="tanh")`).
    pub fn gelu_tanh(&self) -> Result<Self> {
        self.unary(UnaryOp::GeluTanh)
    }
    pub fn silu(&self) -> Result<Self> {
        self.unary(UnaryOp::Silu)
    }
    pub fn square(&self) -> Result<Self> {
        self.unary(UnaryOp::Square)
    }
    pub fn floor(&self) -> Result<Self> {
        self.unary(UnaryOp::Floor)
    }
    pub fn sign(&self) -> Result<Self> {
        self.unary(UnaryOp::Sign)
    }
    pub fn clamp(&self, lo: f32, hi: f32) -> Result<Self> {
        self.unary(UnaryOp::Clamp { lo, hi })
    }
    /// `scale * x + shift` in one kernel.
    pub fn affine(&self, scale: f32, shift: f32) -> Result<Self> {
        self.unary(UnaryOp::Affine { scale, shift })
    }
    pub fn add_scalar(&self, c: f32) -> Result<Self> {
        self.affine(1.0, c)
    }
    pub fn mul_scalar(&self, c: f32) -> Result<Self> {
        self.affine(c, 0.0)
    }

    /// `op(a, b)` with NumPy broadcasting; gradients of broadcast operands are summed back to
    /// their shapes.
    pub fn binary(&self, op: BinaryOp, other: &Self) -> Result<Self> {
        let shape = hal::broadcast_shapes(op_name(op), self.shape(), other.shape())?;
        let dtype = promote(self.dtype(), other.dtype());
        // The result follows the memory order of an operand of its shape (see
        // `Tensor::new_output_like`).
        let out = if self.shape() == shape.as_slice() {
            self.new_output_like(dtype)?
        } else if other.shape() == shape.as_slice() {
            other.new_output_like(dtype)?
        } else {
            self.new_output(&shape, dtype)?
        };
        self.backend()
            .binary(op, self.view(), other.view(), out.view())?;
        if op.is_comparison() {
            return Ok(out);
        }
        let (a, b, y) = (self.clone(), other.clone(), out.detach());
        Ok(Tensor::from_op(
            out,
            op_name(op),
            &[self, other],
            move |g| {
                let (ga, gb) = binary_backward(op, &a, &b, &y, g)?;
                Ok(vec![
                    Some(ga.sum_to(a.shape())?),
                    Some(gb.sum_to(b.shape())?),
                ])
            },
        ))
    }

    pub fn add(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Add, other)
    }
    pub fn sub(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Sub, other)
    }
    pub fn mul(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Mul, other)
    }
    pub fn div(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Div, other)
    }
    /// Floored remainder (the sign of `other`), as Python's `%`.
    pub fn rem(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Rem, other)
    }
    /// Under [`crate::autocast`], in f32 (as PyTorch's).
    pub fn pow(&self, other: &Self) -> Result<Self> {
        if crate::autocast::widens(self) || crate::autocast::widens(other) {
            return self.autocast_wide()?.pow(&other.autocast_wide()?);
        }
        self.binary(BinaryOp::Pow, other)
    }
    /// Elementwise maximum (ties split the gradient evenly, as PyTorch does).
    pub fn maximum(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Max, other)
    }
    pub fn minimum(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Min, other)
    }
    pub fn atan2(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Atan2, other)
    }
    /// `x^p` for a scalar exponent.
    pub fn powf(&self, p: f32) -> Result<Self> {
        let e = Tensor::full(self.backend(), &[], p as f64, self.dtype())?;
        self.pow(&e)
    }
    /// 1 where equal, else 0 (no gradient).
    pub fn eq(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Eq, other)
    }
    pub fn ne(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Ne, other)
    }
    pub fn lt(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Lt, other)
    }
    pub fn le(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Le, other)
    }
    pub fn gt(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Gt, other)
    }
    pub fn ge(&self, other: &Self) -> Result<Self> {
        self.binary(BinaryOp::Ge, other)
    }

    /// `if self != 0 { a } else { b }`, all three broadcasting together. `self` (the
    /// condition) gets no gradient.
    pub fn where_cond(&self, a: &Self, b: &Self) -> Result<Self> {
        let shape = hal::broadcast_shapes("where", self.shape(), a.shape())?;
        let shape = hal::broadcast_shapes("where", &shape, b.shape())?;
        let out = self.new_output(&shape, promote(a.dtype(), b.dtype()))?;
        self.backend().ternary(
            TernaryOp::Where,
            self.view(),
            a.view(),
            b.view(),
            out.view(),
        )?;
        let (cond, a_shape, b_shape) = (self.clone(), a.shape().to_vec(), b.shape().to_vec());
        Ok(Tensor::from_op(out, "where", &[a, b], move |g| {
            let zero = Tensor::zeros(g.backend(), &[], g.dtype())?;
            let ga = cond.where_cond(g, &zero)?.sum_to(&a_shape)?;
            let gb = cond.where_cond(&zero, g)?.sum_to(&b_shape)?;
            Ok(vec![Some(ga), Some(gb)])
        }))
    }

    /// `value` where `mask` (nonzero: true; broadcast to `self`'s shape) holds and `self`
    /// elsewhere, as PyTorch's `masked_fill`; the filled positions pass no gradient.
    pub fn masked_fill(&self, mask: &Self, value: f64) -> Result<Self> {
        let shape = hal::broadcast_shapes("masked_fill", self.shape(), mask.shape())?;
        if shape != self.shape() {
            return Err(crate::error::shape_error(
                "masked_fill",
                self.shape(),
                mask.shape(),
                "the mask must broadcast to the tensor's shape",
            ));
        }
        let fill = Tensor::full(self.backend(), &[], value, self.dtype())?;
        mask.where_cond(&fill, self)
    }

    /// The lower triangle of the last two dimensions: element (i, j) kept where
    /// `j - i <= diagonal`, zero elsewhere (PyTorch's `tril`).
    pub fn tril(&self, diagonal: i64) -> Result<Self> {
        self.triangle(diagonal, true)
    }

    /// The upper triangle of the last two dimensions: element (i, j) kept where
    /// `j - i >= diagonal`, zero elsewhere (PyTorch's `triu`).
    pub fn triu(&self, diagonal: i64) -> Result<Self> {
        self.triangle(diagonal, false)
    }

    fn triangle(&self, diagonal: i64, lower: bool) -> Result<Self> {
        if self.rank() < 2 {
            return Err(invalid(
                if lower { "tril" } else { "triu" },
                format!("needs at least 2 dimensions, got {:?}", self.shape()),
            ));
        }
        let (rows, cols) = (self.shape()[self.rank() - 2], self.shape()[self.rank() - 1]);
        let drop: Vec<u32> = (0..rows * cols)
            .map(|k| {
                let offset = (k % cols) as i64 - (k / cols) as i64;
                u32::from(if lower {
                    offset > diagonal
                } else {
                    offset < diagonal
                })
            })
            .collect();
        let mask = Tensor::from_elements(self.backend(), &drop, &[rows, cols])?;
        self.masked_fill(&mask, 0.0)
    }

    /// The same values stored as `dtype` (rounded; float to integer truncates). The gradient
    /// is cast back.
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let out = self.new_output(self.shape(), dtype)?;
        self.backend().copy(self.view(), out.view())?;
        let from = self.dtype();
        if !dtype.is_float() {
            return Ok(out);
        }
        Ok(Tensor::from_op(out, "to_dtype", &[self], move |g| {
            Ok(vec![Some(g.to_dtype(from)?)])
        }))
    }
}

fn op_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Rem => "rem",
        BinaryOp::Pow => "pow",
        BinaryOp::Max => "maximum",
        BinaryOp::Min => "minimum",
        BinaryOp::Atan2 => "atan2",
        _ => "compare",
    }
}

/// Whether `op`'s derivative is a function of its output alone, so that an operation that
/// fuses it (see [`Tensor::linear_activation`]) can give [`unary_backward`] the output in the
/// input's place and need not keep the input.
pub(crate) fn gradient_from_output(op: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(
        op,
        Neg | Affine { .. }
            | Floor
            | Ceil
            | Round
            | Sign
            | Exp
            | Exp2
            | Sqrt
            | Rsqrt
            | Recip
            | Tanh
            | Sigmoid
            | Relu
    )
}

/// `d op(x) / dx * g`, in one fused kernel per op (or one primitive for the linear ones).
/// Where [`gradient_from_output`] holds, `x` is used for its shape and dtype only.
pub(crate) fn unary_backward<B: Backend>(
    op: UnaryOp,
    x: &Tensor<B>,
    y: &Tensor<B>,
    g: &Tensor<B>,
) -> Result<Tensor<B>> {
    let shape = x.shape().to_vec();
    let dt = x.dtype();
    // Kernels of the output `y` (already dense) or the input `x`, times the incoming gradient.
    let with_y = |name: &str, f: fn(&mut ProgramBuilder, Value, Value) -> Value| {
        fused(name, &[y, g], &shape, dt, |b, v| f(b, v[0], v[1]))
    };
    let with_x = |name: &str, f: &dyn Fn(&mut ProgramBuilder, Value, Value) -> Value| {
        fused(name, &[x, g], &shape, dt, |b, v| f(b, v[0], v[1]))
    };
    match op {
        UnaryOp::Neg => g.neg(),
        UnaryOp::Affine { scale, .. } => g.mul_scalar(scale),
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign => x.new_zeros(&shape, dt),
        UnaryOp::Abs => with_x("abs_grad", &|b, x, g| {
            let zero = lit(b, x, 0.0);
            let ng = b.unary(IrUnary::Neg, g);
            let pos = b.cmp(IrCmp::Gt, x, zero);
            let neg = b.cmp(IrCmp::Lt, x, zero);
            let s = b.select(neg, ng, zero);
            b.select(pos, g, s)
        }),
        UnaryOp::Exp => with_y("exp_grad", |b, y, g| b.mul(y, g)),
        UnaryOp::Exp2 => with_y("exp2_grad", |b, y, g| {
            let l = lit(b, y, std::f64::consts::LN_2);
            let t = b.mul(y, l);
            b.mul(t, g)
        }),
        UnaryOp::Log => with_x("log_grad", &|b, x, g| b.div(g, x)),
        UnaryOp::Log2 => with_x("log2_grad", &|b, x, g| {
            let l = lit(b, x, std::f64::consts::LN_2);
            let d = b.mul(x, l);
            b.div(g, d)
        }),
        UnaryOp::Sqrt => with_y("sqrt_grad", |b, y, g| {
            let h = lit(b, g, 0.5);
            let t = b.mul(g, h);
            b.div(t, y)
        }),
        UnaryOp::Rsqrt => with_y("rsqrt_grad", |b, y, g| {
            let h = lit(b, y, -0.5);
            let y2 = b.mul(y, y);
            let y3 = b.mul(y2, y);
            let t = b.mul(y3, h);
            b.mul(t, g)
        }),
        UnaryOp::Recip => with_y("recip_grad", |b, y, g| {
            let y2 = b.mul(y, y);
            let t = b.mul(y2, g);
            b.unary(IrUnary::Neg, t)
        }),
        UnaryOp::Sin => with_x("sin_grad", &|b, x, g| {
            let c = b.unary(IrUnary::Cos, x);
            b.mul(c, g)
        }),
        UnaryOp::Cos => with_x("cos_grad", &|b, x, g| {
            let s = b.unary(IrUnary::Sin, x);
            let t = b.mul(s, g);
            b.unary(IrUnary::Neg, t)
        }),
        UnaryOp::Tanh => with_y("tanh_grad", |b, y, g| {
            let one = lit(b, y, 1.0);
            let y2 = b.mul(y, y);
            let d = b.sub(one, y2);
            b.mul(d, g)
        }),
        UnaryOp::Sigmoid => with_y("sigmoid_grad", |b, y, g| {
            let one = lit(b, y, 1.0);
            let c = b.sub(one, y);
            let d = b.mul(y, c);
            b.mul(d, g)
        }),
        // The output is 0 exactly where the input was not positive, so it serves as the mask.
        UnaryOp::Relu => with_y("relu_grad", |b, y, g| {
            let zero = lit(b, y, 0.0);
            let pos = b.cmp(IrCmp::Gt, y, zero);
            b.select(pos, g, zero)
        }),
        UnaryOp::LeakyRelu { slope } => with_x("leaky_relu_grad", &move |b, x, g| {
            let zero = lit(b, x, 0.0);
            let s = lit(b, x, slope as f64);
            let pos = b.cmp(IrCmp::Gt, x, zero);
            let sg = b.mul(s, g);
            b.select(pos, g, sg)
        }),
        UnaryOp::Gelu => with_x("gelu_grad", &gelu_grad),
        UnaryOp::GeluTanh => with_x("gelu_tanh_grad", &gelu_tanh_grad),
        UnaryOp::Silu => with_x("silu_grad", &silu_grad),
        UnaryOp::Square => with_x("square_grad", &|b, x, g| {
            let two = lit(b, x, 2.0);
            let t = b.mul(x, two);
            b.mul(t, g)
        }),
        UnaryOp::Clamp { lo, hi } => with_x("clamp_grad", &move |b, x, g| {
            let (l, h, zero) = (lit(b, x, lo as f64), lit(b, x, hi as f64), lit(b, x, 0.0));
            let above = b.cmp(IrCmp::Ge, x, l);
            let below = b.cmp(IrCmp::Le, x, h);
            let inside = b.binary(IrBinary::And, above, below);
            b.select(inside, g, zero)
        }),
    }
}

/// `d/dx [x Phi(x)] g = (Phi(x) + x phi(x)) g`, Phi by the same erf formula as the forward.
/// In f32 the density's `exp(-x^2 / 2)` is the one the erf formula takes at `x / sqrt 2`
/// (computed once: an exponential is most of the program's work on the CPU).
fn gelu_grad(b: &mut ProgramBuilder, x: Value, g: Value) -> Value {
    let k = lit(b, x, std::f64::consts::FRAC_1_SQRT_2);
    let z = b.mul(x, k);
    let (e, shared) = ir_erf(b, z);
    let one = lit(b, x, 1.0);
    let half = lit(b, x, 0.5);
    let t = b.add(one, e);
    let cdf = b.mul(half, t);
    let ex = shared.unwrap_or_else(|| {
        let x2 = b.mul(x, x);
        let mh = lit(b, x, -0.5);
        let a = b.mul(x2, mh);
        b.unary(IrUnary::Exp, a)
    });
    let inv = lit(b, x, 0.398_942_280_401_432_7); // 1 / sqrt(2 pi)
    let pdf = b.mul(ex, inv);
    let d = b.fma(x, pdf, cdf);
    b.mul(d, g)
}

/// With `t = tanh(k (x + c x^3))`: `d/dx [x (1 + t) / 2] g =
/// ((1 + t) / 2 + x (1 - t^2) k (1 + 3 c x^2) / 2) g`.
fn gelu_tanh_grad(b: &mut ProgramBuilder, x: Value, g: Value) -> Value {
    let k = lit(b, x, 0.797_884_560_802_865_4);
    let c = lit(b, x, 0.044_715);
    let c3 = lit(b, x, 3.0 * 0.044_715);
    let (one, half) = (lit(b, x, 1.0), lit(b, x, 0.5));
    let x2 = b.mul(x, x);
    let x3 = b.mul(x2, x);
    let inner = b.fma(c, x3, x);
    let z = b.mul(k, inner);
    let t = b.unary(IrUnary::Tanh, z);
    let t2 = b.mul(t, t);
    let sech2 = b.sub(one, t2);
    let slope = b.fma(c3, x2, one);
    let ks = b.mul(k, slope);
    let xs = b.mul(x, sech2);
    let right = b.mul(xs, ks);
    let left = b.add(one, t);
    let sum = b.add(left, right);
    let d = b.mul(half, sum);
    b.mul(d, g)
}

/// `d/dx [x s(x)] g = s(x) (1 + x (1 - s(x))) g`, `s` the sigmoid.
fn silu_grad(b: &mut ProgramBuilder, x: Value, g: Value) -> Value {
    let one = lit(b, x, 1.0);
    let nx = b.unary(IrUnary::Neg, x);
    let e = b.unary(IrUnary::Exp, nx);
    let den = b.add(one, e);
    let s = b.unary(IrUnary::Recip, den);
    let c = b.sub(one, s);
    let t = b.fma(x, c, one);
    let d = b.mul(s, t);
    b.mul(d, g)
}

/// A float constant of `like`'s type: the kernel's width (f32, or f64 on f64 tensors).
fn lit(b: &mut ProgramBuilder, like: Value, v: f64) -> Value {
    let ty = b.type_of(like).unwrap_or(ScalarType::F32);
    b.const_float(ty, v)
}

/// The error function in IR, by the formula of the forward: `hal::erf_f32`'s
/// Abramowitz-Stegun approximation in f32, `hal::erf_f64`'s series and continued fraction in
/// f64. In f32 also the `exp(-x^2)` the formula takes, for a caller that needs it too.
fn ir_erf(b: &mut ProgramBuilder, x: Value) -> (Value, Option<Value>) {
    if b.type_of(x) == Some(ScalarType::F64) {
        return (ir_erf_f64(b, x), None);
    }
    let ax = b.unary(IrUnary::Abs, x);
    let one = b.const_f32(1.0);
    let p = b.const_f32(0.327_591_1);
    let den = b.fma(p, ax, one);
    let t = b.div(one, den);
    let mut poly = b.const_f32(1.061_405_4);
    for c in [-1.453_152_1f32, 1.421_413_7, -0.284_496_74, 0.254_829_6] {
        let cc = b.const_f32(c);
        poly = b.fma(poly, t, cc);
    }
    poly = b.mul(poly, t);
    let nx2 = {
        let x2 = b.mul(x, x);
        b.unary(IrUnary::Neg, x2)
    };
    let e = b.unary(IrUnary::Exp, nx2);
    let pe = b.mul(poly, e);
    let r = b.sub(one, pe);
    let zero = b.const_f32(0.0);
    let neg = b.cmp(IrCmp::Lt, x, zero);
    let nr = b.unary(IrUnary::Neg, r);
    (b.select(neg, nr, r), Some(e))
}

/// `hal::erf_f64` unrolled (programs have no loops): for |x| < 2.5 the series
/// `2/sqrt(pi) e^(-a^2) sum a (2a^2)^n / (1 3 ... (2n+1))` to 60 terms (the last below 1e-18
/// of the sum at 2.5), from 2.5 to 6 `1 - erfc` by 60 steps of erfc's continued fraction,
/// beyond 6 one; both are computed and the right one chosen.
fn ir_erf_f64(b: &mut ProgramBuilder, x: Value) -> Value {
    let c = |b: &mut ProgramBuilder, v: f64| b.const_f64(v);
    let a = b.unary(IrUnary::Abs, x);
    let a2 = b.mul(a, a);
    let two_a2 = {
        let two = c(b, 2.0);
        b.mul(two, a2)
    };
    let (mut term, mut sum) = (a, a);
    for n in 1..=60 {
        let k = c(b, 1.0 / (2 * n + 1) as f64);
        let r = b.mul(two_a2, k);
        term = b.mul(term, r);
        sum = b.add(sum, term);
    }
    let na2 = b.unary(IrUnary::Neg, a2);
    let e = b.unary(IrUnary::Exp, na2);
    let series = {
        let k = c(b, std::f64::consts::FRAC_2_SQRT_PI);
        let t = b.mul(k, e);
        b.mul(t, sum)
    };
    let mut f = a;
    for k in (1..=60).rev() {
        let h = c(b, k as f64 / 2.0);
        let q = b.div(h, f);
        f = b.add(a, q);
    }
    let fraction = {
        let k = c(b, std::f64::consts::PI.sqrt());
        let d = b.mul(k, f);
        let t = b.div(e, d);
        let one = c(b, 1.0);
        b.sub(one, t)
    };
    let (lo, hi, one) = (c(b, 2.5), c(b, 6.0), c(b, 1.0));
    let small = b.cmp(IrCmp::Lt, a, lo);
    let middle = b.cmp(IrCmp::Lt, a, hi);
    let tail = b.select(middle, fraction, one);
    let r = b.select(small, series, tail);
    let zero = c(b, 0.0);
    let neg = b.cmp(IrCmp::Lt, x, zero);
    let nr = b.unary(IrUnary::Neg, r);
    let signed = b.select(neg, nr, r);
    // NaN stays NaN (the comparisons above are false for it).
    let nan = b.cmp(IrCmp::Ne, x, x);
    b.select(nan, x, signed)
}

/// The gradients of `op(a, b)` with respect to `a` and `b`, still in the output's shape.
fn binary_backward<B: Backend>(
    op: BinaryOp,
    a: &Tensor<B>,
    b: &Tensor<B>,
    y: &Tensor<B>,
    g: &Tensor<B>,
) -> Result<(Tensor<B>, Tensor<B>)> {
    let shape = y.shape().to_vec();
    let dt = g.dtype();
    // The fused formulas index every operand by the launch index, so `a` and `b` are
    // broadcast to the output's shape once, then shared by both gradients' kernels.
    let stretched = || -> Result<(Tensor<B>, Tensor<B>)> {
        Ok((a.materialize(&shape)?, b.materialize(&shape)?))
    };
    let kernel =
        |name: &str, inputs: &[&Tensor<B>], f: &dyn Fn(&mut ProgramBuilder, &[Value]) -> Value| {
            fused(name, inputs, &shape, dt, |pb, v| f(pb, v))
        };
    Ok(match op {
        BinaryOp::Add => (g.clone(), g.clone()),
        BinaryOp::Sub => (g.clone(), g.neg()?),
        BinaryOp::Mul => (g.mul(b)?, g.mul(a)?),
        BinaryOp::Div => (g.div(b)?, g.mul(y)?.div(b)?.neg()?),
        BinaryOp::Rem => (g.clone(), g.mul(&a.div(b)?.floor()?)?.neg()?),
        BinaryOp::Pow => {
            let (a, b) = stretched()?;
            (
                kernel("pow_grad_base", &[&a, &b, g], &|pb, v| {
                    // b * a^(b-1) * g, and 0 where b = 0 (PyTorch's convention: a^0 is 1
                    // for every a, so the base has no effect, even at a = 0).
                    let (one, zero) = (lit(pb, v[0], 1.0), lit(pb, v[0], 0.0));
                    let bm1 = pb.sub(v[1], one);
                    let p = pb.binary(IrBinary::Pow, v[0], bm1);
                    let t = pb.mul(v[1], p);
                    let t = pb.mul(t, v[2]);
                    let constant = pb.cmp(IrCmp::Eq, v[1], zero);
                    pb.select(constant, zero, t)
                })?,
                kernel("pow_grad_exponent", &[&a, y, g], &|pb, v| {
                    // a^b ln(a) g where a > 0; 0 elsewhere (PyTorch's convention for a = 0)
                    let zero = lit(pb, v[0], 0.0);
                    let pos = pb.cmp(IrCmp::Gt, v[0], zero);
                    let l = pb.unary(IrUnary::Log, v[0]);
                    let t = pb.mul(v[1], l);
                    let t = pb.mul(t, v[2]);
                    pb.select(pos, t, zero)
                })?,
            )
        }
        BinaryOp::Max | BinaryOp::Min => {
            let wins = if op == BinaryOp::Max {
                IrCmp::Gt
            } else {
                IrCmp::Lt
            };
            let (a, b) = stretched()?;
            let ga = kernel("extremum_grad", &[&a, &b, g], &|pb, v| {
                let (zero, half) = (lit(pb, v[0], 0.0), lit(pb, v[0], 0.5));
                let win = pb.cmp(wins, v[0], v[1]);
                let tie = pb.cmp(IrCmp::Eq, v[0], v[1]);
                let hg = pb.mul(half, v[2]);
                let t = pb.select(tie, hg, zero);
                pb.select(win, v[2], t)
            })?;
            let gb = g.sub(&ga)?;
            (ga, gb)
        }
        BinaryOp::Atan2 => {
            let (a, b) = stretched()?;
            // g / (a^2 + b^2) times b for `a`, times -a for `b`; 0 at a = b = 0, where atan2
            // has no derivative (PyTorch's value there).
            let scaled = |pb: &mut ProgramBuilder, v: &[Value], by: Value| {
                let a2 = pb.mul(v[0], v[0]);
                let d = pb.fma(v[1], v[1], a2);
                let t = pb.mul(v[2], by);
                let q = pb.div(t, d);
                let zero = lit(pb, v[0], 0.0);
                let origin = pb.cmp(IrCmp::Eq, d, zero);
                pb.select(origin, zero, q)
            };
            (
                kernel("atan2_grad_a", &[&a, &b, g], &|pb, v| scaled(pb, v, v[1]))?,
                kernel("atan2_grad_b", &[&a, &b, g], &|pb, v| {
                    let q = scaled(pb, v, v[0]);
                    pb.unary(IrUnary::Neg, q)
                })?,
            )
        }
        _ => unreachable!("comparisons record no backward"),
    })
}
