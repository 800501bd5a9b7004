//! One layer of a report: where it lives, how it compared, and what its difference is.

use super::{Serialize, Stats};
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
    /// For a layer beyond its baseline whose target runs a file that is not the reference's
    /// own computation (an ONNX file against PyTorch, or against another file): the own error
    /// against the target's nodes computed exactly (float64) as its file writes them, on the
    /// same inputs. Within it, the runtime computes what the file says, and the file differs
    /// (`file_differs`); beyond it too, the kernel does (`op_implementation`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_written: Option<crate::Baseline>,
    /// Why the layer could not be computed as its file writes it, where it was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_written_reason: Option<String>,
    /// The grid the target quantizes this layer's value to (TFLite's int8), with how much of it
    /// clips and its own error in steps; its `local` is then measured on the target's own
    /// inputs and its `baseline` is the ideal quantized computation (see
    /// [`crate::assess_quantized`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<crate::Quantization>,
    /// What the layer's difference is, for a layer that exceeds its tolerance or where drift
    /// is born: `defect`, `precision`, `inherited` or `undecided`.
    pub finding: Option<Finding>,
    /// For an inherited difference: the upstream layer it mostly comes from (its error traced
    /// back along the input that carries the most of it, to the layer that added it).
    pub error_from: Option<String>,
    /// Why the layer differs, from the fixed vocabulary of [`crate::Cause`] (written as its
    /// name: `weight_mismatch`, `op_implementation`, …).
    pub cause: Option<crate::Cause>,
    /// The cause in words.
    pub detail: Option<String>,
    /// The axis permutation that turns the reference into the target, for `layout_permutation`.
    pub permutation: Option<Vec<usize>>,
    /// Where inside the target's fused node(s) the layer's difference is born, when the
    /// optimizer left no value between the layer and the values compared before it: each
    /// reference node of the fused region run alone on the target's runtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inside: Option<Inside>,
}

/// The reference node inside a fusion that carries a layer's difference (see [`Layer::inside`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inside {
    /// The target's node(s) that fused the region.
    pub fused: Vec<String>,
    /// The first reference node that, run alone on the reference's values, exceeds its
    /// tolerance.
    pub node: String,
    /// Its op.
    pub op: String,
    /// The value it produces (which the optimized graph does not have).
    pub value: String,
    /// Its largest difference, run alone.
    #[serde(serialize_with = "crate::floats::float")]
    pub max_abs_diff: f64,
    /// That difference as a multiple of the tolerance.
    #[serde(serialize_with = "crate::floats::float")]
    pub tolerance_multiple: f64,
    /// The region's other nodes, each within the tolerance run alone.
    pub agree: Vec<String>,
    /// How its attributes differ from the reference's node of the same name and op, one line
    /// each (``epsilon` 1e-5 → 0.5 on `ln``): the file's doing, not the runtime's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<String>,
    /// Its weights that differ from the reference's of the same name, one line each: the
    /// file's doing too (an optimizer that reorders a weight leaves no name to check it by,
    /// but the file's own node still has it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<String>,
}

impl Inside {
    /// The narrowing in one sentence.
    pub fn sentence(&self) -> String {
        let fused: Vec<String> = self.fused.iter().map(|n| format!("`{n}`")).collect();
        let agree = if self.agree.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = self.agree.iter().map(|n| format!("`{n}`")).collect();
            format!("; {} alone agree(s)", names.join(", "))
        };
        format!(
            "born inside the fused {}: narrowed to `{}` ({}, its value `{}` is gone from the optimized graph), which alone on the reference's inputs differs by {:.3e} ({:.1}× the tolerance){agree}",
            fused.join(", "),
            self.node,
            self.op,
            self.value,
            self.max_abs_diff,
            self.tolerance_multiple
        )
    }
}

impl Layer {
    /// Its shape as the reports write it (`1×64×56×56`).
    pub fn shape_text(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(usize::to_string).collect();
        dims.join("×")
    }

    /// Whether its own error exceeds its tolerance: its local error, or its whole difference
    /// where it has no local one.
    pub fn own_exceeds(&self) -> bool {
        self.local_exceeds || (self.local.is_none() && self.exceeds_tol)
    }

    /// Whether its own error is beyond what its precision explains (its same-precision
    /// baseline, [`crate::Baseline::beyond`]): judged scale-free where its own error exceeds
    /// its tolerance, and beyond [`crate::WITHIN_TOLERANCE_MARGIN`] where it does not: a layer
    /// of small values stays under the absolute tolerance with any defect, and a layer that
    /// exceeds only with what it inherits hides its own defect in the difference from upstream.
    pub fn own_beyond(&self) -> bool {
        self.baseline.as_ref().is_some_and(|b| {
            b.beyond() && (self.own_exceeds() || b.multiple > crate::WITHIN_TOLERANCE_MARGIN)
        })
    }

