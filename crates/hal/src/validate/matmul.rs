//! Matrix products' operands ([`MatrixView`]) and checks, and the CSR mat-vec's.

use super::{broadcast, disjoint, dtype_is, f64_offered, fits, float, output, same_shape};
use crate::{Csr, DType, DeviceBuffer, Epilogue, Error, Layout, Result, View};

/// A matmul operand as `(batch, rows, cols)` and strides `[batch, row, col]`; a rank-2 view is
/// one batch with batch stride 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixView {
    pub batch: usize,
    pub rows: usize,
    pub cols: usize,
    pub strides: [isize; 3],
    pub offset: usize,
}

impl MatrixView {
    /// The batch stride as used: a batch of 1 broadcasts (stride 0).
    pub fn batch_stride(&self) -> isize {
        if self.batch == 1 { 0 } else { self.strides[0] }
    }

    /// The element offset of batch `b`'s matrix.
    pub fn batch_offset(&self, b: usize) -> isize {
        self.offset as isize + b as isize * self.batch_stride()
    }

    /// The view as a rank-3 layout `[batch, rows, cols]`.
    pub fn layout(&self) -> Layout {
        Layout {
            shape: vec![self.batch, self.rows, self.cols],
            strides: self.strides.to_vec(),
            offset: self.offset,
        }
    }

    pub fn of(l: &Layout) -> MatrixView {
        let r = l.rank();
        let (batch, sb) = if r == 3 {
            (l.shape[0], l.strides[0])
        } else {
            (1, 0)
        };
        MatrixView {
            batch,
            rows: l.shape[r - 2],
            cols: l.shape[r - 1],
            strides: [sb, l.strides[r - 2], l.strides[r - 1]],
            offset: l.offset,
        }
    }
}

