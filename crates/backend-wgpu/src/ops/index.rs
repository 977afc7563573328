//! gather and scatter_add.

use crate::ops::CHUNK;
use crate::ops::reduce::kept;
use crate::pipeline::{Params, Spec};
use crate::{V, WgpuBackend, wgsl};
use hal::{Result, validate};

pub(crate) fn gather(
    gpu: &WgpuBackend,
    x: V<'_>,
    axis: usize,
    index: V<'_>,
    out: V<'_>,
) -> Result<()> {
    validate::gather(x, axis, index, out)?;
    let guard = gpu.check_indices("gather", index, x.layout.shape[axis])?;
    let xm = kept(x.layout, &index.layout.shape, &[axis]);
    let p = Params::default()
        .block(out.layout)
        .block(index.layout)
        .block(&xm)
        .scalar(0, x.layout.strides[axis] as i32 as u32);
    let dts = [x.dtype(), index.dtype(), out.dtype()];
    gpu.run_guarded(
        Spec::new("gather.wgsl").bindings(wgsl::io(&[dts[0], dts[1]], dts[2])),
        p,
        &[(x.buffer, false), (index.buffer, false), (out.buffer, true)],
        out.layout.numel(),
        Some(guard),
    )
}

pub(crate) fn scatter_add(
    gpu: &WgpuBackend,
    src: V<'_>,
    axis: usize,
    index: V<'_>,
    out: V<'_>,
) -> Result<()> {
    validate::scatter_add(src, axis, index, out)?;
    let guard = gpu.check_indices("scatter_add", index, out.layout.shape[axis])?;
    // One thread per line (all positions but `axis`): each output element has one writer.
    let mut outer = index.layout.shape.clone();
    outer[axis] = 1;
    let (sm, im, om) = (
        kept(src.layout, &outer, &[axis]),
        kept(index.layout, &outer, &[axis]),
        kept(out.layout, &outer, &[axis]),
    );
    let dts = [src.dtype(), index.dtype(), out.dtype()];
    let line = index.layout.shape[axis];
    let threads = if index.layout.numel() == 0 {
        0
    } else {
        hal::numel(&outer)
    };
    // Slices of at most CHUNK along the axis, in order: each element's adds stay ordered.
    let mut j0 = 0;
    while j0 < line {
        let j1 = (j0 + CHUNK).min(line);
        let p = Params::default()
            .block(&sm)
            .block(&im)
            .block(&om)
            .scalar(0, j1 as u32)
            .scalar(1, src.layout.strides[axis] as i32 as u32)
            .scalar(2, index.layout.strides[axis] as i32 as u32)
            .scalar(3, out.layout.strides[axis] as i32 as u32)
            .scalar(4, j0 as u32);
        gpu.run_guarded(
            Spec::new("scatter_add.wgsl").bindings(wgsl::io(&[dts[0], dts[1]], dts[2])),
            p,
            &[
                (src.buffer, false),
                (index.buffer, false),
                (out.buffer, true),
            ],
            threads,
            Some(guard),
        )?;
        j0 = j1;
    }
    Ok(())
}
