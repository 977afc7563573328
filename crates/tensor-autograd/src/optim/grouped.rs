//! Adam's eager steps as a few grouped launches on backends where each launch costs more
//! than a small parameter's update (those that capture graphs: CUDA, and wgpu where it
//! records).
//!
//! The update programs are the recorded steps' ([`adam_group_program`], a launch per group
//! of parameters of similar length, [`size_groups`], over the longest), reading this step's `[lr, beta1^t, beta2^t]`
//! from a three-float device buffer the host writes before the launches (stream-ordered,
//! so earlier launches still read the values of their own step). The arithmetic is the
//! fused `adam_step`'s, rounding for rounding, with the bias corrections from the same f32
//! powers the backends compute on the host.

use super::{Adam, GroupRole, adam_group_program, dense_grad, unique_params};
use crate::error::Result;
use crate::tensor::Tensor;
use hal::{AdamParams, Backend, BackendExt, DType};

/// Parameters per eager launch at most (each thread visits every member): the backend's
/// [`hal::Capabilities::program_buffers`] (four buffers a parameter and the values) decides
/// below this.
const EAGER_GROUP: usize = 12;

/// Tensors of `lens` elements in groups of at most `per_launch`, for launches over each
/// group's longest member: sorted by length (longest first, then by position), a group takes
/// the next tensor while the launch's work (its longest length times its members) stays
/// within 1.5 times the elements it covers, so one large tensor (a token embedding) does not
/// make every thread of a launch visit many small ones. Empty tensors are left out. A
/// function of the lengths only, so sums over groups run in a fixed order.
pub(super) fn size_groups(lens: &[usize], per_launch: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).filter(|&i| lens[i] > 0).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(lens[i]), i));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut covered = 0usize;
    for i in order {
        let fits = groups.last().is_some_and(|g| {
            let longest = lens[g[0]];
            g.len() < per_launch.max(1)
                && (longest as f64) * (g.len() + 1) as f64 <= 1.5 * (covered + lens[i]) as f64
        });
        if fits {
            groups.last_mut().expect("checked").push(i);
            covered += lens[i];
        } else {
            groups.push(vec![i]);
            covered = lens[i];
        }
    }
    groups
}

/// One eager launch: its kernel, its members (positions in the parameter list) and the
/// longest member's length (the launch's threads).
struct EagerGroup<B: Backend> {
    kernel: B::Kernel,
    members: Vec<usize>,
    longest: usize,
}

/// The built launches and what they were built for.
pub(super) struct EagerGroups<B: Backend> {
    values: B::Buffer,
    groups: Vec<EagerGroup<B>>,
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
            for members in size_groups(&lens, per_launch) {
                let group_lens: Vec<usize> = members.iter().map(|&i| lens[i]).collect();
                groups.push(EagerGroup {
                    kernel: b.compile(&adam_group_program(
                        &baked,
                        &group_lens,
                        GroupRole::Alone,
                    )?)?,
                    longest: group_lens.iter().copied().max().unwrap_or(0),
                    members,
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
            for &i in &group.members {
                let state = &self.state.buffers[i];
                args.extend([params[i].buffer(), grads[i].buffer(), &state[0], &state[1]]);
            }
            args.push(&e.values);
            b.launch(&group.kernel, &args, group.longest)?;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::size_groups;

    #[test]
    fn a_large_tensor_launches_alone_and_alike_ones_together() {
        // A GPT-2-like list: an embedding, then per layer three similar matrices and two
        // vectors; one empty tensor.
        let mut lens = vec![38_597_376usize, 0];
        for _ in 0..3 {
            lens.extend([2_359_296, 1_769_472, 2_359_296, 768, 768]);
        }
        let groups = size_groups(&lens, 12);
        assert_eq!(groups[0], vec![0], "the embedding launches alone");
        let mut seen: Vec<usize> = groups.concat();
        seen.sort_unstable();
        let nonempty: Vec<usize> = (0..lens.len()).filter(|&i| lens[i] > 0).collect();
        assert_eq!(
            seen, nonempty,
            "every nonempty tensor once, the empty one left out"
        );
        for g in &groups {
            assert!(g.len() <= 12);
            let longest = lens[g[0]] as f64;
            let covered: usize = g.iter().map(|&i| lens[i]).sum();
            assert!(longest * g.len() as f64 <= 1.5 * covered as f64, "{g:?}");
        }
        // The nine large matrices share one launch.
        let big: Vec<usize> = (2..lens.len()).filter(|&i| lens[i] > 1_000_000).collect();
        assert!(groups.iter().any(|g| big.iter().all(|i| g.contains(i))));
        assert_eq!(
            size_groups(&lens, 12),
            groups,
            "a function of the lengths only"
        );
    }
}
