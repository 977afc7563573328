//! Reductions over axes and arg-reductions along one.

use crate::buffer::WgpuBuffer;
use crate::fault::Guard;
use crate::ops::{CHUNK, LOOP_BUDGET};
use crate::pipeline::{Params, Spec};
use crate::wgsl::Access;
use crate::{V, WgpuBackend, wgsl};
use hal::{ArgReduceOp, DType, DeviceBuffer, Layout, ReduceOp, Result, View, validate};

/// `arg_reduce` shortens its chunks when chunks of [`CHUNK`] would give it fewer threads than
/// this.
pub(crate) const ARG_FEW_THREADS: usize = 4096;

/// The threads `reduce_chunked` shortens its chunks to give (see there).
pub(crate) const REDUCE_THREADS: usize = 65_536;

/// The longest run one invocation of `reduce_lanes.wgsl` takes (see `reduce_chunked`).
pub(crate) const LANE_ELEMENTS: usize = 64;

/// `arg_reduce` gives each output a workgroup of its own (arg_line.wgsl) when there are few
/// outputs and their lines are at least this long.
pub(crate) const ARG_LINE_FROM: usize = 1024;

/// The most terms one thread adds in sequence before a partial is written: short runs keep
/// f32 sums accurate without relying on compensation, which a shader compiler may undo.
pub(crate) const SUM_CHUNK: usize = 256;

/// `reduce.wgsl`'s thread layouts (scalar 4; see `reduce_chunked`).
pub(crate) const REDUCE_CHUNKED: u32 = 0;

pub(crate) const REDUCE_OUTPUTS_FASTEST: u32 = 1;

pub(crate) const REDUCE_INTERLEAVED: u32 = 2;

/// The elements `axes` of `x` reduce over, as a layout (offset 0) in memory order: the axes
/// sorted by stride, largest first, and merged where one steps over the other whole (the
/// NCHW view of a channel-major convolution output reduced over N, H and W is one run of
/// N*H*W contiguous elements). The order of a reduction's terms changes, not its terms.
pub(crate) fn reduced_in_memory_order(x: &Layout, axes: &[usize]) -> Layout {
    let mut dims: Vec<(usize, isize)> = axes
        .iter()
        .map(|&a| (x.shape[a], x.strides[a]))
        .filter(|&(n, _)| n != 1)
        .collect();
    if dims.iter().any(|&(n, _)| n == 0) {
        dims = vec![(0, 1)];
    }
    dims.sort_by_key(|&(_, st)| std::cmp::Reverse(st.unsigned_abs()));
    let mut merged: Vec<(usize, isize)> = Vec::with_capacity(dims.len().max(1));
    for (n, st) in dims {
        match merged.last_mut() {
            Some(last) if last.1 == st * n as isize => *last = (last.0 * n, st),
            _ => merged.push((n, st)),
        }
    }
    if merged.is_empty() {
        merged.push((1, 0));
    }
    Layout {
        shape: merged.iter().map(|&(n, _)| n).collect(),
        strides: merged.iter().map(|&(_, st)| st).collect(),
        offset: 0,
    }
}

/// `x`'s strides with `axes` zeroed, on `shape`: the base offset of each output's reduction.
pub(crate) fn kept(x: &Layout, shape: &[usize], axes: &[usize]) -> Layout {
    let mut l = Layout {
        shape: shape.to_vec(),
        strides: x.strides.clone(),
        offset: x.offset,
    };
    for &a in axes {
        l.strides[a] = 0;
    }
    l
}

