//! `--suite real`: residual-compile on the standard problems Ceres is judged on, with C++
//! Ceres on the same files in the same run.
//!
//! Problems: BAL Ladybug (49 cameras, 7,776 points) and its 1,800-point subset, and the g2o
//! pose graphs sphere2500, parking-garage, torus3D (3D), intel and manhattan-odoinit (2D),
//! from `--real-data` (default `../shared/data/real`; the committed subset and intel are used
//! where it is missing, and a problem whose file is absent is "not run").
//!
//! Ceres: `peers/ceres_real.cc` (Ceres's example residuals written against its public API) is
//! compiled with g++ when `/usr/include/ceres` exists (Debian's `libceres-dev`), then run
//! with OpenBLAS preloaded where installed and `OMP_THREAD_LIMIT=1`, on as many threads as
//! the machine has: BA with the dense, sparse and iterative Schur solvers (the best time is
//! the anchor, the lowest cost the target), pose graphs with sparse normal Cholesky.
//! Otherwise Ceres is "not run", and the target and anchor are the ones quoted in the
//! table below (C++ Ceres 2.1.0 from Debian with OpenBLAS on a 2-core machine, the best of
//! 2-3 runs; its ratio column is marked `q`): a GPU host without Ceres still reports time to
//! Ceres's cost.
//!
//! Ours: the solve on this backend in f64, the library's default options (capped at the
//! iteration count Ceres's examples use), warm: a one-iteration solve first compiles the
//! kernels into the backend's cache, as an earlier solve in the process would (the cold
//! compile time is printed beside). Reported: our final cost, the time to reach Ceres's final
//! cost (what compilation remains included, to the end of the first iteration at or below
//! it), the whole solve's time, and time-to-cost over Ceres's best time.

use hal::Backend;
use residual_compile::bal::BalProblem;
use residual_compile::pose_graph::PoseGraph;
use residual_compile::{KernelCache, Loss, Problem, SolveOptions, Summary, solve};
use std::path::{Path, PathBuf};
use std::process::Command;

const CERES_PEER: &str = include_str!("../peers/ceres_real.cc");

#[derive(Clone)]
pub struct RealArgs {
    pub data: PathBuf,
    /// Only the problems whose names contain one of these (all when empty).
    pub only: Vec<String>,
}

/// A problem of the suite: its name, file, kind, the iteration cap of Ceres's example, and
/// Ceres's final cost and best time as quoted (see the module docs).
struct Case {
    name: &'static str,
    file: &'static str,
    bal: bool,
    max_iterations: usize,
    quoted: (f64, f64),
}

const CASES: [Case; 7] = [
    Case {
        name: "ladybug-1800",
        file: "bal-ladybug-problem-49-7776-pre-shrink-1800.txt",
        bal: true,
        max_iterations: 100,
        quoted: (3.001359e3, 0.262),
    },
    Case {
        name: "ladybug",
        file: "problem-49-7776-pre.txt",
        bal: true,
        max_iterations: 100,
        quoted: (1.334426e4, 5.82),
    },
    Case {
        name: "intel",
        file: "intel.g2o",
        bal: false,
        max_iterations: 200,
        quoted: (2.293880e1, 0.051),
    },
    Case {
        name: "manhattan-odoinit",
        file: "manhattan-odoinit.g2o",
        bal: false,
        max_iterations: 200,
        quoted: (1.902703e3, 0.509),
    },
    Case {
        name: "sphere2500",
        file: "sphere2500.g2o",
        bal: false,
        max_iterations: 200,
        quoted: (6.757562e2, 0.595),
    },
    Case {
        name: "parking-garage",
        file: "parking-garage.g2o",
        bal: false,
        max_iterations: 200,
        quoted: (6.341883e-1, 0.512),
    },
    Case {
        name: "torus3D",
        file: "torus3D.g2o",
        bal: false,
        max_iterations: 200,
        quoted: (2.255619e4, 8.18),
    },
];

/// Ceres's result on one problem.
struct CeresRun {
    initial: f64,
    cost: f64,
    iterations: usize,
    seconds: f64,
    solver: String,
}

