//! Nearest-centroid search and k-means++ seeding.

use crate::buffer::CudaBuffer;
use crate::device::Args;
use crate::{CudaBackend, V, device};
use hal::tuning::FEW_CENTROIDS;
use hal::{Backend, DType, Layout, Precision, Result, View, validate};

/// The longest d for which the held nearest-centroid kernels (`nearest_f16_held`,
/// `nearest_f16x3_held`) keep a block's points in shared memory (cluster.cu's `HOLD_D`).
pub(crate) const NEAREST_HOLD_D: usize = 128;

/// Threads per block of `kmeans_pp_race` (reduce.cu's `KPP_BLOCK`).
pub(crate) const KPP_BLOCK: u32 = 256;

/// Which nearest-centroid kernel runs, and what it needs.
pub(crate) struct NearestPlan {
    pub(crate) kernel: &'static str,
    /// f16 planes of each packed operand (2: high parts and remainders), 0 for unpacked.
    pub(crate) planes: usize,
    /// The points are packed too (the streamed kernels).
    pub(crate) streamed: bool,
    /// Dynamic shared memory, bytes.
    pub(crate) shared: usize,
}

impl NearestPlan {
    /// `tensor_cores`: rows contiguous and aligned, d % 4 == 0; `dp`: d rounded up to 32;
    /// `optin`: the most shared memory a block may have.
    pub(crate) fn choose(
        tensor_cores: bool,
        precision: Precision,
        d: usize,
        dp: usize,
        optin: usize,
    ) -> NearestPlan {
        // The static shared memory of these kernels (candidates, norms) comes on top.
        let fits = |bytes: usize| bytes + (5 << 10) <= optin;
        // cluster.cu: held, (1 + split) x (points + two centroid tiles) of 128 rows of dp + 8
        // halves; streamed, STAGES x (1 + split) x 2 slices of 128 rows of SK + 8 = 40 halves.
        let held = |planes: usize| planes * 3 * 128 * (dp + 8) * 2;
        let streamed = |planes: usize, stages: usize| stages * planes * 2 * 128 * 40 * 2;
        let plan = |kernel, planes, streamed, shared| NearestPlan {
            kernel,
            planes,
            streamed,
            shared,
        };
        let fast = precision == Precision::Fast;
        let planes = if fast { 1 } else { 2 };
        if !tensor_cores {
            return plan("nearest_exact", 0, false, 0);
        }
        if d <= NEAREST_HOLD_D && fits(held(planes)) {
            let kernel = if fast {
                "nearest_f16_held"
            } else {
                "nearest_f16x3_held"
            };
            return plan(kernel, planes, false, held(planes));
        }
        let stages = if fast { 4 } else { 3 };
        if fits(streamed(planes, stages)) {
            let kernel = if fast {
                "nearest_f16_stream"
            } else {
                "nearest_f16x3_stream"
            };
            return plan(kernel, planes, true, streamed(planes, stages));
        }
        if fast {
            plan("nearest_f16", 0, false, 0)
        } else {
            plan("nearest_3xtf32", 0, false, 0)
        }
    }
}

