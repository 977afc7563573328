//! `pose_graph`: optimise a g2o pose graph (2D `SE2` or 3D `SE3:QUAT`) with the residuals of
//! Ceres's `pose_graph_2d`/`pose_graph_3d`, print a Ceres-style summary, and write the
//! optimised poses (g2o) and trajectory (OBJ).
//!
//! ```sh
//! cargo run --release -p residual-compile --example pose_graph -- \
//!     crates/residual-compile/data/intel.g2o --out /tmp/intel
//! ```

use clap::Parser;

#[path = "common/solve_args.rs"]
mod solve_args;

use hal::Backend;
use residual_compile::pose_graph::{PoseGraph, g2o};
use residual_compile::{KernelCache, solve};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Optimise a g2o pose graph (Ceres's pose_graph_2d/3d residuals)")]
struct Args {
    /// The g2o file.
    input: PathBuf,
    /// Writes `<out>.g2o` (the optimised graph) and `<out>.obj` (the trajectory).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    solve: solve_args::SolveArgs,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    backends::join_rayon_pool("pose_graph");
    let args = Args::parse();
    let choice = backends::resolve(&args.solve.backend).to_string();
    match backends::on_backend!(choice.as_str(), run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pose_graph: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run<B: Backend>(backend: &B, args: &Args) -> Result<(), String> {
    let options = args.solve.options()?;
    solve_args::check_out(args.out.as_deref())?;
    let graph = PoseGraph::read(&args.input).map_err(|e| e.to_string())?;
    println!(
        "{}: {} poses ({:?}), {} edges",
        args.input.display(),
        graph.len(),
        graph.kind,
        graph.edges.len()
    );
    let mut problem = graph.problem().map_err(|e| e.to_string())?;
    let summary =
        solve(backend, &mut problem, &options, &KernelCache::new()).map_err(|e| e.to_string())?;
    println!("{summary}");
    if let Some(out) = &args.out {
        let poses = &problem.parameters()[..graph.poses.len()];
        let g = out.with_extension("g2o");
        let obj = out.with_extension("obj");
        g2o::write(&graph, poses, &g).map_err(|e| format!("{}: {e}", g.display()))?;
        g2o::write_obj(&graph, poses, &obj).map_err(|e| format!("{}: {e}", obj.display()))?;
        println!("wrote {} and {}", g.display(), obj.display());
    }
    Ok(())
}
