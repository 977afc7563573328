//! im2col and col2im.

use crate::pipeline::{Params, Spec};
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

pub(crate) fn conv_params(g: &Conv2dGeometry, oh: usize, ow: usize) -> Params {
    let v = [
        g.batch,
        g.channels,
        g.height,
        g.width,
        g.kernel.0,
        g.kernel.1,
        g.stride.0,
        g.stride.1,
        g.padding.0,
        g.padding.1,
        g.dilation.0,
        g.dilation.1,
        oh,
        ow,
    ];
    let mut p = Params::default();
    for (i, x) in v.into_iter().enumerate() {
        p = p.scalar(i, x as u32);
    }
    p
}
