//! SGD and Adam steps.

use crate::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::device::Args;
use hal::{AdamParams, DType, DeviceBuffer, Result, SgdParams, validate};

pub(crate) fn sgd_step(
    gpu: &CudaBackend,
    param: &CudaBuffer,
    grad: &CudaBuffer,
    momentum_buffer: Option<&CudaBuffer>,
    p: &SgdParams,
) -> Result<()> {
    validate::sgd_step(param, grad, momentum_buffer, p)?;
    gpu.dev.bind()?;
    // Without momentum the buffer is neither read nor written (as on the CPU).
    let momentum_buffer = momentum_buffer.filter(|_| p.momentum != 0.0);
    if param.dtype() == DType::F64 {
        let wide = |v: f32| v as f64;
        return gpu.dev.launch(
            "sgd_wide_kernel",
            param.len(),
            Args::new()
                .arg(param.len() as i64)
                .arg(param.ptr())
                .arg(grad.ptr())
                .arg(momentum_buffer.map_or(0, |b| b.ptr()))
                .arg(momentum_buffer.is_some() as i32)
                .arg(wide(p.lr))
                .arg(wide(p.momentum))
                .arg(wide(p.dampening))
                .arg(wide(p.weight_decay))
                .arg(p.nesterov as i32)
                .arg((p.step <= 1) as i32),
        );
    }
    gpu.dev.launch(
        "sgd_kernel",
        param.len(),
        Args::new()
            .arg(param.len() as i64)
            .arg(param.ptr())
            .arg(grad.ptr())
            .arg(momentum_buffer.map_or(0, |b| b.ptr()))
            .arg(momentum_buffer.is_some() as i32)
            .arg(p.lr)
            .arg(p.momentum)
            .arg(p.dampening)
            .arg(p.weight_decay)
            .arg(p.nesterov as i32)
            .arg((p.step <= 1) as i32),
    )
}

pub(crate) fn adam_step(
    gpu: &CudaBackend,
    param: &CudaBuffer,
    grad: &CudaBuffer,
    m: &CudaBuffer,
    v: &CudaBuffer,
    p: &AdamParams,
) -> Result<()> {
    validate::adam_step(param, grad, m, v, p)?;
    gpu.dev.bind()?;
    let t = p.step.max(1) as i32;
    if param.dtype() == DType::F64 {
        let (b1, b2) = (p.beta1 as f64, p.beta2 as f64);
        return gpu.dev.launch(
            "adam_wide_kernel",
            param.len(),
            Args::new()
                .arg(param.len() as i64)
                .arg(param.ptr())
                .arg(grad.ptr())
                .arg(m.ptr())
                .arg(v.ptr())
                .arg(p.lr as f64)
                .arg(b1)
                .arg(b2)
                .arg(p.eps as f64)
                .arg(p.weight_decay as f64)
                .arg(p.decoupled_weight_decay as i32)
                .arg(1.0 - b1.powi(t))
                .arg(1.0 - b2.powi(t)),
        );
    }
    let (bc1, bc2) = (1.0 - p.beta1.powi(t), 1.0 - p.beta2.powi(t));
    gpu.dev.launch(
        "adam_kernel",
        param.len(),
        Args::new()
            .arg(param.len() as i64)
            .arg(param.ptr())
            .arg(grad.ptr())
            .arg(m.ptr())
            .arg(v.ptr())
            .arg(p.lr)
            .arg(p.beta1)
            .arg(p.beta2)
            .arg(p.eps)
            .arg(p.weight_decay)
            .arg(p.decoupled_weight_decay as i32)
            .arg(bc1)
            .arg(bc2),
    )
}
