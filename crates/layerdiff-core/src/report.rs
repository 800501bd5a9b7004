//! The report: one serialisable model that every renderer reads. Field order is JSON key order.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::Stats;

/// Schema identifier written into every JSON report. Version 4 renamed `layers[].onnx`
/// (`{value, node, op_type, nodes}`) to `layers[].location` (`{kind, value, node, op, nodes}`,
/// `kind` `onnx`), so a layer's place is said in its side's terms (docs/report.md).
pub const SCHEMA: &str = "layerdiff.report/4";

/// A whole comparison: what ran, on what, and what was found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    /// The command that produced it (`torch`, `onnx`, …).
    pub command: String,
    /// The model compared (built-in name, file or builder spec).
    pub model: String,
    /// The side taken as correct.
    pub reference: SideInfo,
    /// The side under test.
    pub target: SideInfo,
    /// The graph the target really ran, when its runtime optimized the model first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_graph: Option<TargetGraph>,
    /// What computed the float64 truth both sides are measured against, when one ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truth: Option<SideInfo>,
    /// `local`: besides the accumulated error (each side run from the original input), each
    /// layer was re-run on the target with the reference's inputs; `accumulated`: not re-run.
    pub mode: String,
    /// How each layer's tolerance was chosen; the number itself is on each layer.
    pub tolerance: crate::ToleranceInfo,
    /// Seed of the generated inputs, when they were generated.
    pub seed: Option<u64>,
    /// The inputs both sides were given.
    pub inputs: Vec<InputInfo>,
    /// Counts, drift origin and worst layers.
    pub summary: Summary,
    /// Every layer in execution order.
    pub layers: Vec<Layer>,
    /// For a target in a lower precision that drifts: the layers to keep in float32, and what
    /// keeping them did when it was checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_float32: Option<crate::KeepFloat32>,
    /// The machine it was made on: with the sides' versions, what decides whether another run
    /// gives the same bytes (see [`crate::Machine`]).
    pub machine: crate::Machine,
    /// Where the time went, phase by phase; only with `--timings` (times are not deterministic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Vec<Timing>>,
}

/// One phase of a run and its wall time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timing {
    /// What was done (`reference run`, `comparison`…).
    pub phase: String,
    /// Who did it: `layerdiff` (its own work), `runtime` (a runtime's inference), `pytorch`
    /// (capture and export).
    pub by: String,
    /// Wall time.
    #[serde(serialize_with = "crate::render::float")]
    pub seconds: f64,
}

impl Timing {
    /// A phase.
    pub fn new(phase: &str, by: &str, seconds: f64) -> Self {
        Self {
            phase: phase.to_string(),
            by: by.to_string(),
            seconds,
        }
    }
}

impl Report {
    /// The inputs both sides were given, in words (`` `x` float32 [1, 3, 224, 224] (seed 0) ``),
    /// or `None` when there were none.
    pub fn inputs_words(&self) -> Option<String> {
        if self.inputs.is_empty() {
            return None;
        }
        let inputs: Vec<String> = self
            .inputs
            .iter()
            .map(|i| format!("`{}` {} {:?}", i.name, i.dtype, i.shape))
            .collect();
        let seed = self
            .seed
            .map(|s| format!(" (seed {s})"))
            .unwrap_or_default();
        Some(format!("{}{seed}", inputs.join(", ")))
    }
}

/// One side of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideInfo {
    /// `pytorch`, `onnxruntime`, `tract`, `expected`.
    pub runtime: String,
    /// Version, device, provider and options, in words.
    pub detail: String,
    /// Which execution provider really ran how many nodes (ONNX Runtime on a provider other
    /// than the CPU, read from its profiler), most first; absent where it says nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Vec<ProviderNodes>>,
    /// The options of its execution provider that change its numbers, as ONNX Runtime resolved
    /// them (`use_tf32`: `1`); absent where it has none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// Nodes one execution provider ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderNodes {
    /// ONNX Runtime's name for it (`CUDAExecutionProvider`).
    pub provider: String,
    /// Nodes it ran.
    pub nodes: usize,
}

impl SideInfo {
    /// Where its nodes ran, in words (`290 nodes on CUDAExecutionProvider, 12 on
    /// CPUExecutionProvider`), when that is known.
    pub fn placement_text(&self) -> Option<String> {
        let placement = self.placement.as_ref()?;
        let parts: Vec<String> = placement
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let unit = if i == 0 { " nodes" } else { "" };
                format!("{}{unit} on {}", p.nodes, p.provider)
            })
            .collect();
        Some(parts.join(", "))
    }

    /// A side described in words, with nothing known of its node placement.
    pub fn new(runtime: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            runtime: runtime.into(),
            detail: detail.into(),
            placement: None,
            options: BTreeMap::new(),
        }
    }
}

