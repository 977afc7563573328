//! Define-by-run reverse-mode autograd.
//!
//! Every result of a differentiable operation on tensors that require gradients holds a
//! [`Node`]: its inputs and a closure mapping the output's gradient to the inputs' gradients.
//! [`Tensor::backward`] orders the graph topologically from the root and runs the closures in
//! reverse, summing gradients that reach one tensor along several paths, and accumulates the
//! results into the leaves' `grad`. The closures run under [`no_grad`] (no second-order
//! graphs) on the tensors' own device.
//!
//! A closure never holds its own output (that would be a reference cycle): operations whose
//! backward uses the output capture a detached alias of it.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use hal::Backend;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

/// Maps the gradient of an operation's output to the gradients of its inputs (`None` where
/// an input needs none). Each returned gradient has its input's shape.
pub(crate) type BackwardFn<B> =
    Box<dyn Fn(&Tensor<B>) -> Result<Vec<Option<Tensor<B>>>> + Send + Sync>;

/// How a tensor was computed.
pub(crate) struct Node<B: Backend> {
    pub(crate) name: &'static str,
    pub(crate) inputs: Vec<Tensor<B>>,
    pub(crate) backward: BackwardFn<B>,
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static IN_RECORDED_STEP: Cell<bool> = const { Cell::new(false) };
    /// The id of the running backward pass's seed, where that seed holds 1 everywhere: see
    /// [`is_unit_seed`].
    static UNIT_SEED: Cell<Option<u64>> = const { Cell::new(None) };
    /// Called with a leaf's id once a backward pass on this thread has stored that leaf's
    /// gradient: see [`with_leaf_hook`].
    static LEAF_HOOK: RefCell<Option<LeafHook>> = const { RefCell::new(None) };
}

/// What [`with_leaf_hook`] installs.
pub(crate) type LeafHook = Box<dyn FnMut(u64) -> Result<()>>;

/// Runs `f` with `hook` called, on this thread, with the id of each leaf whose gradient a
/// backward pass has just finished (each leaf once per pass: a leaf's gradient is summed
/// over all its paths before it is stored). Data-parallel training starts a bucket's
/// all-reduce from it. The previous hook comes back afterwards, also if `f` panics.
pub(crate) fn with_leaf_hook<R>(hook: LeafHook, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<LeafHook>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            LEAF_HOOK.with(|h| *h.borrow_mut() = previous);
        }
    }
    let _restore = Restore(LEAF_HOOK.with(|h| h.borrow_mut().replace(hook)));
    f()
}

/// Whether `g` is the seed of the backward pass running on this thread and that seed holds 1
/// everywhere ([`Tensor::backward`]'s, or a recorded step's). An operation whose output is the
/// loss itself may then return a gradient it made in its forward pass instead of launching a
/// kernel to scale one by `g` (cross-entropy does, for a training step's loss).
pub(crate) fn is_unit_seed<B: Backend>(g: &Tensor<B>) -> bool {
    UNIT_SEED.with(|s| s.get() == Some(g.id()))
}

/// Runs `f` as the body of a recorded step ([`crate::models::RecordedStep`]), where
/// operations whose launches would not repeat correctly on replay refuse to run.
pub(crate) fn in_recorded_step<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_RECORDED_STEP.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(IN_RECORDED_STEP.with(|g| g.replace(true)));
    f()
}

/// True inside the body of a recorded step.
pub(crate) fn is_recording_step() -> bool {
    IN_RECORDED_STEP.with(|g| g.get())
}

/// Runs `f` without recording operations for autograd (evaluation, optimiser updates).
/// Restores the previous mode afterwards, also if `f` panics.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}

/// True unless inside [`no_grad`].
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

