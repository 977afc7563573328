//! Pose graphs: the g2o reader (and its errors), the writer, Ceres's costs on a real graph,
//! and a synthetic 3D graph whose answer is known.

mod common;

use backend_cpu::CpuBackend;
use common::{data, seed};
use residual_compile::icosphere::SplitMix64;
use residual_compile::manifold::quaternion_product;
use residual_compile::pose_graph::{PoseGraph, PoseKind, g2o};
use residual_compile::{KernelCache, LinearSolver, SolveOptions, solve};

/// Intel Research Lab (1728 poses, 2512 edges): the cost at the file's poses and after the
/// solve, against C++ Ceres 2.1's `pose_graph_2d` on the same file (2.799889e2 -> 2.293880e1,
/// 6 iterations; the table).
#[test]
fn intel_reaches_ceres_cost() {
    let graph = PoseGraph::read(&data("intel.g2o")).unwrap();
    assert_eq!((graph.len(), graph.edges.len()), (1728, 2512));
    assert_eq!(graph.kind, PoseKind::Se2);
    let mut problem = graph.problem().unwrap();
    let start = problem.cost_f64(problem.parameters());
    assert!(
        (start - 2.799889e2).abs() < 0.5e-4,
        "initial cost {start} (Ceres: 2.799889e2)"
    );
    let summary = solve(
        &CpuBackend::new(),
        &mut problem,
        &SolveOptions::default(),
        &KernelCache::new(),
    )
    .unwrap();
    assert!(
        summary.final_cost <= 2.293880e1,
        "final cost {} above Ceres's 2.293880e1\n{summary}",
        summary.final_cost
    );
    // The first pose did not move; every angle stayed wrapped.
    assert_eq!(&problem.parameters()[..3], &graph.poses[..3]);
    assert!(
        problem
            .parameters()
            .chunks(3)
            .all(|p| (-std::f64::consts::PI..std::f64::consts::PI).contains(&p[2]))
    );
}

fn unit(v: [f64; 4]) -> [f64; 4] {
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.map(|x| x / n)
}

/// `(x, y, z, w)` storage to and from `(w, x, y, z)`.
fn wxyz(q: &[f64]) -> [f64; 4] {
    [q[3], q[0], q[1], q[2]]
}

fn rotate(q: [f64; 4], v: [f64; 3]) -> [f64; 3] {
    let p = quaternion_product(quaternion_product(q, [0.0, v[0], v[1], v[2]]), {
        [q[0], -q[1], -q[2], -q[3]]
    });
    [p[1], p[2], p[3]]
}

/// Exact relative measurements of random poses, the poses then perturbed: the solve returns
/// to the truth (the first pose is fixed at its true value), on both linear solvers.
#[test]
fn a_synthetic_3d_graph_returns_to_the_truth() {
    let mut rng = SplitMix64(seed());
    let n = 30;
    let mut truth: Vec<[f64; 7]> = Vec::new();
    for _ in 0..n {
        let q = unit([0.0, 1.0, 2.0, 3.0].map(|_| rng.uniform() - 0.5));
        let p = [0, 1, 2].map(|_| 10.0 * rng.uniform() - 5.0);
        truth.push([p[0], p[1], p[2], q[1], q[2], q[3], q[0]]);
    }
    let mut text = String::new();
    for (i, t) in truth.iter().enumerate() {
        let mut pose = *t;
        if i > 0 {
            for v in pose.iter_mut() {
                *v += 0.05 * (rng.uniform() - 0.5);
            }
        }
        text += &format!(
            "VERTEX_SE3:QUAT {} {}\n",
            i * 3,
            pose.map(|v| v.to_string()).join(" ")
        );
    }
    for i in 0..n {
        for j in [i + 1, i + 7] {
            if j >= n {
                continue;
            }
            let (a, b) = (&truth[i], &truth[j]);
            let qa_inv = {
                let q = wxyz(&a[3..]);
                [q[0], -q[1], -q[2], -q[3]]
            };
            let d = [b[0] - a[0], b[1] - a[1], b[2] - a[2]];
            let p_ab = rotate(qa_inv, d);
            let q_ab = quaternion_product(qa_inv, wxyz(&b[3..]));
            let info = "2 0.1 0 0 0 0 3 0 0 0 0 4 0 0 0 50 1 0 60 0 70";
            text += &format!(
                "EDGE_SE3:QUAT {} {} {} {} {} {} {} {} {} {info}\n",
                i * 3,
                j * 3,
                p_ab[0],
                p_ab[1],
                p_ab[2],
                q_ab[1],
                q_ab[2],
                q_ab[3],
                q_ab[0]
            );
        }
    }
    let graph = g2o::parse(&text).unwrap();
    assert_eq!(graph.ids[1], 3);
    for solver in [
        LinearSolver::SparseCholesky,
        LinearSolver::ConjugateGradient,
    ] {
        let mut problem = graph.problem().unwrap();
        let options = SolveOptions {
            linear_solver: solver,
            max_cg_iterations: 500,
            cg_tolerance: 1e-10,
            ..Default::default()
        };
        let summary = solve(
            &CpuBackend::new(),
            &mut problem,
            &options,
            &KernelCache::new(),
        )
        .unwrap();
        assert!(summary.final_cost < 1e-16, "{solver:?}: {summary}");
        for (i, t) in truth.iter().enumerate() {
            let x = &problem.parameters()[i * 7..(i + 1) * 7];
            let sign = if x[6] * t[6] < 0.0 { -1.0 } else { 1.0 };
            for k in 0..7 {
                let want = if k < 3 { t[k] } else { sign * t[k] };
                assert!(
                    (x[k] - want).abs() < 1e-7,
                    "{solver:?}: pose {i}: {x:?} vs {t:?}"
                );
            }
        }
    }
}

