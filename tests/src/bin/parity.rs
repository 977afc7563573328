//! `parity`: runs the parity suite on the requested backends and prints the table.
//!
//! ```text
//! parity [--backend cpu,wgpu,cuda] [--require cpu,...] [--cases N] [--seed S] [--wgpu-fallbacks]
//!
//! `--wgpu-fallbacks`: the wgpu backend with every optional adapter feature off.
//! ```
//! Exits 1 when a check fails or a required backend is not present. A self-contained binary,
//! so it runs on GPU hosts without a Rust toolchain (`cargo xtask parity` builds and runs it).

use clap::Parser;
use hal_parity::{Report, Suite, SuiteConfig, format_table};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "parity",
    about = "Runs the parity suite on the requested backends"
)]
struct Cli {
    /// Backends to run: cpu, wgpu, cuda.
    #[arg(long = "backend", value_delimiter = ',', default_value = "cpu,wgpu,cuda", value_parser = ["cpu", "wgpu", "cuda"])]
    backends: Vec<String>,
    /// Backends that must be present (a missing one fails the run).
    #[arg(long, value_delimiter = ',', value_parser = ["cpu", "wgpu", "cuda"])]
    require: Vec<String>,
    /// Random cases per primitive.
    #[arg(long, default_value_t = 12)]
    cases: usize,
    /// The seed (default: from the clock); the report prints it for replays.
    #[arg(long)]
    seed: Option<u64>,
    /// wgpu with every optional adapter feature off.
    #[arg(long)]
    wgpu_fallbacks: bool,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backend_wgpu::quiet_headless_start() };
    let cli = Cli::parse();
    let mut backends = cli.backends;
    for r in &cli.require {
        if !backends.contains(r) {
            backends.push(r.clone());
        }
    }
    let seed = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let cfg = SuiteConfig {
        cases: cli.cases,
        seed,
    };
    println!(
        "parity: seed {seed}, {} random cases per primitive (replay with --seed {seed})",
        cli.cases
    );
    let (reports, absent) = run_backends(&backends, cfg, cli.wgpu_fallbacks);
    print!("{}", format_table(&reports, &absent));
    summarize(&reports, &absent, &cli.require)
}

/// The suite on each backend in `backends`: the reports of those present, and why the others
/// are not.
fn run_backends(
    backends: &[String],
    cfg: SuiteConfig,
    fallbacks: bool,
) -> (Vec<Report>, Vec<(String, String)>) {
    let cpu = backend_cpu::CpuBackend::new();
    let mut reports: Vec<Report> = Vec::new();
    let mut absent: Vec<(String, String)> = Vec::new();
    for name in backends {
        let started = std::time::Instant::now();
        match name.as_str() {
            "cpu" => reports.push(Suite::new(&cpu, &cpu, true, cfg).run()),
            "wgpu" => match backend_wgpu::WgpuBackend::with_options(if fallbacks {
                backend_wgpu::WgpuOptions::fallbacks()
            } else {
                backend_wgpu::WgpuOptions::default()
            }) {
                Ok(gpu) => {
                    eprintln!(
                        "parity: wgpu on {} using {}",
                        hal::Backend::info(&gpu).name,
                        gpu.features_in_use()
                    );
                    reports.push(Suite::new(&gpu, &cpu, false, cfg).run())
                }
                Err(e) => absent.push((name.clone(), e.to_string())),
            },
            "cuda" => match backend_cuda::CudaBackend::new() {
                Ok(gpu) => {
                    eprintln!("parity: cuda on {}", hal::Backend::info(&gpu).name);
                    reports.push(Suite::new(&gpu, &cpu, false, cfg).run())
                }
                Err(e) => absent.push((name.clone(), e.to_string())),
            },
            _ => unreachable!("clap accepts cpu, wgpu and cuda only"),
        }
        if reports.last().is_some_and(|r| r.backend == *name) {
            eprintln!(
                "parity: {name} done in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    (reports, absent)
}

/// Prints the counts; fails where a check failed or a required backend is absent.
fn summarize(reports: &[Report], absent: &[(String, String)], require: &[String]) -> ExitCode {
    let failed: usize = reports
        .iter()
        .map(|r| r.rows.iter().filter(|row| !row.passed()).count())
        .sum();
    let passed: usize = reports
        .iter()
        .map(|r| r.rows.iter().filter(|row| row.passed()).count())
        .sum();
    let missing: Vec<&str> = require
        .iter()
        .filter(|r| absent.iter().any(|(n, _)| n == *r))
        .map(|s| s.as_str())
        .collect();
    println!("parity: {passed} passed, {failed} failed");
    if !missing.is_empty() {
        println!(
            "parity: required backend(s) not present: {}",
            missing.join(", ")
        );
    }
    if failed > 0 || !missing.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
