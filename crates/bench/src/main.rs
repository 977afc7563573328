//! `bench`: measures `hal` primitives on a backend and, where a peer can run on the same
//! machine, the peer in the same run, and prints medians with ratios.
//!
//! ```text
//! bench [--backend cpu] [--suite gemm,elementwise,nearest,skinny,launch,memory,nlls,train,vlc] [--reps N] [--gemm-size N]
//!       [--levels 4,5] [--edges N] [--compile-level L] [--no-break-even]
//!       [--elements N] [--points N] [--centroids N] [--dim N] [--wgpu-fallbacks]
//!       [--wgpu-without immediates,f16,subgroups,coop] [--coop-tiles SRxSCxTMxTN,...]
//! ```
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
use hal::{Backend, BackendExt, BinaryOp, DType, Distribution, Layout, View};
use std::process::{Command, ExitCode};
use std::time::Instant;

mod cli;
mod nlls;
mod train;
mod vlc;

pub(crate) use cli::Args;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds of warm-up runs before timed ones (see [`time_it`]).
const WARM_UP_SECONDS: f64 = 0.5;

/// Under `HAL_WGPU_PROFILE` with the wgpu backend or `HAL_CUDA_PROFILE` with the CUDA one: the
/// per-kernel GPU time since the last call, divided by the runs given (see the backends'
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
/// peer ran on the CPU, say) drops its clocks and raises them only after sustained load: on an
/// H200 through Vulkan, runs after an idle spell took 3-4x longer for the first 0.1-0.2 s.
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
    let args = match cli::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    match args.backend.as_str() {
        "cpu" => run(&CpuBackend::new(), &args, Hooks::default()),
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

/// numpy's matmul timed by python3 on this machine, or why it could not run.
fn numpy_gemm(n: usize, reps: usize) -> Result<(f64, String), String> {
    const SCRIPT: &str = r#"
import json, sys, time
import numpy as np
n, reps = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng()
times = []
for i in range(reps + 2):
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    t = time.perf_counter(); c = a @ b; t = time.perf_counter() - t
    if i >= 2: times.append(t)
times.sort()
blas = "unknown BLAS"
try:
    cfg = np.show_config(mode="dicts")
    blas = cfg["Build Dependencies"]["blas"]["name"] + " " + str(cfg["Build Dependencies"]["blas"].get("version", ""))
except Exception:
    pass
print(json.dumps({"median": times[len(times) // 2], "what": "numpy " + np.__version__ + " (" + blas + ")"}))
"#;
    let text = run_peer(SCRIPT, &[n.to_string(), reps.to_string()], "numpy")?;
    let field = |k: &str| json_field(&text, k);
    let median = field("median")
        .and_then(|m| m.parse::<f64>().ok())
        .ok_or(format!("unreadable output: {text}"))?;
    Ok((median, field("what").unwrap_or_default()))
}

fn gemm<B: Backend>(
    b: &B,
    args: &Args,
    coop_tiles: Option<&dyn Fn(&str) -> bool>,
) -> hal::Result<()> {
    gemm_at(b, args, "f32", DType::F32, 1e-5)?;
    match numpy_gemm(args.gemm_size, args.reps) {
        Ok((tp, what)) => {
            let n = args.gemm_size;
            println!(
                "gemm f32 {n}^3: peer {what}: {:.2} ms, {:.1} GFLOP/s",
                tp * 1e3,
                2.0 * (n as f64).powi(3) / tp / 1e9,
            )
        }
        Err(why) => println!("gemm f32 {}^3: peer numpy not run: {why}", args.gemm_size),
    }
    let caps = b.capabilities();
    // Precision::Fast's stated bound is 2^-10 k |a||b|; the check is tighter: 2^-10 |a||b|.
    // Compensated is held to the f32 check.
    for (policy, present, tol) in [
        (hal::Precision::Fast, caps.fast_precision, 2f64.powi(-10)),
        (
            hal::Precision::Compensated,
            caps.compensated_precision,
            1e-5,
        ),
    ] {
        if present {
            let label = format!("f32 in Precision::{policy:?}");
            gemm_at(&b.with_precision(policy), args, &label, DType::F32, tol)?;
        }
    }
    if caps.matrix_units {
        // f16 inputs are exact in f32, so the f32 product's bound applies.
        gemm_at(b, args, "f16 inputs, f32 accumulation", DType::F16, 1e-5)?;
        for name in &args.coop_tiles {
            match coop_tiles {
                Some(set) if set(name) => gemm_at(
                    b,
                    args,
                    &format!("f16 inputs, cooperative tiles {name}"),
                    DType::F16,
                    1e-5,
                )?,
                _ => println!("gemm: tiling {name} not applicable on this backend"),
            }
        }
    }
    Ok(())
}

/// A buffer's values as f64, whatever its float dtype.
fn read_f64<B: Backend>(b: &B, buf: &B::Buffer) -> hal::Result<Vec<f64>> {
    Ok(match hal::DeviceBuffer::dtype(buf) {
        DType::F16 => b
            .read::<half::f16>(buf)?
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::BF16 => b
            .read::<half::bf16>(buf)?
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        _ => b.read::<f32>(buf)?.iter().map(|&v| v as f64).collect(),
    })
}

/// Times an `n^3` GEMM of `dtype` inputs into f32 on `b`, checked first on sampled entries
/// against float64 to `tol` of `|a| @ |b|`; prints also the normwise relative error of the
/// sampled entries.
fn gemm_at<B: Backend>(b: &B, args: &Args, label: &str, dtype: DType, tol: f64) -> hal::Result<()> {
    let n = args.gemm_size;
    let l = Layout::contiguous(&[n, n]);
    let (x, y, out) = (
        b.alloc(dtype, n * n)?,
        b.alloc(dtype, n * n)?,
        b.alloc(DType::F32, n * n)?,
    );
    let normal = Distribution::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let fresh = |i: usize| {
        b.random(View::new(&x, &l), normal, 11, (2 * i * n * n) as u64)
            .expect("random");
        b.random(View::new(&y, &l), normal, 11, ((2 * i + 1) * n * n) as u64)
            .expect("random");
        b.fill(View::new(&out, &l), f64::NAN).expect("fill"); // poison: every element must be written
        b.synchronize().expect("sync");
    };
    // Correct first: sampled entries against float64.
    fresh(0);
    b.matmul(
        View::new(&x, &l),
        View::new(&y, &l),
        View::new(&out, &l),
        1.0,
        0.0,
    )?;
    let (xs, ys, os) = (read_f64(b, &x)?, read_f64(b, &y)?, b.read::<f32>(&out)?);
    let mut worst = 0f64;
    let (mut err2, mut ref2) = (0f64, 0f64);
    for s in 0..256 {
        let (i, j) = ((s * 7919) % n, (s * 104_729 + 13) % n);
        let want: f64 = (0..n).map(|k| xs[i * n + k] * ys[k * n + j]).sum();
        let scale: f64 = (0..n).map(|k| (xs[i * n + k] * ys[k * n + j]).abs()).sum();
        let e = os[i * n + j] as f64 - want;
        worst = worst.max(e.abs() / scale);
        err2 += e * e;
        ref2 += want * want;
    }
    let relative = (err2 / ref2).sqrt();
    if os.iter().any(|v| v.is_nan()) || worst > tol {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: format!(
                "GEMM check failed: worst error {worst:.2e} of |a||b|, or unwritten output"
            ),
        });
    }
    let t = time_it(args.reps, fresh, || {
        b.matmul(
            View::new(&x, &l),
            View::new(&y, &l),
            View::new(&out, &l),
            1.0,
            0.0,
        )
        .expect("matmul");
        b.synchronize().expect("sync");
    });
    let flops = 2.0 * (n as f64).powi(3);
    println!(
        "gemm {label} {n}^3: {:.2} ms, {:.1} GFLOP/s (checked: worst sampled error {worst:.1e} of |a||b|; relative error {relative:.1e} against f64 on 256 sampled entries)",
        t * 1e3,
        flops / t / 1e9
    );
    Ok(())
}

fn elementwise<B: Backend>(b: &B, args: &Args, device_copy: DeviceCopy<'_, B>) -> hal::Result<()> {
    let n = args.elements;
    let bytes = (n * 4) as f64;
    // The bound: a plain memcpy of the same size on the host (read + write counted).
    let src: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let mut dst = vec![0f32; n];
    let t_copy = time_it(args.reps, |_| {}, || dst.copy_from_slice(&src));
    // The stricter bound: the same copy split across every hardware thread.
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let t_par = time_it(
        args.reps,
        |_| {},
        || {
            let chunk = n.div_ceil(threads);
            std::thread::scope(|sc| {
                for (d, s) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                    sc.spawn(move || d.copy_from_slice(s));
                }
            });
        },
    );
    std::hint::black_box(&dst);
    drop((src, dst));
    let copy_bw = 2.0 * bytes / t_copy;
    let par_bw = 2.0 * bytes / t_par;
    println!(
        "memcpy {} MiB (plain, one call): {:.2} ms, {:.2} GB/s read+write",
        (n * 4) >> 20,
        t_copy * 1e3,
        copy_bw / 1e9
    );
    println!(
        "memcpy {} MiB ({threads} threads): {:.2} ms, {:.2} GB/s read+write",
        (n * 4) >> 20,
        t_par * 1e3,
        par_bw / 1e9
    );

    let ops = AddOperands::new(b, DType::F32, n, 5)?;
    let (x, y, out, l) = (&ops.x, &ops.y, &ops.out, &ops.l);
    ops.fresh(0);
    b.fill(View::new(out, l), f64::NAN)?;
    ops.add();
    let (xs, ys, os) = (b.read::<f32>(x)?, b.read::<f32>(y)?, b.read::<f32>(out)?);
    if (0..n).any(|i| os[i] != xs[i] + ys[i]) {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: "elementwise add check failed".into(),
        });
    }
    drop((xs, ys, os));
    let t = time_it(
        args.reps,
        |i| ops.fresh(i),
        || {
            ops.add();
            b.synchronize().expect("sync");
        },
    );
    let bw = 3.0 * bytes / t;
    println!(
        "add f32 {}M: {:.2} ms, {:.2} GB/s read+write = {:.0}% of plain memcpy, {:.0}% of {threads}-thread memcpy (checked exactly)",
        n >> 20,
        t * 1e3,
        bw / 1e9,
        100.0 * bw / copy_bw,
        100.0 * bw / par_bw
    );
    let t_batch = ops.back_to_back(args.reps);
    println!(
        "add f32 {}M, 10 back to back, one wait: {:.3} ms each, {:.2} GB/s read+write",
        n >> 20,
        t_batch * 1e3,
        3.0 * bytes / t_batch / 1e9
    );
    elementwise_f16(b, args)?;
    if let Some(copy) = device_copy {
        // For reference: the driver's own buffer-to-buffer copy (read + write counted). Not a
        // bound: on NVIDIA through Vulkan it runs slower than our add kernel.
        copy(x, out)?;
        b.synchronize()?;
        let t_dev = time_it(
            args.reps,
            |_| {},
            || {
                copy(x, out).expect("device copy");
                b.synchronize().expect("sync");
            },
        );
        println!(
            "driver buffer copy {} MiB (reference, not a bound): {:.3} ms, {:.1} GB/s read+write",
            (n * 4) >> 20,
            t_dev * 1e3,
            2.0 * bytes / t_dev / 1e9
        );
    }
    // Latency: one tiny dispatch, submitted and waited for; then its two halves.
    let one = b.alloc(DType::F32, 1)?;
    let l1 = Layout::contiguous(&[1]);
    let samples = |mut f: Box<dyn FnMut() -> f64 + '_>| {
        let mut v: Vec<f64> = (0..args.reps.max(101) + 5).map(|_| f()).skip(5).collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() * 9 / 10])
    };
    let trip = samples(Box::new(|| {
        let t = Instant::now();
        b.fill(View::new(&one, &l1), 1.0).expect("fill");
        b.synchronize().expect("sync");
        t.elapsed().as_secs_f64()
    }));
    let submit = samples(Box::new(|| {
        let t = Instant::now();
        b.fill(View::new(&one, &l1), 1.0).expect("fill");
        let e = t.elapsed().as_secs_f64();
        b.synchronize().expect("sync");
        e
    }));
    let wait = samples(Box::new(|| {
        b.fill(View::new(&one, &l1), 1.0).expect("fill");
        std::thread::sleep(std::time::Duration::from_millis(1));
        let t = Instant::now();
        b.synchronize().expect("sync");
        t.elapsed().as_secs_f64()
    }));
    println!(
        "round trip of a 1-element dispatch (submit + wait): {:.1} us median (min {:.1}, p90 {:.1}); submit alone {:.1} us, wait for finished work {:.1} us",
        trip.0 * 1e6,
        trip.1 * 1e6,
        trip.2 * 1e6,
        submit.0 * 1e6,
        wait.0 * 1e6
    );
    Ok(())
}

