//! Grouping by signature, bad input, and solves on the CPU backend.

use backend_cpu::CpuBackend;
use residual_compile::icosphere::{Icosphere, SplitMix64};
use residual_compile::{
    CompiledProblem, Error, KernelCache, LinearSolver, Loss, Method, Precision, Problem,
    SolveOptions, Termination, Vec3, solve,
};

#[test]
fn instances_of_three_shapes_compile_three_kernels() {
    let mut p = Problem::new();
    p.add_parameters(&vec![0.5; 3000]);
    for i in 0..33_334usize {
        let j = (i * 7919) % 2997;
        p.add_residual(
            "distance",
            &[j, j + 1, j + 2],
            &[1.0],
            Loss::Trivial,
            |v, c| vec![Vec3::from_slice(v).norm() - c[0]],
        )
        .unwrap();
        p.add_residual(
            "pair",
            &[j, (j + 5) % 3000],
            &[i as f64],
            Loss::Trivial,
            |v, c| vec![v[0] * c[0] - v[1]],
        )
        .unwrap();
        p.add_residual("robust", &[j], &[], Loss::Huber(0.1), |v, _| {
            vec![v[0].sin()]
        })
        .unwrap();
    }
    assert_eq!(p.num_blocks(), 100_002);
    assert_eq!(p.groups().len(), 3);
    let sizes: Vec<usize> = p.groups().iter().map(|g| g.len()).collect();
    assert_eq!(sizes, vec![33_334; 3]);
    let cpu = CpuBackend::new();
    let cache = KernelCache::new();
    let first = CompiledProblem::new(&cpu, &p, &cache, Precision::F64).unwrap();
    assert_eq!(
        (first.report.kernels_compiled, first.report.cache_hits),
        (3, 0)
    );
    let again = CompiledProblem::new(&cpu, &p, &cache, Precision::F64).unwrap();
    assert_eq!(
        (again.report.kernels_compiled, again.report.cache_hits),
        (0, 3)
    );
    // The same shape with another loss is another kernel.
    let mut q = Problem::new();
    q.add_parameters(&[1.0]);
    q.add_residual("robust", &[0], &[], Loss::Cauchy(0.1), |v, _| {
        vec![v[0].sin()]
    })
    .unwrap();
    let third = CompiledProblem::new(&cpu, &q, &cache, Precision::F64).unwrap();
    assert_eq!(third.report.kernels_compiled, 1);
    // The first shape again, its parameters no longer consecutive in every instance: the
    // indices are stored per slot rather than per run of slots, which is another kernel.
    assert_eq!(first.report.groups[0].index_runs, 1);
    let mut spread = Problem::new();
    spread.add_parameters(&[0.5; 9]);
    spread
        .add_residual("distance", &[0, 2, 4], &[1.0], Loss::Trivial, |v, c| {
            vec![Vec3::from_slice(v).norm() - c[0]]
        })
        .unwrap();
    let fourth = CompiledProblem::new(&cpu, &spread, &cache, Precision::F64).unwrap();
    assert_eq!(
        (
            fourth.report.kernels_compiled,
            fourth.report.groups[0].index_runs
        ),
        (1, 3)
    );
}

