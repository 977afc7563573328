//! `--suite vlc`: vlc-anneal against FAISS (`faiss-cpu`) on the same data, side by side:
//! final k-means energy at the same number of anchors and iterations, recall@10 and
//! reconstruction MSE next to `IndexIVFPQ` with the same bytes per vector, and time per
//! iteration. On a GPU backend it also times the speed cases.

use hal::Backend;
use std::path::PathBuf;
use std::time::Instant;
use vlc_anneal::{Config, Matrix, compress, exact_knn, recall_at};

const PEER: &str = include_str!("../peers/vlc_faiss.py");

#[derive(Clone, Debug)]
pub struct VlcArgs {
    pub reps: usize,
    /// Where `glove-100k.npy` and `minilm.npy` are (made by crates/vlc-anneal/data/make_data.py).
    pub data_dir: PathBuf,
    /// Only the speed cases (GPU runs).
    pub speed_only: bool,
}

struct Case {
    name: String,
    data: Matrix,
    m: usize,
}

fn cases(args: &VlcArgs) -> Vec<Result<Case, String>> {
    let mut v = vec![
        Ok(Case {
            name: "synthetic 20K x 64 (200 clusters, 0.5% outliers)".into(),
            data: vlc_anneal::synthetic::gaussian_mixture(20_000, 64, 200, 0.15, 11),
            m: 256,
        }),
        Ok(Case {
            name: "synthetic 100K x 128 (2000 clusters)".into(),
            data: vlc_anneal::synthetic::gaussian_mixture(100_000, 128, 2000, 0.2, 12),
            m: 1024,
        }),
    ];
    for (file, name, m) in [
        ("glove-100k.npy", "GloVe 6B 50-d, first 100K words", 1024),
        ("minilm.npy", "MiniLM-L6 sentence embeddings (384-d)", 256),
    ] {
        let path = args.data_dir.join(file);
        v.push(if path.exists() {
            Matrix::load(&path)
                .map(|data| Case {
                    name: name.into(),
                    data,
                    m,
                })
                .map_err(|e| e.to_string())
        } else {
            Err(format!(
                "{name}: {} is missing; run python3 crates/vlc-anneal/data/make_data.py",
                path.display()
            ))
        });
    }
    v
}