pub(crate) fn reduce(
    gpu: &WgpuBackend,
    op: ReduceOp,
    x: V<'_>,
    axes: &[usize],
    out: V<'_>,
) -> Result<()> {
    validate::reduce(op, x, axes, out)?;
    if op == ReduceOp::LogSumExp {
        // From the other primitives (hal::reduction), whose f64 forms this backend lacks.
        if x.dtype() == DType::F64 || out.dtype() == DType::F64 {
            return Err(hal::Error::UnsupportedDType {
                op: "reduce",
                dtype: DType::F64,
                detail: "LogSumExp in f64 needs the f64 elementwise primitives, which the \
                         wgpu backend does not have"
                    .into(),
            });
        }
        return hal::reduction::log_sum_exp_steps(gpu, x, axes, out);
    }
    let count = hal::numel(&axes.iter().map(|&a| x.layout.shape[a]).collect::<Vec<_>>());
    if x.dtype() == DType::F64 || out.dtype() == DType::F64 {
        let (op, mean_count) = match op {
            ReduceOp::Mean => (ReduceOp::Sum, count),
            other => (other, 0),
        };
        let mean_count = u32::try_from(mean_count).map_err(|_| hal::Error::Unsupported {
            op: "reduce",
            detail: "a mean over more than u32::MAX elements".into(),
        })?;
        return gpu.labelled(
            || format!("reduce (f64) {:?} over {axes:?}", x.layout.shape),
            || gpu.reduce_wide(op, x, axes, out, mean_count),
        );
    }
    let scale = if op == ReduceOp::Mean {
        1.0 / count as f32
    } else {
        1.0
    };
    let op = if op == ReduceOp::Mean {
        ReduceOp::Sum
    } else {
        op
    };
    gpu.labelled(
        || format!("reduce {:?} over {axes:?}", x.layout.shape),
        || gpu.reduce_chunked(op, x, axes, out, scale, None),
    )
}

pub(crate) fn arg_reduce(
    gpu: &WgpuBackend,
    op: ArgReduceOp,
    x: V<'_>,
    axis: usize,
    out: V<'_>,
) -> Result<()> {
    validate::arg_reduce(x, axis, out)?;
    let keep = kept(x.layout, &out.layout.shape, &[axis]);
    let line = Layout {
        shape: vec![x.layout.shape[axis]],
        strides: vec![x.layout.strides[axis]],
        offset: 0,
    };
    gpu.arg_chunked(
        op, true, x.buffer, &keep, &line, None, out.buffer, out.layout, None,
    )
}

/// How `reduce.wgsl`'s threads share the work, so that neighbouring threads read
/// neighbouring words: each output's elements contiguous (a channel's bias gradient over a
/// channel-major convolution output) -> a chunk is every `chunks`-th element
/// ([`REDUCE_INTERLEAVED`]); neighbouring outputs closer in memory than neighbouring elements
/// (a bias gradient over a batch's rows) -> neighbouring threads take neighbouring outputs
/// ([`REDUCE_OUTPUTS_FASTEST`]); otherwise each thread a run of elements
/// ([`REDUCE_CHUNKED`]). `red`: the reduced dimensions; `keep`: each output's start.
fn reduce_mode(red: &Layout, keep: &Layout) -> u32 {
    let smallest = |l: &Layout| {
        l.shape
            .iter()
            .zip(&l.strides)
            .filter(|&(&n, &st)| n > 1 && st != 0)
            .map(|(_, st)| st.unsigned_abs())
            .min()
    };
    match (smallest(red), smallest(keep)) {
        _ if red.rank() == 1 && red.strides[0] == 1 => REDUCE_INTERLEAVED,
        (Some(r), Some(k)) if k < r => REDUCE_OUTPUTS_FASTEST,
        _ => REDUCE_CHUNKED,
    }
}

/// The partials of a chunked reduction into `out` as a view of `out`'s shape plus a last
/// dimension of `chunks`: partial `c` of output `o` is at `o * chunks + c`, or at
/// `c * n_out + o` where outputs went fastest.
fn partials_layout(out: &Layout, chunks: usize, mode: u32) -> Result<Layout> {
    let mut shape = out.shape.clone();
    shape.push(chunks);
    let mut strides = hal::contiguous_strides(&out.shape);
    match mode {
        REDUCE_OUTPUTS_FASTEST => strides.push(out.numel() as isize),
        _ => {
            strides.iter_mut().for_each(|st| *st *= chunks as isize);
            strides.push(1);
        }
    }
    Layout::strided(&shape, &strides, 0)
}

/// The `rule` slot of the arg-reduction kernels: which value is better, and whether a NaN
/// wins (argmax/argmin) or loses (nearest centroid).
fn arg_rule(op: ArgReduceOp, nan_wins: bool) -> String {
    let better = if op == ArgReduceOp::ArgMax {
        "v > best"
    } else {
        "v < best"
    };
    format!(
        "fn better(v: f32, best: f32) -> bool {{ return {better}; }}\nconst NAN_WINS: bool = {nan_wins};"
    )
}

