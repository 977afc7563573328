//! Segment sums.

use crate::CudaBuffer;
use crate::device::Args;
use crate::{CudaBackend, V, dtype_code};
use hal::fault::{fault_code, index_fault};
use hal::tuning::{SCAN_SEGMENTS_TIMES_ROWS, WHOLE_SEGMENT_ROWS};
use hal::{DType, Layout, Precision, Result, View, validate};
use std::sync::atomic::Ordering;

/// Rows per chunk of the segment sums' counting sort: one pass of `segment_place`'s 1,024
/// threads, whose warps take turns within a chunk (so long chunks serialise: chunks of 2,048
/// placed a product quantiser's 160,000 rows in 79 blocks of 64 turns each).
pub(crate) const PLACE_CHUNK: usize = 1024;

pub(crate) fn segment_sum(
    gpu: &CudaBackend,
    x: V<'_>,
    segment: V<'_>,
    weights: Option<V<'_>>,
    sums: V<'_>,
    counts: V<'_>,
) -> Result<()> {
    validate::segment_sum(x, segment, weights, sums, counts)?;
    gpu.dev.bind()?;
    let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
    if m == 0 {
        return Ok(());
    }
    // Runs of rows folded with Kahan compensation outside Precision::Reproducible
    // (cuda/reduce.cu says why); reproducible sums are one chain.
    let runs = (gpu.precision != Precision::Reproducible) as i32;
    // Few segments times few rows: each segment's block scans all the ids itself (one
    // launch, under either precision), checking them on the way. With runs its shared
    // memory also holds the compensations, so rows are narrower (static and dynamic
    // within 48 KiB).
    let widest = if runs == 1 { 2048 } else { 4096 };
    let wide = x.dtype() == DType::F64 || sums.dtype() == DType::F64;
    let scan = !wide && (m as u64) * (n as u64) <= SCAN_SEGMENTS_TIMES_ROWS && d < widest;
    let seg_rows = SegmentRows {
        x,
        weights,
        sums,
        counts,
    };
    if scan {
        let seg = gpu.contiguous(segment, DType::U32)?;
        gpu.dev.fault_pending.store(true, Ordering::Release);
        return gpu.dev.launch_shared(
            gpu.dev.function("segment_scan")?,
            (m as u32, 1, 1),
            1024,
            (d + 1) * 4 * (1 + runs as usize),
            seg_rows
                .outputs(
                    seg_rows
                        .rows(Args::new())
                        .arg(seg.ptr())
                        .arg(n as i64)
                        .arg(d as i64),
                    0,
                )
                .arg(runs)
                .arg(gpu.dev.fault.ptr)
                .arg(fault_code("segment_sum", index_fault(segment.dtype()))),
        );
    }
    let verdict = gpu.check_indices("segment_sum", segment, m)?;
    let seg = gpu.contiguous(segment, DType::U32)?;
    let (starts, order) = counting_sort(gpu, &seg, n, m, verdict.ptr())?;
    // The rows, their weights and their order: the leading parameters of both kernels.
    let rows_args = || {
        seg_rows
            .rows(Args::new())
            .arg(starts.ptr())
            .arg(order.ptr())
            .arg(d as i64)
    };
    if wide {
        // f64: each segment's rows in order, one chain of f64 fmas per column.
        return gpu.dev.launch_raw(
            gpu.dev.function("segment_ordered_wide")?,
            (m as u32, 1, 1),
            128,
            seg_rows.outputs(rows_args(), verdict.ptr()),
        );
    }
    // Segments of a few rows on average (the residual codes' 4,096 of about 40) are summed
    // whole, in order, by one block each: split into parts, most blocks would sum two or
    // three rows and the parts' two reductions would cost more than the sums.
    if gpu.precision != Precision::Reproducible && d < 32 && n <= m * WHOLE_SEGMENT_ROWS {
        // Narrow rows: a warp per segment, lanes over its rows.
        return gpu.dev.launch_raw(
            gpu.dev.function("segment_warp")?,
            (m.div_ceil(8) as u32, 1, 1),
            256,
            seg_rows.outputs(rows_args().arg(m as i64), verdict.ptr()),
        );
    }
    if gpu.precision == Precision::Reproducible || n <= m * WHOLE_SEGMENT_ROWS {
        return gpu.dev.launch_raw(
            gpu.dev.function("segment_ordered")?,
            (m as u32, 1, 1),
            128,
            seg_rows.outputs(rows_args(), verdict.ptr()).arg(runs),
        );
    }
    sum_in_parts(gpu, &seg_rows, rows_args(), &verdict)
}

/// What every segment kernel reads and writes: the rows and their weights lead its
/// parameters ([`SegmentRows::rows`]); the outputs and the index check's verdict close them
/// ([`SegmentRows::outputs`]).
struct SegmentRows<'a> {
    x: V<'a>,
    weights: Option<V<'a>>,
    sums: V<'a>,
    counts: V<'a>,
}

