//! Parameter blocks on manifolds: tangent-space Jacobians of the compiled kernels against
//! central differences through the exact `plus`, solves that stay on the manifold, and the
//! errors for misuse.

mod common;

use backend_cpu::CpuBackend;
use common::seed;
use hal::BackendExt;
use residual_compile::icosphere::SplitMix64;
use residual_compile::{
    CompiledProblem, KernelCache, LinearSolver, Loss, Manifold, Precision, Problem, SolveOptions,
    Var, Vec3, solve,
};

/// `v` rotated by the unit quaternion `q = (w, x, y, z)`.
fn rotate<'t>(q: [Var<'t>; 4], v: Vec3<'t>) -> Vec3<'t> {
    let u = Vec3::new(q[1], q[2], q[3]);
    let t = u.cross(v) * 2.0;
    v + t * q[0] + u.cross(t)
}

fn unit(v: [f64; 4]) -> [f64; 4] {
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.map(|x| x / n)
}

/// The ambient layout of each case: a Euclidean scalar, the manifold block, 3 Euclidean
/// values; and a residual reading all of them.
fn case(m: Manifold, rng: &mut SplitMix64) -> Problem {
    let mut p = Problem::new();
    p.add_parameters(&[0.7]);
    let q = unit([
        rng.uniform() - 0.5,
        rng.uniform() - 0.5,
        rng.uniform() - 0.5,
        rng.uniform() - 0.5,
    ]);
    let block: Vec<f64> = match m {
        Manifold::Quaternion => q.to_vec(),
        Manifold::EigenQuaternion => vec![q[1], q[2], q[3], q[0]],
        Manifold::Angle => vec![3.1],
        Manifold::Se2 => vec![0.3, -0.2, -3.1],
        Manifold::Se3 => vec![0.3, -0.2, 0.5, q[1], q[2], q[3], q[0]],
    };
    let first = p.add_parameters(&block);
    p.set_manifold(first, m).unwrap();
    let tail = p.add_parameters(&[0.4, -1.1, 0.9]);
    let a = m.ambient_size();
    let mut params = vec![0];
    params.extend(first..first + a);
    params.extend(tail..tail + 3);
    p.add_residual("case", &params, &[0.25], Loss::Trivial, move |v, c| {
        let s = v[0];
        let b = &v[1..1 + a];
        let w = Vec3::new(v[1 + a], v[2 + a], v[3 + a]);
        let r = match m {
            Manifold::Quaternion => rotate([b[0], b[1], b[2], b[3]], w),
            Manifold::EigenQuaternion => rotate([b[3], b[0], b[1], b[2]], w),
            Manifold::Angle => Vec3::new(b[0].sin() * w.x, b[0].cos() * w.y, w.z),
            Manifold::Se2 => Vec3::new(
                b[2].cos() * w.x - b[2].sin() * w.y + b[0],
                b[2].sin() * w.x + b[2].cos() * w.y + b[1],
                w.z,
            ),
            Manifold::Se3 => rotate([b[6], b[3], b[4], b[5]], w) + Vec3::new(b[0], b[1], b[2]),
        };
        vec![r.x * s - c[0], r.y + s * s, r.z * r.x]
    })
    .unwrap();
    p
}

const ALL: [Manifold; 5] = [
    Manifold::Quaternion,
    Manifold::EigenQuaternion,
    Manifold::Angle,
    Manifold::Se2,
    Manifold::Se3,
];

