//! `--suite vlc-search`: vlc on the CPU against FAISS (`faiss-cpu`) on the same vectors and
//! threads, in the same run: the k-means iteration at 256 and 1,024 anchors against
//! `faiss.Kmeans` (same iterations over the whole set; seeding included in a second figure),
//! and batched search of held-out queries at nprobe 1 to 64 against `IndexIVFPQ` and
//! `IndexIVFPQFastScan` built with the same lists and bytes per vector.
//!
//! Each data set is a `.npy` of float vectors (`--vlc-search-data`, comma-separated); its
//! last `--vlc-queries` rows are the queries, not indexed. Without files, the GloVe and MiniLM
//! sets that `crates/vlc-anneal/data/make_data.py` writes into `data/vlc/` where they exist,
//! else a synthetic mixture. The threads are the process's (`taskset -c 0,1` pins both sides
//! to two cores); FAISS is told the same count.

use std::path::{Path, PathBuf};
use std::time::Instant;
use vlc_anneal::{Config, Index, Matrix, anneal, compress, exact_knn, recall_at};

const PEER: &str = include_str!("../peers/vlc_search_faiss.py");

#[derive(Clone, Debug)]
pub struct VlcSearchArgs {
    pub reps: usize,
    /// `.npy` files; empty: the defaults (see the module docs).
    pub data: Vec<PathBuf>,
    /// Held-out query rows at the end of each file.
    pub queries: usize,
    /// Inverted lists (anchors) of the indexes.
    pub lists: usize,
    /// Bytes of residual code per vector.
    pub bytes: usize,
    pub nprobe: Vec<usize>,
    /// Anchor counts of the k-means comparison (0s are skipped).
    pub kmeans: Vec<usize>,
    /// Iterations of every k-means, ours and FAISS's.
    pub iterations: usize,
}

/// One data set: the indexed rows and the held-out queries.
struct Set {
    name: String,
    base: Matrix,
    queries: Matrix,
}

fn sets(args: &VlcSearchArgs) -> Vec<Result<Set, String>> {
    let defaults = ["data/vlc/glove-400k.npy", "data/vlc/minilm-1m.npy"];
    let files: Vec<PathBuf> = match args.data.is_empty() {
        false => args.data.clone(),
        true => defaults
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.exists())
            .collect(),
    };
    if files.is_empty() {
        println!(
            "vlc-search: no data files (give --vlc-search-data, or run crates/vlc-anneal/data/make_data.py): a synthetic mixture instead"
        );
        let all =
            vlc_anneal::synthetic::gaussian_mixture(100_000 + args.queries, 128, 2_000, 0.2, 31);
        return vec![split(
            "synthetic 100K x 128 (2,000 clusters)".into(),
            all,
            args,
        )];
    }
    files
        .iter()
        .map(|path| {
            let all = Matrix::load(path).map_err(|e| e.to_string())?;
            split(path.display().to_string(), all, args)
        })
        .collect()
}

/// The last `args.queries` rows as queries, the rest as the indexed set.
fn split(name: String, all: Matrix, args: &VlcSearchArgs) -> Result<Set, String> {
    let q = args.queries;
    if all.rows <= q || q == 0 {
        return Err(format!(
            "{name}: {} rows cannot hold {q} held-out queries and an index",
            all.rows
        ));
    }
    let n = all.rows - q;
    let d = all.cols;
    let queries = Matrix::new(q, d, all.data[n * d..].to_vec()).map_err(|e| e.to_string())?;
    let mut data = all.data;
    data.truncate(n * d);
    let base = Matrix::new(n, d, data).map_err(|e| e.to_string())?;
    Ok(Set {
        name,
        base,
        queries,
    })
}

