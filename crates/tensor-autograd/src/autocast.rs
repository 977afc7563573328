//! Mixed precision: an `autocast` scope, as PyTorch's `torch.autocast`.
//!
//! Inside [`autocast`]`(dtype, ..)` (bf16 or f16) the operations that gain from narrow
//! operands run in `dtype` and the ones that need range or accumulate long sums run in f32,
//! whatever the dtypes they are given; parameters stay f32 (the master weights), and every
//! gradient reaches them in f32 through the casts' own backward passes.
//!
//! The policy (PyTorch's lists, per family):
//! - **narrow** (`matmul`, `linear`, `linear_activation`, `conv2d`,
//!   `scaled_dot_product_attention`, `qkv_attention`): f32 operands are cast to the autocast
//!   dtype (a cast is one elementwise launch; its gradient is cast back), the products
//!   accumulate in f32 and the result is stored in the autocast dtype. A Linear layer's
//!   weight gradient is written in f32 straight from the narrow products.
//! - **f32** (`layer_norm`, `softmax`, `log_softmax`, `logsumexp`, `sum`, `pow`, `exp`, `log`,
//!   `log2`, `rsqrt`, `recip` and every loss): 16-bit operands are widened to f32 first, the
//!   result is f32. Cross-entropy reads 16-bit logits where they lie (no widened copy of the
//!   `[N, C]` logits) and computes in f32.
//! - everything else (elementwise, reductions, movement, dropout) runs in its operands' dtype,
//!   promoted as usual (a 16-bit branch added to an f32 residual stream gives f32).
//!
//! f64 operands are never narrowed. The scope is per thread, and the backward pass always
//! runs outside it: each operation's backward computes in the dtypes its forward pass chose.
//! f16 has a narrow range; train with it under [`crate::optim::GradScaler`], which scales the
//! loss so small gradients do not flush to zero and skips the steps whose gradients overflow.

use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::{Backend, DType};
use std::cell::Cell;

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Runs `f` with mixed precision: the module docs' policy in `dtype`, which must be
/// [`DType::BF16`] or [`DType::F16`]. Scopes nest (the innermost wins) and the previous state
/// is restored afterwards, also if `f` panics.
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> R) -> Result<R> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(invalid(
            "autocast",
            format!("autocast computes in bf16 or f16, got {dtype}"),
        ));
    }
    Ok(with_state(Some(dtype), f))
}

/// The dtype of the innermost [`autocast`] scope on this thread, if any.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|a| a.get())
}

/// Runs `f` with no autocast scope: an operation whose operands the policy already cast.
pub(crate) fn outside<R>(f: impl FnOnce() -> R) -> R {
    with_state(None, f)
}

/// Whether an f32-policy operation widens `t` (a scope is active and `t` is 16-bit).
pub(crate) fn widens<B: Backend>(t: &Tensor<B>) -> bool {
    autocast_dtype().is_some() && matches!(t.dtype(), DType::BF16 | DType::F16)
}

/// Runs `f` with the autocast state set to `state`, restoring the previous one afterwards.
pub(crate) fn with_state<R>(state: Option<DType>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            AUTOCAST.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(AUTOCAST.with(|a| a.replace(state)));
    f()
}

impl<B: Backend> Tensor<B> {
    /// For a narrow-policy operation: this tensor cast to the autocast dtype where a scope is
    /// active and it is f32; else itself.
    pub(crate) fn autocast_narrow(&self) -> Result<Tensor<B>> {
        match autocast_dtype() {
            Some(dt) if self.dtype() == DType::F32 => self.to_dtype(dt),
            _ => Ok(self.clone()),
        }
    }

    /// For an f32-policy operation: this tensor widened to f32 where a scope is active and it
    /// is 16-bit; else itself.
    pub(crate) fn autocast_wide(&self) -> Result<Tensor<B>> {
        match widens(self) {
            true => self.to_dtype(DType::F32),
            false => Ok(self.clone()),
        }
    }
}
