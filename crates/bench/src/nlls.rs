//! `--suite nlls`: the residual-compile workload.
//!
//! - **Icosphere solves** at `--levels` (default 4,5) from the same perturbed start (sigma
//!   0.05, seed 7, w1 = w2 = 1): our Levenberg-Marquardt on this backend in f64 (the default)
//!   and in f32, side by side, then `scipy.optimize.least_squares` (trf, analytic sparse
//!   Jacobian) where python3 has scipy. Wall time includes compiling the kernels. C++ Ceres
//!   is quoted, not run.
//! - **Evaluation**: `--edges` (default 30,000,000 on a GPU, 1,000,000 on the CPU)
//!   edge-length residuals with their Jacobians, one kernel launch plus the cost sum, in f64
//!   and f32; the bound is the bytes the kernel must move at the device's copy bandwidth.
//! - **Compilation**: the icosphere at `--compile-level` (default 7: 1,146,882 residual blocks
//!   of 3 shapes) traced, grouped, differentiated, lowered, compiled and uploaded, end to end;
//!   the first run compiles cold, later runs hit the backend's kernel cache.
//! - On a GPU backend, the same solves on the CPU backend of the same host at levels 3 to 5,
//!   which locate the break-even size `auto` uses.

use crate::median;
use hal::{Backend, DeviceKind};
use residual_compile::icosphere::Icosphere;
use residual_compile::{
    CompiledProblem, KernelCache, Loss, Precision, Problem, SolveOptions, Vec3, solve,
};
use std::time::Instant;

const SCIPY_PEER: &str = include_str!("../peers/nlls_scipy.py");

#[derive(Clone)]
pub struct NllsArgs {
    pub levels: Vec<u32>,
    pub edges: Option<usize>,
    pub compile_level: u32,
    /// On a GPU backend, the CPU-vs-GPU solves at levels 3 to 5 (`--no-break-even` skips).
    pub break_even: bool,
    pub reps: usize,
}

pub fn nlls<B: Backend>(b: &B, args: &NllsArgs) -> Result<(), String> {
    let gpu = b.info().kind != DeviceKind::Cpu;
    for &level in &args.levels {
        icosphere(b, level)?;
    }
    let edges = args
        .edges
        .unwrap_or(if gpu { 30_000_000 } else { 1_000_000 });
    if edges > 0 {
        for precision in [Precision::F64, Precision::F32] {
            if let Err(e) = evaluation(b, edges, args.reps, precision) {
                println!("nlls: evaluate in {}: not run: {e}", precision.name());
            }
        }
    }
    if args.compile_level > 0 {
        compilation(b, args.compile_level, args.reps).map_err(|e| e.to_string())?;
    }
    if gpu && args.break_even {
        break_even(b)?;
    }
    Ok(())
}

struct Solved {
    seconds: f64,
    cost: f64,
    iterations: usize,
}

fn solve_level<B: Backend>(
    b: &B,
    level: u32,
    verbose: bool,
    precision: Precision,
) -> Result<Solved, String> {
    let mesh = Icosphere::new(level).map_err(|e| e.to_string())?;
    let start = mesh.perturbed(0.05, 7);
    let mut problem = mesh.problem(&start, 1.0, 1.0).map_err(|e| e.to_string())?;
    let t = Instant::now();
    // Both precisions stop at the f32 floor's relative cost change, so f64 and f32 run to
    // the same tolerance (f64's default would run on: it still resolves progress there).
    let options = SolveOptions {
        precision,
        function_tolerance: 1e-7,
        max_iterations: 500,
        ..SolveOptions::default()
    };
    let summary =
        solve(b, &mut problem, &options, &KernelCache::new()).map_err(|e| e.to_string())?;
    let seconds = t.elapsed().as_secs_f64();
    if verbose {
        println!("{summary}");
    }
    Ok(Solved {
        seconds,
        cost: summary.final_cost,
        iterations: summary.iterations,
    })
}