pub fn vlc_search(args: &VlcSearchArgs) -> Result<(), String> {
    let cpu = backend_cpu::CpuBackend::new();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "vlc-search: {threads} threads on each side; {} lists, up to {} bytes per vector, k-means {} iterations, medians of {} searches",
        args.lists, args.bytes, args.iterations, args.reps
    );
    let mut failures = Vec::new();
    for set in sets(args) {
        let set = match set {
            Ok(s) => s,
            Err(e) => {
                println!("vlc-search: not run: {e}");
                failures.push(e);
                continue;
            }
        };
        if let Err(e) = one_set(&cpu, &set, args, threads) {
            println!("vlc-search: {}: {e}", set.name);
            failures.push(e);
        }
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("; ")),
    }
}

fn one_set(
    cpu: &backend_cpu::CpuBackend,
    set: &Set,
    args: &VlcSearchArgs,
    threads: usize,
) -> Result<(), String> {
    let (base, queries) = (&set.base, &set.queries);
    // FAISS's product quantiser needs subspaces of one width: the largest divisor of d within
    // the byte budget, on both sides.
    let bytes = (1..=args.bytes.min(base.cols))
        .rev()
        .find(|b| base.cols % b == 0)
        .unwrap_or(1);
    println!(
        "vlc-search: {}: {} x {} indexed, {} queries, {bytes} bytes per vector",
        set.name, base.rows, base.cols, queries.rows
    );
    let t = Instant::now();
    let truth = exact_knn(base, queries, 10);
    println!(
        "  exact top-10 of every query: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let kmeans: Vec<usize> = args.kmeans.iter().copied().filter(|&m| m > 0).collect();
    // The peer reads the same rows, queries and truth from files.
    let dir = std::env::temp_dir().join(format!("vlc-search-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let written = write_inputs(&dir, base, queries, &truth);
    let peer = written.and_then(|paths| {
        let mut a: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        a.extend([
            args.lists.to_string(),
            bytes.to_string(),
            join(&args.nprobe),
            threads.to_string(),
            args.reps.to_string(),
            args.iterations.to_string(),
            join(&kmeans),
        ]);
        crate::run_peer(PEER, &a, "faiss-cpu")
    });
    let _ = std::fs::remove_dir_all(&dir);
    let peer = peer.unwrap_or_else(|e| {
        println!("  faiss: not run: {e}");
        String::new()
    });
    let lines: Vec<&str> = peer.lines().collect();
    let field =
        |line: &str, k: &str| crate::json_field(line, k).and_then(|v| v.parse::<f64>().ok());
    let peer_row = |kind: &str, key: &str, value: usize| {
        lines.iter().copied().find(|l| {
            crate::json_field(l, "kind").as_deref() == Some(kind)
                && field(l, key) == Some(value as f64)
        })
    };
    if let Some(what) = lines.first().and_then(|l| crate::json_field(l, "what")) {
        println!("  peer: {what}");
    }

    for &m in &kmeans {
        let mut cfg = Config::new(m);
        cfg.iterations = args.iterations;
        cfg.report_each_iteration = true;
        let t = Instant::now();
        let c = anneal(cpu, base, &cfg, &mut |_| {}).map_err(|e| e.to_string())?;
        let total = t.elapsed().as_secs_f64();
        let deltas: Vec<f64> = c
            .history
            .windows(2)
            .map(|w| w[1].elapsed - w[0].elapsed)
            .collect();
        let iter_ms = 1e3 * crate::median(deltas);
        print!(
            "  k-means, {m} anchors: ours {iter_ms:.1} ms/iteration, {total:.2} s with seeding ({:.2} s), energy {:.6}",
            c.seeding_seconds, c.energy
        );
        match peer_row("kmeans", "m", m) {
            Some(l) => {
                let (f_ms, f_s, f_e) = (
                    field(l, "iter_ms").unwrap_or(f64::NAN),
                    field(l, "train_s").unwrap_or(f64::NAN),
                    field(l, "energy").unwrap_or(f64::NAN),
                );
                println!(
                    "; FAISS {f_ms:.1} ms/iteration, {f_s:.2} s, energy {f_e:.6}: ours/FAISS {:.2}x per iteration (goal <= 0.8), {:.2}x whole, energy {:.4}",
                    iter_ms / f_ms,
                    total / f_s,
                    c.energy / f_e
                );
            }
            None => println!(),
        }
    }

    let mut cfg = Config::new(args.lists);
    cfg.iterations = args.iterations;
    cfg.pq_bytes = bytes;
    let t = Instant::now();
    let index = compress(cpu, base, &cfg, &mut |_| {})
        .map_err(|e| e.to_string())?
        .index;
    println!(
        "  ours: compressed in {:.1} s, {} bytes ({:.1} bytes per vector){}",
        t.elapsed().as_secs_f64(),
        index.file_size(),
        index.file_size() as f64 / base.rows as f64,
        lines
            .iter()
            .find_map(|l| crate::json_field(l, "build"))
            .map(|b| format!("; FAISS {b}"))
            .unwrap_or_default()
    );
    println!(
        "  {:>6} | {:>10} {:>7} | {:>10} {:>7} | {:>12} {:>7} | ours/IVFPQ",
        "nprobe", "ours q/s", "recall", "IVFPQ q/s", "recall", "FastScan q/s", "recall"
    );
    let mut below = Vec::new();
    for &nprobe in &args.nprobe {
        let (qps, recall) = ours(cpu, &index, queries, &truth, nprobe, args.reps)?;
        let pq = peer_row("ivfpq", "nprobe", nprobe);
        let fs = peer_row("fastscan", "nprobe", nprobe);
        let num = |l: Option<&str>, k: &str| l.and_then(|l| field(l, k)).unwrap_or(f64::NAN);
        let (pq_qps, pq_recall) = (num(pq, "qps"), num(pq, "recall"));
        let ratio = qps / pq_qps;
        println!(
            "  {nprobe:>6} | {qps:>10.0} {recall:>7.4} | {pq_qps:>10.0} {pq_recall:>7.4} | {:>12.0} {:>7.4} | {ratio:.2}x",
            num(fs, "qps"),
            num(fs, "recall")
        );
        if ratio < 1.0 || recall + 0.005 < pq_recall {
            below.push(nprobe.to_string());
        }
    }
    if !below.is_empty() && !lines.is_empty() {
        println!(
            "  below IVFPQ's speed or recall at nprobe {} (the goal: at least its queries/s at equal recall)",
            below.join(", ")
        );
    }
    Ok(())
}

/// Our batched search of every query at `nprobe`: queries/s (median of `reps` after a warm-up)
/// and recall@10.
fn ours(
    cpu: &backend_cpu::CpuBackend,
    index: &Index,
    queries: &Matrix,
    truth: &[Vec<u32>],
    nprobe: usize,
    reps: usize,
) -> Result<(f64, f64), String> {
    let search = || index.search_batch(cpu, queries, 10, nprobe);
    let found = search().map_err(|e| e.to_string())?;
    let mut times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        search().map_err(|e| e.to_string())?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok((
        queries.rows as f64 / crate::median(times),
        recall_at(truth, &found, 10),
    ))
}

/// Writes the indexed rows, the queries (`.npy`, f32) and the true neighbours (`.npy`, i64)
/// into `dir`; returns their paths.
fn write_inputs(
    dir: &Path,
    base: &Matrix,
    queries: &Matrix,
    truth: &[Vec<u32>],
) -> Result<[PathBuf; 3], String> {
    let paths = [
        dir.join("base.npy"),
        dir.join("queries.npy"),
        dir.join("truth.npy"),
    ];
    base.save(&paths[0]).map_err(|e| e.to_string())?;
    queries.save(&paths[1]).map_err(|e| e.to_string())?;
    let k = truth.first().map_or(0, Vec::len);
    let ids: Vec<i64> = truth.iter().flatten().map(|&i| i as i64).collect();
    let bytes = vlc_anneal::vectors::npy_array_bytes(
        "<i8",
        truth.len(),
        k,
        &ids.iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    hal::durable::write_bytes_atomic(&paths[2], &bytes).map_err(|e| e.to_string())?;
    Ok(paths)
}

fn join(v: &[usize]) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}
