//! The `layerdiff` command: parses the command line ([`args`]), runs the verb on the engine
//! ([`layerdiff_flow`]), prints and writes its outputs, and returns the exit code.

pub mod args;
mod onnx_command;

use std::ffi::OsString;
use std::process::ExitCode;

use args::Parsed;

/// Runs `layerdiff onnx`: prints the summary (stdout) and any error (stderr), writes the
/// reports, and returns the exit code (0 clean, 1 drift, 2 could not run).
pub fn run_onnx(args: &args::OnnxArgs, ort_library: Option<&std::path::Path>) -> u8 {
    match onnx_command::run(args, ort_library) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", layerdiff_flow::error_chain(&err));
            2
        }
    }
}

/// Entry point of the Rust binary.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    match args::parse(argv) {
        Parsed::Exit(code) => ExitCode::from(code),
        Parsed::Onnx(args) => ExitCode::from(run_onnx(&args, None)),
        Parsed::Torch(_) => {
            eprintln!(
                "error: `layerdiff torch` needs PyTorch, which lives in the Python package\n\
                 hint: `pip install layerdiff` and run the `layerdiff` it installs"
            );
            ExitCode::from(2)
        }
    }
}
