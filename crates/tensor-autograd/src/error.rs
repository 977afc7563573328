//! The crate's error type: a `hal` error, or one of the library's own checks.

/// Everything a tensor operation, a layer, an optimiser or a file load can report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A backend call failed (shape or dtype mismatch, out of memory, no device, ...).
    #[error(transparent)]
    Hal(#[from] hal::Error),
    /// Operand shapes that do not fit the operation; both shapes are named.
    #[error("{op}: shapes {a:?} and {b:?} do not fit: {detail}")]
    Shape {
        op: &'static str,
        a: Vec<usize>,
        b: Vec<usize>,
        detail: String,
    },
    /// An argument outside what the operation accepts.
    #[error("{op}: {detail}")]
    InvalidArgument { op: &'static str, detail: String },
    /// Misuse of autograd (backward from a non-scalar without a gradient, ...).
    #[error("autograd: {0}")]
    Autograd(String),
    /// A parameter file that does not match the model.
    #[error("{path}: {detail}")]
    Checkpoint { path: String, detail: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn invalid(op: &'static str, detail: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        detail: detail.into(),
    }
}

pub(crate) fn shape_error(
    op: &'static str,
    a: &[usize],
    b: &[usize],
    detail: impl Into<String>,
) -> Error {
    Error::Shape {
        op,
        a: a.to_vec(),
        b: b.to_vec(),
        detail: detail.into(),
    }
}