impl SegmentRows<'_> {
    fn rows(&self, a: Args) -> Args {
        let x = self.x;
        let (wptr, wdt, woff, ws, has_w) = match self.weights {
            Some(w) => (
                w.buffer.ptr(),
                dtype_code(w.dtype()),
                w.layout.offset as i64,
                w.layout.strides[0] as i64,
                1i32,
            ),
            None => (x.buffer.ptr(), 0, 0, 0, 0),
        };
        a.operand(x.buffer)
            .arg(x.layout.offset as i64)
            .arg(x.layout.strides[0] as i64)
            .arg(x.layout.strides[1] as i64)
            .arg(wptr)
            .arg(wdt)
            .arg(woff)
            .arg(ws)
            .arg(has_w)
    }

    /// `verdict`: the index check's verdict word (0: none, the scan checks the ids itself).
    fn outputs(&self, a: Args, verdict: u64) -> Args {
        let (sums, counts) = (self.sums, self.counts);
        a.operand(sums.buffer)
            .arg(sums.layout.offset as i64)
            .arg(sums.layout.strides[0] as i64)
            .arg(sums.layout.strides[1] as i64)
            .operand(counts.buffer)
            .arg(counts.layout.offset as i64)
            .arg(counts.layout.strides[0] as i64)
            .arg(verdict)
    }
}

/// A stable counting sort of `n` rows by their segment ids `seg` (chunks of rows count, then
/// place, in order): each segment's first position in the order (`m + 1` words) and the
/// order itself. Every launch stands down if the index check behind `verdict` failed.
fn counting_sort(
    gpu: &CudaBackend,
    seg: &CudaBuffer,
    n: usize,
    m: usize,
    verdict: u64,
) -> Result<(CudaBuffer, CudaBuffer)> {
    // Chunks of PLACE_CHUNK rows, as many as keep the per-chunk counts (chunks x m words)
    // within 16M words.
    let chunks = n.div_ceil(PLACE_CHUNK).clamp(1, ((1 << 24) / m).max(1));
    let chunk_len = n.div_ceil(chunks).max(1);
    let counts_u = gpu.scratch(DType::U32, chunks * m)?;
    gpu.dev.launch(
        "segment_histogram",
        n,
        Args::new()
            .arg(seg.ptr())
            .arg(n as i64)
            .arg(m as i64)
            .arg(chunk_len as i64)
            .arg(counts_u.ptr())
            .arg(verdict),
    )?;
    let totals = gpu.new_buffer(DType::U32, m)?;
    // A warp per segment.
    gpu.dev.launch_raw(
        gpu.dev.function("segment_chunk_prefix")?,
        (m.div_ceil(8) as u32, 1, 1),
        256,
        Args::new()
            .arg(counts_u.ptr())
            .arg(m as i64)
            .arg(chunks as i64)
            .arg(totals.ptr()),
    )?;
    let starts = gpu.new_buffer(DType::U32, m + 1)?;
    gpu.dev.launch_raw(
        gpu.dev.function("exclusive_scan_one_block")?,
        (1, 1, 1),
        1024,
        Args::new()
            .arg(totals.ptr())
            .arg(m as i64)
            .arg(starts.ptr()),
    )?;
    let order = gpu.new_buffer(DType::U32, n.max(1))?;
    if n > 0 {
        gpu.dev.launch_raw(
            gpu.dev.function("segment_place")?,
            (chunks as u32, 1, 1),
            1024,
            Args::new()
                .arg(seg.ptr())
                .arg(n as i64)
                .arg(m as i64)
                .arg(chunk_len as i64)
                .arg(starts.ptr())
                .arg(counts_u.ptr())
                .arg(order.ptr())
                .arg(verdict),
        )?;
    }
    Ok((starts, order))
}

/// Long segments: each segment's sorted rows summed in order in `PARTS` sub-ranges, then
/// the sub-ranges summed in order: the same result on every run. `rows_args`: the rows,
/// their weights and their order (the leading parameters of `segment_partial`).
fn sum_in_parts(
    gpu: &CudaBackend,
    seg_rows: &SegmentRows<'_>,
    rows_args: Args,
    verdict: &CudaBuffer,
) -> Result<()> {
    const PARTS: usize = 16;
    let (sums, counts) = (seg_rows.sums, seg_rows.counts);
    let (d, m) = (seg_rows.x.layout.shape[1], sums.layout.shape[0]);
    let partial = gpu.new_buffer(DType::F32, m * PARTS * (d + 1))?;
    gpu.dev.launch_raw(
        gpu.dev.function("segment_partial")?,
        (m as u32, PARTS as u32, 1),
        128,
        rows_args
            .arg(PARTS as i64)
            .arg(partial.ptr())
            .arg(verdict.ptr()),
    )?;
    // partial is [m, PARTS, d + 1]: sum over the parts into sums and counts.
    let all = Layout::contiguous(&[m, PARTS, d + 1]);
    let sums_src = all.narrow(2, 0, d)?.permute(&[0, 2, 1])?;
    let counts_src = all.narrow(2, d, 1)?.permute(&[0, 2, 1])?;
    let sums_out = sums.layout.unsqueeze(2)?;
    let counts_out = counts.layout.unsqueeze(1)?.unsqueeze(2)?;
    gpu.reduce_guarded(
        verdict,
        View::new(&partial, &sums_src),
        View::new(sums.buffer, &sums_out),
    )?;
    gpu.reduce_guarded(
        verdict,
        View::new(&partial, &counts_src),
        View::new(counts.buffer, &counts_out),
    )
}
