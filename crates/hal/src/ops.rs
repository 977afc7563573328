//! Operation enums and parameter structs for the primitive families. The semantics of each
//! primitive are specified on the [`Backend`](crate::Backend) method that runs it; the
//! per-element formulas are specified here, on each op, and implemented once for the host in
//! [`UnaryOp::apply`] and [`BinaryOp::apply`] so every backend has one definition to match.

/// An elementwise function of one operand. Computed in `f32` ([`UnaryOp::apply`]), or in
/// `f64` where an operand is `f64` ([`UnaryOp::apply_f64`]: the same formulas, the
/// parameters widened, `Gelu` with an `erf` accurate to `f64` ([`erf_f64`])).
///
/// Special values, on every backend, are those of [`UnaryOp::apply`] (C's `<math.h>` for the
/// functions it has): NaN in gives NaN out for every op but `Sign`, `Relu`, `Clamp` (which keep
/// it) and none else. At `±0` every op gives C's value; the sign of a zero result is C's on
/// the CPU (`Neg`, `Sin`, `Tanh`, `Sqrt`, `Round` keep it) and may differ on a GPU, where
/// zeros compare equal. Infinities: `Exp(-inf) = 0`, `Exp(inf) = inf`,
/// `Log(0) = -inf`, `Log(inf) = inf`, `Log(x < 0) = NaN`, `Sqrt(x < 0) = NaN`,
/// `Rsqrt(0) = inf`, `Recip(±0) = ±inf`, `Recip(±inf) = ±0`, `Tanh(±inf) = ±1`,
/// `Sigmoid(-inf) = 0`, `Sigmoid(inf) = 1`, `Sin(±inf) = Cos(±inf) = NaN`, results beyond
/// `f32::MAX` are `inf`. Subnormal operands are values like any other on the CPU; a GPU
/// backend may flush subnormals to zero at any step (a comparison too), so its finite
/// results may differ from these by up to `f32::MIN_POSITIVE` where a subnormal is involved
/// (the parity suite allows that, and nothing else: NaN and infinities must match).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Exp2,
    /// Natural logarithm; `log(±0) = -inf`, `log(x<0) = NaN`, `log(inf) = inf`.
    Log,
    /// As `Log`, base 2.
    Log2,
    /// `sqrt(-0) = -0`, `sqrt(x<0) = NaN`.
    Sqrt,
    /// `1 / sqrt(x)`: `inf` at `+0`, `-inf` at `-0`, `0` at `inf`.
    Rsqrt,
    /// `1 / x`.
    Recip,
    Sin,
    Cos,
    /// `±1` at `±inf`; NaN stays NaN.
    Tanh,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `x < 0 ? 0 : x`: NaN stays NaN, `-0` stays `-0`.
    Relu,
    /// `x` for `x >= 0`, `slope * x` otherwise.
    LeakyRelu {
        slope: f32,
    },
    /// `0.5 x (1 + erf(x / sqrt 2))` with `erf` from [`erf_f32`] (absolute error below 2e-7).
    Gelu,
    /// `x * sigmoid(x)`.
    Silu,
    Floor,
    Ceil,
    /// Round half to even.
    Round,
    /// -1, 0 or 1 (NaN stays NaN).
    Sign,
    /// `x * x`.
    Square,
    /// `scale * x + shift` (one rounding: fused multiply-add).
    Affine {
        scale: f32,
        shift: f32,
    },
    /// `min(max(x, lo), hi)`; NaN stays NaN.
    Clamp {
        lo: f32,
        hi: f32,
    },
    /// GELU's tanh approximation (GPT-2's; PyTorch's `gelu(approximate="tanh")`):
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh,
}

/// The error function, by the approximation every backend uses for [`UnaryOp::Gelu`]
/// (Abramowitz & Stegun 7.1.26: absolute error below 1.5e-7, plus f32 rounding).
#[inline]
pub fn erf_f32(x: f32) -> f32 {
    erf_f32_with(x, f32::exp)
}