/// Nearest-centroid search: `points` x `dim` against `centroids`, fresh uniform data each run.
/// Checked first on sampled rows against a float64 brute force (the chosen centroid must be
/// within the hal tolerance of the best, the distance within it of the exact one).
fn nearest<B: Backend>(b: &B, args: &Args) -> hal::Result<()> {
    let (n, m, d) = (args.points, args.centroids, args.dim);
    let (xl, cl, ol) = (
        Layout::contiguous(&[n, d]),
        Layout::contiguous(&[m, d]),
        Layout::contiguous(&[n]),
    );
    let (x, c) = (b.alloc(DType::F32, n * d)?, b.alloc(DType::F32, m * d)?);
    let (idx, dist) = (b.alloc(DType::U32, n)?, b.alloc(DType::F32, n)?);
    let uniform = Distribution::Uniform {
        low: -1.0,
        high: 1.0,
    };
    let fresh = |i: usize| {
        let base = (i * (n + m) * d) as u64;
        b.random(View::new(&x, &xl), uniform, 5, base)
            .expect("random");
        b.random(View::new(&c, &cl), uniform, 5, base + (n * d) as u64)
            .expect("random");
        b.fill(View::new(&dist, &ol), f64::NAN).expect("fill");
        b.synchronize().expect("sync");
    };
    let search = || {
        b.nearest_centroid(
            View::new(&x, &xl),
            View::new(&c, &cl),
            View::new(&idx, &ol),
            View::new(&dist, &ol),
        )
    };
    fresh(0);
    search()?;
    let (xs, cs) = (b.read::<f32>(&x)?, b.read::<f32>(&c)?);
    let (is, ds) = (b.read::<u32>(&idx)?, b.read::<f32>(&dist)?);
    let exact = |i: usize, j: usize| -> f64 {
        (0..d)
            .map(|k| (xs[i * d + k] as f64 - cs[j * d + k] as f64).powi(2))
            .sum()
    };
    let norm = |v: &[f32], i: usize| -> f64 { (0..d).map(|k| (v[i * d + k] as f64).powi(2)).sum() };
    let cmax = (0..m).map(|j| norm(&cs, j)).fold(0.0, f64::max);
    let mut worst = 0f64;
    for s in 0..256.min(n) {
        let i = (s * 7919 + 17) % n;
        let best = (0..m).map(|j| exact(i, j)).fold(f64::INFINITY, f64::min);
        let j = is[i] as usize;
        let chosen = if j < m { exact(i, j) } else { f64::INFINITY };
        let tol = 2f64.powi(-16) * (norm(&xs, i) + cmax);
        worst = worst.max((chosen - best).max((ds[i] as f64 - chosen).abs()) / tol);
    }
    if worst > 1.0 || ds.iter().any(|v| v.is_nan()) {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: format!(
                "nearest-centroid check failed: worst {worst:.2} of the tolerance, or unwritten output"
            ),
        });
    }
    drop((xs, cs, is, ds));
    let t = time_it(args.reps, fresh, || {
        search().expect("nearest_centroid");
        b.synchronize().expect("sync");
    });
    println!(
        "nearest centroid {n} x {d} vs {m}: {:.2} ms, {:.1} GFLOP/s of distance work (checked 256 rows: worst {worst:.2} of the tolerance)",
        t * 1e3,
        2.0 * (n * m * d) as f64 / t / 1e9
    );
    if b.capabilities().fast_precision {
        let fast = b.with_precision(hal::Precision::Fast);
        let search_fast = || {
            fast.nearest_centroid(
                View::new(&x, &xl),
                View::new(&c, &cl),
                View::new(&idx, &ol),
                View::new(&dist, &ol),
            )
        };
        // Agreement with the exact assignments on the same data.
        fresh(1);
        search()?;
        let exact_idx = b.read::<u32>(&idx)?;
        search_fast()?;
        let fast_idx = b.read::<u32>(&idx)?;
        let same = exact_idx
            .iter()
            .zip(&fast_idx)
            .filter(|(a, b)| a == b)
            .count();
        let t_fast = time_it(args.reps, fresh, || {
            search_fast().expect("nearest_centroid");
            b.synchronize().expect("sync");
        });
        println!(
            "nearest centroid {n} x {d} vs {m}, Precision::Fast: {:.2} ms, {:.1} GFLOP/s; assignments equal to exact mode on {:.4}% of points",
            t_fast * 1e3,
            2.0 * (n * m * d) as f64 / t_fast / 1e9,
            100.0 * same as f64 / n as f64
        );
    }
    Ok(())
}