/// Blocks added in one parallel batch group exactly as when added one by one, and a batch with
/// a bad block adds nothing and names the first bad block.
#[test]
fn batched_blocks_match_blocks_added_one_by_one() {
    let count = 10_007usize; // several tracing chunks, the last one short
    let params: Vec<usize> = (0..count)
        .flat_map(|i| {
            let j = (i * 7919) % 2997;
            [j, j + 1, j + 2]
        })
        .collect();
    let constants: Vec<f64> = (0..count).map(|i| 1.0 + i as f64 * 1e-3).collect();
    fn f<'t>(
        v: &[residual_compile::Var<'t>],
        c: &[residual_compile::Var<'t>],
    ) -> Vec<residual_compile::Var<'t>> {
        vec![Vec3::from_slice(v).norm() - c[0], v[0] * c[0]]
    }
    let start = |p: &mut Problem| {
        p.add_parameters(&vec![0.5; 3000]);
        // A block before the batch, so the batch's ids do not start at 0.
        p.add_residual("first", &[0], &[], Loss::Trivial, |v, _| vec![v[0]])
            .unwrap();
    };
    let mut one = Problem::new();
    start(&mut one);
    for i in 0..count {
        one.add_residual(
            "distance",
            &params[i * 3..i * 3 + 3],
            &constants[i..i + 1],
            Loss::Trivial,
            f,
        )
        .unwrap();
    }
    let mut batch = Problem::new();
    start(&mut batch);
    let first = batch
        .add_residuals("distance", 3, &params, 1, &constants, Loss::Trivial, f)
        .unwrap();
    assert_eq!(first, 1);
    assert_eq!(batch.num_blocks(), one.num_blocks());
    assert_eq!(batch.num_residuals(), one.num_residuals());
    assert_eq!(batch.groups().len(), 2);
    for (a, b) in one.groups().iter().zip(batch.groups()) {
        assert_eq!(
            (
                &a.name,
                a.signature,
                &a.param_index,
                &a.constants,
                &a.block_ids
            ),
            (
                &b.name,
                b.signature,
                &b.param_index,
                &b.constants,
                &b.block_ids
            )
        );
    }
    assert_eq!(batch.block_name(count), Some("distance"));

    // A bad parameter index in block 5000 of the batch: nothing is added.
    let mut bad = params.clone();
    bad[5000 * 3 + 1] = 9999;
    let before = batch.num_blocks();
    let err = batch
        .add_residuals("distance", 3, &bad, 1, &constants, Loss::Trivial, f)
        .unwrap_err();
    let expected = format!("block {}", before + 5000);
    assert!(
        err.to_string().contains(&expected) && err.to_string().contains("out of range"),
        "{err}"
    );
    assert_eq!(batch.num_blocks(), before);
    // Blocks that are not whole.
    let err = batch
        .add_residuals("distance", 3, &params[..7], 1, &constants, Loss::Trivial, f)
        .unwrap_err();
    assert!(err.to_string().contains("whole blocks"), "{err}");
}

#[test]
fn bad_input_gets_clear_errors() {
    let mut p = Problem::new();
    p.add_parameters(&[1.0, 2.0]);
    let err = p
        .add_residual("r", &[0, 5], &[], Loss::Trivial, |v, _| vec![v[0] + v[1]])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("parameter index 5 is out of range"),
        "{err}"
    );
    let err = p
        .add_residual("r", &[], &[], Loss::Trivial, |_, c| vec![c[0]])
        .unwrap_err();
    assert!(err.to_string().contains("no parameters"), "{err}");
    let err = p
        .add_residual("r", &[1, 1], &[], Loss::Trivial, |v, _| vec![v[0]])
        .unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
    let err = p
        .add_residual("r", &[0], &[f64::NAN], Loss::Trivial, |v, c| {
            vec![v[0] - c[0]]
        })
        .unwrap_err();
    assert!(err.to_string().contains("not finite"), "{err}");
    let err = p
        .add_residual("r", &[0], &[], Loss::Huber(-1.0), |v, _| vec![v[0]])
        .unwrap_err();
    assert!(err.to_string().contains("loss scale"), "{err}");
    let err = p
        .add_residual("r", &[0], &[], Loss::Trivial, |_, _| vec![])
        .unwrap_err();
    assert!(err.to_string().contains("no residuals"), "{err}");
    assert!(p.set_fixed(9, true).is_err());

    let cpu = CpuBackend::new();
    let cache = KernelCache::new();
    let mut empty = Problem::new();
    empty.add_parameters(&[1.0]);
    let err = solve(&cpu, &mut empty, &SolveOptions::default(), &cache).unwrap_err();
    assert!(err.to_string().contains("no residual blocks"), "{err}");

    // A residual that is NaN at the start names its block and instance.
    let mut nan = Problem::new();
    nan.add_parameters(&[4.0, 1.0, -1.0]);
    for (k, &i) in [0usize, 1, 2].iter().enumerate() {
        nan.add_residual("root", &[i], &[k as f64], Loss::Trivial, |v, c| {
            vec![v[0].sqrt() - c[0]]
        })
        .unwrap();
    }
    for solver in [
        LinearSolver::SparseCholesky,
        LinearSolver::ConjugateGradient,
    ] {
        let options = SolveOptions {
            linear_solver: solver,
            ..SolveOptions::default()
        };
        let before = nan.parameters().to_vec();
        let err = solve(&cpu, &mut nan, &options, &cache).unwrap_err();
        let summary = err.summary().expect("a failed solve reports its summary");
        assert_eq!(summary.termination, Termination::Failure);
        assert_eq!(summary.iterations, 0);
        match err.cause() {
            Error::NonFinite {
                name,
                block,
                residual,
                what,
            } => {
                assert_eq!(
                    (name.as_str(), *block, *residual, *what),
                    ("root", 2, 0, "residual")
                );
            }
            other => panic!("expected a NonFinite error, got {other:?}"),
        }
        assert_eq!(
            nan.parameters(),
            &before[..],
            "a failed solve leaves the parameters"
        );
    }
}

