//! The comparison engine of layerdiff.
//!
//! Every command is the same flow (docs/design.md): inputs → two sides → align → compare →
//! analyse → report. A [`Side`] produces a model's values: [`GraphSide`] (an ONNX graph run
//! by ONNX Runtime or tract), [`ExpectedSide`] (values read from a file) and [`PushedSide`]
//! (values handed over as a framework computes them: PyTorch's forward hooks). The [`Engine`]
//! runs the one loop over any two of them. The folders say the same: `engine` (the loop and
//! what it holds), [`sides`] (what produces values), [`spec`] (how each side is spelled) and
//! [`verbs`] (each command: it builds its sides and aligns them, e.g. [`verbs::captured`], a
//! framework's layers against its export); beside them [`onnx`], one ONNX model on two
//! runtimes, the comparison the ONNX verbs share.

mod engine;
mod error;
pub mod inputs;
pub mod interrupt;
pub mod made;
pub mod onnx;
pub mod output;
mod overwrite;
pub mod progress;
pub mod sides;
pub mod spec;
pub mod timings;
pub mod verbs;

pub use engine::baseline::Baseline;
pub use engine::evidence::{WeightCheck, WeightCheckFn};
pub use engine::memory::{self, Segmentation};
pub use engine::plan::{Dataflow, Part, PlanSide};
pub use engine::side::{Group, Member, Own, Receive, Recompute, Side, Values};
pub use engine::{Alignment, Engine, EngineParts, Float64, Header, Settings, Shared};
pub use error::{Error, Result, error_chain};
pub use sides::expected::ExpectedSide;
pub use sides::fallback::FallbackSide;
pub use sides::graph::GraphSide;
pub use sides::graph::baseline::GraphBaseline;
pub use sides::pushed::baseline::HandedBaseline;
pub use sides::pushed::{Computing, PushedSide};
pub use sides::relaid::RelaidSide;
