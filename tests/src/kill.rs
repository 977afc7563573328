//! Writers killed at random moments, for the tests that every file the project writes is
//! whole: a test re-runs its own binary, filtered to an `#[ignore]`d helper test that saves
//! versions of a file in turn for ever ([`write_until_killed`]), kills it with SIGKILL at a
//! random moment and checks the file ([`kill_rounds`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The helper's side: when the environment variable `env` names a target path, saves
/// `versions` to it in turn with `save`, for ever (after creating `TARGET.ready` once the
/// versions exist); otherwise returns at once (a plain `cargo test --ignored` run).
pub fn write_until_killed<T>(env: &str, versions: &[T], save: impl Fn(&T, &Path)) {
    let Ok(target) = std::env::var(env) else {
        return;
    };
    std::fs::write(ready_marker(Path::new(&target)), b"").expect("the ready marker");
    for i in 0.. {
        save(&versions[i % versions.len()], Path::new(&target));
    }
}

/// The test's side: `rounds` times, runs the helper test `helper` of this binary with `env`
/// naming `target`, waits until it is ready, kills it after a random 0 to `max_ms`
/// milliseconds, and calls `check(round)` on what is left. A helper that exits before it is
/// ready fails the test instead of hanging it.
pub fn kill_rounds(
    helper: &str,
    env: &str,
    target: &Path,
    rounds: usize,
    max_ms: u64,
    mut check: impl FnMut(usize),
) {
    let ready = ready_marker(target);
    let mut state = std::process::id() as u64 | 1;
    for round in 0..rounds {
        let _ = std::fs::remove_file(&ready);
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", helper, "--ignored", "--test-threads=1"])
            .env(env, target)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        while !ready.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the writer exited before it was ready: {status}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        std::thread::sleep(Duration::from_millis(state % max_ms.max(1)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        check(round);
    }
}

fn ready_marker(target: &Path) -> PathBuf {
    PathBuf::from(format!("{}.ready", target.display()))
}