/// [`erf_f32`]'s formula with the exponential supplied: a backend whose loops over it should
/// vectorise passes an `exp` that does (the CPU's; libm's `expf` is a call per element).
#[inline(always)]
pub fn erf_f32_with(x: f32, exp: impl Fn(f32) -> f32) -> f32 {
    // A&S 7.1.26: a degree-5 polynomial in t = 1/(1 + p|x|) times exp(-x^2). Cheap and
    // branch-free, so every backend evaluates the same formula and agrees within a few ulps.
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let r = 1.0 - poly * exp(-x * x);
    if x < 0.0 { -r } else { r }
}

/// The error function to `f64` accuracy (relative error a few units of `f64`'s roundoff):
/// the series `erf x = 2/sqrt(pi) e^(-x^2) sum 2^n x^(2n+1) / (1 3 5 ... (2n+1))` below
/// `|x| = 2.5` (every term positive, so no cancellation), `1 - erfc x` by its continued
/// fraction above, `±1` beyond `|x| = 6`.
pub fn erf_f64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 2.5 {
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        while term > sum * 1e-17 {
            n += 1.0;
            term *= 2.0 * a * a / (2.0 * n + 1.0);
            sum += term;
        }
        std::f64::consts::FRAC_2_SQRT_PI * (-a * a).exp() * sum
    } else if a < 6.0 {
        // erfc a = e^(-a^2)/sqrt(pi) / (a + (1/2)/(a + 1/(a + (3/2)/(a + 2/(a + ...))))),
        // evaluated from the tail (enough terms for f64 at a >= 2.5).
        let mut f = a;
        for k in (1..=60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / f
    } else {
        1.0
    };
    if x < 0.0 { -r } else { r }
}

