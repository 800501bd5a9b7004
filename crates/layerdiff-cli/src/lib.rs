//! The Rust `layerdiff` binary: parses the command line ([`layerdiff_args`]) and runs the verb
//! on the engine ([`layerdiff_flow`]). The verbs that need PyTorch or TensorFlow
//! (`torch`, `grad`, `keras`…) live in the Python package's command.

use std::ffi::OsString;
use std::process::ExitCode;

use layerdiff_args::{Dispatched, dispatch};

/// Entry point of the Rust binary.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    layerdiff_flow::interrupt::catch();
    layerdiff_flow::memory::settle_heap();
    match dispatch(argv) {
        Dispatched::Exit(code) => ExitCode::from(layerdiff_flow::interrupt::conclude(code)),
        Dispatched::Python(..) => {
            eprintln!(
                "error: this verb needs PyTorch or TensorFlow, which live in the Python package\n\
                 hint: `pip install layerdiff` and run the `layerdiff` it installs"
            );
            ExitCode::from(2)
        }
    }
}