#[test]
fn the_writer_round_trips() {
    let graph = PoseGraph::read(&data("intel.g2o")).unwrap();
    let dir = std::env::temp_dir().join(format!("rc-g2o-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("intel.g2o");
    g2o::write(&graph, &graph.poses, &path).unwrap();
    let back = PoseGraph::read(&path).unwrap();
    assert_eq!(back.ids, graph.ids);
    assert_eq!(back.poses, graph.poses);
    for (a, b) in back.edges.iter().zip(&graph.edges) {
        assert_eq!((a.a, a.b), (b.a, b.b));
        assert_eq!(a.measurement, b.measurement);
        for (x, y) in a.sqrt_information.iter().zip(&b.sqrt_information) {
            assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()));
        }
    }
    let obj = dir.join("intel.obj");
    g2o::write_obj(&graph, &graph.poses, &obj).unwrap();
    let text = std::fs::read_to_string(&obj).unwrap();
    assert_eq!(text.lines().filter(|l| l.starts_with("v ")).count(), 1728);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_files_are_refused_with_their_line() {
    let v2 = "VERTEX_SE2 0 0 0 0\nVERTEX_SE2 1 1 0 0\n";
    let e2 = "EDGE_SE2 0 1 1 0 0 1 0 0 1 0 1\n";
    let cases: Vec<(String, usize, &str)> = vec![
        (String::new(), 0, "no vertices or edges"),
        (e2.to_string(), 1, "not in the file"),
        (format!("{v2}FOO 1 2\n"), 3, "unknown record type 'FOO'"),
        (
            format!("{v2}EDGE_SE2 0 1 1 0 0 1 0 0 1 0\n"),
            3,
            "has 10 fields",
        ),
        (
            format!("{v2}EDGE_SE2 0 1 1 x 0 1 0 0 1 0 1\n"),
            3,
            "'x' is not a number",
        ),
        (
            format!("{v2}EDGE_SE2 0 1 1 NaN 0 1 0 0 1 0 1\n"),
            3,
            "not finite",
        ),
        (
            format!("{v2}EDGE_SE2 0 7 1 0 0 1 0 0 1 0 1\n"),
            3,
            "vertex 7",
        ),
        (
            format!("{v2}EDGE_SE2 0 0 1 0 0 1 0 0 1 0 1\n"),
            3,
            "to itself",
        ),
        (
            format!("{v2}EDGE_SE2 0 1 1 0 0 1 2 0 1 0 1\n"),
            3,
            "not positive definite",
        ),
        (
            format!("{v2}VERTEX_SE2 1 0 0 0\n"),
            3,
            "vertex 1 appears twice",
        ),
        (
            format!("{v2}VERTEX_SE2 a 0 0 0\n"),
            3,
            "'a' is not a vertex id",
        ),
        (
            format!("{v2}VERTEX_SE3:QUAT 2 0 0 0 0 0 0 1\n"),
            3,
            "a VERTEX_SE3:QUAT record in a file of SE2",
        ),
        (
            "# comment\n\nVERTEX_SE3:QUAT 2 0 0 0 0 0 0 0\n".into(),
            3,
            "the quaternion is zero",
        ),
        (
            e2.replace("EDGE_SE2 0 1", "EDGE_SE2 0 1.5"),
            1,
            "'1.5' is not a vertex id",
        ),
    ];
    for (text, line, message) in cases {
        let err = g2o::parse(&text).unwrap_err();
        assert_eq!(err.line, line, "{text:?}: {err}");
        assert!(err.to_string().contains(message), "{text:?}: {err}");
    }
    // Huge quaternion entries normalise without overflowing.
    let huge = g2o::parse("VERTEX_SE3:QUAT 0 0 0 0 1e308 1e308 1e308 1e308\n").unwrap();
    assert!(
        huge.poses[3..].iter().all(|&v| (v - 0.5).abs() < 1e-15),
        "{:?}",
        huge.poses
    );
    let missing = PoseGraph::read(&data("no-such-file.g2o")).unwrap_err();
    assert!(missing.to_string().contains("cannot read"), "{missing}");
}