#[test]
fn kernel_jacobians_are_tangent_derivatives_through_plus() {
    let cpu = CpuBackend::new();
    let cache = KernelCache::new();
    let mut rng = SplitMix64(seed());
    for m in ALL {
        for _ in 0..5 {
            let problem = case(m, &mut rng);
            let x = problem.parameters().to_vec();
            let compiled = CompiledProblem::new(&cpu, &problem, &cache, Precision::F64).unwrap();
            let tangent = &compiled.tangent;
            assert_eq!(tangent.cols, 4 + m.tangent_size());
            assert_eq!(compiled.cols, tangent.cols);
            let eval = compiled.alloc_evaluation().unwrap();
            let residuals_at = |point: &[f64]| {
                let params = compiled.upload_floats(point).unwrap();
                compiled.evaluate(&params, &eval).unwrap();
                cpu.read_f64(&eval.residuals).unwrap()
            };
            let r0 = residuals_at(&x);
            // The kernel's residuals are the closure's at the stored values (plus at 0 is the
            // identity): the host's f64 evaluation agrees.
            let half_norm = 0.5 * r0.iter().map(|r| r * r).sum::<f64>();
            let host = problem.cost_f64(&x);
            assert!((half_norm - host).abs() <= 1e-14 * (1.0 + host), "{m:?}");
            let params = compiled.upload_floats(&x).unwrap();
            compiled.evaluate(&params, &eval).unwrap();
            let values = cpu.read_f64(&eval.jacobian).unwrap();
            let (offsets, cols) = (&compiled.host_row_offsets, &compiled.host_col_indices);
            let mut dense = vec![vec![0.0; tangent.cols]; compiled.rows];
            for (row, dense_row) in dense.iter_mut().enumerate() {
                for k in offsets[row] as usize..offsets[row + 1] as usize {
                    dense_row[cols[k] as usize] += values[k];
                }
            }
            for c in 0..tangent.cols {
                let h = 1e-6;
                let mut step = vec![0.0; tangent.cols];
                let (mut xp, mut xm) = (x.clone(), x.clone());
                step[c] = h;
                tangent.plus(&x, &step, &mut xp);
                step[c] = -h;
                tangent.plus(&x, &step, &mut xm);
                let (fp, fm) = (residuals_at(&xp), residuals_at(&xm));
                for row in 0..compiled.rows {
                    let fd = (fp[row] - fm[row]) / (2.0 * h);
                    let an = dense[row][c];
                    assert!(
                        (fd - an).abs() <= 1e-7 * (1.0 + an.abs()),
                        "{m:?}: d r{row} / d tangent {c}: kernel {an}, central difference {fd} \
                         (r = {r0:?})"
                    );
                }
            }
        }
    }
}

/// Points rotated and shifted by a known pose: the pose solved on a quaternion block comes
/// back (up to the quaternion's sign) with unit norm, with both linear solvers.
#[test]
fn an_alignment_solve_finds_the_rotation_on_the_sphere() {
    let cpu = CpuBackend::new();
    let mut rng = SplitMix64(seed());
    let truth = unit([0.4, -0.3, 0.8, 0.2]);
    let shift = [0.5, -1.0, 2.0];
    let rot = |p: [f64; 3]| {
        let [w, x, y, z] = truth;
        let u = [x, y, z];
        let cross = |a: [f64; 3], b: [f64; 3]| {
            [
                a[1] * b[2] - a[2] * b[1],
                a[2] * b[0] - a[0] * b[2],
                a[0] * b[1] - a[1] * b[0],
            ]
        };
        let t = cross(u, p).map(|v| 2.0 * v);
        let ut = cross(u, t);
        [0, 1, 2].map(|k| p[k] + w * t[k] + ut[k] + shift[k])
    };
    for solver in [
        LinearSolver::SparseCholesky,
        LinearSolver::ConjugateGradient,
    ] {
        let mut p = Problem::new();
        let q = p.add_parameters(&[1.0, 0.0, 0.0, 0.0]);
        p.set_manifold(q, Manifold::Quaternion).unwrap();
        let t = p.add_parameters(&[0.0; 3]);
        for _ in 0..40 {
            let a = [0, 1, 2].map(|_| 4.0 * rng.uniform() - 2.0);
            let b = rot(a);
            let data = [a[0], a[1], a[2], b[0], b[1], b[2]];
            p.add_residual(
                "point",
                &[q, q + 1, q + 2, q + 3, t, t + 1, t + 2],
                &data,
                Loss::Trivial,
                |v, c| {
                    let r = rotate([v[0], v[1], v[2], v[3]], Vec3::new(c[0], c[1], c[2]))
                        + Vec3::new(v[4], v[5], v[6])
                        - Vec3::new(c[3], c[4], c[5]);
                    vec![r.x, r.y, r.z]
                },
            )
            .unwrap();
        }
        let options = SolveOptions {
            linear_solver: solver,
            max_cg_iterations: 50,
            cg_tolerance: 1e-12,
            ..Default::default()
        };
        let summary = solve(&cpu, &mut p, &options, &KernelCache::new()).unwrap();
        assert_eq!((summary.parameters, summary.columns), (7, 6));
        assert!(
            summary
                .to_string()
                .contains("7 parameters (6 tangent columns)")
        );
        let x = p.parameters();
        let sign = if x[0] * truth[0] < 0.0 { -1.0 } else { 1.0 };
        for k in 0..4 {
            assert!(
                (sign * x[k] - truth[k]).abs() < 1e-8,
                "{solver:?}: q = {:?}, want {truth:?} ({summary})",
                &x[..4]
            );
        }
        let norm = x[..4].iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-12, "{solver:?}: |q| = {norm}");
        for k in 0..3 {
            assert!(
                (x[4 + k] - shift[k]).abs() < 1e-8,
                "{solver:?}: t = {:?}",
                &x[4..]
            );
        }
        assert!(summary.final_cost < 1e-20, "{solver:?}: {summary}");
    }
}

