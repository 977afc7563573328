//! Residuals and Jacobians on the GPU backends against the CPU backend: the icosphere's three
//! shapes and a shape using every operation, at a fresh random point, in f32 and in f64
//! (on wgpu where the adapter has shader-f64, as lavapipe and NVIDIA's driver do). wgpu is
//! required (in CI it runs on lavapipe; the test fails, not skips, without a Vulkan driver);
//! CUDA runs with `--ignored` on a GPU host.

mod common;

use backend_cpu::CpuBackend;
use common::seed;
use hal::{Backend, BackendExt};
use residual_compile::icosphere::{Icosphere, SplitMix64};
use residual_compile::{
    CompiledProblem, KernelCache, LinearSolver, Loss, Precision, Problem, SolveOptions, Vec3, solve,
};

/// The tolerance the parity claim states: each value within `1e-5` (f32) or `1e-12` (f64)
/// relative of the CPU's, with an absolute floor of as much times the buffer's largest
/// magnitude (entries that cancel to near zero carry the rounding of their larger terms).
fn relative(precision: Precision) -> f64 {
    match precision {
        Precision::F32 => 1e-5,
        Precision::F64 => 1e-12,
    }
}

fn everything(p: &mut Problem, rng: &mut SplitMix64, n: usize) {
    let first = p.add_parameters(
        &(0..n * 4)
            .map(|_| 0.3 + 1.4 * rng.uniform())
            .collect::<Vec<_>>(),
    );
    for i in 0..n {
        let at = first + i * 4;
        p.add_residual(
            "everything",
            &[at, at + 1, at + 2, at + 3],
            &[0.5 + rng.uniform()],
            Loss::Cauchy(2.0),
            |v, c| {
                let a = Vec3::new(v[0], v[1], v[2]);
                let b = Vec3::new(v[3], c[0], v[0]);
                let n = a.cross(b).normalize();
                vec![
                    v[0].powi(3) / v[1] + v[2].powf(1.5) - v[3].pow(c[0]),
                    (v[0] - v[1]).exp() * v[2].ln() + v[3].sin() * v[0].cos() + (v[1] * 0.5).tan(),
                    (v[0] - 1.0).atan2(v[1] - 1.0) + (v[2] - 1.0).abs() + v[3].min(v[0])
                        - v[1].max(v[2])
                        + (v[3] - v[0]).atan(),
                    (v[0] - v[3]).tanh()
                        + (v[1] * 3.0 - 3.0).sigmoid()
                        + (v[2] - 1.0).relu()
                        + (v[3] - 1.0).softplus(),
                    v[0].lt(v[1]).select(v[2] * v[3], v[1].sqrt()) + (v[2] * v[3]).rsqrt(),
                    n.x + n.y * n.z,
                ]
            },
        )
        .unwrap();
    }
}

fn compare(label: &str, got: &[f64], want: &[f64], tolerance: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, &v| m.max(v.abs()));
    let mut worst = 0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let allowed = tolerance * (w.abs() + scale).max(f64::MIN_POSITIVE);
        let rel = err / w.abs().max(scale * 1e-3).max(f64::MIN_POSITIVE);
        worst = worst.max(rel);
        assert!(err <= allowed, "{label}[{i}]: {g} vs CPU {w}");
    }
    worst
}

