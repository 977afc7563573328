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

/// An input that an output must not overlap: a different buffer, or addresses outside the
/// output's range. With `in_place`, a view identical to the output's is allowed too (an
/// elementwise primitive reads each element before it writes it).
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
        (Some((ilo, ihi)), Some((olo, ohi))) if ilo <= ohi && olo <= ihi => {
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
