//! Levenberg-Marquardt (Ceres-style trust region) and Gauss-Newton over a compiled problem.
//!
//! Two ways to solve the normal equations `(J^T J + lambda D) delta = -J^T f`:
//! - [`LinearSolver::SparseCholesky`]: `J^T J` assembled on the host in `f64` and factorised
//!   by `faer`'s supernodal sparse Cholesky (the symbolic analysis once, the numeric
//!   factorisation per iteration). Exact; the CPU backend's default.
//! - [`LinearSolver::ConjugateGradient`]: matrix-free preconditioned conjugate gradients on the
//!   device (Jacobi preconditioner, `J` and `J^T` as CSR mat-vecs), reading back a few
//!   scalars per check. The GPU backends' default.
//!
//! The trust region follows Ceres: `lambda = 1 / radius`; a step is accepted when the actual
//! cost decrease is at least `1e-3` of the decrease the linear model predicts; then
//! `radius /= max(1/3, 1 - (2 rho - 1)^3)`, otherwise `radius /= nu, nu *= 2`. `D` is
//! `diag(J^T J)` clamped to `[1e-6, 1e32]`.

use crate::Error;
use crate::compile::{CompiledProblem, Evaluation, KernelCache};
use crate::problem::Problem;
use hal::ir::{Access, Program, ProgramBuilder};
use hal::{Backend, BackendExt, BinaryOp, Csr, DType, Layout, ReduceOp, UnaryOp, View};
use std::fmt;
use std::time::Instant;

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
    /// Sparse Cholesky on the CPU backend, conjugate gradients on a GPU backend.
    Auto,
    SparseCholesky,
    ConjugateGradient,
}

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
    /// An error stopped the solve ([`Error::Failed`] carries it with this summary).
    Failure,
}

#[derive(Clone, Debug)]
pub struct SolveOptions {
    pub method: Method,
    pub linear_solver: LinearSolver,
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
        let uses_cg = self.linear_solver != LinearSolver::SparseCholesky;
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
            max_iterations: 500,
            // The device evaluates in f32: relative cost changes below ~1e-7 are rounding.
            function_tolerance: 1e-7,
            gradient_tolerance: 1e-10,
            parameter_tolerance: 1e-8,
            initial_trust_radius: 1e4,
            max_cg_iterations: 200,
            cg_tolerance: 1e-2,
            cg_check_every: 10,
            verbose: false,
        }
    }
}

/// Seconds spent per phase.
#[derive(Clone, Debug, Default)]
pub struct PhaseTimes {
    /// Kernel compilation, upload of the problem and its Jacobian structure
    /// ([`crate::CompileReport`]).
    pub compile: f64,
    /// Residual and Jacobian evaluation (including reading the cost).
    pub evaluate: f64,
    /// Forming the gradient and `J^T J` (or `J^T` on the device).
    pub linearize: f64,
    /// Factorising and solving, or the conjugate-gradient iterations.
    pub linear_solve: f64,
    pub total: f64,
}

/// A Ceres-like report of a solve.
#[derive(Clone, Debug)]
pub struct Summary {
    pub backend: String,
    pub method: Method,
    pub linear_solver: LinearSolver,
    pub parameters: usize,
    pub residual_blocks: usize,
    pub residuals: usize,
    pub jacobian_entries: usize,
    pub iterations: usize,
    pub accepted_steps: usize,
    pub cg_iterations: usize,
    pub initial_cost: f64,
    pub final_cost: f64,
    pub termination: Termination,
    pub compile: crate::CompileReport,
    pub times: PhaseTimes,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Solver summary ({})", self.backend)?;
        writeln!(
            f,
            "  problem: {} parameters, {} residual blocks, {} residuals, {} Jacobian entries",
            self.parameters, self.residual_blocks, self.residuals, self.jacobian_entries
        )?;
        writeln!(
            f,
            "  kernels: {} compiled, {} cache hits",
            self.compile.kernels_compiled, self.compile.cache_hits
        )?;
        for g in &self.compile.groups {
            writeln!(
                f,
                "    {:<16} signature {:016x}: {} instances x {} residuals x {} parameters ({} index runs), {} traced nodes, {}",
                g.name,
                g.signature,
                g.instances,
                g.residuals_per_instance,
                g.params_per_instance,
                g.index_runs,
                g.traced_nodes,
                if g.cache_hit {
                    "cache hit".to_string()
                } else {
                    format!("{} IR instructions", g.ir_instructions)
                }
            )?;
        }
        writeln!(
            f,
            "  method: {:?} with {:?}",
            self.method, self.linear_solver
        )?;
        writeln!(
            f,
            "  iterations: {} ({} accepted){}",
            self.iterations,
            self.accepted_steps,
            if self.cg_iterations > 0 {
                format!(", {} conjugate-gradient iterations", self.cg_iterations)
            } else {
                String::new()
            }
        )?;
        writeln!(f, "  initial cost: {:.9e}", self.initial_cost)?;
        writeln!(f, "  final cost:   {:.9e}", self.final_cost)?;
        writeln!(f, "  termination:  {:?}", self.termination)?;
        let t = &self.times;
        write!(
            f,
            "  time: {:.3} s total = compile {:.3} + evaluate {:.3} + linearize {:.3} + linear solve {:.3} + other {:.3}",
            t.total,
            t.compile,
            t.evaluate,
            t.linearize,
            t.linear_solve,
            (t.total - t.compile - t.evaluate - t.linearize - t.linear_solve).max(0.0)
        )
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
    /// Evaluates at `x_candidate` into the candidate buffers; the cost there, and whether
    /// every Jacobian entry there is finite.
    fn evaluate_candidate(&mut self) -> Result<(f64, bool), Error>;
    /// Forms what the linear solves need at the current point; returns `max |J^T f|`.
    fn linearize(&mut self) -> Result<f64, Error>;
    /// Solves for the step and sets `x_candidate = x + delta`.
    fn solve(&mut self, lambda: f64) -> Result<Step, Error>;
    /// Scales the last step (Gauss-Newton's halving).
    fn scale_step(&mut self, factor: f64) -> Result<(), Error>;
    fn parameters(&self) -> Result<Vec<f64>, Error>;

