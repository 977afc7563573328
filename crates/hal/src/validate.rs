//! Argument checks for every primitive, written once and called by every backend before it
//! launches anything, so that bad input gets the same clear [`Error`] everywhere and a failed
//! call has touched nothing. (Checks that need the *contents* of an index buffer are the
//! backend's, since reading them may cost a device round trip.)

use crate::ir::Program;
use crate::{
    AdamParams, Conv2dGeometry, Csr, DType, DeviceBuffer, Epilogue, Error, Layout, ReduceOp,
    Result, SgdParams, View,
};

/// The view lies inside its buffer ([`Layout::check_fits`]: checked arithmetic throughout)
/// and within what its backend can index ([`DeviceBuffer::index_limit`]).
pub fn fits<B: DeviceBuffer>(op: &'static str, v: View<'_, B>) -> Result<()> {
    v.layout.check_fits(op, v.buffer.len())?;
    let limit = v.buffer.index_limit();
    if limit < isize::MAX as usize {
        let l = v.layout;
        let too_large = l.numel() > limit
            || l.offset > limit
            || l.shape.iter().any(|&d| d > limit)
            || l.strides.iter().any(|&s| s.unsigned_abs() > limit);
        if too_large {
            return Err(Error::Unsupported {
                op,
                detail: format!(
                    "the view {l:?} has more elements, or a larger offset or stride, than this \
                     backend's kernels index ({limit})"
                ),
            });
        }
    }
    Ok(())
}

/// An output view: it lies inside its buffer and reaches each of its elements once
/// ([`Layout::check_no_self_overlap`]), so the threads of one operation write disjoint memory.
pub fn output<B: DeviceBuffer>(op: &'static str, v: View<'_, B>) -> Result<()> {
    fits(op, v)?;
    v.layout.check_no_self_overlap(op)
}

/// An input that an output must not overlap: a different buffer, or addresses outside the
/// output's range. With `in_place`, a view identical to the output's is allowed too (an
/// elementwise primitive reads each element before it writes it).
pub fn disjoint<B: DeviceBuffer>(
    op: &'static str,
    input: View<'_, B>,
    out: View<'_, B>,
    in_place: bool,
) -> Result<()> {
    if !input.buffer.same_memory(out.buffer) || (in_place && input.layout == out.layout) {
        return Ok(());
    }
    let ranges = (
        input.layout.checked_address_range(op)?,
        out.layout.checked_address_range(op)?,
    );
    match ranges {
        (Some((ilo, ihi)), Some((olo, ohi))) if ilo <= ohi && olo <= ihi => {
            Err(Error::InvalidArgument {
                op,
                detail: format!(
                    "the output view {:?} overlaps an input view {:?} of the same buffer{}",
                    out.layout,
                    input.layout,
                    if in_place {
                        " (only an identical view may be updated in place)"
                    } else {
                        ""
                    }
                ),
            })
        }
        _ => Ok(()),
    }
}

pub fn same_shape(op: &'static str, expected: &[usize], got: &[usize], what: &str) -> Result<()> {
    if expected != got {
        return Err(Error::ShapeMismatch {
            op,
            expected: expected.to_vec(),
            got: got.to_vec(),
            detail: what.to_string(),
        });
    }
    Ok(())
}

pub fn float(op: &'static str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            detail: " (a float dtype is required)".into(),
        });
    }
    Ok(())
}

pub fn dtype_is(op: &'static str, expected: DType, got: DType) -> Result<()> {
    if expected != got {
        return Err(Error::DTypeMismatch { op, expected, got });
    }
    Ok(())
}

pub fn index_dtype(op: &'static str, dtype: DType) -> Result<()> {
    if !matches!(dtype, DType::U32 | DType::I32) {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            detail: " (indices are u32 or i32)".into(),
        });
    }
    Ok(())
}

pub fn rank<B: DeviceBuffer>(op: &'static str, v: View<'_, B>, r: usize, what: &str) -> Result<()> {
    if v.layout.rank() != r {
        return Err(Error::InvalidArgument {
            op,
            detail: format!("{what} must have rank {r}, got shape {:?}", v.layout.shape),
        });
    }
    Ok(())
}

