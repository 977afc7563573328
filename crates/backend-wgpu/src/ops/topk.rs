//! Selection: top-k of rows and the inverted-list scan (`shaders/topk/`), a workgroup per row;
//! candidate scores, 32 invocations per candidate.

use crate::buffer::WgpuBuffer;
use crate::pipeline::{Params, Spec, launch_params};
use crate::{V, WgpuBackend};
use hal::fault::{FaultKind, fault_code, offsets_fault_code};
use hal::topk::check_gpu_k;
use hal::{Backend, CandidateInputs, DType, Error, IvfScanInputs, Result, validate};

/// The selection buffer's pairs for `k` (topk_select.wgsl's `cap` slot): room for k and a
/// round of 256, a power of two for the sort.
fn cap(k: usize) -> usize {
    if k + 256 <= 1024 { 1024 } else { 2048 }
}

/// Workgroup memory of the selection state: two arrays of `cap` words and three more words,
/// rounded up.
fn select_bytes(cap: usize) -> usize {
    2 * cap * 4 + 16
}

/// A kernel of `file` with the selection buffer sized for `k`.
fn spec(file: &'static str, k: usize) -> Spec {
    Spec::new(file).slot("cap", format!("const TK_CAP: u32 = {}u;", cap(k)))
}

/// Rows of candidates one invocation's loops may cover on a CPU adapter (lavapipe stops loops
/// after 65535 iterations): rounds of 256 candidates plus the sorts of the compactions.
const CAPPED_CANDIDATES: usize = 16_384;

/// Probes a query may make on a CPU adapter (each loads its table, up to 16 iterations).
const CAPPED_PROBES: usize = 256;

fn unsupported(op: &'static str, detail: String) -> Error {
    Error::Unsupported { op, detail }
}

impl WgpuBackend {
    /// Refuses what the kernels cannot hold: k past the selection buffer, rows past a
    /// dispatch, and on a CPU adapter loops past its cap.
    fn check_selection(&self, op: &'static str, rows: usize, k: usize, n: usize) -> Result<()> {
        check_gpu_k(op, k, "wgpu")?;
        let max = self.0.limits.max_compute_workgroups_per_dimension as usize;
        if rows > max * max {
            return Err(unsupported(
                op,
                format!("{rows} rows: at most {} workgroups", max * max),
            ));
        }
        if !self.info().kind.is_hardware_gpu() && n > CAPPED_CANDIDATES {
            return Err(unsupported(
                op,
                format!(
                    "{n} candidates a row: this CPU adapter stops shader loops after 65535 \
                     iterations, so its kernels take at most {CAPPED_CANDIDATES}"
                ),
            ));
        }
        Ok(())
    }
}

pub(crate) fn top_k(
    gpu: &WgpuBackend,
    x: V<'_>,
    values: V<'_>,
    indices: V<'_>,
    largest: bool,
) -> Result<()> {
    const OP: &str = "top_k";
    let (rows, n, k) = validate::top_k(x, values, indices)?;
    gpu.check_selection(OP, rows, k, n)?;
    if rows == 0 || k == 0 {
        return Ok(());
    }
    let params = Params::default()
        .scalar(0, n as u32)
        .scalar(1, k as u32)
        .scalar(2, if largest { u32::MAX } else { 0 })
        .matrix(3, x.layout)
        .matrix(6, values.layout)
        .matrix(9, indices.layout)
        .scalar(12, rows as u32);
    let kernel = gpu.kernel(&spec("top_k.wgsl", k))?;
    gpu.dispatch_groups(
        &kernel,
        &params,
        &[
            (x.buffer, false),
            (values.buffer, true),
            (indices.buffer, true),
        ],
        gpu.row_groups(rows),
    )
}

