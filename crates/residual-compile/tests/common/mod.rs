//! Helpers shared by the integration tests.

/// A fresh seed per run, printed so a failure can be replayed with `RC_SEED`.
pub fn seed() -> u64 {
    hal_parity::fresh_seed("RC_SEED")
}
