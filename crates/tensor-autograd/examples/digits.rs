//! Trains an MLP and a small CNN on the UCI handwritten digits (1,797 8x8 images, CC BY 4.0,
//! the copy scikit-learn ships, converted by `data/convert_digits.py`) with a seeded 80/20
//! split, printing loss and accuracy per epoch.
//!
//! cargo run --release -p tensor-autograd --example digits -- --backend cpu

mod common;

use clap::Parser;
use hal::Backend;
use std::process::ExitCode;
use std::sync::Arc;
use tensor_autograd::data::Dataset;
use tensor_autograd::models::{digits_cnn, digits_mlp, load_digits, parse_digits};
use tensor_autograd::nn::{Init, ModuleExt};

/// The UCI digits as `data/convert_digits.py` writes them, built into the binary.
const DIGITS: &[u8] = include_bytes!("../data/digits.bin");

#[derive(Parser, Debug)]
#[command(about = "Train an MLP and a CNN on the UCI digits on a chosen backend")]
struct Args {
    /// cpu, wgpu, cuda or auto (the best present)
    #[arg(long, default_value = "auto")]
    backend: String,
    /// mlp, cnn or both
    #[arg(long, default_value = "both")]
    model: String,
    /// Epochs (default: 40 for the MLP, 20 for the CNN)
    #[arg(long)]
    epochs: Option<usize>,
    #[arg(long, default_value_t = 32)]
    batch: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A digits file to read instead of the embedded set (the same file, built in)
    #[arg(long)]
    data: Option<std::path::PathBuf>,
    /// Save the trained models' parameters to DIR/mlp.safetensors and DIR/cnn.safetensors
    #[arg(long)]
    save: Option<std::path::PathBuf>,
    /// No progress bars
    #[arg(long)]
    quiet: bool,
    /// Fail unless the MLP reaches this test accuracy (percent)
    #[arg(long)]
    require_mlp: Option<f32>,
    /// Fail unless the CNN reaches this test accuracy (percent)
    #[arg(long)]
    require_cnn: Option<f32>,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    backends::join_rayon_pool("digits");
    let args = Args::parse();
    let choice = backends::resolve(&args.backend).to_string();
    println!(
        "digits: backend {choice}{}",
        if args.backend == "auto" {
            " (auto)"
        } else {
            ""
        }
    );
    match backends::on_backend!(choice.as_str(), run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("digits: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run<B: Backend>(backend: &B, args: &Args) -> Result<(), String> {
    // The set is embedded (117 KB), so the binary runs from anywhere; --data reads another.
    let data = match &args.data {
        Some(path) => load_digits(path),
        None => parse_digits(DIGITS, "the embedded digits set"),
    }
    .map_err(|e| e.to_string())?;
    let (train, test) = data.split(0.8, args.seed);
    let (train, test) = (Arc::new(train), Arc::new(test));
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for name in ["mlp", "cnn"] {
        if args.model != "both" && args.model != name {
            continue;
        }
        let mut init = Init::new(backend, args.seed.wrapping_add(17));
        // The MLP trains on standardised pixels (statistics of the training split); the CNN on
        // the raw [0, 1] pixels, with random one-pixel shifts as augmentation.
        let (mut model, epochs, lr, augment, required) = if name == "mlp" {
            (
                digits_mlp(&mut init).map_err(|e| e.to_string())?,
                args.epochs.unwrap_or(40),
                2e-3,
                None,
                args.require_mlp,
            )
        } else {
            (
                digits_cnn(&mut init).map_err(|e| e.to_string())?,
                args.epochs.unwrap_or(20),
                3e-3,
                Some(8),
                args.require_cnn,
            )
        };
        let (train, test) = if name == "mlp" {
            let (mean, std) = train.feature_stats();
            let (mut a, mut b) = (Dataset::clone(&train), Dataset::clone(&test));
            a.normalize(&mean, &std, 0.1);
            b.normalize(&mean, &std, 0.1);
            (Arc::new(a), Arc::new(b))
        } else {
            (train.clone(), test.clone())
        };
        let how = common::Fit {
            epochs,
            batch: args.batch,
            lr,
            seed: args.seed,
            quiet: args.quiet,
            augment_side: augment,
        };
        let outcome = common::fit(backend, name, &mut model, train, test, &how)?;
        if let Some(dir) = &args.save {
            let path = dir.join(format!("{name}.safetensors"));
            model.save(&path).map_err(|e| e.to_string())?;
            println!("{name}: parameters saved to {}", path.display());
        }
        summary.push(format!(
            "{name} {:.2}% in {:.1} s ({} steps)",
            100.0 * outcome.test_accuracy,
            outcome.seconds,
            outcome.steps
        ));
        if let Some(req) = required {
            if 100.0 * outcome.test_accuracy < req {
                failures.push(format!(
                    "{name} reached {:.2}% < required {req}%",
                    100.0 * outcome.test_accuracy
                ));
            }
        }
    }
    println!(
        "digits on {}: test accuracy {}",
        backend.info().name,
        summary.join(", ")
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}