/// The graph a target's runtime optimized and ran, and what comparing inside it cost.
///
/// Exposing a value as an output keeps an optimizer from fusing it away, so values are exposed
/// in the graph the runtime already optimized, never in the file; and the model outputs of
/// that exposed run are checked against a run of the file as it ships.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetGraph {
    /// Who optimized the graph, at which level.
    pub optimized_by: String,
    /// Nodes in the file.
    pub nodes_in_file: usize,
    /// Nodes in the optimized graph (before any value is exposed or converted back).
    pub nodes_optimized: usize,
    /// Reference values that exist in the optimized graph, by name or traced back from a
    /// renamed one; only these can be compared.
    pub values_surviving: usize,
    /// Of those, values the optimizer renamed into another layout, given back through layout
    /// conversions (pure data movement) to be compared.
    pub values_restored: usize,
    /// Model outputs of the exposed run that are bit-identical to those of an unmodified run
    /// of the file at the same level, out of `outputs_checked`.
    pub outputs_identical: usize,
    /// Model outputs checked.
    pub outputs_checked: usize,
    /// The largest absolute difference between the two runs' model outputs (0 when identical).
    #[serde(serialize_with = "crate::render::float")]
    pub outputs_max_abs_diff: f64,
}

impl TargetGraph {
    /// The graph in one sentence, for the text and Markdown summaries.
    pub fn describe(&self) -> String {
        let restored = match self.values_restored {
            0 => String::new(),
            n => format!(" ({n} given back from a blocked layout)"),
        };
        let outputs = if self.outputs_checked == 0 {
            "the model outputs of the exposed run could not be checked against an unmodified run"
                .to_string()
        } else if self.outputs_identical == self.outputs_checked {
            format!(
                "exposing them left the model outputs bit-identical to an unmodified run ({} of {})",
                self.outputs_identical, self.outputs_checked
            )
        } else {
            format!(
                "exposing them CHANGED the model outputs (largest difference {:.3e}; {} of {} identical)",
                self.outputs_max_abs_diff, self.outputs_identical, self.outputs_checked
            )
        };
        format!(
            "{} ({} nodes in the file, {} after); compared where the optimized graph has values: {} reference values survive it{restored}; {outputs}",
            self.optimized_by, self.nodes_in_file, self.nodes_optimized, self.values_surviving
        )
    }
}

/// An input tensor given to both sides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InputInfo {
    /// Input name (the ONNX graph input).
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// dtype name.
    pub dtype: String,
}

impl InputInfo {
    /// The description of each named tensor.
    pub fn describe(inputs: &[(String, crate::Tensor)]) -> Vec<Self> {
        inputs
            .iter()
            .map(|(name, t)| Self {
                name: name.clone(),
                shape: t.shape.clone(),
                dtype: t.dtype.name().to_string(),
            })
            .collect()
    }
}

/// What the analysis found, at a glance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Layers in the report (every leaf-module call, compared or not).
    pub layers_total: usize,
    /// Layers with values on both sides that were compared.
    pub layers_compared: usize,
    /// Layers whose accumulated difference exceeds their tolerance.
    pub layers_exceeding: usize,
    /// Layers whose own (local) difference exceeds their tolerance.
    pub layers_exceeding_locally: usize,
    /// Layers with no counterpart on the target side.
    pub layers_unmapped: usize,
    /// What the run found, in one word: `no_drift` (every compared layer within its
    /// tolerance), `precision` (layers exceed it, and what each adds of its own is what its
    /// precision explains), `defect` (a layer computes differently: see `defects`),
    /// `undecided` (a layer exceeds and nothing tells rounding from a defect there) or
    /// `inconclusive` (part of the model could not be paired).
    pub verdict: Verdict,
    /// Layers that compute something their precision does not explain, most severe first.
    pub defects: Vec<Defect>,
    /// The drift the target's precision explains, when layers exceed their tolerance by it.
    pub precision: Option<PrecisionDrift>,
    /// Where the drift is born: the first defect (or undecided layer) in execution order, else
    /// where the precision drift is born: the first layer whose own (local) error exceeds its
    /// tolerance, or the upstream layer an amplified error came from (see docs/concepts.md).
    pub drift_origin: Option<String>,
    /// The first layer, in execution order, whose accumulated error exceeds its tolerance.
    pub first_exceeding: Option<String>,
    /// The extremes across compared layers.
    pub worst: WorstLayers,
    /// The layers that add the most error of their own (local mean abs diff, where measured and
    /// above zero), most first, at most [`crate::OWN_ERROR_RANKED`]: where quantization or a
    /// lower precision costs the most.
    pub most_own_error: Vec<WorstLayer>,
    /// What a reader must know before trusting the verdict, e.g. that few layers were compared.
    pub warnings: Vec<String>,
    /// Why the run cannot say "no drift" although no compared layer exceeds (layers from some
    /// point on could not be paired, which is what drift beyond recognition looks like); `None`
    /// when the verdict stands. An inconclusive run exits 1, like drift.
    pub inconclusive: Option<String>,
    /// Layers whose own error another exceeding layer's error is traced back to (not written:
    /// each inherited layer names its own in `error_from`).
    #[serde(skip)]
    pub sources: std::collections::BTreeSet<String>,
}

