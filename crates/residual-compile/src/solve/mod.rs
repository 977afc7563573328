//! Levenberg-Marquardt (Ceres-style trust region) and Gauss-Newton over a compiled problem.
//!
//! Five ways to solve the normal equations `(J^T J + lambda D) delta = -J^T f`:
//! - [`LinearSolver::SparseCholesky`]: `J^T J` assembled on the host in `f64` and factorised
//!   by `faer`'s supernodal sparse Cholesky (the symbolic analysis once, the numeric
//!   factorisation per iteration). Exact; the CPU backend's default.
//! - [`LinearSolver::DenseSchur`]: for problems that declare blocks to eliminate (bundle
//!   adjustment's points), the Schur complement formed and factorised dense on the host.
//! - [`LinearSolver::DeviceSchur`]: the same complement formed on the device by kernels per
//!   residual shape, factorised on the host; the GPU backends' default for such problems.
//!   [`LinearSolver::IterativeSchur`]: conjugate gradients on it on the device, without
//!   forming it (the default where it is too large to form).
//! - [`LinearSolver::ConjugateGradient`]: matrix-free preconditioned conjugate gradients on the
//!   device (Jacobi preconditioner, `J` and `J^T` as CSR mat-vecs), reading back a few
//!   scalars per check. The GPU backends' default for large problems without manifolds.
//!
//! The trust region follows Ceres: `lambda = 1 / radius`; a step is accepted when the actual
//! cost decrease is at least `1e-3` of the decrease the linear model predicts; then
//! `radius /= max(1/3, 1 - (2 rho - 1)^3)`, otherwise `radius /= nu, nu *= 2`. `D` is
//! Ceres's too ([`Scaling::Ceres`]) until the solve crawls: where a column of `J` shrinks on
//! the way (a parameter moving towards where the residuals stop depending on it), the damping
//! along it vanishes, steps there overshoot, and the radius collapses until every step is a
//! timid gradient step (Brown and Dennis's function and the first penalty function of the
//! Moré-Garbow-Hillstrom set crawl for hundreds of iterations). After
//! [`CRAWL_ITERATIONS`] iterations in a row with `lambda` above `1 / CRAWL_RADIUS` the
//! scaling turns monotone ([`Scaling::Monotone`], Moré's in MINPACK), and those problems then
//! converge in about a hundred more. It is not monotone from the start because a scaling that
//! never shrinks keeps the damping of a wild start (NIST's MGH10 from its first start) forever.

use crate::compile::{CompiledProblem, Evaluation, KernelCache};
use crate::problem::Problem;
use crate::{Error, Precision};
use hal::{Backend, BackendExt};
use std::ops::ControlFlow;
use web_time::Instant;

mod cg;
mod cholesky;
mod device_schur;
mod kernel;
mod normal;
mod summary;

pub use summary::{IterationSummary, PhaseTimes, Summary};
mod host;
mod schur;

use cg::DeviceEngine;
use cholesky::CholeskyEngine;

/// The outer iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    LevenbergMarquardt,
    /// Undamped steps, halved (up to 10 times) until the cost decreases.
    GaussNewton,
}

