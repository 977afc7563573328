//! fill, copy, unary, binary and ternary ops.

use crate::ops::{all_contiguous, broadcast_rows};
use crate::pipeline::{Params, Spec};
use crate::wgsl::Access;
use crate::{V, WgpuBackend, wgsl};
use hal::{BinaryOp, DType, Result, TernaryOp, UnaryOp, View, validate};

/// `op`'s parameters, which [`wgsl::unary_expr`] reads from scalars 0 and 1 (LeakyRelu's
/// slope, Affine's scale and shift, Clamp's bounds); `None` for an op without any.
pub(crate) fn unary_scalars(op: UnaryOp) -> Option<[f32; 2]> {
    match op {
        UnaryOp::LeakyRelu { slope } => Some([slope, 0.0]),
        UnaryOp::Affine { scale, shift } => Some([scale, shift]),
        UnaryOp::Clamp { lo, hi } => Some([lo, hi]),
        _ => None,
    }
}

/// `p` with `op`'s parameters ([`unary_scalars`]) in scalars 0 and 1.
pub(crate) fn unary_params(p: Params, op: UnaryOp) -> Params {
    match unary_scalars(op) {
        Some([first, second]) => p.f(0, first).f(1, second),
        None => p,
    }
}

pub(crate) fn fill(gpu: &WgpuBackend, out: V<'_>, value: f64) -> Result<()> {
    validate::fill(out)?;
    let (ol, []) = hal::in_memory_order(out.layout, []);
    let out = View::new(out.buffer, &ol);
    let dt = out.dtype();
    let spec = Spec::new("fill.wgsl")
        .bindings(vec![(dt, Access::Write)])
        .contiguous_if(out.layout.is_contiguous(), out);
    // One kernel for every dtype: the value goes in as the output's own element bits.
    let p = Params::default()
        .block(out.layout)
        .scalar(0, dt.fill_bits_narrow(value));
    gpu.run(spec, p, &[(out.buffer, true)], out.layout.numel())
}

pub(crate) fn copy(gpu: &WgpuBackend, src: V<'_>, out: V<'_>) -> Result<()> {
    validate::copy(src, out)?;
    let (ol, [sl]) = hal::in_memory_order(out.layout, [src.layout]);
    let (src, out) = (View::new(src.buffer, &sl), View::new(out.buffer, &ol));
    let (a, b) = (src.dtype(), out.dtype());
    let convert = match (a, b) {
        _ if a == b => "stbits2(dst, bits1(src));",
        (DType::I32, DType::U32) => "stbits2(dst, u32(max(ldi1(src), 0)));",
        (DType::U32, DType::I32) => "stbits2(dst, min(bits1(src), 0x7fffffffu));",
        _ => "st2(dst, ld1(src));",
    };
    let spec = Spec::new("copy.wgsl")
        .bindings(wgsl::io(&[a], b))
        .slot("convert", format!("    {convert}"))
        .contiguous_if(
            all_contiguous(&out.layout.shape, &[out.layout, src.layout]),
            out,
        );
    let p = Params::default().block(out.layout).block(src.layout);
    gpu.run(
        spec,
        p,
        &[(src.buffer, false), (out.buffer, true)],
        out.layout.numel(),
    )
}

pub(crate) fn unary(gpu: &WgpuBackend, op: UnaryOp, x: V<'_>, out: V<'_>) -> Result<()> {
    let xl = validate::unary(x, out)?;
    let (ol, [xl]) = hal::in_memory_order(out.layout, [&xl]);
    let out = View::new(out.buffer, &ol);
    let p = unary_params(Params::default().block(out.layout).block(&xl), op);
    let (a, b) = (x.dtype(), out.dtype());
    let expr = wgsl::unary_expr(op);
    let spec = Spec::new("unary.wgsl")
        .bindings(wgsl::io(&[a], b))
        .slot("op", format!("fn op(v: f32) -> f32 {{ return {expr}; }}"))
        .contiguous_if(all_contiguous(&out.layout.shape, &[out.layout, &xl]), out);
    gpu.run(
        spec,
        p,
        &[(x.buffer, false), (out.buffer, true)],
        out.layout.numel(),
    )
}

