//! `pose_graph`: optimise a g2o pose graph (2D `SE2` or 3D `SE3:QUAT`) with the residuals of
//! Ceres's `pose_graph_2d`/`pose_graph_3d`, print a Ceres-style summary, and write the
//! optimised poses (g2o) and trajectory (OBJ).
//!
//! ```sh
//! cargo run --release -p residual-compile --example pose_graph -- \
//!     crates/residual-compile/data/intel.g2o --out /tmp/intel
//! ```

use clap::Parser;
use hal::Backend;
use residual_compile::pose_graph::{PoseGraph, g2o};
use residual_compile::{KernelCache, LinearSolver, SolveOptions, solve};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Optimise a g2o pose graph (Ceres's pose_graph_2d/3d residuals)")]
struct Args {
    /// The g2o file.
    input: PathBuf,
    /// cpu, wgpu, cuda, or auto.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// auto, cholesky (sparse Cholesky on the host) or cg (conjugate gradients on the device).
    #[arg(long, default_value = "auto")]
    linear_solver: String,
    /// The most iterations (Ceres's examples stop at 100).
    #[arg(long, default_value_t = 100)]
    max_iterations: usize,
    /// Ceres's default tolerances (function 1e-6, gradient 1e-10, parameter 1e-8) rather than
    /// the library's tighter ones.
    #[arg(long)]
    ceres_tolerances: bool,
    /// Writes `<out>.g2o` (the optimised graph) and `<out>.obj` (the trajectory).
    #[arg(long)]
    out: Option<PathBuf>,
    /// No per-iteration lines.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    let args = Args::parse();
    let choice = backends::resolve(&args.backend).to_string();
    match backends::on_backend!(choice.as_str(), run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pose_graph: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run<B: Backend>(backend: &B, args: &Args) -> Result<(), String> {
    let linear_solver = match args.linear_solver.as_str() {
        "auto" => LinearSolver::Auto,
        "cholesky" => LinearSolver::SparseCholesky,
        "cg" => LinearSolver::ConjugateGradient,
        other => return Err(format!("--linear-solver {other}: use auto, cholesky or cg")),
    };
    // Refuse a missing output folder now, not after the solve.
    if let Some(out) = &args.out {
        let dir = out.parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(dir) = dir.filter(|d| !d.is_dir()) {
            return Err(format!(
                "--out: the folder {} does not exist",
                dir.display()
            ));
        }
    }
    let graph = PoseGraph::read(&args.input).map_err(|e| e.to_string())?;
    println!(
        "{}: {} poses ({:?}), {} edges",
        args.input.display(),
        graph.len(),
        graph.kind,
        graph.edges.len()
    );
    let mut problem = graph.problem().map_err(|e| e.to_string())?;
    let defaults = SolveOptions::default();
    let options = SolveOptions {
        linear_solver,
        max_iterations: args.max_iterations,
        verbose: !args.quiet,
        function_tolerance: if args.ceres_tolerances {
            1e-6
        } else {
            defaults.function_tolerance
        },
        parameter_tolerance: if args.ceres_tolerances {
            1e-8
        } else {
            defaults.parameter_tolerance
        },
        ..defaults
    };
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