/// How the normal equations are solved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearSolver {
    /// The dense Schur complement where the problem declares blocks to eliminate and the rest
    /// is small enough ([`AUTO_DENSE_SCHUR_MAX_REDUCED`]); else sparse Cholesky on the CPU
    /// backend and software adapters, and for problems with manifold blocks; else conjugate
    /// gradients on a GPU backend (from [`AUTO_CG_MIN_PARAMETERS`] parameters, where the backend runs the
    /// conjugate-gradient primitives in the solve's precision; sparse Cholesky on the host
    /// otherwise).
    Auto,
    SparseCholesky,
    ConjugateGradient,
    /// The Schur complement of the blocks the problem declares
    /// ([`Problem::set_eliminated`]), formed dense and factorised on the host (Ceres's
    /// `DENSE_SCHUR`): bundle adjustment with up to a few thousand camera parameters.
    DenseSchur,
    /// The same Schur complement formed on the device (one kernel per residual shape adding
    /// its instances' products atomically) and factorised on the host; the point, the step and
    /// the back substitution stay on the device, and only the reduced system crosses the bus.
    /// For problems without manifolds or bounds, on backends with atomics in the solve's
    /// precision; what `Auto` takes for [`LinearSolver::DenseSchur`]'s problems on a GPU.
    DeviceSchur,
    /// Ceres's `ITERATIVE_SCHUR`: conjugate gradients on the device on the reduced system
    /// without forming it, preconditioned by the inverses of its diagonal blocks (Schur-Jacobi:
    /// a camera's columns), for the problems [`LinearSolver::DeviceSchur`] takes; what `Auto`
    /// takes on a GPU where the reduced system is too large to form dense.
    IterativeSchur,
}

/// How the damping `D` in `J^T J + lambda D` is scaled (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scaling {
    #[default]
    /// Ceres's (the default): the current `diag(J^T J)`, clamped to `[1e-6, 1e32]` in the space Ceres's
    /// Jacobi scaling (fixed at the start) makes, which is a floor of `1e-6 (1 + sqrt(d0))^2`
    /// per parameter, `d0` its diagonal at the start.
    Ceres,
    /// MINPACK's: as Ceres's, but never below what it was at an earlier iteration.
    Monotone,
}

impl Scaling {
    /// The floor Ceres's clamp puts under a parameter's damping, from its diagonal at the
    /// start.
    pub(crate) fn first_floor(d0: f64) -> f64 {
        1e-6 * (1.0 + d0.max(0.0).sqrt()).powi(2)
    }
}

/// Iterations in a row with a trust radius below [`CRAWL_RADIUS`] after which the damping's
/// scaling turns monotone.
pub const CRAWL_ITERATIONS: usize = 50;

/// The trust radius below which the solve is crawling: `lambda D` at least `J^T J`'s own
/// diagonal, the steps shortened gradient steps.
pub const CRAWL_RADIUS: f64 = 1.0;

/// Why the solve stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Termination {
    /// The accepted step changed the cost by less than `function_tolerance` relative.
    FunctionTolerance,
    /// `max |J^T f| <= gradient_tolerance`.
    GradientTolerance,
    /// `|delta| <= parameter_tolerance (|x| + parameter_tolerance)`.
    ParameterTolerance,
    /// The trust region shrank below `1e-32` (or Gauss-Newton found no decrease).
    NoProgress,
    MaxIterations,
    /// The observer of [`solve_async`] asked to stop.
    Stopped,
    /// An error stopped the solve ([`Error::Failed`] carries it with this summary).
    Failure,
}

#[derive(Clone, Debug)]
pub struct SolveOptions {
    pub method: Method,
    pub linear_solver: LinearSolver,
    /// What the residuals, Jacobians and linear solves are computed in (`f64` by default).
    pub precision: Precision,
    pub max_iterations: usize,
    pub function_tolerance: f64,
    pub gradient_tolerance: f64,
    pub parameter_tolerance: f64,
    pub initial_trust_radius: f64,
    /// Conjugate gradients: the most iterations per outer step, the relative residual
    /// (`|r| <= eta |r0|` in the preconditioner's norm) that ends them, and how often the
    /// device reports `|r|` (every check is one scalar read).
    pub max_cg_iterations: usize,
    pub cg_tolerance: f64,
    pub cg_check_every: usize,
    /// Prints one line per iteration.
    pub verbose: bool,
}

