//! Reductions over axes and arg-reductions along one.

use crate::buffer::CudaBuffer;
use crate::device::Args;
use crate::walk::Walk;
use crate::{CudaBackend, V, device};
use hal::{ArgReduceOp, Backend, DType, Layout, ReduceOp, Result, TernaryOp, View, validate};

/// `arg_reduce` gives each output a block of 1,024 threads (`arg_reduce_block`) instead of a
/// warp when the axis is at least this long and the outputs are few.
pub(crate) const ARG_BLOCK_FROM_LEN: usize = 2048;

/// `arg_reduce` gives each output one thread (`arg_reduce_short`) along axes up to this long.
pub(crate) const ARG_SHORT_UP_TO_LEN: usize = 16;

/// `arg_reduce` of a single output splits the axis over blocks (`arg_reduce_split`) from this
/// length on.
pub(crate) const ARG_SPLIT_FROM_LEN: usize = 4096;

pub(crate) fn reduce(
    gpu: &CudaBackend,
    op: ReduceOp,
    x: V<'_>,
    axes: &[usize],
    out: V<'_>,
) -> Result<()> {
    validate::reduce(op, x, axes, out)?;
    gpu.dev.bind()?;
    if op == ReduceOp::LogSumExp {
        return gpu.log_sum_exp(x, axes, out);
    }
    if x.dtype() == DType::F64 || out.dtype() == DType::F64 {
        return gpu.reduce_wide(op, x, axes, out);
    }
    gpu.reduce_into(op, x, axes, out)
}

pub(crate) fn arg_reduce(
    gpu: &CudaBackend,
    op: ArgReduceOp,
    x: V<'_>,
    axis: usize,
    out: V<'_>,
) -> Result<()> {
    validate::arg_reduce(x, axis, out)?;
    gpu.dev.bind()?;
    let kept = Walk::of("arg_reduce", &out.layout.shape, &[out.layout, x.layout])?;
    if kept.n == 0 {
        return Ok(());
    }
    let len = x.layout.shape[axis];
    if x.buffer.dtype == DType::F64 {
        // A warp per output (arg_reduce_wide): f64 argmaxes are rare enough to need one form.
        let args = Args::new()
            .arg(kept)
            .arg(len as i64)
            .arg(x.layout.strides[axis] as i64)
            .arg(out.buffer.ptr())
            .arg(x.buffer.ptr())
            .arg(matches!(op, ArgReduceOp::ArgMax) as i32);
        return gpu
            .dev
            .launch("arg_reduce_wide", kept.n as usize * 32, args);
    }
    let args = Args::new()
        .arg(kept)
        .arg(len as i64)
        .arg(x.layout.strides[axis] as i64)
        .arg(out.buffer.ptr())
        .operand(x.buffer)
        .arg(matches!(op, ArgReduceOp::ArgMax) as i32);
    // A thread per output along short axes; a warp per output while there are enough
    // outputs to fill the device; a block each for a few long ones; one output along a
    // long axis split over blocks of 256 with 1,024 keys or more each.
    if kept.n == 1 && len >= ARG_SPLIT_FROM_LEN {
        let blocks = (len / 1024).min(gpu.dev.sms as usize * 2);
        // Each block's best value, and its index (an i64: two words).
        let part_v = gpu.new_buffer(DType::F32, blocks)?;
        let part_i = gpu.new_buffer(DType::U32, 2 * blocks)?;
        return gpu.dev.launch_raw(
            gpu.dev.function("arg_reduce_split")?,
            (blocks as u32, 1, 1),
            256,
            args.arg(part_v.ptr())
                .arg(part_i.ptr())
                .arg(gpu.dev.ticket.ptr),
        );
    }
    if len >= ARG_BLOCK_FROM_LEN && (kept.n as usize) < gpu.dev.sms as usize * 8 {
        return gpu.dev.launch_raw(
            gpu.dev.function("arg_reduce_block")?,
            (kept.n as u32, 1, 1),
            1024,
            args,
        );
    }
    if (1..=ARG_SHORT_UP_TO_LEN).contains(&len) {
        return gpu.dev.launch("arg_reduce_short", kept.n as usize, args);
    }
    gpu.dev
        .launch("arg_reduce_kernel", kept.n as usize * 32, args)
}