/// Launch overhead: an empty kernel launched back to back (where the backend exposes one),
/// and a sequence of 50 small kernels (1024-element adds) launched one by one against the
/// same sequence recorded once and replayed, each waited for.
fn launch<B: Backend>(b: &B, args: &Args, hooks: &Hooks<'_, B>) -> hal::Result<()> {
    let reps = args.reps.max(101);
    if let Some(empty) = hooks.empty_launch {
        empty()?;
        b.synchronize()?;
        let per = time_it(
            reps,
            |_| {},
            || {
                for _ in 0..1000 {
                    empty().expect("launch");
                }
                b.synchronize().expect("sync");
            },
        ) / 1000.0;
        let trip = time_it(
            reps,
            |_| {},
            || {
                empty().expect("launch");
                b.synchronize().expect("sync");
            },
        );
        println!(
            "empty kernel: {:.2} us per launch (1000 back to back, one wait); launch + wait {:.2} us",
            per * 1e6,
            trip * 1e6
        );
    }
    let l = Layout::contiguous(&[1024]);
    let (x, y) = (b.alloc(DType::F32, 1024)?, b.alloc(DType::F32, 1024)?);
    b.fill(View::new(&x, &l), 1.0)?;
    let steps = {
        let (x, y, l) = (x.clone(), y.clone(), l.clone());
        move |b: &B| -> hal::Result<()> {
            for _ in 0..50 {
                b.binary(
                    BinaryOp::Add,
                    View::new(&x, &l),
                    View::new(&y, &l),
                    View::new(&y, &l),
                )?;
            }
            Ok(())
        }
    };
    let graph = b.record(std::sync::Arc::new(steps.clone()))?;
    b.fill(View::new(&y, &l), 0.0)?;
    b.replay(&graph)?;
    let got = b.read::<f32>(&y)?;
    if got.iter().any(|&v| v != 50.0) {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: format!("replayed sequence gave {} instead of 50", got[0]),
        });
    }
    let one_by_one = time_it(
        reps,
        |_| {},
        || {
            steps(b).expect("steps");
            b.synchronize().expect("sync");
        },
    );
    let replayed = time_it(
        reps,
        |_| {},
        || {
            b.replay(&graph).expect("replay");
            b.synchronize().expect("sync");
        },
    );
    let back_to_back = time_it(
        reps,
        |_| {},
        || {
            for _ in 0..10 {
                b.replay(&graph).expect("replay");
            }
            b.synchronize().expect("sync");
        },
    ) / 10.0;
    println!(
        "50 small kernels (1024-element adds), waited for: {:.1} us launched one by one, {:.1} us replayed from a recording ({}; checked); {:.1} us per replay with 10 back to back",
        one_by_one * 1e6,
        replayed * 1e6,
        if b.capabilities().graph_capture {
            "captured launches"
        } else {
            "steps run again"
        },
        back_to_back * 1e6
    );
    Ok(())
}

