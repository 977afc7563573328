//! Movement operations. Reshape (of a contiguous tensor), permute, transpose, expand, narrow,
//! flip, step, squeeze and unsqueeze are views: a new layout over the same buffer, no launch.
//! Pad, cat and stack build new tensors (one strided copy per operand).

use crate::error::{Result, invalid, shape_error};
use crate::tensor::Tensor;
use hal::{Backend, Layout};

impl<B: Backend> Tensor<B> {
    /// A view over the same buffer with another layout, recording `backward`.
    fn view_as(
        &self,
        layout: Layout,
        name: &'static str,
        backward: impl Fn(&Tensor<B>) -> Result<Tensor<B>> + Send + Sync + 'static,
    ) -> Self {
        let out = Tensor::from_parts(self.backend(), self.buffer().clone(), layout);
        Tensor::from_op(out, name, &[self], move |g| Ok(vec![Some(backward(g)?)]))
    }

    /// The same elements in row-major order with another shape. A view where the strides
    /// allow one ([`hal::Layout::reshape`]: always for a contiguous tensor), else a copy.
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        if hal::numel(shape) != self.numel() {
            return Err(shape_error(
                "reshape",
                self.shape(),
                shape,
                "reshape must keep the number of elements",
            ));
        }
        if self.shape() == shape {
            return Ok(self.clone());
        }
        // A view where the strides allow one (a narrowed axis split into heads), else a copy.
        let (src, layout) = match self.layout().reshape(shape) {
            Ok(layout) => (self.clone(), layout),
            Err(_) => {
                let src = self.contiguous()?;
                let layout = src.layout().reshape(shape)?;
                (src, layout)
            }
        };
        let in_shape = self.shape().to_vec();
        Ok(src.view_as(layout, "reshape", move |g| g.reshape(&in_shape)))
    }

    /// Dimensions `start..` merged into one.
    pub fn flatten(&self, start: usize) -> Result<Self> {
        if start > self.rank() {
            return Err(invalid(
                "flatten",
                format!("start {start} > rank {}", self.rank()),
            ));
        }
        let mut shape = self.shape()[..start].to_vec();
        shape.push(self.shape()[start..].iter().product());
        self.reshape(&shape)
    }

    /// A contiguous copy when the tensor is a strided view, else the tensor itself.
    pub fn contiguous(&self) -> Result<Self> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = self.new_output(self.shape(), self.dtype())?;
        self.backend().copy(self.view(), out.view())?;
        Ok(Tensor::from_op(out, "contiguous", &[self], |g| {
            Ok(vec![Some(g.clone())])
        }))
    }

    /// Dimensions reordered: result dimension `i` is input dimension `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Self> {
        let layout = self.layout().permute(perm)?;
        let mut inverse = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        Ok(self.view_as(layout, "permute", move |g| g.permute(&inverse)))
    }

    /// Dimensions `a` and `b` swapped (negative axes count from the end).
    pub fn transpose(&self, a: isize, b: isize) -> Result<Self> {
        let (a, b) = (self.axis(a)?, self.axis(b)?);
        let layout = self.layout().transpose(a, b)?;
        Ok(self.view_as(layout, "transpose", move |g| {
            g.transpose(a as isize, b as isize)
        }))
    }

    /// The transpose of a matrix.
    pub fn t(&self) -> Result<Self> {
        if self.rank() != 2 {
            return Err(invalid(
                "t",
                format!("needs a matrix, got shape {:?}", self.shape()),
            ));
        }
        self.transpose(0, 1)
    }

    /// Broadcast to `shape` (stride 0 along stretched dimensions); the gradient is summed back.
    pub fn expand(&self, shape: &[usize]) -> Result<Self> {
        let layout = self.layout().broadcast_to(shape)?;
        let in_shape = self.shape().to_vec();
        Ok(self.view_as(layout, "expand", move |g| g.sum_to(&in_shape)))
    }

    /// A dimension of size 1 inserted at `axis`.
    pub fn unsqueeze(&self, axis: usize) -> Result<Self> {
        let layout = self.layout().unsqueeze(axis)?;
        Ok(self.view_as(layout, "unsqueeze", move |g| g.squeeze(axis)))
    }

    /// Dimension `axis`, which must have size 1, removed.
    pub fn squeeze(&self, axis: usize) -> Result<Self> {
        if axis >= self.rank() || self.shape()[axis] != 1 {
            return Err(invalid(
                "squeeze",
                format!(
                    "dimension {axis} of shape {:?} is not of size 1",
                    self.shape()
                ),
            ));
        }
        let mut layout = self.layout().clone();
        layout.shape.remove(axis);
        layout.strides.remove(axis);
        Ok(self.view_as(layout, "squeeze", move |g| g.unsqueeze(axis)))
    }

    /// Elements `start..start + len` along `axis` (a view). The gradient is zero elsewhere.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        let layout = self.layout().narrow(axis, start, len)?;
        let in_shape = self.shape().to_vec();
        Ok(self.view_as(layout, "narrow", move |g| {
            let out = g.new_zeros(&in_shape, g.dtype())?;
            let dst = out.layout().narrow(axis, start, len)?;
            g.backend()
                .copy(g.view(), hal::View::new(out.buffer(), &dst))?;
            Ok(out)
        }))
    }

    /// The order of `axis` reversed (a view with a negative stride).
    pub fn flip(&self, axis: usize) -> Result<Self> {
        let layout = self.layout().flip(axis)?;
        Ok(self.view_as(layout, "flip", move |g| g.flip(axis)))
    }

    /// Every `step`-th element along `axis` (a view). The gradient is zero elsewhere.
    pub fn step(&self, axis: usize, step: usize) -> Result<Self> {
        let layout = self.layout().step(axis, step)?;
        let in_shape = self.shape().to_vec();
        Ok(self.view_as(layout, "step", move |g| {
            let out = g.new_zeros(&in_shape, g.dtype())?;
            let dst = out.layout().step(axis, step)?;
            g.backend()
                .copy(g.view(), hal::View::new(out.buffer(), &dst))?;
            Ok(out)
        }))
    }

    /// Padded with `value`: `pads[d] = (before, after)` elements along dimension `d`, one
    /// pair per dimension.
    pub fn pad(&self, pads: &[(usize, usize)], value: f32) -> Result<Self> {
        if pads.len() != self.rank() {
            return Err(invalid(
                "pad",
                format!(
                    "{} padding pairs for a tensor of rank {} (shape {:?})",
                    pads.len(),
                    self.rank(),
                    self.shape()
                ),
            ));
        }
        let shape: Vec<usize> = self
            .shape()
            .iter()
            .zip(pads)
            .map(|(&d, &(lo, hi))| d + lo + hi)
            .collect();
        let out = Tensor::full(self.backend(), &shape, value as f64, self.dtype())?;
        let mut inside = out.layout().clone();
        for (axis, (&d, &(lo, _))) in self.shape().iter().zip(pads).enumerate() {
            inside = inside.narrow(axis, lo, d)?;
        }
        self.backend()
            .copy(self.view(), hal::View::new(out.buffer(), &inside))?;
        let pads = pads.to_vec();
        let in_shape = self.shape().to_vec();
        Ok(Tensor::from_op(out, "pad", &[self], move |g| {
            let mut v = g.clone();
            for (axis, (&d, &(lo, _))) in in_shape.iter().zip(&pads).enumerate() {
                v = v.narrow(axis, lo, d)?;
            }
            Ok(vec![Some(v)])
        }))
    }

    /// Tensors joined along `axis`; all other dimensions must agree.
    pub fn cat(tensors: &[&Tensor<B>], axis: usize) -> Result<Self> {
        let Some(first) = tensors.first() else {
            return Err(invalid("cat", "no tensors to concatenate"));
        };
        if axis >= first.rank() {
            return Err(invalid(
                "cat",
                format!("axis {axis} is out of range for shape {:?}", first.shape()),
            ));
        }
        let mut shape = first.shape().to_vec();
        shape[axis] = 0;
        for t in tensors {
            let same_rank = t.rank() == first.rank();
            let others_agree =
                same_rank && (0..t.rank()).all(|d| d == axis || t.shape()[d] == first.shape()[d]);
            if !others_agree {
                return Err(shape_error(
                    "cat",
                    first.shape(),
                    t.shape(),
                    format!("all dimensions but {axis} must agree"),
                ));
            }
            shape[axis] += t.shape()[axis];
        }
        let dtype = first.dtype();
        let out = first.new_output(&shape, dtype)?;
        let mut at = 0;
        let mut spans = Vec::with_capacity(tensors.len());
        for t in tensors {
            let len = t.shape()[axis];
            let dst = out.layout().narrow(axis, at, len)?;
            first
                .backend()
                .copy(t.view(), hal::View::new(out.buffer(), &dst))?;
            spans.push((at, len));
            at += len;
        }
        Ok(Tensor::from_op(out, "cat", tensors, move |g| {
            spans
                .iter()
                .map(|&(start, len)| Ok(Some(g.narrow(axis, start, len)?)))
                .collect()
        }))
    }

    /// Tensors of one shape stacked along a new dimension `axis`.
    pub fn stack(tensors: &[&Tensor<B>], axis: usize) -> Result<Self> {
        let expanded: Vec<Tensor<B>> = tensors
            .iter()
            .map(|t| t.unsqueeze(axis))
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor<B>> = expanded.iter().collect();
        Tensor::cat(&refs, axis)
    }
}
