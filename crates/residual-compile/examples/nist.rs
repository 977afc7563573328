//! `nist`: grade the solver on NIST's 27 certified nonlinear regression problems (StRD), from
//! both starting points, as NIST grades software: the log relative error (LRE) of the worst
//! certified parameter, and how many of the 54 runs reach LRE 4 and 6.
//!
//! ```sh
//! cargo run --release -p residual-compile --example nist -- --backend cpu
//! ```

#[path = "../tests/common/nist.rs"]
mod nist;

use clap::Parser;
use hal::Backend;
use residual_compile::{Precision, SolveOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Grade the solver on the NIST StRD nonlinear regression problems")]
struct Args {
    /// cpu, wgpu, cuda, or auto.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// The folder of NIST `.dat` files.
    #[arg(long)]
    data: Option<PathBuf>,
    /// f64 (the default) or f32.
    #[arg(long, default_value = "f64")]
    precision: String,
    /// Overrides of the library's default tolerances.
    #[arg(long)]
    function_tolerance: Option<f64>,
    #[arg(long)]
    gradient_tolerance: Option<f64>,
    #[arg(long)]
    parameter_tolerance: Option<f64>,
    /// Only the problems whose names contain this.
    #[arg(long, default_value = "")]
    only: String,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    backends::join_rayon_pool("nist");
    let args = Args::parse();
    let choice = backends::resolve(&args.backend).to_string();
    match backends::on_backend!(choice.as_str(), run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nist: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run<B: Backend>(backend: &B, args: &Args) -> Result<(), String> {
    let defaults = SolveOptions::default();
    let options = SolveOptions {
        precision: match args.precision.as_str() {
            "f64" => Precision::F64,
            "f32" => Precision::F32,
            p => return Err(format!("unknown precision {p} (expected f64 or f32)")),
        },
        function_tolerance: args
            .function_tolerance
            .unwrap_or(defaults.function_tolerance),
        gradient_tolerance: args
            .gradient_tolerance
            .unwrap_or(defaults.gradient_tolerance),
        parameter_tolerance: args
            .parameter_tolerance
            .unwrap_or(defaults.parameter_tolerance),
        ..defaults
    };
    let dir = args.data.clone().unwrap_or_else(nist::data_dir);
    let all = nist::load_all(&dir)?;
    println!(
        "nist: {} problems from {}, backend {}, precision {:?}",
        all.len(),
        dir.display(),
        backend.info().name,
        options.precision
    );
    let (mut runs, mut four, mut six) = (0, 0, 0);
    for c in all.iter().filter(|c| c.name.contains(&args.only)) {
        for start in 0..2 {
            let g = nist::grade(backend, c, start, &options);
            println!("{}", g.line());
            runs += 1;
            four += usize::from(g.parameter_lre >= 4.0);
            six += usize::from(g.parameter_lre >= 6.0);
        }
    }
    println!("nist: LRE >= 4 on {four} of {runs} runs, LRE >= 6 on {six} of {runs}");
    Ok(())
}
