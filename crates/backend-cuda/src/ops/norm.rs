//! Layer normalisation: `cuda/norm.cu`'s warp-per-row forward and dx kernels, and the
//! parameter gradients in fixed row chunks; for f32 rows of at most 1,024 unit-stride
//! columns, dx and the chunks' partials in one pass over x and the output's gradient.

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
    let params = g.dweight.is_some() || g.dbias.is_some();
    if let Some(kernel) = fused_kernel(x, dout, g, n).filter(|_| params && rows > 0) {
        return fused_backward(gpu, kernel, x, [mean, rstd, dout], g, [rows, n]);
    }
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
    sum_partials(gpu, wide, [&pw, &pb], [used, n], g)
}

/// The `layer_norm_bwd_fused_f32_*` kernel whose lanes hold rows of `n` f32 elements at unit
/// stride (x, dout, dx), or `None` where the fused kernel does not apply (f64, rows wider
/// than 1,024, strided columns).
fn fused_kernel(
    x: NormInputs<'_, CudaBuffer>,
    dout: V<'_>,
    g: NormGrads<'_, CudaBuffer>,
    n: usize,
) -> Option<&'static str> {
    let unit = |v: V<'_>| v.layout.strides.len() == 2 && v.layout.strides[1] == 1;
    let f32s = x.x.dtype() == DType::F32;
    if !(f32s && unit(x.x) && unit(dout) && unit(g.dx)) {
        return None;
    }
    FUSED_KERNELS
        .iter()
        .find(|&&(per_lane, _)| 32 * per_lane >= n)
        .map(|&(_, name)| name)
}

/// The fused kernels by the columns a lane holds (`FUSED_NORM_KERNEL` in `cuda/norm.cu`).
const FUSED_KERNELS: [(usize, &str); 6] = [
    (4, "layer_norm_bwd_fused_f32_4"),
    (8, "layer_norm_bwd_fused_f32_8"),
    (12, "layer_norm_bwd_fused_f32_12"),
    (16, "layer_norm_bwd_fused_f32_16"),
    (24, "layer_norm_bwd_fused_f32_24"),
    (32, "layer_norm_bwd_fused_f32_32"),
];

/// Rows a block of the fused backward takes (a chunk of the parameter gradients' partials),
/// four a warp, and its warps. At 24 columns a lane the kernel holds 158 registers: blocks of
/// four warps fit three to an SM where blocks of eight fit one (GPT-2's LayerNorm backward,
/// H200: 48.6 us a call and 12.1 us for the chunk sum, against 69.2 and 8.4 with 32-row
/// chunks of eight warps, 62.3 and 8.1 with those held to 128 registers, which spills).
const FUSED_ROWS: usize = 16;
const FUSED_WARPS: u32 = 4;

/// dx and the parameter gradients' partials in one pass (`layer_norm_bwd_fused_f32_*`), then
/// the partials summed.
fn fused_backward(
    gpu: &CudaBackend,
    kernel: &'static str,
    x: NormInputs<'_, CudaBuffer>,
    [mean, rstd, dout]: [V<'_>; 3],
    g: NormGrads<'_, CudaBuffer>,
    [rows, n]: [usize; 2],
) -> Result<()> {
    let chunks = rows.div_ceil(FUSED_ROWS);
    // Written whole by the fused kernel before the sum reads them.
    let (pw, pb) = (
        gpu.new_buffer(DType::F32, chunks * n)?,
        gpu.new_buffer(DType::F32, chunks * n)?,
    );
    let a = optional(view(Args::new(), x.x), x.weight, x.x.buffer);
    let a = view(view(view(view(a, mean), rstd), dout), g.dx)
        .arg(pw.ptr())
        .arg(pb.ptr())
        .arg(rows as i64)
        .arg(n as i64)
        .arg(FUSED_ROWS as i64);
    gpu.dev.launch_raw(
        gpu.dev.function(kernel)?,
        (chunks as u32, 1, 1),
        FUSED_WARPS * 32,
        a,
    )?;
    sum_partials(gpu, false, [&pw, &pb], [chunks, n], g)
}

/// The chunks' partials `pw`, `pb` (`chunks x n`) summed into the wanted parameter gradients.
fn sum_partials(
    gpu: &CudaBackend,
    wide: bool,
    [pw, pb]: [&CudaBuffer; 2],
    [chunks, n]: [usize; 2],
    g: NormGrads<'_, CudaBuffer>,
) -> Result<()> {
    let a = Args::new()
        .arg(pw.ptr())
        .arg(pb.ptr())
        .arg(chunks as i64)
        .arg(n as i64);
    let a = optional(a, g.dweight, pw);
    let a = optional(a, g.dbias, pw);
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