impl SolveOptions {
    /// Checks every option: tolerances finite and not negative, the trust radius finite and
    /// positive, the conjugate-gradient settings usable. A bad option is an
    /// [`Error::InvalidOptions`] naming it, never a silent "converged".
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |what: &str, value: f64, rule: &str| {
            Err(Error::InvalidOptions(format!("{what} is {value}; {rule}")))
        };
        for (what, value) in [
            ("function_tolerance", self.function_tolerance),
            ("gradient_tolerance", self.gradient_tolerance),
            ("parameter_tolerance", self.parameter_tolerance),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return bad(what, value, "it must be finite and at least 0");
            }
        }
        let radius = self.initial_trust_radius;
        if !(radius.is_finite() && radius > 0.0) {
            return bad(
                "initial_trust_radius",
                radius,
                "it must be finite and greater than 0",
            );
        }
        let uses_cg = matches!(
            self.linear_solver,
            LinearSolver::Auto | LinearSolver::ConjugateGradient | LinearSolver::IterativeSchur
        );
        if uses_cg && !(self.cg_tolerance.is_finite() && self.cg_tolerance > 0.0) {
            return bad(
                "cg_tolerance",
                self.cg_tolerance,
                "it must be finite and greater than 0",
            );
        }
        if uses_cg && (self.max_cg_iterations == 0 || self.cg_check_every == 0) {
            return Err(Error::InvalidOptions(format!(
                "max_cg_iterations ({}) and cg_check_every ({}) must be at least 1",
                self.max_cg_iterations, self.cg_check_every
            )));
        }
        Ok(())
    }
}

impl Default for SolveOptions {
    fn default() -> Self {
        Self {
            method: Method::LevenbergMarquardt,
            linear_solver: LinearSolver::Auto,
            precision: Precision::F64,
            // Ill-conditioned fits need hundreds (NIST's MGH17 from its first start: 582, as
            // C++ Ceres with the same tolerances).
            max_iterations: 2000,
            // Far tighter than Ceres's 1e-6 and 1e-8: the solve goes on while f64 still
            // resolves progress, since in a flat valley a small relative change of the cost or
            // the parameters can still leave them far from the minimum (the first
            // Moré-Garbow-Hillstrom problems reach their minima to 1e-10 with these, not with
            // Ceres's). The cost's tolerance sits at f64's rounding: near a large-residual
            // minimum the cost is quadratic in the parameters' error, so a relative change of
            // 1e-14 still leaves ill-determined parameters wrong in their sixth digit (NIST's
            // ENSO); the parameter tolerance ends those solves. Loosen them for speed. In f32
            // they are at least 1e-7 and 1e-8, its rounding (see `Precision::F32`).
            function_tolerance: 1e-16,
            gradient_tolerance: 1e-10,
            parameter_tolerance: 1e-14,
            initial_trust_radius: 1e4,
            max_cg_iterations: 200,
            cg_tolerance: 1e-2,
            cg_check_every: 10,
            verbose: false,
        }
    }
}

/// One outer step's linear solve.
struct Step {
    /// `L(0) - L(delta)` of the linear model.
    model_reduction: f64,
    step_norm: f64,
    x_norm: f64,
    cg_iterations: usize,
}

/// The current point and the candidate the last step proposes, with their evaluations and
/// costs; accepting a step swaps the two (nothing is copied). `X` holds the parameters: host
/// `f64` for the Cholesky engine, a device buffer for the conjugate-gradient one.
struct Iterates<B: Backend, X> {
    x: X,
    x_candidate: X,
    current: Evaluation<B>,
    candidate: Evaluation<B>,
    cost: f64,
    candidate_cost: f64,
    times: PhaseTimes,
}

impl<B: Backend, X> Iterates<B, X> {
    fn new(compiled: &CompiledProblem<B>, x: X, x_candidate: X) -> Result<Self, Error> {
        Ok(Self {
            x,
            x_candidate,
            current: compiled.alloc_evaluation()?,
            candidate: compiled.alloc_evaluation()?,
            cost: 0.0,
            candidate_cost: 0.0,
            times: PhaseTimes::default(),
        })
    }
}

