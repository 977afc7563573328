//! Nearest-centroid search and k-means++ seeding.

use crate::buffer::WgpuBuffer;
use crate::ops::LOOP_BUDGET;
use crate::ops::matmul::coop::RangeCheck;
use crate::ops::matmul::route::{TileShape, tile_shape};
use crate::pipeline::{Params, Spec};
use crate::wgsl::{Access, Entry};
use crate::{V, WgpuBackend, coop, wgsl};
use hal::tuning::FEW_CENTROIDS;
use hal::{Backend, DType, Layout, Precision, Result, View, validate};

/// The parameters the nearest-centroid kernels take for the slice of centroids `first..end`
/// (see nearest_centroid.wgsl, nearest_ordered.wgsl and nearest_short.wgsl), `fused` saying
/// whether `fma()` is fused. Rank-3 views (a batch) give the first group's matrices and the
/// group strides (scalars 13 and 14); the outputs are passed whole.
pub(crate) fn nearest_slice_params(
    [x, c, out_index, out_distance]: [View<'_, WgpuBuffer>; 4],
    first: usize,
    end: usize,
    fused: bool,
) -> Result<Params> {
    let batched = x.layout.rank() == 3;
    let (xl, cl) = match batched {
        true => (x.layout.select(0, 0)?, c.layout.select(0, 0)?),
        false => (x.layout.clone(), c.layout.clone()),
    };
    let group_stride = |l: &Layout| {
        if batched {
            l.strides[0] as i32 as u32
        } else {
            0
        }
    };
    Ok(Params::default()
        .block(out_index.layout)
        .block(out_distance.layout)
        .scalar(0, xl.shape[0] as u32)
        .scalar(1, end as u32)
        .scalar(2, xl.shape[1] as u32)
        .matrix(3, &xl)
        .matrix(6, &cl)
        .scalar(9, first as u32)
        .scalar(10, (first > 0) as u32)
        .scalar(11, fused as u32)
        .scalar(13, group_stride(x.layout))
        .scalar(14, group_stride(c.layout)))
}

pub(crate) fn kmeans_pp(gpu: &WgpuBackend, x: V<'_>, anchors: V<'_>, seed: u64) -> Result<()> {
    let [n, d, m] = validate::kmeans_pp(x, anchors)?;
    // A group of lanes per point (about 16 coordinates a lane), so many points a
    // workgroup.
    let lanes = hal::seeding::lanes_per_point(d);
    let groups = n.div_ceil(256 / lanes);
    let fits = (m as u64) * (n as u64) < 1 << 32
        && groups <= gpu.0.limits.max_compute_workgroups_per_dimension as usize;
    // The reproducible precision keeps the reference's distance order (hal's steps).
    if gpu.1 == Precision::Reproducible || m == 0 || !fits {
        return hal::seeding::kmeans_pp_steps(gpu, x, anchors, seed);
    }
    let d2 = gpu.scratch(DType::F32, n)?;
    let winners = gpu.scratch(DType::U32, m)?;
    let step = gpu.alloc(DType::U32, 1)?;
    let best_key = gpu.scratch(DType::F32, groups)?;
    let best_at = gpu.scratch(DType::U32, groups)?;
    let keys = gpu.prepare(
        &Spec::new("kmeans_pp_keys.wgsl"),
        &Params::default()
            .scalar(0, n as u32)
            .scalar(1, d as u32)
            .scalar(2, lanes as u32)
            .scalar(3, seed as u32)
            .scalar(4, (seed >> 32) as u32),
        &[
            (x.buffer, false),
            (&d2, true),
            (&winners, false),
            (&step, false),
            (&best_key, true),
            (&best_at, true),
        ],
        [groups as u32, 1, 1],
    )?;
    let pick = gpu.prepare(
        &Spec::new("kmeans_pp_pick.wgsl"),
        &Params::default().scalar(0, groups as u32),
        &[
            (&best_key, false),
            (&best_at, false),
            (&winners, true),
            (&step, true),
        ],
        [1, 1, 1],
    )?;
    let (Some(keys), Some(pick)) = (keys, pick) else {
        // (No immediates on this device: every dispatch would need its own submission.)
        return hal::seeding::kmeans_pp_steps(gpu, x, anchors, seed);
    };
    // Every step's two dispatches encoded from the same bind groups (the step number is
    // on the device), then the winners' rows gathered.
    gpu.encode_repeated(&[keys, pick], m)?;
    let rows = Layout::strided(&[m, d], &[1, 0], 0)?;
    gpu.gather(x, 0, View::new(&winners, &rows), anchors)
}

pub(crate) fn nearest_centroid(
    gpu: &WgpuBackend,
    x: V<'_>,
    c: V<'_>,
    out_index: V<'_>,
    out_distance: V<'_>,
) -> Result<()> {
    validate::nearest_centroid(x, c, out_index, out_distance)?;
    if x.layout.rank() == 3 {
        // A batch (the codebooks of a product quantiser): one light pass over all groups,
        // short rows with the centroids in workgroup memory.
        let (g, n, d) = (x.layout.shape[0], x.layout.shape[1], x.layout.shape[2]);
        let m = c.layout.shape[1];
        let max = gpu.0.limits.max_compute_workgroups_per_dimension as usize;
        // Rows of up to 16 or 32 values; an invocation's distance terms (m x the row width)
        // within the loop budget.
        let width = if d <= 16 { 16 } else { 32 };
        if d <= 32 && m * width <= LOOP_BUDGET && n.div_ceil(256) <= max && g <= max {
            return gpu.nearest_short([x, c, out_index, out_distance], width);
        }
        return gpu.nearest_ordered(x, c, out_index, out_distance);
    }
    let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], c.layout.shape[0]);
    if n == 0 {
        return Ok(());
    }
    // The reference's order, one light pass: under Precision::Reproducible, and for a few
    // centroids under any precision, where the tiled paths would spend their set-up on a
    // handful (k-means++ asks for one at a time).
    if gpu.1 == Precision::Reproducible || m < FEW_CENTROIDS {
        return gpu.nearest_ordered(x, c, out_index, out_distance);
    }
    if gpu.1 == Precision::Fast && gpu.nearest_coop([x, c, out_index, out_distance])? {
        return Ok(());
    }
    // One fused pass (nearest_centroid.wgsl): no n x m distance matrix. The centroids are
    // swept in slices that keep each invocation's loops short (lavapipe stops loops after
    // 65535 iterations; each 64-centroid tile costs about 30 iterations per 16 of d).
    let tiles_per_slice = (1000 / d.div_ceil(16).max(1)).max(1);
    let tile = TileShape {
        rows: 128,
        cols: tile_shape().cols,
    };
    let slice = tiles_per_slice * tile.cols;
    let dts = [x.dtype(), c.dtype()];
    let (name, text) = tile.slot();
    let pipeline = gpu.kernel(
        &Spec::new("nearest_centroid.wgsl")
            .bindings(vec![
                (dts[0], Access::Read),
                (dts[1], Access::Read),
                (DType::U32, Access::Write),
                (DType::F32, Access::Write),
            ])
            .slot(name, text),
    )?;
    // The centroids' squared norms, once per call.
    let norms = gpu.centroid_norms(c, m)?;
    let fused = gpu.fma_is_fused()?;
    let blocks = n.div_ceil(tile.rows);
    let groups = gpu.row_groups(blocks);
    let mut first = 0;
    while first < m {
        let end = (first + slice).min(m);
        let p = nearest_slice_params([x, c, out_index, out_distance], first, end, fused)?;
        gpu.dispatch_groups(
            &pipeline,
            &p,
            &[
                (x.buffer, false),
                (c.buffer, false),
                (out_index.buffer, true),
                (out_distance.buffer, true),
                (&norms, false),
            ],
            groups,
        )?;
        first = end;
    }
    Ok(())
}

