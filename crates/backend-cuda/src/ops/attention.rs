//! Scaled dot-product attention: `cuda/attention.cu`'s fused forward pass and its two
//! backward kernels (dk/dv per key row, dq per query row).

use crate::device::Args;
use crate::{CudaBackend, V};
use hal::validate::AttentionShape;
use hal::{
    AttentionGrads, AttentionInputs, AttentionParams, DType, Error, Layout, Precision, Result,
    validate,
};

/// A rank-4 operand as the kernels take it (`Op4` in `cuda/attention.cu`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Op4 {
    off: i64,
    sb: i64,
    sh: i64,
    st: i64,
    sc: i64,
}

fn op4(l: &Layout) -> Op4 {
    let s = |i: usize| l.strides.get(i).copied().unwrap_or(0) as i64;
    Op4 {
        off: l.offset as i64,
        sb: s(0),
        sh: s(1),
        st: s(2),
        sc: s(3),
    }
}

/// `AttnArgs` in `cuda/attention.cu`.
#[repr(C)]
#[derive(Clone, Copy)]
struct AttnArgs {
    heads: i32,
    tq: i32,
    tk: i32,
    d: i32,
    dv: i32,
    causal: i32,
    has_mask: i32,
    dropout_on: i32,
    scale: f32,
    keep_scale: f32,
    seed_lo: u32,
    seed_hi: u32,
    threshold: u32,
    pad: u32,
    offset: u64,
}

/// The widest row each width's kernels hold, per dtype.
const F32_WIDTHS: [usize; 3] = [32, 64, 128];
const F64_WIDTHS: [usize; 1] = [64];

/// The kernels' names for this call, their row width, and the launch arguments.
struct Plan {
    fwd: &'static str,
    bwd_kv: &'static str,
    bwd_q: &'static str,
    row_bytes: usize,
    args: AttnArgs,
}

fn plan(s: &AttentionShape, dtype: DType, has_mask: bool, p: &AttentionParams) -> Result<Plan> {
    const OP: &str = "attention";
    let width = s.d.max(s.dv);
    let wide = dtype == DType::F64;
    let widths: &[usize] = if wide { &F64_WIDTHS } else { &F32_WIDTHS };
    let dmax = widths
        .iter()
        .copied()
        .find(|&w| width <= w)
        .ok_or_else(|| Error::Unsupported {
            op: OP,
            detail: format!(
                "the CUDA kernels hold rows of at most {} {dtype:?} elements; d = {}, dv = {}",
                widths[widths.len() - 1],
                s.d,
                s.dv
            ),
        })?;
    let too_long = [s.tq, s.tk, s.batch * s.heads]
        .iter()
        .any(|&n| n > i32::MAX as usize);
    if too_long || s.tq.div_ceil(16) > 65_535 || s.tk.div_ceil(16) > 65_535 {
        return Err(Error::Unsupported {
            op: OP,
            detail: format!("{s:?} exceeds the CUDA kernels' grid"),
        });
    }
    macro_rules! names {
        ($t:literal, $($w:literal),*) => {
            match dmax {
                $($w => (
                    concat!("attention_fwd_", $t, "_", $w),
                    concat!("attention_bwd_kv_", $t, "_", $w),
                    concat!("attention_bwd_q_", $t, "_", $w),
                ),)*
                _ => unreachable!("widths listed above"),
            }
        };
    }
    let (fwd, bwd_kv, bwd_q) = if wide {
        names!("f64", 64)
    } else {
        names!("f32", 32, 64, 128)
    };
    Ok(Plan {
        fwd,
        bwd_kv,
        bwd_q,
        row_bytes: dmax * dtype.size_in_bytes(),
        args: AttnArgs {
            heads: s.heads as i32,
            tq: s.tq as i32,
            tk: s.tk as i32,
            d: s.d as i32,
            dv: s.dv as i32,
            causal: p.causal as i32,
            has_mask: has_mask as i32,
            dropout_on: (p.dropout > 0.0) as i32,
            scale: p.scale,
            keep_scale: p.keep_scale(),
            seed_lo: p.seed as u32,
            seed_hi: (p.seed >> 32) as u32,
            threshold: p.keep_threshold(),
            pad: 0,
            offset: p.offset,
        },
    })
}

