//! How every layer is judged: the options every comparing verb shares (`onnx`, `torch`,
//! `keras`, `grad`, `providers`), declared once and resolved by the engine's one rule
//! ([`Settings::new`]).

use super::{Args, Settings, Tolerance};
use layerdiff_flow::Float64;

/// Tolerance, local error, the float64 computations and the memory budget.
#[derive(Debug, Clone, Args)]
pub struct Judging {
    /// Tolerance, judged per element (exceeded when an element's difference is strictly
    /// greater): a number for every element, `dtype` (the default, by the lower-precision side:
    /// atol + rtol·|x| with float32 1e-4 + 1e-5, float16 5e-4 + 1e-3, bfloat16 4e-3 + 8e-3, so
    /// rounding is judged at each value's magnitude), or `auto` (4× the reference's own
    /// distance from the float64 truth, per value; makes the truth, see --float64).
    #[arg(long, default_value = "dtype", value_parser = Tolerance::parse)]
    pub tolerance: Tolerance,
    /// Skip the local error (re-running each layer's own computation on the target, fed the
    /// reference's values: its ONNX nodes, its module, its backward): faster on large models,
    /// but the drift origin is then the first layer whose accumulated error exceeds.
    #[arg(long)]
    pub no_local: bool,
    /// Make the float64 truth: both sides' distance from a float64 run of the reference, for
    /// every value. `torch`, `keras` and `grad` make it unasked (a float64 copy of the model);
    /// `onnx` and `providers` when asked (the reference graph in float64: ONNX Runtime on the
    /// CPU, or node by node on layerdiff's own float64 kernels, ONNX Runtime and tract where
    /// ONNX Runtime has no float64 kernel). Implied by `--tolerance auto`.
    #[arg(long, conflicts_with = "no_float64")]
    pub float64: bool,
    /// Skip every float64 computation: the truth, and the same-precision baseline each layer's
    /// own error is judged against (the reference's computation in float64 on its inputs
    /// rounded to the target's dtype). A layer beyond its tolerance is then `undecided`
    /// between rounding and a defect.
    #[arg(long)]
    pub no_float64: bool,
    /// The most memory layerdiff's copies of the compared values may take at once (`4G`,
    /// `512M`): the run then goes in segments, each value compared as soon as both sides have
    /// it and dropped after its last use. Against values handed over (PyTorch's, a file's), a
    /// segment's budget holds the weights its runtime loads too, and a checkpoint folder whose
    /// float32 weights take more is held one module at a time (`layerdiff torch` against its
    /// ONNX file or a PyTorch target; a run that needs the whole model, `grad` or an export,
    /// refuses it before loading it). Default: what keeps the whole
    /// process within half the memory it could use at start (the values get what is left once
    /// the process's own memory and a runtime's copy of the weights are counted). The numbers
    /// do not depend on it.
    #[arg(long, value_name = "SIZE", value_parser = layerdiff_flow::memory::parse_memory)]
    pub max_memory: Option<u64>,
}

impl Judging {
    /// The settings as the engine takes them, checked; `truth_by_default`: whether the verb
    /// makes the float64 truth unasked (the framework verbs, whose float64 copy of the model
    /// costs one forward pass).
    pub fn settings(&self, truth_by_default: bool) -> Result<Settings, String> {
        let float64 = if self.no_float64 {
            Float64::Skip
        } else if self.float64 || truth_by_default {
            Float64::Truth
        } else {
            Float64::Baseline
        };
        Settings::new(self.tolerance, !self.no_local, self.max_memory, float64)
            .map_err(|e| layerdiff_flow::error_chain(&e))
    }
}
