//! The layerdiff command and the flows behind it.
//!
//! Every command is the same flow (DESIGN.md): inputs → two sides → align → compare → analyse →
//! report. [`captured`] runs it when the reference values were captured elsewhere (PyTorch, via
//! the Python package) and the target is an ONNX model run by ONNX Runtime.

pub mod captured;
pub mod cli;
mod error;
pub mod inputs;
mod local;
pub mod model_pair;
mod onnx_command;
pub mod output;
pub mod segments;
pub mod shipped;
pub mod timings;
mod value_pairing;

pub use error::{Error, Result, error_chain};
