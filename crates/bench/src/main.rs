//! `bench`: measures `hal` primitives on a backend and, where a peer can run on the same
//! machine, the peer in the same run, and prints medians with ratios.
//!
//! ```text
//! bench [--backend cpu] [--suite gemm,elementwise,nearest,skinny,launch,memory,nlls,real,train,gpt,vlc,vlc-search] [--reps N]
//!       [--gemm-size N] [--real-data DIR] [--real-only NAME,...]
//!       [--gpt-config shakespeare-char,gpt2] [--nanogpt DIR]
//!       [--levels 4,5] [--edges N] [--compile-level L] [--no-break-even]
//!       [--elements N] [--points N] [--centroids N] [--dim N] [--wgpu-fallbacks]
//!       [--wgpu-without immediates,f16,subgroups,coop] [--coop-tiles SRxSCxTMxTN,...]
//!       [--vlc-search-data A.npy,...] [--vlc-queries N] [--vlc-lists N] [--vlc-bytes N]
//!       [--vlc-nprobe 1,2,...] [--vlc-kmeans 256,1024] [--vlc-iterations N]
//! ```
//! `vlc-search` (the CPU side of vlc against FAISS, `vlc_search.rs`) ignores `--backend`.
//! `BENCH_EVERY_RUN=1` also prints each timed run, not just the median.
//! `--wgpu-fallbacks` opens the wgpu backend with every optional adapter feature off
//! (parameters in a buffer, packed f16, workgroup-memory reductions), `--wgpu-without` with
//! the named ones off, to measure what they are worth.
//! `launch` times an empty kernel's launch and a recorded sequence of 50 small kernels replayed
//! against the same 50 launched one by one; `memory` runs 10,000 iterations of a loop of
//! primitives and prints device memory before and after (CUDA: also the allocator's figures).
//! Where the backend has a faster precision (`Capabilities::fast_precision`), `gemm` and
//! `nearest` also run under `Precision::Fast` (TF32 on CUDA), the latter with its agreement
//! with the exact assignments. Where it has `compensated_precision`, `gemm` also runs under
//! `Precision::Compensated`, and with matrix units (`Capabilities::matrix_units`) with f16
//! inputs; each product prints its relative error against float64 on sampled entries.
//! `nearest` (nearest-centroid search, default 1,000,000 x 128 against 4096) runs only when
//! named: on a CPU it takes minutes.
//! A self-contained binary (no cargo needed), so it also runs on GPU hosts. Every timed run
//! gets fresh random inputs (drawn by the backend's random primitive, outside the timed
//! region), warm-up runs come first, and results are checked before they are timed.

use backend_cpu::CpuBackend;
use hal::Backend;
use std::process::{Command, ExitCode};
use std::time::Instant;

mod cli;
mod elementwise;
mod gemm;
mod gpt;
mod launch;
mod nearest;
mod nlls;
mod real;
mod train;
mod vlc;
mod vlc_search;

pub(crate) use cli::Args;
use elementwise::elementwise;
use gemm::{gemm, skinny};
use launch::{launch, memory};
use nearest::nearest;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds of warm-up runs before timed ones (see [`time_it`]).
const WARM_UP_SECONDS: f64 = 0.5;

/// Under `HAL_WGPU_PROFILE` with the wgpu backend, `HAL_CUDA_PROFILE` with the CUDA one or
/// `HAL_CPU_PROFILE` with the CPU: the per-kernel (per-call on the CPU) time since the last call, divided by the runs given (see the backends'
/// `take_profile`).
type ProfileHook = Box<dyn Fn(usize) -> Option<String> + Send>;
static PROFILE: std::sync::Mutex<Option<ProfileHook>> = std::sync::Mutex::new(None);

fn set_profile_hook(hook: ProfileHook) {
    *PROFILE.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
}

fn take_profile(runs: usize) -> Option<String> {
    let hook = PROFILE.lock().unwrap_or_else(|p| p.into_inner());
    hook.as_ref().and_then(|h| h(runs))
}

/// Prints the profile of the work since the last [`take_profile`] (per run of `runs`), where
/// there is one.
fn print_profile(runs: usize) {
    if let Some(report) = take_profile(runs) {
        print!("{report}");
    }
}

/// Warm-ups: `run(i)` (which returns the seconds it timed) for i = 0, 1, ... until at least
/// two runs and [`WARM_UP_SECONDS`] of them; returns how many ran. A GPU left idle (while a
/// peer ran on the CPU, say) drops its clocks and raises them only after sustained load (runs
/// after an idle spell took several times longer for the first tenth of a second or two).
/// The warm-ups' kernels are left out of a profile.
fn warm_up<E>(mut run: impl FnMut(usize) -> Result<f64, E>) -> Result<usize, E> {
    let (mut warm, mut warm_runs) = (0.0, 0);
    while warm_runs < 2 || (warm < WARM_UP_SECONDS && warm_runs < 200) {
        warm += run(warm_runs)?;
        warm_runs += 1;
    }
    let _ = take_profile(1);
    Ok(warm_runs)
}

