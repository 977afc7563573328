//! Datasets held on the host and a [`DataLoader`] that batches them: seeded shuffling per
//! epoch, and a background thread that assembles (and augments) and uploads the next batches
//! while the current one trains.

use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::Backend;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

/// Labelled examples: `features` holds `len` items of `item_shape` each, row-major.
#[derive(Clone, Debug)]
pub struct Dataset {
    pub features: Vec<f32>,
    pub item_shape: Vec<usize>,
    pub labels: Vec<u32>,
}

impl Dataset {
    pub fn new(features: Vec<f32>, item_shape: &[usize], labels: Vec<u32>) -> Result<Self> {
        let item: usize = item_shape.iter().product();
        if item == 0 || features.len() != item * labels.len() {
            return Err(invalid(
                "Dataset::new",
                format!(
                    "{} feature values do not make {} items of shape {item_shape:?}",
                    features.len(),
                    labels.len()
                ),
            ));
        }
        if let Some(bad) = features.iter().position(|v| !v.is_finite()) {
            return Err(invalid(
                "Dataset::new",
                format!("feature value {bad} is NaN or infinite"),
            ));
        }
        Ok(Self {
            features,
            item_shape: item_shape.to_vec(),
            labels,
        })
    }
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
    fn item_len(&self) -> usize {
        self.item_shape.iter().product()
    }
    /// The items at `indices`, in that order.
    pub fn subset(&self, indices: &[usize]) -> Dataset {
        let n = self.item_len();
        let mut features = Vec::with_capacity(indices.len() * n);
        for &i in indices {
            features.extend_from_slice(&self.features[i * n..(i + 1) * n]);
        }
        Dataset {
            features,
            item_shape: self.item_shape.clone(),
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
        }
    }
    /// Per-feature mean and standard deviation over the items.
    pub fn feature_stats(&self) -> (Vec<f32>, Vec<f32>) {
        let (d, n) = (self.item_len(), self.len().max(1) as f64);
        let mut mean = vec![0f64; d];
        let mut var = vec![0f64; d];
        for row in self.features.chunks(d) {
            for (m, &v) in mean.iter_mut().zip(row) {
                *m += v as f64 / n;
            }
        }
        for row in self.features.chunks(d) {
            for ((s, &m), &v) in var.iter_mut().zip(&mean).zip(row) {
                *s += (v as f64 - m).powi(2) / n;
            }
        }
        (
            mean.iter().map(|&m| m as f32).collect(),
            var.iter().map(|&v| v.sqrt() as f32).collect(),
        )
    }
    /// `(x - mean) / (std + floor)` per feature (the floor keeps constant pixels finite).
    pub fn normalize(&mut self, mean: &[f32], std: &[f32], floor: f32) {
        for row in self.features.chunks_mut(mean.len()) {
            for ((v, &m), &s) in row.iter_mut().zip(mean).zip(std) {
                *v = (*v - m) / (s + floor);
            }
        }
    }
    /// A seeded random split: the first part gets `round(fraction * len)` items.
    pub fn split(&self, fraction: f64, seed: u64) -> (Dataset, Dataset) {
        let order = permutation(self.len(), seed);
        let cut = ((fraction * self.len() as f64).round() as usize).min(self.len());
        (self.subset(&order[..cut]), self.subset(&order[cut..]))
    }
}

