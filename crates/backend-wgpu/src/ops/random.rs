//! Random fills.

use crate::pipeline::{Params, Spec};
use crate::wgsl::Access;
use crate::{V, WgpuBackend};
use hal::{Distribution, Result, validate};

pub(crate) fn random(
    gpu: &WgpuBackend,
    out: V<'_>,
    dist: Distribution,
    seed: u64,
    offset: u64,
) -> Result<()> {
    validate::random(out)?;
    let (normal, a, b) = match dist {
        Distribution::Uniform { low, high } => (0, low, high),
        Distribution::Normal { mean, std } => (1, mean, std),
    };
    let p = Params::default()
        .block(out.layout)
        .scalar(0, seed as u32)
        .scalar(1, (seed >> 32) as u32)
        .scalar(2, offset as u32)
        .scalar(3, (offset >> 32) as u32)
        .f(4, a)
        .f(5, b)
        .scalar(6, normal);
    let dt = out.dtype();
    gpu.run(
        Spec::new("random.wgsl").bindings(vec![(dt, Access::Write)]),
        p,
        &[(out.buffer, true)],
        out.layout.numel(),
    )
}