pub(crate) fn nearest_centroid(
    gpu: &CudaBackend,
    x: V<'_>,
    centroids: V<'_>,
    out_index: V<'_>,
    out_distance: V<'_>,
) -> Result<()> {
    validate::nearest_centroid(x, centroids, out_index, out_distance)?;
    gpu.dev.bind()?;
    if x.layout.rank() == 3 {
        return gpu.nearest_batched([x, centroids, out_index, out_distance]);
    }
    if gpu.precision == Precision::Reproducible {
        // The reference's order: a batch of one.
        let views = [x, centroids, out_index, out_distance];
        let one: Vec<Layout> = views
            .iter()
            .map(|v| v.layout.unsqueeze(0))
            .collect::<Result<_>>()?;
        return gpu.nearest_batched(std::array::from_fn(|i| View::new(views[i].buffer, &one[i])));
    }
    let (n, d, m) = (
        x.layout.shape[0],
        x.layout.shape[1],
        centroids.layout.shape[0],
    );
    if n == 0 {
        return Ok(());
    }
    // The kernels read f32; other float dtypes are converted once.
    let (xb, xl) = gpu.as_f32(x)?;
    let (cb, cl) = gpu.as_f32(centroids)?;
    // A matrix's parameters as the kernels take them: start, rows, d, row and column
    // strides (nearest_* pass the points' and the centroids' in turn, then d once).
    let rows = |a: Args, b: &CudaBuffer, l: &Layout, count: usize| {
        a.arg(b.ptr() + l.offset as u64 * 4)
            .arg(count as i64)
            .arg(l.strides[0] as i64)
            .arg(l.strides[1] as i64)
    };
    let both = || rows(rows(Args::new(), &xb, &xl, n), &cb, &cl, m).arg(d as i64);
    let outputs = |a: Args| {
        a.arg(out_index.buffer.ptr())
            .arg(out_index.layout.offset as i64)
            .arg(out_index.layout.strides[0] as i64)
            .arg(out_distance.buffer.ptr())
            .arg(out_distance.layout.offset as i64)
            .arg(out_distance.layout.strides[0] as i64)
    };
    // A few centroids take one light pass, a warp per point, where the GEMM-style paths
    // would spend their set-up (norms, scaling, packing, a tile of 128 centroids) on a
    // handful.
    if m < FEW_CENTROIDS {
        return gpu.dev.launch("nearest_few", n * 32, outputs(both()));
    }
    // Tensor cores where the rows are contiguous and 16-byte aligned: f16 under
    // Precision::Fast (operands scaled by powers of two into f16's range, measured first);
    // otherwise three passes over operands split into high and low parts (f16 ones, scaled
    // likewise; TF32 ones on devices with too little shared memory), which rank as
    // accurately as f32. All re-check their two best candidates in f32. Other layouts
    // take the f32 SIMT kernel.
    let rows_ok = |l: &Layout| l.strides[1] == 1 && l.strides[0] % 4 == 0 && l.offset % 4 == 0;
    let tensor_cores = rows_ok(&xl) && rows_ok(&cl) && d % 4 == 0;
    // Where the device lends a block enough shared memory (Hopper 227 KiB, A100 163, other
    // Ampere and Ada parts 99): for d <= 128 the held kernels (points held in shared
    // memory, centroids packed to f16 beforehand and copied a tile ahead; at d = 128,
    // 107 KiB in fast mode, 209 KiB for exact mode's split form), beyond that the streamed
    // ones (points packed too, k-slices copied stages ahead: 84 and 124 KiB). The older
    // register-staged kernels remain for devices with less.
    let (np, mp, dp) = (
        n.next_multiple_of(128),
        m.next_multiple_of(128),
        d.next_multiple_of(32),
    );
    let plan = NearestPlan::choose(tensor_cores, gpu.precision, d, dp, gpu.dev.shared_optin);
    let x_rows = Operand {
        buffer: &xb,
        layout: &xl,
        rows: n,
        padded: np,
    };
    let c_rows = Operand {
        buffer: &cb,
        layout: &cl,
        rows: m,
        padded: mp,
    };
    let (norms, scales) = norms_and_scales(gpu, &plan, x_rows, c_rows, d)?;
    let (packed_c, packed_x) = match &scales {
        Some(scales) if plan.planes > 0 => (
            Some(pack_f16(gpu, &plan, c_rows, d, dp, scales.ptr() + 4)?),
            match plan.streamed {
                true => Some(pack_f16(gpu, &plan, x_rows, d, dp, scales.ptr())?),
                false => None,
            },
        ),
        _ => (None, None),
    };
    // Every kernel here takes the same leading parameters (the tensor-core ones require
    // unit column strides and ignore them); the f16 ones take the scales, the packed
    // centroids, their row length and the packed points after them, which the others
    // ignore.
    let ptr = |b: &Option<CudaBuffer>| b.as_ref().map_or(0, |b| b.ptr());
    let blocks = n.div_ceil(128) as u32;
    gpu.dev.launch_shared(
        gpu.dev.function(plan.kernel)?,
        (blocks, 1, 1),
        256,
        plan.shared,
        outputs(both().arg(norms.ptr()))
            .arg(ptr(&scales))
            .arg(ptr(&packed_c))
            .arg(dp as i64)
            .arg(ptr(&packed_x)),
    )
}

/// A matrix operand of the tensor-core search (f32): its rows, and their count padded to
/// whole tiles of 128.
#[derive(Clone, Copy)]
struct Operand<'a> {
    buffer: &'a CudaBuffer,
    layout: &'a Layout,
    rows: usize,
    padded: usize,
}