/// What a run found, in one word (see [`Summary::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every compared layer within its tolerance.
    #[default]
    NoDrift,
    /// Layers exceed their tolerance, by what their precision explains only.
    Precision,
    /// A layer computes something its precision does not explain.
    Defect,
    /// A layer exceeds its tolerance and nothing measured tells rounding from a defect.
    Undecided,
    /// Nothing exceeds, but part of the model could not be paired.
    Inconclusive,
}

/// When a finished comparison fails (exit code 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailOn {
    /// On a defect, an undecided layer, an inconclusive run, or values that overflow the
    /// target's dtype: what a precision the target was meant to run in does not explain or
    /// does not survive. Rounding alone passes.
    #[default]
    Defect,
    /// On any layer beyond its tolerance, rounding included.
    Drift,
}

impl FailOn {
    /// Parses `--fail-on`: `defect` or `drift`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "defect" | "defects" => Ok(Self::Defect),
            "drift" => Ok(Self::Drift),
            _ => Err(format!(
                "`--fail-on` takes `defect` or `drift`, got `{text}`"
            )),
        }
    }
}

impl Summary {
    /// Whether the run fails under `fail_on` (see [`FailOn`]).
    pub fn fails(&self, fail_on: FailOn) -> bool {
        match self.verdict {
            Verdict::NoDrift => false,
            Verdict::Defect | Verdict::Undecided | Verdict::Inconclusive => true,
            Verdict::Precision => {
                fail_on == FailOn::Drift || self.precision.as_ref().is_some_and(|p| p.overflow > 0)
            }
        }
    }
}

impl Verdict {
    /// The word written into reports (`no_drift`, `precision`…).
    pub fn name(self) -> &'static str {
        match self {
            Self::NoDrift => "no_drift",
            Self::Precision => "precision",
            Self::Defect => "defect",
            Self::Undecided => "undecided",
            Self::Inconclusive => "inconclusive",
        }
    }
}

/// A layer that computes something its precision does not explain, and what fixes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Defect {
    /// The layer.
    pub layer: String,
    /// Its cause (`weight_mismatch`, `op_implementation`, `layout_permutation`,
    /// `shape_mismatch`, `nondeterminism`).
    pub cause: String,
    /// Its own error as a multiple of what its precision explains (the layer's
    /// `baseline.multiple`), where that was measured.
    #[serde(serialize_with = "crate::render::float_opt")]
    pub multiple: Option<f64>,
    /// Its own error as a multiple of its tolerance.
    #[serde(serialize_with = "crate::render::float_opt")]
    pub tolerance_multiple: Option<f64>,
    /// The cause in words.
    pub detail: String,
    /// What to do about it.
    pub fix: String,
}

impl Defect {
    /// How severe it is, for ranking: its multiple of what precision explains, else of its
    /// tolerance.
    pub fn severity(&self) -> f64 {
        self.multiple.or(self.tolerance_multiple).unwrap_or(0.0)
    }
}

/// The drift a target's lower (or different) rounding explains: where it is born, how far it
/// grows, and how many layers it takes past their tolerance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrecisionDrift {
    /// The dtype the target rounds to (`float16`, `bfloat16`, `float32`).
    pub dtype: String,
    /// Where it is born: the first layer whose own rounding exceeds its tolerance, or the
    /// layer an amplified rounding error is traced back to.
    pub origin: Option<String>,
    /// Layers whose own error exceeds their tolerance by rounding alone.
    pub layers: usize,
    /// Layers whose values overflow the target dtype's range (±Inf where the reference is
    /// finite): the model does not work in that precision there.
    pub overflow: usize,
    /// The last compared layer (the model's output), where the drift ends up.
    pub output: Option<String>,
    /// Its largest difference.
    #[serde(serialize_with = "crate::render::float")]
    pub output_max_abs_diff: f64,
    /// Its largest difference as a multiple of its tolerance.
    #[serde(serialize_with = "crate::render::float")]
    pub output_tolerance_multiple: f64,
}