pub fn real<B: Backend>(b: &B, args: &RealArgs) -> Result<(), String> {
    let ceres = build_ceres();
    if let Err(why) = &ceres {
        println!("real: C++ Ceres not run: {why}");
    }
    println!(
        "real: {:<18} {:>14} {:>14} {:>5} {:>8} | {:>14} {:>5} {:>9} {:>8} {:>7}",
        "problem",
        "initial cost",
        "Ceres cost",
        "iters",
        "Ceres s",
        "our cost",
        "iters",
        "to-cost s",
        "total s",
        "ratio"
    );
    for case in &CASES {
        if !args.only.is_empty() && !args.only.iter().any(|o| case.name.contains(o.as_str())) {
            continue;
        }
        let Some(path) = locate(&args.data, case.file) else {
            println!("real: {:<18} not run: {} not found", case.name, case.file);
            continue;
        };
        let peer = match &ceres {
            Ok(exe) => run_ceres(exe, case, &path)
                .map_err(|e| println!("real: {:<18} Ceres failed: {e}", case.name))
                .ok(),
            Err(_) => None,
        };
        let (ours, cold) = run_ours(b, case, &path)?;
        let (target, anchor) = match &peer {
            Some(p) => (p.cost, p.seconds),
            None => case.quoted,
        };
        // A quoted cost has 7 digits: within half a unit of its last.
        let slack = if peer.is_some() { 1e-9 } else { 5e-7 };
        let to_cost = time_to_cost(&ours, target, slack);
        let fmt_opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".into(), f);
        println!(
            "real: {:<18} {:>14.6e} {:>14} {:>5} {:>8} | {:>14.6e} {:>5} {:>9} {:>8.3} {:>7}",
            case.name,
            ours.initial_cost,
            format!("{target:.6e}"),
            peer.as_ref()
                .map_or("-".into(), |p| p.iterations.to_string()),
            format!("{anchor:.3}"),
            ours.final_cost,
            ours.iterations,
            fmt_opt(to_cost, &|s| format!("{s:.3}")),
            ours.times.total,
            match (to_cost, peer.is_some()) {
                (Some(t), true) => format!("{:.2}x", t / anchor),
                (Some(t), false) => format!("{:.2}x q", t / anchor),
                (None, _) => "not met".into(),
            }
        );
        let t = &ours.times;
        println!(
            "real: {:<18} ours: {:?}, cold compile {:.3} s; warm {:.3} s = compile {:.3} + \
             evaluate {:.3} + linearize {:.3} + linear solve {:.3} + other",
            case.name,
            ours.linear_solver,
            cold,
            t.total,
            t.compile,
            t.evaluate,
            t.linearize,
            t.linear_solve
        );
        if let Some(p) = &peer {
            if (p.initial - ours.initial_cost).abs() > 1e-9 * p.initial {
                println!(
                    "real: {:<18} note: initial costs differ (Ceres {:.9e}, ours {:.9e})",
                    case.name, p.initial, ours.initial_cost
                );
            }
            println!(
                "real: {:<18} Ceres's best: {} ({} threads)",
                case.name,
                p.solver,
                threads()
            );
        }
    }
    Ok(())
}

