//! Indexing: `gather` along an axis and `index_select` (embedding lookup). Forward is the
//! backend's gather; backward is its scatter-add into zeros, which the backends make race-free.

use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::Backend;

impl<B: Backend> Tensor<B> {
    /// `out[p] = self[p with p[axis] replaced by index[p]]` (PyTorch's `gather`); `index` is
    /// a `u32` or `i32` tensor of the same rank.
    pub fn gather(&self, axis: usize, index: &Tensor<B>) -> Result<Self> {
        let out = self.new_output(index.shape(), self.dtype())?;
        self.backend()
            .gather(self.view(), axis, index.view(), out.view())?;
        let index = index.clone();
        let in_shape = self.shape().to_vec();
        Ok(Tensor::from_op(out, "gather", &[self], move |g| {
            let grad = g.new_zeros(&in_shape, g.dtype())?;
            g.backend()
                .scatter_add(g.view(), axis, index.view(), grad.view())?;
            Ok(vec![Some(grad)])
        }))
    }

    /// The slices `index[k]` (a 1-D `u32`/`i32` tensor) of `axis`, in order: the result has
    /// `index.len()` along `axis`. Rows picked twice get both gradients.
    pub fn index_select(&self, axis: usize, index: &Tensor<B>) -> Result<Self> {
        if index.rank() != 1 {
            return Err(invalid(
                "index_select",
                format!("the index must be 1-D, got shape {:?}", index.shape()),
            ));
        }
        if axis >= self.rank() {
            return Err(invalid(
                "index_select",
                format!("axis {axis} is out of range for shape {:?}", self.shape()),
            ));
        }
        let mut out_shape = self.shape().to_vec();
        out_shape[axis] = index.numel();
        // The index stands along `axis` and is broadcast (stride 0) along the others.
        let mut along = vec![1; self.rank()];
        along[axis] = index.numel();
        let index = index.dense()?;
        let wide = index.layout().reshape(&along)?.broadcast_to(&out_shape)?;
        let wide_index = Tensor::from_parts(index.backend(), index.buffer().clone(), wide);
        self.gather(axis, &wide_index)
    }
}
