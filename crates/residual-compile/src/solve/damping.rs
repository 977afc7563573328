//! The damping's scaling `D` of the host engines (see [`super::Scaling`]), from the diagonal of
//! `J^T J` at each linearization.

use super::Scaling;

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
