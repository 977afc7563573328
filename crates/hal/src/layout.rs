//! Views: a shape, strides and an offset over a buffer's elements.
//!
//! Every primitive takes its operands as a buffer plus a [`Layout`]. Movement operations
//! (permute, transpose, broadcast, narrow, flip, step, reshape where strides allow) only build a
//! new `Layout`; no data moves until a primitive reads through it.

use crate::{Error, Result};

/// A strided view of a buffer. Strides are in elements and may be zero (broadcast) or negative
/// (flip). Element `[i0, i1, ...]` lives at `offset + sum(i_k * strides[k])`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub offset: usize,
}

/// `out` and the operands' layouts with their dimensions in `out`'s memory order
/// ([`Layout::memory_order`]), for elementwise primitives, which may visit elements in any
/// order: a permuted dense output, with operands laid out alike, then walks (and vectorises)
/// as a contiguous one. The operands must have `out`'s rank (broadcast to its shape).
pub fn in_memory_order<const K: usize>(
    out: &Layout,
    operands: [&Layout; K],
) -> (Layout, [Layout; K]) {
    let order = out.memory_order();
    let permuted = |l: &Layout| l.permute(&order).expect("a permutation of the same rank");
    (permuted(out), operands.map(permuted))
}

/// Row-major strides of a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1) as isize);
    }
    strides
}

/// The number of elements of `shape` (1 for a scalar, 0 when any dimension is 0). Never wraps:
/// a shape whose count does not fit in `isize` (the most elements any buffer can hold) gives
/// `usize::MAX`, which no allocation and no [`Layout::check_fits`] accepts. Use
/// [`checked_numel`] to tell that case apart.
pub fn numel(shape: &[usize]) -> usize {
    checked_numel(shape).unwrap_or(usize::MAX)
}

/// The number of elements of `shape`, or `None` when it exceeds `isize::MAX` (no buffer can
/// hold that many elements, and element offsets are `isize`). A shape with a zero dimension
/// has 0 elements however large its other dimensions are.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize)
}

/// [`checked_numel`] as a typed error naming `op` and the shape.
pub fn try_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    checked_numel(shape).ok_or_else(|| Error::Overflow {
        op,
        detail: format!("shape {shape:?} has more than isize::MAX elements"),
    })
}

/// The shape two operands broadcast to, by NumPy's rules (align on the right; a dimension of 1
/// stretches). Fails with [`Error::ShapeMismatch`] naming both shapes.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    op,
                    expected: a.to_vec(),
                    got: b.to_vec(),
                    detail: "shapes cannot be broadcast together".into(),
                });
            }
        };
    }
    Ok(out)
}

