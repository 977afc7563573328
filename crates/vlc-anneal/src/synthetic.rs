//! Synthetic data: seeded Gaussian mixtures with a few far outliers, the sets the tests and
//! benchmarks use next to real embeddings.

use crate::vectors::Matrix;

/// `n` vectors of dimension `d` around `clusters` centres drawn uniformly from `[-1, 1]^d`,
/// each coordinate offset by a normal of standard deviation `spread`; one vector in 200 is an
/// outlier, ten times farther out. Deterministic for a seed.
pub fn gaussian_mixture(n: usize, d: usize, clusters: usize, spread: f32, seed: u64) -> Matrix {
    let mut state = seed;
    let mut next = move || {
        state = crate::splitmix(state);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let clusters = clusters.max(1);
    let centres: Vec<f32> = (0..clusters * d)
        .map(|_| (next() * 2.0 - 1.0) as f32)
        .collect();
    let mut data = Vec::with_capacity(n * d);
    for i in 0..n {
        let c = (next() * clusters as f64) as usize % clusters;
        let scale = if i % 200 == 199 { 10.0 } else { 1.0 } * spread as f64;
        for k in 0..d {
            // Box-Muller.
            let (u1, u2) = (next().max(1e-300), next());
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            data.push(centres[c * d + k] + (z * scale) as f32);
        }
    }
    Matrix {
        rows: n,
        cols: d,
        data,
    }
}
