//! Trains the bench's models (a 784-512-512-10 MLP and a LeNet-style CNN: two 3x3 conv + ReLU +
//! max-pool, two Linear) on synthetic MNIST-shaped data (28x28, 10 classes: a prototype per
//! class plus noise), for speed measurements with a realistic input pipeline.
//!
//! cargo run --release -p tensor-autograd --example mnist_shape -- --backend auto --items 10000

mod common;

use clap::Parser;
use hal::Backend;
use std::process::ExitCode;
use std::sync::Arc;
use tensor_autograd::models::{lenet, mlp, synthetic_mnist};
use tensor_autograd::nn::Init;

#[derive(Parser, Debug)]
#[command(about = "Train the MLP and the CNN on synthetic 28x28 data and report step times")]
struct Args {
    /// cpu, wgpu, cuda or auto
    #[arg(long, default_value = "auto")]
    backend: String,
    /// mlp, cnn or both
    #[arg(long, default_value = "both")]
    model: String,
    #[arg(long, default_value_t = 10_000)]
    items: usize,
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    #[arg(long, default_value_t = 256)]
    batch: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    backends::join_rayon_pool("mnist_shape");
    let args = Args::parse();
    let choice = backends::resolve(&args.backend).to_string();
    println!("mnist_shape: backend {choice}");
    match backends::on_backend!(choice.as_str(), run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mnist_shape: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run<B: Backend>(backend: &B, args: &Args) -> Result<(), String> {
    let data = synthetic_mnist(args.items, args.seed).map_err(|e| e.to_string())?;
    let (train, test) = data.split(0.9, args.seed);
    let (train, test) = (Arc::new(train), Arc::new(test));
    for name in ["mlp", "cnn"] {
        if args.model != "both" && args.model != name {
            continue;
        }
        let mut init = Init::new(backend, args.seed + 1);
        let mut model = if name == "mlp" {
            mlp(&mut init, &[784, 512, 512, 10])
        } else {
            lenet(&mut init, 1, 28, (32, 64), 128, 10)
        }
        .map_err(|e| e.to_string())?;
        let how = common::Fit {
            epochs: args.epochs,
            batch: args.batch,
            lr: 1e-3,
            seed: args.seed,
            quiet: args.quiet,
            augment_side: None,
        };
        let outcome = common::fit(backend, name, &mut model, train.clone(), test.clone(), &how)?;
        println!(
            "{name}: {:.3} ms per step including data loading ({} steps), test accuracy {:.2}%",
            outcome.seconds * 1e3 / outcome.steps.max(1) as f64,
            outcome.steps,
            100.0 * outcome.test_accuracy
        );
    }
    Ok(())
}
