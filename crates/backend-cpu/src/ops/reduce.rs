//! Reductions along axes, and argmax / argmin along one axis.
//!
//! The input view is split into the kept dimensions (one output element each) and the reduced
//! dimensions. With many outputs, threads take disjoint output ranges; with few, each output's
//! reduction is split into fixed-size chunks whose partial results are combined in chunk order,
//! so the result does not depend on the thread count. Sums accumulate in `f64`; those of `f64`
//! elements carry a compensation term as well (Neumaier's), so they are as accurate as the
//! `f32` sums are.

use crate::storage::{Dst, Src};
use crate::walk::{CHUNK, Walk};
use hal::{ArgReduceOp, Layout, ReduceOp};
use rayon::prelude::*;

/// Splits `x` into (kept layout with the output's shape, reduced layout based at offset 0).
fn split(x: &Layout, axes: &[usize]) -> (Layout, Layout) {
    let mut kept = x.clone();
    let mut red = Layout {
        shape: Vec::new(),
        strides: Vec::new(),
        offset: 0,
    };
    for &a in axes {
        kept.shape[a] = 1;
        kept.strides[a] = 0;
        red.shape.push(x.shape[a]);
        red.strides.push(x.strides[a]);
    }
    (kept, red)
}

#[derive(Clone, Copy)]
struct Acc {
    sum: f64,
    /// Neumaier's compensation: what the rounding of `sum` lost (f64 elements only).
    lost: f64,
    max: f64,
    min: f64,
    nan: bool,
}

impl Acc {
    const EMPTY: Acc = Acc {
        sum: 0.0,
        lost: 0.0,
        max: f64::NEG_INFINITY,
        min: f64::INFINITY,
        nan: false,
    };
    #[inline(always)]
    fn push(&mut self, v: f32) {
        self.sum += v as f64;
        self.nan |= v.is_nan();
        self.max = self.max.max(v as f64);
        self.min = self.min.min(v as f64);
    }
    /// An `f64` element, its sum compensated.
    #[inline(always)]
    fn push_wide(&mut self, v: f64) {
        self.add_compensated(v);
        self.nan |= v.is_nan();
        self.max = self.max.max(v);
        self.min = self.min.min(v);
    }
    /// Adds `v` to the sum, what the rounding loses to `lost` (Neumaier).
    #[inline(always)]
    fn add_compensated(&mut self, v: f64) {
        let t = self.sum + v;
        self.lost += if self.sum.abs() >= v.abs() {
            (self.sum - t) + v
        } else {
            (v - t) + self.sum
        };
        self.sum = t;
    }
    fn merge(mut self, o: Acc) -> Acc {
        if o.lost != 0.0 || self.lost != 0.0 {
            // (Another partial's sum: not an element, so not a candidate for max or min.)
            self.add_compensated(o.sum);
            self.lost += o.lost;
        } else {
            self.sum += o.sum;
        }
        self.nan |= o.nan;
        self.max = self.max.max(o.max);
        self.min = self.min.min(o.min);
        self
    }
    /// The result, exact for max and min, rounded once for sums ([`Dst::store_f64`]).
    fn finish(self, op: ReduceOp, count: usize) -> f64 {
        // An infinite or NaN sum has a NaN compensation: leave it out.
        let sum = if self.lost.is_finite() {
            self.sum + self.lost
        } else {
            self.sum
        };
        match op {
            ReduceOp::Sum => sum,
            ReduceOp::Mean => sum / count as f64,
            ReduceOp::Max | ReduceOp::Min if self.nan => f64::NAN,
            ReduceOp::Max => self.max,
            ReduceOp::Min => self.min,
            ReduceOp::LogSumExp => unreachable!("LogSumExp accumulates in `LogSumExp`"),
        }
    }
}

/// The running `log(sum(exp(x)))` of [`ReduceOp::LogSumExp`], online: `sum` is relative to
/// `max`, the largest finite element so far, and is rescaled when a larger one arrives.
#[derive(Clone, Copy)]
struct LogSumExp {
    max: f64,
    sum: f64,
    nan: bool,
    infinite: bool,
}

