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
use vlc_anneal::{Config, Matrix, anneal, compress, exact_knn, recall_at};

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
    // The peer reads the same rows, queries and truth from files, and stays up to answer.
    let dir = std::env::temp_dir().join(format!("vlc-search-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut peer = write_inputs(&dir, base, queries, &truth).and_then(|paths| {
        let mut a: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        a.extend([args.lists, bytes, threads, args.iterations].map(|v| v.to_string()));
        Peer::start(&a)
    });
    if let Err(e) = &peer {
        println!("  faiss: not run: {e}");
    }
    let result = compare(cpu, set, args, bytes, &truth, peer.as_mut().ok());
    drop(peer);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The comparisons of one set, alternating our timed runs with the peer's where it runs.
fn compare(
    cpu: &backend_cpu::CpuBackend,
    set: &Set,
    args: &VlcSearchArgs,
    bytes: usize,
    truth: &[Vec<u32>],
    mut peer: Option<&mut Peer>,
) -> Result<(), String> {
    let (base, queries) = (&set.base, &set.queries);
    for &m in args.kmeans.iter().filter(|&&m| m > 0) {
        // Two runs each, alternating; the iterations of both runs pooled.
        let (mut ours_ms, mut theirs_ms, mut ours_total, mut theirs_total) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut energy, mut theirs_energy) = (f64::NAN, f64::NAN);
        for _ in 0..2 {
            let mut cfg = Config::new(m);
            cfg.iterations = args.iterations;
            cfg.report_each_iteration = true;
            let t = Instant::now();
            let c = anneal(cpu, base, &cfg, &mut |_| {}).map_err(|e| e.to_string())?;
            ours_total.push(t.elapsed().as_secs_f64());
            ours_ms.extend(
                c.history
                    .windows(2)
                    .map(|w| 1e3 * (w[1].elapsed - w[0].elapsed)),
            );
            energy = c.energy;
            if let Some(p) = peer.as_deref_mut() {
                let line = p.ask(&format!("kmeans {m}"))?;
                theirs_ms.push(num(&line, "iter_ms"));
                theirs_total.push(num(&line, "train_s"));
                theirs_energy = num(&line, "energy");
            }
        }
        let (ms, total) = (crate::median(ours_ms), crate::median(ours_total));
        print!(
            "  k-means, {m} anchors, {} iterations: ours {ms:.1} ms/iteration, {total:.2} s with seeding, energy {energy:.6}",
            args.iterations
        );
        if theirs_ms.is_empty() {
            println!();
            continue;
        }
        let (f_ms, f_s) = (crate::median(theirs_ms), crate::median(theirs_total));
        println!(
            "; FAISS {f_ms:.1} ms/iteration, {f_s:.2} s, energy {theirs_energy:.6}: ours/FAISS {:.2}x per iteration (goal <= 0.8), {:.2}x with seeding, energy {:.4}",
            ms / f_ms,
            total / f_s,
            energy / theirs_energy
        );
    }

    let mut cfg = Config::new(args.lists);
    cfg.iterations = args.iterations;
    cfg.pq_bytes = bytes;
    let t = Instant::now();
    let index = compress(cpu, base, &cfg, &mut |_| {})
        .map_err(|e| e.to_string())?
        .index;
    let built = t.elapsed().as_secs_f64();
    let theirs = match peer.as_deref_mut() {
        Some(p) => format!("; FAISS {}", field(&p.ask("build")?, "build")),
        None => String::new(),
    };
    println!(
        "  ours: compressed in {built:.1} s, {} bytes ({:.1} bytes per vector){theirs}",
        index.file_size(),
        index.file_size() as f64 / base.rows as f64,
    );
    println!(
        "  {:>6} | {:>10} {:>7} | {:>10} {:>7} | {:>12} {:>7} | ours/IVFPQ",
        "nprobe", "ours q/s", "recall", "IVFPQ q/s", "recall", "FastScan q/s", "recall"
    );
    let mut below = Vec::new();
    for &nprobe in &args.nprobe {
        let search = || index.search_batch(cpu, queries, 10, nprobe);
        let recall = recall_at(truth, &search().map_err(|e| e.to_string())?, 10);
        // Per rep: ours, then each of the peer's indexes, so that a slow spell of the machine
        // falls on both sides.
        let kinds = ["ivfpq", "fastscan"];
        let mut theirs: [(Vec<f64>, f64); 2] = Default::default();
        if let Some(p) = peer.as_deref_mut() {
            for kind in kinds {
                p.ask(&format!("search {kind} {nprobe}"))?;
            }
        }
        let mut ours = Vec::new();
        for _ in 0..args.reps {
            let t = Instant::now();
            search().map_err(|e| e.to_string())?;
            ours.push(t.elapsed().as_secs_f64());
            if let Some(p) = peer.as_deref_mut() {
                for (kind, (times, recall)) in kinds.iter().zip(theirs.iter_mut()) {
                    let line = p.ask(&format!("search {kind} {nprobe}"))?;
                    if field(&line, "kind") == *kind {
                        times.push(num(&line, "seconds"));
                        *recall = num(&line, "recall");
                    }
                }
            }
        }
        let n = queries.rows as f64;
        let qps = n / crate::median(ours);
        let [pq, fs] = theirs.map(|(times, recall)| match times.is_empty() {
            true => (f64::NAN, f64::NAN),
            false => (n / crate::median(times), recall),
        });
        let ratio = qps / pq.0;
        println!(
            "  {nprobe:>6} | {qps:>10.0} {recall:>7.4} | {:>10.0} {:>7.4} | {:>12.0} {:>7.4} | {ratio:.2}x",
            pq.0, pq.1, fs.0, fs.1
        );
        if ratio < 1.0 || recall + 0.005 < pq.1 {
            below.push(nprobe.to_string());
        }
    }
    if !below.is_empty() {
        println!(
            "  below IVFPQ's speed or recall at nprobe {} (the goal: at least its queries/s at equal recall)",
            below.join(", ")
        );
    }
    Ok(())
}

/// The FAISS peer, running: one request a line, one JSON line back.
struct Peer {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Peer {
    fn start(args: &[String]) -> Result<Peer, String> {
        use std::process::{Command, Stdio};
        let mut child = Command::new("python3")
            .args(["-c", PEER])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Its warnings and errors go where ours do (a pipe nobody reads could fill).
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("python3 could not start: {e}"))?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        let mut peer = Peer {
            stdin: stdin.ok_or("no stdin")?,
            stdout: std::io::BufReader::new(stdout.ok_or("no stdout")?),
            child,
        };
        let about = peer.line()?;
        println!("  peer: {}", field(&about, "what"));
        Ok(peer)
    }

    /// The next line the peer prints.
    fn line(&mut self) -> Result<String, String> {
        use std::io::BufRead;
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err(
                "the FAISS peer stopped (its error is above; `pip install faiss-cpu` where the module is missing)".into(),
            ),
            Ok(_) => Ok(line),
            Err(e) => Err(format!("the FAISS peer: {e}")),
        }
    }

    fn ask(&mut self, request: &str) -> Result<String, String> {
        use std::io::Write;
        writeln!(self.stdin, "{request}").map_err(|e| format!("the FAISS peer: {e}"))?;
        self.line()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A field of a peer's JSON line, as text ("" where absent).
fn field(line: &str, key: &str) -> String {
    crate::json_field(line, key).unwrap_or_default()
}

/// A numeric field of a peer's JSON line (NaN where absent).
fn num(line: &str, key: &str) -> f64 {
    field(line, key).parse().unwrap_or(f64::NAN)
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
