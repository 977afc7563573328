//! Reductions along axes, and argmax / argmin along one axis.
//!
//! The input view is split into the kept dimensions (one output element each) and the reduced
//! dimensions. With many outputs, threads take disjoint output ranges; with few, each output's
//! reduction is split into fixed-size chunks whose partial results are combined in chunk order,
//! so the result does not depend on the thread count. Sums accumulate in `f64`.

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
    max: f32,
    min: f32,
    nan: bool,
}

impl Acc {
    const EMPTY: Acc = Acc {
        sum: 0.0,
        max: f32::NEG_INFINITY,
        min: f32::INFINITY,
        nan: false,
    };
    #[inline(always)]
    fn push(&mut self, v: f32) {
        self.sum += v as f64;
        self.nan |= v.is_nan();
        self.max = self.max.max(v);
        self.min = self.min.min(v);
    }
    fn merge(mut self, o: Acc) -> Acc {
        self.sum += o.sum;
        self.nan |= o.nan;
        self.max = self.max.max(o.max);
        self.min = self.min.min(o.min);
        self
    }
    fn finish(self, op: ReduceOp, count: usize) -> f32 {
        match op {
            ReduceOp::Sum => self.sum as f32,
            ReduceOp::Mean => (self.sum / count as f64) as f32,
            ReduceOp::Max if self.nan => f32::NAN,
            ReduceOp::Min if self.nan => f32::NAN,
            ReduceOp::Max => self.max,
            ReduceOp::Min => self.min,
        }
    }
}

fn accumulate(x: Src, walk: &Walk<1>, base: isize, start: usize, end: usize) -> Acc {
    let mut acc = Acc::EMPTY;
    walk.runs(start, end, |_, [o], [s], len| {
        for j in 0..len as isize {
            // SAFETY: the view was checked to lie inside the buffer.
            acc.push(unsafe { x.load(base + o + j * s) });
        }
    });
    acc
}

pub(crate) fn reduce(op: ReduceOp, x: Src, xl: &Layout, axes: &[usize], out: Dst, ol: &Layout) {
    let (kept, red) = split(xl, axes);
    let red_walk = Walk::new(&red.shape, [&red]);
    let count = red_walk.numel();
    let out_walk = Walk::new(&ol.shape, [ol, &kept]);
    let n_out = out_walk.numel();
    if n_out >= 2 * rayon::current_num_threads() || count <= CHUNK {
        out_walk.par_runs(|_, [o, k], [so, sk], len| {
            for j in 0..len as isize {
                let acc = accumulate(x, &red_walk, k + j * sk, 0, count);
                // SAFETY: output view checked; disjoint positions per thread.
                unsafe { out.store(o + j * so, acc.finish(op, count)) };
            }
        });
    } else {
        out_walk.runs(0, n_out, |_, [o, k], [so, sk], len| {
            for j in 0..len as isize {
                let base = k + j * sk;
                let partials: Vec<Acc> = (0..count.div_ceil(CHUNK))
                    .into_par_iter()
                    .map(|c| {
                        accumulate(x, &red_walk, base, c * CHUNK, ((c + 1) * CHUNK).min(count))
                    })
                    .collect();
                let acc = partials.into_iter().fold(Acc::EMPTY, Acc::merge);
                unsafe { out.store(o + j * so, acc.finish(op, count)) };
            }
        });
    }
}

pub(crate) fn arg_reduce(op: ArgReduceOp, x: Src, xl: &Layout, axis: usize, out: Dst, ol: &Layout) {
    let (kept, _) = split(xl, &[axis]);
    let (len_axis, stride) = (xl.shape[axis], xl.strides[axis]);
    let out_walk = Walk::new(&ol.shape, [ol, &kept]);
    out_walk.par_runs(|_, [o, k], [so, sk], len| {
        for j in 0..len as isize {
            let base = k + j * sk;
            let mut best = 0usize;
            // SAFETY: the view was checked; len_axis >= 1 was checked by the caller.
            let mut best_v = unsafe { x.load(base) };
            if !best_v.is_nan() {
                for i in 1..len_axis {
                    let v = unsafe { x.load(base + i as isize * stride) };
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
            unsafe { *out.as_u32().offset(o + j * so) = best as u32 };
        }
    });
}