impl LogSumExp {
    const EMPTY: LogSumExp = LogSumExp {
        max: f64::NEG_INFINITY,
        sum: 0.0,
        nan: false,
        infinite: false,
    };
    #[inline(always)]
    fn push(&mut self, v: f64) {
        if v.is_nan() {
            self.nan = true;
        } else if v == f64::INFINITY {
            self.infinite = true;
        } else if v == f64::NEG_INFINITY {
            // exp(-inf) = 0.
        } else if v > self.max {
            self.sum = self.sum * (self.max - v).exp() + 1.0;
            self.max = v;
        } else {
            self.sum += (v - self.max).exp();
        }
    }
    fn merge(self, o: LogSumExp) -> LogSumExp {
        let max = self.max.max(o.max);
        let scaled = |p: LogSumExp| match p.max == f64::NEG_INFINITY {
            true => 0.0,
            false => p.sum * (p.max - max).exp(),
        };
        LogSumExp {
            max,
            sum: scaled(self) + scaled(o),
            nan: self.nan | o.nan,
            infinite: self.infinite | o.infinite,
        }
    }
    fn finish(self) -> f64 {
        if self.nan {
            f64::NAN
        } else if self.infinite {
            f64::INFINITY
        } else if self.max == f64::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            self.max + self.sum.ln()
        }
    }
}

/// A running reduction of one output's elements: started [`Partial::EMPTY`], fed a range of
/// them by [`Partial::over`], and partial results of consecutive ranges merged in order.
trait Partial: Copy + Send {
    const EMPTY: Self;
    /// Elements `start..end` of the reduction walked by `walk` from `base`.
    fn over(x: Src, walk: &Walk<1>, base: isize, start: usize, end: usize) -> Self;
    fn merge(self, later: Self) -> Self;
}

impl Partial for Acc {
    const EMPTY: Acc = Acc::EMPTY;
    fn over(x: Src, walk: &Walk<1>, base: isize, start: usize, end: usize) -> Acc {
        let mut acc = Acc::EMPTY;
        let wide = x.dtype == hal::DType::F64;
        walk.runs(start, end, |_, [o], [s], len| {
            for j in 0..len as isize {
                // SAFETY: the view was checked to lie inside the buffer.
                unsafe {
                    if wide {
                        acc.push_wide(x.load_f64(base + o + j * s))
                    } else {
                        acc.push(x.load(base + o + j * s))
                    }
                }
            }
        });
        acc
    }
    fn merge(self, later: Acc) -> Acc {
        Acc::merge(self, later)
    }
}

impl Partial for LogSumExp {
    const EMPTY: LogSumExp = LogSumExp::EMPTY;
    fn over(x: Src, walk: &Walk<1>, base: isize, start: usize, end: usize) -> LogSumExp {
        let mut acc = LogSumExp::EMPTY;
        walk.runs(start, end, |_, [o], [s], len| {
            for j in 0..len as isize {
                // SAFETY: the view was checked to lie inside the buffer.
                acc.push(unsafe { x.load_f64(base + o + j * s) });
            }
        });
        acc
    }
    fn merge(self, later: LogSumExp) -> LogSumExp {
        LogSumExp::merge(self, later)
    }
}

/// Reduces each output's `count` (at least one) elements into `P` and stores `finish` of it:
/// with many outputs, threads take disjoint output ranges; with few, each output's reduction
/// is split into fixed chunks whose partials are merged in chunk order, so the result does not
/// depend on the thread count.
fn store_per_output<P: Partial>(
    x: Src,
    red_walk: &Walk<1>,
    count: usize,
    (out, out_walk): (Dst, &Walk<2>),
    finish: impl Fn(P) -> f64 + Sync,
) {
    let n_out = out_walk.numel();
    if n_out >= 2 * rayon::current_num_threads() || count <= CHUNK {
        out_walk.par_runs(|_, [o, k], [so, sk], len| {
            for j in 0..len as isize {
                let acc = P::over(x, red_walk, k + j * sk, 0, count);
                // SAFETY: output view checked (validate::reduce); disjoint positions per thread.
                unsafe { out.store_f64(o + j * so, finish(acc)) };
            }
        });
        return;
    }
    out_walk.runs(0, n_out, |_, [o, k], [so, sk], len| {
        for j in 0..len as isize {
            let base = k + j * sk;
            let partials: Vec<P> = (0..count.div_ceil(CHUNK))
                .into_par_iter()
                .map(|c| P::over(x, red_walk, base, c * CHUNK, ((c + 1) * CHUNK).min(count)))
                .collect();
            let acc = partials.into_iter().fold(P::EMPTY, P::merge);
            // SAFETY: output view checked (validate::reduce); this thread alone stores.
            unsafe { out.store_f64(o + j * so, finish(acc)) };
        }
    });
}