/// Residuals, Jacobians and costs of the icosphere at `level` (and, with `all_operations`,
/// the everything-shape) on `gpu` against the CPU in `precision`, then (with `solve_too`) a
/// small solve by conjugate gradients on both.
fn parity_on<B: Backend>(
    gpu: &B,
    level: u32,
    precision: Precision,
    all_operations: bool,
    solve_too: bool,
) {
    let s = seed();
    let mut rng = SplitMix64(s);
    let mesh = Icosphere::new(level).unwrap();
    let start = mesh.perturbed(0.05, s);
    let mut problem = mesh.problem(&start, 1.0, 1.0).unwrap();
    if all_operations {
        everything(&mut problem, &mut rng, 1001);
    }
    let x = problem.parameters().to_vec();
    let cpu = CpuBackend::new();
    let on_cpu = CompiledProblem::new(&cpu, &problem, &KernelCache::new(), precision).unwrap();
    let on_gpu = CompiledProblem::new(gpu, &problem, &KernelCache::new(), precision).unwrap();
    let (ec, eg) = (
        on_cpu.alloc_evaluation().unwrap(),
        on_gpu.alloc_evaluation().unwrap(),
    );
    on_cpu
        .evaluate(&on_cpu.upload_floats(&x).unwrap(), &ec)
        .unwrap();
    on_gpu
        .evaluate(&on_gpu.upload_floats(&x).unwrap(), &eg)
        .unwrap();
    let tol = relative(precision);
    let r = compare(
        "residual",
        &gpu.read_f64(&eg.residuals).unwrap(),
        &cpu.read_f64(&ec.residuals).unwrap(),
        tol,
    );
    let j = compare(
        "Jacobian",
        &gpu.read_f64(&eg.jacobian).unwrap(),
        &cpu.read_f64(&ec.jacobian).unwrap(),
        tol,
    );
    let c = compare(
        "cost",
        &gpu.read_f64(&eg.cost).unwrap(),
        &cpu.read_f64(&ec.cost).unwrap(),
        tol,
    );
    println!(
        "{} in {}: {} residuals, {} Jacobian entries; worst relative difference (floor 1e-3 of the largest): residuals {r:.2e}, Jacobian {j:.2e}, costs {c:.2e}",
        gpu.info().name,
        precision.name(),
        on_cpu.rows,
        on_cpu.nnz
    );
    if !solve_too {
        return;
    }

    // A whole solve by conjugate gradients on the device lands where the CPU's does.
    let small = Icosphere::new(2).unwrap();
    let start = small.perturbed(0.02, 5);
    let options = SolveOptions {
        linear_solver: LinearSolver::ConjugateGradient,
        precision,
        cg_tolerance: 1e-4,
        ..SolveOptions::default()
    };
    let mut on_gpu = small.problem(&start, 1.0, 1.0).unwrap();
    let mut on_cpu = small.problem(&start, 1.0, 1.0).unwrap();
    let sg = solve(gpu, &mut on_gpu, &options, &KernelCache::new()).unwrap();
    let sc = solve(&cpu, &mut on_cpu, &options, &KernelCache::new()).unwrap();
    println!("{sg}");
    assert!(
        (sg.final_cost - sc.final_cost).abs() <= 1e-3 * sc.final_cost,
        "final cost {} on the GPU, {} on the CPU",
        sg.final_cost,
        sc.final_cost
    );
}

#[test]
fn wgpu_matches_cpu() {
    let gpu = backend_wgpu::WgpuBackend::new()
        .expect("the wgpu backend is required (install mesa-vulkan-drivers for lavapipe)");
    parity_on(&gpu, 3, Precision::F32, true, true);
    // f64 programs where the adapter has shader-f64 (lavapipe and NVIDIA's driver do), their
    // functions from math_wide.wgsl. (No conjugate-gradient solve: wgpu has no f64 fill or
    // elementwise kernels yet; tests/mgh.rs solves in f64 on wgpu through the Cholesky path.)
    let f64 = gpu.capabilities().f64;
    if f64.programs {
        parity_on(&gpu, 3, Precision::F64, f64.program_math, false);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on a GPU host"]
fn cuda_matches_cpu() {
    let gpu = backend_cuda::CudaBackend::new().expect("the CUDA backend is required");
    // Level 5: 30,720 edges, enough blocks to fill the GPU.
    parity_on(&gpu, 5, Precision::F32, true, true);
    parity_on(&gpu, 5, Precision::F64, true, false);
}

/// Bundle adjustment on wgpu (lavapipe in CI) in f32: `Auto` takes the device Schur engine
/// (wgpu adds f32 atomically) and reaches the CPU's dense Schur cost to f32's accuracy; the
/// iterative engine too.
#[test]
fn wgpu_device_schur_solves_a_bundle_adjustment_in_f32() {
    let gpu = backend_wgpu::WgpuBackend::new()
        .expect("the wgpu backend is required (install mesa-vulkan-drivers for lavapipe)");
    let scene = residual_compile::bal::Synthetic::new(6, 150, 3, 0.5, seed());
    let cpu_cost = {
        let mut p = scene.start.problem(Loss::Trivial).unwrap();
        solve(
            &CpuBackend::new(),
            &mut p,
            &SolveOptions::default(),
            &KernelCache::new(),
        )
        .unwrap()
        .final_cost
    };
    for solver in [LinearSolver::Auto, LinearSolver::IterativeSchur] {
        let mut p = scene.start.problem(Loss::Trivial).unwrap();
        let options = SolveOptions {
            precision: Precision::F32,
            linear_solver: solver,
            max_iterations: 50,
            ..Default::default()
        };
        let s = solve(&gpu, &mut p, &options, &KernelCache::new())
            .unwrap_or_else(|e| panic!("{solver:?}: {e}"));
        if solver == LinearSolver::Auto {
            assert_eq!(s.linear_solver, LinearSolver::DeviceSchur, "{s}");
        }
        assert!(
            (s.final_cost - cpu_cost).abs() <= 1e-4 * cpu_cost,
            "{solver:?}: {} against the CPU's {cpu_cost}\n{s}",
            s.final_cost
        );
    }
}
