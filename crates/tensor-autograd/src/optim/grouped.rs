//! Adam's eager steps as a few grouped launches on backends where each launch costs more
//! than a small parameter's update (those that capture graphs: CUDA, and wgpu where it
//! records).
//!
//! The update programs are the recorded steps' ([`adam_group_program`], a launch per
//! [`EAGER_GROUP`] parameters over the longest), reading this step's `[lr, beta1^t, beta2^t]`
//! from a three-float device buffer the host writes before the launches (stream-ordered,
//! so earlier launches still read the values of their own step). The arithmetic is the
//! fused `adam_step`'s, rounding for rounding, with the bias corrections from the same f32
//! powers the backends compute on the host.

use super::{
    ADAM_GROUP, Adam, AdamGroup, GroupRole, adam_group_program, dense_grad, unique_params,
};
use crate::error::Result;
use crate::tensor::Tensor;
use hal::{AdamParams, Backend, BackendExt, DType};

/// Parameters per eager launch at most: the backend's [`hal::Capabilities::program_buffers`]
/// (four buffers a parameter and the values) decides below this.
const EAGER_GROUP: usize = 4 * ADAM_GROUP;

/// The built launches and what they were built for.
pub(super) struct EagerGroups<B: Backend> {
    values: B::Buffer,
    groups: Vec<AdamGroup<B>>,
    lens: Vec<usize>,
    /// The hyperparameters baked into the programs (the learning rate is read from `values`).
    baked: AdamParams,
}

impl<B: Backend> Adam<B> {
    /// One step as grouped launches where the backend captures graphs and every parameter is
    /// a nonempty dense f32 tensor with a gradient; `false` (nothing done) otherwise, for the
    /// per-parameter path.
    pub(super) fn grouped_step(&mut self, params: &[Tensor<B>]) -> Result<bool> {
        let params = unique_params(params);
        let Some(first) = params.first() else {
            return Ok(false);
        };
        let b = first.backend().clone();
        let caps = b.capabilities();
        let per_launch = EAGER_GROUP.min(caps.program_buffers.saturating_sub(1) / 4);
        if !caps.graph_capture
            || per_launch == 0
            || params
                .iter()
                .any(|p| p.numel() == 0 || p.dtype() != DType::F32 || !p.is_dense())
        {
            return Ok(false);
        }
        let mut grads = Vec::with_capacity(params.len());
        for p in params.iter() {
            match dense_grad(p, "Adam::step")? {
                Some(g) => grads.push(g),
                None => return Ok(false),
            }
        }
        self.state.ensure("Adam::step", &params, 2)?;
        let lens: Vec<usize> = params.iter().map(|p| p.numel()).collect();
        let baked = AdamParams {
            lr: 0.0,
            step: 0,
            ..self.hyper
        };
        let stale = self
            .eager
            .as_ref()
            .is_none_or(|e| e.lens != lens || e.baked != baked);
        if stale {
            let mut groups = Vec::new();
            for start in (0..lens.len()).step_by(per_launch) {
                let members = start..(start + per_launch).min(lens.len());
                let group_lens = &lens[members.clone()];
                groups.push(AdamGroup {
                    kernel: b.compile(&adam_group_program(
                        &baked,
                        group_lens,
                        GroupRole::Alone,
                    )?)?,
                    longest: group_lens.iter().copied().max().unwrap_or(0),
                    members,
                    role: GroupRole::Alone,
                });
            }
            self.eager = Some(EagerGroups {
                values: b.alloc(DType::F32, 3)?,
                groups,
                lens,
                baked,
            });
        }
        let e = self.eager.as_ref().expect("built above");
        self.state.steps += 1;
        let t = self.state.steps.min(i32::MAX as u64) as i32;
        let h = &self.hyper;
        b.write(&e.values, &[h.lr, h.beta1.powi(t), h.beta2.powi(t)])?;
        for group in &e.groups {
            let mut args: Vec<&B::Buffer> = Vec::with_capacity(4 * group.members.len() + 1);
            for i in group.members.clone() {
                let state = &self.state.buffers[i];
                args.extend([params[i].buffer(), grads[i].buffer(), &state[0], &state[1]]);
            }
            args.push(&e.values);
            b.launch(&group.kernel, &args, group.longest)?;
        }
        Ok(true)
    }
}