/// `name` in `dir`, else in residual-compile's committed data.
fn locate(dir: &Path, name: &str) -> Option<PathBuf> {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../residual-compile/data");
    [dir.join(name), committed.join(name)]
        .into_iter()
        .find(|p| p.is_file())
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn problem_of(case: &Case, path: &Path) -> Result<Problem, String> {
    if case.bal {
        let bal = BalProblem::read(path).map_err(|e| e.to_string())?;
        bal.problem(Loss::Trivial).map_err(|e| e.to_string())
    } else {
        let graph = PoseGraph::read(path).map_err(|e| e.to_string())?;
        graph.problem().map_err(|e| e.to_string())
    }
}

/// Our solve, measured warm: a one-iteration solve first compiles every kernel into the
/// backend's own cache (what a second solve in one process finds); the measured solve then
/// starts from the file again. The warm-up's compile time, the cold cost, is returned too.
fn run_ours<B: Backend>(b: &B, case: &Case, path: &Path) -> Result<(Summary, f64), String> {
    let fail = |e: residual_compile::Error| format!("{}: {e}", case.name);
    let warm_up = SolveOptions {
        max_iterations: 1,
        ..Default::default()
    };
    let cold = solve(
        b,
        &mut problem_of(case, path)?,
        &warm_up,
        &KernelCache::new(),
    )
    .map_err(fail)?
    .times
    .compile;
    let options = SolveOptions {
        max_iterations: case.max_iterations,
        ..Default::default()
    };
    let ours = solve(
        b,
        &mut problem_of(case, path)?,
        &options,
        &KernelCache::new(),
    )
    .map_err(fail)?;
    Ok((ours, cold))
}

/// Seconds from the start of the solve (compilation and the linear solver's analysis
/// included) to the end of the first iteration whose accepted cost is at or below `target`
/// (relative `slack`: 1e-9 for Ceres's printed 10 digits).
fn time_to_cost(s: &Summary, target: f64, slack: f64) -> Option<f64> {
    let goal = target * (1.0 + slack);
    if s.initial_cost <= goal {
        return Some(s.times.compile);
    }
    s.history
        .iter()
        .find(|it| it.step_is_successful && it.candidate_cost <= goal)
        .map(|it| it.cumulative_time)
}

/// Compiles the Ceres peer; the executable's path, or why it cannot be.
fn build_ceres() -> Result<PathBuf, String> {
    if !Path::new("/usr/include/ceres/ceres.h").exists() {
        return Err("libceres-dev is not installed (apt-get install libceres-dev)".into());
    }
    let dir = std::env::temp_dir().join(format!("bench-ceres-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("ceres_real.cc");
    std::fs::write(&src, CERES_PEER).map_err(|e| e.to_string())?;
    let exe = dir.join("ceres_real");
    let out = Command::new("g++")
        .args(["-O2", "-std=c++17"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .args([
            "-I/usr/include/eigen3",
            "-lceres",
            "-lglog",
            "-lgflags",
            "-lpthread",
        ])
        .output()
        .map_err(|e| format!("g++ could not start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "g++ failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .take(5)
                .collect::<Vec<_>>()
                .join(" / ")
        ));
    }
    Ok(exe)
}

fn run_ceres(exe: &Path, case: &Case, path: &Path) -> Result<CeresRun, String> {
    let solvers: &[&str] = if case.bal {
        &["dense_schur", "sparse_schur", "iterative_schur"]
    } else {
        &["sparse_normal_cholesky"]
    };
    let mut best: Option<CeresRun> = None;
    for solver in solvers {
        let mut cmd = Command::new(exe);
        if case.bal {
            cmd.arg("bal")
                .arg(path)
                .arg(solver)
                .arg(threads().to_string());
        } else {
            cmd.arg("g2o").arg(path).arg(threads().to_string());
        }
        cmd.env("OMP_THREAD_LIMIT", "1");
        let openblas = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0";
        if Path::new(openblas).exists() {
            cmd.env("LD_PRELOAD", openblas);
        }
        let out = cmd.output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.starts_with("ceres "))
            .ok_or_else(|| {
                format!(
                    "no result ({})",
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            })?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
        let run = CeresRun {
            initial: num(1).ok_or("bad output")?,
            cost: num(2).ok_or("bad output")?,
            iterations: num(3).ok_or("bad output")? as usize,
            seconds: num(4).ok_or("bad output")?,
            solver: f.get(5).unwrap_or(solver).to_string(),
        };
        // The anchor is Ceres's best time; its cost is the lowest any solver reached.
        best = Some(match best {
            None => run,
            Some(b) => CeresRun {
                cost: b.cost.min(run.cost),
                ..if run.seconds < b.seconds { run } else { b }
            },
        });
    }
    best.ok_or_else(|| "no solver ran".into())
}
