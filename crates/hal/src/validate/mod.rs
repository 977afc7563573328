//! Argument checks for every primitive, written once and called by every backend before it
//! launches anything, so that bad input gets the same clear [`Error`] everywhere and a failed
//! call has touched nothing. (Checks that need the *contents* of an index buffer are the
//! backend's, since reading them may cost a device round trip.)
//!
//! - `operand.rs`: the checks every primitive's operands pass: a view inside its buffer
//!   ([`fits`]), an output reaching each element once ([`output`]), inputs it must not
//!   overlap ([`disjoint`]), shapes, dtypes and broadcasting.
//! - `attention.rs`: the attention passes' operands and sizes ([`AttentionShape`]).
//! - `norm.rs`: layer normalisation's operands.
//! - `collective.rs`: the collectives' operands, counts and in-place forms.
//! - `matmul.rs`: [`MatrixView`] and the products' checks, and CSR's.
//! - `topk.rs`: selection's and the inverted-list scan's operands.
//! - here: the other primitives' checks, one function each.

mod attention;
mod collective;
mod matmul;
mod norm;
mod operand;
mod topk;

pub use attention::{AttentionShape, attention, attention_backward, lse_dtype};
pub use collective::{CollectiveKind, collective};
pub use norm::{layer_norm, layer_norm_backward};
pub use topk::{candidate_scores, ivf_scan, top_k};

pub use matmul::{MatrixView, csr_structure, matmul, matmul_epilogue, spmv_csr};
pub use operand::{
    broadcast, disjoint, dtype_is, f64_offered, fits, float, index_dtype, output, rank, same_shape,
};

use crate::ir::Program;
use crate::{
    AdamParams, Conv2dGeometry, DType, DeviceBuffer, Error, Layout, ReduceOp, Result, SgdParams,
    View,
};

/// A read into a host slice: `bytes` (the buffer's size) must equal `dst` (the slice's).
pub fn read_into(bytes: usize, dst: usize) -> Result<()> {
    if bytes != dst {
        return Err(Error::ShapeMismatch {
            op: "read_bytes_into",
            expected: vec![bytes],
            got: vec![dst],
            detail: "bytes of the buffer, bytes of the destination".into(),
        });
    }
    Ok(())
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
    f64_offered(
        OP,
        &[x.dtype(), c.dtype(), out_distance.dtype()],
        false,
        || "the search has no f64 form (it computes f32 distances)".into(),
    )?;
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

/// Optimizer buffers: one length, all `f32` or all `f64`.
fn optimizer<B: DeviceBuffer>(op: &'static str, bufs: &[&B]) -> Result<()> {
    let float = match bufs[0].dtype() {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    for b in bufs {
        dtype_is(op, float, b.dtype())?;
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
    if n as u64 > u64::from(u32::MAX) + 1 {
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
