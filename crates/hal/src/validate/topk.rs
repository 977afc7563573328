//! The checks of [`crate::Backend::top_k`], [`crate::Backend::ivf_scan`] and
//! [`crate::Backend::candidate_scores`].

use super::{disjoint, dtype_is, fits, output, rank, same_shape};
use crate::topk::{CandidateInputs, CandidateShape, IvfScanInputs, IvfScanShape, MAX_CODEWORDS};
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

/// One contiguous operand of `op` of rank `r` and dtype `dtype`.
fn operand<B: DeviceBuffer>(
    op: &'static str,
    v: View<'_, B>,
    r: usize,
    dtype: DType,
    what: &'static str,
) -> Result<()> {
    fits(op, v)?;
    rank(op, v, r, what)?;
    dtype_is(op, dtype, v.dtype())?;
    if v.layout.numel() > 0 && !v.layout.is_contiguous() {
        return Err(invalid(
            op,
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
    operand(OP, x.tables, 3, DType::F32, "tables")?;
    operand(OP, x.probes, 2, DType::U32, "probes")?;
    operand(OP, x.bases, 2, DType::F32, "bases")?;
    operand(OP, x.offsets, 1, DType::U32, "offsets")?;
    operand(OP, x.codes, 2, DType::U32, "codes")?;
    operand(OP, x.ids, 1, DType::U32, "ids")?;
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
        operand(OP, l, 3, DType::F32, "list_tables")?;
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

/// Returns the sizes of a `candidate_scores`.
pub fn candidate_scores<B: DeviceBuffer>(
    x: CandidateInputs<'_, B>,
    scores: View<'_, B>,
) -> Result<CandidateShape> {
    const OP: &str = "candidate_scores";
    operand(OP, x.queries, 2, DType::F32, "queries")?;
    let vt = x.vectors.dtype();
    let vt = if vt == DType::F16 { vt } else { DType::F32 };
    operand(OP, x.vectors, 2, vt, "vectors")?;
    operand(OP, x.labels, 2, DType::U32, "labels")?;
    let [queries, d] = [0, 1].map(|i| x.queries.layout.shape[i]);
    let [n, vd] = [0, 1].map(|i| x.vectors.layout.shape[i]);
    let candidates = x.labels.layout.shape[1];
    same_shape(OP, &[n, d], &[n, vd], "vectors have the queries' dimension")?;
    same_shape(
        OP,
        &[queries, candidates],
        &x.labels.layout.shape,
        "labels are [queries, candidates]",
    )?;
    if let Some(b) = x.query_bias {
        operand(OP, b, 1, DType::F32, "query_bias")?;
        same_shape(OP, &[queries], &b.layout.shape, "one query bias a query")?;
    }
    if let Some(b) = x.vector_bias {
        operand(OP, b, 1, DType::F32, "vector_bias")?;
        same_shape(OP, &[n], &b.layout.shape, "one vector bias a vector")?;
    }
    if n >= u32::MAX as usize {
        return Err(invalid(
            OP,
            format!("{n} vectors: labels are u32 below u32::MAX"),
        ));
    }
    output(OP, scores)?;
    dtype_is(OP, DType::F32, scores.dtype())?;
    same_shape(
        OP,
        &[queries, candidates],
        &scores.layout.shape,
        "scores are [queries, candidates]",
    )?;
    for r in [
        Some(x.queries),
        Some(x.vectors),
        Some(x.labels),
        x.query_bias,
        x.vector_bias,
    ]
    .into_iter()
    .flatten()
    {
        disjoint(OP, r, scores, false)?;
    }
    Ok(CandidateShape {
        queries,
        candidates,
        d,
        n,
    })
}