/// `v`'s layout broadcast to `shape` (after checking it fits its buffer).
pub fn broadcast<B: DeviceBuffer>(
    op: &'static str,
    v: View<'_, B>,
    shape: &[usize],
) -> Result<Layout> {
    fits(op, v)?;
    v.layout
        .broadcast_to(shape)
        .map_err(|_| Error::ShapeMismatch {
            op,
            expected: shape.to_vec(),
            got: v.layout.shape.clone(),
            detail: "operand cannot be broadcast to the output shape".into(),
        })
}

pub fn fill<B: DeviceBuffer>(out: View<'_, B>) -> Result<()> {
    output("fill", out)
}

pub fn copy<B: DeviceBuffer>(src: View<'_, B>, out: View<'_, B>) -> Result<()> {
    fits("copy", src)?;
    output("copy", out)?;
    disjoint("copy", src, out, true)?;
    same_shape(
        "copy",
        &out.layout.shape,
        &src.layout.shape,
        "copy needs equal shapes",
    )
}

/// Returns `x`'s layout broadcast to the output's shape.
pub fn unary<B: DeviceBuffer>(x: View<'_, B>, out: View<'_, B>) -> Result<Layout> {
    output("unary", out)?;
    disjoint("unary", x, out, true)?;
    float("unary", x.dtype())?;
    float("unary", out.dtype())?;
    broadcast("unary", x, &out.layout.shape)
}

/// Returns both operands' layouts broadcast to the output's shape.
pub fn binary<B: DeviceBuffer>(
    a: View<'_, B>,
    b: View<'_, B>,
    out: View<'_, B>,
) -> Result<(Layout, Layout)> {
    output("binary", out)?;
    disjoint("binary", a, out, true)?;
    disjoint("binary", b, out, true)?;
    Ok((
        broadcast("binary", a, &out.layout.shape)?,
        broadcast("binary", b, &out.layout.shape)?,
    ))
}

/// Returns the three operands' layouts broadcast to the output's shape.
pub fn ternary<B: DeviceBuffer>(
    a: View<'_, B>,
    b: View<'_, B>,
    c: View<'_, B>,
    out: View<'_, B>,
) -> Result<[Layout; 3]> {
    output("ternary", out)?;
    for input in [a, b, c] {
        disjoint("ternary", input, out, true)?;
    }
    let s = &out.layout.shape;
    Ok([
        broadcast("ternary", a, s)?,
        broadcast("ternary", b, s)?,
        broadcast("ternary", c, s)?,
    ])
}

pub fn reduce<B: DeviceBuffer>(
    op: ReduceOp,
    x: View<'_, B>,
    axes: &[usize],
    out: View<'_, B>,
) -> Result<()> {
    fits("reduce", x)?;
    output("reduce", out)?;
    disjoint("reduce", x, out, false)?;
    float("reduce", out.dtype())?;
    let mut expected = x.layout.shape.clone();
    for (i, &a) in axes.iter().enumerate() {
        if a >= x.layout.rank() || axes[..i].contains(&a) {
            return Err(Error::InvalidArgument {
                op: "reduce",
                detail: format!(
                    "axes {axes:?} are not distinct axes of rank {}",
                    x.layout.rank()
                ),
            });
        }
        expected[a] = 1;
    }
    same_shape(
        "reduce",
        &expected,
        &out.layout.shape,
        "the output keeps reduced axes as size 1",
    )?;
    let reduced = crate::numel(&axes.iter().map(|&a| x.layout.shape[a]).collect::<Vec<_>>());
    if reduced == 0 && out.layout.numel() > 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return Err(Error::Empty {
            op: "reduce",
            detail: format!(
                "{op:?} over axes {axes:?} of shape {:?} has no elements",
                x.layout.shape
            ),
        });
    }
    Ok(())
}