pub(crate) fn reduce(op: ReduceOp, x: Src, xl: &Layout, axes: &[usize], out: Dst, ol: &Layout) {
    let (kept, red) = split(xl, axes);
    let red_walk = Walk::new(&red.shape, [&red]);
    let count = red_walk.numel();
    if count == 0 {
        // An empty reduction: `x` holds no elements, so validation bounded none of its
        // strides (a hostile view's may overflow an offset), and none is read. The outputs
        // are the empty reduction's, walked alone.
        let value = match op {
            ReduceOp::LogSumExp => LogSumExp::EMPTY.finish(),
            _ => Acc::EMPTY.finish(op, 0),
        };
        Walk::new(&ol.shape, [ol]).par_runs(|_, [o], [so], len| {
            for j in 0..len as isize {
                // SAFETY: output view checked (validate::reduce); disjoint positions per thread.
                unsafe { out.store_f64(o + j * so, value) };
            }
        });
        return;
    }
    let out_walk = Walk::new(&ol.shape, [ol, &kept]);
    if op == ReduceOp::LogSumExp {
        return store_per_output(x, &red_walk, count, (out, &out_walk), LogSumExp::finish);
    }
    // Sums along a strided axis (a bias gradient: [batch, features] summed over the batch):
    // blocks of neighbouring outputs accumulate together, row after row, so the reads are
    // contiguous. Each output still adds its elements in the same order, so the bits match
    // the one-output-at-a-time loop below.
    let sum_like = matches!(op, ReduceOp::Sum | ReduceOp::Mean);
    let inner_reduced_stride = red.strides.last().copied().unwrap_or(1);
    if sum_like && x.dtype == hal::DType::F32 && inner_reduced_stride.abs() > 1 {
        const BLOCK: usize = 64;
        out_walk.par_runs(|_, [o, k], [so, sk], len| {
            let xs = x.as_f32();
            let mut j0 = 0;
            while j0 < len {
                let width = BLOCK.min(len - j0);
                let mut sums = [0f64; BLOCK];
                let first = k + j0 as isize * sk;
                red_walk.runs(0, count, |_, [r], [rs], rlen| {
                    for i in 0..rlen as isize {
                        let row = first + r + i * rs;
                        for (jj, sum) in sums[..width].iter_mut().enumerate() {
                            // SAFETY: the view was checked to lie inside the buffer.
                            *sum += unsafe { *xs.offset(row + jj as isize * sk) } as f64;
                        }
                    }
                });
                for (jj, &sum) in sums[..width].iter().enumerate() {
                    let acc = Acc { sum, ..Acc::EMPTY };
                    // SAFETY: output view checked; disjoint positions per thread.
                    unsafe { out.store_f64(o + (j0 + jj) as isize * so, acc.finish(op, count)) };
                }
                j0 += width;
            }
        });
        return;
    }
    store_per_output(x, &red_walk, count, (out, &out_walk), |acc: Acc| {
        acc.finish(op, count)
    });
}

