//! Helpers shared by the integration tests.

/// A fresh seed per run, printed so a failure can be replayed with `RC_SEED`.
pub fn seed() -> u64 {
    let s = std::env::var("RC_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("seed {s} (replay with RC_SEED={s})");
    s
}
