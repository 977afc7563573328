//! The solver flags the real-problem examples share (`bundle_adjuster`, `pose_graph`).

use residual_compile::{LinearSolver, SolveOptions};
use std::path::Path;

#[derive(clap::Args)]
pub struct SolveArgs {
    /// cpu, wgpu, cuda, or auto.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// auto, cholesky (sparse Cholesky on the host), schur (dense Schur complement, where
    /// the problem declares blocks to eliminate), device-schur (the same complement formed on
    /// the device), iterative-schur (conjugate gradients on it on the device, unformed) or cg
    /// (conjugate gradients on the device).
    #[arg(long, default_value = "auto")]
    pub linear_solver: String,
    /// f64 (the default) or f32: what the residuals, Jacobians and linear solves are computed
    /// in.
    #[arg(long, default_value = "f64")]
    pub precision: String,
    /// The most iterations (Ceres's examples stop at 100 for BA, 200 for pose graphs).
    #[arg(long, default_value_t = 100)]
    pub max_iterations: usize,
    /// Ceres's default tolerances (function 1e-6, parameter 1e-8) rather than the library's
    /// tighter ones.
    #[arg(long)]
    pub ceres_tolerances: bool,
    /// No per-iteration lines.
    #[arg(long)]
    pub quiet: bool,
}

impl SolveArgs {
    pub fn options(&self) -> Result<SolveOptions, String> {
        let linear_solver = match self.linear_solver.as_str() {
            "auto" => LinearSolver::Auto,
            "cholesky" => LinearSolver::SparseCholesky,
            "schur" => LinearSolver::DenseSchur,
            "device-schur" => LinearSolver::DeviceSchur,
            "iterative-schur" => LinearSolver::IterativeSchur,
            "cg" => LinearSolver::ConjugateGradient,
            other => {
                return Err(format!(
                    "--linear-solver {other}: use auto, cholesky, schur, device-schur, iterative-schur or cg"
                ));
            }
        };
        let defaults = SolveOptions::default();
        let ceres = self.ceres_tolerances;
        let precision = match self.precision.as_str() {
            "f64" => residual_compile::Precision::F64,
            "f32" => residual_compile::Precision::F32,
            other => return Err(format!("--precision {other}: use f64 or f32")),
        };
        Ok(SolveOptions {
            linear_solver,
            precision,
            max_iterations: self.max_iterations,
            verbose: !self.quiet,
            function_tolerance: if ceres {
                1e-6
            } else {
                defaults.function_tolerance
            },
            parameter_tolerance: if ceres {
                1e-8
            } else {
                defaults.parameter_tolerance
            },
            ..defaults
        })
    }
}

/// Refuses an output whose folder does not exist before the solve, not after it.
pub fn check_out(out: Option<&Path>) -> Result<(), String> {
    let dir = out
        .and_then(|o| o.parent())
        .filter(|p| !p.as_os_str().is_empty());
    match dir {
        Some(d) if !d.is_dir() => Err(format!("--out: the folder {} does not exist", d.display())),
        _ => Ok(()),
    }
}
