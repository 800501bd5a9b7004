//! The Rust `layerdiff` binary: parses the command line ([`layerdiff_args`]) and runs the verb
//! on the engine ([`layerdiff_flow`]). The `torch` and `grad` verbs need PyTorch, so they live
//! in the Python package's command.

use std::ffi::OsString;
use std::process::ExitCode;

use layerdiff_args::Parsed;

/// Entry point of the Rust binary.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    match layerdiff_args::parse(argv) {
        Parsed::Exit(code) => ExitCode::from(code),
        Parsed::Onnx(args) => ExitCode::from(layerdiff_flow::onnx_flow::run(
            &args.options(),
            &args.report.destinations(),
            None,
        )),
        Parsed::Providers(args) => ExitCode::from(layerdiff_flow::providers::run(
            &args.options(),
            &args.destinations(),
            None,
        )),
        Parsed::Audit(args) => ExitCode::from(layerdiff_flow::audit::run(
            &args.options(),
            &args.destinations(),
            None,
        )),
        Parsed::Torch(_) | Parsed::Grad(_) | Parsed::Ops(_) | Parsed::Zoo | Parsed::Check(_) => {
            eprintln!(
                "error: this verb needs PyTorch, which lives in the Python package\n\
                 hint: `pip install layerdiff` and run the `layerdiff` it installs"
            );
            ExitCode::from(2)
        }
    }
}
