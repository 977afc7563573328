//! The one error type every backend returns.

use crate::DType;

/// Everything that can go wrong in a `hal` call. Each variant says what happened and names the
/// operation; none of them is raised by a panic. Bad input never aborts the process.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend cannot run here: no driver, no adapter, no library, or not built yet.
    #[error("backend `{backend}` is unavailable: {reason}")]
    Unavailable {
        backend: &'static str,
        reason: String,
    },

    /// Operand shapes do not agree.
    #[error("{op}: shape mismatch: expected {expected:?}, got {got:?} ({detail})")]
    ShapeMismatch {
        op: &'static str,
        expected: Vec<usize>,
        got: Vec<usize>,
        detail: String,
    },

    /// An operand has the wrong element type.
    #[error("{op}: dtype mismatch: expected {expected}, got {got}")]
    DTypeMismatch {
        op: &'static str,
        expected: DType,
        got: DType,
    },

    /// The operation does not support this element type (on this backend).
    #[error("{op}: dtype {dtype} is not supported{detail}")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        detail: String,
    },

    /// A view reaches outside its buffer.
    #[error("{op}: view out of bounds: {detail}")]
    OutOfBounds { op: &'static str, detail: String },

    /// The operation cannot run on this backend as asked (a size beyond what its kernels
    /// index, say); the detail says why. Nothing was run.
    #[error("{op}: unsupported: {detail}")]
    Unsupported { op: &'static str, detail: String },

    /// A size, stride, offset or address computation does not fit its integer type (checked,
    /// never wrapped): the shape or view describes more memory than any buffer can hold.
    #[error("{op}: arithmetic overflow: {detail}")]
    Overflow { op: &'static str, detail: String },

    /// An index operand holds a value outside the dimension it indexes.
    #[error("{op}: index {index} is out of range for a dimension of size {bound}")]
    IndexOutOfRange {
        op: &'static str,
        index: i64,
        bound: usize,
    },

    /// A reduction or search over zero elements, which has no defined result.
    #[error("{op}: empty input: {detail}")]
    Empty { op: &'static str, detail: String },

    /// The requested allocation exceeds what the device can ever hold in one buffer.
    #[error(
        "allocation of {requested_bytes} bytes exceeds the device limit of {limit_bytes} bytes ({what})"
    )]
    AllocationTooLarge {
        requested_bytes: u128,
        limit_bytes: u64,
        what: String,
    },

    /// The allocation was within limits but the device had no memory left for it.
    #[error("out of device memory allocating {requested_bytes} bytes")]
    OutOfMemory { requested_bytes: u128 },

    /// An argument is invalid for a reason not covered above.
    #[error("{op}: invalid argument: {detail}")]
    InvalidArgument { op: &'static str, detail: String },

    /// A scalar program failed validation or compilation.
    #[error("invalid program `{program}`: {detail}")]
    InvalidProgram { program: String, detail: String },

    /// The device was lost or reported an internal error.
    #[error("backend `{backend}` failed: {detail}")]
    Backend {
        backend: &'static str,
        detail: String,
    },
}

impl Error {
    /// What a capturing backend returns for `op` (a wait, a read, an upload or a write) inside
    /// [`Backend::record`](crate::Backend::record): it would happen once, when recording, not at
    /// each replay.
    pub fn inside_recording(op: &'static str) -> Self {
        Error::InvalidArgument {
            op,
            detail: "not allowed inside a recording (it waits for the device or moves host data)"
                .into(),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