/// Where the second pass of a chunked arg-reduction finds each output's partials (`keep`)
/// and the partials along it (`line`): output `o`'s are `o * chunks ..`, one per chunk, in
/// order.
fn arg_partials(out: &Layout, chunks: usize) -> (Layout, Layout) {
    let keep = Layout {
        shape: out.shape.clone(),
        strides: hal::contiguous_strides(&out.shape)
            .iter()
            .map(|s| s * chunks as isize)
            .collect(),
        offset: 0,
    };
    let line = Layout {
        shape: vec![chunks],
        strides: vec![1],
        offset: 0,
    };
    (keep, line)
}

impl WgpuBackend {
    /// Reduces `x` over `axes` into `out` (times `scale`), at most [`CHUNK`] elements per
    /// thread: longer reductions write per-chunk partials and reduce those in another pass.
    /// (Bounded per-thread loops are also what lavapipe needs: llvmpipe stops any invocation's
    /// loops after 65535 iterations.) With a `guard`, the pass that writes `out` writes nothing
    /// when that index check failed.
    pub(crate) fn reduce_chunked(
        &self,
        op: ReduceOp,
        x: V<'_>,
        axes: &[usize],
        out: V<'_>,
        scale: f32,
        guard: Option<Guard>,
    ) -> Result<()> {
        let red = reduced_in_memory_order(x.layout, axes);
        let count = red.numel();
        let n_out = out.layout.numel();
        let longest = if op == ReduceOp::Sum {
            SUM_CHUNK
        } else {
            CHUNK
        };
        // Chunks short enough to give the GPU REDUCE_THREADS threads where the work allows (a
        // bias gradient, 512 sums of 256, was otherwise 512 threads each walking 256 values in
        // sequence; docs/PERF.md, tuning evidence), at least 32 values long.
        let per = (count * n_out).div_ceil(REDUCE_THREADS).clamp(32, longest);
        let chunks = count.div_ceil(per).max(1);
        let keep = kept(x.layout, &out.layout.shape, axes);
        let mode = reduce_mode(&red, &keep);
        let finish = match op {
            ReduceOp::Max => "select(mx, nan(), seen_nan)",
            ReduceOp::Min => "select(mn, nan(), seen_nan)",
            _ => "sum * sf(1u)",
        };
        let spec = |bind: Vec<(DType, Access)>| {
            Spec::new("reduce.wgsl").bindings(bind).slot(
                "finish",
                format!(
                    "fn finish(sum: f32, mx: f32, mn: f32, seen_nan: bool) -> f32 {{ return {finish}; }}"
                ),
            )
        };
        let a = x.dtype();
        // What both kernels read: the output, where each output's line starts, the line.
        let whole_lines = Params::default()
            .block(out.layout)
            .block(&keep)
            .block(&red)
            .scalar(0, count as u32)
            .f(1, scale)
            .scalar(5, n_out as u32);
        if chunks == 1 {
            let p = whole_lines
                .scalar(2, per as u32)
                .scalar(3, 1)
                .scalar(4, mode);
            let b = out.dtype();
            return self.run_guarded(
                spec(wgsl::io(&[a], b)),
                p,
                &[(x.buffer, false), (out.buffer, true)],
                n_out,
                guard,
            );
        }
        // Short lines that still need several chunks: one pass of reduce_lanes.wgsl, a
        // workgroup's invocations sharing each line, instead of partials and a second
        // dispatch (each dispatch costs several microseconds on the GPU: a training step's
        // bias gradients are a handful of these).
        let lanes = if mode == REDUCE_OUTPUTS_FASTEST {
            32
        } else {
            1
        };
        let groups = n_out.div_ceil(lanes);
        let max_groups = self.0.limits.max_compute_workgroups_per_dimension as usize;
        if count.div_ceil(256 / lanes) <= LANE_ELEMENTS && groups.div_ceil(max_groups) <= max_groups
        {
            let p = whole_lines.scalar(4, lanes as u32);
            let lanes_spec = Spec {
                file: "reduce_lanes.wgsl",
                ..spec(wgsl::io(&[a], out.dtype()))
            };
            let buffers = [(x.buffer, false), (out.buffer, true)];
            let (lanes_spec, p, buffers) = match guard {
                Some(g) => self.guarded(lanes_spec, p, &buffers, g),
                None => (lanes_spec, p, buffers.to_vec()),
            };
            let grid = [
                groups.min(max_groups) as u32,
                groups.div_ceil(max_groups) as u32,
                1,
            ];
            return self.dispatch_groups(&self.kernel(&lanes_spec)?, &p, &buffers, grid);
        }
        let partial = self.scratch(DType::F32, n_out * chunks)?;
        let pl = Layout::contiguous(&[n_out * chunks]);
        let p = Params::default()
            .block(&pl)
            .block(&keep)
            .block(&red)
            .scalar(0, count as u32)
            .f(1, 1.0)
            .scalar(2, per as u32)
            .scalar(3, chunks as u32)
            .scalar(4, mode)
            .scalar(5, n_out as u32);
        let f = DType::F32;
        self.run(
            spec(wgsl::io(&[a], f)),
            p,
            &[(x.buffer, false), (&partial, true)],
            n_out * chunks,
        )?;
        let partial_layout = partials_layout(out.layout, chunks, mode)?;
        let out_layout = out.layout.unsqueeze(out.layout.rank())?;
        self.reduce_chunked(
            op,
            View::new(&partial, &partial_layout),
            &[partial_layout.rank() - 1],
            View::new(out.buffer, &out_layout),
            scale,
            guard,
        )
    }

