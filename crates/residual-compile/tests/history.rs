//! The per-iteration history a solve reports (Ceres's `IterationSummary`): one record per
//! iteration that proposed a step, consistent with the summary's totals and with itself.

mod common;

use backend_cpu::CpuBackend;
use common::rosenbrock;
use residual_compile::{KernelCache, LinearSolver, Method, SolveOptions, solve};

#[test]
fn the_history_records_every_step_and_agrees_with_the_summary() {
    let cpu = CpuBackend::new();
    for (method, solver) in [
        (Method::LevenbergMarquardt, LinearSolver::SparseCholesky),
        (Method::LevenbergMarquardt, LinearSolver::ConjugateGradient),
        (Method::GaussNewton, LinearSolver::SparseCholesky),
    ] {
        let mut p = rosenbrock();
        let options = SolveOptions {
            method,
            linear_solver: solver,
            max_iterations: 200,
            ..SolveOptions::default()
        };
        let s = solve(&cpu, &mut p, &options, &KernelCache::new()).unwrap();
        let h = &s.history;
        let what = format!("{method:?} / {solver:?}");
        assert!(!h.is_empty(), "{what}: no history");
        // Every iteration counted proposed a step; only the last may end on a tolerance first.
        assert!(
            h.len() == s.iterations || h.len() + 1 == s.iterations,
            "{what}: {} records for {} iterations",
            h.len(),
            s.iterations
        );
        assert_eq!(h[0].cost, s.initial_cost, "{what}");
        assert_eq!(
            h.iter().filter(|r| r.step_is_successful).count(),
            s.accepted_steps,
            "{what}"
        );
        for (k, r) in h.iter().enumerate() {
            assert_eq!(r.iteration, k, "{what}");
            assert!(
                r.gradient_max_norm.is_finite() && r.step_norm >= 0.0,
                "{what}: {r:?}"
            );
            assert_eq!(r.cost_change, r.cost - r.candidate_cost, "{what}: {r:?}");
            if r.step_is_successful {
                assert!(r.candidate_cost < r.cost, "{what}: accepted a rise: {r:?}");
            }
            // The next iteration starts where this one left: at the candidate if accepted.
            if let Some(next) = h.get(k + 1) {
                let expected = if r.step_is_successful {
                    r.candidate_cost
                } else {
                    r.cost
                };
                assert_eq!(next.cost, expected, "{what}: iteration {}", k + 1);
                assert!(next.cumulative_time >= r.cumulative_time, "{what}");
            }
        }
        // Rosenbrock's minimum is 0 at (1, 1).
        assert!(s.final_cost < 1e-8, "{what}: {}", s.final_cost);
        let report = s.iteration_report();
        assert_eq!(report.lines().count(), h.len() + 1, "{what}:\n{report}");
        assert!(report.starts_with("iter"), "{what}");
    }
}