impl Summary {
    /// [`Summary::most_own_error`] in words (`` `c1` 1.2e-2, `c2` 3.4e-3 ``), or `None`.
    pub fn own_error_text(&self) -> Option<String> {
        let ranked: Vec<String> = self
            .most_own_error
            .iter()
            .map(|w| format!("`{}` {:.3e}", w.layer, w.value))
            .collect();
        (!ranked.is_empty()).then(|| ranked.join(", "))
    }

    /// Whether a layer gets a cause: it exceeds its tolerance, accumulated or locally, or it is
    /// where an exceeding layer's error is traced back to (the drift origin among them).
    pub fn needs_cause(&self, layer: &Layer) -> bool {
        layer.exceeds_tol || layer.local_exceeds || self.is_source(layer)
    }

    /// Whether an exceeding layer's error is traced back to `layer`.
    pub fn is_source(&self, layer: &Layer) -> bool {
        self.sources.contains(&layer.name)
            || self.drift_origin.as_deref() == Some(layer.name.as_str())
    }

    /// Whether the cause of `layer` reads the evidence of its group (ops, precision, weights):
    /// it needs a cause and did not merely inherit its error (its own error measured and within
    /// tolerance, and no error traced back to it: `inherited`, whatever the group shows).
    pub fn needs_evidence(&self, layer: &Layer) -> bool {
        self.needs_cause(layer)
            && (self.is_source(layer) || layer.local.is_none() || layer.local_exceeds)
    }
}

/// The extremes across compared layers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorstLayers {
    /// Largest `max_abs_diff`.
    pub max_abs_diff: Option<WorstLayer>,
    /// Largest `mean_abs_diff`.
    pub mean_abs_diff: Option<WorstLayer>,
    /// Smallest `max_abs_diff`.
    pub min_max_abs_diff: Option<WorstLayer>,
}

/// A layer and one of its figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorstLayer {
    /// Layer name.
    pub layer: String,
    /// The figure.
    #[serde(serialize_with = "crate::render::float")]
    pub value: f64,
}

/// Whether a layer could be compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerStatus {
    /// Both sides have the value; `stats` holds the comparison.
    Compared,
    /// The sides' values have different element counts.
    ShapeMismatch,
    /// The target side has no value for this layer; `reason` says why.
    Unmapped,
}

/// One layer: a leaf-module call, or an ONNX value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layer {
    /// Position in execution order, from 0.
    pub index: usize,
    /// Layer name (`layer1.0.relu#2`).
    pub name: String,
    /// The PyTorch module class, when the reference is PyTorch.
    pub module_type: Option<String>,
    /// Comparison status.
    pub status: LayerStatus,
    /// Why the layer was not compared, or a note on how it was mapped.
    pub reason: Option<String>,
    /// Where the layer lives in the target (an ONNX value and its nodes), in its side's terms.
    pub location: Option<Location>,
    /// Reference shape.
    pub shape: Vec<usize>,
    /// Reference dtype.
    pub dtype: String,
    /// Target shape, when it differs from the reference.
    pub target_shape: Option<Vec<usize>>,
    /// Target dtype, when it differs from the reference.
    pub target_dtype: Option<String>,
    /// The tolerance that applied to this layer, per element.
    pub tolerance: crate::Bound,
    /// Accumulated error: both sides ran from the original inputs.
    pub accumulated: Option<Stats>,
    /// Local error: the layer's target nodes re-run on the reference's values of their inputs.
    pub local: Option<Stats>,
    /// The layers (or graph inputs) whose reference values fed the local re-run.
    pub local_inputs: Vec<String>,
    /// Why the local error was not measured, for a compared layer.
    pub local_reason: Option<String>,
    /// Whether the accumulated error exceeds the tolerance (strictly greater, any NaN mismatch,
    /// a shape mismatch, or a float compared with a non-float).
    pub exceeds_tol: bool,
    /// Whether the local error exceeds the tolerance.
    pub local_exceeds: bool,
    /// Each side's distance from the float64 truth, where it was computed (torch flow).
    pub float64: Option<Float64Distance>,
    /// What an ideal implementation in the target's dtype gets wrong on the inputs of the
    /// local re-run, and the own error against it (see [`crate::assess_baseline`]); where it
    /// was measured.
    pub baseline: Option<crate::Baseline>,
    /// Why no baseline was measured for a layer re-run locally, where none was.
    pub baseline_reason: Option<String>,
    /// What the layer's difference is, for a layer that exceeds its tolerance or where drift
    /// is born: `defect`, `precision`, `inherited` or `undecided`.
    pub finding: Option<Finding>,
    /// For an inherited difference: the upstream layer it mostly comes from (its error traced
    /// back along the input that carries the most of it, to the layer that added it).
    pub error_from: Option<String>,
    /// Why the layer differs, from a fixed vocabulary: `weight_mismatch`, `precision_loss`,
    /// `layout_permutation`, `shape_mismatch`, `op_implementation`, `inherited`,
    /// `nondeterminism`, `rounding`, `undecided`, `unknown`.
    pub cause: Option<String>,
    /// The cause in words.
    pub detail: Option<String>,
    /// The axis permutation that turns the reference into the target, for `layout_permutation`.
    pub permutation: Option<Vec<usize>>,
}