    fn cost(&self) -> f64 {
        self.state().cost
    }

    /// Evaluates at `x + delta`; the cost there, NaN when any residual or Jacobian entry is
    /// not finite (such a point is never accepted: the next linear solve would read it).
    fn try_step(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let (cost, jacobian_finite) = self.evaluate_candidate()?;
        let s = self.state_mut();
        s.times.evaluate += t.elapsed().as_secs_f64();
        s.candidate_cost = if cost.is_finite() && jacobian_finite {
            cost
        } else {
            f64::NAN
        };
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
    fn start(&mut self, problem: &Problem) -> Result<(), Error> {
        if self.try_step()?.is_nan() {
            return Err(non_finite(
                self.compiled(),
                problem,
                &self.state().candidate,
            ));
        }
        self.accept();
        Ok(())
    }
}

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
    options.validate()?;
    let started = Instant::now();
    let compiled = CompiledProblem::new(backend, problem, cache)?;
    let compile_seconds = compiled.report.compile_seconds
        + compiled.report.upload_seconds
        + compiled.report.structure_seconds;
    let linear_solver = match options.linear_solver {
        LinearSolver::Auto if backend.info().kind == hal::DeviceKind::Cpu => {
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
        parameters: problem.parameters().len(),
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
    };
    summary.times.compile = compile_seconds;
    let (outcome, solution) = match linear_solver {
        LinearSolver::SparseCholesky => drive(
            CholeskyEngine::new(compiled, problem),
            options,
            &mut summary,
        ),
        _ => drive(
            DeviceEngine::new(compiled, problem, options),
            options,
            &mut summary,
        ),
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

/// Runs the trust-region loop on a new engine; returns how it ended and the parameters of
/// the last accepted point (`None` when the engine could not start or they cannot be read).
fn drive<E: Engine>(
    engine: Result<E, Error>,
    options: &SolveOptions,
    summary: &mut Summary,
) -> (Result<(), Error>, Option<Vec<f64>>) {
    let mut engine = match engine {
        Ok(engine) => engine,
        Err(e) => {
            summary.initial_cost = f64::NAN;
            summary.final_cost = f64::NAN;
            return (Err(e), None);
        }
    };
    engine.state_mut().times.compile = summary.times.compile;
    let run = trust_region(&mut engine, options, summary);
    summary.times = engine.state().times.clone();
    // On an error the loop stopped early: the current point is the last accepted one.
    summary.final_cost = engine.cost();
    match engine.parameters() {
        Ok(p) => (run, Some(p)),
        Err(e) => (run.and(Err(e)), None),
    }
}

fn trust_region(
    engine: &mut impl Engine,
    options: &SolveOptions,
    summary: &mut Summary,
) -> Result<(), Error> {
    summary.initial_cost = engine.cost();
    let mut radius = options.initial_trust_radius;
    let mut nu = 2.0;
    let mut max_gradient = engine.linearize()?;
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
        let step = engine.solve(lambda)?;
        summary.cg_iterations += step.cg_iterations;
        if step.step_norm
            <= options.parameter_tolerance * (step.x_norm + options.parameter_tolerance)
        {
            summary.termination = Termination::ParameterTolerance;
            break;
        }
        let cost = engine.cost();
        let mut new_cost = engine.try_step()?;
        let mut model_reduction = step.model_reduction;
        if options.method == Method::GaussNewton {
            let mut halvings = 0;
            while new_cost.partial_cmp(&cost) != Some(std::cmp::Ordering::Less) && halvings < 10 {
                engine.scale_step(0.5)?;
                model_reduction *= 0.5;
                new_cost = engine.try_step()?;
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
        if options.verbose {
            println!(
                "  iter {:>4}  cost {:.9e}  candidate {:.9e}  ratio {:>9.3e}  radius {:.3e}  |step| {:.3e}  cg {}  {}",
                iteration,
                cost,
                new_cost,
                ratio,
                radius,
                step.step_norm,
                step.cg_iterations,
                if accepted { "accepted" } else { "rejected" }
            );
        }
        if accepted {
            engine.accept();
            summary.accepted_steps += 1;
            radius = (radius / (1.0f64 / 3.0).max(1.0 - (2.0 * ratio - 1.0).powi(3))).min(1e16);
            nu = 2.0;
            if (cost - new_cost).abs() <= options.function_tolerance * cost {
                summary.termination = Termination::FunctionTolerance;
                break;
            }
            max_gradient = engine.linearize()?;
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
    }
    summary.final_cost = engine.cost();
    Ok(())
}

/// Finds the first residual or Jacobian entry that is not finite and names its block.
fn non_finite<B: Backend>(
    compiled: &CompiledProblem<B>,
    problem: &Problem,
    eval: &Evaluation<B>,
) -> Error {
    let b = &compiled.backend;
    let (residuals, jacobian) = match (
        b.read::<f32>(&eval.residuals),
        b.read::<f32>(&eval.jacobian),
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
    let costs = match b.read::<f32>(&eval.cost) {
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
        "the total cost overflows f32 at the starting point (every block's cost is finite; \
         their sum is not): scale the residuals down"
            .into(),
    )
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

// ---------------------------------------------------------------------------------------------
// Sparse Cholesky on the host.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::sparse::linalg::cholesky::{
    LltRef, SymbolicCholesky, SymmetricOrdering, factorize_symbolic_cholesky,
};
use faer::sparse::{SparseColMatRef, SymbolicSparseColMat};
use faer::{Conj, Par, Side};

struct CholeskyEngine<B: Backend> {
    compiled: CompiledProblem<B>,
    params_buf: B::Buffer,
    it: Iterates<B, Vec<f64>>,
    /// The damped normal matrix's values, rewritten each solve.
    damped: Vec<f64>,
    /// Problem parameter -> index among free parameters (`u32::MAX` when fixed).
    free_index: Vec<u32>,
    /// `J^T J` over the free parameters: lower triangle, CSC.
    normal: SymbolicSparseColMat<u32>,
    symbolic: SymbolicCholesky<u32>,
    /// The numeric factorisation on all cores, when faer's analysis is supernodal.
    parallel: Option<crate::supernodal::ParallelCholesky>,
    /// The factor's values and the factorisation's scratch, kept between iterations.
    factor: Vec<f64>,
    scratch: MemBuffer,
    /// Per instance of each group, the slot in `normal`'s values of each pair `(a, b)`,
    /// `b <= a`, of its parameter slots (`u32::MAX` when either is fixed).
    pair_slots: Vec<Vec<u32>>,
    normal_values: Vec<f64>,
    gradient: Vec<f64>,
    diagonal: Vec<f64>,
    delta: Vec<f64>,
    problem_groups: Vec<(usize, usize, usize)>,
}

impl<B: Backend> CholeskyEngine<B> {
    fn new(compiled: CompiledProblem<B>, problem: &Problem) -> Result<Self, Error> {
        let x = problem.parameters().to_vec();
        let fixed = problem.fixed_mask();
        let mut free_index = vec![u32::MAX; x.len()];
        let mut free = 0u32;
        for (i, f) in fixed.iter().enumerate() {
            if !f {
                free_index[i] = free;
                free += 1;
            }
        }
        let n = free as usize;
        // The pattern of J^T J: for each instance, every pair of its free parameters.
        let mut columns: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut problem_groups = Vec::new();
        for g in problem.groups() {
            let p = g.params_per_instance();
            problem_groups.push((g.len(), g.residuals_per_instance(), p));
            for inst in g.param_index.chunks_exact(p) {
                for &a in inst {
                    for &b in inst {
                        let (fa, fb) = (free_index[a as usize], free_index[b as usize]);
                        if fa != u32::MAX && fb != u32::MAX && fa >= fb {
                            columns[fb as usize].push(fa);
                        }
                    }
                }
            }
        }
        let mut col_ptr = vec![0u32; n + 1];
        let mut row_idx = Vec::new();
        for (c, rows) in columns.iter_mut().enumerate() {
            rows.push(c as u32); // the diagonal, even for a parameter no residual touches
            rows.sort_unstable();
            rows.dedup();
            row_idx.extend_from_slice(rows);
            col_ptr[c + 1] = row_idx.len() as u32;
        }
        let slot = |row: u32, col: u32| -> u32 {
            let (s, e) = (
                col_ptr[col as usize] as usize,
                col_ptr[col as usize + 1] as usize,
            );
            s as u32
                + row_idx[s..e]
                    .binary_search(&row)
                    .expect("pattern has the pair") as u32
        };
        let mut pair_slots = Vec::new();
        for g in problem.groups() {
            let p = g.params_per_instance();
            let mut slots = Vec::with_capacity(g.len() * p * (p + 1) / 2);
            for inst in g.param_index.chunks_exact(p) {
                for a in 0..p {
                    for b in 0..=a {
                        let (fa, fb) = (free_index[inst[a] as usize], free_index[inst[b] as usize]);
                        slots.push(if fa == u32::MAX || fb == u32::MAX {
                            u32::MAX
                        } else {
                            slot(fa.max(fb), fa.min(fb))
                        });
                    }
                }
            }
            pair_slots.push(slots);
        }
        drop(columns);
        let nnz_normal = row_idx.len();
        let normal = SymbolicSparseColMat::new_checked(n, n, col_ptr, None, row_idx);
        let symbolic = factorize_symbolic_cholesky(
            normal.as_ref(),
            Side::Lower,
            SymmetricOrdering::Amd,
            Default::default(),
        )
        .map_err(|e| Error::Solver(format!("sparse Cholesky analysis failed: {e:?}")))?;
        // The numeric factorisation spreads subtrees over the cores (`supernodal`); faer's own
        // splits only inside supernodes, which are too small here for that to pay. faer
        // factors only when it chose its simplicial method (small problems).
        let parallel = crate::supernodal::ParallelCholesky::new(normal.as_ref(), &symbolic);
        let scratch = MemBuffer::try_new(
            symbolic
                .factorize_numeric_llt_scratch::<f64>(Par::Seq, Default::default())
                .or(symbolic.solve_in_place_scratch::<f64>(1, Par::Seq)),
        )
        .map_err(|_| Error::Solver("out of memory for the sparse Cholesky scratch".into()))?;
        let factor = vec![0.0; symbolic.len_val()];
        let backend = compiled.backend.clone();
        let params_buf = backend.alloc(DType::F32, x.len().max(1))?;
        let mut engine = Self {
            params_buf,
            it: Iterates::new(&compiled, x.clone(), x)?,
            damped: vec![0.0; nnz_normal],
            free_index,
            normal,
            symbolic,
            parallel,
            factor,
            scratch,
            pair_slots,
            normal_values: vec![0.0; nnz_normal],
            gradient: vec![0.0; n],
            diagonal: vec![0.0; n],
            delta: vec![0.0; n],
            problem_groups,
            compiled,
        };
        engine.start(problem)?;
        Ok(engine)
    }
}

impl<B: Backend> Engine for CholeskyEngine<B> {
    type B = B;
    type Point = Vec<f64>;

    fn state(&self) -> &Iterates<B, Vec<f64>> {
        &self.it
    }

    fn state_mut(&mut self) -> &mut Iterates<B, Vec<f64>> {
        &mut self.it
    }

    fn compiled(&self) -> &CompiledProblem<B> {
        &self.compiled
    }

    /// The cost summed in f64 on the host from the per-block costs.
    fn evaluate_candidate(&mut self) -> Result<(f64, bool), Error> {
        let b = &self.compiled.backend;
        let xs: Vec<f32> = self.it.x_candidate.iter().map(|&v| v as f32).collect();
        if !xs.is_empty() {
            b.write(&self.params_buf, &xs)?;
        }
        self.compiled
            .evaluate(&self.params_buf, &self.it.candidate)?;
        let costs = b.read::<f32>(&self.it.candidate.cost)?;
        let jacobian_sum = b.read::<f32>(&self.it.candidate.total)?[1];
        Ok((
            costs.iter().map(|&c| c as f64).sum(),
            jacobian_sum.is_finite(),
        ))
    }

    fn linearize(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let b = &self.compiled.backend;
        let residuals = b.read::<f32>(&self.it.current.residuals)?;
        let jacobian = b.read::<f32>(&self.it.current.jacobian)?;
        self.normal_values.iter_mut().for_each(|v| *v = 0.0);
        self.gradient.iter_mut().for_each(|v| *v = 0.0);
        let cols = &self.compiled.host_col_indices;
        let (mut row, mut entry) = (0usize, 0usize);
        let mut jrow = [0f64; 64];
        for (gi, &(n, r, p)) in self.problem_groups.iter().enumerate() {
            let slots = &self.pair_slots[gi];
            let pairs = p * (p + 1) / 2;
            for inst in 0..n {
                let inst_slots = &slots[inst * pairs..(inst + 1) * pairs];
                for _ in 0..r {
                    let f = residuals[row] as f64;
                    let js = &jacobian[entry..entry + p];
                    for k in 0..p {
                        let jk = js[k] as f64;
                        if p <= 64 {
                            jrow[k] = jk;
                        }
                        let fi = self.free_index[cols[entry + k] as usize];
                        if fi != u32::MAX {
                            self.gradient[fi as usize] += jk * f;
                        }
                    }
                    let mut s = 0;
                    for a in 0..p {
                        let ja = if p <= 64 { jrow[a] } else { js[a] as f64 };
                        for bb in 0..=a {
                            let slot = inst_slots[s];
                            s += 1;
                            if slot != u32::MAX {
                                let jb = if p <= 64 { jrow[bb] } else { js[bb] as f64 };
                                // A pair (a, b) with a != b whose parameters share a free
                                // index cannot occur: parameters appear once per block.
                                self.normal_values[slot as usize] += ja * jb;
                            }
                        }
                    }
                    row += 1;
                    entry += p;
                }
            }
        }
        // The diagonal of J^T J, clamped as Ceres does.
        // Each column's first stored row is the diagonal (rows are sorted, and every column
        // holds its diagonal).
        let col_ptr = self.normal.col_ptr();
        for (d, &start) in self.diagonal.iter_mut().zip(col_ptr) {
            *d = self.normal_values[start as usize].clamp(1e-6, 1e32);
        }
        self.it.times.linearize += t.elapsed().as_secs_f64();
        Ok(self.gradient.iter().fold(0.0, |m, g| m.max(g.abs())))
    }

    fn solve(&mut self, lambda: f64) -> Result<Step, Error> {
        let t = Instant::now();
        self.damped.copy_from_slice(&self.normal_values);
        let col_ptr = self.normal.col_ptr();
        for (&start, &d) in col_ptr.iter().zip(&self.diagonal) {
            self.damped[start as usize] += lambda * d;
        }
        let not_positive = |what: String| {
            Error::Solver(format!(
                "sparse Cholesky failed ({what}): J^T J + lambda D is not positive definite (lambda = {lambda:e}); a parameter no residual constrains? fix it with Problem::set_fixed"
            ))
        };
        let llt = match &mut self.parallel {
            Some(parallel) => {
                parallel
                    .factorize(&self.damped, &mut self.factor)
                    .map_err(|column| not_positive(format!("pivot of free parameter {column}")))?;
                LltRef::new(&self.symbolic, &self.factor)
            }
            None => self
                .symbolic
                .factorize_numeric_llt::<f64>(
                    &mut self.factor,
                    SparseColMatRef::new(self.normal.as_ref(), &self.damped),
                    Side::Lower,
                    Default::default(),
                    Par::Seq,
                    MemStack::new(&mut self.scratch),
                    Default::default(),
                )
                .map_err(|e| not_positive(format!("{e:?}")))?,
        };
        self.delta
            .iter_mut()
            .zip(&self.gradient)
            .for_each(|(d, g)| *d = -g);
        let n = self.delta.len();
        llt.solve_in_place_with_conj(
            Conj::No,
            faer::MatMut::from_column_major_slice_mut(&mut self.delta, n, 1),
            Par::Seq,
            MemStack::new(&mut self.scratch),
        );
        // L(0) - L(delta) = -g.delta - |J delta|^2 / 2, and |J delta|^2 = delta^T (J^T J) delta.
        let jtj_quad = symmetric_quadratic(&self.normal, &self.normal_values, &self.delta);
        let g_dot: f64 = self
            .gradient
            .iter()
            .zip(&self.delta)
            .map(|(g, d)| g * d)
            .sum();
        self.it.x_candidate.copy_from_slice(&self.it.x);
        for (i, &fi) in self.free_index.iter().enumerate() {
            if fi != u32::MAX {
                self.it.x_candidate[i] += self.delta[fi as usize];
            }
        }
        self.it.times.linear_solve += t.elapsed().as_secs_f64();
        Ok(Step {
            model_reduction: -g_dot - 0.5 * jtj_quad,
            step_norm: norm(&self.delta),
            x_norm: norm(&self.it.x),
            cg_iterations: 0,
        })
    }

    fn scale_step(&mut self, factor: f64) -> Result<(), Error> {
        self.delta.iter_mut().for_each(|d| *d *= factor);
        for (i, &fi) in self.free_index.iter().enumerate() {
            if fi != u32::MAX {
                self.it.x_candidate[i] = self.it.x[i] + self.delta[fi as usize];
            }
        }
        Ok(())
    }

    fn parameters(&self) -> Result<Vec<f64>, Error> {
        Ok(self.it.x.clone())
    }
}

/// `v^T A v` for symmetric `A` stored as its lower triangle.
fn symmetric_quadratic(a: &SymbolicSparseColMat<u32>, values: &[f64], v: &[f64]) -> f64 {
    let (col_ptr, row_idx) = (a.col_ptr(), a.row_idx());
    let mut total = 0.0;
    for c in 0..v.len() {
        for k in col_ptr[c] as usize..col_ptr[c + 1] as usize {
            let r = row_idx[k] as usize;
            let term = values[k] * v[r] * v[c];
            total += if r == c { term } else { 2.0 * term };
        }
    }
    total
}

// ---------------------------------------------------------------------------------------------
// Conjugate gradients on the device.

/// Scalars the CG kernels share, in one small device buffer.
mod slot {
    pub const RZ: u32 = 0;
    pub const PQ: u32 = 1;
    pub const ALPHA: u32 = 2;
    pub const RZ_NEW: u32 = 3;
    pub const LAMBDA: u32 = 4;
    pub const JD2: u32 = 5;
    pub const GD: u32 = 6;
    pub const GMAX: u32 = 7;
    pub const LEN: usize = 8;
}

struct CgKernels<B: Backend> {
    start: B::Kernel,
    q: B::Kernel,
    alpha: B::Kernel,
    update: B::Kernel,
    beta: B::Kernel,
    direction: B::Kernel,
}

fn cg_programs() -> hal::Result<[Program; 6]> {
    use hal::ir::IrCmp;
    let f32r = |b: &mut ProgramBuilder| b.buffer(DType::F32, Access::Read);
    let f32w = |b: &mut ProgramBuilder| b.buffer(DType::F32, Access::Write);
    let f32rw = |b: &mut ProgramBuilder| b.buffer(DType::F32, Access::ReadWrite);
    let scalar = |b: &mut ProgramBuilder, buf, k: u32| {
        let at = b.const_u32(k);
        b.load(buf, at)
    };
    // scal[num] / scal[den] where the denominator is positive, 0 otherwise.
    let safe_ratio = |b: &mut ProgramBuilder, buf, num: u32, den: u32| {
        let (n, d) = (scalar(b, buf, num), scalar(b, buf, den));
        let zero = b.const_f32(0.0);
        let positive = b.cmp(IrCmp::Gt, d, zero);
        let ratio = b.div(n, d);
        b.select(positive, ratio, zero)
    };

    // start: r = -g m; M = diag + lambda dd (1 when fixed); z = r / M; p = z; delta = 0;
    // parts = r z; damp = lambda dd m; minv = m / M.
    let mut b = ProgramBuilder::new("lm_cg_start");
    let (g, diag, mask, scal) = (f32r(&mut b), f32r(&mut b), f32r(&mut b), f32r(&mut b));
    let (r, z, p, delta, parts, damp, minv) = (
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
    );
    let i = b.index();
    let lambda = scalar(&mut b, scal, slot::LAMBDA);
    let (gi, di, mi) = (b.load(g, i), b.load(diag, i), b.load(mask, i));
    let lo = b.const_f32(1e-6);
    let hi = b.const_f32(1e32);
    let dd = b.binary(hal::ir::IrBinary::Max, di, lo);
    let dd = b.binary(hal::ir::IrBinary::Min, dd, hi);
    let m_full = b.fma(lambda, dd, di);
    let zero = b.const_f32(0.0);
    let is_free = b.cmp(IrCmp::Gt, mi, zero);
    let one = b.const_f32(1.0);
    let m_diag = b.select(is_free, m_full, one);
    let ng = b.unary(hal::ir::IrUnary::Neg, gi);
    let ri = b.mul(ng, mi);
    let inv = b.div(mi, m_diag);
    let zi = b.mul(ri, inv);
    b.store(r, i, ri);
    b.store(z, i, zi);
    b.store(p, i, zi);
    b.store(delta, i, zero);
    let rz = b.mul(ri, zi);
    b.store(parts, i, rz);
    let ld = b.mul(lambda, dd);
    let dmp = b.mul(ld, mi);
    b.store(damp, i, dmp);
    b.store(minv, i, inv);
    let start = b.build()?;

    // q = m (q + damp p); parts = p q.
    let mut b = ProgramBuilder::new("lm_cg_q");
    let (q, p, damp, mask, parts) = (
        f32rw(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32w(&mut b),
    );
    let i = b.index();
    let (qi, pi, di, mi) = (b.load(q, i), b.load(p, i), b.load(damp, i), b.load(mask, i));
    let s = b.fma(di, pi, qi);
    let s = b.mul(s, mi);
    b.store(q, i, s);
    let pq = b.mul(pi, s);
    b.store(parts, i, pq);
    let q_program = b.build()?;

    // alpha = pq > 0 ? rz / pq : 0 (one thread).
    let mut b = ProgramBuilder::new("lm_cg_alpha");
    let scal = f32rw(&mut b);
    let alpha = safe_ratio(&mut b, scal, slot::RZ, slot::PQ);
    let at = b.const_u32(slot::ALPHA);
    b.store(scal, at, alpha);
    let alpha_program = b.build()?;

    // delta += alpha p; r -= alpha q; z = r minv; parts = r z.
    let mut b = ProgramBuilder::new("lm_cg_update");
    let (delta, r, z, p, q, minv, scal, parts) = (
        f32rw(&mut b),
        f32rw(&mut b),
        f32w(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32w(&mut b),
    );
    let i = b.index();
    let alpha = scalar(&mut b, scal, slot::ALPHA);
    let (di, ri, pi, qi, mi) = (
        b.load(delta, i),
        b.load(r, i),
        b.load(p, i),
        b.load(q, i),
        b.load(minv, i),
    );
    let dn = b.fma(alpha, pi, di);
    b.store(delta, i, dn);
    let na = b.unary(hal::ir::IrUnary::Neg, alpha);
    let rn = b.fma(na, qi, ri);
    b.store(r, i, rn);
    let zn = b.mul(rn, mi);
    b.store(z, i, zn);
    let rz = b.mul(rn, zn);
    b.store(parts, i, rz);
    let update = b.build()?;

    // beta = rz_new / rz; rz = rz_new (one thread).
    let mut b = ProgramBuilder::new("lm_cg_beta");
    let scal = f32rw(&mut b);
    let beta = safe_ratio(&mut b, scal, slot::RZ_NEW, slot::RZ);
    let at = b.const_u32(slot::ALPHA); // alpha is dead until the next q: beta reuses it
    b.store(scal, at, beta);
    let rz_new = scalar(&mut b, scal, slot::RZ_NEW);
    let at = b.const_u32(slot::RZ);
    b.store(scal, at, rz_new);
    let beta_program = b.build()?;

    // p = z + beta p.
    let mut b = ProgramBuilder::new("lm_cg_direction");
    let (p, z, scal) = (f32rw(&mut b), f32r(&mut b), f32r(&mut b));
    let i = b.index();
    let beta = scalar(&mut b, scal, slot::ALPHA);
    let (pi, zi) = (b.load(p, i), b.load(z, i));
    let pn = b.fma(beta, pi, zi);
    b.store(p, i, pn);
    let direction = b.build()?;

    Ok([
        start,
        q_program,
        alpha_program,
        update,
        beta_program,
        direction,
    ])
}

struct DeviceEngine<B: Backend> {
    compiled: CompiledProblem<B>,
    kernels: CgKernels<B>,
    options: SolveOptions,
    it: Iterates<B, B::Buffer>,
    jt_values: B::Buffer,
    jt_squared: B::Buffer,
    ones: B::Buffer,
    mask: B::Buffer,
    gradient: B::Buffer,
    diagonal: B::Buffer,
    delta: B::Buffer,
    r: B::Buffer,
    z: B::Buffer,
    p: B::Buffer,
    q: B::Buffer,
    t: B::Buffer,
    damp: B::Buffer,
    minv: B::Buffer,
    parts: B::Buffer,
    scalars: B::Buffer,
}

impl<B: Backend> DeviceEngine<B> {
    fn new(
        compiled: CompiledProblem<B>,
        problem: &Problem,
        options: &SolveOptions,
    ) -> Result<Self, Error> {
        let b = compiled.backend.clone();
        let programs = cg_programs()?;
        let kernels = CgKernels {
            start: b.compile(&programs[0])?,
            q: b.compile(&programs[1])?,
            alpha: b.compile(&programs[2])?,
            update: b.compile(&programs[3])?,
            beta: b.compile(&programs[4])?,
            direction: b.compile(&programs[5])?,
        };
        let (n, rows, nnz) = (compiled.cols.max(1), compiled.rows, compiled.nnz);
        let vec_n = || b.alloc(DType::F32, n);
        let x: Vec<f32> = problem.parameters().iter().map(|&v| v as f32).collect();
        let mask: Vec<f32> = problem
            .fixed_mask()
            .iter()
            .map(|&f| if f { 0.0 } else { 1.0 })
            .collect();
        // The start goes in as the candidate: `start` evaluates it and makes it current.
        let start = if x.is_empty() {
            vec_n()?
        } else {
            b.upload(&x)?
        };
        let mut engine = Self {
            it: Iterates::new(&compiled, vec_n()?, start)?,
            jt_values: b.alloc(DType::F32, nnz.max(1))?,
            jt_squared: b.alloc(DType::F32, nnz.max(1))?,
            ones: {
                let o = b.alloc(DType::F32, rows.max(1))?;
                b.fill(View::new(&o, &Layout::contiguous(&[rows.max(1)])), 1.0)?;
                o
            },
            mask: if mask.is_empty() {
                vec_n()?
            } else {
                b.upload(&mask)?
            },
            gradient: vec_n()?,
            diagonal: vec_n()?,
            delta: vec_n()?,
            r: vec_n()?,
            z: vec_n()?,
            p: vec_n()?,
            q: vec_n()?,
            t: b.alloc(DType::F32, rows.max(1))?,
            damp: vec_n()?,
            minv: vec_n()?,
            parts: b.alloc(DType::F32, n.max(rows))?,
            scalars: b.alloc(DType::F32, slot::LEN)?,
            options: options.clone(),
            kernels,
            compiled,
        };
        engine.start(problem)?;
        Ok(engine)
    }

    fn csr<'a>(&'a self, values: &'a B::Buffer) -> Csr<'a, B::Buffer> {
        Csr {
            rows: self.compiled.rows,
            cols: self.compiled.cols,
            row_offsets: &self.compiled.row_offsets,
            col_indices: &self.compiled.col_indices,
            values,
        }
    }

    fn csr_t<'a>(&'a self, values: &'a B::Buffer) -> Csr<'a, B::Buffer> {
        Csr {
            rows: self.compiled.cols,
            cols: self.compiled.rows,
            row_offsets: &self.compiled.t_row_offsets,
            col_indices: &self.compiled.t_col_indices,
            values,
        }
    }

    /// `scalars[at] = sum(a * b)` over `len` elements (`parts` as scratch).
    fn dot_into(&self, a: &B::Buffer, b: &B::Buffer, len: usize, at: u32) -> Result<(), Error> {
        let be = &self.compiled.backend;
        let l = Layout::contiguous(&[len]);
        be.binary(
            BinaryOp::Mul,
            View::new(a, &l),
            View::new(b, &l),
            View::new(&self.parts, &l),
        )?;
        self.sum_parts_into(len, at)
    }

    fn sum_parts_into(&self, len: usize, at: u32) -> Result<(), Error> {
        let l = Layout::contiguous(&[len]);
        let out = Layout::strided(&[1], &[1], at as usize)?;
        self.compiled.backend.reduce(
            ReduceOp::Sum,
            View::new(&self.parts, &l),
            &[0],
            View::new(&self.scalars, &out),
        )?;
        Ok(())
    }
}

impl<B: Backend> Engine for DeviceEngine<B> {
    type B = B;
    type Point = B::Buffer;

    fn state(&self) -> &Iterates<B, B::Buffer> {
        &self.it
    }

    fn state_mut(&mut self) -> &mut Iterates<B, B::Buffer> {
        &mut self.it
    }

    fn compiled(&self) -> &CompiledProblem<B> {
        &self.compiled
    }

    /// The cost summed on the device; one scalar read.
    fn evaluate_candidate(&mut self) -> Result<(f64, bool), Error> {
        self.compiled
            .evaluate(&self.it.x_candidate, &self.it.candidate)?;
        let total = self
            .compiled
            .backend
            .read::<f32>(&self.it.candidate.total)?;
        Ok((total[0] as f64, total[1].is_finite()))
    }

    fn linearize(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let be = self.compiled.backend.clone();
        let (n, nnz) = (self.compiled.cols, self.compiled.nnz);
        let ln = Layout::contiguous(&[nnz]);
        let lp = Layout::contiguous(&[self.compiled.nnz]);
        be.gather(
            View::new(&self.it.current.jacobian, &ln),
            0,
            View::new(&self.compiled.transpose_perm, &lp),
            View::new(&self.jt_values, &ln),
        )?;
        be.unary(
            UnaryOp::Square,
            View::new(&self.jt_values, &ln),
            View::new(&self.jt_squared, &ln),
        )?;
        be.spmv_csr(
            self.csr_t(&self.jt_values),
            &self.it.current.residuals,
            &self.gradient,
            1.0,
            0.0,
        )?;
        be.spmv_csr(
            self.csr_t(&self.jt_squared),
            &self.ones,
            &self.diagonal,
            1.0,
            0.0,
        )?;
        // max |g| over the free parameters.
        let l = Layout::contiguous(&[n]);
        be.binary(
            BinaryOp::Mul,
            View::new(&self.gradient, &l),
            View::new(&self.mask, &l),
            View::new(&self.parts, &l),
        )?;
        be.unary(
            UnaryOp::Abs,
            View::new(&self.parts, &l),
            View::new(&self.parts, &l),
        )?;
        let out = Layout::strided(&[1], &[1], slot::GMAX as usize)?;
        be.reduce(
            ReduceOp::Max,
            View::new(&self.parts, &l),
            &[0],
            View::new(&self.scalars, &out),
        )?;
        let s = be.read::<f32>(&self.scalars)?;
        self.it.times.linearize += t.elapsed().as_secs_f64();
        Ok(s[slot::GMAX as usize] as f64)
    }

    fn solve(&mut self, lambda: f64) -> Result<Step, Error> {
        let t = Instant::now();
        let be = self.compiled.backend.clone();
        let (n, rows) = (self.compiled.cols, self.compiled.rows);
        let k = &self.kernels;
        let scalars_init = [0f32, 0.0, 0.0, 0.0, lambda as f32, 0.0, 0.0, 0.0];
        be.write(&self.scalars, &scalars_init)?;
        be.launch(
            &k.start,
            &[
                &self.gradient,
                &self.diagonal,
                &self.mask,
                &self.scalars,
                &self.r,
                &self.z,
                &self.p,
                &self.delta,
                &self.parts,
                &self.damp,
                &self.minv,
            ],
            n,
        )?;
        self.sum_parts_into(n, slot::RZ)?;
        let rz0 = be.read::<f32>(&self.scalars)?[slot::RZ as usize] as f64;
        let target = rz0 * self.options.cg_tolerance * self.options.cg_tolerance;
        let mut iterations = 0;
        if rz0 > 0.0 {
            while iterations < self.options.max_cg_iterations {
                be.spmv_csr(
                    self.csr(&self.it.current.jacobian),
                    &self.p,
                    &self.t,
                    1.0,
                    0.0,
                )?;
                be.spmv_csr(self.csr_t(&self.jt_values), &self.t, &self.q, 1.0, 0.0)?;
                be.launch(
                    &k.q,
                    &[&self.q, &self.p, &self.damp, &self.mask, &self.parts],
                    n,
                )?;
                self.sum_parts_into(n, slot::PQ)?;
                be.launch(&k.alpha, &[&self.scalars], 1)?;
                be.launch(
                    &k.update,
                    &[
                        &self.delta,
                        &self.r,
                        &self.z,
                        &self.p,
                        &self.q,
                        &self.minv,
                        &self.scalars,
                        &self.parts,
                    ],
                    n,
                )?;
                self.sum_parts_into(n, slot::RZ_NEW)?;
                be.launch(&k.beta, &[&self.scalars], 1)?;
                be.launch(&k.direction, &[&self.p, &self.z, &self.scalars], n)?;
                iterations += 1;
                if iterations % self.options.cg_check_every.max(1) == 0 {
                    let rz = be.read::<f32>(&self.scalars)?[slot::RZ as usize] as f64;
                    if rz <= target {
                        break;
                    }
                }
            }
        }
        // The model reduction -g.delta - |J delta|^2 / 2, and the norms, from one read.
        be.spmv_csr(
            self.csr(&self.it.current.jacobian),
            &self.delta,
            &self.t,
            1.0,
            0.0,
        )?;
        self.dot_into(&self.t, &self.t, rows, slot::JD2)?;
        self.dot_into(&self.gradient, &self.delta, n, slot::GD)?;
        self.dot_into(&self.delta, &self.delta, n, slot::PQ)?;
        self.dot_into(&self.it.x, &self.it.x, n, slot::ALPHA)?;
        let l = Layout::contiguous(&[n]);
        be.binary(
            BinaryOp::Add,
            View::new(&self.it.x, &l),
            View::new(&self.delta, &l),
            View::new(&self.it.x_candidate, &l),
        )?;
        let s = be.read::<f32>(&self.scalars)?;
        self.it.times.linear_solve += t.elapsed().as_secs_f64();
        let (jd2, gd) = (s[slot::JD2 as usize] as f64, s[slot::GD as usize] as f64);
        Ok(Step {
            model_reduction: -gd - 0.5 * jd2,
            step_norm: (s[slot::PQ as usize] as f64).sqrt(),
            x_norm: (s[slot::ALPHA as usize] as f64).sqrt(),
            cg_iterations: iterations,
        })
    }

    fn scale_step(&mut self, factor: f64) -> Result<(), Error> {
        let be = &self.compiled.backend;
        let l = Layout::contiguous(&[self.compiled.cols]);
        be.unary(
            UnaryOp::Affine {
                scale: factor as f32,
                shift: 0.0,
            },
            View::new(&self.delta, &l),
            View::new(&self.delta, &l),
        )?;
        be.binary(
            BinaryOp::Add,
            View::new(&self.it.x, &l),
            View::new(&self.delta, &l),
            View::new(&self.it.x_candidate, &l),
        )?;
        Ok(())
    }

    fn parameters(&self) -> Result<Vec<f64>, Error> {
        let x = self.compiled.backend.read::<f32>(&self.it.x)?;
        Ok(x.iter()
            .take(self.compiled.cols)
            .map(|&v| v as f64)
            .collect())
    }
}
