//! The device fault record that GPU backends share: how a kernel that finds bad data (an index
//! out of range, broken CSR row offsets, an IR access out of bounds) tells the host, which
//! reports it as an [`Error`] at the next `synchronize` or read.
//!
//! The record is four `u32` words, `[claimed, value, bound, op code]`; the first fault of a
//! run claims it. The op code is a position in [`FAULT_OPS`], so every backend's kernels and
//! host code agree on what a code means.

use crate::{DType, Error};

/// What a fault is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// An index out of range; `signed`: the value is an i32.
    Index { signed: bool },
    /// CSR-style offsets that do not start at 0, decrease, or run past the stored entries;
    /// `offsets` names the operand in the error.
    CsrOffsets { offsets: &'static str },
}

/// The op and kind each code names: the code is the position here. Code 0 is an IR program's
/// load or store.
pub const FAULT_OPS: [(&str, FaultKind); 11] = [
    (
        "launch (program load/store)",
        FaultKind::Index { signed: false },
    ),
    ("gather", FaultKind::Index { signed: false }),
    ("gather", FaultKind::Index { signed: true }),
    ("scatter_add", FaultKind::Index { signed: false }),
    ("scatter_add", FaultKind::Index { signed: true }),
    ("segment_sum", FaultKind::Index { signed: false }),
    ("spmv_csr", FaultKind::Index { signed: false }),
    (
        "spmv_csr",
        FaultKind::CsrOffsets {
            offsets: "row_offsets",
        },
    ),
    ("ivf_scan", FaultKind::Index { signed: false }),
    ("ivf_scan", FaultKind::CsrOffsets { offsets: "offsets" }),
    ("candidate_scores", FaultKind::Index { signed: false }),
];

/// The code of `kind` of fault in `op`.
pub fn fault_code(op: &str, kind: FaultKind) -> u32 {
    FAULT_OPS
        .iter()
        .position(|&(o, k)| o == op && k == kind)
        .expect("every checked op is in FAULT_OPS") as u32
}

/// The code of `op`'s fault of broken offsets ([`FaultKind::CsrOffsets`]).
pub fn offsets_fault_code(op: &str) -> u32 {
    FAULT_OPS
        .iter()
        .position(|&(o, k)| o == op && matches!(k, FaultKind::CsrOffsets { .. }))
        .expect("every checked op is in FAULT_OPS") as u32
}

/// The fault kind of an index out of range in indices of `dtype`.
pub fn index_fault(dtype: DType) -> FaultKind {
    FaultKind::Index {
        signed: dtype == DType::I32,
    }
}

/// The error a fault record reports, or `None` when no fault claimed it. `backend` names the
/// backend in the error for an unknown code.
pub fn fault_error(backend: &'static str, record: [u32; 4]) -> Option<Error> {
    let [claimed, value, bound, code] = record;
    if claimed == 0 {
        return None;
    }
    let Some(&(op, kind)) = FAULT_OPS.get(code as usize) else {
        return Some(Error::Backend {
            backend,
            detail: format!("unknown fault code {code}"),
        });
    };
    Some(match kind {
        FaultKind::Index { signed } => Error::IndexOutOfRange {
            op,
            index: if signed {
                value as i32 as i64
            } else {
                value as i64
            },
            bound: bound as usize,
        },
        FaultKind::CsrOffsets { offsets } => Error::InvalidArgument {
            op,
            detail: format!(
                "{offsets} must start at 0, never decrease and end within the {bound} stored entries (found offset {value})"
            ),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode_to_the_ops_that_raise_them() {
        let code = fault_code("gather", index_fault(DType::I32));
        match fault_error("t", [1, (-3i32) as u32, 7, code]) {
            Some(Error::IndexOutOfRange { op, index, bound }) => {
                assert_eq!((op, index, bound), ("gather", -3, 7))
            }
            e => panic!("{e:?}"),
        }
        assert!(fault_error("t", [0, 5, 5, code]).is_none());
        assert!(matches!(
            fault_error("t", [1, 0, 0, 99]),
            Some(Error::Backend { .. })
        ));
    }
}
