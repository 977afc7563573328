//! Layer normalisation: `cuda/norm.cu`'s warp-per-row forward and dx kernels, and the
//! parameter gradients in fixed row chunks.

use crate::device::Args;
use crate::{CudaBackend, CudaBuffer, V};
use hal::{DType, Layout, NormGrads, NormInputs, Result, validate};

/// A rank-2 or rank-1 operand as the kernels take it (`Op2` in `cuda/norm.cu`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Op2 {
    off: i64,
    s0: i64,
    s1: i64,
}

fn op2(l: &Layout) -> Op2 {
    let s = |i: usize| l.strides.get(i).copied().unwrap_or(0) as i64;
    Op2 {
        off: l.offset as i64,
        s0: s(0),
        s1: s(1),
    }
}

/// An operand's address and `Op2`; an absent one is `fallback`'s address, no strides.
fn optional(a: Args, v: Option<V<'_>>, fallback: &CudaBuffer) -> Args {
    match v {
        Some(v) => a.arg(v.buffer.ptr()).arg(op2(v.layout)).arg(1i32),
        None => a
            .arg(fallback.ptr())
            .arg(op2(&Layout::contiguous(&[0])))
            .arg(0i32),
    }
}

fn view(a: Args, v: V<'_>) -> Args {
    a.arg(v.buffer.ptr()).arg(op2(v.layout))
}

/// Rows each thread of the parameter gradients' first pass sums (a chunk): short enough that
/// the GPT step's 16,384 rows make 256 chunks, enough blocks to fill the GPU (chunks of 256
/// rows took 72 us a call on an H100).
const PARTIAL_ROWS: usize = 64;

/// Rows per block of the warp-per-row kernels (8 warps).
const ROWS_PER_BLOCK: usize = 8;

fn name(wide: bool, f32_name: &'static str, f64_name: &'static str) -> &'static str {
    if wide { f64_name } else { f32_name }
}

pub(crate) fn layer_norm(
    gpu: &CudaBackend,
    x: NormInputs<'_, CudaBuffer>,
    out: V<'_>,
    mean: V<'_>,
    rstd: V<'_>,
    eps: f32,
) -> Result<()> {
    let (rows, n) = validate::layer_norm(x, out, mean, rstd, eps)?;
    if rows == 0 {
        return Ok(());
    }
    gpu.dev.bind()?;
    let wide = x.x.dtype() == DType::F64;
    let a = view(Args::new(), x.x);
    let a = optional(a, x.weight, x.x.buffer);
    let a = optional(a, x.bias, x.x.buffer);
    let a = view(view(view(a, out), mean), rstd)
        .arg(rows as i64)
        .arg(n as i64)
        .arg(eps);
    gpu.dev.launch_raw(
        gpu.dev
            .function(name(wide, "layer_norm_fwd_f32", "layer_norm_fwd_f64"))?,
        (rows.div_ceil(ROWS_PER_BLOCK) as u32, 1, 1),
        (ROWS_PER_BLOCK * 32) as u32,
        a,
    )
}

pub(crate) fn layer_norm_backward(
    gpu: &CudaBackend,
    x: NormInputs<'_, CudaBuffer>,
    mean: V<'_>,
    rstd: V<'_>,
    dout: V<'_>,
    g: NormGrads<'_, CudaBuffer>,
) -> Result<()> {
    let (rows, n) = validate::layer_norm_backward(x, mean, rstd, dout, g)?;
    gpu.dev.bind()?;
    let wide = x.x.dtype() == DType::F64;
    if rows > 0 {
        let a = optional(view(Args::new(), x.x), x.weight, x.x.buffer);
        let a = view(view(view(view(a, mean), rstd), dout), g.dx)
            .arg(rows as i64)
            .arg(n as i64);
        gpu.dev.launch_raw(
            gpu.dev
                .function(name(wide, "layer_norm_bwd_dx_f32", "layer_norm_bwd_dx_f64"))?,
            (rows.div_ceil(ROWS_PER_BLOCK) as u32, 1, 1),
            (ROWS_PER_BLOCK * 32) as u32,
            a,
        )?;
    }
    if (g.dweight.is_none() && g.dbias.is_none()) || n == 0 {
        return Ok(());
    }
    // Fixed chunks of rows (a function of the row count only: deterministic).
    let chunks = rows.div_ceil(PARTIAL_ROWS).clamp(1, 4096);
    let per = rows.div_ceil(chunks).max(1);
    let dtype = x.x.dtype();
    // Written whole by the partial kernel before the sum reads them.
    let (pw, pb) = (
        gpu.new_buffer(dtype, chunks * n)?,
        gpu.new_buffer(dtype, chunks * n)?,
    );
    let cols = n.div_ceil(128) as u32;
    if rows > 0 {
        let a = view(view(view(view(Args::new(), x.x), mean), rstd), dout)
            .arg(pw.ptr())
            .arg(pb.ptr())
            .arg(rows as i64)
            .arg(n as i64)
            .arg(per as i64);
        gpu.dev.launch_raw(
            gpu.dev.function(name(
                wide,
                "layer_norm_bwd_partial_f32",
                "layer_norm_bwd_partial_f64",
            ))?,
            (cols, chunks as u32, 1),
            128,
            a,
        )?;
    }
    let used = if rows > 0 { chunks } else { 0 };
    let a = Args::new()
        .arg(pw.ptr())
        .arg(pb.ptr())
        .arg(used as i64)
        .arg(n as i64);
    let a = optional(a, g.dweight, &pw);
    let a = optional(a, g.dbias, &pw);
    gpu.dev.launch_raw(
        gpu.dev.function(name(
            wide,
            "layer_norm_bwd_params_f32",
            "layer_norm_bwd_params_f64",
        ))?,
        // A warp a column, eight a block.
        (n.div_ceil(8).max(1) as u32, 1, 1),
        256,
        a,
    )
}