pub fn arg_reduce<B: DeviceBuffer>(x: View<'_, B>, axis: usize, out: View<'_, B>) -> Result<()> {
    fits("arg_reduce", x)?;
    output("arg_reduce", out)?;
    disjoint("arg_reduce", x, out, false)?;
    dtype_is("arg_reduce", DType::U32, out.dtype())?;
    if axis >= x.layout.rank() {
        return Err(Error::InvalidArgument {
            op: "arg_reduce",
            detail: format!("axis {axis} is out of range for shape {:?}", x.layout.shape),
        });
    }
    let mut expected = x.layout.shape.clone();
    expected[axis] = 1;
    same_shape(
        "arg_reduce",
        &expected,
        &out.layout.shape,
        "the output keeps the reduced axis as size 1",
    )?;
    if x.layout.shape[axis] == 0 && out.layout.numel() > 0 {
        return Err(Error::Empty {
            op: "arg_reduce",
            detail: format!("axis {axis} of shape {:?} has no elements", x.layout.shape),
        });
    }
    Ok(())
}

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
    for buf in [a.values, x, y] {
        dtype_is(OP, DType::F32, buf.dtype())?;
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

fn gather_shapes<B: DeviceBuffer>(
    op: &'static str,
    x: View<'_, B>,
    axis: usize,
    index: View<'_, B>,
) -> Result<()> {
    fits(op, x)?;
    fits(op, index)?;
    index_dtype(op, index.dtype())?;
    let (xs, is) = (&x.layout.shape, &index.layout.shape);
    if axis >= xs.len() || xs.len() != is.len() || (0..xs.len()).any(|d| d != axis && is[d] > xs[d])
    {
        return Err(Error::ShapeMismatch {
            op,
            expected: xs.clone(),
            got: is.clone(),
            detail: format!(
                "the index must have the data's rank, axis {axis} inside it, and no larger dimension off the axis"
            ),
        });
    }
    Ok(())
}

pub fn gather<B: DeviceBuffer>(
    x: View<'_, B>,
    axis: usize,
    index: View<'_, B>,
    out: View<'_, B>,
) -> Result<()> {
    gather_shapes("gather", x, axis, index)?;
    output("gather", out)?;
    disjoint("gather", x, out, false)?;
    disjoint("gather", index, out, false)?;
    same_shape(
        "gather",
        &index.layout.shape,
        &out.layout.shape,
        "the output has the index's shape",
    )
}

pub fn scatter_add<B: DeviceBuffer>(
    src: View<'_, B>,
    axis: usize,
    index: View<'_, B>,
    out: View<'_, B>,
) -> Result<()> {
    gather_shapes("scatter_add", out, axis, index)?;
    output("scatter_add", out)?;
    fits("scatter_add", src)?;
    disjoint("scatter_add", src, out, false)?;
    disjoint("scatter_add", index, out, false)?;
    float("scatter_add", out.dtype())?;
    same_shape(
        "scatter_add",
        &index.layout.shape,
        &src.layout.shape,
        "the source has the index's shape",
    )
}

fn conv_cols(op: &'static str, g: &Conv2dGeometry) -> Result<Vec<usize>> {
    g.cols_shape()
        .map(|s| s.to_vec())
        .ok_or_else(|| Error::InvalidArgument { op, detail: format!("{g:?} has a zero stride, dilation or kernel, a kernel larger than the padded input, or sizes that overflow") })
}

pub fn im2col<B: DeviceBuffer>(x: View<'_, B>, g: &Conv2dGeometry, out: View<'_, B>) -> Result<()> {
    let cols = conv_cols("im2col", g)?;
    fits("im2col", x)?;
    output("im2col", out)?;
    disjoint("im2col", x, out, false)?;
    same_shape(
        "im2col",
        &g.image_shape(),
        &x.layout.shape,
        "the input has the geometry's image shape",
    )?;
    same_shape(
        "im2col",
        &cols,
        &out.layout.shape,
        "the output has the geometry's columns shape",
    )
}

pub fn col2im<B: DeviceBuffer>(
    cols: View<'_, B>,
    g: &Conv2dGeometry,
    out: View<'_, B>,
) -> Result<()> {
    let shape = conv_cols("col2im", g)?;
    fits("col2im", cols)?;
    output("col2im", out)?;
    disjoint("col2im", cols, out, false)?;
    same_shape(
        "col2im",
        &shape,
        &cols.layout.shape,
        "the input has the geometry's columns shape",
    )?;
    same_shape(
        "col2im",
        &g.image_shape(),
        &out.layout.shape,
        "the output has the geometry's image shape",
    )
}

pub fn nearest_centroid<B: DeviceBuffer>(
    x: View<'_, B>,
    c: View<'_, B>,
    out_index: View<'_, B>,
    out_distance: View<'_, B>,
) -> Result<()> {
    const OP: &str = "nearest_centroid";
    for v in [x, c] {
        fits(OP, v)?;
    }
    for out in [out_index, out_distance] {
        output(OP, out)?;
        for input in [x, c] {
            disjoint(OP, input, out, false)?;
        }
    }
    disjoint(OP, out_index, out_distance, false)?;
    // Rank 2, or rank 3 for a batch of independent searches.
    let r = x.layout.rank();
    if !(2..=3).contains(&r) {
        return Err(Error::InvalidArgument {
            op: OP,
            detail: format!(
                "x must have rank 2 (or 3 for a batch), got shape {:?}",
                x.layout.shape
            ),
        });
    }
    rank(OP, c, r, "centroids (as x)")?;
    float(OP, x.dtype())?;
    float(OP, c.dtype())?;
    dtype_is(OP, DType::U32, out_index.dtype())?;
    dtype_is(OP, DType::F32, out_distance.dtype())?;
    let batch = &x.layout.shape[..r - 2];
    let (n, d) = (x.layout.shape[r - 2], x.layout.shape[r - 1]);
    let m = c.layout.shape[r - 2];
    let with_batch = |tail: &[usize]| [batch, tail].concat();
    same_shape(
        OP,
        &with_batch(&[m, d]),
        &c.layout.shape,
        "centroids have the points' batch and dimension",
    )?;
    let outputs = with_batch(&[n]);
    same_shape(OP, &outputs, &out_index.layout.shape, "one index per point")?;
    same_shape(
        OP,
        &outputs,
        &out_distance.layout.shape,
        "one distance per point",
    )?;
    if m == 0 && n > 0 && !batch.contains(&0) {
        return Err(Error::Empty {
            op: OP,
            detail: "no centroids to search".into(),
        });
    }
    Ok(())
}

pub fn segment_sum<B: DeviceBuffer>(
    x: View<'_, B>,
    segment: View<'_, B>,
    weights: Option<View<'_, B>>,
    sums: View<'_, B>,
    counts: View<'_, B>,
) -> Result<()> {
    const OP: &str = "segment_sum";
    for v in [x, segment].into_iter().chain(weights) {
        fits(OP, v)?;
        for out in [sums, counts] {
            disjoint(OP, v, out, false)?;
        }
    }
    for out in [sums, counts] {
        output(OP, out)?;
    }
    disjoint(OP, sums, counts, false)?;
    rank(OP, x, 2, "x")?;
    rank(OP, sums, 2, "sums")?;
    dtype_is(OP, DType::U32, segment.dtype())?;
    float(OP, sums.dtype())?;
    float(OP, counts.dtype())?;
    let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
    same_shape(OP, &[n], &segment.layout.shape, "one segment id per row")?;
    same_shape(
        OP,
        &[m, d],
        &sums.layout.shape,
        "sums are [segments, columns]",
    )?;
    same_shape(OP, &[m], &counts.layout.shape, "one count per segment")?;
    if let Some(w) = weights {
        same_shape(OP, &[n], &w.layout.shape, "one weight per row")?;
    }
    Ok(())
}

/// Checks [`crate::Backend::kmeans_pp`]'s operands; returns `[n, d, m]`.
pub fn kmeans_pp<B: DeviceBuffer>(x: View<'_, B>, anchors: View<'_, B>) -> Result<[usize; 3]> {
    const OP: &str = "kmeans_pp";
    for v in [x, anchors] {
        fits(OP, v)?;
        dtype_is(OP, DType::F32, v.dtype())?;
        if !v.layout.is_contiguous() || v.layout.offset != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                detail: format!(
                    "x and anchors must be contiguous from offset 0, got strides {:?} offset {}",
                    v.layout.strides, v.layout.offset
                ),
            });
        }
    }
    rank(OP, x, 2, "x")?;
    rank(OP, anchors, 2, "anchors")?;
    if x.buffer.same_memory(anchors.buffer) {
        return Err(Error::InvalidArgument {
            op: OP,
            detail: "the anchors must not share memory with x".into(),
        });
    }
    let (n, d, m) = (
        x.layout.shape[0],
        x.layout.shape[1],
        anchors.layout.shape[0],
    );
    same_shape(
        OP,
        &[m, d],
        &anchors.layout.shape,
        "anchors are [m, d] for x [n, d]",
    )?;
    if m > n {
        return Err(Error::InvalidArgument {
            op: OP,
            detail: format!("{m} anchors asked of {n} rows: at most one anchor per row"),
        });
    }
    Ok([n, d, m])
}

