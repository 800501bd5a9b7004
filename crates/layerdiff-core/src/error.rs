use std::path::PathBuf;

/// Errors of the core crate: bad tensors, unreadable tensor files, unwritable reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A buffer's length does not match its shape and dtype.
    #[error(
        "tensor `{name}`: {len} bytes do not hold shape {shape:?} of {dtype} ({expected} bytes expected)"
    )]
    BufferSize {
        /// Tensor name.
        name: String,
        /// Bytes given.
        len: usize,
        /// Declared shape.
        shape: Vec<usize>,
        /// Declared dtype name.
        dtype: &'static str,
        /// Bytes the shape needs.
        expected: usize,
    },
    /// Two tensors with different element counts were compared.
    #[error("cannot compare tensors of shapes {reference:?} and {target:?}: element counts differ")]
    ShapeMismatch {
        /// Reference shape.
        reference: Vec<usize>,
        /// Target shape.
        target: Vec<usize>,
    },
    /// A dtype name or code layerdiff does not handle.
    #[error("unsupported dtype `{0}`")]
    UnsupportedDType(String),
    /// A tensor file could not be read or written.
    #[error("cannot access `{path}`")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An `.npz` file that cannot be read.
    #[error("`{path}` is not a readable .npz file: {message}")]
    Npz {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A safetensors file is malformed.
    #[error("`{path}` is not a valid safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What safetensors said.
        message: String,
    },
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