impl<B: Backend> Tensor<B> {
    /// The result of an operation: records `backward` when gradients are enabled and some
    /// input requires one.
    pub(crate) fn from_op(
        out: Tensor<B>,
        name: &'static str,
        inputs: &[&Tensor<B>],
        backward: impl Fn(&Tensor<B>) -> Result<Vec<Option<Tensor<B>>>> + Send + Sync + 'static,
    ) -> Tensor<B> {
        if !is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad_flag()) {
            return out;
        }
        let node = Node {
            name,
            inputs: inputs.iter().map(|t| (*t).clone()).collect(),
            backward: Box::new(backward),
        };
        // The untracked `out` is dropped; the result shares its buffer and layout.
        Tensor::with_node(
            out.backend(),
            out.buffer().clone(),
            out.layout().clone(),
            true,
            Some(node),
        )
    }

    /// Back-propagates from this one-element tensor (a loss): every leaf that requires a
    /// gradient and contributed to it gets `d self / d leaf` added to its `grad`.
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(Error::Autograd(format!(
                "backward() needs a one-element tensor, got shape {:?}; pass the output's gradient with backward_with",
                self.shape()
            )));
        }
        let seed = Tensor::full(self.backend(), self.shape(), 1.0, self.dtype())?;
        self.backward_seeded(&seed, true)
    }

    /// Back-propagates `grad` (the gradient of some scalar with respect to this tensor, of
    /// this tensor's shape).
    pub fn backward_with(&self, grad: &Tensor<B>) -> Result<()> {
        self.backward_seeded(grad, false)
    }

    /// [`Tensor::backward_with`] from `ones`, which the caller made with 1 in every element
    /// and has not changed since (a recorded step's seed, made once outside the recording).
    pub(crate) fn backward_with_ones(&self, ones: &Tensor<B>) -> Result<()> {
        self.backward_seeded(ones, true)
    }

    /// The backward pass from `grad`; `unit`: `grad` holds 1 everywhere ([`is_unit_seed`]).
    fn backward_seeded(&self, grad: &Tensor<B>, unit: bool) -> Result<()> {
        if !self.requires_grad_flag() {
            return Err(Error::Autograd(
                "backward through a tensor that does not require a gradient (no input had requires_grad, or it was made under no_grad)".into(),
            ));
        }
        if grad.shape() != self.shape() {
            return Err(crate::error::shape_error(
                "backward_with",
                self.shape(),
                grad.shape(),
                "the gradient must have the output's shape",
            ));
        }
        struct Restore(Option<u64>);
        impl Drop for Restore {
            fn drop(&mut self) {
                UNIT_SEED.with(|s| s.set(self.0));
            }
        }
        let _restore = Restore(UNIT_SEED.with(|s| s.replace(unit.then(|| grad.id()))));
        // Each tensor runs once every operation that read it has passed its gradient back
        // (a count of such reads per tensor, as PyTorch's engine keeps): a leaf's gradient
        // is stored, and the leaf hook called, as soon as its last reader is done, not at the
        // end of the pass, so data-parallel training can start reducing it early.
        let mut waiting = readers(self);
        let mut grads: HashMap<u64, Tensor<B>> = HashMap::new();
        grads.insert(self.id(), grad.clone());
        let mut ready = vec![self.clone()];
        // Each backward computes in the dtypes its forward pass chose, whatever autocast
        // scope the caller is in.
        crate::autocast::outside(|| {
            no_grad(|| {
                while let Some(t) = ready.pop() {
                    let g = grads.remove(&t.id());
                    let Some(node) = &t.inner.node else {
                        if let Some(g) = g {
                            accumulate_leaf(&t, g)?;
                        }
                        continue;
                    };
                    let input_grads = match &g {
                        Some(g) => (node.backward)(g)?,
                        None => vec![None; node.inputs.len()],
                    };
                    debug_assert_eq!(input_grads.len(), node.inputs.len(), "{}", node.name);
                    for (input, ig) in node.inputs.iter().zip(input_grads) {
                        if !input.requires_grad_flag() {
                            continue;
                        }
                        if let Some(ig) = ig {
                            if ig.shape() != input.shape() {
                                return Err(Error::Autograd(format!(
                                    "internal: backward of {} gave a gradient of shape {:?} for an input of shape {:?}",
                                    node.name,
                                    ig.shape(),
                                    input.shape()
                                )));
                            }
                            // A gradient has its tensor's dtype (PyTorch's rule): a 16-bit
                            // operand of a wider result gets its gradient rounded once, here.
                            let ig = if ig.dtype() != input.dtype() && input.dtype().is_float() {
                                ig.to_dtype(input.dtype())?
                            } else {
                                ig
                            };
                            let sum = match grads.remove(&input.id()) {
                                Some(prev) => prev.add(&ig)?,
                                None => ig,
                            };
                            grads.insert(input.id(), sum);
                        }
                        let left = waiting.get_mut(&input.id()).expect("counted");
                        *left -= 1;
                        if *left == 0 {
                            ready.push(input.clone());
                        }
                    }
                }
                Ok(())
            })
        })
    }
}

