//! Layer normalisation: `shaders/norm/`'s row kernels (forward, dx; a workgroup a row) and
//! the parameter gradients in fixed row chunks. f32 only.

use crate::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::pipeline::{Params, Spec, launch_params};
use hal::{DType, Layout, NormGrads, NormInputs, Result, View, validate};

type V<'a> = View<'a, WgpuBuffer>;

launch_params! {
    /// What the layer-norm kernels read (`shaders/norm/norm_params.wgsl`).
    pub(crate) struct NormLaunch {
        rows: u32,
        n: u32,
        eps: f32,
        has_w: u32,
        has_b: u32,
        want_w: u32,
        want_b: u32,
        chunks: u32,
        per: u32,
    }
}

/// Rows each thread of the parameter gradients' first pass sums (a chunk): short enough that
/// the GPT step's 16,384 rows make 256 chunks, enough blocks to fill the GPU (chunks of 256
/// rows took 72 us a call on an H100).
const PARTIAL_ROWS: usize = 64;

/// The placeholder layout of an absent operand (never read: its flag is 0).
fn absent() -> Layout {
    Layout::contiguous(&[1])
}

fn params(rows: usize, n: usize, eps: f32, flags: [bool; 4], chunks: usize, per: usize) -> Params {
    let u = |v: usize| v as u32;
    Params::default().typed(&NormLaunch {
        rows: u(rows),
        n: u(n),
        eps,
        has_w: flags[0] as u32,
        has_b: flags[1] as u32,
        want_w: flags[2] as u32,
        want_b: flags[3] as u32,
        chunks: u(chunks),
        per: u(per),
    })
}

pub(crate) fn layer_norm(
    gpu: &WgpuBackend,
    x: NormInputs<'_, WgpuBuffer>,
    out: V<'_>,
    mean: V<'_>,
    rstd: V<'_>,
    eps: f32,
) -> Result<()> {
    const OP: &str = "layer_norm";
    let (rows, n) = validate::layer_norm(x, out, mean, rstd, eps)?;
    gpu.f64_offered(OP, &[x.x.dtype()])?;
    if rows == 0 {
        return Ok(());
    }
    let none = absent();
    let flags = [x.weight.is_some(), x.bias.is_some(), false, false];
    let (w, b) = (
        x.weight.unwrap_or(View::new(x.x.buffer, &none)),
        x.bias.unwrap_or(View::new(x.x.buffer, &none)),
    );
    let p = [x.x, w, b, out, mean, rstd]
        .iter()
        .fold(params(rows, n, eps, flags, 0, 0), |p, v| p.block(v.layout));
    gpu.dispatch_groups(
        &gpu.kernel(&Spec::new("layer_norm.wgsl"))?,
        &p,
        &[
            (x.x.buffer, false),
            (w.buffer, false),
            (b.buffer, false),
            (out.buffer, true),
            (mean.buffer, true),
            (rstd.buffer, true),
        ],
        gpu.row_groups(rows),
    )
}

pub(crate) fn layer_norm_backward(
    gpu: &WgpuBackend,
    x: NormInputs<'_, WgpuBuffer>,
    mean: V<'_>,
    rstd: V<'_>,
    dout: V<'_>,
    g: NormGrads<'_, WgpuBuffer>,
) -> Result<()> {
    const OP: &str = "layer_norm_backward";
    let (rows, n) = validate::layer_norm_backward(x, mean, rstd, dout, g)?;
    gpu.f64_offered(OP, &[x.x.dtype()])?;
    let none = absent();
    let w = x.weight.unwrap_or(View::new(x.x.buffer, &none));
    // At most 1,024 chunks: the sum over chunks stays within lavapipe's loop budget.
    let chunks = rows.div_ceil(PARTIAL_ROWS).clamp(1, 1024);
    let per = rows.div_ceil(chunks).max(1);
    let flags = [
        x.weight.is_some(),
        x.bias.is_some(),
        g.dweight.is_some(),
        g.dbias.is_some(),
    ];
    if rows > 0 {
        let p = [x.x, w, mean, rstd, dout, g.dx]
            .iter()
            .fold(params(rows, n, 0.0, flags, chunks, per), |p, v| {
                p.block(v.layout)
            });
        gpu.dispatch_groups(
            &gpu.kernel(&Spec::new("layer_norm_dx.wgsl"))?,
            &p,
            &[
                (x.x.buffer, false),
                (w.buffer, false),
                (mean.buffer, false),
                (rstd.buffer, false),
                (dout.buffer, false),
                (g.dx.buffer, true),
            ],
            gpu.row_groups(rows),
        )?;
    }
    if (g.dweight.is_none() && g.dbias.is_none()) || n == 0 {
        return Ok(());
    }
    let used = if rows > 0 { chunks } else { 0 };
    let (pw, pb) = (
        gpu.scratch(DType::F32, chunks * n)?,
        gpu.scratch(DType::F32, chunks * n)?,
    );
    if rows > 0 {
        let p = [x.x, mean, rstd, dout]
            .iter()
            .fold(params(rows, n, 0.0, flags, used, per), |p, v| {
                p.block(v.layout)
            });
        gpu.run(
            Spec::new("layer_norm_partial.wgsl"),
            p,
            &[
                (x.x.buffer, false),
                (mean.buffer, false),
                (rstd.buffer, false),
                (dout.buffer, false),
                (&pw, true),
                (&pb, true),
            ],
            chunks * n,
        )?;
    }
    let dummy = gpu.scratch(DType::F32, 1)?;
    let dw = g.dweight.unwrap_or(View::new(&dummy, &none));
    let db = g.dbias.unwrap_or(View::new(&dummy, &none));
    let p = params(rows, n, 0.0, flags, used, per)
        .block(dw.layout)
        .block(db.layout);
    gpu.run(
        Spec::new("layer_norm_params.wgsl"),
        p,
        &[
            (&pw, false),
            (&pb, false),
            (dw.buffer, true),
            (db.buffer, true),
        ],
        n,
    )
}