    /// [`Self::reduce_chunked`] in `f64` (`reduce_wide.wgsl`): sums, partials and the
    /// maximum and minimum in `f64`, inputs of any float dtype widened, the result rounded
    /// once into `out`; a mean divides by `mean_count` (0: a sum, max or min) at the end.
    pub(crate) fn reduce_wide(
        &self,
        op: ReduceOp,
        x: V<'_>,
        axes: &[usize],
        out: V<'_>,
        mean_count: u32,
    ) -> Result<()> {
        let red = reduced_in_memory_order(x.layout, axes);
        let count = red.numel();
        let n_out = out.layout.numel();
        let per = (count * n_out).div_ceil(REDUCE_THREADS).clamp(32, CHUNK);
        let chunks = count.div_ceil(per).max(1);
        let keep = kept(x.layout, &out.layout.shape, axes);
        let mode = reduce_mode(&red, &keep);
        let finish = match op {
            ReduceOp::Max => "select(mx, f64(nan()), seen_nan)",
            ReduceOp::Min => "select(mn, f64(nan()), seen_nan)",
            _ => "sum",
        };
        let spec = |reads: DType, writes: DType| {
            let put = if writes == DType::F64 {
                "st2(i, v)"
            } else {
                "st2(i, f32(v))"
            };
            Spec::new("reduce_wide.wgsl")
                .bindings(wgsl::io(&[reads], writes))
                .slot(
                    "finish",
                    format!(
                        "fn finish(sum: f64, mx: f64, mn: f64, seen_nan: bool) -> f64 {{ return {finish}; }}"
                    ),
                )
                .slot("put", format!("fn put(i: i32, v: f64) {{ {put}; }}"))
        };
        let params = |written: &Layout, chunks: usize, mean: u32| {
            Params::default()
                .block(written)
                .block(&keep)
                .block(&red)
                .scalar(0, count as u32)
                .f(1, 1.0)
                .scalar(2, per as u32)
                .scalar(3, chunks as u32)
                .scalar(4, mode)
                .scalar(5, n_out as u32)
                .scalar(6, mean)
        };
        if chunks == 1 {
            let p = params(out.layout, 1, mean_count);
            let b = out.dtype();
            return self.run(
                spec(x.dtype(), b),
                p,
                &[(x.buffer, false), (out.buffer, true)],
                n_out,
            );
        }
        let partial = self.scratch(DType::F64, n_out * chunks)?;
        let pl = Layout::contiguous(&[n_out * chunks]);
        let p = params(&pl, chunks, 0);
        self.run(
            spec(x.dtype(), DType::F64),
            p,
            &[(x.buffer, false), (&partial, true)],
            n_out * chunks,
        )?;
        let partial_layout = partials_layout(out.layout, chunks, mode)?;
        let out_layout = out.layout.unsqueeze(out.layout.rank())?;
        self.reduce_wide(
            op,
            View::new(&partial, &partial_layout),
            &[partial_layout.rank() - 1],
            View::new(out.buffer, &out_layout),
            mean_count,
        )
    }

    /// Where a one-pass arg-reduction writes the extreme values: `out_value`, or a word it is
    /// told (scalar 5 is 0) not to write, under a broadcast layout.
    fn value_binding(
        &self,
        out_value: Option<(&WgpuBuffer, &Layout)>,
        out_layout: &Layout,
    ) -> Result<(WgpuBuffer, Layout, u32)> {
        Ok(match out_value {
            Some((b, l)) => (b.clone(), l.clone(), 1),
            None => (
                self.scratch(DType::F32, 1)?,
                Layout::contiguous(&[1]).broadcast_to(&out_layout.shape)?,
                0,
            ),
        })
    }

