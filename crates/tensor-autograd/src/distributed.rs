//! Data-parallel training over a [`hal::Communicator`], as PyTorch's `DistributedDataParallel`.
//!
//! Each rank (a thread or a process, one device each) holds a replica of the model and trains
//! on its own shard of every batch. [`DataParallel::new`] broadcasts the parameters from rank 0,
//! so the replicas start equal; [`DataParallel::backward`] runs the backward pass and averages
//! the gradients over the ranks, in buckets of about [`DEFAULT_BUCKET_BYTES`]: each bucket's
//! all-reduce is enqueued as soon as the backward pass has finished every gradient in it, while
//! the pass goes on producing the others, and buckets go out in one fixed order on every rank
//! (the reverse of the parameters', the order a backward pass finishes them), whatever order
//! the pass finishes them in. The optimiser then takes the same step on every rank, so the
//! replicas stay equal bit for bit (every rank receives the same bits from an all-reduce).
//!
//! A parameter that took no part in a rank's loss counts as a zero gradient there. For
//! gradient accumulation call [`Tensor::backward`] on all micro-batches but the last and
//! [`DataParallel::backward`] on the last (its averaging covers the accumulated sums), or
//! [`DataParallel::all_reduce_grads`] after them all. [`DataParallel::shard_seed`] gives each
//! rank its own stream of random batches; [`DataParallel::is_primary`] is the rank that logs and
//! writes checkpoints.
//!
//! The all-reduces are overlapped ([`Communicator::all_reduce_overlapped`]): on NCCL they run
//! on a stream of their own beside the rest of the backward pass, and the gradients are handed
//! back once the pass has been enqueued whole (the optimiser's kernels wait for them on the
//! device, not the host). On the CPU reference they run in order.

use crate::autograd::with_leaf_hook;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use hal::collective::{CollectiveOp, Communicator};
use hal::{Backend, DeviceBuffer, Layout, View};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The gradients averaged by one all-reduce, about PyTorch DDP's default bucket (25 MiB).
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// How long [`DataParallel::new`] and [`DataParallel::synchronize`] wait for the peers.
pub const TIMEOUT: Duration = Duration::from_secs(600);

/// Parameters and buckets, shared with the backward hook.
struct Shared<C: Communicator> {
    comm: C,
    params: Vec<Tensor<C::Backend>>,
    /// Parameter positions per bucket, in launch order; one dtype per bucket.
    buckets: Vec<Vec<usize>>,
    bucket_of: Vec<usize>,
    position: HashMap<u64, usize>,
    /// During a backward pass: gradients still missing per bucket, and the next bucket to go.
    pending: Mutex<(Vec<usize>, usize)>,
    /// Buckets whose all-reduce is under way: the flat buffer, and each member's place in it.
    reducing: Mutex<Vec<Reducing<C::Backend>>>,
}

/// A bucket whose all-reduce is under way: its index, its flat buffer, its members' places.
type Reducing<B> = (usize, <B as Backend>::Buffer, Vec<Layout>);

/// One rank's replica of a model's parameters (see the module docs).
pub struct DataParallel<C: Communicator + 'static> {
    shared: Arc<Shared<C>>,
}

fn invalid(detail: String) -> Error {
    Error::InvalidArgument {
        op: "DataParallel",
        detail,
    }
}

