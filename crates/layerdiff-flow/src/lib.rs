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
mod baseline;
pub mod bisect;
pub mod captured;
pub mod check;
mod engine;
mod error;
mod evidence;
mod expected_side;
mod fallback_side;
mod graph_side;
mod group;
pub mod inputs;
pub mod interrupt;
pub mod keras_side;
pub mod memory;
pub mod onnx_flow;
pub mod ops;
pub mod output;
mod pairs;
mod plan;
pub mod progress;
pub mod providers;
mod pushed_side;
pub mod reduce;
mod relaid_side;
mod rerun;
pub mod shipped;
mod side;
pub mod target;
pub mod timings;
pub mod torch_side;
mod value_pairing;

pub use baseline::{Baseline, GraphBaseline, HandedBaseline};
pub use engine::{Alignment, Engine, Header, Settings, Shared};
pub use error::{Error, Result, error_chain};
pub use evidence::{WeightCheck, WeightCheckFn};
pub use expected_side::ExpectedSide;
pub use fallback_side::FallbackSide;
pub use graph_side::GraphSide;
pub use memory::Segmentation;
pub use plan::{Dataflow, Part, PlanSide};
pub use pushed_side::{Computing, PushedSide};
pub use relaid_side::RelaidSide;
pub use side::{Group, Member, Own, Receive, Recompute, Side, Values};
