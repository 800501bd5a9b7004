//! The verbs: each builds its sides, aligns them and runs the engine, or checks what the engine
//! does not (an opset audit, the op matrix). `onnx` (one ONNX model on two runtimes, or two
//! versions of a model, on [`crate::onnx`]), `captured` (a framework's layers against its model's ONNX export),
//! `reduce` and `bisect` (a drifting run cut down to its smallest part), `ops`, `providers`,
//! `audit`, `check`.

pub mod audit;
pub mod bisect;
pub mod captured;
pub mod check;
pub mod onnx;
pub mod ops;
pub mod providers;
pub mod reduce;
pub mod sweep;