fn optimizer<B: DeviceBuffer>(op: &'static str, bufs: &[&B]) -> Result<()> {
    for b in bufs {
        dtype_is(op, DType::F32, b.dtype())?;
        if b.len() != bufs[0].len() {
            return Err(Error::ShapeMismatch {
                op,
                expected: vec![bufs[0].len()],
                got: vec![b.len()],
                detail: "optimizer buffers have one length".into(),
            });
        }
    }
    Ok(())
}

pub fn sgd_step<B: DeviceBuffer>(
    param: &B,
    grad: &B,
    momentum_buffer: Option<&B>,
    p: &SgdParams,
) -> Result<()> {
    let bufs: Vec<&B> = [param, grad].into_iter().chain(momentum_buffer).collect();
    optimizer("sgd_step", &bufs)?;
    if p.momentum != 0.0 && momentum_buffer.is_none() {
        return Err(Error::InvalidArgument {
            op: "sgd_step",
            detail: "momentum != 0 needs a momentum buffer".into(),
        });
    }
    Ok(())
}

pub fn adam_step<B: DeviceBuffer>(
    param: &B,
    grad: &B,
    m: &B,
    v: &B,
    _p: &AdamParams,
) -> Result<()> {
    optimizer("adam_step", &[param, grad, m, v])
}

