//! The sides: what produces a model's values for the engine. An ONNX graph run by a runtime
//! (with its re-runs of its own nodes and the graph a runtime ships), values read from a file,
//! values a framework pushes as it computes them, the first of several sides that can run, and
//! a side whose values are laid out another way.

pub mod expected;
pub mod fallback;
pub mod graph;
pub mod pushed;
pub mod relaid;