/// An angle solved across the wrap: the answer comes back in `[-pi, pi)`.
#[test]
fn angles_stay_wrapped_through_a_solve() {
    let cpu = CpuBackend::new();
    let target = -3.0f64; // reached from 3.0 across pi
    let mut p = Problem::new();
    let a = p.add_parameters(&[3.0]);
    p.set_manifold(a, Manifold::Angle).unwrap();
    p.add_residual(
        "heading",
        &[a],
        &[target.cos(), target.sin()],
        Loss::Trivial,
        |v, c| vec![v[0].cos() - c[0], v[0].sin() - c[1]],
    )
    .unwrap();
    solve(&cpu, &mut p, &SolveOptions::default(), &KernelCache::new()).unwrap();
    let got = p.parameters()[0];
    assert!((got - target).abs() < 1e-9, "angle {got}");
}

#[test]
fn misuse_is_refused_with_the_block_named() {
    let mut p = Problem::new();
    let q = p.add_parameters(&[1.0, 0.0, 0.0, 0.0, 5.0]);
    let err = p.set_manifold(q + 2, Manifold::Quaternion).unwrap_err();
    assert!(err.to_string().contains("needs parameters 2..6"), "{err}");
    p.set_manifold(q, Manifold::Quaternion).unwrap();
    let err = p.set_manifold(q + 1, Manifold::Angle).unwrap_err();
    assert!(err.to_string().contains("on a manifold already"), "{err}");
    let err = p.set_lower_bound(q + 1, 0.0).unwrap_err();
    assert!(err.to_string().contains("cannot be bounded"), "{err}");
    // Part of the block, or out of order.
    for params in [
        &[q, q + 1][..],
        &[q + 1, q, q + 2, q + 3],
        &[4, q + 1, q + 2, q + 3],
    ] {
        let err = p
            .add_residual("partial", params, &[], Loss::Trivial, |v, _| vec![v[0]])
            .unwrap_err();
        assert!(err.to_string().contains("read whole and in order"), "{err}");
    }
    // A parameter read Euclidean cannot be put on a manifold afterwards.
    p.add_residual("scalar", &[4], &[], Loss::Trivial, |v, _| vec![v[0] - 1.0])
        .unwrap();
    p.set_upper_bound(4, 10.0).unwrap();
    let mut fresh = Problem::new();
    fresh.add_parameters(&[0.0; 4]);
    fresh
        .add_residual("early", &[0, 1, 2, 3], &[], Loss::Trivial, |v, _| {
            vec![v[0] + v[1] + v[2] + v[3]]
        })
        .unwrap();
    let err = fresh.set_manifold(0, Manifold::Quaternion).unwrap_err();
    assert!(
        err.to_string().contains("read by a residual block"),
        "{err}"
    );
    // A partly fixed block.
    p.add_residual(
        "q",
        &[q, q + 1, q + 2, q + 3],
        &[],
        Loss::Trivial,
        |v, _| vec![v[0] - 1.0, v[1]],
    )
    .unwrap();
    p.set_fixed(q + 1, true).unwrap();
    let err = solve(
        &CpuBackend::new(),
        &mut p,
        &SolveOptions::default(),
        &KernelCache::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("partly fixed"), "{err}");
    // Fixed whole, it stays put.
    for k in 0..4 {
        p.set_fixed(q + k, true).unwrap();
    }
    let before = p.parameters()[..4].to_vec();
    let summary = solve(
        &CpuBackend::new(),
        &mut p,
        &SolveOptions::default(),
        &KernelCache::new(),
    )
    .unwrap();
    assert_eq!(&p.parameters()[..4], &before[..], "{summary}");
    assert!((p.parameters()[4] - 1.0).abs() < 1e-12);
}