/// The leading operands of every kernel: q, k, v and the mask (q's address and no strides
/// where there is none; `has_mask` says so).
fn inputs(a: Args, x: AttentionInputs<'_, crate::CudaBuffer>, mask: Option<&Layout>) -> Args {
    let a = a
        .arg(x.q.buffer.ptr())
        .arg(op4(x.q.layout))
        .arg(x.k.buffer.ptr())
        .arg(op4(x.k.layout))
        .arg(x.v.buffer.ptr())
        .arg(op4(x.v.layout));
    match (x.mask, mask) {
        (Some(m), Some(l)) => a.arg(m.buffer.ptr()).arg(op4(l)),
        _ => a.arg(x.q.buffer.ptr()).arg(op4(&Layout::contiguous(&[0]))),
    }
}

pub(crate) fn attention(
    gpu: &CudaBackend,
    x: AttentionInputs<'_, crate::CudaBuffer>,
    out: V<'_>,
    lse: V<'_>,
    p: &AttentionParams,
) -> Result<()> {
    let (s, mask) = validate::attention(x, out, lse, p)?;
    let tc = tensor_cores(gpu, &s, &x);
    if x.q.dtype().size_in_bytes() == 2 && tc.is_none() {
        return hal::attention::attention_widened(gpu, x, out, lse, p);
    }
    let plan = plan(&s, x.q.dtype(), mask.is_some(), p)?;
    let bh = s.batch * s.heads;
    if bh == 0 || s.tq == 0 {
        return Ok(());
    }
    gpu.dev.bind()?;
    let args = inputs(Args::new(), x, mask.as_ref())
        .arg(out.buffer.ptr())
        .arg(op4(out.layout))
        .arg(lse.buffer.ptr())
        .arg(op4(lse.layout))
        .arg(plan.args);
    let (f, threads) = match tc {
        Some(names) => (names.fwd, 128),
        None => (plan.fwd, 64),
    };
    gpu.dev.launch_raw(
        gpu.dev.function(f)?,
        (bh as u32, s.tq.div_ceil(64) as u32, 1),
        threads,
        args,
    )
}

pub(crate) fn attention_backward(
    gpu: &CudaBackend,
    x: AttentionInputs<'_, crate::CudaBuffer>,
    out: V<'_>,
    lse: V<'_>,
    dout: V<'_>,
    g: AttentionGrads<'_, crate::CudaBuffer>,
    p: &AttentionParams,
) -> Result<()> {
    let (s, mask) = validate::attention_backward(x, out, lse, dout, g, p)?;
    let tc = tensor_cores(gpu, &s, &x);
    if x.q.dtype().size_in_bytes() == 2 && tc.is_none() {
        return hal::attention::attention_backward_widened(gpu, x, [out, lse, dout], g, p);
    }
    let plan = plan(&s, x.q.dtype(), mask.is_some(), p)?;
    let bh = s.batch * s.heads;
    if bh == 0 {
        return Ok(());
    }
    gpu.dev.bind()?;
    if let Some(names) = tc {
        let io = (out, lse, dout);
        return backward_tc(gpu, (x, mask.as_ref()), io, g, (&s, names), plan.args);
    }
    // Threads per block: one owned row each, as many as keep the owned rows' shared memory
    // near 16 KiB a matrix (`BK`/`BQ` in cuda/attention.cu).
    let owned = (16384 / plan.row_bytes).min(64);
    let common = |a: Args| {
        inputs(a, x, mask.as_ref())
            .arg(out.buffer.ptr())
            .arg(op4(out.layout))
            .arg(lse.buffer.ptr())
            .arg(op4(lse.layout))
            .arg(dout.buffer.ptr())
            .arg(op4(dout.layout))
    };
    if s.tk > 0 {
        gpu.dev.launch_raw(
            gpu.dev.function(plan.bwd_kv)?,
            (bh as u32, s.tk.div_ceil(owned) as u32, 1),
            owned as u32,
            common(Args::new())
                .arg(g.dk.buffer.ptr())
                .arg(op4(g.dk.layout))
                .arg(g.dv.buffer.ptr())
                .arg(op4(g.dv.layout))
                .arg(plan.args),
        )?;
    }
    if s.tq > 0 {
        gpu.dev.launch_raw(
            gpu.dev.function(plan.bwd_q)?,
            (bh as u32, s.tq.div_ceil(owned) as u32, 1),
            owned as u32,
            common(Args::new())
                .arg(g.dq.buffer.ptr())
                .arg(op4(g.dq.layout))
                .arg(plan.args),
        )?;
    }
    Ok(())
}

