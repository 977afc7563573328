//! SGD and Adam steps.

use crate::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::pipeline::{Params, Spec, launch_params};
use hal::{AdamParams, DType, DeviceBuffer, Result, SgdParams, validate};

launch_params! {
    /// What sgd.wgsl reads.
    pub(crate) struct SgdStepParams {
        lr: f32,
        momentum: f32,
        dampening: f32,
        weight_decay: f32,
        nesterov: u32,
        /// The first step: the momentum buffer starts as the gradient.
        first: u32,
        use_momentum: u32,
    }
}

launch_params! {
    /// What adam.wgsl reads.
    pub(crate) struct AdamStepParams {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        /// AdamW: the decay applies to the parameter, not the gradient.
        decoupled: u32,
        /// The bias corrections `1 - beta^t`.
        correction1: f32,
        correction2: f32,
    }
}

pub(crate) fn sgd_step(
    gpu: &WgpuBackend,
    param: &WgpuBuffer,
    grad: &WgpuBuffer,
    momentum_buffer: Option<&WgpuBuffer>,
    h: &SgdParams,
) -> Result<()> {
    validate::sgd_step(param, grad, momentum_buffer, h)?;
    let use_momentum = h.momentum != 0.0;
    let p = Params::default().typed(&SgdStepParams {
        lr: h.lr,
        momentum: h.momentum,
        dampening: h.dampening,
        weight_decay: h.weight_decay,
        nesterov: h.nesterov as u32,
        first: (h.step <= 1) as u32,
        use_momentum: use_momentum as u32,
    });
    let dummy;
    let mb = match momentum_buffer {
        Some(b) if use_momentum => b,
        _ => {
            dummy = gpu.scratch(DType::F32, 1)?;
            &dummy
        }
    };
    gpu.run(
        Spec::new("sgd.wgsl"),
        p,
        &[(param, true), (grad, false), (mb, true)],
        param.len(),
    )
}

pub(crate) fn adam_step(
    gpu: &WgpuBackend,
    param: &WgpuBuffer,
    grad: &WgpuBuffer,
    m: &WgpuBuffer,
    v: &WgpuBuffer,
    h: &AdamParams,
) -> Result<()> {
    validate::adam_step(param, grad, m, v, h)?;
    let t = h.step.max(1) as i32;
    let p = Params::default().typed(&AdamStepParams {
        lr: h.lr,
        beta1: h.beta1,
        beta2: h.beta2,
        eps: h.eps,
        weight_decay: h.weight_decay,
        decoupled: h.decoupled_weight_decay as u32,
        correction1: 1.0 - h.beta1.powi(t),
        correction2: 1.0 - h.beta2.powi(t),
    });
    gpu.run(
        Spec::new("adam.wgsl"),
        p,
        &[(param, true), (grad, false), (m, true), (v, true)],
        param.len(),
    )
}
