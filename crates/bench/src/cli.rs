//! `bench`'s command line, parsed by clap like every other binary here, into [`Args`].

use clap::Parser;
use std::path::PathBuf;

/// The suites this build has.
pub(crate) const SUITES: [&str; 12] = [
    "train",
    "gpt",
    "gemm",
    "elementwise",
    "nearest",
    "skinny",
    "launch",
    "memory",
    "nlls",
    "real",
    "vlc",
    "vlc-search",
];

/// Measures hal primitives and workloads on one backend, with peers timed in the same run.
#[derive(Parser)]
#[command(name = "bench")]
struct Cli {
    /// cpu, wgpu or cuda.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Suites to run, comma-separated: train, gpt, gemm, elementwise, nearest, skinny,
    /// launch, memory, nlls, real, vlc, vlc-search.
    #[arg(
        long = "suite",
        value_delimiter = ',',
        default_value = "gemm,elementwise"
    )]
    suites: Vec<String>,
    /// Timed runs per measurement (the median is reported), at least 1.
    #[arg(long, default_value_t = 9)]
    reps: usize,
    /// Side of the square GEMM.
    #[arg(long, default_value_t = 2048)]
    gemm_size: usize,
    /// Elements of the elementwise suite's operands.
    #[arg(long, default_value_t = 64 << 20)]
    elements: usize,
    /// Points of the nearest-centroid suite.
    #[arg(long, default_value_t = 1_000_000)]
    points: usize,
    /// Centroids of the nearest-centroid suite (at least 1).
    #[arg(long, default_value_t = 4096)]
    centroids: usize,
    /// Dimension of the nearest-centroid suite (at least 1).
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Icosphere levels of the nlls suite, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4,5")]
    levels: Vec<u32>,
    /// Edges of the nlls suite's problem instead of whole levels.
    #[arg(long)]
    edges: Option<usize>,
    /// The level whose compile time the nlls suite reports.
    #[arg(long, default_value_t = 7)]
    compile_level: u32,
    /// Skip the nlls suite's CPU/GPU break-even search.
    #[arg(long)]
    no_break_even: bool,
    /// Steps of the train suite's memory check (at least 100).
    #[arg(long, default_value_t = 10_000)]
    memory_steps: usize,
    /// The gpt suite's recipes, comma-separated: shakespeare-char, gpt2.
    #[arg(long, value_delimiter = ',', default_value = "shakespeare-char")]
    gpt_config: Vec<String>,
    /// nanoGPT's folder (its model.py), for the gpt suite's PyTorch peer.
    #[arg(long)]
    nanogpt: Option<PathBuf>,
    /// The gpt suite's dropout instead of the recipe's (ours only: the peer keeps the recipe's,
    /// so no ratio is printed). For measuring what dropout costs.
    #[arg(long)]
    gpt_dropout: Option<f32>,
    /// The real suite's data folder (BAL and g2o files).
    #[arg(long, default_value = "../shared/data/real")]
    real_data: PathBuf,
    /// The real suite's problems whose names contain one of these, comma-separated.
    #[arg(long, value_delimiter = ',')]
    real_only: Vec<String>,
    /// The vlc suite's data folder.
    #[arg(long, default_value = "data/vlc")]
    vlc_data: PathBuf,
    /// The vlc suite's timings only (no quality figures).
    #[arg(long)]
    vlc_speed_only: bool,
    /// The vlc-search suite's data sets, `.npy` files, comma-separated (default: GloVe and
    /// MiniLM in data/vlc where make_data.py wrote them, else a synthetic mixture).
    #[arg(long, value_delimiter = ',')]
    vlc_search_data: Vec<PathBuf>,
    /// Held-out queries: the last rows of each vlc-search set.
    #[arg(long, default_value_t = 10_000)]
    vlc_queries: usize,
    /// Inverted lists of the vlc-search indexes (ours and FAISS's).
    #[arg(long, default_value_t = 1024)]
    vlc_lists: usize,
    /// Bytes of residual code per vector in the vlc-search indexes.
    #[arg(long, default_value_t = 16)]
    vlc_bytes: usize,
    /// The vlc-search suite's nprobe values, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    vlc_nprobe: Vec<usize>,
    /// Anchor counts of the vlc-search suite's k-means comparison (0: none).
    #[arg(long, value_delimiter = ',', default_value = "256,1024")]
    vlc_kmeans: Vec<usize>,
    /// Iterations of every k-means in the vlc-search suite, ours and FAISS's.
    #[arg(long, default_value_t = 20)]
    vlc_iterations: usize,
    /// wgpu with every optional adapter feature off.
    #[arg(long)]
    wgpu_fallbacks: bool,
    /// wgpu with these features off, comma-separated: immediates, f16, subgroups, coop.
    #[arg(long, value_delimiter = ',')]
    wgpu_without: Vec<String>,
    /// Tilings of wgpu's cooperative-matrix product to compare (SRxSCxTMxTN,...).
    #[arg(long, value_delimiter = ',')]
    coop_tiles: Vec<String>,
}

