//! Scaled dot-product attention: `shaders/attention/`'s fused forward pass and its three
//! backward passes (delta, dk/dv per key row, dq per query row). f32 only.

use crate::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::pipeline::{Params, Spec, launch_params};
use hal::validate::AttentionShape;
use hal::{
    AttentionGrads, AttentionInputs, AttentionParams, DType, Error, Layout, Result, View, validate,
};

type V<'a> = View<'a, WgpuBuffer>;

launch_params! {
    /// What the attention kernels read (`shaders/attention/attention_params.wgsl`).
    pub(crate) struct AttentionLaunch {
        heads: u32,
        tq: u32,
        tk: u32,
        d: u32,
        dv: u32,
        causal: u32,
        has_mask: u32,
        dropout_on: u32,
        scale: f32,
        keep_scale: f32,
        seed_lo: u32,
        seed_hi: u32,
        threshold: u32,
        offset_lo: u32,
        offset_hi: u32,
    }
}

/// The widest rows the kernels hold in registers, by instantiation.
const WIDTHS: [u32; 3] = [32, 64, 128];
/// Rows a workgroup owns (the kernels' `@workgroup_size`).
const ROWS: usize = 64;

/// The row width to instantiate, the launch parameters and the workgroup grid's limit check.
fn plan(
    gpu: &WgpuBackend,
    op: &'static str,
    s: &AttentionShape,
    has_mask: bool,
    p: &AttentionParams,
) -> Result<(u32, Params)> {
    let width = s.d.max(s.dv);
    let dmax = WIDTHS
        .iter()
        .copied()
        .find(|&w| width <= w as usize)
        .ok_or_else(|| Error::Unsupported {
            op,
            detail: format!(
                "the wgpu kernels hold rows of at most 128 elements; d = {}, dv = {}",
                s.d, s.dv
            ),
        })?;
    // A CPU adapter (lavapipe) stops each invocation's loops after 65535 iterations in all
    // and carries on with wrong values; these kernels' loops over the other side's rows
    // (unrolled by its compiler at width 32, not at 64 or 128) reach that beyond these
    // lengths (measured on lavapipe: forward and backward exact up to them, wrong past 352 at
    // width 64 and 192 at 128). Refused there rather than computed wrong.
    if gpu.0.info.device_type == wgpu::DeviceType::Cpu {
        let limit = match dmax {
            32 => 4096,
            64 => 320,
            _ => 160,
        };
        if s.tq.max(s.tk) > limit {
            return Err(Error::Unsupported {
                op,
                detail: format!(
                    "this CPU adapter ({}) caps a shader's loop iterations: attention over rows of width {dmax} runs to {limit} queries and keys here, got tq = {}, tk = {}",
                    gpu.0.info.name, s.tq, s.tk
                ),
            });
        }
    }
    let max = gpu.0.limits.max_compute_workgroups_per_dimension as usize;
    let tiles = s.tq.max(s.tk).div_ceil(ROWS);
    if s.batch * s.heads > max || tiles > max || s.batch * s.heads * s.tq > u32::MAX as usize {
        return Err(Error::Unsupported {
            op,
            detail: format!("{s:?} exceeds the adapter's workgroup grid ({max} a dimension)"),
        });
    }
    let u = |v: usize| v as u32;
    let params = Params::default().typed(&AttentionLaunch {
        heads: u(s.heads),
        tq: u(s.tq),
        tk: u(s.tk),
        d: u(s.d),
        dv: u(s.dv),
        causal: p.causal as u32,
        has_mask: has_mask as u32,
        dropout_on: (p.dropout > 0.0) as u32,
        scale: p.scale,
        keep_scale: p.keep_scale(),
        seed_lo: p.seed as u32,
        seed_hi: (p.seed >> 32) as u32,
        threshold: p.keep_threshold(),
        offset_lo: p.offset as u32,
        offset_hi: (p.offset >> 32) as u32,
    });
    Ok((dmax, params))
}

fn spec(file: &'static str, dmax: u32) -> Spec {
    Spec::new(file).slot("dmax", format!("const DMAX: u32 = {dmax}u;\n"))
}

