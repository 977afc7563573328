//! Times the annealing iteration with the points split over 1, 2, 4 ... devices
//! ([`vlc_anneal::anneal_sharded`]): a Gaussian mixture of `--points` x `--dim` (generated on
//! all cores, each rank's rows of one mixture), `--anchors` anchors, `--iterations` updates,
//! maintenance off. Prints the time per iteration (after seeding, and after a one-update run
//! that compiles the kernels) and the speed-up over the first device count, and checks that
//! every rank ends with the same anchors.
//!
//! ```sh
//! cargo run --release -p vlc-anneal --example sharded_kmeans -- --backend cuda --devices 1,2,4
//! cargo run --release -p vlc-anneal --example sharded_kmeans -- --backend cpu --points 200000 --anchors 256 --devices 1,2
//! ```
//!
//! `--exact` runs exact mode, where every device count must print the same anchors digest
//! (one device's anchors bit for bit).

use backend_cpu::CpuCommunicator;
use backend_cuda::{CudaBackend, NcclCommunicator};
use hal::collective::Communicator;
use std::time::Instant;
use vlc_anneal::{Config, Matrix, anneal_sharded};

struct Args {
    backend: String,
    devices: Vec<usize>,
    points: usize,
    dim: usize,
    anchors: usize,
    iterations: usize,
    exact: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        backend: "cuda".into(),
        devices: vec![1, 2, 4],
        points: 10_000_000,
        dim: 128,
        anchors: 4096,
        iterations: 20,
        exact: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--exact" {
            a.exact = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = || value.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--backend" => a.backend = value.clone(),
            "--devices" => {
                a.devices = value
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--devices: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--points" => a.points = num()?,
            "--dim" => a.dim = num()?,
            "--anchors" => a.anchors = num()?,
            "--iterations" => a.iterations = num()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Rows `range` of one mixture of `clusters` Gaussians (spread 0.05 around centres in
/// [-1, 1]^d), each row a function of its index: any split of the rows gives the same set.
fn rows(range: std::ops::Range<usize>, d: usize, clusters: usize) -> Matrix {
    let unit = |h: u64| (h >> 11) as f64 / (1u64 << 53) as f64;
    let centre =
        |c: usize, k: usize| (unit(splitmix((c * d + k) as u64 ^ 0xc3)) * 2.0 - 1.0) as f32;
    let n = range.len();
    let mut data = vec![0f32; n * d];
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (t, chunk) in data.chunks_mut(per * d).enumerate() {
            let start = range.start + t * per;
            s.spawn(move || {
                for (i, row) in chunk.chunks_mut(d).enumerate() {
                    let mut h = splitmix((start + i) as u64);
                    let c = (h % clusters as u64) as usize;
                    for (k, v) in row.iter_mut().enumerate() {
                        h = splitmix(h);
                        let (u1, u2) = (unit(h).max(1e-300), unit(splitmix(h ^ 1)));
                        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                        *v = centre(c, k) + (z * 0.05) as f32;
                    }
                }
            });
        }
    });
    Matrix::new(n, d, data).expect("sized")
}

/// Runs every rank of `comms` on its rows; returns (seconds per iteration, energy, a digest
/// of the anchors' bits).
fn run<C: Communicator>(comms: Vec<C>, a: &Args) -> Result<(f64, f64, u64), String> {
    let size = comms.len();
    let mut cfg = Config::new(a.anchors);
    cfg.iterations = a.iterations;
    cfg.maintain_every = 0;
    cfg.tolerance = 0.0;
    if a.exact {
        cfg.mode = vlc_anneal::Mode::Exact;
    }
    let outcomes: Vec<Result<_, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let cfg = cfg.clone();
                s.spawn(move || {
                    let (lo, hi) = (a.points * rank / size, a.points * (rank + 1) / size);
                    let shard = rows(lo..hi, a.dim, 1000);
                    // A one-update run first: the kernels compile (NVRTC) outside the timing.
                    let mut warm = cfg.clone();
                    warm.iterations = 1;
                    anneal_sharded(&comm, &shard, &warm, &mut |_| {}).map_err(|e| e.to_string())?;
                    let started = Instant::now();
                    let c = anneal_sharded(&comm, &shard, &cfg, &mut |_| {})
                        .map_err(|e| e.to_string())?;
                    let total = started.elapsed().as_secs_f64();
                    let last = c.history.last().map_or(total, |r| r.elapsed);
                    Ok((
                        (last - c.seeding_seconds) / a.iterations as f64,
                        c.energy,
                        c.anchors.data,
                    ))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let outcomes: Vec<_> = outcomes.into_iter().collect::<Result<_, _>>()?;
    if outcomes.iter().any(|o| o.2 != outcomes[0].2) {
        return Err("the ranks' anchors differ".into());
    }
    let slowest = outcomes.iter().map(|o| o.0).fold(0f64, f64::max);
    let digest = outcomes[0].2.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
    });
    Ok((slowest, outcomes[0].1, digest))
}

fn main() -> std::process::ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sharded_kmeans: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!(
        "sharded k-means: {} x {} points, {} anchors, {} iterations, backend {}",
        a.points, a.dim, a.anchors, a.iterations, a.backend
    );
    let mut one = None;
    for &n in &a.devices {
        let outcome = match a.backend.as_str() {
            "cpu" => CpuCommunicator::group(n)
                .map_err(|e| e.to_string())
                .and_then(|g| run(g, &a)),
            "cuda" => (0..n)
                .map(CudaBackend::with_ordinal)
                .collect::<Result<Vec<_>, _>>()
                .and_then(NcclCommunicator::for_backends)
                .map_err(|e| e.to_string())
                .and_then(|g| run(g, &a)),
            other => Err(format!("unknown backend {other} (cpu or cuda)")),
        };
        match outcome {
            Ok((t, energy, digest)) => {
                let base = *one.get_or_insert(t);
                println!(
                    "{n} device(s): {:.2} ms per iteration, {:.2}x the first count's speed, energy {energy:.6}, anchors {digest:016x}",
                    t * 1e3,
                    base / t
                );
            }
            Err(e) => {
                eprintln!("sharded_kmeans: {n} device(s): {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}
