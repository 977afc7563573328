//! The checks every primitive's operands pass, whatever the primitive.

use crate::{DType, DeviceBuffer, Error, Layout, Result, View};

/// The view lies inside its buffer ([`Layout::check_fits`]: checked arithmetic throughout)
/// and within what its backend can index ([`DeviceBuffer::index_limit`]).
pub fn fits<B: DeviceBuffer>(op: &'static str, v: View<'_, B>) -> Result<()> {
    v.layout.check_fits(op, v.buffer.len())?;
    let limit = v.buffer.index_limit();
    if limit < isize::MAX as usize {
        let l = v.layout;
        let too_large = l.numel() > limit
            || l.offset > limit
            || l.shape.iter().any(|&d| d > limit)
            || l.strides.iter().any(|&s| s.unsigned_abs() > limit);
        if too_large {
            return Err(Error::Unsupported {
                op,
                detail: format!(
                    "the view {l:?} has more elements, or a larger offset or stride, than this \
                     backend's kernels index ({limit})"
                ),
            });
        }
    }
    Ok(())
}

/// An output view: it lies inside its buffer and reaches each of its elements once
/// ([`Layout::check_no_self_overlap`]), so the threads of one operation write disjoint memory.
pub fn output<B: DeviceBuffer>(op: &'static str, v: View<'_, B>) -> Result<()> {
    fits(op, v)?;
    v.layout.check_no_self_overlap(op)
}

/// An input that an output must not overlap: a different buffer, addresses outside the
/// output's range, or interleaved slices that provably never meet (`interleaved_apart`:
/// the q, k and v columns of one packed buffer). With `in_place`, a view identical to the
/// output's is allowed too (an elementwise primitive reads each element before it writes it).
pub fn disjoint<B: DeviceBuffer>(
    op: &'static str,
    input: View<'_, B>,
    out: View<'_, B>,
    in_place: bool,
) -> Result<()> {
    if !input.buffer.same_memory(out.buffer) || (in_place && input.layout == out.layout) {
        return Ok(());
    }
    let ranges = (
        input.layout.checked_address_range(op)?,
        out.layout.checked_address_range(op)?,
    );
    match ranges {
        (Some((ilo, ihi)), Some((olo, ohi)))
            if ilo <= ohi && olo <= ihi && !interleaved_apart(input.layout, out.layout) =>
        {
            Err(Error::InvalidArgument {
                op,
                detail: format!(
                    "the output view {:?} overlaps an input view {:?} of the same buffer{}",
                    out.layout,
                    input.layout,
                    if in_place {
                        " (only an identical view may be updated in place)"
                    } else {
                        ""
                    }
                ),
            })
        }
        _ => Ok(()),
    }
}

pub fn same_shape(op: &'static str, expected: &[usize], got: &[usize], what: &str) -> Result<()> {
    if expected != got {
        return Err(Error::ShapeMismatch {
            op,
            expected: expected.to_vec(),
            got: got.to_vec(),
            detail: what.to_string(),
        });
    }
    Ok(())
}

pub fn float(op: &'static str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            detail: " (a float dtype is required)".into(),
        });
    }
    Ok(())
}

/// Refuses `op` where any of `dtypes` is `f64` and the backend does not run `op` in `f64`;
/// `reason` says why (it ends the error's detail).
pub fn f64_offered(
    op: &'static str,
    dtypes: &[DType],
    offered: bool,
    reason: impl FnOnce() -> String,
) -> Result<()> {
    if !offered && dtypes.contains(&DType::F64) {
        return Err(Error::UnsupportedDType {
            op,
            dtype: DType::F64,
            detail: format!(" here: {}", reason()),
        });
    }
    Ok(())
}

pub fn dtype_is(op: &'static str, expected: DType, got: DType) -> Result<()> {
    if expected != got {
        return Err(Error::DTypeMismatch { op, expected, got });
    }
    Ok(())
}

pub fn index_dtype(op: &'static str, dtype: DType) -> Result<()> {
    if !matches!(dtype, DType::U32 | DType::I32) {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            detail: " (indices are u32 or i32)".into(),
        });
    }
    Ok(())
}