/// Times `run` `reps` times after warm-ups (at least two, and [`WARM_UP_SECONDS`] of them),
/// calling `prepare` (untimed) before each.
fn time_it(reps: usize, mut prepare: impl FnMut(usize), mut run: impl FnMut()) -> f64 {
    let warm_runs = warm_up(|i| {
        prepare(i);
        let t = Instant::now();
        run();
        Ok::<_, std::convert::Infallible>(t.elapsed().as_secs_f64())
    })
    .unwrap_or_else(|never| match never {});
    let mut times = Vec::new();
    for i in 0..reps {
        prepare(warm_runs + i);
        let t = Instant::now();
        run();
        times.push(t.elapsed().as_secs_f64());
    }
    print_profile(reps);
    if std::env::var_os("BENCH_EVERY_RUN").is_some() {
        let ms: Vec<String> = times.iter().map(|t| format!("{:.2}", t * 1e3)).collect();
        println!("bench: every run (ms): {}", ms.join(" "));
    }
    median(times)
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backend_wgpu::quiet_headless_start() };
    // The CPU backend's passes start on this thread (see `join_rayon_pool`).
    if let Err(e) = backend_cpu::join_rayon_pool(0) {
        eprintln!("bench: {e}");
    }
    let args = match cli::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    match args.backend.as_str() {
        "cpu" => {
            let cpu = CpuBackend::new();
            let profiled = cpu.clone();
            set_profile_hook(Box::new(move |runs| profiled.take_profile(runs)));
            run(&cpu, &args, Hooks::default())
        }
        "wgpu" => match backend_wgpu::WgpuBackend::with_options(args.wgpu_options) {
            Ok(gpu) => {
                let profiled = gpu.clone();
                set_profile_hook(Box::new(move |runs| {
                    profiled.take_profile(runs).ok().flatten()
                }));
                let tiles = match std::env::var("HAL_WGPU_TILE") {
                    Ok(t) => format!("{t} for every product (HAL_WGPU_TILE)"),
                    Err(_) => "by shape (64 x 64 for small products, 128 x 128 or a half tile for large ones)".into(),
                };
                println!(
                    "bench: wgpu GEMM tiles {tiles}; recordings {}; optional features in use: {}",
                    if gpu.capabilities().graph_capture {
                        "captured"
                    } else {
                        "run again on each replay (HAL_WGPU_CAPTURE=0)"
                    },
                    gpu.features_in_use()
                );
                let copy = |src: &backend_wgpu::WgpuBuffer, dst: &backend_wgpu::WgpuBuffer| {
                    gpu.copy_whole_buffer(src, dst)
                };
                let tiles = |name: &str| match backend_wgpu::coop::CoopTiles::parse(name) {
                    Some(t) => gpu.set_coop_tiles(t),
                    None => false,
                };
                let hooks = Hooks {
                    device_copy: Some(&copy),
                    coop_tiles: Some(&tiles),
                    ..Hooks::default()
                };
                run(&gpu, &args, hooks)
            }
            Err(e) => not_present("wgpu", &e.to_string()),
        },
        "cuda" => match backend_cuda::CudaBackend::new() {
            Ok(gpu) => {
                let profiled = gpu.clone();
                set_profile_hook(Box::new(move |runs| {
                    profiled.take_profile(runs).ok().flatten()
                }));
                let copy = |src: &backend_cuda::CudaBuffer, dst: &backend_cuda::CudaBuffer| {
                    gpu.copy_whole_buffer(src, dst)
                };
                let empty = || gpu.launch_empty();
                let memory = || {
                    let s = gpu.pool_stats();
                    let free = gpu.device_memory().map(|m| m.0).unwrap_or(0);
                    format!(
                        "driver reports {:.1} MiB free; pool holds {:.1} MiB, {:.1} MiB in use, {} cuMemAlloc calls so far",
                        free as f64 / 1048576.0,
                        s.reserved_bytes as f64 / 1048576.0,
                        s.in_use_bytes as f64 / 1048576.0,
                        s.driver_allocs
                    )
                };
                let hooks = Hooks {
                    device_copy: Some(&copy),
                    empty_launch: Some(&empty),
                    memory: Some(&memory),
                    coop_tiles: None,
                };
                run(&gpu, &args, hooks)
            }
            Err(e) => not_present("cuda", &e.to_string()),
        },
        other => {
            eprintln!("bench: unknown backend {other} (expected cpu, wgpu or cuda)");
            ExitCode::from(2)
        }
    }
}

