//! The checks of [`crate::Backend::top_k`] and [`crate::Backend::ivf_scan`].

use super::{disjoint, dtype_is, fits, output, rank, same_shape};
use crate::topk::{IvfScanInputs, IvfScanShape, MAX_CODEWORDS};
use crate::{DType, DeviceBuffer, Error, Result, View};

fn invalid(op: &'static str, detail: String) -> Error {
    Error::InvalidArgument { op, detail }
}

/// Two outputs of rank 2 shaped `[rows, k]`, f32 and u32, apart from each other and from
/// `reads`.
fn outputs<B: DeviceBuffer>(
    op: &'static str,
    reads: &[View<'_, B>],
    [values, indices]: [View<'_, B>; 2],
    shape: [usize; 2],
) -> Result<()> {
    for (o, dtype, what) in [
        (values, DType::F32, "the values are [rows, k]"),
        (indices, DType::U32, "the indices are [rows, k]"),
    ] {
        output(op, o)?;
        dtype_is(op, dtype, o.dtype())?;
        same_shape(op, &shape, &o.layout.shape, what)?;
        for &r in reads {
            disjoint(op, r, o, false)?;
        }
    }
    disjoint(op, values, indices, false)
}

/// Returns `(rows, n, k)`.
pub fn top_k<B: DeviceBuffer>(
    x: View<'_, B>,
    values: View<'_, B>,
    indices: View<'_, B>,
) -> Result<(usize, usize, usize)> {
    const OP: &str = "top_k";
    fits(OP, x)?;
    rank(OP, x, 2, "x")?;
    dtype_is(OP, DType::F32, x.dtype())?;
    rank(OP, values, 2, "values")?;
    let (rows, n, k) = (x.layout.shape[0], x.layout.shape[1], values.layout.shape[1]);
    outputs(OP, &[x], [values, indices], [rows, k])?;
    if k > n {
        return Err(invalid(
            OP,
            format!("k ({k}) is larger than the row length ({n})"),
        ));
    }
    if n > u32::MAX as usize {
        return Err(invalid(
            OP,
            format!("rows of {n} values: indices are u32, so at most 2^32 - 1"),
        ));
    }
    Ok((rows, n, k))
}

/// One contiguous operand of `ivf_scan` of rank `r` and dtype `dtype`.
fn operand<B: DeviceBuffer>(
    v: View<'_, B>,
    r: usize,
    dtype: DType,
    what: &'static str,
) -> Result<()> {
    const OP: &str = "ivf_scan";
    fits(OP, v)?;
    rank(OP, v, r, what)?;
    dtype_is(OP, dtype, v.dtype())?;
    if !v.layout.is_contiguous() {
        return Err(invalid(
            OP,
            format!(
                "{what} must be contiguous, got strides {:?}",
                v.layout.strides
            ),
        ));
    }
    Ok(())
}

/// Returns the scan's sizes.
pub fn ivf_scan<B: DeviceBuffer>(
    x: IvfScanInputs<'_, B>,
    distances: View<'_, B>,
    labels: View<'_, B>,
) -> Result<IvfScanShape> {
    const OP: &str = "ivf_scan";
    operand(x.tables, 3, DType::F32, "tables")?;
    operand(x.probes, 2, DType::U32, "probes")?;
    operand(x.bases, 2, DType::F32, "bases")?;
    operand(x.offsets, 1, DType::U32, "offsets")?;
    operand(x.codes, 2, DType::U32, "codes")?;
    operand(x.ids, 1, DType::U32, "ids")?;
    let [queries, bytes, codewords] = [0, 1, 2].map(|i| x.tables.layout.shape[i]);
    let probes = x.probes.layout.shape[1];
    same_shape(
        OP,
        &[queries, probes],
        &x.probes.layout.shape,
        "probes are [queries, p]",
    )?;
    same_shape(
        OP,
        &[queries, probes],
        &x.bases.layout.shape,
        "bases are shaped as probes",
    )?;
    let lists = x.offsets.layout.shape[0].checked_sub(1).ok_or_else(|| {
        invalid(
            OP,
            "offsets hold lists + 1 entries (at least one)".to_string(),
        )
    })?;
    let (members, words) = (x.codes.layout.shape[0], x.codes.layout.shape[1]);
    if words != bytes.div_ceil(4) {
        return Err(invalid(
            OP,
            format!(
                "codes of {bytes} bytes take {} words, got {words}",
                bytes.div_ceil(4)
            ),
        ));
    }
    same_shape(OP, &[members], &x.ids.layout.shape, "one id per code")?;
    if let Some(l) = x.list_tables {
        operand(l, 3, DType::F32, "list_tables")?;
        same_shape(
            OP,
            &[lists, bytes, codewords],
            &l.layout.shape,
            "list tables are [lists, bytes, codewords]",
        )?;
    }
    if codewords > MAX_CODEWORDS || (codewords == 0 && bytes > 0) {
        return Err(invalid(
            OP,
            format!("codewords must be 1 to {MAX_CODEWORDS} (a code is a byte), got {codewords}"),
        ));
    }
    if members > u32::MAX as usize || lists >= u32::MAX as usize {
        return Err(invalid(
            OP,
            format!("{members} members in {lists} lists: positions are u32"),
        ));
    }
    rank(OP, distances, 2, "distances")?;
    let k = distances.layout.shape[1];
    let reads: Vec<View<'_, B>> = [
        Some(x.tables),
        x.list_tables,
        Some(x.probes),
        Some(x.bases),
        Some(x.offsets),
        Some(x.codes),
        Some(x.ids),
    ]
    .into_iter()
    .flatten()
    .collect();
    outputs(OP, &reads, [distances, labels], [queries, k])?;
    Ok(IvfScanShape {
        queries,
        probes,
        lists,
        members,
        bytes,
        codewords,
        words,
        k,
    })
}
