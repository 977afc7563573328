//! `parity`: runs the parity suite on the requested backends and prints the table.
//!
//! ```text
//! parity [--backend cpu,wgpu,cuda] [--require cpu,...] [--cases N] [--seed S] [--wgpu-fallbacks]
//!
//! `--wgpu-fallbacks`: the wgpu backend with every optional adapter feature off.
//! ```
//! Exits 1 when a check fails or a required backend is not present. A self-contained binary,
//! so it runs on GPU hosts without a Rust toolchain (`cargo xtask parity` builds and runs it).

use hal_parity::{Report, Suite, SuiteConfig, format_table};
use std::process::ExitCode;

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backend_wgpu::quiet_headless_start() };
    let mut backends = vec!["cpu".to_string(), "wgpu".into(), "cuda".into()];
    let mut require: Vec<String> = Vec::new();
    let mut cases = 12usize;
    let mut seed: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let mut fallbacks = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next().unwrap_or_else(|| {
                eprintln!("parity: {name} needs a value");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--backend" => backends = value("--backend").split(',').map(str::to_string).collect(),
            "--require" => require = value("--require").split(',').map(str::to_string).collect(),
            "--cases" => {
                cases = value("--cases").parse().unwrap_or_else(|_| {
                    eprintln!("parity: --cases takes a number");
                    std::process::exit(2)
                })
            }
            "--seed" => {
                seed = value("--seed").parse().unwrap_or_else(|_| {
                    eprintln!("parity: --seed takes a number");
                    std::process::exit(2)
                })
            }
            "--wgpu-fallbacks" => fallbacks = true,
            "-h" | "--help" => {
                println!(
                    "parity [--backend cpu,wgpu,cuda] [--require LIST] [--cases N] [--seed S] [--wgpu-fallbacks]"
                );
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("parity: unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    for name in backends.iter().chain(&require) {
        if !["cpu", "wgpu", "cuda"].contains(&name.as_str()) {
            eprintln!("parity: unknown backend {name} (expected cpu, wgpu or cuda)");
            return ExitCode::from(2);
        }
    }
    for r in &require {
        if !backends.contains(r) {
            backends.push(r.clone());
        }
    }
    let cfg = SuiteConfig { cases, seed };
    println!("parity: seed {seed}, {cases} random cases per primitive (replay with --seed {seed})");
    let cpu = backend_cpu::CpuBackend::new();
    let mut reports: Vec<Report> = Vec::new();
    let mut absent: Vec<(String, String)> = Vec::new();
    for name in &backends {
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
            _ => unreachable!(),
        }
        if reports.last().is_some_and(|r| r.backend == *name) {
            eprintln!(
                "parity: {name} done in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    print!("{}", format_table(&reports, &absent));
    let failed: usize = reports
        .iter()
        .map(|r| r.rows.iter().filter(|row| !row.passed()).count())
        .sum();
    let passed: usize = reports
        .iter()
        .map(|r| r.rows.iter().filter(|row| row.passed()).count())
        .sum();
    let missing: Vec<&String> = require
        .iter()
        .filter(|r| absent.iter().any(|(n, _)| n == *r))
        .collect();
    println!("parity: {passed} passed, {failed} failed");
    if !missing.is_empty() {
        println!(
            "parity: required backend(s) not present: {}",
            missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if failed > 0 || !missing.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
