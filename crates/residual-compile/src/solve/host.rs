//! What the host engines (sparse Cholesky, dense Schur) share: evaluating a point held on the
//! host, and the damping's scaling `D` (see [`super::Scaling`]) from the diagonal of `J^T J`
//! at each linearization.

use super::Scaling;
use crate::Error;
use crate::compile::{CompiledProblem, Evaluation};
use hal::{Backend, BackendExt};

/// Evaluates at the host point `x` (written to `params` in the solve's precision) into `out`;
/// the cost summed in `f64` from the per-block costs.
pub(super) async fn evaluate_at<B: Backend>(
    compiled: &CompiledProblem<B>,
    params: &B::Buffer,
    x: &[f64],
    out: &Evaluation<B>,
) -> Result<f64, Error> {
    compiled.write_floats(params, x)?;
    compiled.evaluate(params, out)?;
    Ok(compiled
        .backend
        .read_f64_async(&out.cost)
        .await?
        .iter()
        .sum())
}

/// The [`super::Engine`] methods every host engine has alike: its iterates in `it`, its
/// compiled problem in `compiled`, the parameter buffer it evaluates from in `params_buf`,
/// its step in `delta` placed by `place_candidate`, its damping in `damping`.
macro_rules! host_engine_common {
    () => {
        type B = B;
        type Point = Vec<f64>;

        fn state(&self) -> &super::Iterates<B, Vec<f64>> {
            &self.it
        }

        fn state_mut(&mut self) -> &mut super::Iterates<B, Vec<f64>> {
            &mut self.it
        }

        fn compiled(&self) -> &crate::compile::CompiledProblem<B> {
            &self.compiled
        }

        async fn evaluate_candidate(&mut self) -> Result<f64, crate::Error> {
            let it = &self.it;
            super::host::evaluate_at(
                &self.compiled,
                &self.params_buf,
                &it.x_candidate,
                &it.candidate,
            )
            .await
        }

        async fn parameters(&self) -> Result<Vec<f64>, crate::Error> {
            Ok(self.it.x.clone())
        }

        async fn scale_step(&mut self, factor: f64) -> Result<(), crate::Error> {
            self.delta.iter_mut().for_each(|d| *d *= factor);
            self.place_candidate();
            Ok(())
        }

        fn set_scaling(&mut self, scaling: super::Scaling) {
            self.damping.scaling = scaling;
        }
    };
}
pub(super) use host_engine_common;

/// `D` per free column, with the floor the first linearization sets and the peaks the
/// monotone scaling keeps.
#[derive(Default)]
pub(super) struct Damping {
    pub(super) diagonal: Vec<f64>,
    floor: Vec<f64>,
    peak: Vec<f64>,
    pub(super) scaling: Scaling,
}

impl Damping {
    /// `D` from `jtj_diagonal`, the free columns' `(J^T J)_ii` at the current point.
    pub(super) fn update(&mut self, jtj_diagonal: impl ExactSizeIterator<Item = f64>) {
        let n = jtj_diagonal.len();
        let first = self.floor.is_empty();
        if first {
            self.floor = vec![0.0; n];
            self.peak = vec![0.0; n];
            self.diagonal = vec![0.0; n];
        }
        let monotone = self.scaling == Scaling::Monotone;
        for (i, v) in jtj_diagonal.enumerate() {
            if first {
                self.floor[i] = Scaling::first_floor(v);
            }
            let clamped = v.clamp(1e-6, 1e32);
            self.peak[i] = self.peak[i].max(clamped);
            self.diagonal[i] = if monotone {
                self.peak[i]
            } else {
                clamped.max(self.floor[i])
            };
        }
    }
}