pub(crate) fn arg_reduce(op: ArgReduceOp, x: Src, xl: &Layout, axis: usize, out: Dst, ol: &Layout) {
    let (kept, _) = split(xl, &[axis]);
    let (len_axis, stride) = (xl.shape[axis], xl.strides[axis]);
    let out_walk = Walk::new(&ol.shape, [ol, &kept]);
    out_walk.par_runs(|_, [o, k], [so, sk], len| {
        for j in 0..len as isize {
            let base = k + j * sk;
            if x.dtype == hal::DType::F32 && stride == 1 {
                // SAFETY: the view was checked: `len_axis` elements from `base` lie inside.
                let row = unsafe { std::slice::from_raw_parts(x.as_f32().offset(base), len_axis) };
                unsafe { *out.as_u32().offset(o + j * so) = arg_extreme_f32(op, row) as u32 };
                continue;
            }
            let mut best = 0usize;
            // SAFETY: the view was checked; len_axis >= 1 was checked by the caller.
            // (As f64: exact for every dtype, so f64 values that round alike stay apart.)
            let mut best_v = unsafe { x.load_f64(base) };
            if !best_v.is_nan() {
                for i in 1..len_axis {
                    let v = unsafe { x.load_f64(base + i as isize * stride) };
                    let better = v.is_nan()
                        || match op {
                            ArgReduceOp::ArgMax => v > best_v,
                            ArgReduceOp::ArgMin => v < best_v,
                        };
                    if better {
                        best = i;
                        best_v = v;
                        if v.is_nan() {
                            break;
                        }
                    }
                }
            }
            // SAFETY: validate::arg_reduce proved the output view inside its buffer and free of
            // self-overlap; each thread stores its own runs.
            unsafe { *out.as_u32().offset(o + j * so) = best as u32 };
        }
    });
}

/// `arg_reduce` along a contiguous f32 row: the first NaN's index if there is one, else the
/// lowest index of the extreme value. Passes that vectorise (the extreme, then its first
/// position) instead of one loop whose every step depends on the last.
fn arg_extreme_f32(op: ArgReduceOp, row: &[f32]) -> usize {
    if let Some(i) = row.iter().position(|v| v.is_nan()) {
        return i;
    }
    let extreme = match op {
        ArgReduceOp::ArgMin => row.iter().fold(f32::INFINITY, |a, &v| a.min(v)),
        ArgReduceOp::ArgMax => row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)),
    };
    // -0.0 and 0.0 compare equal, as in the strict comparison of the general loop, which
    // keeps the first of them.
    row.iter().position(|&v| v == extreme).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use crate::CpuBackend;
    use hal::{Backend, BackendExt, DType, Layout, ReduceOp, View};

    /// Sums along a strided axis take the blocked path; each output must still be the f64 sum
    /// of its elements in index order, rounded once, bit for bit (the CPU reference's
    /// determinism). Checked on a row-major matrix summed over rows, on a transposed view
    /// summed over its (contiguous) second axis, and on a sliced view, with the mean as well.
    #[test]
    fn strided_sums_add_in_index_order() {
        let (rows, cols) = (37usize, 301usize);
        let range = hal::Distribution::Uniform {
            low: -500.0,
            high: 500.0,
        };
        let values: Vec<f32> = (0..(rows * cols) as u64)
            .map(|i| hal::random::random_value(range, 0x9e37_79b9_7f4a_7c15, i))
            .collect();
        let b = CpuBackend::new();
        let x = b.upload(&values).unwrap();
        let expected = |col_range: std::ops::Range<usize>, mean: bool| -> Vec<f32> {
            col_range
                .map(|c| {
                    let s: f64 = (0..rows).map(|r| values[r * cols + c] as f64).sum();
                    (if mean { s / rows as f64 } else { s }) as f32
                })
                .collect()
        };
        let lx = Layout::contiguous(&[rows, cols]);
        let sliced = Layout {
            shape: vec![rows, 245],
            strides: vec![cols as isize, 1],
            offset: 5,
        };
        // [rows, cols] over axis 0; the transposed view [cols, rows] over axis 1 (the same
        // sums); columns 5..250 only (an offset view).
        let cases = [
            (lx.clone(), 0, vec![1, cols], 0..cols),
            (lx.transpose(0, 1).unwrap(), 1, vec![cols, 1], 0..cols),
            (sliced, 0, vec![1, 245], 5..250),
        ];
        for (op, mean) in [(ReduceOp::Sum, false), (ReduceOp::Mean, true)] {
            for (layout, axis, out_shape, columns) in cases.iter().cloned() {
                let out = b.alloc(DType::F32, columns.len()).unwrap();
                b.reduce(
                    op,
                    View::new(&x, &layout),
                    &[axis],
                    View::new(&out, &Layout::contiguous(&out_shape)),
                )
                .unwrap();
                let got: Vec<f32> = b.read(&out).unwrap();
                assert!(
                    got.iter()
                        .zip(expected(columns, mean))
                        .all(|(a, e)| a.to_bits() == e.to_bits())
                );
            }
        }
    }
}
