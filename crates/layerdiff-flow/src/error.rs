/// Why a flow could not do its job (as opposed to finding drift, which is a result).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model file.
    #[error(transparent)]
    Onnx(#[from] layerdiff_onnx::Error),
    /// A runtime.
    #[error(transparent)]
    Runtime(#[from] layerdiff_runtime::Error),
    /// Tensors.
    #[error(transparent)]
    Core(#[from] layerdiff_core::Error),
    /// Inputs that do not fit the model.
    #[error("{0}")]
    Inputs(String),
    /// A layer list that does not fit together.
    #[error("{0}")]
    Layers(String),
    /// Options that do not fit together.
    #[error("{0}")]
    Usage(String),
    /// The run compared no layer, so it has no verdict.
    #[error("{0}")]
    NothingCompared(String),
    /// A runtime ran out of memory.
    #[error("{0}")]
    Memory(String),
    /// A report or file could not be written.
    #[error("cannot write `{}`: {source}", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Expected values that cannot be read or do not fit the model.
    #[error("expected values: {0}")]
    Expected(String),
    /// A signal stopped the run before it compared any layer (see [`crate::interrupt`]).
    #[error("interrupted by {} before any layer was compared: no report written", crate::interrupt::name(*.0))]
    Interrupted(i32),
}

impl Error {
    /// The exit code of a verb that ends with this error, which it prints first: 2 (layerdiff
    /// could not do its job), or 128 + the signal that stopped the run.
    pub fn exit(&self) -> u8 {
        match self {
            // the command's end says what the signal left (`interrupt::conclude`)
            Error::Interrupted(_) => crate::interrupt::exit_code().unwrap_or(130),
            _ => {
                eprintln!("error: {}", error_chain(self));
                2
            }
        }
    }
}

/// Result type of the flows.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its causes on one line, each cause once (`a: b: c`), as the CLI prints them.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}