impl<C: Communicator + 'static> DataParallel<C> {
    /// Wraps `params` (each parameter once: a tied weight listed twice counts once) with
    /// [`DEFAULT_BUCKET_BYTES`] buckets and broadcasts them from rank 0.
    pub fn new(comm: C, params: &[Tensor<C::Backend>]) -> Result<Self> {
        Self::with_bucket_bytes(comm, params, DEFAULT_BUCKET_BYTES)
    }

    /// As [`DataParallel::new`], with buckets of about `bucket_bytes`.
    pub fn with_bucket_bytes(
        comm: C,
        params: &[Tensor<C::Backend>],
        bucket_bytes: usize,
    ) -> Result<Self> {
        let mut unique: Vec<Tensor<C::Backend>> = Vec::new();
        for p in params {
            let seen = unique.iter().any(|q| {
                q.id() == p.id() || (q.buffer().same_memory(p.buffer()) && q.layout() == p.layout())
            });
            if seen {
                continue;
            }
            if !p.is_contiguous() || !p.dtype().is_float() {
                return Err(invalid(format!(
                    "parameters must be contiguous float tensors, got {p:?}"
                )));
            }
            unique.push(p.clone());
        }
        // Buckets over the parameters in reverse, closed at the byte budget or a dtype change.
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let mut bytes = 0;
        for i in (0..unique.len()).rev() {
            let size = unique[i].numel() * unique[i].dtype().size_in_bytes();
            let same_dtype = buckets
                .last()
                .is_some_and(|b| unique[b[0]].dtype() == unique[i].dtype());
            if !same_dtype || bytes + size > bucket_bytes.max(1) && bytes > 0 {
                buckets.push(Vec::new());
                bytes = 0;
            }
            buckets.last_mut().expect("pushed").push(i);
            bytes += size;
        }
        let mut bucket_of = vec![0; unique.len()];
        for (b, members) in buckets.iter().enumerate() {
            for &i in members {
                bucket_of[i] = b;
            }
        }
        let position = unique
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id(), i))
            .collect();
        for p in &unique {
            comm.broadcast(0, p.view(), p.view())?;
        }
        comm.synchronize(TIMEOUT)?;
        Ok(Self {
            shared: Arc::new(Shared {
                comm,
                params: unique,
                buckets,
                bucket_of,
                position,
                pending: Mutex::new((Vec::new(), 0)),
                reducing: Mutex::new(Vec::new()),
            }),
        })
    }

    pub fn rank(&self) -> usize {
        self.shared.comm.rank()
    }
    pub fn size(&self) -> usize {
        self.shared.comm.size()
    }
    /// Rank 0: the one that logs, evaluates and writes checkpoints.
    pub fn is_primary(&self) -> bool {
        self.rank() == 0
    }
    pub fn communicator(&self) -> &C {
        &self.shared.comm
    }
    /// The parameters, each once, in the order given.
    pub fn params(&self) -> &[Tensor<C::Backend>] {
        &self.shared.params
    }
    /// The number of all-reduces a backward pass makes.
    pub fn buckets(&self) -> usize {
        self.shared.buckets.len()
    }

    /// A seed for this rank's random batches, different on every rank and a function of
    /// `seed` and the rank only.
    pub fn shard_seed(&self, seed: u64) -> u64 {
        let mut z = seed ^ (self.rank() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z ^ (z >> 31)
    }

    /// This rank's part of `0..n` (contiguous; the first `n % size` ranks take one more).
    pub fn shard_range(&self, n: usize) -> std::ops::Range<usize> {
        let (r, s) = (self.rank(), self.size());
        let base = n / s;
        let extra = n % s;
        let start = r * base + r.min(extra);
        start..start + base + usize::from(r < extra)
    }

    /// Back-propagates from `loss` and averages every parameter's gradient over the ranks,
    /// each bucket's all-reduce enqueued as soon as its gradients are final.
    pub fn backward(&self, loss: &Tensor<C::Backend>) -> Result<()> {
        {
            let mut pending = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *pending = (self.shared.buckets.iter().map(Vec::len).collect(), 0);
        }
        let shared = self.shared.clone();
        let hook = Box::new(move |id: u64| -> Result<()> {
            let Some(&i) = shared.position.get(&id) else {
                return Ok(());
            };
            let ready: Vec<usize> = {
                let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
                let (missing, next) = &mut *pending;
                missing[shared.bucket_of[i]] = missing[shared.bucket_of[i]].saturating_sub(1);
                let first = *next;
                while *next < missing.len() && missing[*next] == 0 {
                    *next += 1;
                }
                (first..*next).collect()
            };
            ready
                .into_iter()
                .try_for_each(|b| reduce_bucket(&shared, b))
        });
        with_leaf_hook(hook, || loss.backward())?;
        // Buckets with a parameter the loss did not reach go now, in order.
        let rest: Vec<usize> = {
            let mut pending = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let next = pending.1;
            pending.1 = self.shared.buckets.len();
            (next..self.shared.buckets.len()).collect()
        };
        rest.into_iter()
            .try_for_each(|b| reduce_bucket(&self.shared, b))?;
        finish_buckets(&self.shared)
    }

    /// Averages the gradients the parameters hold now over the ranks (after backward passes
    /// run without [`DataParallel::backward`]).
    pub fn all_reduce_grads(&self) -> Result<()> {
        (0..self.shared.buckets.len()).try_for_each(|b| reduce_bucket(&self.shared, b))?;
        finish_buckets(&self.shared)
    }

    /// Waits for this rank's queued work, the all-reduces included (at most [`TIMEOUT`]).
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.shared.comm.synchronize(TIMEOUT)?)
    }
}

