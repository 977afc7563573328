//! Iteration over strided views: the loop nest every elementwise, indexing and reduction
//! kernel shares.
//!
//! A [`Walk`] visits the elements of a shape in row-major order, tracking the element offset of
//! `K` operands at once. Adjacent dimensions that are contiguous for every operand are merged
//! first, so a contiguous tensor of any rank becomes one long run. Callers get *runs*: a start
//! offset per operand, a stride per operand and a length, so inner loops are tight.

// The loops index several parallel per-operand arrays by the same dimension or operand index.
#![allow(clippy::needless_range_loop)]

use hal::Layout;
use rayon::prelude::*;

/// Elements per parallel task: large enough to amortise scheduling, small enough to balance.
pub(crate) const CHUNK: usize = 1 << 15;

pub(crate) struct Walk<const K: usize> {
    shape: Vec<usize>,
    strides: [Vec<isize>; K],
    base: [isize; K],
    numel: usize,
}

impl<const K: usize> Walk<K> {
    /// `layouts` all have shape `shape` (broadcast first).
    pub fn new(shape: &[usize], layouts: [&Layout; K]) -> Self {
        // Saturating (hal::numel): a zero dimension makes 0 however large the others are.
        let numel = hal::numel(shape);
        let mut dims: Vec<(usize, [isize; K])> = Vec::new();
        for (d, &size) in shape.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let s: [isize; K] = std::array::from_fn(|k| layouts[k].strides[d]);
            if let Some((prev_size, prev)) = dims.last_mut() {
                if (0..K).all(|k| s[k].checked_mul(size as isize) == Some(prev[k])) {
                    *prev_size *= size;
                    *prev = s;
                    continue;
                }
            }
            dims.push((size, s));
        }
        if dims.is_empty() {
            dims.push((1, [0; K]));
        }
        Self {
            shape: dims.iter().map(|d| d.0).collect(),
            strides: std::array::from_fn(|k| dims.iter().map(|d| d.1[k]).collect()),
            base: std::array::from_fn(|k| layouts[k].offset as isize),
            numel,
        }
    }

    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Calls `f(linear_start, offsets, inner_strides, len)` for each run covering the
    /// row-major positions `start..end`.
    pub fn runs(
        &self,
        start: usize,
        end: usize,
        mut f: impl FnMut(usize, [isize; K], [isize; K], usize),
    ) {
        if start >= end {
            return;
        }
        let rank = self.shape.len();
        let last = rank - 1;
        let mut idx = vec![0usize; rank];
        let mut rem = start;
        for d in (0..rank).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
        }
        let mut off = self.base;
        for d in 0..rank {
            for k in 0..K {
                off[k] += idx[d] as isize * self.strides[k][d];
            }
        }
        let inner: [isize; K] = std::array::from_fn(|k| self.strides[k][last]);
        let mut pos = start;
        while pos < end {
            let len = (self.shape[last] - idx[last]).min(end - pos);
            f(pos, off, inner, len);
            pos += len;
            if pos >= end {
                break;
            }
            // Advance to the start of the next run: the inner index wraps to 0, carry upward.
            for k in 0..K {
                off[k] += (len as isize) * inner[k] - (self.shape[last] as isize) * inner[k];
            }
            idx[last] = 0;
            let mut d = last;
            loop {
                if d == 0 {
                    break;
                }
                d -= 1;
                idx[d] += 1;
                for k in 0..K {
                    off[k] += self.strides[k][d];
                }
                if idx[d] < self.shape[d] {
                    break;
                }
                for k in 0..K {
                    off[k] -= self.shape[d] as isize * self.strides[k][d];
                }
                idx[d] = 0;
            }
        }
    }

    /// [`Walk::runs`] over all positions, split across threads in chunks of [`CHUNK`].
    pub fn par_runs(&self, f: impl Fn(usize, [isize; K], [isize; K], usize) + Sync) {
        let n = self.numel;
        if n <= CHUNK {
            self.runs(0, n, &f);
            return;
        }
        (0..n.div_ceil(CHUNK)).into_par_iter().for_each(|c| {
            self.runs(c * CHUNK, ((c + 1) * CHUNK).min(n), &f);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_visit_every_offset_in_row_major_order() {
        let base = Layout::contiguous(&[3, 4, 5]);
        let views = [
            base.clone(),
            base.permute(&[2, 0, 1]).unwrap(),
            base.flip(1).unwrap().narrow(2, 1, 3).unwrap(),
        ];
        for v in &views {
            let walk = Walk::new(&v.shape, [v]);
            for (start, end) in [(0, v.numel()), (3, v.numel() - 2), (7, 8)] {
                let mut got = Vec::new();
                walk.runs(start, end, |lin, off, st, len| {
                    assert_eq!(lin, start + got.len());
                    for j in 0..len as isize {
                        got.push(off[0] + j * st[0]);
                    }
                });
                let want: Vec<isize> = (start..end)
                    .map(|p| {
                        let mut rem = p;
                        let mut idx = vec![0; v.rank()];
                        for d in (0..v.rank()).rev() {
                            idx[d] = rem % v.shape[d];
                            rem /= v.shape[d];
                        }
                        v.index_of(&idx) as isize
                    })
                    .collect();
                assert_eq!(got, want, "view {v:?} range {start}..{end}");
            }
        }
    }
}