/// Device memory across 10,000 iterations of a loop of primitives that allocate temporaries
/// (elementwise, reduction, small matmul, nearest-centroid search, segment sums, gather).
fn memory<B: Backend>(b: &B, hooks: &Hooks<'_, B>) -> hal::Result<()> {
    let (n, d, m) = (4096usize, 32usize, 64usize);
    let (xl, cl) = (Layout::contiguous(&[n, d]), Layout::contiguous(&[m, d]));
    let x = b.alloc(DType::F32, n * d)?;
    let c = b.alloc(DType::F32, m * d)?;
    let u = Distribution::Uniform {
        low: -1.0,
        high: 1.0,
    };
    b.random(View::new(&x, &xl), u, 3, 0)?;
    b.random(View::new(&c, &cl), u, 3, (n * d) as u64)?;
    let iteration = || -> hal::Result<()> {
        let idx = b.alloc(DType::U32, n)?;
        let dist = b.alloc(DType::F32, n)?;
        let nl = Layout::contiguous(&[n]);
        b.nearest_centroid(
            View::new(&x, &xl),
            View::new(&c, &cl),
            View::new(&idx, &nl),
            View::new(&dist, &nl),
        )?;
        let sums = b.alloc(DType::F32, m * d)?;
        let counts = b.alloc(DType::F32, m)?;
        b.segment_sum(
            View::new(&x, &xl),
            View::new(&idx, &nl),
            None,
            View::new(&sums, &cl),
            View::new(&counts, &Layout::contiguous(&[m])),
        )?;
        let sq = b.alloc(DType::F32, n * d)?;
        b.binary(
            BinaryOp::Mul,
            View::new(&x, &xl),
            View::new(&x, &xl),
            View::new(&sq, &xl),
        )?;
        let total = b.alloc(DType::F32, n)?;
        b.reduce(
            hal::ReduceOp::Sum,
            View::new(&sq, &xl),
            &[1],
            View::new(&total, &Layout::contiguous(&[n, 1])),
        )?;
        let prod = b.alloc(DType::F32, m * m)?;
        b.matmul(
            View::new(&c, &cl),
            View::new(&c, &cl.transpose(0, 1)?),
            View::new(&prod, &Layout::contiguous(&[m, m])),
            1.0,
            0.0,
        )?;
        let picked = b.alloc(DType::F32, n * d)?;
        let il = Layout::contiguous(&[n, 1]).broadcast_to(&[n, d])?;
        b.gather(
            View::new(&c, &cl),
            0,
            View::new(&idx, &il),
            View::new(&picked, &xl),
        )?;
        Ok(())
    };
    let describe = |when: &str| println!("memory {when}: {}", memory_report(b, hooks.memory));
    // One iteration first so the pool holds what the loop needs, then 10,000 more.
    iteration()?;
    b.synchronize()?;
    describe("after 1 iteration");
    let t = Instant::now();
    for _ in 0..10_000 {
        iteration()?;
    }
    b.synchronize()?;
    describe("after 10,001 iterations");
    println!(
        "memory loop: 10,000 iterations of 6 primitives with temporaries in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Device memory in use as the backend's hook describes it, else the bytes it reports free.
fn memory_report<B: Backend>(b: &B, memory: Option<&dyn Fn() -> String>) -> String {
    match memory {
        Some(f) => f(),
        None => format!("{} bytes available", b.info().memory_available),
    }
}

/// Elementwise add on f16 storage (f32 arithmetic, one rounding), back to back: the 16-bit
/// load and store path. Checked exactly against f16(f32(x) + f32(y)).
fn elementwise_f16<B: Backend>(b: &B, args: &Args) -> hal::Result<()> {
    let n = args.elements;
    let ops = AddOperands::new(b, DType::F16, n, 7)?;
    ops.fresh(0);
    ops.add();
    let halves = |buf: &B::Buffer| -> hal::Result<Vec<half::f16>> {
        Ok(b.read_bytes(buf)?
            .chunks(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
            .collect())
    };
    let (xs, ys, os) = (halves(&ops.x)?, halves(&ops.y)?, halves(&ops.out)?);
    if (0..n).any(|i| os[i] != half::f16::from_f32(xs[i].to_f32() + ys[i].to_f32())) {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: "f16 add check failed".into(),
        });
    }
    drop((xs, ys, os));
    let t = ops.back_to_back(args.reps);
    println!(
        "add f16 {}M, 10 back to back, one wait: {:.3} ms each, {:.2} GB/s read+write (checked exactly)",
        n >> 20,
        t * 1e3,
        3.0 * 2.0 * n as f64 / t / 1e9
    );
    Ok(())
}

/// The operands of the add benchmarks: `out = x + y` over `n` contiguous elements of one
/// dtype, `x` and `y` drawn afresh (uniform in [-1, 1), seeded) before each timed run.
struct AddOperands<'a, B: Backend> {
    b: &'a B,
    x: B::Buffer,
    y: B::Buffer,
    out: B::Buffer,
    l: Layout,
    seed: u64,
}