impl WgpuBackend {
    /// The squared norm of each centroid (row_norms.wgsl) in a new f32 buffer of `len >= m`
    /// entries, those past `m` +inf (padding that no search picks).
    pub(crate) fn centroid_norms(&self, c: V<'_>, len: usize) -> Result<WgpuBuffer> {
        let (m, d) = (c.layout.shape[0], c.layout.shape[1]);
        let norms = self.scratch(DType::F32, len)?;
        self.run(
            Spec::new("row_norms.wgsl").bindings(wgsl::io(&[c.dtype()], DType::F32)),
            Params::default().scalar(0, d as u32).matrix(1, c.layout),
            &[(c.buffer, false), (&norms, true)],
            m,
        )?;
        if len > m {
            let tail = Layout {
                shape: vec![len - m],
                strides: vec![1],
                offset: m,
            };
            self.fill(View::new(&norms, &tail), f64::INFINITY)?;
        }
        Ok(norms)
    }

    /// `nearest_centroid` under [`Precision::Fast`] on cooperative matrices: candidates
    /// ranked with f16 operands (nearest_coop.wgsl), then compared in f32
    /// (nearest_recheck_subgroups.wgsl). A coordinate beyond f16's range fails the packing's range
    /// check, and the re-check then searches every centroid in f32. `false`: not taken (no
    /// cooperative matrices, or operands too large to pack).
    pub(crate) fn nearest_coop(&self, [x, c, out_index, out_distance]: [V<'_>; 4]) -> Result<bool> {
        if self.0.coop.is_none() {
            return Ok(false);
        }
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], c.layout.shape[0]);
        let tiles = coop::NEAREST_TILES;
        let np = n.next_multiple_of(tiles.rows());
        let mp = m.next_multiple_of(tiles.cols());
        let kp = d.next_multiple_of(coop::STEP_K);
        if !self.coop_fits(np * kp) || !self.coop_fits(kp * mp) {
            return Ok(false);
        }
        let guard = self.next_guard();
        let check = RangeCheck::F16Range;
        let xv = validate::MatrixView::of(x.layout);
        let px = self.coop_operand(x, &xv, [np, kp], false, check, Some(guard))?;
        // The centroids transposed ([d, m]): the right-hand operand of x c^T.
        let ct = Layout {
            shape: vec![d, m],
            strides: vec![c.layout.strides[1], c.layout.strides[0]],
            offset: c.layout.offset,
        };
        let cv = validate::MatrixView::of(&ct);
        let pc = self.coop_operand(
            View::new(c.buffer, &ct),
            &cv,
            [kp, mp],
            false,
            check,
            Some(guard),
        )?;
        // Padding centroids score +inf: never a candidate.
        let norms = self.centroid_norms(c, mp)?;
        let candidates = self.scratch(DType::U32, 2 * np)?;
        let kernel = self.kernel(&Spec {
            file: "nearest_coop.wgsl",
            bindings: None,
            slots: coop::nearest_slots(),
            entry: Entry::Strided,
        })?;
        let p = Params::default()
            .scalar(0, kp as u32)
            .scalar(1, px.row_stride as u32)
            .scalar(2, pc.row_stride as u32)
            .scalar(3, m as u32)
            .scalar(4, (mp / tiles.cols()) as u32)
            .scalar(5, n as u32)
            .scalar(10, guard.word)
            .scalar(11, guard.serial)
            .scalar(12, px.offset as u32)
            .scalar(13, pc.offset as u32);
        let blocks = np / tiles.rows();
        self.dispatch_groups(
            &kernel,
            &p,
            &[
                (&px.buffer, false),
                (&pc.buffer, false),
                (&norms, false),
                (&candidates, true),
                (&self.0.verdicts, false),
            ],
            self.row_groups(blocks),
        )?;
        let p = Params::default()
            .block(out_index.layout)
            .block(out_distance.layout)
            .scalar(0, n as u32)
            .scalar(1, m as u32)
            .scalar(2, d as u32)
            .matrix(3, x.layout)
            .matrix(6, c.layout)
            .scalar(10, guard.word)
            .scalar(11, guard.serial);
        let bindings = vec![
            (x.dtype(), Access::Read),
            (c.dtype(), Access::Read),
            (DType::U32, Access::Read),
            (DType::U32, Access::Write),
            (DType::F32, Access::Write),
            (DType::U32, Access::Read),
        ];
        self.run(
            Spec::new("nearest_recheck_subgroups.wgsl").bindings(bindings),
            p,
            &[
                (x.buffer, false),
                (c.buffer, false),
                (&candidates, false),
                (out_index.buffer, true),
                (out_distance.buffer, true),
                (&self.0.verdicts, false),
            ],
            32 * n,
        )?;
        Ok(true)
    }

    /// `nearest_centroid` under [`Precision::Reproducible`] (nearest_ordered.wgsl): the CPU
    /// reference's order of operations, one thread per point, centroids in slices short
    /// enough for lavapipe's loop limit.
    pub(crate) fn nearest_ordered(
        &self,
        x: View<'_, WgpuBuffer>,
        c: View<'_, WgpuBuffer>,
        out_index: View<'_, WgpuBuffer>,
        out_distance: View<'_, WgpuBuffer>,
    ) -> Result<()> {
        // Rank 2, or rank 3 with a leading group axis (see nearest_ordered.wgsl).
        let r = x.layout.rank();
        let groups = hal::numel(&x.layout.shape[..r - 2]);
        let (n, d, m) = (
            x.layout.shape[r - 2],
            x.layout.shape[r - 1],
            c.layout.shape[r - 2],
        );
        if groups * n == 0 {
            return Ok(());
        }
        let fused = self.fma_is_fused()?;
        let slice = (LOOP_BUDGET / d.max(1)).max(1);
        let spec = Spec::new("nearest_ordered.wgsl").bindings(vec![
            (x.dtype(), Access::Read),
            (c.dtype(), Access::Read),
            (DType::U32, Access::Write),
            (DType::F32, Access::Write),
        ]);
        let mut first = 0;
        while first < m {
            let end = (first + slice).min(m);
            let p = nearest_slice_params([x, c, out_index, out_distance], first, end, fused)?;
            self.run(
                spec.clone(),
                p,
                &[
                    (x.buffer, false),
                    (c.buffer, false),
                    (out_index.buffer, true),
                    (out_distance.buffer, true),
                ],
                groups * n,
            )?;
            first = end;
        }
        Ok(())
    }

    /// A batch of searches among short rows (rank-3 views, rows of at most `width` values:
    /// 16, or 32 with tiles of 128 centroids instead of 256, 4,096 values of workgroup memory
    /// either way; see nearest_short.wgsl): a workgroup per 256 points of a group.
    pub(crate) fn nearest_short(
        &self,
        [x, c, out_index, out_distance]: [View<'_, WgpuBuffer>; 4],
        width: usize,
    ) -> Result<()> {
        let (g, n, m) = (x.layout.shape[0], x.layout.shape[1], c.layout.shape[1]);
        if g * n == 0 {
            return Ok(());
        }
        let mut spec = Spec::new("nearest_short.wgsl").bindings(vec![
            (x.dtype(), Access::Read),
            (c.dtype(), Access::Read),
            (DType::U32, Access::Write),
            (DType::F32, Access::Write),
        ]);
        if width > 16 {
            let (name, text) = wgsl::nearest_short_wide_slot();
            spec = spec.slot(name, text);
        }
        let pipeline = self.kernel(&spec)?;
        let fused = self.fma_is_fused()?;
        let p = nearest_slice_params([x, c, out_index, out_distance], 0, m, fused)?;
        self.dispatch_groups(
            &pipeline,
            &p,
            &[
                (x.buffer, false),
                (c.buffer, false),
                (out_index.buffer, true),
                (out_distance.buffer, true),
            ],
            [n.div_ceil(256) as u32, g as u32, 1],
        )
    }
}
