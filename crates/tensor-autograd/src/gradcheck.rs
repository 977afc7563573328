//! [`gradcheck`]: every gradient autograd computes for a function, against central differences
//! of the function itself, in f64 (PyTorch's `torch.autograd.gradcheck` runs in f64 for the
//! same reason: in f32 a difference quotient's rounding error swamps the comparison).

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use hal::{Backend, DType};

/// The step and tolerances of a [`gradcheck`]: an element passes when
/// `|autograd - central difference| <= atol + rtol |central difference|`.
#[derive(Clone, Copy, Debug)]
pub struct GradcheckOptions {
    /// The central differences' step `h`: `(f(x + h) - f(x - h)) / 2h`.
    pub eps: f64,
    pub atol: f64,
    pub rtol: f64,
}

impl Default for GradcheckOptions {
    /// PyTorch's defaults: `eps = 1e-6`, `atol = 1e-5`, `rtol = 1e-3`.
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-6,
            atol: 1e-5,
            rtol: 1e-3,
        }
    }
}

/// What a [`gradcheck`] found.
#[derive(Clone, Debug, Default)]
pub struct GradcheckReport {
    /// Gradient elements compared.
    pub checked: usize,
    /// The largest `|autograd - difference| / (atol + rtol |difference|)` (at most 1 passes).
    pub worst: f64,
    /// The elements that failed: (input, element, autograd, central difference), at most 10.
    pub failures: Vec<(usize, usize, f64, f64)>,
}

impl GradcheckReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Checks the gradient of `f` with respect to each of `inputs` (f64 tensors) at their values:
/// autograd's, of the loss `sum(f(x) * w)` with fixed pseudo-random weights `w`, against
/// central differences of that loss, each element of each input perturbed in turn (two
/// evaluations of `f` per element, under [`crate::no_grad`]). `f` must be deterministic.
///
/// Errors: an input that is not f64 (convert with `to_dtype(DType::F64)`: the check is only
/// as good as its arithmetic), or an error of `f` or of the backward pass.
pub fn gradcheck<B: Backend>(
    inputs: &[Tensor<B>],
    f: impl Fn(&[Tensor<B>]) -> Result<Tensor<B>>,
    options: GradcheckOptions,
) -> Result<GradcheckReport> {
    if let Some(bad) = inputs.iter().find(|t| t.dtype() != DType::F64) {
        return Err(Error::InvalidArgument {
            op: "gradcheck",
            detail: format!(
                "an input holds {}; gradcheck runs in f64 (convert with to_dtype(DType::F64))",
                bad.dtype()
            ),
        });
    }
    let values: Vec<Vec<f64>> = inputs
        .iter()
        .map(|t| t.to_vec_f64())
        .collect::<Result<_>>()?;
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let backend =
        inputs
            .first()
            .map(|t| t.backend().clone())
            .ok_or_else(|| Error::InvalidArgument {
                op: "gradcheck",
                detail: "no inputs".into(),
            })?;
    let leaf = |k: usize, v: &[f64]| Tensor::from_elements(&backend, v, &shapes[k]);
    let leaves: Vec<Tensor<B>> = (0..inputs.len())
        .map(|k| Ok(leaf(k, &values[k])?.requires_grad()))
        .collect::<Result<_>>()?;
    let y = f(&leaves)?;
    // Fixed weights in [-1, 1): a SplitMix64 stream, so a rerun checks the same loss.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let w: Vec<f64> = (0..y.numel())
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 * 2f64.powi(-52) - 1.0
        })
        .collect();
    let wt = Tensor::from_elements(&backend, &w, y.shape())?;
    y.to_dtype(DType::F64)?.mul(&wt)?.sum_all()?.backward()?;
    let loss_at = |k: usize, moved: &[f64]| -> Result<f64> {
        let ts: Vec<Tensor<B>> = (0..inputs.len())
            .map(|i| leaf(i, if i == k { moved } else { &values[i] }))
            .collect::<Result<_>>()?;
        let out = crate::no_grad(|| f(&ts))?.to_vec_f64()?;
        Ok(out.iter().zip(&w).map(|(o, wi)| o * wi).sum())
    };
    let mut report = GradcheckReport::default();
    for (k, leafk) in leaves.iter().enumerate() {
        let got = match leafk.grad() {
            Some(g) => g.to_vec_f64()?,
            None => vec![0.0; values[k].len()],
        };
        let mut moved = values[k].clone();
        for j in 0..moved.len() {
            let x = moved[j];
            moved[j] = x + options.eps;
            let plus = loss_at(k, &moved)?;
            moved[j] = x - options.eps;
            let minus = loss_at(k, &moved)?;
            moved[j] = x;
            let fd = (plus - minus) / (2.0 * options.eps);
            let ratio = (got[j] - fd).abs() / (options.atol + options.rtol * fd.abs());
            report.checked += 1;
            if ratio.is_nan() || ratio > report.worst {
                report.worst = if ratio.is_nan() { f64::INFINITY } else { ratio };
            }
            let passes = ratio <= 1.0;
            if !passes && report.failures.len() < 10 {
                report.failures.push((k, j, got[j], fd));
            }
        }
    }
    Ok(report)
}