pub(crate) fn ivf_scan(
    gpu: &WgpuBackend,
    x: IvfScanInputs<'_, WgpuBuffer>,
    distances: V<'_>,
    labels: V<'_>,
) -> Result<()> {
    const OP: &str = "ivf_scan";
    let s = validate::ivf_scan(x, distances, labels)?;
    gpu.check_selection(OP, s.queries, s.k, s.members)?;
    if !gpu.info().kind.is_hardware_gpu() && s.probes > CAPPED_PROBES {
        return Err(unsupported(
            OP,
            format!(
                "{} probes a query: this CPU adapter stops shader loops after 65535 \
                 iterations, so its kernel takes at most {CAPPED_PROBES}",
                s.probes
            ),
        ));
    }
    // The table's workgroup array, sized in powers of two (few pipeline variants).
    let table = (s.bytes * s.codewords).next_power_of_two().max(256);
    let limit = gpu.0.limits.max_compute_workgroup_storage_size as usize;
    let shared = select_bytes(cap(s.k)) + table * 4;
    if shared > limit {
        return Err(unsupported(
            OP,
            format!(
                "tables of {} bytes x {} codewords with the selection take {} bytes of \
                 workgroup memory; this adapter offers {limit}",
                s.bytes, s.codewords, shared
            ),
        ));
    }
    if s.queries == 0 || s.k == 0 {
        return Ok(());
    }
    let list_tables = x.list_tables.unwrap_or(x.tables);
    let mut params = Params::default();
    for v in [
        x.tables,
        list_tables,
        x.probes,
        x.bases,
        x.offsets,
        x.codes,
        x.ids,
    ] {
        params = params.block(v.layout);
    }
    let params = params
        .scalar(0, s.probes as u32)
        .scalar(1, s.lists as u32)
        .scalar(2, s.members as u32)
        .scalar(3, s.bytes as u32)
        .scalar(4, s.codewords as u32)
        .scalar(5, s.words as u32)
        .scalar(6, s.k as u32)
        .scalar(7, x.list_tables.is_some() as u32)
        .scalar(8, fault_code(OP, FaultKind::Index { signed: false }))
        .scalar(9, offsets_fault_code(OP))
        .matrix(10, distances.layout)
        .matrix(13, labels.layout);
    let spec = spec("ivf_scan.wgsl", s.k).slot("table", format!("const TABLE: u32 = {table}u;"));
    let kernel = gpu.kernel(&spec)?;
    let buffers = [
        (x.tables.buffer, false),
        (list_tables.buffer, false),
        (x.probes.buffer, false),
        (x.bases.buffer, false),
        (x.offsets.buffer, false),
        (x.codes.buffer, false),
        (x.ids.buffer, false),
        (distances.buffer, true),
        (labels.buffer, true),
        (&gpu.0.faults, true),
    ];
    gpu.dispatch_groups(&kernel, &params, &buffers, gpu.row_groups(s.queries))?;
    gpu.faults_may_be_written();
    Ok(())
}

launch_params! {
    /// `candidate_scores.wgsl`'s scalars.
    pub(crate) struct CandidateLaunch {
        rows: u32,
        c: u32,
        d: u32,
        n: u32,
        alpha: f32,
        has_qb: u32,
        has_vb: u32,
        halves: u32,
        fault_code: u32,
    }
}

pub(crate) fn candidate_scores(
    gpu: &WgpuBackend,
    x: CandidateInputs<'_, WgpuBuffer>,
    alpha: f32,
    scores: V<'_>,
) -> Result<()> {
    const OP: &str = "candidate_scores";
    let s = validate::candidate_scores(x, scores)?;
    let pairs = s.queries * s.candidates;
    if pairs == 0 {
        return Ok(());
    }
    let groups = pairs.div_ceil(8);
    let max = gpu.0.limits.max_compute_workgroups_per_dimension as usize;
    if groups > max * max || pairs > u32::MAX as usize {
        return Err(unsupported(
            OP,
            format!(
                "{pairs} candidates: at most {} workgroups of eight",
                max * max
            ),
        ));
    }
    // Absent biases bind the queries in their place (never read: the flags are 0).
    let (qb, vb) = (
        x.query_bias.unwrap_or(x.queries),
        x.vector_bias.unwrap_or(x.queries),
    );
    let mut params = Params::default();
    for v in [x.queries, x.vectors, x.labels, qb, vb, scores] {
        params = params.block(v.layout);
    }
    let params = params.typed(&CandidateLaunch {
        rows: s.queries as u32,
        c: s.candidates as u32,
        d: s.d as u32,
        n: s.n as u32,
        alpha,
        has_qb: x.query_bias.is_some() as u32,
        has_vb: x.vector_bias.is_some() as u32,
        halves: (x.vectors.dtype() == DType::F16) as u32,
        fault_code: fault_code(OP, FaultKind::Index { signed: false }),
    });
    let kernel = gpu.kernel(&Spec::new("candidate_scores.wgsl"))?;
    let buffers = [
        (x.queries.buffer, false),
        (x.vectors.buffer, false),
        (x.labels.buffer, false),
        (qb.buffer, false),
        (vb.buffer, false),
        (scores.buffer, true),
        (&gpu.0.faults, true),
    ];
    gpu.dispatch_groups(&kernel, &params, &buffers, gpu.row_groups(groups))?;
    gpu.faults_may_be_written();
    Ok(())
}