/// The tensor-core kernels of one element type (`cuda/attention_tc.cuh` for f32 on TF32,
/// `cuda/attention_mma16.cuh` for bf16 and f16 on their own matrix units).
#[derive(Clone, Copy)]
struct TcKernels {
    fwd: &'static str,
    delta: &'static str,
    bwd_kv: &'static str,
    bwd_q: &'static str,
}

/// The tensor-core kernels that take this call, if any: `Precision::Fast` (TF32 products, or
/// 16-bit weights for 16-bit operands, allowed), f32, bf16 or f16 operands (an f32 mask, if
/// any), rows of at most 64.
fn tensor_cores(
    gpu: &CudaBackend,
    s: &AttentionShape,
    x: &AttentionInputs<'_, crate::CudaBuffer>,
) -> Option<TcKernels> {
    let fits = gpu.precision == Precision::Fast
        && s.d <= 64
        && s.dv <= 64
        && x.mask
            .is_none_or(|m| m.dtype() == DType::F32 || x.q.dtype() == DType::F32);
    let names = match x.q.dtype() {
        DType::F32 => TcKernels {
            fwd: "attention_fwd_tc",
            delta: "attention_delta_tc",
            bwd_kv: "attention_bwd_kv_tc",
            bwd_q: "attention_bwd_q_tc",
        },
        DType::BF16 => TcKernels {
            fwd: "attention_fwd_tc_bf16",
            delta: "attention_delta_tc_bf16",
            bwd_kv: "attention_bwd_kv_tc_bf16",
            bwd_q: "attention_bwd_q_tc_bf16",
        },
        DType::F16 => TcKernels {
            fwd: "attention_fwd_tc_f16",
            delta: "attention_delta_tc_f16",
            bwd_kv: "attention_bwd_kv_tc_f16",
            bwd_q: "attention_bwd_q_tc_f16",
        },
        _ => return None,
    };
    fits.then_some(names)
}

/// The tensor-core backward pass: delta per query row, then dk/dv and dq.
fn backward_tc(
    gpu: &CudaBackend,
    (x, mask): (AttentionInputs<'_, crate::CudaBuffer>, Option<&Layout>),
    (out, lse, dout): (V<'_>, V<'_>, V<'_>),
    g: AttentionGrads<'_, crate::CudaBuffer>,
    (s, names): (&AttentionShape, TcKernels),
    args: AttnArgs,
) -> Result<()> {
    let bh = s.batch * s.heads;
    let rows = bh * s.tq;
    let delta = gpu.new_buffer(DType::F32, rows.max(1))?;
    if rows > 0 {
        gpu.dev.launch_raw(
            gpu.dev.function(names.delta)?,
            (rows.div_ceil(8) as u32, 1, 1),
            256,
            Args::new()
                .arg(out.buffer.ptr())
                .arg(op4(out.layout))
                .arg(dout.buffer.ptr())
                .arg(op4(dout.layout))
                .arg(delta.ptr())
                .arg(rows as i64)
                .arg(args),
        )?;
    }
    let common = |a: Args| {
        inputs(a, x, mask)
            .arg(lse.buffer.ptr())
            .arg(op4(lse.layout))
            .arg(dout.buffer.ptr())
            .arg(op4(dout.layout))
            .arg(delta.ptr())
    };
    if s.tk > 0 {
        gpu.dev.launch_raw(
            gpu.dev.function(names.bwd_kv)?,
            (bh as u32, s.tk.div_ceil(64) as u32, 1),
            128,
            common(Args::new())
                .arg(g.dk.buffer.ptr())
                .arg(op4(g.dk.layout))
                .arg(g.dv.buffer.ptr())
                .arg(op4(g.dv.layout))
                .arg(args),
        )?;
    }
    if s.tq > 0 {
        gpu.dev.launch_raw(
            gpu.dev.function(names.bwd_q)?,
            (bh as u32, s.tq.div_ceil(64) as u32, 1),
            128,
            common(Args::new())
                .arg(g.dq.buffer.ptr())
                .arg(op4(g.dq.layout))
                .arg(args),
        )?;
    }
    Ok(())
}
