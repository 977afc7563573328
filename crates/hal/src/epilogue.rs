//! What a matrix product does besides multiplying ([`Backend::matmul_epilogue`]): the
//! [`Epilogue`] (bias, activation, a gated `a`, `a`'s row sums), the activation [`Gate`], and
//! [`matmul_epilogue_steps`], the epilogue as separate primitive calls (the trait's default).

use crate::{Backend, BinaryOp, DType, Layout, ReduceOp, Result, TernaryOp, UnaryOp, View};

/// What a matrix product does besides multiplying ([`Backend::matmul_epilogue`]). The forward
/// pass of a layer: `out = activation(product + bias)` (cuBLASLt's `BIAS` and `RELU_BIAS`
/// epilogues). Its backward pass: `a` gated by the activation's derivative as the product
/// reads it (`a_gate`), and the rows of the gated `a` summed beside the product
/// (`a_row_sums`, cuBLASLt's `BGRADA`): a Linear layer's weight gradient
/// `(g * act'(y))^T @ x` and its bias gradient in one call, with no pass of their own. Every
/// part may be absent.
#[derive(Debug)]
pub struct Epilogue<'a, Buf> {
    /// Added to the product; broadcasts to the output's shape (a Linear layer's bias `[n]`).
    pub bias: Option<View<'a, Buf>>,
    /// Applied last, element by element.
    pub activation: Option<UnaryOp>,
    /// The product reads `a[.., i, p] * activation'(output[.., i, p])` in `a`'s place.
    pub a_gate: Option<Gate<'a, Buf>>,
    /// Also stores `alpha * sum_p gated_a[.., i, p]` here (beta does not apply): shape `a`'s
    /// without its last axis (`[m]`, or `[batch, m]`), float, not overlapping any operand.
    pub a_row_sums: Option<View<'a, Buf>>,
}

/// The derivative of an activation, from the activation's output `y`, by which a product
/// scales its `a` operand ([`Epilogue::a_gate`]): `a` is the gradient at the activation's
/// output and the product takes it on through the activation. `output` has `a`'s shape (any
/// strides; a backend may fuse only where they are `a`'s) and a float dtype.
#[derive(Debug)]
pub struct Gate<'a, Buf> {
    /// One of [`Gate::ACTIVATIONS`].
    pub activation: UnaryOp,
    /// The activation's output.
    pub output: View<'a, Buf>,
}

impl<Buf> Clone for Gate<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for Gate<'_, Buf> {}

impl<Buf> Gate<'_, Buf> {
    /// The activations whose derivative is a function of their output, as a gate needs:
    /// ReLU (`1` where `y > 0`, else `0`: the gradient passes or is dropped, never
    /// multiplied, so a NaN or infinite gradient where `y <= 0` gives `0`), sigmoid
    /// (`y (1 - y)`) and tanh (`1 - y^2`).
    pub const ACTIVATIONS: [UnaryOp; 3] = [UnaryOp::Relu, UnaryOp::Sigmoid, UnaryOp::Tanh];
}

impl<Buf> Clone for Epilogue<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for Epilogue<'_, Buf> {}

impl<Buf> Default for Epilogue<'_, Buf> {
    fn default() -> Self {
        Self {
            bias: None,
            activation: None,
            a_gate: None,
            a_row_sums: None,
        }
    }
}

impl<Buf> Epilogue<'_, Buf> {
    /// True when it changes nothing (a plain product).
    pub fn is_empty(&self) -> bool {
        self.bias.is_none()
            && self.activation.is_none()
            && self.a_gate.is_none()
            && self.a_row_sums.is_none()
    }
}