/// Fits `y = a exp(b t) + c` to noisy samples with outliers.
fn curve_fit(loss: Loss, fix_c: bool) -> (Problem, [f64; 3]) {
    let truth = [2.0, -0.7, 0.3];
    let mut rng = SplitMix64(11);
    let mut p = Problem::new();
    p.add_parameters(&[1.0, 0.0, if fix_c { truth[2] } else { 0.0 }]);
    if fix_c {
        p.set_fixed(2, true).unwrap();
    }
    for i in 0..200 {
        let t = i as f64 / 40.0;
        let mut y = truth[0] * (truth[1] * t).exp() + truth[2] + 0.01 * rng.normal();
        if i % 25 == 0 {
            y += 3.0; // an outlier
        }
        p.add_residual("sample", &[0, 1, 2], &[t, y], loss, |v, c| {
            vec![v[0] * (v[1] * c[0]).exp() + v[2] - c[1]]
        })
        .unwrap();
    }
    (p, truth)
}

#[test]
fn robust_fits_recover_the_curve_with_both_linear_solvers_and_methods() {
    let cpu = CpuBackend::new();
    let cache = KernelCache::new();
    for (method, solver) in [
        (Method::LevenbergMarquardt, LinearSolver::SparseCholesky),
        (Method::LevenbergMarquardt, LinearSolver::ConjugateGradient),
        (Method::GaussNewton, LinearSolver::SparseCholesky),
    ] {
        let options = SolveOptions {
            method,
            linear_solver: solver,
            ..SolveOptions::default()
        };
        let (mut p, truth) = curve_fit(Loss::Cauchy(0.05), false);
        let s = solve(&cpu, &mut p, &options, &cache).unwrap();
        assert!(s.final_cost < s.initial_cost);
        assert!(s.termination != Termination::MaxIterations, "{s}");
        for (k, (&got, &want)) in p.parameters().iter().zip(&truth).enumerate() {
            assert!(
                (got - want).abs() < 0.02,
                "{method:?}/{solver:?}: parameter {k} = {got} (truth {want})\n{s}"
            );
        }
        // The f64 reference agrees with the reported cost.
        let reference = p.cost_f64(p.parameters());
        assert!(
            (reference - s.final_cost).abs() <= 1e-4 * reference,
            "{reference} vs {}",
            s.final_cost
        );
    }
    // Without a robust loss the outliers drag the fit away.
    let (mut p, truth) = curve_fit(Loss::Trivial, false);
    solve(&cpu, &mut p, &SolveOptions::default(), &cache).unwrap();
    assert!((p.parameters()[2] - truth[2]).abs() > 0.02);
    // A fixed parameter does not move.
    let (mut p, truth) = curve_fit(Loss::Huber(0.05), true);
    solve(&cpu, &mut p, &SolveOptions::default(), &cache).unwrap();
    assert_eq!(p.parameters()[2], truth[2]);
    assert!((p.parameters()[0] - truth[0]).abs() < 0.02);
}

#[test]
fn icosphere_solves_agree_between_cholesky_and_conjugate_gradients() {
    let mesh = Icosphere::new(2).unwrap();
    assert_eq!(mesh.vertices.len(), 162);
    assert_eq!(mesh.edges.len(), 480);
    let start = mesh.perturbed(0.02, 3);
    let cpu = CpuBackend::new();
    let cache = KernelCache::new();
    let mut costs = Vec::new();
    for solver in [
        LinearSolver::SparseCholesky,
        LinearSolver::ConjugateGradient,
    ] {
        let mut p = mesh.problem(&start, 1.0, 1.0).unwrap();
        let options = SolveOptions {
            linear_solver: solver,
            cg_tolerance: 1e-4,
            ..SolveOptions::default()
        };
        let s = solve(&cpu, &mut p, &options, &cache).unwrap();
        assert!(s.final_cost < 0.9 * s.initial_cost, "{s}");
        costs.push(s.final_cost);
    }
    assert!((costs[0] - costs[1]).abs() <= 1e-3 * costs[0], "{costs:?}");
}
