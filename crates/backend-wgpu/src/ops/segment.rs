//! Segment sums: scanned, sorted and in a fixed order.

use crate::buffer::WgpuBuffer;
use crate::fault::Guard;
use crate::ops::LOOP_BUDGET;
use crate::ops::reduce::SUM_CHUNK;
use crate::pipeline::{Params, Spec};
use crate::wgsl::Access;
use crate::{V, WgpuBackend, wgsl};
use hal::tuning::{SCAN_SEGMENTS_TIMES_ROWS, WHOLE_SEGMENT_ROWS};
use hal::{Backend, DType, DeviceBuffer, Layout, Precision, ReduceOp, Result, View, validate};

/// From this many segments on, `segment_sum` sorts rows by segment first (O(n d) work)
/// instead of having every (chunk, segment, column) thread scan its chunk (O(n m d)).
pub(crate) const SORTED_SEGMENTS: usize = 128;

/// What the segment-sum kernels bind as weights: the weights and their layout, or, without
/// weights, `x` itself under a broadcast layout, which the kernels are told (a scalar slot)
/// not to read: no per-call buffer of ones.
pub(crate) fn weight_binding<'a>(
    x: View<'a, WgpuBuffer>,
    weights: Option<View<'a, WgpuBuffer>>,
) -> Result<(&'a WgpuBuffer, Layout)> {
    Ok(match weights {
        Some(w) => (w.buffer, w.layout.clone()),
        None => (
            x.buffer,
            Layout::contiguous(&[1]).broadcast_to(&[x.layout.shape[0]])?,
        ),
    })
}

pub(crate) fn segment_sum(
    gpu: &WgpuBackend,
    x: V<'_>,
    segment: V<'_>,
    weights: Option<V<'_>>,
    sums: V<'_>,
    counts: V<'_>,
) -> Result<()> {
    validate::segment_sum(x, segment, weights, sums, counts)?;
    let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
    // Small sums take the scan under either precision (in the reproducible order, or in
    // compensated runs of rows outside Precision::Reproducible).
    let ordered = gpu.1 == Precision::Reproducible || gpu.scan_fits(n, m, d);
    if ordered {
        // Probed (once per device, with a read-back) before the index check is enqueued,
        // whose fault must surface at the caller's synchronize, not at the probe's.
        gpu.fma_is_fused()?;
    }
    let guard = gpu.check_indices("segment_sum", segment, m)?;
    if ordered {
        return gpu.segment_sum_ordered(x, segment, weights, sums, counts, guard);
    }
    if m >= SORTED_SEGMENTS {
        return gpu.segment_sum_sorted(x, segment, weights, sums, counts, guard);
    }
    // One thread per (row chunk, segment, column) plus one per (row chunk, segment) for
    // the count, each summing its rows in order with Kahan compensation; then the chunks'
    // partials are summed by the reduction. Deterministic, no atomics; O(n m d) work, the
    // straightforward version, correct before fast.
    let (w, wl) = weight_binding(x, weights)?;
    let chunks = n.div_ceil(SUM_CHUNK).max(1);
    let width = m * (d + 1);
    let partial = gpu.scratch(DType::F32, chunks * width)?;
    let p = Params::default()
        .block(segment.layout)
        .block(&wl)
        .scalar(0, n as u32)
        .scalar(1, d as u32)
        .scalar(2, m as u32)
        .matrix(3, x.layout)
        .scalar(6, SUM_CHUNK as u32)
        .scalar(7, weights.is_some() as u32);
    // Partial layout: [chunk, segment, column 0..d (sums) and d (count)].
    let dts = [x.dtype(), w.dtype()];
    gpu.run(
        Spec::new("segment_sum.wgsl").bindings(wgsl::io(&[dts[0], DType::U32, dts[1]], DType::F32)),
        p,
        &[
            (x.buffer, false),
            (segment.buffer, false),
            (w, false),
            (&partial, true),
        ],
        chunks * width,
    )?;
    // Sum the chunks: sums[s, k] = sum_c partial[c, s, k]; counts[s] = sum_c partial[c, s, d].
    let parts_last = Layout::contiguous(&[chunks, m, d + 1]).permute(&[1, 2, 0])?;
    gpu.sum_segment_partials(&partial, &parts_last, sums, counts, guard)
}