/// What the elementwise formulas need of a float width, so each is written once for `f32`
/// and `f64`.
trait Real:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Rem<Output = Self>
    + std::ops::Neg<Output = Self>
{
    const NAN: Self;
    const FRAC_1_SQRT_2: Self;
    /// `sqrt(2 / pi)`, and GELU's tanh-approximation coefficient 0.044715, in this width.
    const SQRT_2_OVER_PI: Self;
    const GELU_CUBIC: Self;
    /// An `f32` (an op's parameter or a literal) in this width, exactly.
    fn of(v: f32) -> Self;
    fn abs(self) -> Self;
    fn exp(self) -> Self;
    fn exp2(self) -> Self;
    fn ln(self) -> Self;
    fn log2(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn round_ties_even(self) -> Self;
    fn erf(self) -> Self;
    fn is_nan(self) -> bool;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn powf(self, o: Self) -> Self;
    fn atan2(self, o: Self) -> Self;
    fn mul_add(self, a: Self, b: Self) -> Self;
}

macro_rules! real {
    ($t:ident, $erf:ident, $of:expr) => {
        impl Real for $t {
            const NAN: $t = $t::NAN;
            const FRAC_1_SQRT_2: $t = std::$t::consts::FRAC_1_SQRT_2;
            const SQRT_2_OVER_PI: $t = 0.797_884_560_802_865_4_f64 as $t;
            const GELU_CUBIC: $t = 0.044_715;
            #[inline(always)]
            fn of(v: f32) -> $t {
                $of(v)
            }
            #[inline(always)]
            fn erf(self) -> $t {
                $erf(self)
            }
            real!(@unary $t: abs exp exp2 ln log2 sqrt sin cos tanh floor ceil round_ties_even);
            #[inline(always)]
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
            real!(@binary $t: max min powf atan2);
            #[inline(always)]
            fn mul_add(self, a: $t, b: $t) -> $t {
                $t::mul_add(self, a, b)
            }
        }
    };
    (@unary $t:ident: $($f:ident)*) => {$(
        #[inline(always)]
        fn $f(self) -> $t {
            $t::$f(self)
        }
    )*};
    (@binary $t:ident: $($f:ident)*) => {$(
        #[inline(always)]
        fn $f(self, o: $t) -> $t {
            $t::$f(self, o)
        }
    )*};
}

real!(f32, erf_f32, |v: f32| v);
real!(f64, erf_f64, |v: f32| v as f64);

impl UnaryOp {
    /// The reference definition of the op on one `f32`.
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        self.eval(x)
    }

    /// The op on one `f64`: [`UnaryOp::apply`]'s formulas in `f64`, the parameters widened,
    /// `Gelu` with [`erf_f64`].
    pub fn apply_f64(self, x: f64) -> f64 {
        self.eval(x)
    }

    /// The formulas, written once for both widths.
    #[inline(always)]
    fn eval<T: Real>(self, x: T) -> T {
        let (zero, one) = (T::of(0.0), T::of(1.0));
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Exp2 => x.exp2(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Log2 => x.log2(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => one / x.sqrt(),
            UnaryOp::Recip => one / x,
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => one / (one + (-x).exp()),
            UnaryOp::Relu => {
                if x < zero {
                    zero
                } else {
                    x
                }
            }
            UnaryOp::LeakyRelu { slope } => {
                if x < zero {
                    T::of(slope) * x
                } else {
                    x
                }
            }
            UnaryOp::Gelu => T::of(0.5) * x * (one + (x * T::FRAC_1_SQRT_2).erf()),
            UnaryOp::GeluTanh => {
                let inner = T::SQRT_2_OVER_PI * (x + T::GELU_CUBIC * x * x * x);
                T::of(0.5) * x * (one + inner.tanh())
            }
            UnaryOp::Silu => x / (one + (-x).exp()),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Round => x.round_ties_even(),
            UnaryOp::Sign => {
                if x > zero {
                    one
                } else if x < zero {
                    -one
                } else {
                    x
                }
            }
            UnaryOp::Square => x * x,
            UnaryOp::Affine { scale, shift } => T::of(scale).mul_add(x, T::of(shift)),
            UnaryOp::Clamp { lo, hi } => {
                if x.is_nan() {
                    x
                } else {
                    x.max(T::of(lo)).min(T::of(hi))
                }
            }
        }
    }

    /// Every op, with representative parameters (for tests and reports).
    pub fn all() -> Vec<UnaryOp> {
        use UnaryOp::*;
        vec![
            Neg,
            Abs,
            Exp,
            Exp2,
            Log,
            Log2,
            Sqrt,
            Rsqrt,
            Recip,
            Sin,
            Cos,
            Tanh,
            Sigmoid,
            Relu,
            LeakyRelu { slope: 0.01 },
            Gelu,
            Silu,
            Floor,
            Ceil,
            Round,
            Sign,
            Square,
            Affine {
                scale: 1.5,
                shift: -0.25,
            },
            Clamp { lo: -0.5, hi: 0.75 },
            GeluTanh,
        ]
    }
}

/// An elementwise function of two operands. Computed in `f32`. Comparisons produce 1 or 0 in
/// the output's dtype.
///
/// Special values are those of [`BinaryOp::apply`] (IEEE arithmetic and C's `powf`, `fmodf`
/// and `atan2f`) on every backend; each op lists the cases that surprise. Comparisons with a
/// NaN are false, except `Ne`, which is true. As for [`UnaryOp`], a GPU backend may flush
/// subnormals to zero (finite results then within `f32::MIN_POSITIVE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// Floored remainder, the sign of `b` (Python's `%`, PyTorch's `remainder`):
    /// `a - b * floor(a / b)`, computed as C's `fmod(a, b)` plus `b` where the signs differ,
    /// so exact. `rem(a, 0)`, `rem(±inf, b)` and NaNs give NaN; `rem(a, ±inf)` for finite `a`
    /// is `a` when `a` has `b`'s sign (or is 0), else `±inf` (Python and PyTorch alike).
    Rem,
    /// `a^b` (C's `powf`): `pow(a, ±0) = 1` and `pow(1, b) = 1` even for NaN; a negative base
    /// takes an integer exponent (the sign kept for odd ones: `(-2)^3 = -8`, `(-2)^2 = 4`) and
    /// gives NaN for any other; `pow(±0, b < 0) = inf` (`-inf` for `-0` and odd `b`),
    /// `pow(±0, b > 0) = +0` (`-0` for odd `b`); `pow(-1, ±inf) = 1`; `pow(a, inf)` is `inf`
    /// for `|a| > 1` and `0` for `|a| < 1` (the reverse for `-inf`); `pow(NaN, b != 0) = NaN`.
    Pow,
    /// Elementwise maximum; NaN in either operand gives NaN.
    Max,
    /// Elementwise minimum; NaN in either operand gives NaN.
    Min,
    /// `atan2(a, b)`, the angle of the point `(b, a)` (C's `atan2f`): `atan2(±0, +0) = ±0`,
    /// `atan2(±0, -0) = ±pi`, `atan2(±0, b < 0) = ±pi`, `atan2(a != 0, ±0) = ±pi/2`,
    /// `atan2(±inf, ±inf)` is `±pi/4` or `±3pi/4`; NaN in either gives NaN.
    Atan2,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 15] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Atan2,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
    ];

    /// True for the comparisons, whose result is 1 or 0 and which have no gradient.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }

    /// The reference definition of the op on two `f32`s.
    #[inline(always)]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        self.eval(a, b)
    }

    /// The op on two `f64`s: [`BinaryOp::apply`]'s formulas in `f64`.
    pub fn apply_f64(self, a: f64, b: f64) -> f64 {
        self.eval(a, b)
    }

    /// The formulas, written once for both widths.
    #[inline(always)]
    fn eval<T: Real>(self, a: T, b: T) -> T {
        let zero = T::of(0.0);
        let flag = |c: bool| T::of(if c { 1.0 } else { 0.0 });
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Rem => {
                let r = a % b;
                if r != zero && ((r < zero) != (b < zero)) {
                    r + b
                } else {
                    r
                }
            }
            BinaryOp::Pow => a.powf(b),
            BinaryOp::Max | BinaryOp::Min if a.is_nan() || b.is_nan() => T::NAN,
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
            BinaryOp::Atan2 => a.atan2(b),
            BinaryOp::Eq => flag(a == b),
            BinaryOp::Ne => flag(a != b),
            BinaryOp::Lt => flag(a < b),
            BinaryOp::Le => flag(a <= b),
            BinaryOp::Gt => flag(a > b),
            BinaryOp::Ge => flag(a >= b),
        }
    }
}

