//! `cargo xtask python [--release] [PYTEST ARGS]`: builds the `vlc` Python module's wheel
//! (crate `python/`, with maturin) and runs its pytest suite against the installed wheel.
//!
//! Everything goes into a virtual environment at `target/python-venv` (made with the machine's
//! `python3 -m venv`; maturin, pytest and numpy installed into it from PyPI the first time),
//! so the system's Python is left alone. The wheel is built with cargo's `dev` profile by
//! default, sharing the workspace's test build (`--release` for speed figures), and installed
//! over any earlier one. The tests run from the repository root, so `import vlc` finds the
//! installed package, not the sources in `python/vlc` (which lack the compiled half).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// What the suite needs from PyPI, pinned to the majors the module is written for.
const REQUIREMENTS: [&str; 3] = ["maturin>=1.9,<2", "pytest>=7", "numpy>=1.21"];

pub fn run(args: &[String]) -> ExitCode {
    match suite(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask python: {e}");
            ExitCode::FAILURE
        }
    }
}

fn suite(args: &[String]) -> Result<ExitCode, String> {
    let release = args.iter().any(|a| a == "--release");
    let pytest_args: Vec<&String> = args.iter().filter(|a| *a != "--release").collect();
    let venv = PathBuf::from("target/python-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        status(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv (Debian: apt-get install python3-venv)",
        )?;
    }
    let ready = Command::new(&python)
        .args(["-c", "import maturin, pytest, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        println!(
            "xtask python: installing {} into {}",
            REQUIREMENTS.join(", "),
            venv.display()
        );
        status(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet"])
                .args(REQUIREMENTS),
            "pip install (PyPI must be reachable)",
        )?;
    }
    let wheels = PathBuf::from("target/python-wheels");
    if wheels.exists() {
        std::fs::remove_dir_all(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
    }
    let profile = if release { "release" } else { "dev" };
    status(
        Command::new(venv.join("bin/maturin"))
            .args([
                "build",
                "--quiet",
                "--profile",
                profile,
                "-m",
                "python/Cargo.toml",
                "-o",
            ])
            .arg(&wheels),
        "maturin build",
    )?;
    let wheel = only_wheel(&wheels)?;
    status(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--force-reinstall",
            ])
            .arg(&wheel),
        "pip install of the wheel",
    )?;
    println!("xtask python: pytest against {}", wheel.display());
    let code = Command::new(&python)
        .args(["-m", "pytest", "-q", "python/tests"])
        .args(pytest_args)
        .status()
        .map_err(|e| format!("cannot run pytest: {e}"))?;
    Ok(if code.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs `cmd`, failing with `what` where it cannot start or fails.
fn status(cmd: &mut Command, what: &str) -> Result<(), String> {
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{what} failed ({s})")),
        Err(e) => Err(format!("cannot run {what}: {e}")),
    }
}

/// The one wheel maturin wrote into `dir`.
fn only_wheel(dir: &Path) -> Result<PathBuf, String> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(format!("{}: expected one wheel, found {n}", dir.display())),
    }
}