impl CudaBackend {
    /// [`ReduceOp::LogSumExp`]: one pass of `reduce_lse_rows` (a block per output) where each
    /// output's reduced elements are one contiguous run of f32 or 16-bit floats and the outputs
    /// are many enough to fill the device; otherwise composed from the other primitives
    /// (`hal::reduction`), as for f64.
    fn log_sum_exp(&self, x: V<'_>, axes: &[usize], out: V<'_>) -> Result<()> {
        let (kept, red) = reduce_walks(x, axes, out)?;
        if kept.n == 0 {
            return Ok(());
        }
        let rows = red.n > 0
            && red.rank() == 1
            && red.stride(0, 0) == 1
            && matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16)
            && out.dtype() != DType::F64
            && (kept.n >= self.dev.sms as i64 || red.n < 1 << 16);
        if !rows {
            return hal::reduction::log_sum_exp_steps(self, x, axes, out);
        }
        let blocks = (kept.n as usize).min(self.dev.sms as usize * 32) as u32;
        self.dev.launch_raw(
            self.dev.function("reduce_lse_rows")?,
            (blocks, 1, 1),
            device::BLOCK,
            Args::new()
                .arg(kept)
                .arg(red.n)
                .operand(out.buffer)
                .operand(x.buffer),
        )
    }

    /// `reduce` in `f64` (`reduce_wide` in `cuda/reduce.cu`): a block per output, or, for few
    /// outputs with long reductions, a block per chunk writing `f64` partials that a second
    /// launch reduces.
    pub(crate) fn reduce_wide(
        &self,
        op: ReduceOp,
        x: V<'_>,
        axes: &[usize],
        out: V<'_>,
    ) -> Result<()> {
        let (kept, red) = reduce_walks(x, axes, out)?;
        let code = reduce_code(op);
        if kept.n == 0 {
            return Ok(());
        }
        let count = red.n;
        let sms = self.dev.sms as i64;
        let launch =
            |kept: Walk, red: Walk, out: &CudaBuffer, x: &CudaBuffer, op: i32, chunks: i64| {
                let blocks = (kept.n * chunks).min(sms * 32).max(1) as u32;
                self.dev.launch_raw(
                    self.dev.function("reduce_wide")?,
                    (blocks, 1, 1),
                    device::BLOCK,
                    Args::new()
                        .arg(kept)
                        .arg(red)
                        .operand(out)
                        .operand(x)
                        .arg(op)
                        .arg(chunks)
                        .arg(count),
                )
            };
        if kept.n < sms && red.n >= 1 << 14 {
            let chunks = ((8 * sms + kept.n - 1) / kept.n).min(red.n / 4096).max(2);
            let partial = self.new_buffer(DType::F64, (kept.n * chunks) as usize)?;
            launch(kept, red, &partial, x.buffer, code, chunks)?;
            let mut strides = hal::contiguous_strides(&out.layout.shape);
            strides.iter_mut().for_each(|s| *s *= chunks as isize);
            let parts = Layout::strided(&out.layout.shape, &strides, 0)?;
            let kept2 = Walk::of("reduce", &out.layout.shape, &[out.layout, &parts])?;
            let red2 = Walk::new("reduce", &[chunks as usize], &[(&[1], 0)])?;
            return launch(kept2, red2, out.buffer, &partial, code, 1);
        }
        launch(kept, red, out.buffer, x.buffer, code, 1)
    }

    pub(crate) fn reduce_into(
        &self,
        op: ReduceOp,
        x: V<'_>,
        axes: &[usize],
        out: V<'_>,
    ) -> Result<()> {
        let (kept, red) = reduce_walks(x, axes, out)?;
        let code = reduce_code(op);
        if kept.n == 0 {
            return Ok(());
        }
        // Few outputs with very long reductions (a whole-array sum): one block per output
        // would leave the GPU idle, so the reduction is split into chunks over many blocks
        // (`reduce_partial`), whose partial results are then reduced as below.
        let sms = self.dev.sms as i64;
        if kept.n < sms && red.n >= 1 << 14 {
            // About eight blocks per multiprocessor in all: enough threads to keep the loads
            // in flight.
            let chunks = ((8 * sms + kept.n - 1) / kept.n).min(red.n / 4096).max(2);
            let partial = self.new_buffer(DType::F32, (kept.n * chunks) as usize)?;
            self.dev.launch_raw(
                self.dev.function("reduce_partial")?,
                ((kept.n * chunks).min(sms * 32) as u32, 1, 1),
                device::BLOCK,
                Args::new()
                    .arg(kept)
                    .arg(red)
                    .arg(partial.ptr())
                    .arg(chunks)
                    .operand(x.buffer)
                    .arg(code),
            )?;
            let mut strides = hal::contiguous_strides(&out.layout.shape);
            strides.iter_mut().for_each(|s| *s *= chunks as isize);
            let parts = Layout::strided(&out.layout.shape, &strides, 0)?;
            let kept2 = Walk::of("reduce", &out.layout.shape, &[out.layout, &parts])?;
            let red2 = Walk::new("reduce", &[chunks as usize], &[(&[1], 0)])?;
            let pass2 = if op == ReduceOp::Max || op == ReduceOp::Min {
                code
            } else {
                0
            };
            return self.dev.launch_raw(
                self.dev.function("reduce_warp")?,
                (
                    (kept.n as usize)
                        .div_ceil(8)
                        .min(self.dev.sms as usize * 32)
                        .max(1) as u32,
                    1,
                    1,
                ),
                device::BLOCK,
                Args::new()
                    .arg(kept2)
                    .arg(red2)
                    .operand(out.buffer)
                    .operand(&partial)
                    .arg(pass2),
            );
        }
        // One reduced axis of far-apart elements, with neighbouring outputs next to each other
        // in x and not too many rows: 32 outputs a block (`reduce_columns`), so loads coalesce.
        let columns = red.rank() == 1
            && red.stride(0, 0).abs() > 1
            && kept.rank() >= 1
            && kept.stride(1, kept.rank() - 1) == 1
            && kept.n >= 2
            && red.n <= 1 << 14;
        // Otherwise few outputs with long reductions get a block each, and the rest a warp
        // each.
        const COLUMN_W: usize = 32;
        let per_block = kept.n < 4 * sms && red.n >= 1024;
        let (name, groups, threads) = if columns {
            ("reduce_columns", (kept.n as usize).div_ceil(COLUMN_W), 1024)
        } else if kept.n == 1 && red.n >= 4096 {
            // One output: a block of 1,024 threads has four times the loads in flight (the
            // 10,000 distances of an assignment's energy).
            ("reduce_block_wide", 1, 1024)
        } else if per_block {
            ("reduce_block", kept.n as usize, device::BLOCK)
        } else {
            ("reduce_warp", (kept.n as usize).div_ceil(8), device::BLOCK)
        };
        let blocks = groups.min(self.dev.sms as usize * 32).max(1) as u32;
        self.dev.launch_raw(
            self.dev.function(name)?,
            (blocks, 1, 1),
            threads,
            Args::new()
                .arg(kept)
                .arg(red)
                .operand(out.buffer)
                .operand(x.buffer)
                .arg(code),
        )
    }

    /// A sum over the last axis of `src` into `out`, skipped when `verdict` is set (the segment
    /// sums' final step: a failed check writes nothing).
    pub(crate) fn reduce_guarded(
        &self,
        verdict: &CudaBuffer,
        src: V<'_>,
        out: V<'_>,
    ) -> Result<()> {
        // The sums land in a scratch buffer; `out = verdict ? out : sums` then copies them out
        // only when the check passed (the verdict word broadcast over the output).
        let tmp_l = Layout::contiguous(&out.layout.shape);
        let tmp = self.new_buffer(DType::F32, tmp_l.numel())?;
        let axes = [src.layout.rank() - 1];
        self.reduce_into(ReduceOp::Sum, src, &axes, View::new(&tmp, &tmp_l))?;
        // The verdict word (a u32, nonzero after a failed check) broadcast over the output.
        let verdict_view = Layout::contiguous(&[1]);
        self.ternary(
            TernaryOp::Where,
            View::new(verdict, &verdict_view),
            out,
            View::new(&tmp, &tmp_l),
            out,
        )
    }
}

/// The kernels' reduction codes (`reduce_combine` in `cuda/reduce.cu`).
fn reduce_code(op: ReduceOp) -> i32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Mean => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::LogSumExp => unreachable!("LogSumExp has kernels of its own"),
    }
}

/// A reduction's two walks: over the outputs (operands: out, x) and over one output's
/// reduced elements of `x` (offset 0: the first walk supplies the base).
fn reduce_walks(x: V<'_>, axes: &[usize], out: V<'_>) -> Result<(Walk, Walk)> {
    let kept = Walk::of("reduce", &out.layout.shape, &[out.layout, x.layout])?;
    let red_shape: Vec<usize> = (0..x.layout.rank())
        .map(|d| {
            if axes.contains(&d) {
                x.layout.shape[d]
            } else {
                1
            }
        })
        .collect();
    let red = Walk::new("reduce", &red_shape, &[(&x.layout.strides, 0)])?;
    Ok((kept, red))
}