/// An elementwise function of three operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TernaryOp {
    /// `if a != 0 { b } else { c }` (a NaN condition counts as true, as in C).
    Where,
    /// `a * b + c` with one rounding.
    Fma,
    /// `b + a * (c - b)`: linear interpolation from `b` to `c` by weight `a`.
    Lerp,
}

impl TernaryOp {
    pub const ALL: [TernaryOp; 3] = [TernaryOp::Where, TernaryOp::Fma, TernaryOp::Lerp];

    #[inline(always)]
    pub fn apply(self, a: f32, b: f32, c: f32) -> f32 {
        self.eval(a, b, c)
    }

    /// The op on three `f64`s.
    pub fn apply_f64(self, a: f64, b: f64, c: f64) -> f64 {
        self.eval(a, b, c)
    }

    #[inline(always)]
    fn eval<T: Real>(self, a: T, b: T, c: T) -> T {
        match self {
            TernaryOp::Where => {
                if a != T::of(0.0) {
                    b
                } else {
                    c
                }
            }
            TernaryOp::Fma => a.mul_add(b, c),
            TernaryOp::Lerp => a.mul_add(c - b, b),
        }
    }
}

/// A reduction along axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum; 0 over no elements.
    Sum,
    /// Sum divided by the count; NaN over no elements.
    Mean,
    /// Maximum; NaN if any element is NaN; an error over no elements.
    Max,
    /// Minimum; NaN if any element is NaN; an error over no elements.
    Min,
    /// `log(sum(exp(x)))`, computed as `m + log(sum(exp(x - m)))` with `m` the largest finite
    /// element, so no exponential overflows: the log-partition of a softmax, in one pass over
    /// `x`. NaN if any element is NaN, else `+inf` if any is `+inf`; `-inf` over no elements
    /// or where every element is `-inf`.
    LogSumExp,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::LogSumExp,
    ];
}

