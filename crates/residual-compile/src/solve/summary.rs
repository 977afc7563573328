//! What a solve reports: per-phase times, per-iteration figures and the Ceres-like summary.

use super::{LinearSolver, Method, Termination};
use crate::Precision;
use std::fmt;

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

/// One iteration of the trust-region loop, as Ceres's `IterationSummary` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct IterationSummary {
    /// 0-based.
    pub iteration: usize,
    /// The cost at the start of the iteration.
    pub cost: f64,
    /// The cost at the proposed point (NaN where a residual or Jacobian entry there is not
    /// finite).
    pub candidate_cost: f64,
    /// `cost - candidate_cost`: the actual reduction.
    pub cost_change: f64,
    /// `max |J^T f|` at the start of the iteration.
    pub gradient_max_norm: f64,
    /// `|delta|` of the proposed step (after Gauss-Newton's halvings).
    pub step_norm: f64,
    /// The actual over the linear model's predicted reduction.
    pub relative_decrease: f64,
    /// The trust radius the step was solved with (Levenberg-Marquardt's `1 / lambda`).
    pub trust_region_radius: f64,
    /// Conjugate-gradient iterations of the step's linear solve (0 for Cholesky).
    pub linear_solver_iterations: usize,
    pub step_is_successful: bool,
    /// Seconds since the solve began (compilation, upload and the linear solver's analysis
    /// included), at the end of the iteration.
    pub cumulative_time: f64,
}

/// A Ceres-like report of a solve.
#[derive(Clone, Debug)]
pub struct Summary {
    pub backend: String,
    pub method: Method,
    pub linear_solver: LinearSolver,
    /// What the solve evaluated and solved in.
    pub precision: Precision,
    /// Stored parameter values.
    pub parameters: usize,
    /// Jacobian columns: the parameters, but for manifold blocks, which count their tangent
    /// size (a quaternion 3, not 4).
    pub columns: usize,
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
    /// Every iteration's figures, in order (the iterations a solve ends in without a step,
    /// on the gradient or parameter tolerance, are not in it).
    pub history: Vec<IterationSummary>,
    /// The iteration from which the damping's scaling was monotone, if the solve crawled
    /// ([`Scaling`](super::Scaling)).
    pub monotone_scaling_from: Option<usize>,
}

impl Summary {
    /// The heading of [`Summary::iteration_report`]'s table.
    pub const ITERATION_HEADER: &'static str = "iter           cost  cost_change |gradient|     |step|   tr_ratio tr_radius ls_iter iter_time total_time";

    /// The per-iteration table, a line per iteration, in the form of Ceres's report (a `*`
    /// before the iteration's time marks a rejected step).
    pub fn iteration_report(&self) -> String {
        let mut out = format!("{}\n", Self::ITERATION_HEADER);
        let mut previous = 0.0;
        for it in &self.history {
            out.push_str(&it.line(it.cumulative_time - previous));
            out.push('\n');
            previous = it.cumulative_time;
        }
        out
    }
}

impl IterationSummary {
    /// The iteration as a line of [`Summary::iteration_report`], `seconds` its own time.
    pub(super) fn line(&self, seconds: f64) -> String {
        format!(
            "{:>4} {:>14.6e} {:>12.2e} {:>10.2e} {:>10.2e} {:>10.2e} {:>9.2e} {:>6} {}{:>9.2e} {:>10.2e}",
            self.iteration,
            self.cost,
            self.cost_change,
            self.gradient_max_norm,
            self.step_norm,
            self.relative_decrease,
            self.trust_region_radius,
            self.linear_solver_iterations,
            if self.step_is_successful { ' ' } else { '*' },
            seconds,
            self.cumulative_time
        )
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Solver summary ({})", self.backend)?;
        writeln!(
            f,
            "  problem: {} parameters{}, {} residual blocks, {} residuals, {} Jacobian entries",
            self.parameters,
            if self.columns == self.parameters {
                String::new()
            } else {
                format!(" ({} tangent columns)", self.columns)
            },
            self.residual_blocks,
            self.residuals,
            self.jacobian_entries
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
            "  method: {:?} with {:?}, in {}",
            self.method,
            self.linear_solver,
            self.precision.name()
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
        if let Some(i) = self.monotone_scaling_from {
            writeln!(
                f,
                "  damping:      Ceres's scaling, monotone (MINPACK's) from iteration {i}"
            )?;
        }
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
