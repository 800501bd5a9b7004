use std::path::PathBuf;

/// Errors of the runtimes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A runtime's shared library could not be found.
    #[error(
        "cannot find the {runtime} library (looked in: {searched}); install it with `{install}` \
         or point `{env}` at the library file"
    )]
    LibraryNotFound {
        /// The runtime (`ONNX Runtime`).
        runtime: &'static str,
        /// How to install it.
        install: &'static str,
        /// The variable that names the file.
        env: &'static str,
        /// Where we looked.
        searched: String,
    },
    /// The library exists but could not be loaded.
    #[error("cannot load {runtime} from `{path}`: {message}")]
    LibraryLoad {
        /// The runtime (`ONNX Runtime`).
        runtime: &'static str,
        /// The library file.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// An execution provider that this ONNX Runtime build or machine cannot use.
    #[error("execution provider `{provider}` is unavailable: {reason}")]
    ProviderUnavailable {
        /// The provider's spelling.
        provider: &'static str,
        /// Why.
        reason: String,
    },
    /// ONNX Runtime refused the model.
    #[error("ONNX Runtime cannot load the model: {0}")]
    Session(String),
    /// ONNX Runtime could not save, or layerdiff could not read back, the optimized graph.
    #[error("ONNX Runtime could not save its optimized graph: {0}")]
    SaveOptimized(String),
    /// ONNX Runtime failed while running.
    #[error("ONNX Runtime failed to run the model: {0}")]
    Run(String),
    /// The model asks for an input that was not given, or a given input has the wrong type.
    #[error("{0}")]
    Inputs(String),
    /// A tensor of an element type layerdiff cannot read.
    #[error("value `{name}` has element type {element}, which layerdiff cannot compare")]
    UnsupportedOutput {
        /// The value.
        name: String,
        /// Its element type.
        element: String,
    },
    /// Expected values that cannot be read.
    #[error("expected values: {0}")]
    Expected(String),
    /// A runtime refused the model or failed while running it, in its own words (its name
    /// first: `tract cannot load the model: …`).
    #[error("{0}")]
    Failed(String),
    /// A runtime has no kernel for one node of the model (its op, or its op for these input
    /// types): the node's name, why in a few words (`Unimplemented(Det)`), and the runtime's
    /// own message. The comparison leaves such a node out of the target's graph.
    #[error("{message}")]
    LacksNode {
        /// The node's name.
        node: String,
        /// Why, in a few words.
        why: String,
        /// The runtime's message.
        message: String,
    },
    /// No runtime has a kernel for a node.
    #[error("{0}")]
    NoKernel(String),
    /// Something a runtime does not support.
    #[error("{runtime} does not support {what}")]
    Unsupported {
        /// The runtime.
        runtime: &'static str,
        /// What.
        what: String,
    },
    /// A runtime in a worker process died (see [`crate::Isolated`]).
    #[error("{0}")]
    Crashed(Box<Crash>),
    /// A custom-op library that cannot be used.
    #[error("{0}")]
    CustomOps(String),
    /// The worker process of an isolated side could not be used.
    #[error("{0}")]
    Worker(String),
    /// `LAYERDIFF_THREADS` is not a number of threads.
    #[error(
        "LAYERDIFF_THREADS is `{0}`: give the number of threads each run's kernels may use, 1 or \
         more"
    )]
    Threads(String),
    /// Writing the model for the runtime failed.
    #[error(transparent)]
    Onnx(#[from] layerdiff_onnx::Error),
}

/// How a runtime in a worker process died: how, on which node where that could be traced, and
/// the last lines it wrote on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    /// The runtime (`onnxruntime`).
    pub runtime: String,
    /// How it died (`SIGSEGV, a segmentation fault`; `exit code 3`).
    pub how: String,
    /// The node whose run kills it.
    pub node: Option<CrashedNode>,
    /// The end of what it wrote on stderr.
    pub last_words: Option<String>,
}

/// The node a runtime died on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashedNode {
    /// Its name (or how it is shown when it has none).
    pub name: String,
    /// Its op, with the domain when not the standard one (`com.vendor.FastGelu`).
    pub op: String,
    /// The values it produces (they name it in the file the run came from).
    pub outputs: Vec<String>,
}

impl std::fmt::Display for Crash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} crashed in its worker process ({})",
            self.runtime, self.how
        )?;
        match &self.node {
            Some(node) => write!(f, " running node `{}` ({})", node.name, node.op)?,
            None => write!(
                f,
                "; the crash could not be traced to one node (the graph's beginnings run alone do \
                 not crash)"
            )?,
        }
        if let Some(words) = &self.last_words {
            write!(f, "; its last words: {words}")?;
        }
        Ok(())
    }
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
