//! SGD and Adam steps.

use crate::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::pipeline::{Params, Spec};
use hal::{AdamParams, DType, DeviceBuffer, Result, SgdParams, validate};

pub(crate) fn sgd_step(
    gpu: &WgpuBackend,
    param: &WgpuBuffer,
    grad: &WgpuBuffer,
    momentum_buffer: Option<&WgpuBuffer>,
    h: &SgdParams,
) -> Result<()> {
    validate::sgd_step(param, grad, momentum_buffer, h)?;
    let use_momentum = h.momentum != 0.0;
    let p = Params::default()
        .f(0, h.lr)
        .f(1, h.momentum)
        .f(2, h.dampening)
        .f(3, h.weight_decay)
        .scalar(4, h.nesterov as u32)
        .scalar(5, (h.step <= 1) as u32)
        .scalar(6, use_momentum as u32);
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
    let p = Params::default()
        .f(0, h.lr)
        .f(1, h.beta1)
        .f(2, h.beta2)
        .f(3, h.eps)
        .f(4, h.weight_decay)
        .scalar(5, h.decoupled_weight_decay as u32)
        .f(6, 1.0 - h.beta1.powi(t))
        .f(7, 1.0 - h.beta2.powi(t));
    gpu.run(
        Spec::new("adam.wgsl"),
        p,
        &[(param, true), (grad, false), (m, true), (v, true)],
        param.len(),
    )
}
