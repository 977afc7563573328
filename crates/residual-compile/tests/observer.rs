//! `solve_async`'s observer: it sees every iteration in order with the current parameters,
//! can stop the solve, and the synchronous `solve` is the same loop run to completion.

use backend_cpu::CpuBackend;
use hal::Backend;
use residual_compile::icosphere::{demo, demo_options_f32};
use residual_compile::{
    KernelCache, LinearSolver, Progress, SolveOptions, Termination, solve, solve_async,
};
use std::ops::ControlFlow;

/// Each observed iteration's number and the parameters the observer was shown.
type Seen = Vec<(usize, Vec<f64>)>;

/// Runs `solve_async` with an observer that records each iteration's number and parameters
/// and stops after `stop_after` iterations (never when `None`); the summary, what was seen,
/// and the problem's parameters afterwards.
fn observed<B: Backend>(
    backend: &B,
    options: &SolveOptions,
    stop_after: Option<usize>,
) -> (residual_compile::Summary, Seen, Vec<f64>) {
    let (_, _, mut problem) = demo(3).unwrap();
    let mut seen = Vec::new();
    let mut observe = |p: Progress<'_>| {
        seen.push((p.iteration.iteration, p.parameters.to_vec()));
        match stop_after {
            Some(n) if seen.len() >= n => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    };
    let summary = pollster::block_on(solve_async(
        backend,
        &mut problem,
        options,
        &KernelCache::new(),
        Some(&mut observe),
    ))
    .unwrap();
    (summary, seen, problem.parameters().to_vec())
}

#[test]
fn the_observer_sees_each_iteration_and_the_result_matches_solve() {
    let cpu = CpuBackend::new();
    let options = demo_options_f32();
    let (summary, seen, solution) = observed(&cpu, &options, None);
    assert_eq!(summary.termination, Termination::FunctionTolerance);
    // Every iteration whose step was evaluated is seen once, in order, the last included.
    let numbers: Vec<usize> = seen.iter().map(|(i, _)| *i).collect();
    let rows: Vec<usize> = summary.history.iter().map(|r| r.iteration).collect();
    assert_eq!(numbers, rows);
    assert_eq!(*numbers.last().unwrap() + 1, summary.iterations);
    assert!(seen.iter().all(|(_, p)| p.len() == solution.len()));
    // After the last iteration the current point is the solution.
    assert_eq!(seen.last().unwrap().1, solution);
    // The synchronous entry point is the same loop: the same iterations and bits.
    let (_, _, mut problem) = demo(3).unwrap();
    let plain = solve(&cpu, &mut problem, &options, &KernelCache::new()).unwrap();
    assert_eq!(plain.iterations, summary.iterations);
    assert_eq!(plain.final_cost.to_bits(), summary.final_cost.to_bits());
    assert_eq!(problem.parameters(), &solution[..]);
}

#[test]
fn breaking_from_the_observer_stops_at_the_last_accepted_point() {
    let cpu = CpuBackend::new();
    let (summary, seen, solution) = observed(&cpu, &demo_options_f32(), Some(3));
    assert_eq!(summary.termination, Termination::Stopped);
    assert_eq!(summary.iterations, 3);
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2].1, solution);
    assert!(summary.final_cost < summary.initial_cost);
}

#[test]
fn a_device_engine_reports_its_parameters_to_the_observer_on_wgpu() {
    let gpu = backend_wgpu::WgpuBackend::new()
        .expect("wgpu is required here: install a Vulkan driver (mesa-vulkan-drivers)");
    // Conjugate gradients keep the point on the device: the observer's copy is read back.
    let options = SolveOptions {
        linear_solver: LinearSolver::ConjugateGradient,
        ..demo_options_f32()
    };
    let (summary, seen, solution) = observed(&gpu, &options, Some(4));
    assert_eq!(summary.termination, Termination::Stopped);
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[3].1, solution);
    assert!(summary.accepted_steps > 0 && summary.final_cost < summary.initial_cost);
}
