//! `vlc`: compress embedding vectors into a searchable index and use it.
//!
//! ```text
//! vlc compress IN -o OUT --anchors M --bytes B [--backend auto] [--iterations N] [--exact] [--refine]
//! vlc info INDEX
//! vlc search INDEX QUERIES [-k 10] [--nprobe 16] [--rerank R] [--ids IDS.npy] [--distances D.npy]
//! vlc eval INDEX DATA [--queries 1000 | --query-file Q [--truth GT.ivecs]] [--nprobe 16]
//! vlc add INDEX VECTORS -o OUT [--ids IDS.npy]
//! vlc remove INDEX --ids IDS.npy -o OUT
//! vlc decompress INDEX -o OUT.npy
//! vlc demo [--backend auto]
//! ```
//!
//! Vectors are read from `.npy` (float16, float32 or float64, either byte order, C or Fortran
//! order; converted to float32), `.fvecs` or `.bvecs`; ground truth from `.ivecs` or an
//! integer `.npy`. `--backend auto` takes CUDA if
//! present, else wgpu on a hardware GPU, else the CPU.

mod eval;
mod hits;

use clap::{Args, Parser, Subcommand};
use eval::{Queries, evaluate};
use hal::Backend;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use vlc_anneal::{Config, Index, Matrix, Mode, compress};

