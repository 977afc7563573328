//! Loss functions, each a mean over the batch, composed from differentiable operations.

use crate::error::{Result, invalid, shape_error};
use crate::tensor::Tensor;
use hal::{Backend, DType};

impl<B: Backend> Tensor<B> {
    /// Mean squared error `mean((self - target)^2)`; the shapes must be equal.
    pub fn mse_loss(&self, target: &Tensor<B>) -> Result<Self> {
        if self.shape() != target.shape() {
            return Err(shape_error(
                "mse_loss",
                self.shape(),
                target.shape(),
                "prediction and target must have one shape",
            ));
        }
        self.sub(target)?.square()?.mean_all()
    }

    /// Negative log-likelihood of class `target[i]` (`u32` or `i32`, shape `[N]`) under
    /// log-probabilities `self: [N, C]`, averaged over the batch.
    pub fn nll_loss(&self, target: &Tensor<B>) -> Result<Self> {
        if self.rank() != 2 || target.rank() != 1 || target.shape()[0] != self.shape()[0] {
            return Err(shape_error(
                "nll_loss",
                self.shape(),
                target.shape(),
                "expects log-probabilities [N, C] and class indices [N]",
            ));
        }
        if target.dtype().is_float() {
            return Err(invalid(
                "nll_loss",
                format!("class indices must be u32 or i32, got {}", target.dtype()),
            ));
        }
        let picked = self.gather(1, &target.reshape(&[target.numel(), 1])?)?;
        picked.mean_all()?.neg()
    }

    /// Cross-entropy of logits `self: [N, C]` against class indices `target: [N]`:
    /// `nll_loss(log_softmax(self))`.
    pub fn cross_entropy(&self, target: &Tensor<B>) -> Result<Self> {
        if self.rank() != 2 {
            return Err(shape_error(
                "cross_entropy",
                self.shape(),
                target.shape(),
                "expects logits [N, C] and class indices [N]",
            ));
        }
        self.log_softmax(1)?.nll_loss(target)
    }

    /// Binary cross-entropy of logits against targets in `[0, 1]` of the same shape, in the
    /// stable form `max(x, 0) - x y + log(1 + exp(-|x|))`.
    pub fn bce_with_logits(&self, target: &Tensor<B>) -> Result<Self> {
        if self.shape() != target.shape() {
            return Err(shape_error(
                "bce_with_logits",
                self.shape(),
                target.shape(),
                "logits and targets must have one shape",
            ));
        }
        let target = target.to_dtype(if self.dtype() == DType::U32 {
            DType::F32
        } else {
            self.dtype()
        })?;
        let softplus = self.abs()?.neg()?.exp()?.add_scalar(1.0)?.log()?;
        self.relu()?
            .sub(&self.mul(&target)?)?
            .add(&softplus)?
            .mean_all()
    }
}