/// SplitMix64's output function of `state + golden`: a well-mixed word per input.
pub(crate) fn splitmix(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded Fisher-Yates permutation of `0..n`.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let z = splitmix(seed ^ splitmix(i as u64));
        let j = (z % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// One batch on the device: `x: [batch, item_shape...]` (f32) and `y: [batch]` (u32).
pub struct Batch<B: Backend> {
    pub x: Tensor<B>,
    pub y: Tensor<B>,
}

/// Batches of a [`Dataset`] on a device.
pub struct DataLoader<B: Backend> {
    backend: B,
    data: Arc<Dataset>,
    batch_size: usize,
    shuffle_seed: Option<u64>,
    drop_last: bool,
    epoch: u64,
    prefetch: usize,
    transform: Option<Transform>,
}

/// A per-item augmentation run on the loader's thread: it gets the item's features and a
/// random word that depends on the shuffle seed, the epoch and the item's position.
pub type Transform = Arc<dyn Fn(&mut [f32], u64) + Send + Sync>;

impl<B: Backend> DataLoader<B> {
    pub fn new(backend: &B, data: Arc<Dataset>, batch_size: usize) -> Result<Self> {
        if batch_size == 0 {
            return Err(invalid("DataLoader::new", "batch size must be at least 1"));
        }
        Ok(Self {
            backend: backend.clone(),
            data,
            batch_size,
            shuffle_seed: None,
            drop_last: false,
            epoch: 0,
            prefetch: 2,
            transform: None,
        })
    }
    /// Shuffles every epoch, from `seed` and the epoch number.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.shuffle_seed = Some(seed);
        self
    }
    /// Drops a last, smaller batch.
    pub fn drop_last(mut self) -> Self {
        self.drop_last = true;
        self
    }
    /// Batches in flight ahead of the consumer (default 2).
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch = batches.max(1);
        self
    }
    /// Applies `transform` to every item of every training batch (data augmentation).
    pub fn transform(
        mut self,
        transform: impl Fn(&mut [f32], u64) + Send + Sync + 'static,
    ) -> Self {
        self.transform = Some(Arc::new(transform));
        self
    }
    pub fn num_batches(&self) -> usize {
        let n = self.data.len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// The next epoch's batches. A thread assembles and uploads them ahead of use; dropping
    /// the iterator stops it.
    pub fn epoch(&mut self) -> Batches<B> {
        let salt = splitmix(self.shuffle_seed.unwrap_or(0) ^ splitmix(self.epoch));
        let transform = self.transform.clone();
        let order = match self.shuffle_seed {
            Some(seed) => permutation(
                self.data.len(),
                seed ^ self.epoch.wrapping_mul(0xA24B_AED4_963E_E407),
            ),
            None => (0..self.data.len()).collect(),
        };
        self.epoch += 1;
        let (tx, rx) = sync_channel(self.prefetch);
        let (data, backend, batch_size, batches) = (
            self.data.clone(),
            self.backend.clone(),
            self.batch_size,
            self.num_batches(),
        );
        let worker = std::thread::spawn(move || {
            let item = data.item_len();
            for b in 0..batches {
                let idx = &order[b * batch_size..((b + 1) * batch_size).min(order.len())];
                let mut features = Vec::with_capacity(idx.len() * item);
                for (k, &i) in idx.iter().enumerate() {
                    let at = features.len();
                    features.extend_from_slice(&data.features[i * item..(i + 1) * item]);
                    if let Some(t) = &transform {
                        t(
                            &mut features[at..],
                            splitmix(salt ^ (b * batch_size + k) as u64),
                        );
                    }
                }
                let labels: Vec<u32> = idx.iter().map(|&i| data.labels[i]).collect();
                let mut shape = vec![idx.len()];
                shape.extend_from_slice(&data.item_shape);
                let batch = Tensor::from_slice(&backend, &features, &shape).and_then(|x| {
                    let y = Tensor::from_elements(&backend, &labels, &[labels.len()])?;
                    Ok(Batch { x, y })
                });
                if tx.send(batch).is_err() {
                    return; // the consumer stopped early
                }
            }
        });
        Batches {
            rx: Some(rx),
            worker: Some(worker),
            remaining: batches,
        }
    }
}

/// An epoch's batches, assembled (augmented) and uploaded by a background thread ahead of
/// use: the uploads are enqueued on the device while the current step trains.
pub struct Batches<B: Backend> {
    rx: Option<Receiver<Result<Batch<B>>>>,
    worker: Option<JoinHandle<()>>,
    remaining: usize,
}

impl<B: Backend> Iterator for Batches<B> {
    type Item = Result<Batch<B>>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let Ok(batch) = self.rx.as_ref()?.recv() else {
            // The worker stopped before the epoch's end: report it rather than end short.
            self.remaining = 0;
            return Some(Err(invalid(
                "DataLoader",
                "the loader thread stopped before the end of the epoch (it panicked)",
            )));
        };
        Some(batch)
    }
}

impl<B: Backend> Drop for Batches<B> {
    fn drop(&mut self) {
        self.rx.take(); // unblocks a worker waiting to send
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