fn icosphere<B: Backend>(b: &B, level: u32) -> Result<(), String> {
    let mesh = Icosphere::new(level).map_err(|e| e.to_string())?;
    println!(
        "nlls: icosphere level {level}: {} vertices, {} edges, sigma 0.05, seed 7, w1 = w2 = 1",
        mesh.vertices.len(),
        mesh.edges.len()
    );
    let ours = solve_level(b, level, true, Precision::F64)?;
    println!(
        "nlls: level {level} ours (f64): {:.3} s, final cost {:.9e}, {} iterations",
        ours.seconds, ours.cost, ours.iterations
    );
    match solve_level(b, level, false, Precision::F32) {
        Ok(narrow) => println!(
            "nlls: level {level} ours (f32): {:.3} s, final cost {:.9e}, {} iterations; f64/f32 time {:.2}x, per iteration {:.2}x",
            narrow.seconds,
            narrow.cost,
            narrow.iterations,
            ours.seconds / narrow.seconds,
            (ours.seconds / ours.iterations.max(1) as f64)
                / (narrow.seconds / narrow.iterations.max(1) as f64)
        ),
        Err(e) => println!("nlls: level {level} ours (f32): failed: {e}"),
    }
    match scipy(&mesh, level) {
        Ok((seconds, cost, what)) => println!(
            "nlls: level {level} peer {what}: {seconds:.3} s, final cost {cost:.9e}; ours/peer: time {:.2}x, cost {:.5}x",
            ours.seconds / seconds,
            ours.cost / cost
        ),
        Err(e) => println!("nlls: level {level} peer scipy not run: {e}"),
    }
    let quoted = match level {
        4 => Some("3.0 s (191 iterations) to 0.0454402"),
        5 => Some("52.4 s (540 iterations) to 0.0342453"),
        6 => Some("30 s for 50 iterations"),
        _ => None,
    };
    if let Some(q) = quoted {
        println!(
            "nlls: level {level} quoted C++ Ceres 2.1 (SPARSE_NORMAL_CHOLESKY, 2 cores; figures from the project's issue, its own residual scaling, so its cost is not comparable): {q}"
        );
    }
    Ok(())
}

/// scipy's solve of the same start, or why it could not run.
fn scipy(mesh: &Icosphere, level: u32) -> Result<(f64, f64, String), String> {
    let start = mesh.perturbed(0.05, 7);
    let path =
        std::env::temp_dir().join(format!("nlls-icosphere-{level}-{}.bin", std::process::id()));
    mesh.write_start(&path, &start).map_err(|e| e.to_string())?;
    let text = crate::run_peer(
        SCIPY_PEER,
        &[
            path.to_string_lossy().into_owned(),
            "1".into(),
            "1".into(),
            "1e-10".into(),
        ],
        "scipy",
    );
    let _ = std::fs::remove_file(&path);
    let text = text?;
    let field = |k: &str| crate::json_field(&text, k);
    let num = |k: &str| {
        field(k)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or(format!("unreadable output: {text}"))
    };
    Ok((
        num("seconds")?,
        num("cost")?,
        field("what").unwrap_or_default(),
    ))
}

