//! The collectives on NCCL, on a host with several GPUs: parity of every collective against
//! float64 (and the CPU reference's threads on the same cases), one process driving the GPUs
//! and one process per GPU meeting through a TCP or file rendezvous, and the all-reduce
//! bandwidth.
//!
//! ```text
//! collectives                      # groups of 2 and 4 GPUs (as many as there are), all cases
//! collectives --processes 2        # the same cases, one process per GPU (TCP and file)
//! collectives --bandwidth --gib 1  # all-reduce of 1 GiB of f32: time, algorithm and bus bandwidth
//! ```

use backend_cpu::CpuCommunicator;
use backend_cuda::{CudaBackend, NcclCommunicator, Rendezvous};
use clap::Parser;
use hal::collective::{CollectiveOp, Communicator};
use hal::{Backend, DType, Layout, View};
use hal_parity::collective::{Case, Kind, cases, check_group, check_rank, run_rank};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    /// Group sizes to check in one process (at most the GPUs present).
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    groups: Vec<usize>,
    /// Element counts of the cases (besides the large one).
    #[arg(long, value_delimiter = ',', default_value = "0,1,37,20011")]
    sizes: Vec<usize>,
    /// The large cases' elements (f32; all-gather and reduce-scatter split it by rank); 0 skips.
    #[arg(long, default_value_t = 1 << 28)]
    large: usize,
    /// Instead: one process per GPU, this many, meeting over TCP and then over a file.
    #[arg(long)]
    processes: Option<usize>,
    /// Instead: time all-reduce (sum, f32) on each group size.
    #[arg(long)]
    bandwidth: bool,
    /// The all-reduce's size in GiB.
    #[arg(long, default_value_t = 1.0)]
    gib: f64,
    /// Timed repetitions (after 5 warm-up ones).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    #[arg(long)]
    seed: Option<u64>,
    /// (Internal) run as rank RANK of a multi-process group: RANK,SIZE,tcp:ADDR|file:PATH.
    #[arg(long)]
    child: Option<String>,
}

const TIMEOUT: Duration = Duration::from_secs(300);

fn large_cases(size: usize, n: usize) -> Vec<Case> {
    let case = |kind, n| Case {
        kind,
        dtype: DType::F32,
        n,
        offset: 0,
        in_place: false,
        special: false,
    };
    vec![
        case(Kind::AllReduce(CollectiveOp::Sum), n),
        case(Kind::AllReduce(CollectiveOp::Max), n),
        case(Kind::Broadcast(size - 1), n),
        case(Kind::AllGather, n / size),
        case(Kind::ReduceScatter(CollectiveOp::Sum), n / size),
    ]
}

fn all_cases(args: &Args, size: usize) -> Vec<Case> {
    let mut c = cases(size, &args.sizes);
    if args.large > 0 {
        c.extend(large_cases(size, args.large));
    }
    c
}

fn backends(n: usize) -> hal::Result<Vec<CudaBackend>> {
    (0..n).map(CudaBackend::with_ordinal).collect()
}

fn gpu_count() -> usize {
    (0..64)
        .take_while(|&o| CudaBackend::with_ordinal(o).is_ok())
        .count()
}

fn report(what: &str, passed: usize, failures: &[String], started: Instant) -> bool {
    println!(
        "{what}: {passed} of {} cases passed ({:.1} s)",
        passed + failures.len(),
        started.elapsed().as_secs_f64()
    );
    for f in failures.iter().take(20) {
        println!("  FAIL {f}");
    }
    failures.is_empty()
}

fn parity(args: &Args, seed: u64, gpus: usize) -> hal::Result<bool> {
    let mut ok = true;
    for &size in args.groups.iter().filter(|&&g| g <= gpus) {
        let cases = all_cases(args, size);
        let started = Instant::now();
        let mut cpu = CpuCommunicator::group(size)?;
        let small: Vec<Case> = cases.iter().copied().filter(|c| c.n < 1 << 20).collect();
        let (passed, failures) = check_group(&mut cpu, seed, &small, TIMEOUT);
        ok &= report(
            &format!("cpu reference, {size} ranks"),
            passed,
            &failures,
            started,
        );
        let started = Instant::now();
        let mut group = NcclCommunicator::for_backends(backends(size)?)?;
        if size == args.groups[0] {
            println!("NCCL {}", group[0].nccl_version());
        }
        let (passed, failures) = check_group(&mut group, seed, &cases, TIMEOUT);
        ok &= report(
            &format!("NCCL, {size} GPUs in one process"),
            passed,
            &failures,
            started,
        );
    }
    Ok(ok)
}