pub(crate) fn binary(
    gpu: &WgpuBackend,
    op: BinaryOp,
    a: V<'_>,
    b: V<'_>,
    out: V<'_>,
) -> Result<()> {
    let (al, bl) = validate::binary(a, b, out)?;
    let (ol, [al, bl]) = hal::in_memory_order(out.layout, [&al, &bl]);
    let out = View::new(out.buffer, &ol);
    let (da, db, dout) = (a.dtype(), b.dtype(), out.dtype());
    // f32 arithmetic on contiguous operands that start and end on 16-byte boundaries: four
    // elements per load and store, so enough bytes are in flight to reach bandwidth.
    let arithmetic = matches!(
        op,
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
    );
    let n = out.layout.numel();
    let aligned = [out.layout, &al, &bl].iter().all(|l| l.offset % 4 == 0) && n % 4 == 0;
    // `b` contiguous too (binary_vec4), or a broadcast bias (binary_rows_vec4: its offset in
    // elements, then the run each value covers and the values before the pattern repeats).
    let vec4 = if arithmetic
        && aligned
        && [da, db, dout].iter().all(|&d| d == DType::F32)
        && all_contiguous(&out.layout.shape, &[out.layout, &al])
    {
        match broadcast_rows(&bl) {
            _ if all_contiguous(&out.layout.shape, &[&bl]) => Some((
                "binary_vec4.wgsl",
                Params::default().scalar(1, (bl.offset / 4) as u32),
            )),
            Some((inner, outer)) => Some((
                "binary_rows_vec4.wgsl",
                Params::default()
                    .scalar(1, bl.offset as u32)
                    .scalar(3, inner as u32)
                    .scalar(4, outer as u32),
            )),
            None => None,
        }
    } else {
        None
    };
    if let Some((file, p)) = vec4 {
        let p = p
            .scalar(0, (al.offset / 4) as u32)
            .scalar(2, (out.layout.offset / 4) as u32);
        let expr = wgsl::binary_vec4_expr(op);
        let spec = Spec::new(file).slot(
            "op",
            format!("fn op(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {{ return {expr}; }}"),
        );
        return gpu.run(
            spec,
            p,
            &[(a.buffer, false), (b.buffer, false), (out.buffer, true)],
            n / 4,
        );
    }
    let expr = wgsl::binary_expr(op);
    let spec = Spec::new("binary.wgsl")
        .bindings(wgsl::io(&[da, db], dout))
        .slot(
            "op",
            format!("fn op(a: f32, b: f32) -> f32 {{ return {expr}; }}"),
        )
        .contiguous_if(
            all_contiguous(&out.layout.shape, &[out.layout, &al, &bl]),
            out,
        );
    let p = Params::default().block(out.layout).block(&al).block(&bl);
    gpu.run(
        spec,
        p,
        &[(a.buffer, false), (b.buffer, false), (out.buffer, true)],
        out.layout.numel(),
    )
}

pub(crate) fn ternary(
    gpu: &WgpuBackend,
    op: TernaryOp,
    a: V<'_>,
    b: V<'_>,
    c: V<'_>,
    out: V<'_>,
) -> Result<()> {
    let [al, bl, cl] = validate::ternary(a, b, c, out)?;
    let (ol, [al, bl, cl]) = hal::in_memory_order(out.layout, [&al, &bl, &cl]);
    let out = View::new(out.buffer, &ol);
    let dts = [a.dtype(), b.dtype(), c.dtype(), out.dtype()];
    let expr = match op {
        TernaryOp::Where => "select(z, y, x != 0.0)",
        TernaryOp::Fma => "fma(x, y, z)",
        TernaryOp::Lerp => "fma(x, z - y, y)",
    };
    let p = Params::default()
        .block(out.layout)
        .block(&al)
        .block(&bl)
        .block(&cl);
    let spec = Spec::new("ternary.wgsl")
        .bindings(wgsl::io(&[dts[0], dts[1], dts[2]], dts[3]))
        .slot(
            "op",
            format!("fn op(x: f32, y: f32, z: f32) -> f32 {{ return {expr}; }}"),
        )
        .contiguous_if(
            all_contiguous(&out.layout.shape, &[out.layout, &al, &bl, &cl]),
            out,
        );
    gpu.run(
        spec,
        p,
        &[
            (a.buffer, false),
            (b.buffer, false),
            (c.buffer, false),
            (out.buffer, true),
        ],
        out.layout.numel(),
    )
}