impl Layout {
    /// A contiguous row-major view of `shape` starting at element 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Self {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// A view with explicit strides and offset. Whether it fits a buffer is checked by the
    /// primitive that uses it ([`Layout::check_fits`]).
    pub fn strided(shape: &[usize], strides: &[isize], offset: usize) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(Error::InvalidArgument {
                op: "Layout::strided",
                detail: format!(
                    "shape {:?} has rank {} but strides {:?} have rank {}",
                    shape,
                    shape.len(),
                    strides,
                    strides.len()
                ),
            });
        }
        Ok(Self {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        })
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// True when the view is row-major contiguous (any offset). Dimensions of size 1 may have
    /// any stride.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1isize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d.min(isize::MAX as usize) as isize);
        }
        true
    }

    /// The lowest and highest element index the view touches, or `None` for an empty view,
    /// computed in checked arithmetic: `Err` names the overflow when the element count, an
    /// offset or a span does not fit in `isize` (such a view fits no buffer), or a stride is
    /// `isize::MIN` (whose magnitude is no `isize`).
    pub fn checked_address_range(&self, op: &'static str) -> Result<Option<(isize, isize)>> {
        let overflow = |what: &str| Error::Overflow {
            op,
            detail: format!("{what} of view {self:?} overflows isize"),
        };
        if self.shape.len() != self.strides.len() {
            return Err(Error::InvalidArgument {
                op,
                detail: format!(
                    "shape {:?} and strides {:?} have different ranks",
                    self.shape, self.strides
                ),
            });
        }
        if self.strides.contains(&isize::MIN) {
            // Its magnitude is no isize: a walk or a flip could not negate it.
            return Err(overflow("a stride of isize::MIN"));
        }
        // An empty view is held to the same arithmetic, counting a zero dimension as 1: a
        // backend may walk its other dimensions (the outputs of a reduction over the empty
        // one), and those addresses must be computable too, though none is read.
        let nonzero: Vec<usize> = self.shape.iter().map(|&d| d.max(1)).collect();
        try_numel(op, &nonzero)?;
        let offset = isize::try_from(self.offset).map_err(|_| overflow("the offset"))?;
        let (mut lo, mut hi) = (offset, offset);
        for (&d, &s) in nonzero.iter().zip(&self.strides) {
            // 1 <= d <= numel <= isize::MAX.
            let span = ((d - 1) as isize)
                .checked_mul(s)
                .ok_or_else(|| overflow("a dimension's span"))?;
            let bound = if span < 0 { &mut lo } else { &mut hi };
            *bound = bound
                .checked_add(span)
                .ok_or_else(|| overflow("the address range"))?;
        }
        if self.shape.contains(&0) {
            return Ok(None);
        }
        Ok(Some((lo, hi)))
    }

    /// The lowest and highest element index the view touches, or `None` for an empty view or
    /// one whose addresses overflow ([`Layout::checked_address_range`] tells them apart).
    pub fn address_range(&self) -> Option<(isize, isize)> {
        self.checked_address_range("address_range").ok().flatten()
    }

    /// Checks that every element of the view lies inside a buffer of `len` elements: the
    /// element count, the offset and every address fit in `isize` (checked, never wrapped),
    /// and the lowest and highest address lie in `0..len`. Every element address
    /// `offset + sum(i_k * strides[k])` of such a view, and every partial sum of it, lies in
    /// that range too, so a backend walking the view computes no address this did not bound.
    pub fn check_fits(&self, op: &'static str, len: usize) -> Result<()> {
        match self.checked_address_range(op)? {
            None => Ok(()),
            Some((lo, hi)) if lo >= 0 && (hi as usize) < len => Ok(()),
            Some((lo, hi)) => Err(Error::OutOfBounds {
                op,
                detail: format!(
                    "view {self:?} touches elements {lo}..={hi} of a buffer of {len} elements"
                ),
            }),
        }
    }

    /// Checks that no two elements of the view share an address, as an output's view must:
    /// the threads of one operation write disjoint elements, and a written element is written
    /// once. Sufficient test (what PyTorch's overlap check proves, and more): ordered by
    /// stride magnitude, each dimension's stride exceeds the span of all the smaller ones.
    /// A layout that is dense but not provably so this way is refused too; copy it first.
    pub fn check_no_self_overlap(&self, op: &'static str) -> Result<()> {
        if self.checked_address_range(op)?.is_none() {
            return Ok(());
        }
        let mut dims: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|&(&d, _)| d > 1)
            .map(|(&d, &s)| (s.unsigned_abs(), d))
            .collect();
        dims.sort_unstable();
        // The span of the dimensions so far: the largest address difference they reach. It
        // cannot overflow: checked_address_range bounded the whole span by isize::MAX.
        let mut span = 0usize;
        for (stride, d) in dims {
            if stride <= span {
                return Err(Error::InvalidArgument {
                    op,
                    detail: format!(
                        "the output view {self:?} reaches one element through several indices \
                         (a broadcast or overlapping view); write to a dense view and copy"
                    ),
                });
            }
            span += stride * (d - 1);
        }
        Ok(())
    }

    /// The dimension order that walks this view through memory: by descending stride
    /// magnitude, ties (and size-1 dimensions, last) in their own order; `0..rank` for a
    /// row-major view. Elementwise work may visit elements in any order; walking every operand
    /// in the output's memory order turns a permuted dense output (the NCHW view of a
    /// convolution's channel-major result) into a contiguous walk.
    pub fn memory_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.rank()).collect();
        if self.is_contiguous() {
            return order;
        }
        order.sort_by_key(|&d| {
            let magnitude = if self.shape[d] == 1 {
                0
            } else {
                self.strides[d].unsigned_abs()
            };
            std::cmp::Reverse(magnitude)
        });
        order
    }

    /// Reorders the dimensions: dimension `i` of the result is dimension `perm[i]` of `self`.
    pub fn permute(&self, perm: &[usize]) -> Result<Self> {
        let mut seen = vec![false; self.rank()];
        if perm.len() != self.rank()
            || perm
                .iter()
                .any(|&p| p >= self.rank() || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::InvalidArgument {
                op: "permute",
                detail: format!("{perm:?} is not a permutation of 0..{}", self.rank()),
            });
        }
        Ok(Self {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    /// Swaps two dimensions.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self> {
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        if a >= self.rank() || b >= self.rank() {
            return Err(self.axis_error("transpose", a.max(b)));
        }
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Broadcasts the view to `shape` (NumPy rules): new leading dimensions and stretched
    /// size-1 dimensions get stride 0.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Self> {
        let target = broadcast_shapes("broadcast_to", &self.shape, shape)?;
        if target != shape {
            return Err(Error::ShapeMismatch {
                op: "broadcast_to",
                expected: shape.to_vec(),
                got: self.shape.clone(),
                detail: "the view cannot be broadcast to the requested shape".into(),
            });
        }
        let pad = shape.len() - self.rank();
        let strides = (0..shape.len())
            .map(|i| {
                if i < pad || self.shape[i - pad] != shape[i] {
                    0
                } else {
                    self.strides[i - pad]
                }
            })
            .collect();
        Ok(Self {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Keeps `len` elements of dimension `axis` starting at `start`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        if axis >= self.rank() {
            return Err(self.axis_error("narrow", axis));
        }
        if start
            .checked_add(len)
            .is_none_or(|end| end > self.shape[axis])
        {
            return Err(Error::InvalidArgument {
                op: "narrow",
                detail: format!(
                    "range {start}..{} exceeds dimension {axis} of size {}",
                    start.saturating_add(len),
                    self.shape[axis]
                ),
            });
        }
        let mut out = self.clone();
        if len > 0 {
            out.offset = self.moved_offset("narrow", start, self.strides[axis])?;
        }
        out.shape[axis] = len;
        Ok(out)
    }

    /// Reverses dimension `axis`.
    pub fn flip(&self, axis: usize) -> Result<Self> {
        if axis >= self.rank() {
            return Err(self.axis_error("flip", axis));
        }
        let mut out = self.clone();
        if self.shape[axis] > 0 {
            out.offset = self.moved_offset("flip", self.shape[axis] - 1, self.strides[axis])?;
        }
        out.strides[axis] = self.strides[axis]
            .checked_neg()
            .ok_or_else(|| Error::Overflow {
                op: "flip",
                detail: format!("stride {} cannot be negated", self.strides[axis]),
            })?;
        Ok(out)
    }

    /// Keeps every `step`-th element of dimension `axis` (like `x[::step]`).
    pub fn step(&self, axis: usize, step: usize) -> Result<Self> {
        if axis >= self.rank() {
            return Err(self.axis_error("step", axis));
        }
        if step == 0 {
            return Err(Error::InvalidArgument {
                op: "step",
                detail: "step must be at least 1".into(),
            });
        }
        let mut out = self.clone();
        out.shape[axis] = self.shape[axis].div_ceil(step);
        out.strides[axis] = isize::try_from(step)
            .ok()
            .and_then(|step| self.strides[axis].checked_mul(step))
            .ok_or_else(|| Error::Overflow {
                op: "step",
                detail: format!("stride {} times step {step}", self.strides[axis]),
            })?;
        Ok(out)
    }

    /// A new shape over the same elements, without a copy: a contiguous view always, a strided
    /// one where each group of dimensions that the new shape splits or merges is contiguous
    /// within itself (a narrowed last axis split into heads, say; PyTorch's `view` rule).
    /// Otherwise this fails and the caller makes the view contiguous first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        if numel(shape) != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                expected: self.shape.clone(),
                got: shape.to_vec(),
                detail: "reshape must keep the number of elements".into(),
            });
        }
        if !self.is_contiguous() {
            return match self.strides_for(shape) {
                Some(strides) => Ok(Self {
                    shape: shape.to_vec(),
                    strides,
                    offset: self.offset,
                }),
                None => Err(Error::InvalidArgument {
                    op: "reshape",
                    detail: format!("view {self:?} cannot take shape {shape:?} without a copy"),
                }),
            };
        }
        Ok(Self {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: self.offset,
        })
    }

    /// Strides that lay `shape` (of this view's element count) over this view's elements in
    /// row-major order, where some do. The old dimensions fall into chunks, each a run whose
    /// strides nest (`strides[d] == shape[d + 1] * strides[d + 1]`); a new dimension may not
    /// straddle two chunks. Size-1 dimensions take any stride. (ATen's `computeStride`.)
    fn strides_for(&self, shape: &[usize]) -> Option<Vec<isize>> {
        let mut out = vec![0isize; shape.len()];
        if self.numel() == 0 {
            return Some(contiguous_strides(shape));
        }
        let (old, olds) = (&self.shape, &self.strides);
        let mut view_d = shape.len();
        let mut chunk_stride = *olds.last()?;
        let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
        for d in (0..old.len()).rev() {
            tensor_numel = tensor_numel.checked_mul(old[d])?;
            let chunk_ends = d == 0
                || (old[d - 1] != 1
                    && olds[d - 1] != (tensor_numel as isize).checked_mul(chunk_stride)?);
            if !chunk_ends {
                continue;
            }
            while view_d > 0 && (view_numel < tensor_numel || shape[view_d - 1] == 1) {
                out[view_d - 1] = (view_numel as isize).checked_mul(chunk_stride)?;
                view_numel = view_numel.checked_mul(shape[view_d - 1])?;
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if d > 0 {
                chunk_stride = olds[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
        (view_d == 0).then_some(out)
    }

    /// Fixes dimension `axis` at `index`, dropping it (one matrix of a batch).
    pub fn select(&self, axis: usize, index: usize) -> Result<Self> {
        let mut out = self.narrow(axis, index, 1)?;
        out.shape.remove(axis);
        out.strides.remove(axis);
        Ok(out)
    }

    /// Inserts a dimension of size 1 at `axis`.
    pub fn unsqueeze(&self, axis: usize) -> Result<Self> {
        if axis > self.rank() {
            return Err(self.axis_error("unsqueeze", axis));
        }
        let mut out = self.clone();
        out.shape.insert(axis, 1);
        out.strides.insert(axis, 0);
        Ok(out)
    }

    /// The element index of multi-index `idx` (no bounds check beyond debug assertions).
    pub fn index_of(&self, idx: &[usize]) -> usize {
        debug_assert_eq!(idx.len(), self.rank());
        let mut at = self.offset as isize;
        for (&i, &s) in idx.iter().zip(&self.strides) {
            at = at.wrapping_add((i as isize).wrapping_mul(s));
        }
        at as usize
    }

    /// `offset + index * stride` as a new offset, checked: it must not overflow or fall below 0.
    fn moved_offset(&self, op: &'static str, index: usize, stride: isize) -> Result<usize> {
        isize::try_from(index)
            .ok()
            .and_then(|i| i.checked_mul(stride))
            .and_then(|delta| isize::try_from(self.offset).ok()?.checked_add(delta))
            .and_then(|at| usize::try_from(at).ok())
            .ok_or_else(|| Error::Overflow {
                op,
                detail: format!(
                    "offset {} moved by {index} x stride {stride} leaves 0..isize::MAX",
                    self.offset
                ),
            })
    }

    fn axis_error(&self, op: &'static str, axis: usize) -> Error {
        Error::InvalidArgument {
            op,
            detail: format!("axis {axis} is out of range for rank {}", self.rank()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_order_walks_a_permuted_dense_view_contiguously() {
        let base = Layout::contiguous(&[4, 3, 5, 1]);
        assert_eq!(base.memory_order(), vec![0, 1, 2, 3]);
        let nchw = base.permute(&[1, 0, 3, 2]).unwrap();
        let order = nchw.memory_order();
        assert_eq!(order, vec![1, 0, 3, 2]);
        assert!(nchw.permute(&order).unwrap().is_contiguous());
        let flipped = base.flip(1).unwrap().permute(&[2, 0, 1, 3]).unwrap();
        assert_eq!(flipped.memory_order(), vec![1, 2, 0, 3]);
    }

    #[test]
    fn movement_ops_are_metadata() {
        let l = Layout::contiguous(&[2, 3, 4]);
        let t = l.transpose(0, 2).unwrap();
        assert_eq!(t.shape, vec![4, 3, 2]);
        assert_eq!(t.strides, vec![1, 4, 12]);
        assert!(!t.is_contiguous());
        let f = l.flip(1).unwrap();
        assert_eq!(f.index_of(&[0, 0, 0]), 8);
        assert_eq!(f.address_range(), Some((0, 23)));
        let n = l.narrow(2, 1, 2).unwrap();
        assert_eq!(n.index_of(&[1, 2, 1]), 12 + 8 + 2);
        let b = Layout::contiguous(&[3, 1])
            .broadcast_to(&[2, 3, 5])
            .unwrap();
        assert_eq!(b.strides, vec![0, 1, 0]);
        assert!(Layout::contiguous(&[3, 2]).broadcast_to(&[3, 3]).is_err());
        assert!(t.reshape(&[24]).is_err());
        // A narrowed last axis splits into heads as a view; merging across the cut cannot.
        let qkv = Layout::contiguous(&[2, 5, 12]).narrow(2, 4, 4).unwrap();
        let heads = qkv.reshape(&[2, 5, 2, 2]).unwrap();
        assert_eq!(
            (heads.strides.clone(), heads.offset),
            (vec![60, 12, 2, 1], 4)
        );
        assert_eq!(heads.index_of(&[1, 3, 1, 0]), 4 + 60 + 36 + 2);
        assert!(qkv.reshape(&[10, 4]).is_ok());
        assert!(qkv.reshape(&[2, 20]).is_err());
        // Size-1 dimensions come and go anywhere.
        let unit = t.reshape(&[4, 1, 3, 2, 1]).unwrap();
        assert_eq!(unit.strides[0], 1);
        assert_eq!((unit.strides[2], unit.strides[3]), (4, 12));
        assert_eq!(l.step(2, 3).unwrap().shape, vec![2, 3, 2]);
    }

    #[test]
    fn movement_arithmetic_never_wraps() {
        let l = Layout::contiguous(&[4, 8]);
        assert!(l.narrow(1, usize::MAX, 2).is_err());
        assert!(l.narrow(1, 3, usize::MAX).is_err());
        let huge = Layout::strided(&[4], &[isize::MAX / 2], 0).unwrap();
        assert!(matches!(huge.flip(0), Err(Error::Overflow { .. })));
        assert!(matches!(huge.step(0, 4), Err(Error::Overflow { .. })));
        let wrapped = Layout::contiguous(&[(1 << 62) + 1, 4]);
        assert!(matches!(
            wrapped.check_fits("t", 4),
            Err(Error::Overflow { .. })
        ));
        assert_eq!(numel(&[(1 << 62) + 1, 4]), usize::MAX, "saturates");
        assert_eq!(checked_numel(&[1 << 32, 1 << 32]), None);
        assert_eq!(checked_numel(&[usize::MAX, 0]), Some(0));
        let min = Layout::strided(&[1], &[isize::MIN], 0).unwrap();
        assert!(min.check_fits("t", 4).is_err());
        let overlapping = Layout::strided(&[3, 2], &[1, 1], 0).unwrap();
        assert!(overlapping.check_no_self_overlap("t").is_err());
        assert!(
            Layout::contiguous(&[3, 2])
                .check_no_self_overlap("t")
                .is_ok()
        );
        let transposed = Layout::contiguous(&[3, 2]).transpose(0, 1).unwrap();
        assert!(transposed.check_no_self_overlap("t").is_ok());
        let broadcast = Layout::contiguous(&[3]).broadcast_to(&[2, 3]).unwrap();
        assert!(broadcast.check_no_self_overlap("t").is_err());
    }

    #[test]
    fn fits_detects_out_of_range_views() {
        let l = Layout::strided(&[4], &[3], 2).unwrap();
        assert!(l.check_fits("t", 11).is_err());
        assert!(l.check_fits("t", 12).is_ok());
        assert!(Layout::contiguous(&[0, 5]).check_fits("t", 0).is_ok());
    }
}