/// A matrix's parameters as the kernels take them after `a`: start, rows, d, row and column
/// strides.
fn matrix_onto(a: Args, m: Operand<'_>, d: usize) -> Args {
    let l = m.layout;
    a.arg(m.buffer.ptr() + l.offset as u64 * 4)
        .arg(m.rows as i64)
        .arg(d as i64)
        .arg(l.strides[0] as i64)
        .arg(l.strides[1] as i64)
}

/// The centroids' squared norms, padded to whole tiles of 128 with NaN (which the held
/// kernels copy with each tile and which no score can win with), and, for the f16 kernels,
/// the two operands' power-of-two scales (two words, cleared by `row_norms`).
fn norms_and_scales(
    gpu: &CudaBackend,
    plan: &NearestPlan,
    x: Operand<'_>,
    c: Operand<'_>,
    d: usize,
) -> Result<(CudaBuffer, Option<CudaBuffer>)> {
    let scales = if plan.kernel.starts_with("nearest_f16") {
        Some(gpu.new_buffer(DType::U32, 2)?)
    } else {
        None
    };
    let norms = gpu.new_buffer(DType::F32, c.padded)?;
    gpu.dev.launch(
        "row_norms",
        c.padded * 32,
        matrix_onto(Args::new(), c, d)
            .arg(norms.ptr())
            .arg(c.padded as i64)
            .arg(scales.as_ref().map_or(0, |s| s.ptr()))
            .arg(if scales.is_some() { 2i32 } else { 0 }),
    )?;
    if let Some(scales) = &scales {
        // Both operands' scales in one launch, each its own share of blocks as
        // `Device::launch` would give it alone.
        let (bx, bc) = (
            gpu.dev.blocks_for(x.rows * d),
            gpu.dev.blocks_for(c.rows * d),
        );
        let args = matrix_onto(Args::new(), x, d).arg(scales.ptr());
        let args = matrix_onto(args, c, d).arg(scales.ptr() + 4);
        gpu.dev.launch_raw(
            gpu.dev.function("absmax_rows_pair")?,
            (bx + bc, 1, 1),
            device::BLOCK,
            args.arg(bx as i64),
        )?;
    }
    Ok((norms, scales))
}

/// An operand packed to f16 for the held and streamed kernels (rows padded to whole tiles
/// of 128 and to `dp`, a multiple of 32 halves; the split form's remainders in a second
/// plane), scaled by the word at `scale`.
fn pack_f16(
    gpu: &CudaBackend,
    plan: &NearestPlan,
    m: Operand<'_>,
    d: usize,
    dp: usize,
    scale: u64,
) -> Result<CudaBuffer> {
    let packed = gpu.new_buffer(DType::U32, plan.planes * m.padded * dp / 2)?;
    let args = matrix_onto(Args::new(), m, d)
        .arg(scale)
        .arg(m.padded as i64)
        .arg(dp as i64)
        .arg(packed.ptr())
        .arg((plan.planes - 1) as i64);
    gpu.dev.launch("pack_f16_scaled", m.padded * dp / 2, args)?;
    Ok(packed)
}

pub(crate) fn kmeans_pp(gpu: &CudaBackend, x: V<'_>, anchors: V<'_>, seed: u64) -> Result<()> {
    let [n, d, m] = validate::kmeans_pp(x, anchors)?;
    // The reproducible precision keeps the reference's distance order (hal's steps).
    // (Indices are packed into 32 bits.)
    if gpu.precision == Precision::Reproducible || m == 0 || n > u32::MAX as usize {
        return hal::seeding::kmeans_pp_steps(gpu, x, anchors, seed);
    }
    gpu.dev.bind()?;
    // One cooperative launch (reduce.cu's kmeans_pp_race): a group of lanes per point,
    // about 16 coordinates a lane, and at most a block per multiprocessor, so that every
    // block is resident.
    let lanes = hal::seeding::lanes_per_point(d);
    let blocks = (n * lanes)
        .div_ceil(KPP_BLOCK as usize)
        .clamp(1, gpu.dev.sms as usize);
    let d2 = gpu.new_buffer(DType::F32, n)?;
    // Per anchor, the packed winner (u64) and the blocks counted in (u32), all ones.
    let slots = gpu.new_buffer(DType::U32, 3 * m)?;
    gpu.dev.memset(slots.ptr(), 0xff, 12 * m)?;
    gpu.dev.launch_cooperative(
        gpu.dev.function("kmeans_pp_race")?,
        blocks as u32,
        KPP_BLOCK,
        Args::new()
            .arg(x.buffer.ptr())
            .arg(n as i64)
            .arg(d as i64)
            .arg(m as i64)
            .arg(anchors.buffer.ptr())
            .arg(d2.ptr())
            .arg(slots.ptr())
            .arg(slots.ptr() + 8 * m as u64)
            .arg(seed as u32)
            .arg((seed >> 32) as u32)
            .arg(lanes as i32),
    )
}

