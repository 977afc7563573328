//! Adam's state in a file, so a training run can stop and resume where it was: the first and
//! second moments of each distinct parameter and the step count, as safetensors.

use super::{Adam, Recorded, unique_params};
use crate::error::{Result, invalid};
use crate::nn::{load_safetensors, save_safetensors};
use crate::tensor::Tensor;
use hal::{Backend, DType, DeviceBuffer, Layout};
use std::path::Path;

/// The step count as two exactly representable f32s: the low 24 bits and the rest.
fn split_steps(steps: u64) -> [f32; 2] {
    [(steps & 0xff_ffff) as f32, (steps >> 24) as f32]
}

impl<B: Backend> Adam<B> {
    /// Writes the state for `params` (the same list, in the same order, as passed to
    /// [`crate::optim::Optimizer::step`]) to `path`, atomically: `exp_avg.{i}` and
    /// `exp_avg_sq.{i}` (PyTorch's names for Adam's moments) for the `i`-th distinct
    /// parameter, zeros for one that has not been stepped, and `step` as two f32s (the low 24
    /// bits and the rest, both exact). Hyperparameters and the schedule are the caller's.
    pub fn save_state(&self, params: &[Tensor<B>], path: &Path) -> Result<()> {
        let mut tensors = Vec::new();
        for (i, p) in unique_params(params).iter().enumerate() {
            let n = p.numel();
            let moments: Vec<Tensor<B>> = match self.state.buffers.get(i) {
                Some(bufs) if bufs.len() >= 2 => bufs[..2]
                    .iter()
                    .map(|b| Tensor::from_parts(p.backend(), b.clone(), Layout::contiguous(&[n])))
                    .collect(),
                _ => vec![
                    Tensor::zeros(p.backend(), &[n], DType::F32)?,
                    Tensor::zeros(p.backend(), &[n], DType::F32)?,
                ],
            };
            let [m, v]: [Tensor<B>; 2] = moments.try_into().expect("two moments");
            tensors.push((format!("exp_avg.{i}"), m));
            tensors.push((format!("exp_avg_sq.{i}"), v));
        }
        let Some(first) = params.first() else {
            return Err(invalid("Adam::save_state", "no parameters"));
        };
        let steps = Tensor::from_slice(first.backend(), &split_steps(self.state.steps), &[2])?;
        tensors.push(("step".to_string(), steps));
        save_safetensors(&tensors, path)
    }

    /// Reads a file written by [`Adam::save_state`] for the same parameters: every moment must
    /// be there with its parameter's length, or nothing changes. Refused once the optimiser
    /// is prepared for recorded steps (the recording keeps the step count on the device):
    /// load first, then record.
    pub fn load_state(&mut self, params: &[Tensor<B>], path: &Path) -> Result<()> {
        if !matches!(self.recorded, Recorded::No) {
            return Err(invalid(
                "Adam::load_state",
                "the optimiser is prepared for recorded steps; load its state before recording",
            ));
        }
        let Some(first) = params.first() else {
            return Err(invalid("Adam::load_state", "no parameters"));
        };
        let mut tensors = Vec::new();
        for (i, p) in unique_params(params).iter().enumerate() {
            let (m, v) = (
                Tensor::zeros(p.backend(), &[p.numel()], DType::F32)?,
                Tensor::zeros(p.backend(), &[p.numel()], DType::F32)?,
            );
            tensors.push((format!("exp_avg.{i}"), m));
            tensors.push((format!("exp_avg_sq.{i}"), v));
        }
        let steps = Tensor::zeros(first.backend(), &[2], DType::F32)?;
        tensors.push(("step".to_string(), steps.clone()));
        load_safetensors(&tensors, path)?;
        let s = steps.to_vec()?;
        if s.iter().any(|&x| x < 0.0 || x.fract() != 0.0) || s[0] >= (1 << 24) as f32 {
            return Err(invalid(
                "Adam::load_state",
                format!("{}: `step` holds {s:?}, not a step count", path.display()),
            ));
        }
        let moments = &tensors[..tensors.len() - 1];
        let buffers: Vec<Vec<B::Buffer>> = moments
            .chunks(2)
            .map(|mv| mv.iter().map(|(_, t)| t.buffer().clone()).collect())
            .collect();
        debug_assert!(buffers.iter().flatten().all(|b| b.dtype() == DType::F32));
        self.state.buffers = buffers;
        self.state.steps = s[0] as u64 + ((s[1] as u64) << 24);
        self.state.device = Some(first.backend().clone());
        Ok(())
    }
}
