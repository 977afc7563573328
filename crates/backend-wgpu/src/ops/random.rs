//! Random fills.

use crate::pipeline::{Params, Spec, launch_params};
use crate::wgsl::Access;
use crate::{V, WgpuBackend};
use hal::{Distribution, Result, validate};

launch_params! {
    /// What random.wgsl reads.
    pub(crate) struct RandomParams {
        seed_lo: u32,
        seed_hi: u32,
        offset_lo: u32,
        offset_hi: u32,
        /// Uniform: low and high; normal: mean and standard deviation.
        a: f32,
        b: f32,
        normal: u32,
    }
}

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
    let p = Params::default().block(out.layout).typed(&RandomParams {
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        offset_lo: offset as u32,
        offset_hi: (offset >> 32) as u32,
        a,
        b,
        normal,
    });
    let dt = out.dtype();
    gpu.run(
        Spec::new("random.wgsl").bindings(vec![(dt, Access::Write)]),
        p,
        &[(out.buffer, true)],
        out.layout.numel(),
    )
}
