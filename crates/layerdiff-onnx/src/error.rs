use std::path::PathBuf;

/// Everything that can go wrong while reading, indexing or editing an ONNX model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read or written.
    #[error("cannot access `{path}`")]
    Io {
        /// The file in question.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid ONNX `ModelProto`.
    #[error("`{path}` is not a valid ONNX model (protobuf decoding failed: {source})")]
    Decode {
        /// The file in question.
        path: PathBuf,
        /// The protobuf error.
        #[source]
        source: prost::DecodeError,
    },
    /// The model decoded, but has no graph or no nodes.
    #[error("`{path}` is not a usable ONNX model: {reason}")]
    NotAModel {
        /// The file in question.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// An attribute a node needs is missing or of the wrong type.
    #[error("node `{node}` ({op_type}): {message}")]
    Attribute {
        /// The node's name.
        node: String,
        /// The node's op type.
        op_type: String,
        /// What is wrong.
        message: String,
    },
    /// A tensor's external data that cannot be read where it says, or that lies outside the
    /// model's folder (a hostile file reaching for other files).
    #[error("`{}`: {kind} `{tensor}` keeps its data in `{location}`, {reason}", path.display())]
    ExternalData {
        /// The model file.
        path: PathBuf,
        /// What holds the tensor: `initializer`, or `constant` (a node's tensor attribute).
        kind: &'static str,
        /// The tensor's name (a constant's: its node's output where the tensor has none).
        tensor: String,
        /// Its `location` entry.
        location: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A value name was asked for that the graph does not have.
    #[error("the graph has no value named `{0}`")]
    UnknownValue(String),
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
