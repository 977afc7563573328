//! Every tensor operation and its backward, grouped by family. Shared helpers live here:
//! reducing a broadcast gradient back to its input's shape, and fused elementwise kernels
//! through the `hal` scalar program IR.

mod elementwise;
mod index;
mod linalg;
mod loss;
mod movement;
mod random;
mod reduce;

pub use linalg::Conv2dOptions;

use crate::error::Result;
use crate::tensor::Tensor;
use hal::ir::{Access, ProgramBuilder, Value};
use hal::{Backend, DType};

/// The dtype of an operation's result on two operands: their common dtype, else f32.
pub(crate) fn promote(a: DType, b: DType) -> DType {
    if a == b { a } else { DType::F32 }
}

impl<B: Backend> Tensor<B> {
    /// A fresh contiguous zero tensor on this tensor's device.
    pub(crate) fn new_zeros(&self, shape: &[usize], dtype: DType) -> Result<Self> {
        Tensor::zeros(self.backend(), shape, dtype)
    }

    /// A fresh contiguous tensor on this tensor's device for a result that the next call
    /// writes whole (contents unspecified until then; see [`Tensor::for_write`]).
    pub(crate) fn new_output(&self, shape: &[usize], dtype: DType) -> Result<Self> {
        Tensor::for_write(self.backend(), shape, dtype)
    }

    /// Sums this gradient over the dimensions that broadcasting stretched, so that it has
    /// `shape` (the shape of the input it belongs to). Uses the backend's reduction, so no two
    /// threads add into one element.
    pub(crate) fn sum_to(&self, shape: &[usize]) -> Result<Self> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let rank = self.rank();
        let lead = rank - shape.len();
        let axes: Vec<usize> = (0..rank)
            .filter(|&i| i < lead || (shape[i - lead] == 1 && self.shape()[i] != 1))
            .collect();
        let reduced = if axes.is_empty() {
            self.clone()
        } else {
            let mut keep = self.shape().to_vec();
            for &a in &axes {
                keep[a] = 1;
            }
            let out = self.new_output(&keep, self.dtype())?;
            self.backend()
                .reduce(hal::ReduceOp::Sum, self.view(), &axes, out.view())?;
            out
        };
        reduced.reshape(shape)
    }

    /// This tensor broadcast to `shape` and stored densely (for the fused kernels, which index
    /// their operands by the launch index).
    pub(crate) fn materialize(&self, shape: &[usize]) -> Result<Self> {
        if self.shape() == shape && self.is_dense() {
            return Ok(self.clone());
        }
        let layout = self.layout().broadcast_to(shape)?;
        let out = self.new_output(shape, self.dtype())?;
        self.backend()
            .copy(hal::View::new(self.buffer(), &layout), out.view())?;
        Ok(out)
    }
}

/// A fused elementwise kernel through the scalar program IR: `inputs` are broadcast to
/// `shape`, each loaded at the launch index, and `body` computes the output from the loaded
/// values. The program is rebuilt per call (a few instructions) and compiled once per backend,
/// which caches kernels by structural hash. No history is recorded.
pub(crate) fn fused<B: Backend>(
    name: &str,
    inputs: &[&Tensor<B>],
    shape: &[usize],
    dtype: DType,
    body: impl FnOnce(&mut ProgramBuilder, &[Value]) -> Value,
) -> Result<Tensor<B>> {
    let backend = inputs[0].backend().clone();
    let dense: Vec<Tensor<B>> = inputs
        .iter()
        .map(|t| t.materialize(shape))
        .collect::<Result<_>>()?;
    let mut b = ProgramBuilder::new(name);
    let ids: Vec<_> = dense
        .iter()
        .map(|t| b.buffer(t.dtype(), Access::Read))
        .collect();
    let out_id = b.buffer(dtype, Access::Write);
    let i = b.index();
    let loaded: Vec<Value> = ids.iter().map(|&id| b.load(id, i)).collect();
    let r = body(&mut b, &loaded);
    b.store(out_id, i, r);
    let program = b.build()?;
    let kernel = backend.compile(&program)?;
    let out = Tensor::for_write(&backend, shape, dtype)?;
    let mut args: Vec<&B::Buffer> = dense.iter().map(|t| t.buffer()).collect();
    args.push(out.buffer());
    let n = hal::numel(shape);
    if n > 0 {
        backend.launch(&kernel, &args, n)?;
    }
    Ok(out)
}
