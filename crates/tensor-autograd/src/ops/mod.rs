//! Every tensor operation and its backward, grouped by family. Shared helpers live here:
//! reducing a broadcast gradient back to its input's shape, and fused elementwise kernels
//! through the `hal` scalar program IR.

mod attention;
mod elementwise;
mod index;
mod linalg;
mod loss;
mod movement;
mod norm;
mod pool;
mod random;
mod reduce;

pub use attention::AttentionOptions;
pub use linalg::Conv2dOptions;

use crate::error::Result;
use crate::tensor::Tensor;
use hal::ir::{Access, ProgramBuilder, Value};
use hal::{Backend, DType, DeviceBuffer, Layout};

/// The dtype of an operation's result on two operands: their common dtype, f64 where either
/// is f64 (never narrowed), else f32.
pub(crate) fn promote(a: DType, b: DType) -> DType {
    if a == b {
        a
    } else if a == DType::F64 || b == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
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

    /// This tensor's layout where it covers its whole buffer from element 0 in some order of
    /// its dimensions (row-major, or permuted: the NCHW view of a convolution's channel-major
    /// result), else `None`.
    pub(crate) fn dense_layout(&self) -> Option<Layout> {
        let l = self.layout();
        if l.offset != 0 || self.buffer().len() != self.numel() || self.numel() == 0 {
            return None;
        }
        let in_memory_order = l.permute(&l.memory_order()).ok()?;
        in_memory_order.is_contiguous().then(|| l.clone())
    }

    /// A fresh tensor of this tensor's shape for a result the next call writes whole, laid out
    /// in this tensor's memory order where it is dense in one ([`Tensor::dense_layout`]), else
    /// row-major. Elementwise results follow their input's order, as PyTorch's do, so that a
    /// chain of them over a permuted tensor neither transposes nor copies, and its gradient
    /// comes back in the same order.
    pub(crate) fn new_output_like(&self, dtype: DType) -> Result<Self> {
        match self.dense_layout() {
            Some(layout) if !layout.is_contiguous() => {
                Tensor::for_write_as(self.backend(), layout, dtype)
            }
            _ => self.new_output(self.shape(), dtype),
        }
    }

    /// This tensor broadcast to `layout`'s shape and stored in `layout` (a dense layout over a
    /// fresh buffer), or itself where it is stored so already.
    fn stored_as(&self, layout: &Layout) -> Result<Self> {
        if self.layout() == layout && self.buffer().len() == layout.numel() {
            return Ok(self.clone());
        }
        let source = self.layout().broadcast_to(&layout.shape)?;
        let out = Tensor::for_write_as(self.backend(), layout.clone(), self.dtype())?;
        self.backend()
            .copy(hal::View::new(self.buffer(), &source), out.view())?;
        Ok(out)
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
        self.stored_as(&Layout::contiguous(shape))
    }
}

/// For a launch over the longest of several buffers, index `i` of one holding `len`
/// elements: `(at, inside)` with `inside = i < len` and `at = i` there, 0 past the end, so that
/// a load at `at` stays in range (it reads element 0) and a store is made under `inside`.
pub(crate) fn index_within(p: &mut ProgramBuilder, i: Value, len: usize) -> (Value, Value) {
    let end = p.const_u32(len as u32);
    let inside = p.cmp(hal::ir::IrCmp::Lt, i, end);
    let zero = p.const_u32(0);
    (p.select(inside, i, zero), inside)
}

/// A fused elementwise kernel through the scalar program IR: `inputs` are broadcast to
/// `shape`, each loaded at the launch index, and `body` computes the output from the loaded
/// values. Operands and output share one dense layout: the first full-shape input's where it
/// is dense in some order (see [`Tensor::new_output_like`]), else row-major; operands stored
/// otherwise are copied into it first. The program is rebuilt per call (a few instructions)
/// and compiled once per backend, which caches kernels by structural hash. No history is
/// recorded.
pub(crate) fn fused<B: Backend>(
    name: &str,
    inputs: &[&Tensor<B>],
    shape: &[usize],
    dtype: DType,
    body: impl FnOnce(&mut ProgramBuilder, &[Value]) -> Value,
) -> Result<Tensor<B>> {
    let backend = inputs[0].backend().clone();
    let layout = inputs
        .iter()
        .filter(|t| t.shape() == shape)
        .find_map(|t| t.dense_layout())
        .unwrap_or_else(|| Layout::contiguous(shape));
    let dense: Vec<Tensor<B>> = inputs
        .iter()
        .map(|t| t.stored_as(&layout))
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
    let out = Tensor::for_write_as(&backend, layout, dtype)?;
    let mut args: Vec<&B::Buffer> = dense.iter().map(|t| t.buffer()).collect();
    args.push(out.buffer());
    let n = hal::numel(shape);
    if n > 0 {
        backend.launch(&kernel, &args, n)?;
    }
    Ok(out)
}
