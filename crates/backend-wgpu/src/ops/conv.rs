//! im2col and col2im.

use crate::pipeline::{Params, Spec, launch_params};
use crate::{V, WgpuBackend, wgsl};
use hal::{Conv2dGeometry, Result, validate};

pub(crate) fn im2col(gpu: &WgpuBackend, x: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
    validate::im2col(x, g, out)?;
    let (oh, ow) = g.output_size().expect("validated");
    let p = conv_params(g, oh, ow).block(out.layout).block(x.layout);
    let dts = [x.dtype(), out.dtype()];
    // A thread per window position (it writes the window's kh*kw entries).
    gpu.run(
        Spec::new("im2col.wgsl").bindings(wgsl::io(&[dts[0]], dts[1])),
        p,
        &[(x.buffer, false), (out.buffer, true)],
        g.batch * g.channels * oh * ow,
    )
}

pub(crate) fn col2im(gpu: &WgpuBackend, cols: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
    validate::col2im(cols, g, out)?;
    let (oh, ow) = g.output_size().expect("validated");
    let p = conv_params(g, oh, ow).block(out.layout).block(cols.layout);
    // One thread per pixel gathers every column entry that reads it: no atomics.
    let dts = [cols.dtype(), out.dtype()];
    gpu.run(
        Spec::new("col2im.wgsl").bindings(wgsl::io(&[dts[0]], dts[1])),
        p,
        &[(cols.buffer, false), (out.buffer, true)],
        out.layout.numel(),
    )
}

launch_params! {
    /// What im2col.wgsl and col2im.wgsl read (`shaders/conv/conv_params.wgsl`): the geometry
    /// and the output size.
    pub(crate) struct ConvParams {
        batch: u32,
        channels: u32,
        height: u32,
        width: u32,
        kernel_h: u32,
        kernel_w: u32,
        stride_h: u32,
        stride_w: u32,
        pad_h: u32,
        pad_w: u32,
        dilation_h: u32,
        dilation_w: u32,
        out_h: u32,
        out_w: u32,
    }
}

/// The launch parameters of geometry `g` with an `oh x ow` output.
pub(crate) fn conv_params(g: &Conv2dGeometry, oh: usize, ow: usize) -> Params {
    let u = |v: usize| v as u32;
    Params::default().typed(&ConvParams {
        batch: u(g.batch),
        channels: u(g.channels),
        height: u(g.height),
        width: u(g.width),
        kernel_h: u(g.kernel.0),
        kernel_w: u(g.kernel.1),
        stride_h: u(g.stride.0),
        stride_w: u(g.stride.1),
        pad_h: u(g.padding.0),
        pad_w: u(g.padding.1),
        dilation_h: u(g.dilation.0),
        dilation_w: u(g.dilation.1),
        out_h: u(oh),
        out_w: u(ow),
    })
}
