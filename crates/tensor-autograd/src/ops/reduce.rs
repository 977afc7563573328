//! Reductions along axes: sum, mean, max/min (with the index of the winner), argmax/argmin,
//! variance, logsumexp, softmax and log-softmax. Sum and mean are one `hal` reduction each;
//! max and min are an arg-reduction and a gather, so the gradient goes to the one element that
//! won (the lowest index among ties, as PyTorch's `max(dim)`); the rest are compositions.

use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::{ArgReduceOp, Backend, DType, ReduceOp};

impl<B: Backend> Tensor<B> {
    /// Resolves and checks a list of axes; sorted, without repeats.
    fn axes(&self, axes: &[isize]) -> Result<Vec<usize>> {
        let mut out = axes
            .iter()
            .map(|&a| self.axis(a))
            .collect::<Result<Vec<_>>>()?;
        out.sort_unstable();
        if out.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("reduce", format!("axis listed twice in {axes:?}")));
        }
        Ok(out)
    }

    fn kept_shape(&self, axes: &[usize]) -> Vec<usize> {
        let mut s = self.shape().to_vec();
        for &a in axes {
            s[a] = 1;
        }
        s
    }

    fn dropped_shape(&self, axes: &[usize]) -> Vec<usize> {
        self.shape()
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect()
    }

    fn sum_or_mean(&self, op: ReduceOp, axes: &[isize], keepdim: bool) -> Result<Self> {
        let axes = self.axes(axes)?;
        if axes.is_empty() {
            return Ok(self.clone());
        }
        let kept = self.kept_shape(&axes);
        let out = self.new_output(&kept, self.dtype())?;
        self.backend().reduce(op, self.view(), &axes, out.view())?;
        let count: usize = axes.iter().map(|&a| self.shape()[a]).product();
        let in_shape = self.shape().to_vec();
        let kept_c = kept.clone();
        let name = if op == ReduceOp::Mean { "mean" } else { "sum" };
        let out = Tensor::from_op(out, name, &[self], move |g| {
            let g = g.reshape(&kept_c)?;
            let g = if op == ReduceOp::Mean {
                g.mul_scalar(1.0 / count.max(1) as f32)?
            } else {
                g
            };
            Ok(vec![Some(g.expand(&in_shape)?)])
        });
        if keepdim {
            Ok(out)
        } else {
            out.reshape(&self.dropped_shape(&axes))
        }
    }

    /// The sum over `axes` (negative axes count from the end).
    /// Under [`crate::autocast`], 16-bit tensors are summed in f32 with an f32 result (as
    /// PyTorch's).
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        if crate::autocast::widens(self) {
            return self.autocast_wide()?.sum(axes, keepdim);
        }
        self.sum_or_mean(ReduceOp::Sum, axes, keepdim)
    }

    /// The mean over `axes`.
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        self.sum_or_mean(ReduceOp::Mean, axes, keepdim)
    }

    fn all_axes(&self) -> Vec<isize> {
        (0..self.rank() as isize).collect()
    }

    /// The sum of all elements (shape `[]`).
    pub fn sum_all(&self) -> Result<Self> {
        self.sum(&self.all_axes(), false)
    }

    /// The mean of all elements (shape `[]`).
    pub fn mean_all(&self) -> Result<Self> {
        self.mean(&self.all_axes(), false)
    }

    /// The index (`u32`) of the largest element along `axis`; ties give the lowest index.
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Self> {
        self.arg_reduce(ArgReduceOp::ArgMax, axis, keepdim)
    }

    /// The index (`u32`) of the smallest element along `axis`.
    pub fn argmin(&self, axis: isize, keepdim: bool) -> Result<Self> {
        self.arg_reduce(ArgReduceOp::ArgMin, axis, keepdim)
    }

    fn arg_reduce(&self, op: ArgReduceOp, axis: isize, keepdim: bool) -> Result<Self> {
        let axis = self.axis(axis)?;
        let kept = self.kept_shape(&[axis]);
        let out = self.new_output(&kept, DType::U32)?;
        self.backend()
            .arg_reduce(op, self.view(), axis, out.view())?;
        if keepdim {
            Ok(out)
        } else {
            out.reshape(&self.dropped_shape(&[axis]))
        }
    }

    fn extremum(&self, op: ArgReduceOp, axis: isize, keepdim: bool) -> Result<Self> {
        let index = self.arg_reduce(op, axis, true)?;
        let axis_u = self.axis(axis)?;
        let values = self.gather(axis_u, &index)?;
        if keepdim {
            Ok(values)
        } else {
            values.reshape(&self.dropped_shape(&[axis_u]))
        }
    }

    /// The largest value along `axis`.
    pub fn max(&self, axis: isize, keepdim: bool) -> Result<Self> {
        self.extremum(ArgReduceOp::ArgMax, axis, keepdim)
    }

    /// The smallest value along `axis`.
    pub fn min(&self, axis: isize, keepdim: bool) -> Result<Self> {
        self.extremum(ArgReduceOp::ArgMin, axis, keepdim)
    }

    /// The largest element (shape `[]`). Its gradient is split evenly among the elements
    /// that equal the maximum (as PyTorch's `max()` without a dimension does), so tied maxima
    /// each get `g / ties`; [`Tensor::max`] along an axis sends it to the first instead.
    pub fn max_all(&self) -> Result<Self> {
        self.extremum_all(ArgReduceOp::ArgMax)
    }

    /// The smallest element (shape `[]`); ties share the gradient as in [`Tensor::max_all`].
    pub fn min_all(&self) -> Result<Self> {
        self.extremum_all(ArgReduceOp::ArgMin)
    }

    fn extremum_all(&self, op: ArgReduceOp) -> Result<Self> {
        let x = self.detach();
        let value = crate::no_grad(|| x.flatten(0)?.extremum(op, 0, false))?;
        let kept = value.clone();
        Ok(Tensor::from_op(value, "extremum_all", &[self], move |g| {
            // A mask of the ties (NaN: the mask is empty where no element equals a NaN
            // extremum, and the gradient is NaN, as the value is).
            let ties = x.eq(&kept)?;
            let count = ties.sum_all()?;
            let share = g.div(&count)?;
            Ok(vec![Some(ties.mul(&share)?)])
        }))
    }

    /// The variance over `axes`, with `correction` subtracted from the count (1: unbiased).
    pub fn var(&self, axes: &[isize], correction: usize, keepdim: bool) -> Result<Self> {
        let ax = self.axes(axes)?;
        let count: usize = ax.iter().map(|&a| self.shape()[a]).product();
        if count <= correction {
            return Err(invalid(
                "var",
                format!(
                    "{count} elements leave no degrees of freedom with correction {correction}"
                ),
            ));
        }
        let centred = self.sub(&self.mean(axes, true)?)?;
        centred
            .square()?
            .sum(axes, keepdim)?
            .mul_scalar(1.0 / (count - correction) as f32)
    }

    /// `log(sum(exp(x)))` along `axis`, computed stably (shifted by the largest finite
    /// element) in one reduction (`hal::ReduceOp::LogSumExp`). A slice whose elements are all
    /// `-inf` gives `-inf` (the log of an empty sum; its gradient there is NaN, as PyTorch's);
    /// a slice holding `+inf` gives `+inf`. The gradient is `softmax(x) g`, formed from the
    /// result.
    pub fn logsumexp(&self, axis: isize, keepdim: bool) -> Result<Self> {
        if crate::autocast::widens(self) {
            return self.autocast_wide()?.logsumexp(axis, keepdim);
        }
        let a = self.axis(axis)?;
        let kept = self.kept_shape(&[a]);
        let out = self.new_output(&kept, self.dtype())?;
        self.backend()
            .reduce(ReduceOp::LogSumExp, self.view(), &[a], out.view())?;
        let (x, lse) = (self.detach(), out.detach());
        let kept_c = kept.clone();
        let out = Tensor::from_op(out, "logsumexp", &[self], move |g| {
            let g = g.reshape(&kept_c)?;
            Ok(vec![Some(x.sub(&lse)?.exp()?.mul(&g)?)])
        });
        if keepdim {
            Ok(out)
        } else {
            out.reshape(&self.dropped_shape(&[a]))
        }
    }

    /// `exp(x) / sum(exp(x))` along `axis`.
    pub fn softmax(&self, axis: isize) -> Result<Self> {
        if crate::autocast::widens(self) {
            return self.autocast_wide()?.softmax(axis);
        }
        let m = self.max(axis, true)?.detach();
        let e = self.sub(&m)?.exp()?;
        e.div(&e.sum(&[axis], true)?)
    }

    /// `x - logsumexp(x)` along `axis`.
    pub fn log_softmax(&self, axis: isize) -> Result<Self> {
        if crate::autocast::widens(self) {
            return self.autocast_wide()?.log_softmax(axis);
        }
        self.sub(&self.logsumexp(axis, true)?)
    }
}