/// For each tensor reachable from `root` through nodes (inputs that require a gradient),
/// how many times an operation in the graph read it.
fn readers<B: Backend>(root: &Tensor<B>) -> HashMap<u64, usize> {
    let mut count: HashMap<u64, usize> = HashMap::new();
    let mut seen = HashSet::new();
    // Iterative: deep graphs (long training unrolls) must not overflow the stack.
    let mut stack: Vec<Tensor<B>> = vec![root.clone()];
    seen.insert(root.id());
    while let Some(t) = stack.pop() {
        if let Some(node) = &t.inner.node {
            for input in &node.inputs {
                if !input.requires_grad_flag() {
                    continue;
                }
                *count.entry(input.id()).or_insert(0) += 1;
                if seen.insert(input.id()) {
                    stack.push(input.clone());
                }
            }
        }
    }
    count
}

/// Adds `g` to a leaf's stored gradient, kept dense so optimisers can step on it directly.
/// The read, the sum and the store happen under the leaf's gradient lock: backward passes
/// on several threads into one leaf each add their whole gradient (none is lost to another's
/// store), in some order.
fn accumulate_leaf<B: Backend>(leaf: &Tensor<B>, g: Tensor<B>) -> Result<()> {
    let g = if g.dtype() == leaf.dtype() {
        g
    } else {
        g.to_dtype(leaf.dtype())?
    };
    {
        let mut slot = leaf.inner.grad.lock().unwrap_or_else(|p| p.into_inner());
        let total = match slot.as_ref() {
            Some(prev) => prev.add(&g)?,
            None => g,
        };
        *slot = Some(total.dense()?.detach());
    }
    // The hook is taken out while it runs, so what it calls cannot re-enter it.
    let hook = LEAF_HOOK.with(|h| h.borrow_mut().take());
    if let Some(mut hook) = hook {
        let outcome = hook(leaf.id());
        LEAF_HOOK.with(|h| *h.borrow_mut() = Some(hook));
        outcome?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::with_leaf_hook;
    use crate::Tensor;
    use backend_cpu::CpuBackend;
    use std::sync::{Arc, Mutex};

    /// In a chain of three layers, each weight's gradient is stored as soon as the pass has
    /// gone through its layer: the last layer's first, while the earlier layers' are still
    /// to come (data-parallel training starts reducing it then).
    #[test]
    fn a_leaf_is_finished_as_soon_as_its_readers_are() {
        let dev = CpuBackend::new();
        let w: Vec<Tensor<CpuBackend>> = (0..3)
            .map(|i| Tensor::randn(&dev, &[4, 4], i).unwrap().requires_grad())
            .collect();
        let x = Tensor::randn(&dev, &[2, 4], 9).unwrap();
        let mut h = x;
        for wi in &w {
            h = h.matmul(wi).unwrap().tanh().unwrap();
        }
        let loss = h.sum_all().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (log, ws) = (seen.clone(), w.clone());
        let hook = Box::new(move |id: u64| {
            // Which weights already hold a gradient when this one is finished.
            let done: Vec<bool> = ws.iter().map(|t| t.grad().is_some()).collect();
            log.lock().unwrap().push((id, done));
            Ok(())
        });
        with_leaf_hook(hook, || loss.backward()).unwrap();
        let seen = seen.lock().unwrap();
        let order: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
        assert_eq!(order, vec![w[2].id(), w[1].id(), w[0].id()]);
        // When the last layer's weight was finished, the first two had no gradient yet.
        assert_eq!(seen[0].1, vec![false, false, true]);
    }
}
