//! Helpers shared by the integration tests: seeded inputs, views that are not contiguous, and
//! the two gradient checks.
#![allow(dead_code)]

use hal::Backend;
use tensor_autograd::{Result, Tensor};

/// A fresh seed per run, printed so a failure can be replayed with `TA_SEED`.
pub fn seed() -> u64 {
    hal_parity::fresh_seed("TA_SEED")
}

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform on `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A function of input tensors under test.
pub type Forward<'a, B> = dyn Fn(&[Tensor<B>]) -> Result<Tensor<B>> + 'a;

/// How an input is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Storage {
    Contiguous,
    /// The logical tensor is the transpose of its last two dimensions' storage.
    Transposed,
}

/// A leaf that requires a gradient, holding `values` (row-major in its logical `shape`)
/// either contiguously or as a transposed view of a buffer laid out the other way.
pub fn leaf<B: Backend>(dev: &B, values: &[f64], shape: &[usize], storage: Storage) -> Tensor<B> {
    let data: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    match storage {
        Storage::Transposed if shape.len() >= 2 => {
            let r = shape.len();
            let mut stored = shape.to_vec();
            stored.swap(r - 2, r - 1);
            // stored[.., j, i] = logical[.., i, j]
            let (rows, cols) = (shape[r - 2], shape[r - 1]);
            let plane = rows * cols;
            let mut t = vec![0f32; data.len()];
            for (p, chunk) in data.chunks(plane.max(1)).enumerate() {
                for i in 0..rows {
                    for j in 0..cols {
                        t[p * plane + j * rows + i] = chunk[i * cols + j];
                    }
                }
            }
            let base = Tensor::from_slice(dev, &t, &stored).unwrap();
            let view = base.transpose(-1, -2).unwrap();
            assert!(!view.is_contiguous() || rows == 1 || cols == 1);
            view.requires_grad()
        }
        _ => Tensor::from_slice(dev, &data, shape)
            .unwrap()
            .requires_grad(),
    }
}

/// Checks the autograd gradient of `f` at `inputs` against central differences of the
/// library's own forward pass, formed and summed in f64: the loss is `sum(f(x) * w)` with
/// fixed random weights `w`. Returns the worst error relative to `atol + rtol |fd|`
/// (below 1 passes).
pub fn gradcheck<B: Backend>(
    dev: &B,
    rng: &mut Rng,
    inputs: &[(Vec<f64>, Vec<usize>, Storage)],
    h: f64,
    tol: (f64, f64),
    f: &Forward<'_, B>,
) -> f64 {
    let leaves: Vec<Tensor<B>> = inputs
        .iter()
        .map(|(v, s, st)| leaf(dev, v, s, *st))
        .collect();
    let y = f(&leaves).unwrap();
    let w = rng.vec(y.numel(), -1.0, 1.0);
    let wt = Tensor::from_slice(
        dev,
        &w.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        y.shape(),
    )
    .unwrap();
    y.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
    let loss_at = |values: &[Vec<f64>]| -> f64 {
        let ts: Vec<Tensor<B>> = values
            .iter()
            .zip(inputs)
            .map(|(v, (_, s, st))| leaf(dev, v, s, *st).detach())
            .collect();
        let out = tensor_autograd::no_grad(|| f(&ts))
            .unwrap()
            .to_vec()
            .unwrap();
        out.iter().zip(&w).map(|(&o, &wi)| o as f64 * wi).sum()
    };
    let (atol, rtol) = tol;
    let mut worst: f64 = 0.0;
    for (k, (values, shape, _)) in inputs.iter().enumerate() {
        let got = leaves[k]
            .grad()
            .map(|g| g.to_vec().unwrap())
            .unwrap_or_else(|| vec![0.0; values.len()]);
        assert_eq!(
            got.len(),
            values.len(),
            "gradient of input {k} has the wrong size ({shape:?})"
        );
        for j in 0..values.len() {
            let mut plus: Vec<Vec<f64>> = inputs.iter().map(|i| i.0.clone()).collect();
            let mut minus = plus.clone();
            plus[k][j] += h;
            minus[k][j] -= h;
            let fd = (loss_at(&plus) - loss_at(&minus)) / (2.0 * h);
            let err = (got[j] as f64 - fd).abs() / (atol + rtol * fd.abs());
            if err > worst {
                worst = err;
            }
            assert!(
                err <= 1.0,
                "input {k} element {j}: autograd {} vs finite difference {fd} (shape {shape:?})",
                got[j]
            );
        }
    }
    worst
}

/// A recorded training step ([`tensor_autograd::models::RecordedStep`]) against the same
/// steps taken eagerly ([`tensor_autograd::models::train_step`]) from the same start on `dev`:
/// Adam (a learning-rate change halfway through, after two eager warm-up steps) and AdamW,
/// on fresh random batches, the recorded update reading its per-step values from the device
/// as on a capturing backend. The parameters and the losses must agree to f32 rounding.
pub fn recorded_step_matches_eager<B: Backend>(dev: &B, seed: u64) {
    // One, two and three grouped Adam launches (2, 6 and 8 parameters; see optim.rs).
    for widths in [&[7usize, 5][..], &[7, 19, 11, 5], &[7, 19, 11, 9, 5]] {
        recorded_step_matches_eager_for(dev, seed, widths);
    }
}

fn recorded_step_matches_eager_for<B: Backend>(dev: &B, seed: u64, widths: &[usize]) {
    use std::sync::Arc;
    use tensor_autograd::models::{RecordedStep, mlp, train_step};
    use tensor_autograd::nn::{Init, Module, ModuleExt};
    use tensor_autograd::optim::{Adam, Optimizer};
    let mut rng = Rng::new(seed);
    let batch = 13;
    let classes = *widths.last().expect("widths");
    let batches: Vec<(Tensor<B>, Tensor<B>)> = (0..7)
        .map(|_| {
            let x: Vec<f32> = rng
                .vec(batch * widths[0], -1.0, 1.0)
                .iter()
                .map(|&v| v as f32)
                .collect();
            let y: Vec<u32> = (0..batch).map(|_| rng.below(classes) as u32).collect();
            (
                Tensor::from_slice(dev, &x, &[batch, widths[0]]).unwrap(),
                Tensor::from_elements(dev, &y, &[batch]).unwrap(),
            )
        })
        .collect();
    for adamw in [false, true] {
        let make = || -> (Arc<dyn Module<B>>, Adam<B>) {
            let model = mlp(&mut Init::new(dev, seed), widths).unwrap();
            let opt = if adamw {
                Adam::adamw(0.01)
            } else {
                Adam::new(0.01)
            };
            // The capturing backends' update on every backend.
            (Arc::new(model), opt.device_values_everywhere())
        };
        // Both start with two eager steps, so the recorded one begins mid-way in the count.
        let (eager_model, mut eager_opt) = make();
        let (rec_model, mut rec_opt) = make();
        let (eager_params, rec_params) = (eager_model.parameters(), rec_model.parameters());
        for (x, y) in &batches[..2] {
            train_step(&*eager_model, &eager_params, &mut eager_opt, x, y).unwrap();
            train_step(&*rec_model, &rec_params, &mut rec_opt, x, y).unwrap();
        }
        let recorded =
            RecordedStep::new(rec_model.clone(), rec_opt, &batches[0].0, &batches[0].1).unwrap();
        for (k, (x, y)) in batches[2..].iter().enumerate() {
            if k == 2 {
                eager_opt.set_learning_rate(0.003);
                recorded.optimizer().set_learning_rate(0.003);
            }
            let a = train_step(&*eager_model, &eager_params, &mut eager_opt, x, y)
                .unwrap()
                .loss
                .item()
                .unwrap();
            let b = recorded.run(x, y).unwrap().loss.item().unwrap();
            assert!(
                (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                "{widths:?} adamw {adamw}, step {k}: loss {a} eager, {b} recorded"
            );
        }
        assert_eq!(recorded.optimizer().steps(), eager_opt.steps());
        for (i, (p, q)) in eager_params.iter().zip(&rec_params).enumerate() {
            let (p, q) = (p.to_vec().unwrap(), q.to_vec().unwrap());
            let scale = p.iter().fold(0f32, |a, v| a.max(v.abs()));
            let worst = p
                .iter()
                .zip(&q)
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(
                worst <= 1e-5 * scale.max(1e-3),
                "{widths:?} adamw {adamw}: parameter {i} differs by {worst} (scale {scale})"
            );
        }
    }
}
