//! Parameter bounds, as Ceres's `SetParameterLowerBound`/`SetParameterUpperBound`: steps are
//! projected onto them, a solve ends on the bound where the unconstrained minimum lies beyond,
//! and bad bounds or an infeasible start are refused before anything runs.

mod common;

use backend_cpu::CpuBackend;
use common::rosenbrock;
use residual_compile::{
    Error, KernelCache, LinearSolver, Loss, Method, Problem, SolveOptions, Termination, solve,
};

fn engines() -> [(Method, LinearSolver); 2] {
    [
        (Method::LevenbergMarquardt, LinearSolver::SparseCholesky),
        (Method::LevenbergMarquardt, LinearSolver::ConjugateGradient),
    ]
}

#[test]
fn a_bound_holds_and_the_solve_ends_on_it() {
    let cpu = CpuBackend::new();
    for (method, solver) in engines() {
        // x <= 0.5 cuts off the minimum at (1, 1): the constrained one is (0.5, 0.25), cost
        // (1 - 0.5)^2 / 2 = 0.125.
        let mut p = rosenbrock();
        p.set_upper_bound(0, 0.5).unwrap();
        let options = SolveOptions {
            method,
            linear_solver: solver,
            max_iterations: 300,
            ..SolveOptions::default()
        };
        let s = solve(&cpu, &mut p, &options, &KernelCache::new())
            .unwrap_or_else(|e| panic!("{method:?}/{solver:?}: {e}"));
        let x = p.parameters();
        let what = format!("{method:?}/{solver:?}: x = {x:?}, {s}");
        assert!(x[0] <= 0.5, "{what}");
        assert!((x[0] - 0.5).abs() < 1e-4, "{what}");
        assert!((x[1] - 0.25).abs() < 1e-3, "{what}");
        assert!((s.final_cost - 0.125).abs() < 1e-4, "{what}");
        // Every step the history records stayed feasible: its cost never fell below the
        // constrained minimum.
        assert!(
            s.history
                .iter()
                .all(|r| r.candidate_cost.is_nan() || r.candidate_cost >= 0.125 - 1e-6),
            "{what}"
        );
    }
}

#[test]
fn a_lower_bound_beyond_the_minimum_moves_it() {
    let cpu = CpuBackend::new();
    // r = x - 3 from x = 5 with x >= 4: the minimum sits on the bound.
    let mut p = Problem::new();
    p.add_parameters(&[5.0]);
    p.add_residual("line", &[0], &[3.0], Loss::Trivial, |v, c| {
        vec![v[0] - c[0]]
    })
    .unwrap();
    p.set_lower_bound(0, 4.0).unwrap();
    for (method, solver) in engines() {
        let mut q = Problem::new();
        q.add_parameters(&[5.0]);
        q.add_residual("line", &[0], &[3.0], Loss::Trivial, |v, c| {
            vec![v[0] - c[0]]
        })
        .unwrap();
        q.set_lower_bound(0, 4.0).unwrap();
        let options = SolveOptions {
            method,
            linear_solver: solver,
            ..SolveOptions::default()
        };
        let s = solve(&cpu, &mut q, &options, &KernelCache::new()).unwrap();
        assert_eq!(q.parameters()[0], 4.0, "{method:?}/{solver:?}");
        // On the bound the gradient (1) points out of the feasible set: the projected
        // gradient, Ceres's test, is 0 there.
        assert_eq!(
            s.termination,
            Termination::GradientTolerance,
            "{method:?}/{solver:?}: {s}"
        );
    }
    assert_eq!(p.bounds(0), (4.0, f64::INFINITY));
}

#[test]
fn bad_bounds_and_infeasible_starts_are_refused() {
    let cpu = CpuBackend::new();
    let mut p = rosenbrock();
    assert!(matches!(
        p.set_lower_bound(0, f64::NAN),
        Err(Error::InvalidProblem(_))
    ));
    assert!(matches!(
        p.set_upper_bound(7, 1.0),
        Err(Error::InvalidProblem(_))
    ));
    // The start (-1.2) lies outside [-1, 2].
    p.set_lower_bound(0, -1.0).unwrap();
    p.set_upper_bound(0, 2.0).unwrap();
    let err = solve(&cpu, &mut p, &SolveOptions::default(), &KernelCache::new()).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidProblem(m) if m.contains("outside its bounds")),
        "{err}"
    );
    assert_eq!(p.parameters(), &[-1.2, 1.0], "nothing ran");
    // Gauss-Newton cannot keep to bounds (as in Ceres, they need the trust region).
    let mut g = rosenbrock();
    g.set_upper_bound(0, 0.5).unwrap();
    let gn = SolveOptions {
        method: Method::GaussNewton,
        ..SolveOptions::default()
    };
    let err = solve(&cpu, &mut g, &gn, &KernelCache::new()).unwrap_err();
    assert!(matches!(err, Error::InvalidOptions(_)), "{err}");
    // Crossed bounds.
    let mut q = rosenbrock();
    q.set_lower_bound(1, 3.0).unwrap();
    q.set_upper_bound(1, 2.0).unwrap();
    let err = solve(&cpu, &mut q, &SolveOptions::default(), &KernelCache::new()).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidProblem(m) if m.contains("above upper bound")),
        "{err}"
    );
}
