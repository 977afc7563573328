//! `icosphere`: perturb a subdivided icosahedron and pull it back into shape with
//! Levenberg-Marquardt; prints the solver summary and writes an OBJ file of the result.
//!
//! ```sh
//! cargo run --release -p residual-compile --example icosphere -- --level 4 --backend cpu
//! ```

use clap::Parser;
use hal::Backend;
use residual_compile::icosphere::Icosphere;
use residual_compile::{KernelCache, LinearSolver, Method, Precision, SolveOptions, solve};
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Solve the perturbed-icosphere problem on a chosen backend")]
struct Args {
    /// Subdivision level, 3 to 7 (642 to 163,842 vertices).
    #[arg(long, default_value_t = 4)]
    level: u32,
    /// cpu, wgpu, cuda, or auto (the GPU above the measured break-even size, else the CPU).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Standard deviation of the noise added to each coordinate.
    #[arg(long, default_value_t = residual_compile::icosphere::DEMO_SIGMA)]
    sigma: f64,
    #[arg(long, default_value_t = residual_compile::icosphere::DEMO_SEED)]
    seed: u64,
    /// Weights of the sphere and bending residuals.
    #[arg(long, default_value_t = 1.0)]
    w1: f64,
    #[arg(long, default_value_t = 1.0)]
    w2: f64,
    /// lm or gn.
    #[arg(long, default_value = "lm")]
    method: String,
    /// auto, cholesky or cg.
    #[arg(long, default_value = "auto")]
    linear_solver: String,
    /// f64 (the default) or f32: what residuals, Jacobians and the linear solves run in.
    #[arg(long, default_value = "f64")]
    precision: String,
    #[arg(long, default_value_t = 500)]
    max_iterations: usize,
    /// The relative cost change that ends the solve (default: the library's).
    #[arg(long)]
    function_tolerance: Option<f64>,
    /// Where to write the result (Wavefront OBJ); nothing is written when empty.
    #[arg(long, default_value = "icosphere.obj")]
    out: String,
    /// One line per iteration.
    #[arg(long)]
    verbose: bool,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    backends::join_rayon_pool("icosphere");
    let args = Args::parse();
    if !(3..=7).contains(&args.level) {
        eprintln!("icosphere: --level must be 3 to 7 (got {})", args.level);
        return ExitCode::from(2);
    }
    let mesh = match Icosphere::new(args.level) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("icosphere: {e}");
            return ExitCode::FAILURE;
        }
    };
    let residuals = mesh.edges.len() * 4 + mesh.vertices.len();
    let choice = match args.backend.as_str() {
        "auto" if residuals >= residual_compile::AUTO_GPU_MIN_RESIDUALS => backends::best_present(),
        "auto" => "cpu",
        other => other,
    };
    println!(
        "icosphere: level {} ({} vertices, {} edges, {} residuals), sigma {}, seed {}, backend {} ({})",
        args.level,
        mesh.vertices.len(),
        mesh.edges.len(),
        residuals,
        args.sigma,
        args.seed,
        choice,
        if args.backend == "auto" {
            format!(
                "auto: the GPU from {} residuals, the break-even the bench measured",
                residual_compile::AUTO_GPU_MIN_RESIDUALS
            )
        } else {
            "chosen".into()
        }
    );
    let result = backends::on_backend!(choice, run(&mesh, &args));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("icosphere: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run<B: Backend>(backend: &B, mesh: &Icosphere, args: &Args) -> Result<(), String> {
    let start = mesh.perturbed(args.sigma, args.seed);
    let mut problem = mesh
        .problem(&start, args.w1, args.w2)
        .map_err(|e| e.to_string())?;
    let options = SolveOptions {
        method: match args.method.as_str() {
            "lm" => Method::LevenbergMarquardt,
            "gn" => Method::GaussNewton,
            m => return Err(format!("unknown method {m} (expected lm or gn)")),
        },
        linear_solver: match args.linear_solver.as_str() {
            "auto" => LinearSolver::Auto,
            "cholesky" => LinearSolver::SparseCholesky,
            "cg" => LinearSolver::ConjugateGradient,
            s => {
                return Err(format!(
                    "unknown linear solver {s} (expected auto, cholesky or cg)"
                ));
            }
        },
        precision: match args.precision.as_str() {
            "f64" => Precision::F64,
            "f32" => Precision::F32,
            p => return Err(format!("unknown precision {p} (expected f64 or f32)")),
        },
        max_iterations: args.max_iterations,
        function_tolerance: args
            .function_tolerance
            .unwrap_or(SolveOptions::default().function_tolerance),
        verbose: args.verbose,
        ..SolveOptions::default()
    };
    let summary =
        solve(backend, &mut problem, &options, &KernelCache::new()).map_err(|e| e.to_string())?;
    println!("{summary}");
    if !args.out.is_empty() {
        let path = std::path::Path::new(&args.out);
        mesh.write_obj(path, problem.parameters())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("icosphere: wrote {}", path.display());
    }
    Ok(())
}
