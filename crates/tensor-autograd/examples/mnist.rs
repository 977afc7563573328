//! Trains the LeNet-style CNN (two 3x3 convolutions of 32 and 64 channels with ReLU and 2x2
//! max-pooling, then 128 hidden units) on the real MNIST: 60,000 training images, accuracy on
//! the 10,000 test images after each epoch (Adam with a cosine schedule, random one-pixel
//! shifts). Get the data first (nothing downloads at run time):
//!
//! ```sh
//! cargo xtask fetch mnist
//! cargo run --release -p tensor-autograd --example mnist -- --backend auto --require 99.0
//! cargo run --release -p tensor-autograd --example mnist -- --backend cuda --devices 2
//! ```
//!
//! `--devices N` trains data-parallel: rank r takes the r-th of N equal parts of the training
//! images, `--batch` images a step each, and the gradients are averaged over the ranks.

mod common;

use clap::Parser;
use hal::Backend;
use hal::collective::Communicator;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tensor_autograd::data::Dataset;
use tensor_autograd::distributed::{Alone, Replicas};
use tensor_autograd::idx::{MnistSplit, load_mnist};
use tensor_autograd::models::lenet;
use tensor_autograd::nn::{Init, ModuleExt};

#[derive(Parser, Debug)]
#[command(about = "Train LeNet on the real MNIST and report test accuracy")]
struct Args {
    /// cpu, wgpu, cuda or auto (the best present)
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Devices to train on, data-parallel (cuda: GPUs 0..N over NCCL; cpu: N threads)
    #[arg(long, default_value_t = 1)]
    devices: usize,
    /// Train on the first this many training images only (a quick run)
    #[arg(long)]
    limit: Option<usize>,
    /// The folder `cargo xtask fetch mnist` fills.
    #[arg(long, default_value = "data/mnist")]
    data: PathBuf,
    #[arg(long, default_value_t = 6)]
    epochs: usize,
    #[arg(long, default_value_t = 128)]
    batch: usize,
    #[arg(long, default_value_t = 2e-3)]
    lr: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Save the trained parameters (safetensors) here
    #[arg(long)]
    save: Option<PathBuf>,
    /// No progress bars
    #[arg(long)]
    quiet: bool,
    /// Fail unless the test accuracy reaches this (percent)
    #[arg(long)]
    require: Option<f32>,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    let args = Args::parse();
    if args.devices <= 1 {
        // One thread drives the backend (ranks are threads of their own otherwise).
        backends::join_rayon_pool("mnist");
    }
    let choice = backends::resolve(&args.backend).to_string();
    println!("mnist: backend {choice}");
    let outcome = if args.devices > 1 {
        backends::on_group!(choice.as_str(), args.devices, parallel(&args))
    } else {
        backends::on_backend!(choice.as_str(), alone(&args))
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mnist: {e}");
            ExitCode::FAILURE
        }
    }
}

type Splits = (Dataset, Dataset);

fn load(args: &Args) -> Result<Splits, String> {
    let mut train = load_mnist(&args.data, MnistSplit::Train).map_err(|e| e.to_string())?;
    let test = load_mnist(&args.data, MnistSplit::Test).map_err(|e| e.to_string())?;
    if let Some(n) = args.limit {
        train = train.subset(&(0..n.min(train.len())).collect::<Vec<_>>());
    }
    println!(
        "mnist: {} training and {} test images from {}",
        train.len(),
        test.len(),
        args.data.display()
    );
    Ok((train, test))
}

fn alone<B: Backend>(backend: &B, args: &Args) -> Result<(), String> {
    let (train, test) = load(args)?;
    run(backend, args, train, test, |_| Ok(Box::new(Alone)))
}

/// A thread per rank; rank r trains on the r-th equal part of the training images.
fn parallel<C: Communicator + 'static>(comms: Vec<C>, args: &Args) -> Result<(), String> {
    let (train, test) = load(args)?;
    let size = comms.len();
    let per = train.len() / size;
    println!("mnist: data-parallel over {size} devices, {per} training images each");
    let (train, test) = (&train, &test);
    common::on_ranks(comms, |rank, comm| {
        let shard = train.subset(&(rank * per..(rank + 1) * per).collect::<Vec<_>>());
        let backend = comm.backend().clone();
        run(&backend, args, shard, test.clone(), move |params| {
            common::join(comm, params)
        })
    })
}

fn run<'a, B: Backend>(
    backend: &B,
    args: &Args,
    train: Dataset,
    test: Dataset,
    join: impl FnOnce(&[tensor_autograd::Tensor<B>]) -> Result<Box<dyn Replicas<B> + 'a>, String>,
) -> Result<(), String> {
    let mut init = Init::new(backend, args.seed.wrapping_add(17));
    let mut model = lenet(&mut init, 1, 28, (32, 64), 128, 10).map_err(|e| e.to_string())?;
    let replicas = join(&model.parameters())?;
    let how = common::Fit {
        epochs: args.epochs,
        batch: args.batch,
        lr: args.lr,
        seed: args.seed,
        quiet: args.quiet,
        augment_side: Some(28),
    };
    let outcome = common::fit_replicated(
        backend,
        "lenet",
        &mut model,
        Arc::new(train),
        Arc::new(test),
        &how,
        &*replicas,
    )?;
    if !replicas.is_primary() {
        return Ok(());
    }
    let accuracy = 100.0 * outcome.test_accuracy;
    println!(
        "mnist on {}: LeNet test accuracy {accuracy:.2}% after {} epochs, {:.1} s ({} steps)",
        backend.info().name,
        args.epochs,
        outcome.seconds,
        outcome.steps
    );
    if let Some(path) = &args.save {
        model.save(path).map_err(|e| e.to_string())?;
        println!("mnist: parameters saved to {}", path.display());
    }
    match args.require {
        Some(req) if accuracy < req => Err(format!("{accuracy:.2}% < required {req}%")),
        _ => Ok(()),
    }
}