/// [`Backend::matmul_epilogue`] as separate calls: the gated `a` made whole (in a scratch
/// buffer, by elementwise calls), the product, the row sums (a reduction, scaled by alpha),
/// then the bias added and the activation applied in place. The trait's default, and the
/// fallback of a backend that fuses only some products.
pub fn matmul_epilogue_steps<B: Backend>(
    backend: &B,
    [a, b, out]: [View<'_, B::Buffer>; 3],
    alpha: f32,
    beta: f32,
    epilogue: Epilogue<'_, B::Buffer>,
) -> Result<()> {
    crate::validate::matmul_epilogue([a, b, out], &epilogue)?;
    let contiguous = Layout::contiguous(&a.layout.shape);
    let gated = match epilogue.a_gate {
        Some(gate) => Some(gated_operand(backend, a, gate)?),
        None => None,
    };
    let a = match &gated {
        Some(buffer) => View::new(buffer, &contiguous),
        None => a,
    };
    // The gated operand is f32 (the gate applied in f32, rounded once); the product wants
    // both operands of one dtype.
    let b_layout = Layout::contiguous(&b.layout.shape);
    let b_f32 = match gated.is_some() && b.dtype() != DType::F32 {
        true => {
            let widened = backend.alloc_for_write(DType::F32, b_layout.numel().max(1))?;
            backend.copy(b, View::new(&widened, &b_layout))?;
            Some(widened)
        }
        false => None,
    };
    let b = match &b_f32 {
        Some(buffer) => View::new(buffer, &b_layout),
        None => b,
    };
    backend.matmul(a, b, out, alpha, beta)?;
    if let Some(sums) = epilogue.a_row_sums {
        // The reduction keeps the summed axis as size 1.
        let mut kept = sums.layout.clone();
        kept.shape.push(1);
        kept.strides.push(1);
        let kept = View::new(sums.buffer, &kept);
        backend.reduce(ReduceOp::Sum, a, &[a.layout.rank() - 1], kept)?;
        if alpha != 1.0 {
            let scale = UnaryOp::Affine {
                scale: alpha,
                shift: 0.0,
            };
            backend.unary(scale, sums, sums)?;
        }
    }
    if let Some(bias) = epilogue.bias {
        backend.binary(BinaryOp::Add, out, bias, out)?;
    }
    if let Some(op) = epilogue.activation {
        backend.unary(op, out, out)?;
    }
    Ok(())
}

/// `a` through the gate's derivative, as a contiguous f32 buffer of `a`'s shape, by
/// elementwise calls (validated by the caller).
fn gated_operand<B: Backend>(
    backend: &B,
    a: View<'_, B::Buffer>,
    gate: Gate<'_, B::Buffer>,
) -> Result<B::Buffer> {
    let shape = Layout::contiguous(&a.layout.shape);
    let scratch = || backend.alloc_for_write(DType::F32, shape.numel().max(1));
    let (gated, derivative) = (scratch()?, scratch()?);
    let (gated_view, derivative_view) = (View::new(&gated, &shape), View::new(&derivative, &shape));
    let y = gate.output;
    let one_minus = UnaryOp::Affine {
        scale: -1.0,
        shift: 1.0,
    };
    match gate.activation {
        UnaryOp::Relu => {
            // A select, not a product: where y <= 0 the gradient is dropped even if NaN.
            let zero = backend.alloc(DType::F32, 1)?;
            let zero_view = Layout {
                shape: shape.shape.clone(),
                strides: vec![0; shape.rank()],
                offset: 0,
            };
            let zero_view = View::new(&zero, &zero_view);
            backend.binary(BinaryOp::Gt, y, zero_view, derivative_view)?;
            backend.ternary(TernaryOp::Where, derivative_view, a, zero_view, gated_view)?;
        }
        UnaryOp::Sigmoid => {
            backend.unary(one_minus, y, gated_view)?;
            backend.binary(BinaryOp::Mul, y, gated_view, derivative_view)?;
            backend.binary(BinaryOp::Mul, derivative_view, a, gated_view)?;
        }
        UnaryOp::Tanh => {
            backend.unary(UnaryOp::Square, y, gated_view)?;
            backend.unary(one_minus, gated_view, derivative_view)?;
            backend.binary(BinaryOp::Mul, derivative_view, a, gated_view)?;
        }
        op => unreachable!("validation admits only Gate::ACTIVATIONS, not {op:?}"),
    }
    Ok(gated)
}