/// Rank `rank` of a multi-process group: joins, runs every case, checks its own results.
fn child(args: &Args, seed: u64, spec: &str) -> hal::Result<bool> {
    let mut parts = spec.splitn(3, ',');
    let (rank, size, place) = (
        parts.next().and_then(|s| s.parse().ok()).unwrap_or(0usize),
        parts.next().and_then(|s| s.parse().ok()).unwrap_or(0usize),
        parts.next().unwrap_or(""),
    );
    let rendezvous = if let Some(addr) = place.strip_prefix("tcp:") {
        Rendezvous::Tcp(addr.parse().expect("a socket address"))
    } else {
        Rendezvous::File(place.strip_prefix("file:").unwrap_or(place).into())
    };
    let started = Instant::now();
    let comm = NcclCommunicator::join(
        CudaBackend::with_ordinal(rank)?,
        &rendezvous,
        rank,
        size,
        Duration::from_secs(60),
    )?;
    let joined = started.elapsed().as_secs_f64();
    let cases = all_cases(args, size);
    let mut failures = Vec::new();
    for case in &cases {
        let outcome = run_rank(&comm, seed, case, TIMEOUT)
            .map_err(|e| e.to_string())
            .and_then(|bytes| check_rank(seed, case, size, rank, &bytes));
        if let Err(e) = outcome {
            failures.push(format!("{}: {e}", case.describe()));
        }
    }
    report(
        &format!("rank {rank} of {size} processes ({place}; joined in {joined:.2} s)"),
        cases.len() - failures.len(),
        &failures,
        started,
    );
    Ok(failures.is_empty())
}

fn processes(args: &Args, seed: u64, n: usize) -> bool {
    let exe = std::env::current_exe().expect("own path");
    let file = std::env::temp_dir().join(format!("hal-nccl-id-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let mut ok = true;
    for place in [
        format!("tcp:127.0.0.1:{}", 29_000 + std::process::id() % 1000),
        format!("file:{}", file.display()),
    ] {
        let started = Instant::now();
        let children: Vec<_> = (0..n)
            .map(|rank| {
                std::process::Command::new(&exe)
                    .arg("--child")
                    .arg(format!("{rank},{n},{place}"))
                    .arg("--seed")
                    .arg(seed.to_string())
                    .arg("--large")
                    .arg(args.large.to_string())
                    .arg("--sizes")
                    .arg(
                        args.sizes
                            .iter()
                            .map(|s| s.to_string())
                            .collect::<Vec<_>>()
                            .join(","),
                    )
                    .spawn()
                    .expect("spawning a rank")
            })
            .collect();
        let codes: Vec<bool> = children
            .into_iter()
            .map(|mut c| c.wait().map(|s| s.success()).unwrap_or(false))
            .collect();
        let all = codes.iter().all(|&c| c);
        println!(
            "{n} processes over {place}: {} ({:.1} s)",
            if all { "all ranks passed" } else { "FAILED" },
            started.elapsed().as_secs_f64()
        );
        ok &= all;
    }
    let _ = std::fs::remove_file(&file);
    ok
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bandwidth(args: &Args, gpus: usize) -> hal::Result<()> {
    let n = ((args.gib * (1u64 << 30) as f64) as usize / 4).max(1);
    let bytes = (n * 4) as f64;
    for &size in args.groups.iter().filter(|&&g| g <= gpus) {
        let mut group = NcclCommunicator::for_backends(backends(size)?)?;
        let barrier = std::sync::Barrier::new(size);
        let times: Vec<hal::Result<Vec<f64>>> = std::thread::scope(|s| {
            let hs: Vec<_> = group
                .iter_mut()
                .map(|c| {
                    let barrier = &barrier;
                    s.spawn(move || -> hal::Result<Vec<f64>> {
                        let be = c.backend();
                        let x = be.alloc(DType::F32, n)?;
                        be.fill(View::new(&x, &Layout::contiguous(&[n])), 1.0)?;
                        let l = Layout::contiguous(&[n]);
                        let mut t = Vec::new();
                        for rep in 0..5 + args.reps {
                            barrier.wait();
                            let start = Instant::now();
                            c.all_reduce(CollectiveOp::Sum, View::new(&x, &l), View::new(&x, &l))?;
                            c.synchronize(TIMEOUT)?;
                            if rep >= 5 {
                                t.push(start.elapsed().as_secs_f64());
                            }
                        }
                        Ok(t)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let rank0 = times.into_iter().next().unwrap()?;
        let t = median(rank0);
        let alg = bytes / t / 1e9;
        let bus = alg * 2.0 * (size - 1) as f64 / size as f64;
        println!(
            "all_reduce f32 sum, {:.2} GiB, {size} GPUs: median {:.3} ms, algbw {alg:.1} GB/s, busbw {bus:.1} GB/s ({} reps)",
            bytes / (1u64 << 30) as f64,
            t * 1e3,
            args.reps
        );
        let _ = group[0].backend().synchronize();
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args
        .seed
        .unwrap_or_else(|| hal_parity::fresh_seed("COLLECTIVE_SEED"));
    let outcome = if let Some(spec) = &args.child {
        child(&args, seed, spec)
    } else {
        let gpus = gpu_count();
        println!("{gpus} GPUs");
        if gpus < 2 {
            eprintln!("the collectives need at least 2 GPUs");
            return ExitCode::FAILURE;
        }
        if args.bandwidth {
            bandwidth(&args, gpus).map(|()| true)
        } else if let Some(n) = args.processes {
            Ok(processes(&args, seed, n.min(gpus)))
        } else {
            parity(&args, seed, gpus)
        }
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
