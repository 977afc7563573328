//! # residual-compile: scalar residuals compiled into batched kernels, and a sparse
//! Levenberg-Marquardt solver
//!
//! Nonlinear least squares in the style of Ceres, on any `hal` backend:
//!
//! 1. **Trace.** A residual block is a Rust closure over [`Var`]s (scalar autograd: `+ - * /`,
//!    `powi`, `sqrt`, `exp`, `atan2`, `select`, [`Vec3`] helpers, ...). [`Problem::add_residual`]
//!    runs it once per instance on a [`trace::Tape`], recording the operations, not values.
//! 2. **Group.** Each traced graph gets a topology signature ([`Graph::signature`]: operations,
//!    wiring and literals, not parameter values or per-instance constants). Instances with the
//!    same signature and loss form one [`ResidualGroup`]; their parameter indices and
//!    constants become device buffers read by indirect indexing.
//! 3. **Compile.** Per group, the graph and its Jacobian (reverse-mode symbolic derivatives
//!    with common subexpressions shared, [`Graph::derivatives`]) are lowered to one `hal`
//!    scalar program ([`lower`]) that writes residuals, CSR Jacobian values and costs. So
//!    100,000 residuals of 3 shapes compile 3 kernels, on the CPU, in WGSL or through NVRTC;
//!    [`KernelCache`] keeps them across problems.
//! 4. **Solve.** [`solve()`] runs Levenberg-Marquardt (Ceres's trust-region update) or
//!    Gauss-Newton, with the normal equations solved by sparse Cholesky on the host (`faer`),
//!    by the dense Schur complement of declared elimination blocks (bundle adjustment's
//!    points), or by Jacobi-preconditioned conjugate gradients on the device, matrix-free,
//!    and reports a Ceres-like [`Summary`]. [`solve_async`] is the same loop as a future, with
//!    an observer called after each iteration: what a browser page runs on WebGPU (wasm32),
//!    where reads from the device cannot block.
//!
//! Parameter blocks can live on manifolds ([`Manifold`]: quaternions, angles, SE(2), SE(3)):
//! the kernels then write Jacobians in the tangent space and the solver steps there.
//! [`bal`] and [`pose_graph`] read the standard bundle-adjustment and pose-graph files into
//! problems with Ceres's residuals (`examples/bundle_adjuster.rs`, `examples/pose_graph.rs`).
//!
//! ```
//! use residual_compile::{Problem, Loss, KernelCache, SolveOptions, solve};
//! # fn main() -> Result<(), residual_compile::Error> {
//! let backend = backend_cpu::CpuBackend::new();
//! let mut problem = Problem::new();
//! let x = problem.add_parameters(&[-1.2, 1.0]);
//! problem.add_residual("rosenbrock", &[x, x + 1], &[], Loss::Trivial, |v, _| {
//!     vec![1.0 - v[0], 10.0 * (v[1] - v[0] * v[0])]
//! })?;
//! let summary = solve(&backend, &mut problem, &SolveOptions::default(), &KernelCache::new())?;
//! assert!(summary.final_cost < 1e-8);
//! assert!((problem.parameters()[0] - 1.0).abs() < 1e-3);
//! # Ok(()) }
//! ```
//!
//! Everything runs in `f64` by default: parameters, data constants exactly as given,
//! residuals, Jacobians, the normal equations and the linear solves ([`Precision`]);
//! [`Precision::F32`] evaluates in `f32` on the device for speed. The host-side `f64`
//! evaluation ([`Graph::eval`], [`Derivatives::eval_jacobian`], [`Problem::cost_f64`]) is the
//! reference the tests hold the kernels to.

pub mod bal;
pub mod compile;
mod dense;
pub mod graph;
pub mod icosphere;
pub mod lower;
pub mod manifold;
mod ordering;
pub mod pose_graph;
pub mod problem;
mod slots;
pub mod solve;
mod supernodal;
pub mod trace;

pub use compile::{CompileReport, CompiledProblem, Evaluation, GroupReport, KernelCache};
pub use graph::{Derivatives, Graph};
pub use manifold::{Manifold, TangentSpace};
pub use problem::{Loss, Problem, ResidualGroup};
pub use solve::{
    AUTO_CG_MIN_PARAMETERS, CRAWL_ITERATIONS, CRAWL_RADIUS, IterationSummary, LinearSolver, Method,
    Observer, PhaseTimes, Progress, Scaling, SolveOptions, Summary, Termination, solve,
    solve_async,
};
pub use trace::{Cond, Var, Vec2, Vec3};

