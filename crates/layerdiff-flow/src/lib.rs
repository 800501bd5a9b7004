//! The comparison engine of layerdiff.
//!
//! Every command is the same flow (docs/design.md): inputs → two sides → align → compare →
//! analyse → report. A [`Side`] produces a model's values: [`GraphSide`] (an ONNX graph run
//! by ONNX Runtime or tract), [`ExpectedSide`] (values read from a file) and [`PushedSide`]
//! (values handed over as a framework computes them: PyTorch's forward hooks). The [`Engine`]
//! runs the one loop over any two of them. Commands only build their sides and align them:
//! [`onnx_flow`] (one ONNX model on two runtimes, or two versions of a model) and
//! [`captured`] (PyTorch's layers against the model's ONNX export).

pub mod audit;
pub mod bisect;
pub mod captured;
pub mod check;
mod engine;
mod error;
pub mod inputs;
pub mod interrupt;
pub mod onnx_flow;
pub mod ops;
pub mod output;
pub mod progress;
pub mod providers;
pub mod reduce;
pub mod sides;
pub mod spec;
pub mod timings;
mod value_pairing;

pub use engine::baseline::{Baseline, GraphBaseline, HandedBaseline};
pub use engine::evidence::{WeightCheck, WeightCheckFn};
pub use engine::memory::{self, Segmentation};
pub use engine::plan::{Dataflow, Part, PlanSide};
pub use engine::side::{Group, Member, Own, Receive, Recompute, Side, Values};
pub use engine::{Alignment, Engine, Header, Settings, Shared};
pub use error::{Error, Result, error_chain};
pub use sides::expected::ExpectedSide;
pub use sides::fallback::FallbackSide;
pub use sides::graph::GraphSide;
pub use sides::pushed::{Computing, PushedSide};
pub use sides::relaid::RelaidSide;