pub fn vlc<B: Backend>(b: &B, args: &VlcArgs) -> Result<(), String> {
    if args.speed_only || b.info().kind != hal::DeviceKind::Cpu {
        speed(b, args)?;
        if args.speed_only {
            return Ok(());
        }
    }
    let iterations = 20;
    let nprobe = 16;
    let queries = 1000;
    println!(
        "vlc: {iterations} iterations, nprobe {nprobe}, {queries} queries; residual bytes per vector: the largest divisor of d up to 8 (FAISS's PQ needs one), the same on both sides"
    );
    let mut failures = Vec::new();
    for case in cases(args) {
        let case = match case {
            Ok(c) => c,
            Err(e) => {
                println!("vlc: not run: {e}");
                continue;
            }
        };
        let Case { name, data, m } = case;
        let bytes = (1..=8).rev().find(|b| data.cols % b == 0).unwrap_or(1);
        let mut cfg = Config::new(m);
        cfg.iterations = iterations;
        cfg.pq_bytes = bytes;
        // Per-iteration times below come from the reports' clocks.
        cfg.report_each_iteration = true;
        let out = compress(b, &data, &cfg, &mut |_| {}).map_err(|e| e.to_string())?;
        let deltas: Vec<f64> = out
            .clustering
            .history
            .windows(2)
            .map(|w| w[1].elapsed - w[0].elapsed)
            .collect();
        let iter_ms = 1e3 * crate::median(deltas);
        let step = (data.rows / queries).max(1);
        let q = Matrix {
            rows: queries.min(data.rows),
            cols: data.cols,
            data: (0..queries.min(data.rows))
                .flat_map(|i| data.row(i * step).to_vec())
                .collect(),
        };
        let truth = exact_knn(&data, &q, 10);
        let found = out
            .index
            .search(&q, 10, nprobe)
            .map_err(|e| e.to_string())?;
        let recall = recall_at(&truth, &found, 10);
        let mse = out.index.reconstruction_mse(&data);
        println!(
            "vlc: {name}, n = {}, d = {}, m = {m}, {bytes} bytes per vector",
            data.rows, data.cols
        );
        println!(
            "  ours : energy {:.6}  {iter_ms:.1} ms/iteration (seeding {:.2} s)  recall@10 {recall:.4}  MSE {mse:.6}  file {} bytes ({:.1}x)",
            out.clustering.energy,
            out.seconds.seeding,
            out.index.file_size(),
            (data.rows * data.cols * 4) as f64 / out.index.file_size() as f64
        );
        match faiss(&data, m, iterations, bytes, nprobe, queries) {
            Ok(f) => {
                println!(
                    "  faiss: energy {:.6}  {:.1} ms/iteration  recall@10 {:.4}  MSE {:.6}  index {} bytes  [{}]",
                    f.energy, f.iter_ms, f.recall, f.mse, f.bytes, f.what
                );
                let e_ratio = out.clustering.energy / f.energy;
                println!(
                    "  energy ours/faiss {e_ratio:.4} (goal <= 1), time per iteration ours/faiss {:.2}",
                    iter_ms / f.iter_ms
                );
                if e_ratio > 1.0 {
                    failures.push(format!("{name}: energy {e_ratio:.4}x FAISS's"));
                }
            }
            Err(e) => println!("  faiss: not run: {e}"),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

struct Faiss {
    energy: f64,
    iter_ms: f64,
    recall: f64,
    mse: f64,
    bytes: String,
    what: String,
}

fn faiss(
    data: &Matrix,
    m: usize,
    iterations: usize,
    bytes: usize,
    nprobe: usize,
    queries: usize,
) -> Result<Faiss, String> {
    let path = std::env::temp_dir().join(format!("vlc-bench-{}.npy", std::process::id()));
    data.save(&path).map_err(|e| e.to_string())?;
    let mut args = vec![path.to_string_lossy().into_owned()];
    args.extend([m, iterations, bytes, nprobe, queries, 1].map(|v| v.to_string()));
    let text = crate::run_peer(PEER, &args, "faiss-cpu");
    let _ = std::fs::remove_file(&path);
    let text = text?;
    let num = |k: &str| {
        crate::json_field(&text, k)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or(format!("unreadable output: {text}"))
    };
    Ok(Faiss {
        energy: num("energy")?,
        iter_ms: num("iter_ms")?,
        recall: num("ivfpq_recall")?,
        mse: num("ivfpq_mse")?,
        bytes: crate::json_field(&text, "ivfpq_bytes").unwrap_or_default(),
        what: crate::json_field(&text, "what").unwrap_or_default(),
    })
}

/// The speed cases: the whole compression of 10K x 128 (256 anchors, 30 iterations),
/// and one iteration at 1M x 128 (m = 4096) and 100K x 768 (m = 1024); medians.
fn speed<B: Backend>(b: &B, args: &VlcArgs) -> Result<(), String> {
    let e = |e: vlc_anneal::Error| e.to_string();
    let small = vlc_anneal::synthetic::gaussian_mixture(10_000, 128, 256, 0.2, 21);
    let mut cfg = Config::new(256);
    cfg.iterations = 30;
    cfg.pq_bytes = 16;
    let mut whole = Vec::new();
    let mut anneal_only = Vec::new();
    let mut parts: [Vec<f64>; 4] = Default::default();
    // Warm-ups as `time_it`'s, each with a seed of its own.
    crate::warm_up(|i| {
        cfg.seed = 1000 + i as u64;
        let t = Instant::now();
        compress(b, &small, &cfg, &mut |_| {}).map_err(e)?;
        Ok::<_, String>(t.elapsed().as_secs_f64())
    })?;
    for rep in 0..args.reps {
        cfg.seed = rep as u64;
        let t = Instant::now();
        let out = compress(b, &small, &cfg, &mut |_| {}).map_err(e)?;
        let s = t.elapsed().as_secs_f64();
        whole.push(s * 1e3);
        anneal_only.push((out.seconds.seeding + out.seconds.annealing) * 1e3);
        let t = out.seconds;
        let split = [
            t.seeding,
            t.annealing,
            t.coding,
            t.total - t.seeding - t.annealing - t.coding,
        ];
        for (v, x) in parts.iter_mut().zip(split) {
            v.push(x * 1e3);
        }
    }
    println!(
        "vlc speed: whole compression 10,000 x 128, 256 anchors, 30 iterations, 16-byte codes: {:.2} ms (seeding + annealing {:.2} ms); goal <= 10 ms on an H200",
        crate::median(whole),
        crate::median(anneal_only)
    );
    let [seeding, annealing, coding, index] = parts.map(crate::median);
    println!(
        "  medians: seeding {seeding:.2} ms, annealing {annealing:.2} ms, residual codes {coding:.2} ms, index and MSE {index:.2} ms"
    );
    crate::print_profile(args.reps);
    iteration_parts(b, &small, 256, args.reps).map_err(|e| e.to_string())?;
    code_parts(b, small.rows, 16, 8, args.reps).map_err(|e| e.to_string())?;
    {
        // Once more, waiting for every iteration: where the annealing's time goes.
        let mut live = cfg.clone();
        live.report_each_iteration = true;
        let out = compress(b, &small, &live, &mut |_| {}).map_err(e)?;
        let h = &out.clustering.history;
        let deltas: Vec<String> = h
            .windows(2)
            .map(|w| format!("{:.2}", (w[1].elapsed - w[0].elapsed) * 1e3))
            .collect();
        println!(
            "vlc speed:   waiting for each iteration: seeding + first assignment {:.2} ms, then per iteration (ms; maintenance after 5, 10, 15, 20): {}",
            h[0].elapsed * 1e3,
            deltas.join(" ")
        );
    }
    for (n, d, m, goal) in [
        (1_000_000usize, 128usize, 4096usize, 10.0),
        (100_000, 768, 1024, 2.0),
    ] {
        let data = vlc_anneal::synthetic::gaussian_mixture(n, d, m, 0.2, 31);
        let mut cfg = Config::new(m);
        cfg.iterations = args.reps + 3;
        cfg.maintain_every = 0;
        cfg.pq_bytes = 0;
        cfg.report_each_iteration = true;
        let out = vlc_anneal::anneal(b, &data, &cfg, &mut |_| {}).map_err(e)?;
        let deltas: Vec<f64> = out
            .history
            .windows(2)
            .skip(2)
            .map(|w| (w[1].elapsed - w[0].elapsed) * 1e3)
            .collect();
        println!(
            "vlc speed: one iteration {n} x {d}, m = {m}: {:.2} ms (median of {}); goal <= {goal} ms on an H200",
            crate::median(deltas.clone()),
            deltas.len()
        );
        iteration_parts(b, &data, m, args.reps).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Where an iteration's time goes: its three heavy primitives timed alone on the fast-mode
/// handle (each waited for), with the data's first `m` rows as anchors.
fn iteration_parts<B: Backend>(
    backend: &B,
    data: &Matrix,
    m: usize,
    reps: usize,
) -> hal::Result<()> {
    use hal::{BackendExt, DType, Layout, View};
    let b = backend.with_precision(hal::Precision::Fast);
    let (n, d) = (data.rows, data.cols);
    let x = b.upload(&data.data)?;
    let anchors = b.upload(&data.data[..m * d])?;
    let (assign, dist, weights) = (
        b.alloc(DType::U32, n)?,
        b.alloc(DType::F32, n)?,
        b.alloc(DType::F32, n)?,
    );
    let (sums, wsums, sse, counts) = (
        b.alloc(DType::F32, m * d)?,
        b.alloc(DType::F32, m)?,
        b.alloc(DType::F32, m)?,
        b.alloc(DType::F32, m)?,
    );
    let (lx, lc, ln) = (
        Layout::contiguous(&[n, d]),
        Layout::contiguous(&[m, d]),
        Layout::contiguous(&[n]),
    );
    b.fill(View::new(&weights, &ln), 1.0)?;
    let nearest = || {
        b.nearest_centroid(
            View::new(&x, &lx),
            View::new(&anchors, &lc),
            View::new(&assign, &ln),
            View::new(&dist, &ln),
        )
    };
    nearest()?;
    let ms = |run: &dyn Fn() -> hal::Result<()>| waited_ms(&b, reps, run);
    let energy_sums = || {
        b.segment_sum(
            View::new(&dist, &Layout::contiguous(&[n, 1])),
            View::new(&assign, &ln),
            None,
            View::new(&sse, &Layout::contiguous(&[m, 1])),
            View::new(&counts, &Layout::contiguous(&[m])),
        )
    };
    let weighted_sums = || {
        b.segment_sum(
            View::new(&x, &lx),
            View::new(&assign, &ln),
            Some(View::new(&weights, &ln)),
            View::new(&sums, &lc),
            View::new(&wsums, &Layout::contiguous(&[m])),
        )
    };
    let t_nearest = ms(&nearest);
    let t_energy = ms(&|| {
        energy_sums()?;
        b.read::<f32>(&sse).map(|_| ())
    });
    let t_weighted = ms(&weighted_sums);
    let t_wait = ms(&|| Ok(()));
    let batch = |run: &dyn Fn() -> hal::Result<()>| in_loop_ms(&b, reps, run);
    let l1 = Layout::contiguous(&[1]);
    let in_loop = [
        batch(&nearest),
        batch(&energy_sums),
        batch(&weighted_sums),
        batch(&|| b.copy(View::new(&sse, &l1), View::new(&counts, &l1))),
    ];
    println!(
        "vlc speed:   in a loop (20 back to back, one wait), each: assignment {:.3} ms, energy sums {:.3} ms, weighted member sums {:.3} ms, a one-element copy {:.3} ms",
        in_loop[0], in_loop[1], in_loop[2], in_loop[3]
    );
    println!(
        "vlc speed:   of which, each alone and waited for: assignment {t_nearest:.3} ms, energy sums + read-back {t_energy:.3} ms, weighted member sums {t_weighted:.3} ms (a wait alone {t_wait:.3} ms)"
    );
    Ok(())
}

/// Where the residual codes' time goes: one training iteration's two heavy primitives (the
/// batched search of every subspace's rows against its own codebook, and the sums per
/// (subspace, codeword)) on `n` vectors of `bytes` subspaces of `width` values, 256 codewords,
/// back to back in a loop; and the whole training of 12 iterations, waited for.
fn code_parts<B: Backend>(
    backend: &B,
    n: usize,
    bytes: usize,
    width: usize,
    reps: usize,
) -> hal::Result<()> {
    use hal::{BackendExt, DType, Layout, View};
    let b = backend.with_precision(hal::Precision::Fast);
    let k = 256;
    let rows: Vec<f32> = (0..n * bytes * width)
        .map(|i| {
            ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f32 / (1u64 << 24) as f32
                - 0.5
        })
        .collect();
    let x = b.upload(&rows)?;
    let books = b.upload(&rows[..bytes * k * width])?;
    let codes = b.alloc(DType::U32, n * bytes)?;
    let dist = b.alloc(DType::F32, n * bytes)?;
    let sums = b.alloc(DType::F32, bytes * k * width)?;
    let counts = b.alloc(DType::F32, bytes * k)?;
    let by_subspace = Layout {
        shape: vec![bytes, n, width],
        strides: vec![width as isize, (bytes * width) as isize, 1],
        offset: 0,
    };
    let per_subspace = Layout::contiguous(&[n, bytes]).transpose(0, 1)?;
    let search = || {
        b.nearest_centroid(
            View::new(&x, &by_subspace),
            View::new(&books, &Layout::contiguous(&[bytes, k, width])),
            View::new(&codes, &per_subspace),
            View::new(&dist, &per_subspace),
        )
    };
    // Segment ids like the training's: subspace * k + code.
    let seg: Vec<u32> = (0..n * bytes)
        .map(|t| ((t % bytes) * k + (t * 7 + t / bytes) % k) as u32)
        .collect();
    let seg = b.upload(&seg)?;
    let member_sums = || {
        b.segment_sum(
            View::new(&x, &Layout::contiguous(&[n * bytes, width])),
            View::new(&seg, &Layout::contiguous(&[n * bytes])),
            None,
            View::new(&sums, &Layout::contiguous(&[bytes * k, width])),
            View::new(&counts, &Layout::contiguous(&[bytes * k])),
        )
    };
    let ms = |run: &dyn Fn() -> hal::Result<()>| waited_ms(&b, reps, run);
    let batch = |run: &dyn Fn() -> hal::Result<()>| in_loop_ms(&b, reps, run);
    let (t_search, t_sums) = (batch(&search), batch(&member_sums));
    let whole = ms(&|| {
        vlc_anneal::pq::train_and_encode(&b, &x, (n, bytes * width), bytes, 12, 7, &mut |_| {})
            .expect("training");
        Ok(())
    });
    println!(
        "vlc speed:   residual codes ({n} x {bytes} subspaces of {width}, {k} codewords): in a loop, each: search {t_search:.3} ms, member sums {t_sums:.3} ms; training of 12 iterations and the codes, waited for: {whole:.2} ms"
    );
    Ok(())
}

/// Median milliseconds of `run` and a wait for the device (at least five runs).
fn waited_ms<B: Backend>(b: &B, reps: usize, run: &dyn Fn() -> hal::Result<()>) -> f64 {
    crate::time_it(
        reps.max(5),
        |_| {},
        || {
            run().expect("primitive");
            b.synchronize().expect("sync");
        },
    ) * 1e3
}

/// What one call of `run` costs inside a loop: 20 back to back and one wait, per call.
fn in_loop_ms<B: Backend>(b: &B, reps: usize, run: &dyn Fn() -> hal::Result<()>) -> f64 {
    waited_ms(b, reps, &|| {
        for _ in 0..20 {
            run()?;
        }
        Ok(())
    }) / 20.0
}