/// The floating-point type a solve evaluates and solves in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Double precision throughout: parameters, data constants (as the user wrote them),
    /// residuals, Jacobians, the normal equations, the Cholesky factor and conjugate
    /// gradients. The default, as in Ceres. The backend must offer `f64` programs (and, for
    /// conjugate gradients, `f64` primitives): see [`hal::Capabilities::f64`].
    #[default]
    F64,
    /// Residuals, Jacobians and the device's conjugate gradients in `f32`, for speed; the
    /// sparse Cholesky path still forms and solves the normal equations in `f64` on the host
    /// (mixed precision), and costs are summed in `f64`. Evaluation rounding limits what the
    /// solve can resolve: relative cost changes below about `1e-7` and relative steps below
    /// `1e-8` are noise, so the function and parameter tolerances used are at least those.
    F32,
}

impl Precision {
    /// The buffers' element type.
    pub fn dtype(self) -> hal::DType {
        match self {
            Precision::F64 => hal::DType::F64,
            Precision::F32 => hal::DType::F32,
        }
    }

    /// The IR's value type.
    pub fn scalar(self) -> hal::ir::ScalarType {
        match self {
            Precision::F64 => hal::ir::ScalarType::F64,
            Precision::F32 => hal::ir::ScalarType::F32,
        }
    }

    /// The least relative cost change evaluation rounding leaves meaningful.
    pub fn function_tolerance_floor(self) -> f64 {
        match self {
            Precision::F64 => 0.0,
            Precision::F32 => 1e-7,
        }
    }

    /// The least relative step evaluation rounding leaves meaningful.
    pub fn parameter_tolerance_floor(self) -> f64 {
        match self {
            Precision::F64 => 0.0,
            Precision::F32 => 1e-8,
        }
    }

    /// `f64` or `f32`.
    pub fn name(self) -> &'static str {
        self.dtype().name()
    }
}

/// What can go wrong building or solving a problem.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Hal(#[from] hal::Error),
    /// A problem that cannot be solved as given: no residual blocks, a parameter index out of
    /// range, a residual block without parameters, a non-finite constant.
    #[error("invalid problem: {0}")]
    InvalidProblem(String),
    /// A residual (or Jacobian entry) evaluated to NaN or infinity at the starting point.
    #[error(
        "residual block '{name}' (block {block}, residual {residual}) produced a non-finite {what} at the starting point"
    )]
    NonFinite {
        name: String,
        block: usize,
        residual: usize,
        what: &'static str,
    },
    #[error("solver: {0}")]
    Solver(String),
    /// The damped normal equations could not be factorised (a negative or zero pivot: a
    /// direction no residual constrains, with too little damping to make up for it).
    /// Levenberg-Marquardt treats it as a rejected step and damps more, as Ceres does; it
    /// stops a solve only where the damping cannot grow (Gauss-Newton).
    #[error("solver: {0}")]
    NotPositiveDefinite(String),
    /// A [`SolveOptions`] value that cannot be used (a negative or NaN tolerance, a trust
    /// radius that is not positive, ...).
    #[error("invalid solve options: {0}")]
    InvalidOptions(String),
    /// The solve stopped on an error after it started; `summary` reports it so far (the
    /// iterations, the last accepted cost, [`Termination::Failure`]) and the problem holds the
    /// parameters of the last accepted step.
    #[error("{source} (solve stopped after {} iterations, {} accepted; last accepted cost {:e})", summary.iterations, summary.accepted_steps, summary.final_cost)]
    Failed {
        source: Box<Error>,
        summary: Box<Summary>,
    },
}

impl Error {
    /// The summary of a solve that stopped on this error, where it had started.
    pub fn summary(&self) -> Option<&Summary> {
        match self {
            Error::Failed { summary, .. } => Some(summary),
            _ => None,
        }
    }

    /// The error itself, without the solve's summary around it.
    pub fn cause(&self) -> &Error {
        match self {
            Error::Failed { source, .. } => source.cause(),
            other => other,
        }
    }
}

/// `auto` backend choice: problems with at least this many scalar residuals go to a GPU
/// backend when one is present, smaller ones to the CPU (where launch and transfer latency
/// dominate). Measured by `bench --suite nlls` on a GPU host (docs/PERF.md, tuning
/// evidence): the icosphere at level 3 (8,322 residuals) solved faster on its CPU, at level 4
/// (33,282) on the GPU; the threshold sits between the two.
pub const AUTO_GPU_MIN_RESIDUALS: usize = 20_000;

/// faer's parallelism over every core: rayon's pool natively, the calling thread on wasm32,
/// which has no threads (faer's rayon support is built only for native targets).
pub(crate) fn all_cores() -> faer::Par {
    #[cfg(not(target_arch = "wasm32"))]
    {
        faer::Par::rayon(0)
    }
    #[cfg(target_arch = "wasm32")]
    {
        faer::Par::Seq
    }
}
