//! Command-line parsing, shared by the Rust binary and the Python entry point.
//!
//! The Python package owns the `torch` verb (PyTorch lives there) but not its parsing: it asks
//! [`parse`] for the options, so `--help`, errors and exit codes are the same from either door.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// layerdiff: find where numerical drift between two runtimes is born, and why.
#[derive(Debug, Parser)]
#[command(name = "layerdiff", version, max_term_width = 100)]
pub struct Cli {
    /// What to compare.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Compare a PyTorch model with its ONNX export under ONNX Runtime, layer by layer.
    ///
    /// Exit code 0: no layer exceeds the tolerance; 1: drift found; 2: layerdiff could not run.
    Torch(TorchArgs),
}

/// Options of `layerdiff torch`.
#[derive(Debug, Clone, Args)]
pub struct TorchArgs {
    /// A built-in model (`resnet18`, `resnet50`, `mobilenet_v3_small`, `vit_b_16`) or a builder:
    /// `path/to/file.py:build` or `package.module:build`, where `build()` returns
    /// `(model, example_inputs)`.
    pub model: String,
    /// Absolute tolerance on each layer's max abs diff (a layer exceeds it when strictly greater).
    #[arg(long, default_value_t = 1e-4, value_parser = positive_float)]
    pub tolerance: f64,
    /// Seed for the model's random weights and for generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Which `torch.onnx.export` path produces the ONNX file.
    #[arg(long, value_enum, default_value_t = Exporter::Dynamo)]
    pub exporter: Exporter,
    /// Compare against this ONNX file of the same model instead of exporting one.
    #[arg(long, value_name = "PATH")]
    pub onnx: Option<PathBuf>,
    /// ONNX Runtime graph optimizations (default off, so every value exists as written).
    #[arg(long, value_enum, default_value_t = OptArg::Disable)]
    pub ort_opt: OptArg,
    /// Write report.json, report.md, inputs.safetensors and model.onnx into this folder.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Write the JSON report here (inputs are saved beside it).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write the Markdown report here.
    #[arg(long, value_name = "PATH")]
    pub markdown: Option<PathBuf>,
    /// Print nothing but errors; the exit code still tells the verdict.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Export paths of `torch.onnx.export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Exporter {
    /// `dynamo=True`, the default exporter.
    Dynamo,
    /// `dynamo=False`, the TorchScript-based exporter.
    Legacy,
}

/// ONNX Runtime graph optimization levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OptArg {
    /// No rewrites.
    Disable,
    /// Constant folding, redundant nodes.
    Basic,
    /// Plus fusions.
    Extended,
    /// Everything.
    All,
}

impl From<OptArg> for layerdiff_runtime::OptLevel {
    fn from(o: OptArg) -> Self {
        match o {
            OptArg::Disable => Self::Disable,
            OptArg::Basic => Self::Basic,
            OptArg::Extended => Self::Extended,
            OptArg::All => Self::All,
        }
    }
}

fn positive_float(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a non-negative number")),
    }
}

/// The result of parsing a command line.
#[derive(Debug)]
pub enum Parsed {
    /// Run `torch` with these options (the caller owns PyTorch).
    Torch(TorchArgs),
    /// Parsing already did everything (help, version, a usage error): exit with this code.
    Exit(u8),
}

/// Parses `argv` (program name first). Help and usage errors are printed here.
pub fn parse(argv: Vec<OsString>) -> Parsed {
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Torch(args),
        }) => Parsed::Torch(args),
        Err(err) => {
            let _ = err.print();
            Parsed::Exit(if err.use_stderr() { 2 } else { 0 })
        }
    }
}

/// Entry point of the Rust binary.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    match parse(argv) {
        Parsed::Exit(code) => ExitCode::from(code),
        Parsed::Torch(_) => {
            eprintln!(
                "error: `layerdiff torch` needs PyTorch, which lives in the Python package\n\
                 hint: `pip install layerdiff` and run the `layerdiff` it installs"
            );
            ExitCode::from(2)
        }
    }
}