    /// The layer computed as its target's file writes it ([`Layer::as_written`]), where the
    /// target is within that: the runtime computes what the file says, and the file is what
    /// differs from the reference.
    pub fn computes_as_written(&self) -> Option<&crate::Baseline> {
        self.as_written.as_ref().filter(|w| !w.beyond())
    }

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
            as_written: None,
            as_written_reason: None,
            quantization: None,
            finding: None,
            error_from: None,
            cause: None,
            detail: None,
            permutation: None,
            inside: None,
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
    /// Its kernel computes beyond what its precision explains, and the effect stays within
    /// every tolerance (its own, its value's, and no layer after it exceeds by it): an
    /// approximation, named in the summary; not a defect unless `--fail-on approximation`.
    Approximation,
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

/// A target at most this many times as far from the float64 truth as the reference is only
/// rounding, as the reference does (the same factor that makes the two "about equally far").
pub const ROUNDING_FACTOR: f64 = 2.0;

/// How many times the ratio of their steps a reference that rounds coarser than the target
/// may be further from float64 than the target before it, not its rounding, is what is off.
pub const COARSER_OFF_FACTOR: f64 = 4.0;

/// Each side's max abs distance from the same model run in float64.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Float64Distance {
    /// The reference's distance.
    #[serde(serialize_with = "crate::floats::float")]
    pub reference: f64,
    /// The target's distance.
    #[serde(serialize_with = "crate::floats::float")]
    pub target: f64,
}

impl Float64Distance {
    /// Which side is right, in words, for a layer whose finding is a defect or undecided: both
    /// about equally far (rounding), or one side further.
    pub fn verdict(&self) -> String {
        self.said(false)
    }

    /// The same for a layer whose own error its precision explains: a target further from
    /// float64 is its lower precision, not a target that is off.
    pub fn verdict_of_precision(&self) -> String {
        self.said(true)
    }

    /// The same for a defect or undecided layer whose reference rounds coarser than the
    /// target (`reference`, `target`: their dtypes, a bfloat16 reference of a float16
    /// target): the reference's own rounding is most of its distance, so two sides about
    /// equally far say nothing of the target's kernel; only a target far further is off.
    pub fn verdict_beside_coarser(&self, reference: crate::DType, target: crate::DType) -> String {
        let (r, t) = (self.reference, self.target);
        // how many times coarser the reference's steps are (8 for bfloat16 beside float16)
        let bits = |d: crate::DType| d.mantissa_bits().unwrap_or(53) as i32;
        let coarser = 2f64.powi(bits(target) - bits(reference));
        let (reference, target) = (reference.name(), target.name());
        if t > ROUNDING_FACTOR * r {
            format!(
                "the target is further from float64 than even the {reference} reference (target {t:.2e}, reference {r:.2e}): the target is off"
            )
        } else if r > COARSER_OFF_FACTOR * coarser * t {
            format!(
                "the {reference} reference is {:.0} times as far from float64 as the target (reference {r:.2e}, target {t:.2e}), where its steps, {coarser} times as coarse, explain about {coarser}: the reference is off here, not the target",
                r / t
            )
        } else {
            format!(
                "the {reference} reference's own rounding keeps it about as far from float64 or further (reference {r:.2e}, target {t:.2e}), which cannot tell a {target} kernel's error: the {target} ideal above does"
            )
        }
    }

    fn said(&self, precision: bool) -> String {
        let (r, t) = (self.reference, self.target);
        if r == 0.0 && t == 0.0 {
            "both sides match float64 exactly".to_string()
        } else if t <= ROUNDING_FACTOR * r && r <= ROUNDING_FACTOR * t {
            format!(
                "both sides are about equally far from float64 (reference {r:.2e}, target {t:.2e}): rounding, not a bug"
            )
        } else if t > r && precision {
            format!(
                "the target is further from float64 (target {t:.2e}, reference {r:.2e}), as its precision explains"
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn beside_a_coarser_reference_the_truth_tells_which_side_is_off_only_far_out() {
        let said = |reference, target| {
            Float64Distance { reference, target }.verdict_beside_coarser(DType::BF16, DType::F16)
        };
        // about the 8× bfloat16's steps are: its rounding, which says nothing of the target
        assert!(said(8e-3, 1e-3).contains("cannot tell a float16 kernel's error"));
        assert!(said(1e-3, 3e-3).contains("the target is off"));
        // 840× (an epsilon of 0.5 in the reference's own bfloat16 path)
        let off = said(1.43, 1.7e-3);
        assert!(
            off.contains("the reference is off here, not the target"),
            "{off}"
        );
        assert!(off.contains("841 times as far"), "{off}");
    }
}