fn not_present(name: &str, why: &str) -> ExitCode {
    println!("bench: backend {name} not present: {why}");
    ExitCode::FAILURE
}

/// The device's own whole-buffer copy, where the backend has one: the bandwidth bound.
type DeviceCopy<'a, B> =
    Option<&'a dyn Fn(&<B as Backend>::Buffer, &<B as Backend>::Buffer) -> hal::Result<()>>;

/// What a backend offers beyond `hal`, for the figures that need it.
struct Hooks<'a, B: Backend> {
    device_copy: DeviceCopy<'a, B>,
    /// Launches an empty kernel.
    empty_launch: Option<&'a dyn Fn() -> hal::Result<()>>,
    /// Describes device memory in use.
    memory: Option<&'a dyn Fn() -> String>,
    /// Sets the tiling of wgpu's cooperative-matrix product (`SRxSCxTMxTN`); false if refused.
    coop_tiles: Option<&'a dyn Fn(&str) -> bool>,
}

impl<B: Backend> Default for Hooks<'_, B> {
    fn default() -> Self {
        Hooks {
            device_copy: None,
            empty_launch: None,
            memory: None,
            coop_tiles: None,
        }
    }
}

fn run<B: Backend>(b: &B, args: &Args, hooks: Hooks<'_, B>) -> ExitCode {
    let info = b.info();
    println!(
        "bench: backend {} on {} ({:.1} GiB), medians of {} runs after warm-ups (at least 2 runs and {WARM_UP_SECONDS} s)",
        info.backend,
        info.name,
        info.memory_total as f64 / (1u64 << 30) as f64,
        args.reps
    );
    let mut ok = true;
    for suite in &args.suites {
        let result = match suite.as_str() {
            "gemm" => gemm(b, args, hooks.coop_tiles),
            "nearest" => nearest(b, args),
            "skinny" => skinny(b, args),
            "launch" => launch(b, args, &hooks),
            "memory" => memory(b, &hooks),
            "nlls" => {
                let n = nlls::NllsArgs {
                    reps: args.reps,
                    ..args.nlls.clone()
                };
                nlls::nlls(b, &n).map_err(|e| hal::Error::Backend {
                    backend: "nlls",
                    detail: e,
                })
            }
            "real" => real::real(b, &args.real).map_err(|e| hal::Error::Backend {
                backend: "real",
                detail: e,
            }),
            "vlc" => vlc::vlc(
                b,
                &vlc::VlcArgs {
                    reps: args.reps,
                    ..args.vlc.clone()
                },
            )
            .map_err(|e| hal::Error::Backend {
                backend: "vlc",
                detail: e,
            }),
            "vlc-search" => vlc_search::vlc_search(&vlc_search::VlcSearchArgs {
                reps: args.reps,
                ..args.vlc_search.clone()
            })
            .map_err(|e| hal::Error::Backend {
                backend: "vlc-search",
                detail: e,
            }),
            "gpt" => gpt::gpt(
                b,
                &gpt::GptArgs {
                    reps: args.reps,
                    ..args.gpt.clone()
                },
            )
            .map_err(|e| hal::Error::Backend {
                backend: "gpt",
                detail: e,
            }),
            "train" => {
                let t = train::TrainArgs {
                    reps: args.reps,
                    ..args.train.clone()
                };
                train::train(b, &t, hooks.memory).map_err(|e| hal::Error::Backend {
                    backend: "train",
                    detail: e,
                })
            }
            _ => elementwise(b, args, hooks.device_copy),
        };
        if let Err(e) = result {
            println!("bench: suite {suite} failed: {e}");
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The value of `key` in the one-line JSON object a peer script printed (a number or a string
/// without commas or quotes).
fn json_field(text: &str, key: &str) -> Option<String> {
    text.split(&format!("\"{key}\": ")).nth(1).map(|s| {
        s.trim_start_matches('"')
            .split(['"', ',', '}'])
            .next()
            .unwrap_or("")
            .to_string()
    })
}

/// Runs a peer script with `python3 -c SCRIPT ARGS` and returns what it printed, or why it
/// could not run (`module` names the package to install when an import fails).
pub(crate) fn run_peer(script: &str, args: &[String], module: &str) -> Result<String, String> {
    let out = Command::new("python3")
        .args(["-c", script])
        .args(args)
        .output()
        .map_err(|e| format!("python3 could not start: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(if err.contains("No module named") {
            format!("{module} is not installed (pip install {module})")
        } else {
            format!("python3 failed: {}", err.trim())
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}