    /// The index of the extreme value along a line, at most [`CHUNK`] values per thread.
    /// `keep` gives each output's base offset in `x`, `line` the values along the reduced axis.
    /// With `index` given, `x` holds earlier passes' extremes and `index` their positions.
    /// `nan_wins`: a NaN is the extreme (argmax/argmin); otherwise NaNs lose (nearest centroid).
    /// With `out_value`, the extreme values are written too.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn arg_chunked(
        &self,
        op: ArgReduceOp,
        nan_wins: bool,
        x: &WgpuBuffer,
        keep: &Layout,
        line: &Layout,
        index: Option<&WgpuBuffer>,
        out: &WgpuBuffer,
        out_layout: &Layout,
        out_value: Option<(&WgpuBuffer, &Layout)>,
    ) -> Result<()> {
        let count = line.numel();
        let n_out = out_layout.numel();
        // Few outputs along a long line get chunks of about sqrt(count) (two passes of that
        // many steps each) instead of CHUNK, which left one line of 8,192 to four threads, or,
        // for lines long enough, a workgroup each (below).
        let few_outputs = n_out * count.div_ceil(CHUNK) < ARG_FEW_THREADS;
        let chunk = if few_outputs {
            count.isqrt().clamp(32, CHUNK)
        } else {
            CHUNK
        };
        let chunks = count.div_ceil(chunk).max(1);
        let rule = arg_rule(op, nan_wins);
        let a = x.dtype();
        let (vb, vl, has) = self.value_binding(out_value, out_layout)?;
        let vb = &vb;
        let max_groups = self.0.limits.max_compute_workgroups_per_dimension as usize;
        if index.is_none()
            && few_outputs
            && (ARG_LINE_FROM..=LOOP_BUDGET * 256).contains(&count)
            && n_out <= max_groups
        {
            // Few long lines: a workgroup each (arg_line.wgsl), one dispatch.
            let spec = Spec::new("arg_line.wgsl")
                .bindings(vec![
                    (a, Access::Read),
                    (DType::U32, Access::Write),
                    (DType::F32, Access::Write),
                ])
                .slot("rule", rule);
            let p = Params::default()
                .block(out_layout)
                .block(keep)
                .block(line)
                .block(&vl)
                .scalar(0, count as u32)
                .scalar(5, has);
            return self.dispatch_groups(
                &self.kernel(&spec)?,
                &p,
                &[(x, false), (out, true), (vb, true)],
                [n_out as u32, 1, 1],
            );
        }
        let dummy = self.scratch(DType::U32, 1)?;
        let idx = index.unwrap_or(&dummy);
        let spec = Spec::new("arg_reduce.wgsl")
            .bindings(vec![
                (a, Access::Read),
                (DType::U32, Access::Write),
                (DType::U32, Access::Read),
                (DType::F32, Access::Write),
            ])
            .slot("rule", rule);
        let scalars = |p: Params| {
            p.scalar(0, count as u32)
                .scalar(2, chunk as u32)
                .scalar(3, chunks as u32)
                .scalar(4, index.is_some() as u32)
        };
        if chunks == 1 {
            let p = scalars(
                Params::default()
                    .block(out_layout)
                    .block(keep)
                    .block(line)
                    .block(&vl),
            )
            .scalar(5, has);
            return self.run(
                spec,
                p,
                &[(x, false), (out, true), (idx, false), (vb, true)],
                n_out,
            );
        }
        let (pv, pi) = (
            self.scratch(DType::F32, n_out * chunks)?,
            self.scratch(DType::U32, n_out * chunks)?,
        );
        let pl = Layout::contiguous(&[n_out * chunks]);
        let p = scalars(
            Params::default()
                .block(&pl)
                .block(keep)
                .block(line)
                .block(&pl),
        )
        .scalar(5, 1);
        self.run(
            spec,
            p,
            &[(x, false), (&pi, true), (idx, false), (&pv, true)],
            n_out * chunks,
        )?;
        let (keep2, line2) = arg_partials(out_layout, chunks);
        self.arg_chunked(
            op,
            nan_wins,
            &pv,
            &keep2,
            &line2,
            Some(&pi),
            out,
            out_layout,
            out_value,
        )
    }
}