/// What the trust-region loop needs from a linear-algebra engine.
trait Engine {
    type B: Backend;
    type Point;
    fn state(&self) -> &Iterates<Self::B, Self::Point>;
    fn state_mut(&mut self) -> &mut Iterates<Self::B, Self::Point>;
    fn compiled(&self) -> &CompiledProblem<Self::B>;
    /// Evaluates at `x_candidate` into the candidate buffers; the cost there (not finite
    /// where a residual or Jacobian entry there is not).
    async fn evaluate_candidate(&mut self) -> Result<f64, Error>;
    /// Forms what the linear solves need at the current point; returns `max |J^T f|`.
    async fn linearize(&mut self) -> Result<f64, Error>;
    /// Solves for the step and sets `x_candidate = x + delta`.
    async fn solve(&mut self, lambda: f64) -> Result<Step, Error>;
    /// Scales the last step (Gauss-Newton's halving).
    async fn scale_step(&mut self, factor: f64) -> Result<(), Error>;
    /// Changes how the damping is scaled from the next linearization on.
    fn set_scaling(&mut self, scaling: Scaling);
    async fn parameters(&self) -> Result<Vec<f64>, Error>;

    fn cost(&self) -> f64 {
        self.state().cost
    }

    /// Evaluates at `x + delta`; the cost there, NaN when any residual or Jacobian entry is
    /// not finite (such a point is never accepted: the next linear solve would read it).
    async fn try_step(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let cost = self.evaluate_candidate().await?;
        let s = self.state_mut();
        s.times.evaluate += t.elapsed().as_secs_f64();
        s.candidate_cost = if cost.is_finite() { cost } else { f64::NAN };
        Ok(s.candidate_cost)
    }

    /// Makes the last candidate the current point.
    fn accept(&mut self) {
        let s = self.state_mut();
        std::mem::swap(&mut s.current, &mut s.candidate);
        std::mem::swap(&mut s.x, &mut s.x_candidate);
        s.cost = s.candidate_cost;
    }

    /// Evaluates the starting point (a new engine's `x_candidate`) and makes it current; a
    /// residual that is not finite there is an error naming its block.
    async fn start(&mut self, problem: &Problem) -> Result<(), Error> {
        if self.try_step().await?.is_nan() {
            return Err(non_finite(self.compiled(), problem, &self.state().candidate).await);
        }
        self.accept();
        Ok(())
    }
}

/// What [`solve_async`] shows its observer after each iteration whose step it evaluated
/// (each row of [`Summary::history`] but those of failed factorisations).
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// The iteration's row of the summary.
    pub iteration: &'a IterationSummary,
    /// The parameters of the current point (the last accepted one), as
    /// [`Problem::parameters`] holds them.
    pub parameters: &'a [f64],
}

