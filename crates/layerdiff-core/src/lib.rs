//! The numeric heart of layerdiff: tensors and dtypes, the comparison kernel (one pass, parallel,
//! deterministic), drift analysis (tolerance, drift origin, worst layers), and the report model with
//! its renderers. Nothing here knows about Python, ONNX files or runtimes.

mod advice;
mod analysis;
mod axis;
mod baseline;
mod bisect;
mod cause;
mod compare;
mod digest;
mod dtype;
mod error;
mod fingerprint;
pub mod floats;
mod io;
mod kernel;
mod layout;
mod machine;
mod measure;
mod npz;
mod op_check;
mod pair;
mod quantized;
mod random;
pub mod render;
mod report;
mod tensor;
mod tolerance;

pub use advice::{
    MOST_KEPT, advice_checked, check_advice, keep_float32, layers_to_check, lower_precision_of,
};
pub use analysis::{
    BORN_HERE, LOW_COVERAGE, LOW_COVERAGE_WARNING, OWN_ERROR_RANKED, analyse, judge,
    not_compared_reasons, nothing_compared, summarise,
};
pub use axis::{
    AXIS_SCHEMA, AxisLayer, AxisPoint, AxisReport, along_axis, axis_markdown, axis_text,
};
pub use baseline::{
    Baseline, DEFECT_MARGIN, FromExact, HONEST_FACTOR, Indices, NarrowIdeal, Reduction, SAME_BITS,
    WITHIN_TOLERANCE_MARGIN, accumulation_unit, assess_baseline, kernel_allowance,
    narrow_accumulation_sigma, output_steps,
};
pub use bisect::{Bisection, BisectionCheck, OpaqueSearch, RangeTried, smallest_set};
pub use cause::{
    Cause, Clipped, Evidence, FileDifference, attributes_differ, explain, precision_grid,
    quantizing_op, unseen_differences, weights_fix,
};
pub use compare::{
    Judge, PERCENTILE_RESOLUTION, Rounding, Stats, THRESHOLDS, Worst, compare, compare_judged,
    within,
};
pub use digest::Digest;
pub use dtype::DType;
pub use error::{Error, Result};
pub use fingerprint::{Fingerprint, SAME_VALUE};
pub use io::{
    parse_safetensors, read_safetensors, read_safetensors_metadata, write_atomic, write_safetensors,
};
pub use layout::{LayoutFinding, detect_layout};
pub use machine::Machine;
pub use measure::Measure;
pub use npz::{parse_npz, read_npz};
pub use op_check::{OpBound, OpCheck, OpWorst, check_op, check_op_in};
pub use pair::{PairOutcome, SENTINEL, compare_pair, held_as, max_abs_diffs};
pub use quantized::{
    QUANTIZED_MAX_STEPS, QUANTIZED_MEAN_STEPS, Quantization, SATURATION_LIMIT, assess_quantized,
};
pub use random::{SplitMix64, random_tensor};
pub use report::{
    AdviceCheck, Approximation, CompiledWhole, Defect, ExactOutput, FailOn, Finding,
    Float64Distance, InputInfo, Inside, Invocation, KeepFloat32, KeptLayer, Layer, LayerStatus,
    Location, ModuleCompiled, NarrowKernel, PrecisionDrift, ProviderNodes, ROUNDING_FACTOR, Report,
    SCHEMA, SideInfo, Summary, TargetGraph, Timing, Verdict, WorstLayer, WorstLayers,
};
pub use tensor::{Tensor, TensorView};
pub use tolerance::{
    AUTO_FACTOR, AUTO_FLOOR, Bound, DEFAULTS_TEXT, Tolerance, ToleranceInfo, computing_grid,
    default_for, lower_precision,
};