pub fn random<B: DeviceBuffer>(out: View<'_, B>) -> Result<()> {
    output("random", out)?;
    float("random", out.dtype())
}

/// The buffers bound to a program launch: one per declared buffer, each of its declared dtype;
/// launch indices fit the IR's `u32` index.
pub fn launch<B: DeviceBuffer>(program: &Program, args: &[&B], n: usize) -> Result<()> {
    if args.len() != program.buffers.len() {
        return Err(Error::InvalidArgument {
            op: "launch",
            detail: format!(
                "program `{}` takes {} buffers, {} were bound",
                program.name,
                program.buffers.len(),
                args.len()
            ),
        });
    }
    for (i, (a, decl)) in args.iter().zip(&program.buffers).enumerate() {
        if a.dtype() != decl.dtype {
            return Err(Error::InvalidArgument {
                op: "launch",
                detail: format!(
                    "buffer {i} of program `{}` is declared {} but a {} buffer was bound",
                    program.name,
                    decl.dtype,
                    a.dtype()
                ),
            });
        }
    }
    if n > u32::MAX as usize + 1 {
        return Err(Error::InvalidArgument {
            op: "launch",
            detail: format!("{n} launch indices exceed the u32 index range"),
        });
    }
    Ok(())
}

/// The number of `dtype` elements in an upload of `bytes`, which must be a whole number of them.
pub fn upload(dtype: DType, bytes: &[u8]) -> Result<usize> {
    let size = dtype.size_in_bytes();
    if bytes.len() % size != 0 {
        return Err(Error::InvalidArgument {
            op: "upload",
            detail: format!(
                "{} bytes is not a whole number of {dtype} elements",
                bytes.len()
            ),
        });
    }
    Ok(bytes.len() / size)
}

/// A write must cover the whole buffer, byte for byte.
pub fn write<B: DeviceBuffer>(dst: &B, bytes: &[u8]) -> Result<()> {
    let size = dst.len() * dst.dtype().size_in_bytes();
    if bytes.len() != size {
        return Err(Error::InvalidArgument {
            op: "write",
            detail: format!("{} bytes written to a buffer of {size} bytes", bytes.len()),
        });
    }
    Ok(())
}