/// Checks a product with an epilogue ([`crate::Backend::matmul_epilogue`]): the product as
/// [`matmul`]; the bias a float view that broadcasts to the output's shape and does not share
/// its memory; the gate one of [`Gate::ACTIVATIONS`](crate::Gate::ACTIVATIONS) with a float
/// output of `a`'s shape; the row sums a float view of `a`'s shape less its last axis that
/// shares memory with no operand. Returns the matrices and the bias's layout broadcast to the
/// output's shape.
pub fn matmul_epilogue<B: DeviceBuffer>(
    [a, b, out]: [View<'_, B>; 3],
    epilogue: &Epilogue<'_, B>,
) -> Result<([MatrixView; 3], Option<Layout>)> {
    const OP: &str = "matmul_epilogue";
    let matrices = matmul(a, b, out)?;
    let mut dtypes = vec![a.dtype(), b.dtype(), out.dtype()];
    dtypes.extend(epilogue.bias.map(|v| v.dtype()));
    dtypes.extend(epilogue.a_row_sums.map(|v| v.dtype()));
    dtypes.extend(epilogue.a_gate.as_ref().map(|g| g.output.dtype()));
    f64_offered(OP, &dtypes, false, || {
        "the fused epilogue has no f64 form (matmul and the elementwise primitives do)".into()
    })?;
    let invalid = |detail: String| Error::InvalidArgument { op: OP, detail };
    let bias = match epilogue.bias {
        Some(bias) => {
            float(OP, bias.dtype())?;
            if bias.buffer.same_memory(out.buffer) {
                return Err(invalid(
                    "the bias must not share memory with the output".into(),
                ));
            }
            Some(broadcast(OP, bias, &out.layout.shape)?)
        }
        None => None,
    };
    if let Some(gate) = epilogue.a_gate {
        if !crate::Gate::<B>::ACTIVATIONS.contains(&gate.activation) {
            return Err(invalid(format!(
                "a gate's activation must be one whose derivative follows from its output \
                 ({:?}), not {:?}",
                crate::Gate::<B>::ACTIVATIONS,
                gate.activation
            )));
        }
        fits(OP, gate.output)?;
        disjoint(OP, gate.output, out, false)?;
        float(OP, gate.output.dtype())?;
        if gate.output.buffer.same_memory(out.buffer) {
            return Err(invalid(
                "the gate's output must not share memory with the product's".into(),
            ));
        }
        same_shape(
            OP,
            &a.layout.shape,
            &gate.output.layout.shape,
            "the gate's output has a's shape",
        )?;
    }
    if let Some(sums) = epilogue.a_row_sums {
        output(OP, sums)?;
        float(OP, sums.dtype())?;
        let rank = a.layout.rank();
        same_shape(
            OP,
            &a.layout.shape[..rank - 1],
            &sums.layout.shape,
            "the row sums have a's shape without its last axis",
        )?;
        let operands = [Some(a), Some(b), Some(out), epilogue.bias]
            .into_iter()
            .chain([epilogue.a_gate.map(|g| g.output)]);
        if operands
            .flatten()
            .any(|v| v.buffer.same_memory(sums.buffer))
        {
            return Err(invalid(
                "the row sums must not share memory with another operand".into(),
            ));
        }
    }
    Ok((matrices, bias))
}

/// Returns the three operands as matrices; batches of 1 broadcast.
pub fn matmul<B: DeviceBuffer>(
    a: View<'_, B>,
    b: View<'_, B>,
    out: View<'_, B>,
) -> Result<[MatrixView; 3]> {
    output("matmul", out)?;
    for (v, what) in [(a, "a"), (b, "b"), (out, "out")] {
        fits("matmul", v)?;
        float("matmul", v.dtype())?;
        if !(2..=3).contains(&v.layout.rank()) {
            return Err(Error::InvalidArgument {
                op: "matmul",
                detail: format!(
                    "{what} must have rank 2 or 3, got shape {:?}",
                    v.layout.shape
                ),
            });
        }
    }
    dtype_is("matmul", a.dtype(), b.dtype())?;
    let (am, bm, om) = (
        MatrixView::of(a.layout),
        MatrixView::of(b.layout),
        MatrixView::of(out.layout),
    );
    let batch_ok = |x: usize| x == om.batch || x == 1;
    if am.cols != bm.rows
        || am.rows != om.rows
        || bm.cols != om.cols
        || !batch_ok(am.batch)
        || !batch_ok(bm.batch)
    {
        return Err(Error::ShapeMismatch {
            op: "matmul",
            expected: a.layout.shape.clone(),
            got: b.layout.shape.clone(),
            detail: format!(
                "[batch, m, k] @ [batch, k, n] cannot produce an output of shape {:?}",
                out.layout.shape
            ),
        });
    }
    if out.buffer.same_memory(a.buffer) || out.buffer.same_memory(b.buffer) {
        return Err(Error::InvalidArgument {
            op: "matmul",
            detail: "the output must not share memory with an operand".into(),
        });
    }
    Ok([am, bm, om])
}

pub fn spmv_csr<B: DeviceBuffer>(a: &Csr<'_, B>, x: &B, y: &B) -> Result<()> {
    const OP: &str = "spmv_csr";
    dtype_is(OP, DType::U32, a.row_offsets.dtype())?;
    dtype_is(OP, DType::U32, a.col_indices.dtype())?;
    // f32 throughout, or f64 throughout.
    let float = a.values.dtype();
    if !matches!(float, DType::F32 | DType::F64) {
        dtype_is(OP, DType::F32, float)?;
    }
    for buf in [x, y] {
        dtype_is(OP, float, buf.dtype())?;
    }
    if [a.row_offsets, a.col_indices, a.values, x]
        .iter()
        .any(|b| b.same_memory(y))
    {
        return Err(Error::InvalidArgument {
            op: OP,
            detail: "y must not share memory with the matrix or x".into(),
        });
    }
    if a.rows.checked_add(1) != Some(a.row_offsets.len())
        || x.len() != a.cols
        || y.len() != a.rows
        || a.col_indices.len() != a.values.len()
    {
        return Err(Error::ShapeMismatch {
            op: OP,
            expected: vec![a.rows.saturating_add(1), a.cols, a.rows],
            got: vec![a.row_offsets.len(), x.len(), y.len()],
            detail: "row_offsets needs rows + 1 entries, x cols, y rows; col_indices and values one length".into(),
        });
    }
    Ok(())
}

/// Checks a CSR structure read to the host: offsets start at 0, never decrease, end within the
/// stored entries, and every column index is below `cols`.
pub fn csr_structure(offsets: &[u32], cols: &[u32], ncols: usize, nnz: usize) -> Result<()> {
    const OP: &str = "spmv_csr";
    let rows = offsets.len().saturating_sub(1);
    if offsets.first() != Some(&0)
        || offsets.windows(2).any(|w| w[0] > w[1])
        || offsets[rows] as usize > nnz
    {
        return Err(Error::InvalidArgument {
            op: OP,
            detail: "row_offsets must start at 0, never decrease and end within the stored entries"
                .into(),
        });
    }
    if let Some(&bad) = cols[..offsets[rows] as usize]
        .iter()
        .find(|&&c| c as usize >= ncols)
    {
        return Err(Error::IndexOutOfRange {
            op: OP,
            index: bad as i64,
            bound: ncols,
        });
    }
    Ok(())
}
