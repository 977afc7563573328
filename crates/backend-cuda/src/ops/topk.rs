//! Selection: top-k of rows and the inverted-list scan (`cuda/topk.cu`), a block per row;
//! candidate scores, a warp per candidate.

use crate::device::Args;
use crate::{CudaBackend, V};
use hal::fault::{FaultKind, fault_code, offsets_fault_code};
use hal::topk::check_gpu_k;
use hal::{CandidateInputs, DType, Error, IvfScanInputs, Result, validate};
use std::sync::atomic::Ordering;

/// Threads per block (topk.cu's `TK_BLOCK`).
const TK_BLOCK: u32 = 256;
/// The selection state's shared memory (topk.cu's `TkState`).
const TK_STATE_BYTES: usize = 2048 * 8 + 16;

/// The kernels take a row per block.
fn check_sizes(op: &'static str, rows: usize, k: usize) -> Result<()> {
    check_gpu_k(op, k, "CUDA")?;
    if rows > i32::MAX as usize {
        return Err(Error::Unsupported {
            op,
            detail: format!("{rows} rows: the CUDA kernels take at most 2^31 - 1"),
        });
    }
    Ok(())
}

/// The element address of a view's start, in bytes of 4-byte elements.
fn start(v: V<'_>) -> u64 {
    v.buffer.ptr() + v.layout.offset as u64 * 4
}

/// A rank-2 output's address and strides, as the kernels take them.
fn strided(a: Args, v: V<'_>) -> Args {
    a.arg(start(v))
        .arg(v.layout.strides[0] as i64)
        .arg(v.layout.strides[1] as i64)
}

pub(crate) fn top_k(
    gpu: &CudaBackend,
    x: V<'_>,
    values: V<'_>,
    indices: V<'_>,
    largest: bool,
) -> Result<()> {
    const OP: &str = "top_k";
    let (rows, n, k) = validate::top_k(x, values, indices)?;
    check_sizes(OP, rows, k)?;
    if rows == 0 || k == 0 {
        return Ok(());
    }
    gpu.dev.bind()?;
    // x's address, its row length, then its strides.
    let args = Args::new()
        .arg(start(x))
        .arg(n as i64)
        .arg(x.layout.strides[0] as i64)
        .arg(x.layout.strides[1] as i64)
        .arg(k as u32)
        .arg(if largest { u32::MAX } else { 0u32 });
    let args = strided(strided(args, values), indices);
    gpu.dev.launch_raw(
        gpu.dev.function("top_k_rows")?,
        (rows as u32, 1, 1),
        TK_BLOCK,
        args,
    )
}

pub(crate) fn ivf_scan(
    gpu: &CudaBackend,
    x: IvfScanInputs<'_, crate::CudaBuffer>,
    distances: V<'_>,
    labels: V<'_>,
) -> Result<()> {
    const OP: &str = "ivf_scan";
    let s = validate::ivf_scan(x, distances, labels)?;
    check_sizes(OP, s.queries, s.k)?;
    let shared = TK_STATE_BYTES + s.bytes * s.codewords * 4;
    if shared > gpu.dev.shared_optin {
        return Err(Error::Unsupported {
            op: OP,
            detail: format!(
                "tables of {} bytes x {} codewords take {shared} bytes of shared memory with \
                 the selection; this device offers {}",
                s.bytes, s.codewords, gpu.dev.shared_optin
            ),
        });
    }
    if s.queries == 0 || s.k == 0 {
        return Ok(());
    }
    gpu.dev.bind()?;
    let kernel = match s.words {
        1 => "ivf_scan_w1",
        2 => "ivf_scan_w2",
        4 => "ivf_scan_w4",
        8 => "ivf_scan_w8",
        _ => "ivf_scan_any",
    };
    let args = Args::new()
        .arg(start(x.tables))
        .arg(x.list_tables.map_or(0, start))
        .arg(start(x.probes))
        .arg(start(x.bases))
        .arg(start(x.offsets))
        .arg(start(x.codes))
        .arg(start(x.ids))
        .arg(s.probes as u32)
        .arg(s.lists as u32)
        .arg(s.members as u32)
        .arg(s.bytes as u32)
        .arg(s.codewords as u32)
        .arg(s.words as u32)
        .arg(s.k as u32);
    let args = strided(strided(args, distances), labels)
        .arg(fault_code(OP, FaultKind::Index { signed: false }))
        .arg(offsets_fault_code(OP))
        .arg(gpu.dev.fault.ptr);
    gpu.dev.fault_pending.store(true, Ordering::Release);
    gpu.dev.launch_shared(
        gpu.dev.function(kernel)?,
        (s.queries as u32, 1, 1),
        TK_BLOCK,
        shared,
        args,
    )
}

pub(crate) fn candidate_scores(
    gpu: &CudaBackend,
    x: CandidateInputs<'_, crate::CudaBuffer>,
    alpha: f32,
    scores: V<'_>,
) -> Result<()> {
    const OP: &str = "candidate_scores";
    let s = validate::candidate_scores(x, scores)?;
    let pairs = s.queries as u64 * s.candidates as u64;
    if pairs == 0 {
        return Ok(());
    }
    // Eight warps (pairs) a block.
    let blocks = pairs.div_ceil(8);
    if blocks > i32::MAX as u64 || s.queries > u32::MAX as usize {
        return Err(Error::Unsupported {
            op: OP,
            detail: format!("{pairs} candidates: the CUDA kernel takes at most 2^34"),
        });
    }
    gpu.dev.bind()?;
    let f16 = x.vectors.dtype() == DType::F16;
    let (kernel, vstart) = if f16 {
        let off = x.vectors.layout.offset as u64;
        // Two values a 4-byte load where every row starts on a 4-byte boundary.
        let pairs_ok = s.d % 2 == 0 && off % 2 == 0;
        (
            if pairs_ok {
                "candidate_scores_f16x2"
            } else {
                "candidate_scores_f16"
            },
            x.vectors.buffer.ptr() + off * 2,
        )
    } else {
        ("candidate_scores_f32", start(x.vectors))
    };
    let args = Args::new()
        .arg(start(x.queries))
        .arg(vstart)
        .arg(start(x.labels))
        .arg(x.query_bias.map_or(0, start))
        .arg(x.vector_bias.map_or(0, start))
        .arg(s.queries as u32)
        .arg(s.candidates as u32)
        .arg(s.d as u32)
        .arg(s.n as u32)
        .arg(alpha);
    let args = strided(args, scores)
        .arg(fault_code(OP, FaultKind::Index { signed: false }))
        .arg(gpu.dev.fault.ptr);
    gpu.dev.fault_pending.store(true, Ordering::Release);
    gpu.dev
        .launch_raw(gpu.dev.function(kernel)?, (blocks as u32, 1, 1), 256, args)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_state_size_matches_the_kernel() {
        // TkState: TK_CAP u64s, a u64 threshold, a u32 count and its padding word.
        assert_eq!(super::TK_STATE_BYTES, 2048 * 8 + 8 + 4 + 4);
        let ptx = include_str!("../../ptx/topk.ptx");
        assert!(ptx.contains(".entry top_k_rows"));
    }
}