impl<'a, B: Backend> AddOperands<'a, B> {
    fn new(b: &'a B, dtype: DType, n: usize, seed: u64) -> hal::Result<Self> {
        Ok(AddOperands {
            b,
            x: b.alloc(dtype, n)?,
            y: b.alloc(dtype, n)?,
            out: b.alloc(dtype, n)?,
            l: Layout::contiguous(&[n]),
            seed,
        })
    }

    /// New random `x` and `y` for run `i`, waited for (outside any timed region).
    fn fresh(&self, i: usize) {
        let (n, u) = (
            self.l.numel(),
            Distribution::Uniform {
                low: -1.0,
                high: 1.0,
            },
        );
        for (k, buf) in [&self.x, &self.y].into_iter().enumerate() {
            let at = ((2 * i + k) * n) as u64;
            self.b
                .random(View::new(buf, &self.l), u, self.seed, at)
                .expect("random");
        }
        self.b.synchronize().expect("sync");
    }

    fn add(&self) {
        let v = |buf| View::new(buf, &self.l);
        self.b
            .binary(BinaryOp::Add, v(&self.x), v(&self.y), v(&self.out))
            .expect("add")
    }

    /// Median seconds per add of ten adds submitted back to back with one wait: the
    /// kernel's own throughput, per-call waiting excluded.
    fn back_to_back(&self, reps: usize) -> f64 {
        time_it(
            reps,
            |i| self.fresh(i),
            || {
                for _ in 0..10 {
                    self.add();
                }
                self.b.synchronize().expect("sync");
            },
        ) / 10.0
    }
}