impl WgpuBackend {
    /// Sums per-part partial results into `sums` and `counts`: `partials` is seen as
    /// `[m, d + 1, parts]` (columns `0..d` the sums, column `d` the weight total), and the
    /// parts are reduced, honouring the index check's `guard`.
    pub(crate) fn sum_segment_partials(
        &self,
        partial: &WgpuBuffer,
        parts_last: &Layout,
        sums: View<'_, WgpuBuffer>,
        counts: View<'_, WgpuBuffer>,
        guard: Guard,
    ) -> Result<()> {
        let d = parts_last.shape[1] - 1;
        let sums_src = parts_last.narrow(1, 0, d)?;
        let counts_src = parts_last.narrow(1, d, 1)?;
        let sums_out = sums.layout.unsqueeze(2)?;
        let counts_out = counts.layout.unsqueeze(1)?.unsqueeze(2)?;
        self.reduce_chunked(
            ReduceOp::Sum,
            View::new(partial, &sums_src),
            &[2],
            View::new(sums.buffer, &sums_out),
            1.0,
            Some(guard),
        )?;
        self.reduce_chunked(
            ReduceOp::Sum,
            View::new(partial, &counts_src),
            &[2],
            View::new(counts.buffer, &counts_out),
            1.0,
            Some(guard),
        )
    }