#[derive(Parser)]
#[command(
    name = "vlc",
    version,
    about = "Annealed k-means compression of embedding vectors, with search"
)]
struct Cli {
    /// CPU threads for the work that runs on the host (search, coding, the CPU backend);
    /// 0 takes every core.
    #[arg(long, global = true, default_value_t = 0)]
    threads: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compresses vectors (.npy or .fvecs) into an index file.
    Compress(CompressArgs),
    /// Prints an index's header.
    Info { index: PathBuf },
    /// The k nearest indexed vectors of each query (distances from the codes by the index's
    /// metric), printed as `query<TAB>id:distance ...`, or written as .npy files.
    Search {
        /// An index written by `vlc compress`.
        index: PathBuf,
        /// Query vectors (.npy or .fvecs) of the index's dimension.
        queries: PathBuf,
        /// Neighbours per query (at most the number indexed; fewer where the probed lists
        /// hold fewer, which is reported).
        #[arg(short, default_value_t = 10)]
        k: usize,
        /// Anchors (lists) probed per query: more finds more true neighbours, slower.
        #[arg(long, default_value_t = 16)]
        nprobe: usize,
        /// Re-ranks this many candidates (at least k) per query by their exact distances to
        /// the vectors the index keeps (`vlc compress --refine`); 0: the codes' ranking.
        #[arg(long, default_value_t = 0)]
        rerank: usize,
        /// Writes the ids as a `queries x k` int64 .npy (or int32 .ivecs) here (-1 where
        /// fewer were found) instead of printing.
        #[arg(long)]
        ids: Option<PathBuf>,
        /// Writes the distances (by the index's metric) as a `queries x k` float32 .npy (or
        /// .fvecs) here (infinity where fewer were found; minus infinity for inner product).
        #[arg(long)]
        distances: Option<PathBuf>,
    },
    /// Energy, reconstruction MSE, recall@10 against exact search, compression ratio, time.
    Eval {
        /// An index written by `vlc compress`.
        index: PathBuf,
        /// The vectors the index was built from.
        data: PathBuf,
        /// Queries: this many of the data's vectors, spread evenly (unless --query-file).
        #[arg(long, default_value_t = 1000)]
        queries: usize,
        /// Queries of their own (.npy, .fvecs or .bvecs) instead of the data's vectors.
        #[arg(long)]
        query_file: Option<PathBuf>,
        /// The queries' true nearest neighbours (.ivecs or an integer .npy, at least 10 a
        /// query, nearest first) instead of an exact search here; needs --query-file.
        #[arg(long, requires = "query_file")]
        truth: Option<PathBuf>,
        /// Anchors (lists) probed per query.
        #[arg(long, default_value_t = 16)]
        nprobe: usize,
    },
    /// Adds vectors to an index without retraining it (assigned to its anchors, coded with
    /// its codebooks), writing the grown index.
    Add {
        /// An index written by `vlc compress`.
        index: PathBuf,
        /// The vectors to add (.npy, .fvecs or .bvecs) of the index's dimension.
        vectors: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Their ids (a one-dimensional int64 .npy); without it, the ids after the index's.
        #[arg(long)]
        ids: Option<PathBuf>,
        /// cpu, wgpu, cuda, or auto.
        #[arg(long, default_value = "auto")]
        backend: String,
    },
    /// Removes the vectors with the given ids, writing the smaller index.
    Remove {
        /// An index written by `vlc compress`.
        index: PathBuf,
        /// The ids to remove (a one-dimensional int64 .npy; ids absent from the index are
        /// ignored and counted).
        #[arg(long)]
        ids: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Writes every vector's reconstruction as .npy or .fvecs (unit vectors for a cosine
    /// index).
    Decompress {
        /// An index written by `vlc compress`.
        index: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// A short run on synthetic data (the README's main command runs it): compress, search,
    /// report the headline figures.
    Demo {
        #[arg(long, default_value = "auto")]
        backend: String,
        #[arg(long, default_value_t = 20_000)]
        n: usize,
        #[arg(long)]
        quiet: bool,
    },
}

/// `vlc compress`'s arguments.
#[derive(Args)]
struct CompressArgs {
    input: PathBuf,
    #[arg(short, long)]
    output: PathBuf,
    /// Number of anchors (clusters).
    #[arg(long, default_value_t = 256)]
    anchors: usize,
    /// Bytes of residual code per vector.
    #[arg(long, default_value_t = 8)]
    bytes: usize,
    /// cpu, wgpu, cuda, or auto (CUDA if present, else wgpu on a hardware GPU, else the CPU).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Annealing iterations (k-means steps at a falling temperature).
    #[arg(long, default_value_t = 25)]
    iterations: usize,
    /// Seed of the k-means++ seeding and every random choice after it: the same seed, data
    /// and options give the same index.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Identical results on every backend (slower).
    #[arg(long)]
    exact: bool,
    /// How the index compares vectors: l2 (squared Euclidean), cosine (the vectors are
    /// normalised first; search reports 1 - cos) or ip (inner product, largest first).
    #[arg(long, default_value = "l2")]
    metric: vlc_anneal::Metric,
    /// The vectors' ids (a one-dimensional int64 .npy, one a vector); without it, their
    /// positions.
    #[arg(long)]
    ids: Option<PathBuf>,
    /// Stop when the energy changes by less than this fraction (0: run every iteration).
    #[arg(long, default_value_t = 0.0)]
    tolerance: f64,
    /// Keep the vectors too (float16, 2 bytes per dimension) so that `vlc search --rerank`
    /// can order candidates by exact distance.
    #[arg(long)]
    refine: bool,
    /// Split the vectors over this many devices (cuda: GPUs 0..N over NCCL; cpu: threads):
    /// each anneals and codes its part, the sums added over all before every update (with
    /// --exact, in one device's order: its anchors bit for bit). No maintenance rounds; the
    /// codebooks are trained on the first device's part.
    #[arg(long, default_value_t = 1)]
    devices: usize,
    /// Print no progress.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    let cli = Cli::parse();
    if cli.threads > 0 {
        vlc_anneal::index::set_threads(cli.threads);
    }
    // Rayon's pool with this thread as its first (the CPU backend's passes start here).
    if let Err(e) = backends::backend_cpu::join_rayon_pool(cli.threads) {
        eprintln!("vlc: --threads {}: {e}", cli.threads);
        return ExitCode::FAILURE;
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vlc: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res<T> = Result<T, String>;

fn err(e: vlc_anneal::Error) -> String {
    e.to_string()
}

fn run(command: Command) -> Res<()> {
    match command {
        Command::Compress(args) => compress_command(args),
        Command::Info { index } => info(&index),
        Command::Search {
            index,
            queries,
            k,
            nprobe,
            rerank,
            ids,
            distances,
        } => {
            for (out, texmex) in ids
                .iter()
                .map(|p| (p, "ivecs"))
                .chain(distances.iter().map(|p| (p, "fvecs")))
            {
                writable_output(out, &[&index, &queries])?;
                let ext = out.extension().and_then(|e| e.to_str());
                if ext != Some("npy") && ext != Some(texmex) {
                    return Err(format!(
                        "{}: write {} as .npy or .{texmex}",
                        out.display(),
                        if texmex == "ivecs" {
                            "ids"
                        } else {
                            "distances"
                        }
                    ));
                }
            }
            let index = Index::open(&index).map_err(err)?;
            if rerank > 0 && !index.has_refine() {
                return Err(
                    "--rerank needs an index that keeps its vectors (vlc compress --refine)".into(),
                );
            }
            let queries = Matrix::load(&queries).map_err(err)?;
            if k > index.header.n {
                eprintln!(
                    "vlc: -k {k} exceeds the {} indexed vectors; returning at most {}",
                    index.header.n, index.header.n
                );
            }
            // Positions to the index's ids.
            // The coarse step and the query tables as products on the CPU's GEMM.
            let cpu = backends::backend_cpu::CpuBackend::new();
            let found = match rerank {
                0 => index.search_batch(&cpu, &queries, k, nprobe),
                r => index.search_reranked(&cpu, &queries, k, nprobe, r),
            };
            let hits: Vec<Vec<(u64, f32)>> = found
                .map_err(err)?
                .into_iter()
                .map(|row| {
                    row.into_iter()
                        .map(|(i, d)| (index.id(i as usize), d))
                        .collect()
                })
                .collect();
            let k = k.min(index.header.n);
            let short: Vec<usize> = hits.iter().map(Vec::len).filter(|&l| l < k).collect();
            if let Some(fewest) = short.iter().min() {
                eprintln!(
                    "vlc: {} of {} queries found fewer than {k} vectors in their {nprobe} probed \
                     lists (the fewest {fewest}); raise --nprobe for more",
                    short.len(),
                    hits.len()
                );
            }
            if ids.is_none() && distances.is_none() {
                for (q, row) in hits.iter().enumerate() {
                    let line: Vec<String> =
                        row.iter().map(|(i, d)| format!("{i}:{d:.5}")).collect();
                    println!("{q}\t{}", line.join(" "));
                }
            }
            hits::write_hits(
                &hits,
                k,
                index.header.metric.unfound(),
                ids.as_deref(),
                distances.as_deref(),
            )
        }
        Command::Eval {
            index,
            data,
            queries,
            query_file,
            truth,
            nprobe,
        } => {
            let index = Index::open(&index).map_err(err)?;
            let data = Matrix::load(&data).map_err(err)?;
            let queries = match query_file {
                Some(path) => Queries::Given {
                    queries: Matrix::load(&path).map_err(err)?,
                    truth: match truth {
                        Some(t) => Some(vlc_anneal::vectors::load_neighbors(&t).map_err(err)?),
                        None => None,
                    },
                },
                None => Queries::Spread(queries),
            };
            let report = evaluate(&index, &data, queries, nprobe)?;
            println!("{}", report.text);
            Ok(())
        }
        Command::Add {
            index: path,
            vectors,
            output,
            ids,
            backend,
        } => {
            writable_output(&output, &[&path, &vectors])?;
            let index = Index::open(&path).map_err(err)?;
            let x = Matrix::load(&vectors).map_err(err)?;
            let ids = match ids {
                Some(p) => Some(vlc_anneal::vectors::load_ids(&p).map_err(err)?),
                None => None,
            };
            let name = backends::resolve(&backend);
            let grown = backends::on_backend!(name, add_with(&index, &x, ids.as_deref()))?;
            grown.save(&output).map_err(err)?;
            println!(
                "wrote {}: {} vectors ({} added)",
                output.display(),
                grown.header.n,
                x.rows
            );
            Ok(())
        }
        Command::Remove {
            index: path,
            ids,
            output,
        } => {
            writable_output(&output, &[&path, &ids])?;
            let index = Index::open(&path).map_err(err)?;
            let ids = vlc_anneal::vectors::load_ids(&ids).map_err(err)?;
            let (smaller, removed) = index.remove(&ids).map_err(err)?;
            smaller.save(&output).map_err(err)?;
            println!(
                "wrote {}: {} vectors ({removed} removed; {} of the ids were not in the index)",
                output.display(),
                smaller.header.n,
                ids.len() - removed.min(ids.len())
            );
            Ok(())
        }
        Command::Decompress {
            index: path,
            output,
        } => {
            writable_output(&output, &[&path])?;
            let index = Index::open(&path).map_err(err)?;
            index
                .decompress()
                .map_err(err)?
                .save(&output)
                .map_err(err)?;
            println!("wrote {} vectors to {}", index.header.n, output.display());
            Ok(())
        }
        Command::Demo { backend, n, quiet } => demo(&backend, n, quiet),
    }
}

/// `vlc compress`: loads the vectors, compresses them on the chosen backend, writes the index.
fn compress_command(args: CompressArgs) -> Res<()> {
    let CompressArgs {
        input,
        output,
        anchors,
        bytes,
        backend,
        iterations,
        seed,
        exact,
        metric,
        ids,
        tolerance,
        refine,
        devices,
        quiet,
    } = args;
    if devices == 0 {
        return Err("--devices must be at least 1".into());
    }
    writable_output(&output, &[&input])?;
    let data = Matrix::load(&input).map_err(err)?;
    let ids = match ids {
        Some(path) => {
            let ids = vlc_anneal::vectors::load_ids(&path).map_err(err)?;
            if ids.len() != data.rows {
                return Err(format!(
                    "{}: {} ids for {} vectors",
                    path.display(),
                    ids.len(),
                    data.rows
                ));
            }
            Some(ids)
        }
        None => None,
    };
    let mut cfg = Config::new(anchors);
    cfg.pq_bytes = bytes;
    cfg.iterations = iterations;
    cfg.seed = seed;
    cfg.tolerance = tolerance;
    cfg.mode = if exact { Mode::Exact } else { Mode::Fast };
    cfg.metric = metric;
    // The progress bar shows each iteration as it finishes.
    cfg.report_each_iteration = !quiet;
    let name = backends::resolve(&backend);
    if !quiet {
        eprintln!(
            "vlc: {} vectors of dimension {} from {}, {anchors} anchors, {bytes} bytes per vector, backend {name}{}",
            data.rows,
            data.cols,
            input.display(),
            if exact { " (exact mode)" } else { "" }
        );
    }
    let mut index = if devices > 1 {
        if data.rows < devices {
            return Err(format!(
                "{} vectors cannot be split over {devices} devices",
                data.rows
            ));
        }
        backends::on_group!(name, devices, compress_group(&data, &cfg, quiet))?
    } else {
        backends::on_backend!(name, compress_with(&data, &cfg, quiet))?
    };
    if let Some(ids) = ids {
        index = index.with_ids(ids).map_err(err)?;
    }
    if refine {
        index = index.with_refine(&data).map_err(err)?;
    }
    index.save(&output).map_err(err)?;
    let h = &index.header;
    if index.file_size() as f64 >= f32_bytes(h) {
        eprintln!(
            "vlc: note: the index ({} bytes) is not smaller than the vectors as float32 ({} \
             bytes): {} vectors are too few for {anchors} anchors of dimension {} and {bytes}-byte \
             codes (the anchors and codebooks are stored whole)",
            index.file_size(),
            f32_bytes(h),
            h.n,
            h.d
        );
    }
    println!(
        "wrote {}: {} bytes, ratio {:.1}x against f32, energy {:.6}, reconstruction MSE {:.6}",
        output.display(),
        index.file_size(),
        f32_bytes(h) / index.file_size() as f64,
        h.energy,
        h.mse
    );
    Ok(())
}

fn add_with<B: Backend>(b: &B, index: &Index, x: &Matrix, ids: Option<&[u64]>) -> Res<Index> {
    index.add(b, x, ids).map_err(err)
}

/// `vlc info`: the index's header.
fn info(index: &std::path::Path) -> Res<()> {
    let index = Index::open(index).map_err(err)?;
    let h = &index.header;
    println!("vectors           {} x {}", h.n, h.d);
    println!(
        "anchors           {} (f16), {} bits per assignment",
        h.m, h.assignment_bits
    );
    println!(
        "residual code     {} bytes per vector, {} codewords per subspace",
        h.pq_bytes, h.codewords
    );
    println!(
        "mode              {}",
        if h.exact { "exact" } else { "fast" }
    );
    println!("metric            {}", h.metric.name());
    println!(
        "ids               {}",
        if index.has_ids() {
            "stored"
        } else {
            "positions"
        }
    );
    println!(
        "refine vectors    {}",
        if index.has_refine() {
            "kept (f16), for search --rerank"
        } else {
            "none"
        }
    );
    println!("seed, iterations  {}, {}", h.seed, h.iterations);
    println!("energy            {:.6}", h.energy);
    println!("reconstruction    MSE {:.6}", h.mse);
    println!(
        "file              {} bytes, ratio {:.2}x against f32",
        index.file_size(),
        f32_bytes(h) / index.file_size() as f64
    );
    Ok(())
}

/// `vlc demo`: a short run on synthetic data that checks its own figures.
fn demo(backend: &str, n: usize, quiet: bool) -> Res<()> {
    let name = backends::resolve(backend);
    let data = vlc_anneal::synthetic::gaussian_mixture(n, 64, 200, 0.15, 11);
    let mut cfg = Config::new(256);
    cfg.pq_bytes = 16;
    cfg.iterations = 20;
    println!(
        "vlc demo: {n} x 64 synthetic vectors (200 Gaussian clusters), 256 anchors, 16 bytes per vector, backend {name}"
    );
    let start = Instant::now();
    let index = backends::on_backend!(name, compress_with(&data, &cfg, quiet))?;
    let seconds = start.elapsed().as_secs_f64();
    println!("compressed in {seconds:.2} s");
    let report = evaluate(&index, &data, Queries::Spread(500), 16)?;
    println!("{}", report.text);
    // The demo checks itself: residual codes must beat the anchors alone, and search
    // must find most true neighbours.
    if report.mse >= index.header.energy || report.recall < 0.5 {
        return Err(format!(
            "demo figures out of range: MSE {} against energy {}, recall@10 {}",
            report.mse, index.header.energy, report.recall
        ));
    }
    Ok(())
}

/// The size of an index's vectors as f32, in bytes (f64: a header may describe more bytes
/// than `usize` counts).
fn f32_bytes(h: &vlc_anneal::index::Header) -> f64 {
    h.n as f64 * h.d as f64 * 4.0
}

/// Refuses, before any work, an output that would replace one of the command's inputs or
/// whose folder does not exist. (The write itself is atomic: an interrupted one leaves any
/// old file at `output` whole.)
fn writable_output(output: &std::path::Path, inputs: &[&std::path::Path]) -> Res<()> {
    if let Some(input) = inputs.iter().find(|i| hal::durable::same_file(i, output)) {
        return Err(format!(
            "the output {} is the input {}; write to another file",
            output.display(),
            input.display()
        ));
    }
    let folder = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if !folder.is_dir() {
        return Err(format!(
            "the output's folder {} does not exist",
            folder.display()
        ));
    }
    if output.is_dir() {
        return Err(format!("the output {} is a folder", output.display()));
    }
    Ok(())
}

fn compress_with<B: Backend>(b: &B, data: &Matrix, cfg: &Config, quiet: bool) -> Res<Index> {
    with_progress(quiet, |p| compress(b, data, cfg, p))
}

/// [`vlc_anneal::compress_sharded`] on a thread per rank of `comms`, rank `r` holding the
/// `r`-th of equal parts of the rows; the first rank shows the progress.
fn compress_group<C: hal::Communicator>(
    comms: Vec<C>,
    data: &Matrix,
    cfg: &Config,
    quiet: bool,
) -> Res<Index> {
    let size = comms.len();
    let outcomes: Vec<Res<Index>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                s.spawn(move || {
                    let (lo, hi) = (data.rows * rank / size, data.rows * (rank + 1) / size);
                    let shard = Matrix::new(
                        hi - lo,
                        data.cols,
                        data.data[lo * data.cols..hi * data.cols].to_vec(),
                    )
                    .map_err(err)?;
                    let mut rank_cfg = cfg.clone();
                    rank_cfg.report_each_iteration &= rank == 0;
                    with_progress(quiet || rank > 0, |p| {
                        vlc_anneal::compress_sharded(&comm, &shard, &rank_cfg, p)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a device's thread panicked".into()))
            })
            .collect()
    });
    let mut first = None;
    for o in outcomes {
        let index = o?;
        first.get_or_insert(index);
    }
    first.ok_or_else(|| "no devices".into())
}

/// Runs a compression, drawing its progress (one bar a phase) unless `quiet`.
fn with_progress(
    quiet: bool,
    run: impl FnOnce(
        &mut dyn FnMut(vlc_anneal::Progress<'_>),
    ) -> vlc_anneal::Result<vlc_anneal::Compressed>,
) -> Res<Index> {
    // One bar a phase: a spinner with the elapsed time for a phase of one step (seeding), a
    // bar with an estimate of the time left for the others.
    let new_bar = |name: &str, steps: usize| -> ProgressBar {
        if quiet {
            return ProgressBar::hidden();
        }
        let (bar, template) = if steps == 0 {
            (
                ProgressBar::new_spinner(),
                "{prefix:>9} {spinner} {elapsed_precise} {msg}",
            )
        } else {
            (
                ProgressBar::new(steps as u64),
                "{prefix:>9} [{bar:30}] {pos}/{len} {elapsed_precise}, ETA {eta} {msg}",
            )
        };
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(name.to_string());
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        bar
    };
    let mut bar = ProgressBar::hidden();
    let mut on_progress = |p: vlc_anneal::Progress<'_>| match p {
        vlc_anneal::Progress::Phase { name, steps } => {
            bar.finish_and_clear();
            bar = new_bar(name, steps);
            if !quiet && bar.is_hidden() {
                eprintln!("vlc: {name}");
            }
        }
        vlc_anneal::Progress::Iteration(r) => {
            let mut msg = format!("energy {:.6} T {:.3}", r.energy, r.temperature);
            if r.merged + r.split + r.reseeded > 0 {
                msg += &format!(
                    " (merged {}, split {}, re-seeded {})",
                    r.merged, r.split, r.reseeded
                );
            }
            bar.set_position(r.iteration as u64);
            bar.set_message(msg.clone());
            if !quiet && bar.is_hidden() {
                eprintln!("iteration {}: {msg}", r.iteration);
            }
        }
        vlc_anneal::Progress::Step(done) => bar.set_position(done as u64),
    };
    let out = run(&mut on_progress).map_err(err)?;
    bar.finish_and_clear();
    if !quiet {
        let t = out.seconds;
        eprintln!(
            "vlc: seeding {:.3} s, annealing {:.3} s, residual coding {:.3} s; final energy {:.6}",
            t.seeding, t.annealing, t.coding, out.clustering.energy
        );
    }
    Ok(out.index)
}
