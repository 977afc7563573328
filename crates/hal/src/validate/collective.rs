//! The collectives' operands ([`crate::collective`]).

use super::{dtype_is, fits};
use crate::{DType, DeviceBuffer, Error, Result, View};

/// Which collective, with what it needs to check its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectiveKind {
    AllReduce,
    Broadcast { root: usize },
    AllGather,
    ReduceScatter,
}

impl CollectiveKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::Broadcast { .. } => "broadcast",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
        }
    }
}

/// Checks one rank's operands of a collective over `size` ranks and returns the element
/// counts `(send, recv)`. Both views contiguous and inside their buffers, one dtype of the
/// six the collectives carry, counts in the ratio the collective needs, `root` a rank, and
/// the two apart unless in one of the in-place forms.
pub fn collective<B: DeviceBuffer>(
    kind: CollectiveKind,
    rank: usize,
    size: usize,
    send: View<'_, B>,
    recv: View<'_, B>,
) -> Result<(usize, usize)> {
    let op = kind.name();
    if size == 0 || rank >= size {
        return Err(Error::InvalidArgument {
            op,
            detail: format!("rank {rank} of a group of {size}"),
        });
    }
    for (what, v) in [("send", send), ("recv", recv)] {
        fits(op, v)?;
        if !v.layout.is_contiguous() {
            return Err(Error::InvalidArgument {
                op,
                detail: format!("the {what} view {:?} is not contiguous", v.layout),
            });
        }
    }
    dtype_is(op, send.dtype(), recv.dtype())?;
    if !matches!(
        send.dtype(),
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::I32 | DType::U32
    ) {
        return Err(Error::UnsupportedDType {
            op,
            dtype: send.dtype(),
            detail: " by the collectives".into(),
        });
    }
    let (n_send, n_recv) = (send.layout.numel(), recv.layout.numel());
    let overflow = || Error::Overflow {
        op,
        detail: format!("{size} ranks x the part's elements"),
    };
    // The offset of this rank's part inside the larger operand (in-place forms).
    let (expected_recv, part) = match kind {
        CollectiveKind::AllReduce => (n_send, None),
        CollectiveKind::Broadcast { root } => {
            if root >= size {
                return Err(Error::InvalidArgument {
                    op,
                    detail: format!("root {root} is not a rank of a group of {size}"),
                });
            }
            (n_send, None)
        }
        CollectiveKind::AllGather => (
            n_send.checked_mul(size).ok_or_else(overflow)?,
            Some((recv, send, n_send)),
        ),
        CollectiveKind::ReduceScatter => {
            let whole = n_recv.checked_mul(size).ok_or_else(overflow)?;
            if whole != n_send {
                return Err(Error::ShapeMismatch {
                    op,
                    expected: vec![whole],
                    got: vec![n_send],
                    detail: format!("send must hold {size} ranks x recv's {n_recv} elements"),
                });
            }
            (n_recv, Some((send, recv, n_recv)))
        }
    };
    if n_recv != expected_recv {
        return Err(Error::ShapeMismatch {
            op,
            expected: vec![expected_recv],
            got: vec![n_recv],
            detail: match kind {
                CollectiveKind::AllGather => {
                    format!("recv must hold {size} ranks x send's {n_send} elements")
                }
                _ => "recv must hold as many elements as send".into(),
            },
        });
    }
    if !send.buffer.same_memory(recv.buffer) || n_send == 0 || n_recv == 0 {
        return Ok((n_send, n_recv));
    }
    let (s0, r0) = (send.layout.offset, recv.layout.offset);
    let in_place = match part {
        None => s0 == r0,
        // `small` must be part `rank` of `whole`.
        Some((whole, small, n)) => small.layout.offset == whole.layout.offset + rank * n,
    };
    let apart = s0 + n_send <= r0 || r0 + n_recv <= s0;
    if in_place || apart {
        Ok((n_send, n_recv))
    } else {
        Err(Error::InvalidArgument {
            op,
            detail: format!(
                "send (elements {s0}..{}) and recv (elements {r0}..{}) of one buffer overlap \
                 other than in place (for {op} in place: {})",
                s0 + n_send,
                r0 + n_recv,
                match kind {
                    CollectiveKind::AllGather => "send is this rank's part of recv",
                    CollectiveKind::ReduceScatter => "recv is this rank's part of send",
                    _ => "the same view",
                }
            ),
        })
    }
}