    /// `segment_sum` for many segments: a stable counting sort of the rows by segment
    /// (segment_count, segment_offsets, segment_starts, segment_place .wgsl), then each
    /// segment's rows summed in order in parts (segment_gather.wgsl) and the parts
    /// summed by the reduction. Deterministic, no atomics, O(n d + chunks m) work.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn segment_sum_sorted(
        &self,
        x: View<'_, WgpuBuffer>,
        segment: View<'_, WgpuBuffer>,
        weights: Option<View<'_, WgpuBuffer>>,
        sums: View<'_, WgpuBuffer>,
        counts: View<'_, WgpuBuffer>,
        guard: Guard,
    ) -> Result<()> {
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
        // Each segment's rows are summed in parts: several for long segments (a GPU gets
        // enough threads from 16); segments of a few rows on average (the residual codes'
        // 4,096 of about 40) whole, where parts of two or three rows and the reduction over
        // them would cost more than the sums. On a software rasteriser a part must also keep
        // one thread's loop under lavapipe's cap even if every row falls in one segment.
        let capped = !self.info().kind.is_hardware_gpu();
        let parts_needed = if capped { n.div_ceil(LOOP_BUDGET) } else { 1 };
        let parts = if n <= m * WHOLE_SEGMENT_ROWS {
            parts_needed
        } else {
            parts_needed.max(16)
        };
        // Chunks of at least 2,048 rows (eight tiles of segment_place's workgroup), at most
        // LOOP_BUDGET of them (the offsets pass loops over chunks), and few enough that the
        // per-chunk counts (chunks x m words) stay within 16M words.
        let rows = 2048
            .max(n.div_ceil(LOOP_BUDGET))
            .max(((n as u64 * m as u64) >> 24) as usize + 1);
        let chunks = n.div_ceil(rows).max(1);
        let u32s = |len: usize| self.scratch(DType::U32, len);
        let per_chunk = u32s(chunks * m)?;
        self.fill(
            View::new(&per_chunk, &Layout::contiguous(&[chunks * m])),
            0.0,
        )?;
        let sorting = Params::default()
            .block(segment.layout)
            .scalar(0, n as u32)
            .scalar(1, m as u32)
            .scalar(2, rows as u32)
            .scalar(3, chunks as u32);
        self.run_guarded(
            Spec::new("segment_count.wgsl"),
            sorting.clone(),
            &[(segment.buffer, false), (&per_chunk, true)],
            n,
            Some(guard),
        )?;
        let totals = u32s(m)?;
        let u = DType::U32;
        self.run(
            Spec::new("segment_offsets.wgsl")
                .bindings(vec![(u, Access::Write), (u, Access::Write)]),
            sorting.clone(),
            &[(&per_chunk, true), (&totals, true)],
            m,
        )?;
        let starts = u32s(m)?;
        self.dispatch_groups(
            &self.kernel(&Spec::new("segment_starts.wgsl"))?,
            &sorting,
            &[(&totals, false), (&starts, true)],
            [1, 1, 1],
        )?;
        let order = u32s(n.max(1))?;
        let (place, params, buffers) = self.guarded(
            Spec::new("segment_place.wgsl"),
            sorting,
            &[
                (segment.buffer, false),
                (&starts, false),
                (&per_chunk, true),
                (&order, true),
            ],
            guard,
        );
        self.dispatch_groups(
            &self.kernel(&place)?,
            &params,
            &buffers,
            [chunks as u32, 1, 1],
        )?;
        let (w, wl) = weight_binding(x, weights)?;
        let partial = self.scratch(DType::F32, m * parts * (d + 1))?;
        self.run(
            Spec::new("segment_gather.wgsl").bindings(vec![
                (x.dtype(), Access::Read),
                (w.dtype(), Access::Read),
                (u, Access::Read),
                (u, Access::Read),
                (u, Access::Read),
                (DType::F32, Access::Write),
            ]),
            Params::default()
                .block(&wl)
                .scalar(1, d as u32)
                .matrix(3, x.layout)
                .scalar(6, parts as u32)
                .scalar(7, weights.is_some() as u32),
            &[
                (x.buffer, false),
                (w, false),
                (&starts, false),
                (&totals, false),
                (&order, false),
                (&partial, true),
            ],
            m * parts * (d + 1),
        )?;
        let parts_last = Layout::contiguous(&[m, parts, d + 1]).permute(&[0, 2, 1])?;
        self.sum_segment_partials(&partial, &parts_last, sums, counts, guard)
    }

    /// Whether segment_scan.wgsl takes a segment sum: segments times rows within
    /// [`SCAN_SEGMENTS_TIMES_ROWS`], and, since its per-thread loops run over all of a
    /// segment's rows, on a software rasteriser (loops capped) only within the loop budget.
    pub(crate) fn scan_fits(&self, n: usize, m: usize, d: usize) -> bool {
        let capped = !self.info().kind.is_hardware_gpu();
        (m as u64) * (n as u64) <= SCAN_SEGMENTS_TIMES_ROWS
            && d < 1024
            && (!capped || n <= LOOP_BUDGET)
    }

    /// `segment_sum` in the reproducible order (each segment's rows ascending, a correctly
    /// rounded fused multiply-add per term) into `[m, d + 1]` accumulators, then copied into
    /// `sums` and `counts` by the pass that honours the index check's guard (a sum over an
    /// axis of length 1, exact). Small sums in one dispatch (segment_scan.wgsl: a workgroup
    /// per segment scans every id for its rows; outside Precision::Reproducible it adds in
    /// compensated runs instead, for accuracy on long segments), and on a software
    /// rasteriser every sum that way in row ranges short enough for its loop cap; otherwise
    /// segment_sum_ordered.wgsl, one thread per (segment, column).
    pub(crate) fn segment_sum_ordered(
        &self,
        x: View<'_, WgpuBuffer>,
        segment: View<'_, WgpuBuffer>,
        weights: Option<View<'_, WgpuBuffer>>,
        sums: View<'_, WgpuBuffer>,
        counts: View<'_, WgpuBuffer>,
        guard: Guard,
    ) -> Result<()> {
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
        let (w, wl) = weight_binding(x, weights)?;
        let fused = self.fma_is_fused()?;
        let acc = self.scratch(DType::F32, m * (d + 1))?;
        let bindings = wgsl::io(&[x.dtype(), DType::U32, w.dtype()], DType::F32);
        let buffers = [
            (x.buffer, false),
            (segment.buffer, false),
            (w, false),
            (&acc, true),
        ];
        let params = Params::default()
            .block(segment.layout)
            .block(&wl)
            .scalar(1, d as u32)
            .matrix(3, x.layout)
            .scalar(7, weights.is_some() as u32)
            .scalar(11, fused as u32);
        // Both kernels take rows [scalar 8, scalar 0) a dispatch, continuing (scalar 9) from
        // the accumulators the previous range left: ranges within a software rasteriser's
        // loop cap where the kernel loops over them.
        let capped = !self.info().kind.is_hardware_gpu();
        let ranges = |range: usize| {
            (0..n.max(1))
                .step_by(range)
                .map(move |first| (first, (first + range).min(n)))
        };
        let range_params = |(first, end): (usize, usize)| {
            params
                .clone()
                .scalar(0, end as u32)
                .scalar(8, first as u32)
                .scalar(9, (first > 0) as u32)
        };
        if self.scan_fits(n, m, d) || (capped && d < 1024) {
            // Whole, or on a software rasteriser every sum in ranges: there a workgroup per
            // segment reading every id (m n reads) beats a thread per segment and column
            // testing every id (m (d + 1) n): vlc's exact product-quantiser training (24,000
            // rows, 2,048 segments, d = 7) took 7.5 s a range on lavapipe the other way.
            let pipeline = self.kernel(&Spec::new("segment_scan.wgsl").bindings(bindings))?;
            let runs = (self.1 != Precision::Reproducible) as u32;
            for range in ranges(if capped { LOOP_BUDGET } else { n.max(1) }) {
                let p = range_params(range).scalar(2, m as u32).scalar(13, runs);
                self.dispatch_groups(&pipeline, &p, &buffers, self.row_groups(m))?;
            }
        } else {
            let spec = Spec::new("segment_sum_ordered.wgsl").bindings(bindings);
            for range in ranges(LOOP_BUDGET) {
                self.run(spec.clone(), range_params(range), &buffers, m * (d + 1))?;
            }
        }
        let parts_last = Layout::contiguous(&[m, d + 1, 1]);
        self.sum_segment_partials(&acc, &parts_last, sums, counts, guard)
    }
}