/// The expanded-distance twin of a reference-order short-row kernel (`nearest_short_*`), for
/// batched searches outside `Precision::Reproducible`; `None` for the other kernels.
pub(crate) fn expanded_short(kernel: &str) -> Option<&'static str> {
    match kernel {
        "nearest_short_4" => Some("nearest_short_expanded_4"),
        "nearest_short_8" => Some("nearest_short_expanded_8"),
        "nearest_short_16" => Some("nearest_short_expanded_16"),
        _ => None,
    }
}

/// The reference-order nearest-centroid kernel for `m` centroids of dimension `d`, and the
/// points each block of 256 threads takes: rows of at most 4, 8 or 16 held in registers
/// (`nearest_short_*`), otherwise tiles of 32, 8 or 1 centroids (each computing thread keeps
/// that many sums).
pub(crate) fn ordered_kernel(m: usize, d: usize) -> (&'static str, usize) {
    match (m, d) {
        (_, 0..=4) => ("nearest_short_4", 256),
        (_, 5..=8) => ("nearest_short_8", 256),
        (9.., 9..=16) => ("nearest_short_16", 256),
        (1, _) => ("nearest_ordered_1", 64),
        (2..=8, _) => ("nearest_ordered_8", 64),
        _ => ("nearest_ordered", 128),
    }
}

impl CudaBackend {
    /// A batch of nearest-centroid searches (rank-3 views, validated), and every search under
    /// `Precision::Reproducible` (as a batch of one): the reference-order kernels, a grid row
    /// per group (batches search small codebooks, where the tensor-core paths' set-up would
    /// dominate).
    pub(crate) fn nearest_batched(
        &self,
        [x, c, out_index, out_distance]: [V<'_>; 4],
    ) -> Result<()> {
        let (g, n, d, m) = (
            x.layout.shape[0],
            x.layout.shape[1],
            x.layout.shape[2],
            c.layout.shape[1],
        );
        if g == 0 || n == 0 {
            return Ok(());
        }
        if g > u16::MAX as usize {
            // More groups than a grid has rows.
            return hal::nearest_per_group([x, c, out_index, out_distance], |[x, c, i, o]| {
                self.nearest_centroid(x, c, i, o)
            });
        }
        let (xb, xl) = self.as_f32(x)?;
        let (cb, cl) = self.as_f32(c)?;
        let (mut kernel, points) = ordered_kernel(m, d);
        if self.precision != Precision::Reproducible {
            // Short rows take the expanded distance (same launch shape).
            kernel = expanded_short(kernel).unwrap_or(kernel);
        }
        let s = |l: &Layout, i: usize| l.strides[i] as i64;
        let args = Args::new()
            .arg(xb.ptr() + xl.offset as u64 * 4)
            .arg(n as i64)
            .arg(s(&xl, 1))
            .arg(s(&xl, 2))
            .arg(cb.ptr() + cl.offset as u64 * 4)
            .arg(m as i64)
            .arg(s(&cl, 1))
            .arg(s(&cl, 2))
            .arg(d as i64)
            .arg(out_index.buffer.ptr())
            .arg(out_index.layout.offset as i64)
            .arg(s(out_index.layout, 1))
            .arg(out_distance.buffer.ptr())
            .arg(out_distance.layout.offset as i64)
            .arg(s(out_distance.layout, 1))
            .arg(s(&xl, 0))
            .arg(s(&cl, 0))
            .arg(s(out_index.layout, 0))
            .arg(s(out_distance.layout, 0));
        self.dev.launch_raw(
            self.dev.function(kernel)?,
            (n.div_ceil(points) as u32, g as u32, 1),
            256,
            args,
        )
    }
}
