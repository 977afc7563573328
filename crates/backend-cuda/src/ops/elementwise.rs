//! fill, copy, unary, binary and ternary ops, and contiguous copies. Where an operand is f64
//! the `*_wide` kernels compute in double (hal's `apply_f64`).

use crate::buffer::CudaBuffer;
use crate::device::Args;
use crate::walk::Walk;
use crate::{CudaBackend, V};
use hal::{BinaryOp, DType, DeviceBuffer, Layout, Result, TernaryOp, UnaryOp, View, validate};

pub(crate) fn unary_code(op: UnaryOp) -> (i32, f32, f32) {
    UnaryOp::all()
        .iter()
        .position(|o| std::mem::discriminant(o) == std::mem::discriminant(&op))
        .map(|i| {
            let (p0, p1) = match op {
                UnaryOp::LeakyRelu { slope } => (slope, 0.0),
                UnaryOp::Affine { scale, shift } => (scale, shift),
                UnaryOp::Clamp { lo, hi } => (lo, hi),
                _ => (0.0, 0.0),
            };
            (i as i32, p0, p1)
        })
        .expect("UnaryOp::all lists every op")
}

/// Whether any of `views` is f64: then the op runs in a `*_wide` kernel.
fn wide(views: &[V<'_>]) -> bool {
    views.iter().any(|v| v.dtype() == DType::F64)
}

/// `name`, or its f64 form `name` with `_kernel` replaced by `_wide_kernel`.
fn kernel_for(name: &'static str, wide: bool) -> &'static str {
    match (name, wide) {
        ("copy_kernel", true) => "copy_wide_kernel",
        ("unary_kernel", true) => "unary_wide_kernel",
        ("binary_kernel", true) => "binary_wide_kernel",
        ("ternary_kernel", true) => "ternary_wide_kernel",
        _ => name,
    }
}

/// True when `v` is a contiguous f32 view starting on a 16-byte boundary.
pub(crate) fn vec4_ready(v: V<'_>) -> bool {
    v.dtype() == DType::F32 && v.layout.is_contiguous() && v.layout.offset % 4 == 0
}

/// The address of a contiguous f32, f16 or bf16 view's first element where it starts on a
/// four-element boundary (the `*_narrow_vec*` kernels' operands), else `None`.
fn narrow_vec4(v: V<'_>) -> Option<u64> {
    let narrow = matches!(v.dtype(), DType::F32 | DType::F16 | DType::BF16);
    (narrow && v.layout.is_contiguous() && v.layout.offset % 4 == 0)
        .then(|| v.buffer.ptr() + (v.layout.offset * v.dtype().size_in_bytes()) as u64)
}

/// Of a family's `[four, eight]` kernels (`*_narrow_vec4`, `*_narrow_vec8`), the one for
/// operands at `addresses`, and the elements a thread takes: eight (16-byte accesses) where
/// every operand starts on a 16-byte boundary, else four.
fn narrow_kernel([four, eight]: [&'static str; 2], addresses: &[u64]) -> (&'static str, usize) {
    match addresses.iter().all(|a| a % 16 == 0) {
        true => (eight, 8),
        false => (four, 4),
    }
}

pub(crate) fn fill(gpu: &CudaBackend, out: V<'_>, value: f64) -> Result<()> {
    validate::fill(out)?;
    gpu.dev.bind()?;
    let (ol, []) = hal::in_memory_order(out.layout, []);
    let w = Walk::of("fill", &ol.shape, &[&ol])?;
    if out.dtype() == DType::F64 {
        let args = Args::new()
            .arg(w)
            .arg(out.buffer.ptr())
            .arg(value.to_bits());
        return gpu.dev.launch("fill_wide_kernel", w.n as usize, args);
    }
    gpu.dev.launch(
        "fill_kernel",
        w.n as usize,
        Args::new()
            .arg(w)
            .arg(out.buffer.ptr())
            .arg(out.dtype().size_in_bytes() as i32)
            .arg(out.dtype().fill_bits_narrow(value)),
    )
}

pub(crate) fn copy(gpu: &CudaBackend, src: V<'_>, out: V<'_>) -> Result<()> {
    validate::copy(src, out)?;
    gpu.dev.bind()?;
    gpu.copy_view(src, out)
}

pub(crate) fn unary(gpu: &CudaBackend, op: UnaryOp, x: V<'_>, out: V<'_>) -> Result<()> {
    let xl = validate::unary(x, out)?;
    gpu.dev.bind()?;
    let (code, p0, p1) = unary_code(op);
    let n = out.layout.numel();
    let (ol, [xl]) = hal::in_memory_order(out.layout, [&xl]);
    if vec4_ready(View::new(out.buffer, &ol)) && vec4_ready(View::new(x.buffer, &xl)) {
        return gpu.dev.launch(
            "unary_f32_vec4",
            n.div_ceil(4),
            Args::new()
                .arg(n as i64)
                .arg(out.buffer.ptr() + out.layout.offset as u64 * 4)
                .arg(x.buffer.ptr() + xl.offset as u64 * 4)
                .arg(code)
                .arg(p0)
                .arg(p1),
        );
    }
    if let (Some(o), Some(xa)) = (
        narrow_vec4(View::new(out.buffer, &ol)),
        narrow_vec4(View::new(x.buffer, &xl)),
    ) {
        let (kernel, per_thread) =
            narrow_kernel(["unary_narrow_vec4", "unary_narrow_vec8"], &[o, xa]);
        return gpu.dev.launch(
            kernel,
            n.div_ceil(per_thread),
            Args::new()
                .arg(n as i64)
                .arg(o)
                .arg(crate::dtype_code(out.dtype()))
                .arg(xa)
                .arg(crate::dtype_code(x.dtype()))
                .arg(code)
                .arg(p0)
                .arg(p1),
        );
    }
    let w = Walk::of("unary", &ol.shape, &[&ol, &xl])?;
    gpu.dev.launch(
        kernel_for("unary_kernel", wide(&[x, out])),
        n,
        Args::new()
            .arg(w)
            .operand(out.buffer)
            .operand(x.buffer)
            .arg(code)
            .arg(p0)
            .arg(p1),
    )
}

pub(crate) fn binary(
    gpu: &CudaBackend,
    op: BinaryOp,
    a: V<'_>,
    b: V<'_>,
    out: V<'_>,
) -> Result<()> {
    let (al, bl) = validate::binary(a, b, out)?;
    gpu.dev.bind()?;
    let code = BinaryOp::ALL.iter().position(|&o| o == op).expect("listed") as i32;
    let n = out.layout.numel();
    let (ol, [al, bl]) = hal::in_memory_order(out.layout, [&al, &bl]);
    if vec4_ready(View::new(out.buffer, &ol))
        && vec4_ready(View::new(a.buffer, &al))
        && vec4_ready(View::new(b.buffer, &bl))
    {
        return gpu.dev.launch(
            "binary_f32_vec4",
            n.div_ceil(4),
            Args::new()
                .arg(n as i64)
                .arg(out.buffer.ptr() + out.layout.offset as u64 * 4)
                .arg(a.buffer.ptr() + al.offset as u64 * 4)
                .arg(b.buffer.ptr() + bl.offset as u64 * 4)
                .arg(code),
        );
    }
    if let (Some(o), Some(aa), Some(ba)) = (
        narrow_vec4(View::new(out.buffer, &ol)),
        narrow_vec4(View::new(a.buffer, &al)),
        narrow_vec4(View::new(b.buffer, &bl)),
    ) {
        let (kernel, per_thread) =
            narrow_kernel(["binary_narrow_vec4", "binary_narrow_vec8"], &[o, aa, ba]);
        return gpu.dev.launch(
            kernel,
            n.div_ceil(per_thread),
            Args::new()
                .arg(n as i64)
                .arg(o)
                .arg(crate::dtype_code(out.dtype()))
                .arg(aa)
                .arg(crate::dtype_code(a.dtype()))
                .arg(ba)
                .arg(crate::dtype_code(b.dtype()))
                .arg(code),
        );
    }
    let w = Walk::of("binary", &ol.shape, &[&ol, &al, &bl])?;
    gpu.dev.launch(
        kernel_for("binary_kernel", wide(&[a, b, out])),
        n,
        Args::new()
            .arg(w)
            .operand(out.buffer)
            .operand(a.buffer)
            .operand(b.buffer)
            .arg(code),
    )
}

pub(crate) fn ternary(
    gpu: &CudaBackend,
    op: TernaryOp,
    a: V<'_>,
    b: V<'_>,
    c: V<'_>,
    out: V<'_>,
) -> Result<()> {
    let [al, bl, cl] = validate::ternary(a, b, c, out)?;
    gpu.dev.bind()?;
    let code = TernaryOp::ALL
        .iter()
        .position(|&o| o == op)
        .expect("listed") as i32;
    let (ol, [al, bl, cl]) = hal::in_memory_order(out.layout, [&al, &bl, &cl]);
    let w = Walk::of("ternary", &ol.shape, &[&ol, &al, &bl, &cl])?;
    gpu.dev.launch(
        kernel_for("ternary_kernel", wide(&[a, b, c, out])),
        w.n as usize,
        Args::new()
            .arg(w)
            .operand(out.buffer)
            .operand(a.buffer)
            .operand(b.buffer)
            .operand(c.buffer)
            .arg(code),
    )
}

impl CudaBackend {
    /// Makes `v` a contiguous buffer of `dtype` (the buffer itself when it already is one).
    pub(crate) fn contiguous(&self, v: V<'_>, dtype: DType) -> Result<CudaBuffer> {
        if v.layout.is_contiguous()
            && v.layout.offset == 0
            && v.dtype() == dtype
            && v.buffer.len() == v.layout.numel()
        {
            return Ok(v.buffer.clone());
        }
        let out = self.new_buffer(dtype, v.layout.numel())?;
        let l = Layout::contiguous(&v.layout.shape);
        self.copy_view(v, View::new(&out, &l))?;
        Ok(out)
    }

    pub(crate) fn copy_view(&self, src: V<'_>, out: V<'_>) -> Result<()> {
        let (ol, [sl]) = hal::in_memory_order(out.layout, [src.layout]);
        // A conversion between contiguous narrow floats, four or eight elements a thread (a
        // copy within one dtype keeps its bits in `copy_kernel`).
        if src.dtype() != out.dtype()
            && let (Some(o), Some(x)) = (
                narrow_vec4(View::new(out.buffer, &ol)),
                narrow_vec4(View::new(src.buffer, &sl)),
            )
        {
            let n = ol.numel();
            let (kernel, per_thread) =
                narrow_kernel(["convert_narrow_vec4", "convert_narrow_vec8"], &[o, x]);
            return self.dev.launch(
                kernel,
                n.div_ceil(per_thread),
                Args::new()
                    .arg(n as i64)
                    .arg(o)
                    .arg(crate::dtype_code(out.dtype()))
                    .arg(x)
                    .arg(crate::dtype_code(src.dtype())),
            );
        }
        let w = Walk::of("copy", &ol.shape, &[&ol, &sl])?;
        self.dev.launch(
            kernel_for("copy_kernel", wide(&[src, out])),
            w.n as usize,
            Args::new().arg(w).operand(out.buffer).operand(src.buffer),
        )
    }

    /// `v` as f32: itself, or a contiguous f32 copy of another float dtype.
    pub(crate) fn as_f32(&self, v: V<'_>) -> Result<(CudaBuffer, Layout)> {
        if v.dtype() == DType::F32 {
            Ok((v.buffer.clone(), v.layout.clone()))
        } else {
            let c = self.contiguous(v, DType::F32)?;
            Ok((c, Layout::contiguous(&v.layout.shape)))
        }
    }
}
