//! What the device engines share over the Jacobian on the device: its transpose's values,
//! the gradient `J' f` and `diag(J' J)` from one evaluation, and dot products summed into a
//! slot of a scalar buffer.

use crate::Error;
use crate::compile::{CompiledProblem, Evaluation};
use hal::{Backend, BinaryOp, Layout, ReduceOp, UnaryOp, View};

/// `J'`'s values (refreshed by each [`Transposed::linearize`]), their squares, and a vector
/// of ones over the rows (`diag(J' J) = (J'^2) 1`).
pub(super) struct Transposed<B: Backend> {
    pub(super) values: B::Buffer,
    squared: B::Buffer,
    ones: B::Buffer,
}

impl<B: Backend> Transposed<B> {
    pub(super) fn new(compiled: &CompiledProblem<B>) -> Result<Self, Error> {
        let b = &compiled.backend;
        let dtype = compiled.precision.dtype();
        let (rows, nnz) = (compiled.rows.max(1), compiled.nnz.max(1));
        let ones = b.alloc(dtype, rows)?;
        b.fill(View::new(&ones, &Layout::contiguous(&[rows])), 1.0)?;
        Ok(Self {
            values: b.alloc(dtype, nnz)?,
            squared: b.alloc(dtype, nnz)?,
            ones,
        })
    }

    /// `gradient = J' f` and `diagonal = diag(J' J)` at `eval`, on the device.
    pub(super) fn linearize(
        &self,
        compiled: &CompiledProblem<B>,
        eval: &Evaluation<B>,
        gradient: &B::Buffer,
        diagonal: &B::Buffer,
    ) -> Result<(), Error> {
        let be = &compiled.backend;
        let ln = Layout::contiguous(&[compiled.nnz]);
        be.gather(
            View::new(&eval.jacobian, &ln),
            0,
            View::new(&compiled.transpose_perm, &ln),
            View::new(&self.values, &ln),
        )?;
        be.unary(
            UnaryOp::Square,
            View::new(&self.values, &ln),
            View::new(&self.squared, &ln),
        )?;
        let t = |v| compiled.transpose_csr(v);
        be.spmv_csr(t(&self.values), &eval.residuals, gradient, 1.0, 0.0)?;
        be.spmv_csr(t(&self.squared), &self.ones, diagonal, 1.0, 0.0)?;
        Ok(())
    }
}

/// `scalars[at] = sum(parts[..len])`.
pub(super) fn sum_into<B: Backend>(
    be: &B,
    parts: &B::Buffer,
    len: usize,
    scalars: &B::Buffer,
    at: usize,
) -> Result<(), Error> {
    let out = Layout::strided(&[1], &[1], at)?;
    be.reduce(
        ReduceOp::Sum,
        View::new(parts, &Layout::contiguous(&[len])),
        &[0],
        View::new(scalars, &out),
    )?;
    Ok(())
}

/// `scalars[at] = sum(a * b)` over `len` elements, `parts` as scratch.
pub(super) fn dot_into<B: Backend>(
    be: &B,
    (a, b): (&B::Buffer, &B::Buffer),
    len: usize,
    parts: &B::Buffer,
    scalars: &B::Buffer,
    at: usize,
) -> Result<(), Error> {
    let l = Layout::contiguous(&[len]);
    be.binary(
        BinaryOp::Mul,
        View::new(a, &l),
        View::new(b, &l),
        View::new(parts, &l),
    )?;
    sum_into(be, parts, len, scalars, at)
}
