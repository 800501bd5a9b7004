//! The report: one serialisable model that every renderer reads. Field order is JSON key order.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::Stats;

mod compiled;
mod keep;
mod layer;
pub use compiled::{CompiledWhole, ModuleCompiled};
pub use keep::{AdviceCheck, KeepFloat32, KeptLayer};
pub use layer::{Finding, Float64Distance, Inside, Layer, LayerStatus, Location, ROUNDING_FACTOR};
mod summary;
pub use summary::{
    Approximation, Defect, ExactOutput, FailOn, NarrowKernel, PrecisionDrift, Summary, Verdict,
    WorstLayer, WorstLayers,
};

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
    /// What turns the difference on, when it was bisected (`--bisect`): the ONNX Runtime
    /// optimizers, compiler stages or layers kept in float32 whose switch makes the run clean,
    /// checked by running it that way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bisection: Option<crate::Bisection>,
    /// How a target that cannot show its layers was searched (`--opaque`): the node ranges its
    /// graph ran on unmodified, and the node they narrowed to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opaque: Option<crate::OpaqueSearch>,
    /// A torch.compile target: the whole model compiled at once against the same side eager,
    /// and, where it differs, the smallest module whose compiled form differs (see
    /// [`crate::CompiledWhole`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compiled_whole: Option<crate::CompiledWhole>,
    /// The machine it was made on: with the sides' versions, what decides whether another run
    /// gives the same bytes (see [`crate::Machine`]).
    pub machine: crate::Machine,
    /// Where the time went, phase by phase; only with `--timings` (times are not deterministic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Vec<Timing>>,
}

/// A command line and the folder it ran in: kept in the metadata of the inputs saved beside a
/// report (`invocation`, as JSON), not in the report, whose bytes stay the same wherever it is
/// written; `layerdiff reduce` runs it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Invocation {
    /// The arguments after the program's name, as given.
    pub argv: Vec<String>,
    /// The working folder, which relative paths in `argv` are relative to.
    pub cwd: String,
}

impl Invocation {
    /// The command line `argv` (the program's name first), run in this process's working
    /// folder.
    pub fn of(argv: &[std::ffi::OsString]) -> Self {
        Self {
            argv: argv
                .iter()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            cwd: std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
        }
    }

    /// The command line as one would type it (`layerdiff onnx model.onnx --target tract`).
    pub fn text(&self) -> String {
        let quoted: Vec<String> = self
            .argv
            .iter()
            .map(|a| {
                if !a.is_empty()
                    && a.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.,:=/@+".contains(c))
                {
                    a.clone()
                } else {
                    format!("'{}'", a.replace('\'', "'\\''"))
                }
            })
            .collect();
        format!("layerdiff {}", quoted.join(" "))
    }
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
    #[serde(serialize_with = "crate::floats::float")]
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

/// `detail` with a narrowing's `attributes` (in place of it with `replace`, else after it) and
/// its `sentence`.
fn told(detail: &mut String, attributes: Option<&str>, replace: bool, sentence: &str) {
    match attributes {
        Some(changed) if replace => {
            detail.clear();
            then(detail, changed);
        }
        // said already (the files' own difference found it)
        Some(changed) if detail.contains(changed) => {}
        Some(changed) => then(detail, changed),
        None => {}
    }
    then(detail, sentence);
}

/// `text` after `detail`, separated by a semicolon.
fn then(detail: &mut String, text: &str) {
    if !detail.is_empty() {
        detail.push_str("; ");
    }
    detail.push_str(text);
}

impl Report {
    /// The layer a repro shows: the first defect's; else the first layer whose own error
    /// exceeds its tolerance; else the kernel that approximates the most. `Err` says why there
    /// is none (a clean run; drift that only accumulates).
    pub fn headline(&self) -> std::result::Result<&Layer, String> {
        let by_name = |name: &str| self.layers.iter().find(|l| l.name == name);
        if let Some(layer) = self.summary.defects.first().and_then(|d| by_name(&d.layer)) {
            return Ok(layer);
        }
        if let Some(layer) = self.layers.iter().find(|l| l.local_exceeds) {
            return Ok(layer);
        }
        // a kernel that approximates within every tolerance: the most beyond, as the headline
        // names it first
        if let Some(layer) = (self.summary.approximations.first()).and_then(|a| by_name(&a.layer)) {
            return Ok(layer);
        }
        Err(if self.summary.layers_exceeding == 0 {
            "no layer exceeds its tolerance: there is nothing to reproduce".to_string()
        } else {
            "no layer's own error exceeds its tolerance: the drift only accumulates from rounding \
             within it, which no small piece shows (`--bisect` names what turns it on)"
                .to_string()
        })
    }