/// Matrix products with few outputs and a long k (the dot-product kernel on wgpu): a
/// 4096 x 4096 matrix times a vector (bandwidth-bound: the matrix is read once), and a 64 x 64
/// output with k = 262144 (b viewed transposed, so both k strides are 1). Checked first on
/// sampled outputs against float64.
fn skinny<B: Backend>(b: &B, args: &Args) -> hal::Result<()> {
    for (m, n, k, what) in [
        (4096usize, 1usize, 4096usize, "matrix-vector 4096 x 4096"),
        (64, 64, 262_144, "64 x 64 output, k = 262144"),
    ] {
        let la = Layout::contiguous(&[m, k]);
        let lb = Layout::contiguous(&[n, k]).permute(&[1, 0])?;
        let lo = Layout::contiguous(&[m, n]);
        let (a, bt, out) = (
            b.alloc(DType::F32, m * k)?,
            b.alloc(DType::F32, n * k)?,
            b.alloc(DType::F32, m * n)?,
        );
        let u = Distribution::Uniform {
            low: -1.0,
            high: 1.0,
        };
        let fresh = |i: usize| {
            let base = (i * (m + n) * k) as u64;
            b.random(View::new(&a, &la), u, 11, base).expect("random");
            b.random(
                View::new(&bt, &Layout::contiguous(&[n, k])),
                u,
                11,
                base + (m * k) as u64,
            )
            .expect("random");
            b.synchronize().expect("sync");
        };
        let product = || {
            b.matmul(
                View::new(&a, &la),
                View::new(&bt, &lb),
                View::new(&out, &lo),
                1.0,
                0.0,
            )
            .expect("matmul")
        };
        fresh(0);
        product();
        let (av, bv, ov) = (
            b.read::<f32>(&a)?,
            b.read::<f32>(&bt)?,
            b.read::<f32>(&out)?,
        );
        for o in (0..m * n).step_by((m * n / 61).max(1)) {
            let (r, c) = (o / n, o % n);
            let (mut exact, mut size) = (0f64, 0f64);
            for j in 0..k {
                let t = av[r * k + j] as f64 * bv[c * k + j] as f64;
                exact += t;
                size += t.abs();
            }
            // hal's tolerance, 2^-18 k (|a| @ |b|), is loose for k this long; this is 2^-18 of
            // the sum of |terms|, tighter, and still what f32 accumulation in 32 parts meets.
            let bound = 2f64.powi(-18) * size + 2f64.powi(-24) * exact.abs();
            if (ov[o] as f64 - exact).abs() > bound {
                return Err(hal::Error::Backend {
                    backend: "bench",
                    detail: format!("{what}: output {o} is {} but float64 gives {exact}", ov[o]),
                });
            }
        }
        drop((av, bv, ov));
        let t = time_it(args.reps, fresh, || {
            product();
            b.synchronize().expect("sync");
        });
        let flops = 2.0 * (m * n * k) as f64;
        let bytes = 4.0 * ((m + n) * k + m * n) as f64;
        println!(
            "matmul f32 {what}: {:.3} ms, {:.1} GFLOP/s, {:.1} GB/s of operands (checked against float64)",
            t * 1e3,
            flops / t / 1e9,
            bytes / t / 1e9
        );
    }
    Ok(())
}
