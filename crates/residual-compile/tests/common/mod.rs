//! Helpers shared by the integration tests.

#[allow(dead_code)] // Not every test file uses it.
pub mod mgh;
#[allow(dead_code)] // Not every test file uses it.
pub mod nist;

/// A file of the crate's committed `data/` folder.
#[allow(dead_code)] // Not every test file uses it.
pub fn data(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

/// A fresh seed per run, printed so a failure can be replayed with `RC_SEED`.
#[allow(dead_code)] // Not every test file uses it.
pub fn seed() -> u64 {
    hal_parity::fresh_seed("RC_SEED")
}

/// Rosenbrock as two residuals, `10 (y - x^2)` and `1 - x`, from the standard start
/// (-1.2, 1): a curved valley, so some trust-region steps are rejected on the way. Its
/// minimum is 0 at (1, 1).
#[allow(dead_code)] // Not every test file uses it.
pub fn rosenbrock() -> residual_compile::Problem {
    let mut p = residual_compile::Problem::new();
    p.add_parameters(&[-1.2, 1.0]);
    p.add_residual(
        "rosenbrock",
        &[0, 1],
        &[10.0, 1.0],
        residual_compile::Loss::Trivial,
        |v, c| vec![c[0] * (v[1] - v[0] * v[0]), c[1] - v[0]],
    )
    .unwrap();
    p
}