/// The index of the extreme element along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgReduceOp {
    ArgMax,
    ArgMin,
}

/// Geometry of a 2-D convolution over NCHW data, shared by `im2col` and `col2im`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dGeometry {
    pub batch: usize,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
}

impl Conv2dGeometry {
    /// Output height and width, or `None` when the kernel does not fit the padded input, a
    /// stride or dilation is 0, or the geometry's arithmetic overflows (checked, never wrapped).
    pub fn output_size(&self) -> Option<(usize, usize)> {
        let dim = |input: usize, k: usize, s: usize, p: usize, d: usize| -> Option<usize> {
            if s == 0 || d == 0 || k == 0 {
                return None;
            }
            let span = d.checked_mul(k - 1)?.checked_add(1)?;
            let padded = input.checked_add(p.checked_mul(2)?)?;
            // Padded coordinates are walked as isize by the backends.
            if padded > isize::MAX as usize {
                return None;
            }
            (padded >= span).then(|| (padded - span) / s + 1)
        };
        Some((
            dim(
                self.height,
                self.kernel.0,
                self.stride.0,
                self.padding.0,
                self.dilation.0,
            )?,
            dim(
                self.width,
                self.kernel.1,
                self.stride.1,
                self.padding.1,
                self.dilation.1,
            )?,
        ))
    }

    /// Shape of the column matrix: `[batch, channels * kh * kw, oh * ow]`, or `None` as
    /// [`Conv2dGeometry::output_size`] or when a product overflows, or when either shape holds
    /// more elements than a buffer can ([`crate::checked_numel`]).
    pub fn cols_shape(&self) -> Option<[usize; 3]> {
        let (oh, ow) = self.output_size()?;
        let rows = self
            .channels
            .checked_mul(self.kernel.0)?
            .checked_mul(self.kernel.1)?;
        let shape = [self.batch, rows, oh.checked_mul(ow)?];
        crate::checked_numel(&shape)?;
        crate::checked_numel(&self.image_shape())?;
        Some(shape)
    }

    /// Shape of the image: `[batch, channels, height, width]`.
    pub fn image_shape(&self) -> [usize; 4] {
        [self.batch, self.channels, self.height, self.width]
    }
}

/// Stochastic gradient descent with momentum, PyTorch's formulation:
/// `g = grad + weight_decay * p`; with momentum `buf = momentum * buf + (1 - dampening) * g`
/// (on the first step, `step == 1`, `buf = g`); `g = nesterov ? g + momentum * buf : buf`;
/// `p -= lr * g`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdParams {
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
    /// 1-based step count; only `step == 1` is special (the momentum buffer starts as `g`).
    pub step: u64,
}

/// Adam and AdamW (PyTorch's formulation). With `decoupled_weight_decay` (AdamW):
/// `p *= 1 - lr * weight_decay`; otherwise `g = grad + weight_decay * p`. Then
/// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
/// `p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamParams {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub decoupled_weight_decay: bool,
    /// 1-based step count, for bias correction.
    pub step: u64,
}

/// The distribution of [`Backend::random`](crate::Backend::random).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Uniform on `[low, high)`.
    Uniform { low: f32, high: f32 },
    /// Normal with the given mean and standard deviation.
    Normal { mean: f32, std: f32 },
}

#[cfg(test)]
mod tests {
    /// `erf_f64` against values from the literature (Abramowitz & Stegun table 7.1, extended
    /// to 16 digits), on both sides of the switch from series to continued fraction.
    #[test]
    fn erf_f64_is_accurate_to_f64() {
        let known = [
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.9999779095030014),
            (4.0, 0.9999999845827421),
        ];
        for (x, want) in known {
            for (x, want) in [(x, want), (-x, -want)] {
                let got = super::erf_f64(x);
                assert!(
                    (got - want).abs() <= 4e-16 * want.abs(),
                    "erf({x}) = {got}, want {want}"
                );
            }
        }
        assert_eq!(super::erf_f64(7.0), 1.0);
        assert!(super::erf_f64(f64::NAN).is_nan());
    }
}