/// Called by [`solve_async`] after each iteration; [`ControlFlow::Break`] ends the solve
/// there ([`Termination::Stopped`]).
pub type Observer<'a> = &'a mut dyn FnMut(Progress<'_>) -> ControlFlow<()>;

/// Solves `problem` on `backend`, writing the solution into the problem's parameters.
///
/// Errors: bad options ([`Error::InvalidOptions`]) and problems that cannot be compiled are
/// returned before anything runs. An error once the solve has started (a residual, Jacobian
/// entry or cost that is not finite at the starting point, a device error, a failed
/// factorisation) is an [`Error::Failed`] carrying the [`Summary`] so far (iterations, the
/// last accepted cost, [`Termination::Failure`]); the problem's parameters are then those of
/// the last accepted step (the start if none was).
pub fn solve<B: Backend>(
    backend: &B,
    problem: &mut Problem,
    options: &SolveOptions,
    cache: &KernelCache<B>,
) -> Result<Summary, Error> {
    // Every native backend's reads are ready at once, so this runs straight through.
    pollster::block_on(solve_async(backend, problem, options, cache, None))
}

/// [`solve`] as a future, for a caller that must not block: in a browser on WebGPU each read
/// of a cost or scalar awaits the page's event loop (see [`hal::Backend::read_bytes_async`]),
/// so the page stays live and can draw while the solve runs. The same loop and engines as
/// [`solve`], which is this future run to completion.
///
/// `observer`, where given, is called after each iteration whose step was evaluated (the last
/// one included) with that iteration's summary row and the current parameters, the step
/// taken where it was accepted (read from the device for the engines that keep them there:
/// one read per iteration), and may stop the solve.
pub async fn solve_async<B: Backend>(
    backend: &B,
    problem: &mut Problem,
    options: &SolveOptions,
    cache: &KernelCache<B>,
    observer: Option<Observer<'_>>,
) -> Result<Summary, Error> {
    options.validate()?;
    problem.check_bounds()?;
    if options.method == Method::GaussNewton && problem.has_bounds() {
        // As in Ceres, where bounds need the trust-region minimizer: a projected Gauss-Newton
        // step need not descend, and halving it cannot fix that.
        return Err(Error::InvalidOptions(
            "parameter bounds need Method::LevenbergMarquardt (Gauss-Newton's halving cannot \
             keep a projected step descending)"
                .into(),
        ));
    }
    let started = Instant::now();
    let compiled = CompiledProblem::new(backend, problem, cache, options.precision)?;
    let compile_seconds = compiled.report.compile_seconds
        + compiled.report.upload_seconds
        + compiled.report.structure_seconds;
    let on_cpu = backend.info().kind == hal::DeviceKind::Cpu;
    let device_schur =
        !on_cpu && device_schur::applies(backend, problem, options.precision).is_ok();
    let linear_solver = match options.linear_solver {
        LinearSolver::Auto if device_schur && dense_schur_fits(problem) => {
            LinearSolver::DeviceSchur
        }
        LinearSolver::Auto if device_schur => LinearSolver::IterativeSchur,
        LinearSolver::Auto if dense_schur_fits(problem) => LinearSolver::DenseSchur,
        LinearSolver::Auto if on_cpu => LinearSolver::SparseCholesky,
        // A software adapter (lavapipe, a browser's SwiftShader) runs the device engine's
        // hundreds of small dispatches on the CPU anyway: factorising there is faster (the
        // icosphere at level 5 in Chromium on SwiftShader: 0.6 iterations/s against 0.046).
        LinearSolver::Auto if backend.info().kind == hal::DeviceKind::Software => {
            LinearSolver::SparseCholesky
        }
        LinearSolver::Auto if !cg_runs_in(backend, options.precision) => {
            LinearSolver::SparseCholesky
        }
        // The device engine's Jacobi preconditioner leaves pose graphs' coupled rotations
        // unresolved (sphere2500 on an H200: 200 iterations without reaching the cost the
        // factorisation reaches in 14); until a block preconditioner, problems with manifold
        // blocks factorise on the host.
        LinearSolver::Auto if problem.has_manifolds() => LinearSolver::SparseCholesky,
        LinearSolver::Auto if problem.parameters().len() < AUTO_CG_MIN_PARAMETERS => {
            LinearSolver::SparseCholesky
        }
        LinearSolver::Auto => LinearSolver::ConjugateGradient,
        other => other,
    };
    let report = compiled.report.clone();
    let (rows, nnz) = (compiled.rows, compiled.nnz);
    let mut summary = Summary {
        backend: backend.info().name,
        method: options.method,
        linear_solver,
        precision: options.precision,
        parameters: problem.parameters().len(),
        columns: compiled.cols,
        residual_blocks: problem.num_blocks(),
        residuals: rows,
        jacobian_entries: nnz,
        iterations: 0,
        accepted_steps: 0,
        cg_iterations: 0,
        initial_cost: 0.0,
        final_cost: 0.0,
        termination: Termination::MaxIterations,
        compile: report,
        times: PhaseTimes::default(),
        history: Vec::new(),
        monotone_scaling_from: None,
    };
    summary.times.compile = compile_seconds;
    let (outcome, solution) = match linear_solver {
        LinearSolver::SparseCholesky => {
            let engine = CholeskyEngine::new(compiled, problem);
            drive(engine, problem, options, (&mut summary, started), observer).await
        }
        LinearSolver::DenseSchur => {
            let engine = schur::SchurEngine::new(compiled, problem);
            drive(engine, problem, options, (&mut summary, started), observer).await
        }
        LinearSolver::DeviceSchur | LinearSolver::IterativeSchur => {
            let iterative = linear_solver == LinearSolver::IterativeSchur;
            let engine =
                device_schur::DeviceSchurEngine::new(compiled, problem, options, iterative);
            drive(engine, problem, options, (&mut summary, started), observer).await
        }
        _ => {
            let engine = DeviceEngine::new(compiled, problem, options);
            drive(engine, problem, options, (&mut summary, started), observer).await
        }
    };
    if let Some(solution) = solution {
        problem.parameters_mut().copy_from_slice(&solution);
    }
    summary.times.total = started.elapsed().as_secs_f64();
    match outcome {
        Ok(()) => Ok(summary),
        Err(source) => {
            summary.termination = Termination::Failure;
            if summary.accepted_steps == 0 && !summary.final_cost.is_finite() {
                summary.final_cost = summary.initial_cost;
            }
            Err(Error::Failed {
                source: Box::new(source),
                summary: Box::new(summary),
            })
        }
    }
}

/// `LinearSolver::Auto` takes the dense Schur complement where the problem declares blocks to
/// eliminate and the other parameters number at most this many (the dense reduced system's
/// factorisation grows with their cube).
pub const AUTO_DENSE_SCHUR_MAX_REDUCED: usize = 2500;

fn dense_schur_fits(problem: &Problem) -> bool {
    let Some((_, size, count)) = problem.eliminated() else {
        return false;
    };
    schur::applies(problem).is_ok()
        && problem.parameters().len() - size * count <= AUTO_DENSE_SCHUR_MAX_REDUCED
}

/// `LinearSolver::Auto` on a GPU backend factorises on the host below this many parameters:
/// there the exact step costs less than the device's conjugate-gradient launches, and small
/// problems are the ones solved to their last digits.
pub const AUTO_CG_MIN_PARAMETERS: usize = 4096;

/// Whether the device engine's primitives run in `precision` on `backend` (every backend runs
/// them in `f32`; `f64` needs them in [`hal::Capabilities::f64`]) and its kernels' buffers
/// fit the device's bindings (a browser's WebGPU may bind as few as 8).
fn cg_runs_in<B: Backend>(backend: &B, precision: Precision) -> bool {
    const USES: [&str; 7] = [
        "fill", "unary", "binary", "reduce", "gather", "spmv_csr", "launch",
    ];
    if backend.capabilities().program_buffers < cg::kernel_buffers(precision) {
        return false;
    }
    match precision {
        Precision::F32 => true,
        Precision::F64 => {
            let f64 = backend.capabilities().f64;
            USES.iter().all(|op| f64.primitive(op))
        }
    }
}

/// Starts a new engine at the problem's parameters and runs the trust-region loop; returns how
/// it ended and the parameters of the last accepted point (`None` when the engine could not
/// start or they cannot be read).
async fn drive<E: Engine>(
    engine: Result<E, Error>,
    problem: &Problem,
    options: &SolveOptions,
    (summary, started): (&mut Summary, Instant),
    observer: Option<Observer<'_>>,
) -> (Result<(), Error>, Option<Vec<f64>>) {
    let mut engine = match engine {
        Ok(engine) => engine,
        Err(e) => {
            summary.initial_cost = f64::NAN;
            summary.final_cost = f64::NAN;
            return (Err(e), None);
        }
    };
    if let Err(e) = engine.start(problem).await {
        summary.initial_cost = f64::NAN;
        summary.final_cost = f64::NAN;
        return (Err(e), None);
    }
    // Engines that compile kernels of their own have counted them already.
    engine.state_mut().times.compile += summary.times.compile;
    let run = trust_region(&mut engine, options, (summary, started), observer).await;
    summary.times = engine.state().times.clone();
    // On an error the loop stopped early: the current point is the last accepted one.
    summary.final_cost = engine.cost();
    match engine.parameters().await {
        Ok(p) => (run, Some(p)),
        Err(e) => (run.and(Err(e)), None),
    }
}

/// The outer loop. `started` is when the solve began (before compiling and the engine's
/// analysis), so each iteration's `cumulative_time` counts everything a caller waited for.
async fn trust_region(
    engine: &mut impl Engine,
    options: &SolveOptions,
    (summary, started): (&mut Summary, Instant),
    mut observer: Option<Observer<'_>>,
) -> Result<(), Error> {
    summary.initial_cost = engine.cost();
    if options.verbose {
        println!("{}", Summary::ITERATION_HEADER);
    }
    let mut radius = options.initial_trust_radius;
    let mut nu = 2.0;
    let mut crawling = 0;
    let mut max_gradient = engine.linearize().await?;
    summary.termination = Termination::MaxIterations;
    for iteration in 0..options.max_iterations {
        if max_gradient <= options.gradient_tolerance {
            summary.termination = Termination::GradientTolerance;
            break;
        }
        summary.iterations = iteration + 1;
        let lambda = match options.method {
            Method::LevenbergMarquardt => 1.0 / radius,
            // A whisper of damping keeps gauge freedoms (a rotation of the whole problem, say)
            // from making the system singular.
            Method::GaussNewton => 1e-9,
        };
        let step = match engine.solve(lambda).await {
            Ok(step) => step,
            // As Ceres: a factorisation that fails is a rejected step; damp more.
            Err(Error::NotPositiveDefinite(_)) if options.method == Method::LevenbergMarquardt => {
                let record = IterationSummary {
                    iteration,
                    cost: engine.cost(),
                    candidate_cost: f64::NAN,
                    cost_change: f64::NAN,
                    gradient_max_norm: max_gradient,
                    step_norm: 0.0,
                    relative_decrease: f64::NEG_INFINITY,
                    trust_region_radius: radius,
                    linear_solver_iterations: 0,
                    step_is_successful: false,
                    cumulative_time: started.elapsed().as_secs_f64(),
                };
                if options.verbose {
                    let previous = summary.history.last().map_or(0.0, |r| r.cumulative_time);
                    println!("{}", record.line(record.cumulative_time - previous));
                }
                summary.history.push(record);
                radius /= nu;
                nu *= 2.0;
                if radius < 1e-32 {
                    summary.termination = Termination::NoProgress;
                    break;
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        summary.cg_iterations += step.cg_iterations;
        let parameter_tolerance = options
            .parameter_tolerance
            .max(options.precision.parameter_tolerance_floor());
        if step.step_norm <= parameter_tolerance * (step.x_norm + parameter_tolerance) {
            summary.termination = Termination::ParameterTolerance;
            break;
        }
        let cost = engine.cost();
        let mut new_cost = engine.try_step().await?;
        let mut model_reduction = step.model_reduction;
        let mut step_norm = step.step_norm;
        if options.method == Method::GaussNewton {
            let mut halvings = 0;
            while new_cost.partial_cmp(&cost) != Some(std::cmp::Ordering::Less) && halvings < 10 {
                engine.scale_step(0.5).await?;
                model_reduction *= 0.5;
                step_norm *= 0.5;
                new_cost = engine.try_step().await?;
                halvings += 1;
            }
        }
        let ratio = if new_cost.is_finite() && model_reduction > 0.0 {
            (cost - new_cost) / model_reduction
        } else {
            f64::NEG_INFINITY
        };
        let accepted = match options.method {
            Method::LevenbergMarquardt => ratio > 1e-3,
            Method::GaussNewton => new_cost < cost,
        };
        let record = IterationSummary {
            iteration,
            cost,
            candidate_cost: new_cost,
            cost_change: cost - new_cost,
            gradient_max_norm: max_gradient,
            step_norm,
            relative_decrease: ratio,
            trust_region_radius: radius,
            linear_solver_iterations: step.cg_iterations,
            step_is_successful: accepted,
            cumulative_time: started.elapsed().as_secs_f64(),
        };
        if options.verbose {
            let previous = summary.history.last().map_or(0.0, |r| r.cumulative_time);
            println!("{}", record.line(record.cumulative_time - previous));
        }
        summary.history.push(record);
        if accepted {
            engine.accept();
            summary.accepted_steps += 1;
        }
        if let Some(observe) = observer.as_deref_mut() {
            let parameters = engine.parameters().await?;
            let iteration = summary.history.last().expect("pushed above");
            if observe(Progress {
                iteration,
                parameters: &parameters,
            })
            .is_break()
            {
                summary.termination = Termination::Stopped;
                break;
            }
        }
        if accepted {
            radius = (radius / (1.0f64 / 3.0).max(1.0 - (2.0 * ratio - 1.0).powi(3))).min(1e16);
            nu = 2.0;
            let function_tolerance = options
                .function_tolerance
                .max(options.precision.function_tolerance_floor());
            if (cost - new_cost).abs() <= function_tolerance * cost {
                summary.termination = Termination::FunctionTolerance;
                break;
            }
            max_gradient = engine.linearize().await?;
        } else {
            if options.method == Method::GaussNewton {
                summary.termination = Termination::NoProgress;
                break;
            }
            radius /= nu;
            nu *= 2.0;
            if radius < 1e-32 {
                summary.termination = Termination::NoProgress;
                break;
            }
        }
        crawling = if radius < CRAWL_RADIUS {
            crawling + 1
        } else {
            0
        };
        if crawling >= CRAWL_ITERATIONS && summary.monotone_scaling_from.is_none() {
            engine.set_scaling(Scaling::Monotone);
            summary.monotone_scaling_from = Some(iteration + 1);
        }
    }
    summary.final_cost = engine.cost();
    Ok(())
}

/// Finds the first residual or Jacobian entry that is not finite and names its block.
async fn non_finite<B: Backend>(
    compiled: &CompiledProblem<B>,
    problem: &Problem,
    eval: &Evaluation<B>,
) -> Error {
    let b = &compiled.backend;
    let (residuals, jacobian) = match (
        b.read_f64_async(&eval.residuals).await,
        b.read_f64_async(&eval.jacobian).await,
    ) {
        (Ok(r), Ok(j)) => (r, j),
        (Err(e), _) | (_, Err(e)) => return e.into(),
    };
    let offsets = &compiled.host_row_offsets;
    for row in 0..compiled.rows {
        let entries = &jacobian[offsets[row] as usize..offsets[row + 1] as usize];
        let what = if !residuals[row].is_finite() {
            "residual"
        } else if entries.iter().any(|v| !v.is_finite()) {
            "Jacobian"
        } else {
            continue;
        };
        let Some((block, residual)) = problem.locate_row(row) else {
            break;
        };
        return Error::NonFinite {
            name: problem.block_name(block).unwrap_or("?").to_string(),
            block,
            residual,
            what,
        };
    }
    // Finite residuals and Jacobian: a block's cost (its robust loss) or their sum is not.
    let costs = match b.read_f64_async(&eval.cost).await {
        Ok(c) => c,
        Err(e) => return e.into(),
    };
    if let Some(block) = costs
        .iter()
        .take(compiled.blocks)
        .position(|c| !c.is_finite())
        .and_then(|entry| problem.locate_cost(entry))
    {
        return Error::NonFinite {
            name: problem.block_name(block).unwrap_or("?").to_string(),
            block,
            residual: 0,
            what: "cost",
        };
    }
    Error::Solver(
        "the total cost overflows at the starting point (every block's cost is finite; their \
         sum is not): scale the residuals down"
            .into(),
    )
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}
