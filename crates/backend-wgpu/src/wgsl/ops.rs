//! The WGSL spellings of hal's elementwise ops (what an `op` slot returns) and the
//! epilogue and gate slots built from them; the special values they must give are hal's
//! (`UnaryOp`, `BinaryOp`), through the prelude's `*_ref` functions where WGSL's builtins differ.

/// The WGSL expression of a unary op on `v` (scalar parameters in slots 0 and 1). Builtins
/// whose NaN a compiler may lose go through the prelude's `keep_nan` (Chromium's WebGPU on
/// SwiftShader gives `exp(NaN) = inf`; WGSL lets an implementation assume no NaN).
pub fn unary_expr(op: hal::UnaryOp) -> &'static str {
    use hal::UnaryOp::*;
    match op {
        Neg => "-v",
        Abs => "abs(v)",
        Exp => "exp_ref(v)",
        Exp2 => "exp2_ref(v)",
        Log => "log_ref(v)",
        Log2 => "log2_ref(v)",
        Sqrt => "keep_nan(sqrt(v), v)",
        Rsqrt => "keep_nan(1.0 / sqrt(v), v)",
        Recip => "1.0 / v",
        Sin => "sin_ref(v)",
        Cos => "cos_ref(v)",
        Tanh => "tanh_ref(v)",
        Sigmoid => "keep_nan(1.0 / (1.0 + exp(-v)), v)",
        Relu => "relu_ref(v)",
        LeakyRelu { .. } => "select(v, sf(0u) * v, v < 0.0)",
        Gelu => "keep_nan(0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752)), v)",
        Silu => "keep_nan(v / (1.0 + exp(-v)), v)",
        Floor => "keep_nan(floor(v), v)",
        Ceil => "keep_nan(ceil(v), v)",
        Round => "keep_nan(round(v), v)",
        Sign => "select(select(v, -1.0, v < 0.0), 1.0, v > 0.0)",
        Square => "v * v",
        Affine { .. } => "fma(sf(0u), v, sf(1u))",
        Clamp { .. } => "select(min(max(v, sf(0u)), sf(1u)), v, is_nan(v))",
        GeluTanh => {
            "keep_nan(0.5 * v * (1.0 + tanh_ref(0.79788456080286536 * (v + 0.044715 * v * v * v))), v)"
        }
    }
}

/// The WGSL expression of `g` through the derivative of a gate's activation at its output `y`
/// ([`hal::Gate`]; ReLU selects, so a NaN `g` where `y <= 0` gives 0 as the reference does).
pub fn gate_expr(op: hal::UnaryOp) -> &'static str {
    use hal::UnaryOp::*;
    match op {
        Relu => "select(0.0, g, y > 0.0)",
        Sigmoid => "y * (1.0 - y) * g",
        Tanh => "(1.0 - y * y) * g",
        _ => unreachable!("validation admits only hal::Gate::ACTIVATIONS"),
    }
}

/// The `a_load` slot of tile.wgsl and gemm_dot_body.wgsl for a product that reads `a`
/// through a gate: the gate's output in binding 4, each element scalar 15's shift from `a`'s.
pub fn gate_load_slot(op: hal::UnaryOp) -> (&'static str, String) {
    let expr = gate_expr(op);
    (
        "a_load",
        format!(
            "fn lda(i: i32) -> f32 {{\n    let g = ld1(i);\n    let y = ld4(i + si(15u));\n    return {expr};\n}}"
        ),
    )
}

/// The `ones_column` slot of tile.wgsl and gemm_dot_body.wgsl: `b` with a column of ones
/// after its last, so the product's last column sums `a`'s rows.
pub fn ones_column_slot() -> (&'static str, String) {
    ("ones_column", "const ONES_COLUMN: bool = true;".to_string())
}

/// The `row_sums` slot of gemm_sum.wgsl: the partials' last column stored to binding 4 at
/// block 2.
pub fn row_sums_slot() -> (&'static str, String) {
    (
        "row_sums",
        "const ROW_SUMS: bool = true;\nfn row_sum(row: u32, v: f32) { st4(off(2u, row), v); }"
            .to_string(),
    )
}

/// The `dot_epilogue` slot of gemm_dot_body.wgsl, for a product the dot kernel runs whole:
/// the bias from binding `bias` at layout block 3 (the bias broadcast to the output's `[rows,
/// cols]`), then `activation` (one without parameters: gemm's scalars 0 and 1 hold m and n),
/// and the row sums of a column of ones stored to binding `row_sums` at the next block.
pub fn dot_epilogue_slot(
    bias: Option<usize>,
    activation: Option<hal::UnaryOp>,
    row_sums: Option<usize>,
) -> (&'static str, String) {
    let mut text = format!(
        "const ROW_SUMS_APART: bool = {};\nfn epilogue(x: f32, row: u32, col: u32) -> f32 {{\n    var v = x;\n",
        row_sums.is_some()
    );
    if let Some(b) = bias {
        text += &format!(
            "    v = v + ld{b}(block_offset(3u) + i32(row) * block_stride(3u, 0u) + i32(col) * block_stride(3u, 1u));\n"
        );
    }
    text += &format!("    return {};\n}}\n", activation.map_or("v", unary_expr));
    text += &match row_sums {
        Some(r) => {
            let k = 3 + usize::from(bias.is_some());
            format!(
                "fn row_sum(row: u32, v: f32) {{ st{r}(block_offset({k}u) + i32(row) * block_stride({k}u, 0u), v); }}\n"
            )
        }
        None => "fn row_sum(row: u32, v: f32) {}\n".to_string(),
    };
    ("dot_epilogue", text)
}

/// The WGSL expression of a binary op on `a` and `b`.
pub fn binary_expr(op: hal::BinaryOp) -> &'static str {
    use hal::BinaryOp::*;
    match op {
        Add => "a + b",
        Sub => "a - b",
        Mul => "a * b",
        // A divisor beyond 2^126 is scaled first: some drivers divide as a * (1 / b), whose
        // reciprocal would flush to zero (inf / MAX gave NaN, MAX / MAX gave 0).
        Div => "select(a / b, (a * 0.25) / (b * 0.25), abs(b) > 8.507059e37)",
        Rem => "rem_floored(a, b)",
        Pow => "pow_ref(a, b)",
        Max => "select(max(a, b), nan(), is_nan(a) || is_nan(b))",
        Min => "select(min(a, b), nan(), is_nan(a) || is_nan(b))",
        Atan2 => "atan2_ref(a, b)",
        Eq => "select(0.0, 1.0, a == b)",
        // WGSL's `!=` is ordered (false with a NaN); the reference's is not.
        Ne => "select(0.0, 1.0, !(a == b))",
        Lt => "select(0.0, 1.0, a < b)",
        Le => "select(0.0, 1.0, a <= b)",
        Gt => "select(0.0, 1.0, a > b)",
        Ge => "select(0.0, 1.0, a >= b)",
    }
}

/// [`binary_expr`] on `vec4<f32>` operands, for the arithmetic ops the vec4 kernels run.
pub fn binary_vec4_expr(op: hal::BinaryOp) -> &'static str {
    match op {
        hal::BinaryOp::Div => {
            "select(a / b, (a * 0.25) / (b * 0.25), abs(b) > vec4<f32>(8.507059e37))"
        }
        other => binary_expr(other),
    }
}
