//! `bundle_adjuster`: solve a BAL bundle-adjustment problem with the residual of Ceres's
//! `bundle_adjuster` (`snavely_reprojection_error.h`), print a Ceres-style summary, and write
//! the optimised scene as a PLY point cloud.
//!
//! `--synthetic 100,250000,4` solves a generated scene with a known noise floor instead.
//!
//! ```sh
//! cargo run --release -p residual-compile --example bundle_adjuster -- \
//!     crates/residual-compile/data/bal-ladybug-problem-49-7776-pre-shrink-1800.txt --out /tmp/ba.ply
//! ```

use clap::Parser;

#[path = "common/solve_args.rs"]
mod solve_args;

use hal::Backend;
use residual_compile::bal::{BalProblem, Synthetic};
use residual_compile::{KernelCache, Loss, solve};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Solve a BAL bundle-adjustment problem (Ceres's bundle_adjuster residual)")]
struct Args {
    /// The BAL file (or `--synthetic`).
    input: Option<PathBuf>,
    /// A synthetic scene instead of a file, `CAMERAS,POINTS,PER_POINT` (e.g. 100,250000,4:
    /// a million observations), with 0.5 pixels of noise; the summary is followed by the
    /// noise floor the final cost should reach.
    #[arg(long, value_delimiter = ',')]
    synthetic: Option<Vec<usize>>,
    /// A robust loss on each observation: none, huber, cauchy, softl1 or tukey (scale 1 pixel;
    /// Ceres's `bundle_adjuster -robustify` uses huber).
    #[arg(long, default_value = "none")]
    loss: String,
    /// Writes the optimised points and camera centres as a PLY file.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    solve: solve_args::SolveArgs,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    backends::join_rayon_pool("bundle_adjuster");
    let args = Args::parse();
    let choice = backends::resolve(&args.solve.backend).to_string();
    match backends::on_backend!(choice.as_str(), run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bundle_adjuster: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run<B: Backend>(backend: &B, args: &Args) -> Result<(), String> {
    let options = args.solve.options()?;
    let loss = match args.loss.as_str() {
        "none" => Loss::Trivial,
        "huber" => Loss::Huber(1.0),
        "cauchy" => Loss::Cauchy(1.0),
        "softl1" => Loss::SoftLOne(1.0),
        "tukey" => Loss::Tukey(1.0),
        other => {
            return Err(format!(
                "--loss {other}: use none, huber, cauchy, softl1 or tukey"
            ));
        }
    };
    solve_args::check_out(args.out.as_deref())?;
    let (bal, name, floor) = match (&args.input, &args.synthetic) {
        (Some(path), None) => (
            BalProblem::read(path).map_err(|e| e.to_string())?,
            path.display().to_string(),
            None,
        ),
        (None, Some(s)) => {
            let &[cameras, points, per_point] = &s[..] else {
                return Err(format!(
                    "--synthetic takes CAMERAS,POINTS,PER_POINT, not {} numbers",
                    s.len()
                ));
            };
            if per_point < 2 || cameras < per_point || points == 0 {
                return Err(format!(
                    "--synthetic {cameras},{points},{per_point}: each point needs 2 or more \
                     cameras, no more than there are, and there must be points"
                ));
            }
            let scene = Synthetic::new(cameras, points, per_point, 0.5, 7);
            let floor = (scene.expected_cost, scene.cost_std);
            (scene.start, "synthetic scene".into(), Some(floor))
        }
        _ => return Err("give a BAL file or --synthetic, not both or neither".into()),
    };
    println!(
        "{name}: {} cameras, {} points, {} observations",
        bal.num_cameras(),
        bal.num_points(),
        bal.observations.len()
    );
    let mut problem = bal.problem(loss).map_err(|e| e.to_string())?;
    let summary =
        solve(backend, &mut problem, &options, &KernelCache::new()).map_err(|e| e.to_string())?;
    println!("{summary}");
    if let Some((expected, std)) = floor {
        println!(
            "noise floor: {expected:.6e} +- {std:.2e} (final cost {:+.1} standard deviations \
             from it)",
            (summary.final_cost - expected) / std
        );
    }
    if let Some(out) = &args.out {
        bal.write_ply(problem.parameters(), out)
            .map_err(|e| format!("{}: {e}", out.display()))?;
        println!("wrote {}", out.display());
    }
    Ok(())
}
