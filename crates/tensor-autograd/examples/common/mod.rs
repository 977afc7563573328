//! The training driver shared by the examples (the backend is picked by the `backends`
//! crate).
#![allow(dead_code)]

use hal::Backend;
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Arc;
use std::time::Instant;
use tensor_autograd::data::{DataLoader, Dataset};
use tensor_autograd::distributed::{Alone, Replicas};
use tensor_autograd::models::{accuracy, train_epoch_replicated};
use tensor_autograd::nn::{ModuleExt, Sequential};
use tensor_autograd::optim::{Adam, Cosine};

/// What a training run reports.
pub struct Outcome {
    pub test_accuracy: f32,
    pub seconds: f64,
    pub steps: u64,
}

/// How to train.
pub struct Fit {
    pub epochs: usize,
    pub batch: usize,
    pub lr: f32,
    pub seed: u64,
    /// No progress bars.
    pub quiet: bool,
    /// Random one-pixel shifts of square images of this side.
    pub augment_side: Option<usize>,
}

/// Trains `model` with Adam and a cosine schedule, printing loss and accuracy per epoch with a
/// progress bar.
pub fn fit<B: Backend>(
    backend: &B,
    name: &str,
    model: &mut Sequential<B>,
    train: Arc<Dataset>,
    test: Arc<Dataset>,
    how: &Fit,
) -> Result<Outcome, String> {
    fit_replicated(backend, name, model, train, test, how, &Alone)
}

/// [`fit`] as one rank of a data-parallel group: `train` is this rank's shard (every rank's
/// the same size), the gradients are averaged through `replicas`, and only rank 0 prints and
/// measures the test accuracy (0 elsewhere).
pub fn fit_replicated<B: Backend>(
    backend: &B,
    name: &str,
    model: &mut Sequential<B>,
    train: Arc<Dataset>,
    test: Arc<Dataset>,
    how: &Fit,
    replicas: &dyn Replicas<B>,
) -> Result<Outcome, String> {
    let Fit {
        epochs,
        batch,
        lr,
        seed,
        quiet,
        augment_side,
    } = *how;
    let e = |e: tensor_autograd::Error| e.to_string();
    let (train_items, test_items) = (train.len(), test.len());
    let primary = replicas.is_primary();
    let mut loader = DataLoader::new(backend, train, batch)
        .map_err(e)?
        .shuffle(seed ^ (replicas.rank() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    if replicas.size() > 1 {
        // Equal shards give every rank the same number of whole batches.
        loader = loader.drop_last();
    }
    if let Some(side) = augment_side {
        loader =
            loader.transform(move |item, r| tensor_autograd::models::shift_image(item, side, r));
    }
    let total = (loader.num_batches() * epochs) as u64;
    let schedule = Cosine {
        base: lr,
        min: lr * 0.02,
        warmup: 0,
        total,
    };
    let mut opt = Adam::new(lr);
    let mut step = 0u64;
    let started = Instant::now();
    if primary {
        println!(
            "{name}: {} parameters, {} train / {} test items{}, batch {batch}{}, {epochs} epochs, Adam lr {lr} (cosine)",
            model.num_parameters(),
            train_items,
            test_items,
            if replicas.size() > 1 { " per rank" } else { "" },
            if replicas.size() > 1 {
                format!(" per rank on {} ranks", replicas.size())
            } else {
                String::new()
            }
        );
    }
    let mut test_accuracy = 0.0;
    for epoch in 1..=epochs {
        let bar = if quiet || !primary {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(loader.num_batches() as u64)
        };
        bar.set_style(
            ProgressStyle::with_template(
                "  epoch {prefix:>3} [{bar:30}] {pos}/{len} batches {elapsed}",
            )
            .unwrap()
            .progress_chars("=> "),
        );
        bar.set_prefix(epoch.to_string());
        let report = train_epoch_replicated(
            model,
            &mut opt,
            Some(&schedule),
            &mut loader,
            &mut step,
            &mut || bar.inc(1),
            replicas,
        )
        .map_err(e)?;
        bar.finish_and_clear();
        if !primary {
            continue;
        }
        test_accuracy = accuracy(model, backend, test.clone(), 512).map_err(e)?;
        println!(
            "  epoch {epoch:>3}: loss {:.4}, train accuracy {:.2}%, test accuracy {:.2}%  ({:.1} s)",
            report.mean_loss,
            100.0 * report.train_accuracy,
            100.0 * test_accuracy,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(Outcome {
        test_accuracy,
        seconds: started.elapsed().as_secs_f64(),
        steps: step,
    })
}

/// Runs `rank(r, communicator)` on a thread per rank of `comms` and returns the first error,
/// if any (a rank that panics counts as one).
pub fn on_ranks<C: hal::collective::Communicator>(
    comms: Vec<C>,
    rank: impl Fn(usize, C) -> Result<(), String> + Sync,
) -> Result<(), String> {
    let rank = &rank;
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, comm)| s.spawn(move || rank(r, comm)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    outcomes.into_iter().collect()
}

/// Joins `comm`'s group for the training loops: the parameters broadcast from rank 0, and
/// the gradients averaged over the ranks.
pub fn join<C: hal::collective::Communicator + 'static>(
    comm: C,
    params: &[tensor_autograd::Tensor<C::Backend>],
) -> Result<Box<dyn tensor_autograd::distributed::Replicas<C::Backend>>, String> {
    Ok(Box::new(
        tensor_autograd::distributed::DataParallel::new(comm, params).map_err(|e| e.to_string())?,
    ))
}