pub fn rank<B: DeviceBuffer>(op: &'static str, v: View<'_, B>, r: usize, what: &str) -> Result<()> {
    if v.layout.rank() != r {
        return Err(Error::InvalidArgument {
            op,
            detail: format!("{what} must have rank {r}, got shape {:?}", v.layout.shape),
        });
    }
    Ok(())
}

/// `v`'s layout broadcast to `shape` (after checking it fits its buffer).
pub fn broadcast<B: DeviceBuffer>(
    op: &'static str,
    v: View<'_, B>,
    shape: &[usize],
) -> Result<Layout> {
    fits(op, v)?;
    v.layout
        .broadcast_to(shape)
        .map_err(|_| Error::ShapeMismatch {
            op,
            expected: shape.to_vec(),
            got: v.layout.shape.clone(),
            detail: "operand cannot be broadcast to the output shape".into(),
        })
}

/// Whether two views of one shape and strides (none negative) provably share no element,
/// although their address ranges overlap: some period `P` (a stride that every larger stride
/// is a multiple of) exceeds the span `S` of the dimensions with smaller strides, so each
/// view's addresses modulo `P` lie in one window `[offset mod P, + S)`, and the two windows
/// are apart. Sound, not complete: `false` only means "not proved".
pub(crate) fn interleaved_apart(a: &Layout, b: &Layout) -> bool {
    if a.shape != b.shape || a.strides != b.strides || a.strides.iter().any(|&s| s < 0) {
        return false;
    }
    let mut dims: Vec<(usize, usize)> = a
        .shape
        .iter()
        .zip(&a.strides)
        .filter(|&(&n, _)| n > 1)
        .map(|(&n, &s)| (s as usize, n))
        .collect();
    dims.sort_unstable();
    // Each split: dimensions [..m] inside the window, [m..] stepping by multiples of P.
    let mut span = 1usize;
    for m in 0..dims.len() {
        let period = dims[m].0;
        let periodic = period > 0 && dims[m..].iter().all(|&(s, _)| s % period == 0);
        if periodic && span <= period {
            let (ra, rb) = (a.offset % period, b.offset % period);
            let gap = |x: usize, y: usize| (y + period - x) % period;
            if gap(ra, rb) >= span && gap(rb, ra) >= span {
                return true;
            }
        }
        let Some(reach) = (dims[m].1 - 1)
            .checked_mul(dims[m].0)
            .and_then(|r| r.checked_add(span))
        else {
            return false;
        };
        span = reach;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::interleaved_apart;
    use crate::Layout;

    #[test]
    fn packed_columns_are_apart_and_overlaps_are_not() {
        // q, k, v heads [b, h, t, d] of one [b, t, 3 h d] buffer.
        let packed = Layout::contiguous(&[2, 5, 3 * 4 * 8]);
        let heads = |i: usize| {
            packed
                .narrow(2, i * 32, 32)
                .and_then(|l| l.reshape(&[2, 5, 4, 8]))
                .and_then(|l| l.permute(&[0, 2, 1, 3]))
                .unwrap()
        };
        let (q, k, v) = (heads(0), heads(1), heads(2));
        assert!(q.address_range().unwrap().1 > k.address_range().unwrap().0);
        assert!(
            interleaved_apart(&q, &k) && interleaved_apart(&k, &v) && interleaved_apart(&v, &q)
        );
        // Columns 0..32 and 16..48 share elements.
        let half = packed
            .narrow(2, 16, 32)
            .and_then(|l| l.reshape(&[2, 5, 4, 8]))
            .and_then(|l| l.permute(&[0, 2, 1, 3]))
            .unwrap();
        assert!(!interleaved_apart(&q, &half));
        assert!(!interleaved_apart(&q, &q));
        // Every other element against the ones between: apart; with one shared, not.
        let even = Layout::strided(&[6], &[2], 0).unwrap();
        assert!(interleaved_apart(
            &even,
            &Layout::strided(&[6], &[2], 1).unwrap()
        ));
        assert!(!interleaved_apart(
            &even,
            &Layout::strided(&[6], &[2], 2).unwrap()
        ));
    }
}