pub(crate) struct Args {
    pub backend: String,
    pub suites: Vec<String>,
    pub reps: usize,
    pub gemm_size: usize,
    pub elements: usize,
    pub points: usize,
    pub centroids: usize,
    pub dim: usize,
    /// Optional wgpu features turned off.
    pub wgpu_options: backend_wgpu::WgpuOptions,
    /// Tilings of wgpu's cooperative-matrix product to compare (`--coop-tiles`).
    pub coop_tiles: Vec<String>,
    pub nlls: crate::nlls::NllsArgs,
    pub train: crate::train::TrainArgs,
    pub gpt: crate::gpt::GptArgs,
    pub vlc: crate::vlc::VlcArgs,
    pub vlc_search: crate::vlc_search::VlcSearchArgs,
    pub real: crate::real::RealArgs,
}

/// The command line as [`Args`]; clap itself answers `--help` and malformed flags.
pub(crate) fn parse() -> Result<Args, String> {
    let c = Cli::parse();
    for s in &c.suites {
        if !SUITES.contains(&s.as_str()) {
            return Err(format!(
                "unknown suite {s} (this build has: {})",
                SUITES.join(", ")
            ));
        }
    }
    let mut wgpu_options = match c.wgpu_fallbacks {
        true => backend_wgpu::WgpuOptions::fallbacks(),
        false => backend_wgpu::WgpuOptions::default(),
    };
    for f in &c.wgpu_without {
        match f.as_str() {
            "immediates" => wgpu_options.immediates = false,
            "f16" => wgpu_options.native_f16 = false,
            "subgroups" => wgpu_options.subgroups = false,
            "coop" => wgpu_options.cooperative_matrix = false,
            other => {
                return Err(format!(
                    "unknown wgpu feature {other} (immediates, f16, subgroups, coop)"
                ));
            }
        }
    }
    Ok(Args {
        backend: c.backend,
        suites: c.suites,
        reps: c.reps.max(1),
        gemm_size: c.gemm_size,
        elements: c.elements,
        points: c.points,
        centroids: c.centroids.max(1),
        dim: c.dim.max(1),
        wgpu_options,
        coop_tiles: c.coop_tiles,
        nlls: crate::nlls::NllsArgs {
            levels: c.levels,
            edges: c.edges,
            compile_level: c.compile_level,
            break_even: !c.no_break_even,
            reps: 9,
        },
        train: crate::train::TrainArgs {
            reps: 9,
            memory_steps: c.memory_steps.max(100),
        },
        gpt: crate::gpt::GptArgs {
            reps: 9,
            configs: c.gpt_config,
            nanogpt: c.nanogpt,
            dropout: c.gpt_dropout,
        },
        vlc: crate::vlc::VlcArgs {
            reps: 9,
            data_dir: c.vlc_data,
            speed_only: c.vlc_speed_only,
        },
        vlc_search: crate::vlc_search::VlcSearchArgs {
            reps: 9,
            data: c.vlc_search_data,
            queries: c.vlc_queries,
            lists: c.vlc_lists.max(1),
            bytes: c.vlc_bytes,
            nprobe: c.vlc_nprobe,
            kmeans: c.vlc_kmeans,
            iterations: c.vlc_iterations,
        },
        real: crate::real::RealArgs {
            data: c.real_data,
            only: c.real_only,
        },
    })
}