    /// Says where inside a fusion `layer`'s difference is born: on the layer, and in its words
    /// and its defect's.
    ///
    /// Where the node it was narrowed to has other attributes than the reference's and the
    /// cause was the kernel (`op_implementation`), the attribute is the cause, in front, and the
    /// fix is the attribute rather than the kernel; beside another cause (a weight that differs
    /// too) it is said after that cause, which stays.
    pub fn narrowed(&mut self, layer: &str, inside: Inside) {
        let sentence = inside.sentence();
        let attributes =
            (!inside.attributes.is_empty()).then(|| crate::attributes_differ(&inside.attributes));
        let kernel = |cause: Option<crate::Cause>| cause == Some(crate::Cause::OpImplementation);
        // A weight of the node that differs is what the kernel was blamed for: the file's
        // weight, the same defect as a weight read by name.
        let weight = (!inside.weights.is_empty()).then(|| {
            let also = attributes
                .as_deref()
                .map(|a| format!("; {a}"))
                .unwrap_or_default();
            (
                format!(
                    "{}: the fused region reads a weight that is not the reference's{also}",
                    inside.weights.join("; ")
                ),
                crate::weights_fix(
                    &format!("the target's node(s) `{}`", inside.node),
                    &inside.weights,
                ),
            )
        });
        if let Some(l) = self.layers.iter_mut().find(|l| l.name == layer) {
            let replace = kernel(l.cause);
            let detail = l.detail.get_or_insert_with(String::new);
            match &weight {
                Some((words, _)) if replace => {
                    *detail = format!("{words}; {sentence}");
                    l.cause = Some(crate::Cause::WeightMismatch);
                }
                _ => told(detail, attributes.as_deref(), replace, &sentence),
            }
            l.inside = Some(inside.clone());
        }
        let mut weighed = false;
        for defect in self.summary.defects.iter_mut().filter(|d| d.layer == layer) {
            let replace = kernel(Some(defect.cause));
            if let (true, Some((words, fix))) = (replace, &weight) {
                defect.cause = crate::Cause::WeightMismatch;
                defect.detail = format!("{words}; {sentence}");
                defect.fix = fix.clone();
                weighed = true;
                continue;
            }
            told(
                &mut defect.detail,
                attributes.as_deref(),
                replace,
                &sentence,
            );
            if replace && attributes.is_some() {
                defect.fix = format!(
                    "give `{}` the reference's attribute values back (reference → target: {}); the runtime computes the node as the file says",
                    inside.node,
                    inside.attributes.join(", ")
                );
            }
        }
        // The node's own value found the same weight from the files alone; the narrowed
        // defect says it where it shows, so it is said once.
        if weighed {
            self.summary
                .defects
                .retain(|d| !(d.layer == inside.value && d.cause == crate::Cause::WeightMismatch));
        }
    }

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
    #[serde(serialize_with = "crate::floats::float")]
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

#[cfg(test)]
impl Report {
    /// A report of `layers`, judged against a fixed tolerance of 1e-3 (analysed and explained
    /// here), as the tests build one: command `test`, sides `r` and `t`, no timings.
    pub(crate) fn of_layers(model: &str, mut layers: Vec<Layer>) -> Report {
        let tolerance = crate::Tolerance::Fixed(1e-3);
        let mut summary = crate::analyse(&mut layers, tolerance);
        crate::explain(&mut layers, &[], &mut summary);
        Report {
            schema: SCHEMA,
            command: "test".to_string(),
            model: model.to_string(),
            reference: SideInfo::new("r", "r"),
            target: SideInfo::new("t", "t"),
            target_graph: None,
            truth: None,
            mode: "local".to_string(),
            tolerance: tolerance.info(),
            seed: None,
            inputs: Vec::new(),
            summary,
            layers,
            keep_float32: None,
            bisection: None,
            opaque: None,
            compiled_whole: None,
            machine: crate::Machine::this(),
            timings: None,
        }
    }
}