/// A training loop's view of how it is replicated: [`Alone`], or one rank of a
/// [`DataParallel`] group. Loops written against it run either way unchanged.
pub trait Replicas<B: Backend> {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Back-propagates from `loss` and leaves in each parameter the gradient the optimiser
    /// steps on (averaged over the ranks for a group).
    fn backward(&self, loss: &Tensor<B>) -> Result<()>;
    /// Rank 0, which logs, evaluates and writes checkpoints.
    fn is_primary(&self) -> bool {
        self.rank() == 0
    }
}

/// One process training alone: `backward` is [`Tensor::backward`].
pub struct Alone;

impl<B: Backend> Replicas<B> for Alone {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn backward(&self, loss: &Tensor<B>) -> Result<()> {
        loss.backward()
    }
}

impl<C: Communicator + 'static> Replicas<C::Backend> for DataParallel<C> {
    fn rank(&self) -> usize {
        DataParallel::rank(self)
    }
    fn size(&self) -> usize {
        DataParallel::size(self)
    }
    fn backward(&self, loss: &Tensor<C::Backend>) -> Result<()> {
        DataParallel::backward(self, loss)
    }
}

/// Copies bucket `b`'s gradients (zeros for a missing one) into one buffer and starts its
/// average over the ranks in place, beside the work enqueued after it
/// ([`Communicator::all_reduce_overlapped`]); [`finish_buckets`] hands the results out.
fn reduce_bucket<C: Communicator>(shared: &Shared<C>, b: usize) -> Result<()> {
    let members = &shared.buckets[b];
    let be = shared.comm.backend();
    let dtype = shared.params[members[0]].dtype();
    let total: usize = members.iter().map(|&i| shared.params[i].numel()).sum();
    let flat = be.alloc_for_write(dtype, total)?;
    let mut at = 0;
    let mut parts = Vec::with_capacity(members.len());
    for &i in members {
        let p = &shared.params[i];
        let mut slice = Layout::contiguous(p.shape());
        slice.offset = at;
        match p.grad() {
            Some(g) => be.copy(g.view(), View::new(&flat, &slice))?,
            None => be.fill(View::new(&flat, &slice), 0.0)?,
        }
        parts.push(slice);
        at += p.numel();
    }
    let whole = Layout::contiguous(&[total]);
    shared
        .comm
        .all_reduce_overlapped(CollectiveOp::Mean, View::new(&flat, &whole))?;
    shared
        .reducing
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((b, flat, parts));
    Ok(())
}

/// Orders what follows after the buckets' all-reduces and gives each parameter its part of
/// its bucket as a fresh gradient.
fn finish_buckets<C: Communicator>(shared: &Shared<C>) -> Result<()> {
    shared.comm.wait_overlapped()?;
    let be = shared.comm.backend();
    let done = std::mem::take(&mut *shared.reducing.lock().unwrap_or_else(|e| e.into_inner()));
    for (b, flat, parts) in done {
        for (&i, slice) in shared.buckets[b].iter().zip(&parts) {
            let p = &shared.params[i];
            let g = Tensor::from_parts(
                be,
                be.alloc_for_write(p.dtype(), p.numel())?,
                Layout::contiguous(p.shape()),
            );
            be.copy(View::new(&flat, slice), g.view())?;
            p.set_grad(Some(g));
        }
    }
    Ok(())
}