impl Layer {
    /// A layer not yet compared: status `unmapped`, no statistics, no cause.
    pub fn new(
        index: usize,
        name: impl Into<String>,
        shape: Vec<usize>,
        dtype: impl Into<String>,
    ) -> Self {
        Self {
            index,
            name: name.into(),
            module_type: None,
            status: LayerStatus::Unmapped,
            reason: None,
            location: None,
            shape,
            dtype: dtype.into(),
            target_shape: None,
            target_dtype: None,
            tolerance: crate::Bound::default(),
            accumulated: None,
            local: None,
            local_inputs: Vec::new(),
            local_reason: None,
            exceeds_tol: false,
            local_exceeds: false,
            float64: None,
            baseline: None,
            baseline_reason: None,
            finding: None,
            error_from: None,
            cause: None,
            detail: None,
            permutation: None,
        }
    }
}

/// What a layer's difference is (see [`Layer::finding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// It computes something its precision does not explain: a weight, an op, a layout or
    /// nondeterminism.
    Defect,
    /// Its own error is what its precision explains.
    Precision,
    /// Its own error is within its tolerance: the difference comes from upstream.
    Inherited,
    /// Its own error exceeds its tolerance and nothing measured tells rounding from a defect.
    Undecided,
}

/// Where a layer lives in the target, in the terms of the target's side: for an ONNX graph
/// (`kind` `onnx`), the value the layer maps to, the node producing it, its op type, and the
/// nodes of its group. A framework side names its own (a Keras layer and its class).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Location {
    /// Whose terms these are: `onnx`.
    pub kind: &'static str,
    /// The value the layer's output is, in that side.
    pub value: String,
    /// What produces it (an ONNX node's name).
    pub node: String,
    /// The producer's op (an ONNX op type).
    pub op: String,
    /// Everything that computes the layer from the values of the layers before it (the group
    /// its local error re-ran), in order; empty where that group is not known.
    pub nodes: Vec<String>,
}

impl Location {
    /// An ONNX value and its producer, the layer's other nodes not yet known.
    pub fn onnx(value: &str, node: &str, op_type: &str) -> Self {
        Self {
            kind: "onnx",
            value: value.to_string(),
            node: node.to_string(),
            op: op_type.to_string(),
            nodes: Vec::new(),
        }
    }
}

/// Each side's max abs distance from the same model run in float64.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Float64Distance {
    /// The reference's distance.
    #[serde(serialize_with = "crate::render::float")]
    pub reference: f64,
    /// The target's distance.
    #[serde(serialize_with = "crate::render::float")]
    pub target: f64,
}

impl Float64Distance {
    /// Which side is right, in words: both about equally far (rounding), or one side further.
    pub fn verdict(&self) -> String {
        let (r, t) = (self.reference, self.target);
        if r == 0.0 && t == 0.0 {
            "both sides match float64 exactly".to_string()
        } else if t <= crate::ROUNDING_FACTOR * r && r <= crate::ROUNDING_FACTOR * t {
            format!(
                "both sides are about equally far from float64 (reference {r:.2e}, target {t:.2e}): rounding, not a bug"
            )
        } else if t > r {
            format!(
                "the target is further from float64 (target {t:.2e}, reference {r:.2e}): the target is off"
            )
        } else {
            format!(
                "the reference is further from float64 (reference {r:.2e}, target {t:.2e}): the target is closer to the truth"
            )
        }
    }
}
