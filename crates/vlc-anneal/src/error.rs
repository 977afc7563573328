//! The crate's one error type.

/// Everything that can go wrong: a device error, bad input data or parameters, a malformed
/// index file, or the file system.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Hal(#[from] hal::Error),
    /// Input vectors or parameters that cannot be compressed as asked (NaN, m > n, d = 0, ...).
    #[error("invalid input: {0}")]
    Input(String),
    /// A file that is not what it claims to be: wrong magic, truncated, bad checksum, ...
    #[error("{path}: {detail}")]
    Format { path: String, detail: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn input(detail: impl Into<String>) -> Error {
    Error::Input(detail.into())
}

pub(crate) fn format_error(path: &str, detail: impl Into<String>) -> Error {
    Error::Format {
        path: path.to_string(),
        detail: detail.into(),
    }
}

pub(crate) fn io_error(path: &std::path::Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}
