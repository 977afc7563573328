//! The solver's failure paths: a step whose Jacobian is not finite is rejected (not accepted
//! and then misdiagnosed), bad options are refused up front, an error after the start still
//! reports a summary and leaves the last accepted parameters, and errors name the real block.

use backend_cpu::CpuBackend;
use residual_compile::{
    Error, KernelCache, LinearSolver, Loss, Precision, Problem, SolveOptions, Termination, solve,
};

/// Per precision: a target beyond where `exp` overflows, that point, and a residual whose
/// square overflows.
const OVERFLOWS: [(Precision, f64, f64, f64); 2] = [
    (Precision::F64, 800.0, 709.8, 3e160),
    (Precision::F32, 100.0, 88.8, 3e19),
];

/// `r = x - target + c tanh(exp(x))` with `c = 0` (a constant, so nothing folds it away):
/// the residual is finite everywhere, but past x = 709.8 (88.7 in f32) `exp` overflows and
/// the Jacobian entry `1 + c (1 - tanh^2) exp(x)` is `1 + 0 * inf`, NaN. The minimum lies
/// beyond it, at `target`, so the first full step lands where the Jacobian is NaN.
fn overflowing_jacobian(target: f64) -> Problem {
    let mut p = Problem::new();
    p.add_parameters(&[0.0]);
    p.add_residual("overflow", &[0], &[target, 0.0], Loss::Trivial, |v, c| {
        vec![v[0] - c[0] + c[1] * v[0].exp().tanh()]
    })
    .unwrap();
    p
}

#[test]
fn a_step_with_a_non_finite_jacobian_is_rejected() {
    let cpu = CpuBackend::new();
    for (precision, target, limit, _) in OVERFLOWS {
        for solver in [
            LinearSolver::SparseCholesky,
            LinearSolver::ConjugateGradient,
        ] {
            let mut p = overflowing_jacobian(target);
            let options = SolveOptions {
                linear_solver: solver,
                precision,
                max_iterations: 60,
                initial_trust_radius: 1e4 * target,
                ..SolveOptions::default()
            };
            let summary = solve(&cpu, &mut p, &options, &KernelCache::new()).unwrap_or_else(|e| {
                panic!("{solver:?}: the step should be rejected, not fail: {e}")
            });
            let x = p.parameters()[0];
            assert!(
                x.is_finite() && x < limit,
                "{solver:?} in {precision:?}: accepted x = {x}, where the Jacobian is NaN"
            );
            assert!(summary.final_cost.is_finite(), "{summary:?}");
            assert!(summary.final_cost < summary.initial_cost, "{summary:?}");
            assert_ne!(summary.termination, Termination::Failure);
        }
    }
}

#[test]
fn bad_options_are_refused_before_anything_runs() {
    let cpu = CpuBackend::new();
    let base = SolveOptions::default();
    let bad = [
        (
            "initial_trust_radius",
            SolveOptions {
                initial_trust_radius: 0.0,
                ..base.clone()
            },
        ),
        (
            "initial_trust_radius",
            SolveOptions {
                initial_trust_radius: f64::NAN,
                ..base.clone()
            },
        ),
        (
            "initial_trust_radius",
            SolveOptions {
                initial_trust_radius: -1.0,
                ..base.clone()
            },
        ),
        (
            "function_tolerance",
            SolveOptions {
                function_tolerance: -1e-9,
                ..base.clone()
            },
        ),
        (
            "gradient_tolerance",
            SolveOptions {
                gradient_tolerance: f64::NAN,
                ..base.clone()
            },
        ),
        (
            "parameter_tolerance",
            SolveOptions {
                parameter_tolerance: f64::INFINITY,
                ..base.clone()
            },
        ),
        (
            "cg_tolerance",
            SolveOptions {
                cg_tolerance: 0.0,
                ..base.clone()
            },
        ),
        (
            "cg_check_every",
            SolveOptions {
                cg_check_every: 0,
                ..base.clone()
            },
        ),
    ];
    for (name, options) in bad {
        let mut p = overflowing_jacobian(1.0);
        let before = p.parameters().to_vec();
        let err = solve(&cpu, &mut p, &options, &KernelCache::new()).unwrap_err();
        assert!(matches!(err, Error::InvalidOptions(_)), "{name}: {err}");
        assert!(err.to_string().contains(name), "{name}: {err}");
        assert_eq!(p.parameters(), &before[..]);
    }
}

/// A cost that is not finite at the start, with finite residuals (a huge residual overflows
/// once squared): the error names the block that holds it, never a made-up "cost" block with
/// index usize::MAX.
#[test]
fn a_non_finite_cost_names_its_block() {
    for (precision, _, _, huge) in OVERFLOWS {
        non_finite_cost_named(precision, huge);
    }
}

fn non_finite_cost_named(precision: Precision, huge: f64) {
    let cpu = CpuBackend::new();
    let mut p = Problem::new();
    p.add_parameters(&[0.0, 0.0]);
    p.add_residual("fine", &[0], &[1.0], Loss::Trivial, |v, c| {
        vec![v[0] - c[0]]
    })
    .unwrap();
    p.add_residual("huge", &[1], &[huge], Loss::Trivial, |v, c| {
        vec![v[0] - c[0]]
    })
    .unwrap();
    let options = SolveOptions {
        precision,
        ..SolveOptions::default()
    };
    let err = solve(&cpu, &mut p, &options, &KernelCache::new()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("huge") && text.contains("block 1"), "{text}");
    assert!(!text.contains(&usize::MAX.to_string()), "{text}");
    let summary = err.summary().expect("the solve had started");
    assert_eq!(summary.termination, Termination::Failure);
    assert_eq!(p.parameters(), &[0.0, 0.0]);
}