/// The mask operand (q's buffer and layout where there is none: never read then).
fn mask_of<'a>(x: &AttentionInputs<'a, WgpuBuffer>, mask: &'a Option<Layout>) -> V<'a> {
    match (x.mask, mask) {
        (Some(m), Some(l)) => View::new(m.buffer, l),
        _ => x.q,
    }
}

pub(crate) fn attention(
    gpu: &WgpuBackend,
    x: AttentionInputs<'_, WgpuBuffer>,
    out: V<'_>,
    lse: V<'_>,
    p: &AttentionParams,
) -> Result<()> {
    const OP: &str = "attention";
    let (s, mask) = validate::attention(x, out, lse, p)?;
    if x.q.dtype().size_in_bytes() == 2 {
        // The shaders read f32: 16-bit operands go through f32 copies.
        return hal::attention::attention_widened(gpu, x, out, lse, p);
    }
    gpu.f64_offered(OP, &[x.q.dtype()])?;
    if s.batch * s.heads == 0 || s.tq == 0 {
        return Ok(());
    }
    let (dmax, params) = plan(gpu, OP, &s, mask.is_some(), p)?;
    let m = mask_of(&x, &mask);
    let params = [x.q, x.k, x.v, m, out, lse]
        .iter()
        .fold(params, |p, v| p.block(v.layout));
    gpu.dispatch_groups(
        &gpu.kernel(&spec("attention_fwd.wgsl", dmax))?,
        &params,
        &[
            (x.q.buffer, false),
            (x.k.buffer, false),
            (x.v.buffer, false),
            (m.buffer, false),
            (out.buffer, true),
            (lse.buffer, true),
        ],
        [(s.batch * s.heads) as u32, s.tq.div_ceil(ROWS) as u32, 1],
    )
}

pub(crate) fn attention_backward(
    gpu: &WgpuBackend,
    x: AttentionInputs<'_, WgpuBuffer>,
    out: V<'_>,
    lse: V<'_>,
    dout: V<'_>,
    g: AttentionGrads<'_, WgpuBuffer>,
    p: &AttentionParams,
) -> Result<()> {
    const OP: &str = "attention_backward";
    let (s, mask) = validate::attention_backward(x, out, lse, dout, g, p)?;
    if x.q.dtype().size_in_bytes() == 2 {
        return hal::attention::attention_backward_widened(gpu, x, [out, lse, dout], g, p);
    }
    gpu.f64_offered(OP, &[x.q.dtype()])?;
    let bh = s.batch * s.heads;
    if bh == 0 {
        return Ok(());
    }
    let (dmax, params) = plan(gpu, OP, &s, mask.is_some(), p)?;
    let m = mask_of(&x, &mask);
    let delta = gpu.scratch(DType::F32, (bh * s.tq).max(1))?;
    gpu.run(
        Spec::new("attention_delta.wgsl"),
        params.clone().block(out.layout).block(dout.layout),
        &[(out.buffer, false), (dout.buffer, false), (&delta, true)],
        bh * s.tq,
    )?;
    let common = [x.q, x.k, x.v, m, lse, dout]
        .iter()
        .fold(params, |p, v| p.block(v.layout));
    let reads = [
        (x.q.buffer, false),
        (x.k.buffer, false),
        (x.v.buffer, false),
        (m.buffer, false),
        (lse.buffer, false),
        (dout.buffer, false),
        (&delta, false),
    ];
    if s.tk > 0 {
        let mut buffers = reads.to_vec();
        buffers.extend([(g.dk.buffer, true), (g.dv.buffer, true)]);
        gpu.dispatch_groups(
            &gpu.kernel(&spec("attention_bwd_kv.wgsl", dmax))?,
            &common.clone().block(g.dk.layout).block(g.dv.layout),
            &buffers,
            [bh as u32, s.tk.div_ceil(ROWS) as u32, 1],
        )?;
    }
    if s.tq > 0 {
        let mut buffers = reads.to_vec();
        buffers.push((g.dq.buffer, true));
        gpu.dispatch_groups(
            &gpu.kernel(&spec("attention_bwd_q.wgsl", dmax))?,
            &common.block(g.dq.layout),
            &buffers,
            [bh as u32, s.tq.div_ceil(ROWS) as u32, 1],
        )?;
    }
    Ok(())
}