fn evaluation<B: Backend>(
    b: &B,
    edges: usize,
    reps: usize,
    precision: Precision,
) -> Result<(), residual_compile::Error> {
    // A chain-like graph with some long edges: vertex e/3 to e/3 + 1, + 7 and + 19.
    let vertices = edges / 3 + 20;
    let mut problem = Problem::new();
    let coords: Vec<f64> = (0..vertices * 3)
        .map(|i| ((i * 2_654_435_761) % 1000) as f64 / 500.0 - 1.0)
        .collect();
    problem.add_parameters(&coords);
    let t = Instant::now();
    let mut index = Vec::with_capacity(edges * 6);
    for e in 0..edges {
        let (a, c) = (e / 3, e / 3 + [1, 7, 19][e % 3]);
        index.extend([3 * a, 3 * a + 1, 3 * a + 2, 3 * c, 3 * c + 1, 3 * c + 2]);
    }
    problem.add_residuals(
        "edge",
        6,
        &index,
        1,
        &vec![0.1; edges],
        Loss::Trivial,
        |v, k| vec![(Vec3::from_slice(&v[0..3]) - Vec3::from_slice(&v[3..6])).norm() - k[0]],
    )?;
    drop(index);
    let traced = t.elapsed().as_secs_f64();
    let compiled = CompiledProblem::new(b, &problem, &KernelCache::new(), precision)?;
    let params = compiled.upload_floats(&coords)?;
    let eval = compiled.alloc_evaluation()?;
    let mut times = Vec::new();
    for i in 0..reps + 2 {
        b.synchronize()?;
        let t = Instant::now();
        compiled.evaluate(&params, &eval)?;
        b.synchronize()?;
        if i >= 2 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let m = median(times);
    // Read: 2 stored indices (the slot runs) + 1 constant + 6 parameters (each vertex is
    // shared by ~6 edges, so about 1/6 of those come from memory); written: 1 residual + 6
    // Jacobian values + 1 cost. Floats of the precision's size, indices of 4 bytes.
    let f = precision.dtype().size_in_bytes() as f64;
    let bytes = edges as f64 * (2.0 * 4.0 + f + 6.0 * f / 6.0 + f + 6.0 * f + f);
    println!(
        "nlls: evaluate {edges} edge-length residuals + Jacobians (+ the cost sum) in {}: median {:.3} ms = {:.1} GB/s of the {:.2} GB the kernel must move (traced in {:.1} s)",
        precision.name(),
        m * 1e3,
        bytes / m / 1e9,
        bytes / 1e9,
        traced
    );
    Ok(())
}

fn compilation<B: Backend>(b: &B, level: u32, reps: usize) -> Result<(), residual_compile::Error> {
    let mesh = Icosphere::new(level)?;
    let start = mesh.perturbed(0.05, 7);
    let mut runs = Vec::new();
    for _ in 0..reps.min(5) {
        let t = Instant::now();
        let problem = mesh.problem(&start, 1.0, 1.0)?;
        let traced = t.elapsed().as_secs_f64();
        let compiled = CompiledProblem::new(b, &problem, &KernelCache::new(), Precision::F64)?;
        b.synchronize()?;
        let r = &compiled.report;
        // End to end: tracing to kernels and instance data on the device; the solver's
        // Jacobian structure is reported beside it.
        let total = t.elapsed().as_secs_f64() - r.structure_seconds;
        runs.push((
            total,
            traced,
            r.compile_seconds,
            r.upload_seconds,
            r.structure_seconds,
            problem.num_blocks(),
            problem.groups().len(),
        ));
    }
    let (total, traced, comp, up, structure, blocks, groups) = runs[0];
    println!(
        "nlls: compile {blocks} residual blocks of {groups} shapes (icosphere level {level}), cold: {:.1} ms end to end = trace+group {:.1} + derive/lower/compile {:.1} + upload instance data {:.1} (then the solver's Jacobian structure: {:.1} ms)",
        total * 1e3,
        traced * 1e3,
        comp * 1e3,
        up * 1e3,
        structure * 1e3
    );
    if runs.len() > 1 {
        let warm = median(runs[1..].iter().map(|r| r.0).collect());
        let warm_compile = median(runs[1..].iter().map(|r| r.2).collect());
        println!(
            "nlls: compile again (the backend's kernel cache warm): median {:.1} ms end to end, of which {:.1} ms derive/lower/compile",
            warm * 1e3,
            warm_compile * 1e3
        );
    }
    Ok(())
}

fn break_even<B: Backend>(b: &B) -> Result<(), String> {
    let cpu = backend_cpu::CpuBackend::new();
    for level in 3..=5u32 {
        let mesh = Icosphere::new(level).map_err(|e| e.to_string())?;
        let residuals = mesh.edges.len() * 4 + mesh.vertices.len();
        let g = solve_level(b, level, false, Precision::F64)?;
        let c = solve_level(&cpu, level, false, Precision::F64)?;
        println!(
            "nlls: break-even: level {level} ({residuals} residuals): this backend {:.3} s ({} iterations, cost {:.6e}), CPU backend {:.3} s ({} iterations, cost {:.6e}) on {}",
            g.seconds,
            g.iterations,
            g.cost,
            c.seconds,
            c.iterations,
            c.cost,
            cpu.info().name
        );
    }
    Ok(())
}
