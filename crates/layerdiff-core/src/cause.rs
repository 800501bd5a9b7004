//! Causes: why a layer differs, from a fixed vocabulary, each with a sentence of detail, and
//! what kind of finding that is: a **defect** (the layer computes something its precision does
//! not explain), **precision** (what it adds of its own is what its dtype explains),
//! **inherited**, or **undecided** (nothing measured tells the two apart).
//!
//! The flows gather [`Evidence`] per layer (they know the graphs, weights and runtimes) and
//! measure each layer's own error against the same-precision baseline ([`crate::Baseline`]);
//! this module only decides, in a fixed order, for every layer that exceeds its tolerance
//! (accumulated or locally), every layer whose own error stays within it while beyond what its
//! precision explains ([`Layer::own_beyond`]: a layer of small values stays under the absolute
//! tolerance with any defect, and one that exceeds with what it inherits hides its own), and
//! every layer an exceeding layer's error is traced back to:
//!
//! 1. `inherited`: its own (local) error is within tolerance and within what its precision
//!    explains; the difference came from upstream, mostly from the layer it is traced back to
//!    (`error_from`);
//! 2. `layout_permutation` (defect): permuting the target onto the reference restores
//!    agreement; `shape_mismatch` (defect): the target's value has another shape, and no
//!    permutation maps one onto the other;
//! 3. `nondeterminism` (defect): a side run twice disagrees with itself here by more than the
//!    tolerance;
//! 4. `weight_mismatch` (defect): a parameter or initializer the layer uses differs between the
//!    sides beyond its rounding to the target's dtype;
//! 5. `precision_loss` (precision): the target's values overflow its narrower dtype's range to
//!    ±Inf where the reference's are finite;
//! 6. `op_implementation` (defect): an attribute of the target's nodes differs, or
//!    `file_differs` (defect) where the target computes what its file says (below);
//!    `argument_mismatch` (defect): the target's own code passes a framework call other
//!    numbers or flags (an epsilon computed from the dtype), and with them the layer is beyond
//!    what its precision explains;
//! 7. `precision_loss` (precision): the target's runtime does this float32 layer's products in
//!    lower precision (TF32 on a GPU), a mode it was asked for;
//! 8. against the baseline, where it was measured: own error beyond what the precision explains
//!    is `op_implementation` (defect: the kernel computes differently), unless the target's
//!    file is not the reference's computation and the target is within its own nodes computed
//!    exactly as the file writes them ([`Layer::as_written`]): then `file_differs` (defect: the
//!    runtime computes what the file says; the export or an edit changed it); a kernel that
//!    sums in the narrow dtype is `narrow_accumulation` (precision); within the baseline,
//!    `precision_loss` (a narrower dtype) or `rounding` (the same dtype) (precision);
//! 9. without a baseline: `rounding` (precision) where the float64 truth shows the target no
//!    further from it than twice the reference's own distance, or within its dtype's absolute
//!    tolerance of it, or where a traced origin's own error stays within its tolerance with
//!    nothing else different; otherwise `undecided`, whose detail says how to decide;
//! 10. `unknown` (undecided): the local error could not be measured and nothing else fits; the
//!     detail says what was ruled out.

use crate::{DType, Defect, Finding, Layer, LayoutFinding, Summary, TensorView};

mod conclude;
use conclude::conclude;
pub(crate) use conclude::overflows;
mod decide;
use decide::decide;
mod fix;
use fix::fix;
pub use fix::weights_fix;
mod files;
mod grid;
mod index;
mod name;
mod quantized;
mod reference;
mod truth;
pub use files::{FileDifference, attributes_differ, unseen_differences};
pub use grid::{precision_grid, quantizing_op};
pub use name::Cause;
#[cfg(test)]
mod tests;

/// What a flow found out about one layer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// A permutation under which the sides agree.
    pub layout: Option<LayoutFinding>,
    /// A side that disagrees with itself when run twice, and by how much (max abs diff).
    pub self_disagreement: Option<(String, f64)>,
    /// Parameters or initializers used by the layer that differ, with their difference.
    pub weights: Vec<String>,
    /// The target's nodes that read those weights (none where the side has no nodes): what
    /// the fix names, not every node of the layer.
    pub weight_readers: Vec<String>,
    /// How the target lowers precision here (`the target's values lie on the float16 grid`).
    pub precision: Option<String>,
    /// Attributes that differ between the sides' nodes (`` `epsilon` 1e-05 → 0.1 ``).
    pub attributes: Vec<String>,
    /// A framework call's numbers and flags the target's own code passes otherwise than the
    /// reference's (`` `eps` 1e-05 → 0.5 ``): its local re-run took the target's.
    pub arguments: Vec<String>,
    /// The grid the group's quantizing ops store or compute on, where it is not int8
    /// (`int4`: ONNX Runtime's MatMulNBits with 4 bits).
    pub quantized_to: Option<String>,
    /// What the target's file writes for the group, node by node (`` `node_gelu` Gelu
    /// (approximate tanh) ``, the constants it reads): what a `file_differs` names.
    pub written: Vec<String>,
    /// The target's op types in the re-run group, for the kernel sentence (`Conv`).
    pub ops: Vec<String>,
    /// How the target's runtime does this group's float32 math in lower precision (TF32 on a
    /// GPU), in words.
    pub reduced_math: Option<String>,
    /// The grid the reference's runtime computes this group's float32 math on, where it is a
    /// narrower dtype (OpenVINO's bfloat16 inference precision), and how, in words: the
    /// values the target is measured against carry that rounding.
    pub reference_lowered: Option<(DType, String)>,
    /// The grid the target quantizes one of the group's values to (its output, or a graph
    /// input it reads) that clips the largest share of the reference's values of it.
    pub clipped: Option<Clipped>,
}

/// A grid the target quantizes a value to, with the reference's values of it counted against
/// its range.
#[derive(Debug, Clone, PartialEq)]
pub struct Clipped {
    /// The value, in words (`this layer`, `` the input `input.1` ``).
    pub what: String,
    /// The target's node that quantizes it (its QuantizeLinear).
    pub node: String,
    /// The grid, its clipped elements counted.
    pub grid: crate::Quantization,
}

impl Evidence {
    /// `side` disagreed with itself by `d` when run twice (`None`: not measured): kept when it
    /// is the most disagreement seen here (the first side seen keeps a tie).
    pub fn disagrees(&mut self, side: &str, d: Option<f64>) {
        if let Some(d) = d
            && self
                .self_disagreement
                .as_ref()
                .is_none_or(|(_, seen)| d > *seen)
        {
            self.self_disagreement = Some((side.to_string(), d));
        }
    }

    /// The target's ops in the group, for a sentence (`Conv → Relu`; `nodes` when unknown).
    fn ops_words(&self) -> String {
        if self.ops.is_empty() {
            "nodes".to_string()
        } else {
            self.ops.join(" → ")
        }
    }

    /// What the target file's nodes write, in words (`its Conv → Relu` where nothing was
    /// told of them).
    fn written_words(&self) -> String {
        if self.written.is_empty() {
            format!("its {}", self.ops_words())
        } else {
            self.written.join(", ")
        }
    }

    /// What the two values of an exceeding layer show by themselves: a layout permutation, or
    /// target values on a lower-precision grid.
    pub fn from_values(layer: &Layer, reference: TensorView<'_>, target: TensorView<'_>) -> Self {
        let mut evidence = Self::default();
        if !(layer.exceeds_tol || layer.local_exceeds) {
            return evidence;
        }
        if layer.target_dtype.is_none() {
            evidence.layout = crate::detect_layout(reference, target, layer.tolerance.atol);
        }
        evidence.precision = precision_grid(reference, target).map(|grid| {
            format!(
                "the target's values lie on the {grid} grid: it computed or stored them in {grid}"
            )
        });
        evidence
    }
}

/// Sets `cause`, `detail` and `finding` on every layer that exceeds its tolerance and on every
/// layer an exceeding layer's error is traced back to; then the summary's verdict, its defects
/// (most severe first, each with what fixes it), the precision drift and the drift origin.
/// `evidence` is indexed like `layers` (missing entries mean no evidence).
pub fn explain(layers: &mut [Layer], evidence: &[Evidence], summary: &mut Summary) {
    let none = Evidence::default();
    let reached = reached(layers, summary);
    let mut defects: Vec<(usize, Defect)> = Vec::new();
    // each defect's cause and detail as decided, before the layer's own sentences
    let mut named_defects: Vec<String> = Vec::new();
    // each defect's layer, cause and the nodes its own error re-ran
    let mut defect_groups: Vec<(String, Cause, Vec<String>)> = Vec::new();
    // Layers whose precision is a quantization's (their grid for the summary).
    // the layers whose precision is a quantization's, with its grid (`int8`, `int4`)
    let mut quantized: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (i, layer) in layers.iter_mut().enumerate() {
        if !summary.needs_cause(layer) {
            continue;
        }
        let is_source = summary.is_source(layer);
        let e = evidence.get(i).unwrap_or(&none);
        let (cause, detail, finding) = decide(layer, e, is_source);
        // what the cause says before the sentences about this layer's figures are added
        let said = format!("{cause}: {detail}");
        let detail = in_context(layer, cause, finding, detail, is_source, &reached);
        layer.permutation = match cause {
            Cause::LayoutPermutation => e.layout.as_ref().map(|l| l.permutation.clone()),
            _ => None,
        };
        if finding == Finding::Precision && e.ops.iter().any(|op| quantizing_op(op)) {
            let grid = e.quantized_to.clone().unwrap_or_else(|| "int8".to_string());
            quantized.insert(layer.name.clone(), grid);
        }
        // A defect already named upstream in the same words (one changed weight two layers
        // read) is that defect once, whatever each layer's own figures; so is one whose
        // re-run took nodes of an earlier defect's group with the same cause (a value no layer
        // holds between them, a rotary table's sin beside its compared cos: the same edit
        // re-run twice).
        let shared = (finding == Finding::Defect)
            .then(|| shared_group(layer, cause, &defect_groups))
            .flatten();
        let named = named_defects.contains(&said) || shared.is_some();
        let detail = match shared {
            Some((upstream, nodes)) => format!(
                "{detail}; it re-runs nodes of `{upstream}`'s group ({nodes}), which carry that defect: the same one, not another"
            ),
            None => detail,
        };
        if finding == Finding::Defect
            && let Some(location) = &layer.location
        {
            defect_groups.push((layer.name.clone(), cause, location.nodes.clone()));
        }
        kernel_finding(summary, cause, layer, e);
        // (set before the fix is written: it reads what the detail says)
        layer.detail = Some(detail.clone());
        if finding == Finding::Defect && !named {
            named_defects.push(said);
            let own = layer.local.as_ref().or(layer.accumulated.as_ref());
            defects.push((
                layer.index,
                Defect {
                    layer: layer.name.clone(),
                    cause,
                    // (a baseline on the code the target runs says nothing of this defect)
                    multiple: layer
                        .baseline
                        .as_ref()
                        .filter(|b| b.reference_off == 0)
                        .filter(|_| !detail.contains(truth::TRUTH_FOLLOWS_TARGET))
                        .map(|b| b.multiple),
                    tolerance_multiple: own.and_then(crate::Stats::tolerance_multiple),
                    detail: detail.clone(),
                    fix: fix(cause, layer, e),
                },
            ));
        }
        layer.cause = Some(cause);
        layer.detail = Some(detail);
        layer.finding = Some(finding);
    }
    defects.sort_by(|(ia, a), (ib, b)| b.severity().total_cmp(&a.severity()).then(ia.cmp(ib)));
    // most beyond a float32-accumulating kernel first, as the defects; the approximations too
    summary
        .narrow_accumulation
        .sort_by(|a, b| b.multiple.total_cmp(&a.multiple));
    summary
        .approximations
        .sort_by(|a, b| b.multiple.total_cmp(&a.multiple));
    summary.defects = defects.into_iter().map(|(_, d)| d).collect();
    conclude(layers, summary, &quantized);
}

/// A kernel finding that is not a defect, listed in the summary beside the defects: an
/// approximation within every tolerance, or a kernel that accumulates in the narrow dtype.
fn kernel_finding(summary: &mut Summary, cause: Cause, layer: &Layer, e: &Evidence) {
    if cause == Cause::Approximation
        && let Some(b) = &layer.baseline
    {
        let own = layer
            .local
            .as_ref()
            .and_then(crate::Stats::tolerance_multiple);
        summary.approximations.push(crate::Approximation {
            layer: layer.name.clone(),
            ops: if e.ops.is_empty() {
                layer
                    .module_type
                    .clone()
                    .unwrap_or_else(|| "kernel".to_string())
            } else {
                e.ops_words()
            },
            dtype: b.grid.clone(),
            multiple: b.multiple,
            tolerance_multiple: own.unwrap_or(0.0),
            fix: fix(cause, layer, e),
        });
    }
    if cause == Cause::NarrowAccumulation
        && let Some((b, n)) = layer
            .baseline
            .as_ref()
            .and_then(|b| Some((b, b.narrow.as_ref()?)))
    {
        summary.narrow_accumulation.push(crate::NarrowKernel {
            layer: layer.name.clone(),
            dtype: b.grid.clone(),
            terms: n.terms,
            multiple: b.multiple,
            narrow_multiple: n.multiple,
            fix: fix(cause, layer, e),
        });
    }
}

/// The earlier defect of the same `cause` whose group shares nodes with `layer`'s, and those
/// nodes in words (the first three).
fn shared_group(
    layer: &Layer,
    cause: Cause,
    defects: &[(String, Cause, Vec<String>)],
) -> Option<(String, String)> {
    let nodes = &layer.location.as_ref()?.nodes;
    defects.iter().find_map(|(name, c, theirs)| {
        let shared: Vec<String> = (theirs.iter())
            .filter(|n| nodes.contains(n))
            .map(|n| format!("`{n}`"))
            .collect();
        (*c == cause && !shared.is_empty()).then(|| {
            let more = shared.len().saturating_sub(3);
            let shown = shared.into_iter().take(3).collect::<Vec<_>>().join(", ");
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            (name.clone(), format!("{shown}{more}"))
        })
    })
}

/// For each layer errors are traced back to: the first exceeding layer traced to it, its
/// difference and tolerance, to say how it came to exceed.
type Reached = std::collections::HashMap<String, (String, f64, crate::Bound)>;

fn reached(layers: &[Layer], summary: &Summary) -> Reached {
    let max = |l: &Layer| l.accumulated.as_ref().map_or(0.0, |s| s.max_abs_diff);
    let mut reached: Reached = std::collections::HashMap::new();
    for l in layers.iter().filter(|l| l.exceeds_tol) {
        let from = l.error_from.clone().unwrap_or_else(|| l.name.clone());
        reached
            .entry(from)
            .or_insert((l.name.clone(), max(l), l.tolerance));
    }
    if let (Some(origin), Some(first)) = (&summary.drift_origin, &summary.first_exceeding)
        && let Some(l) = layers.iter().find(|l| &l.name == first)
    {
        reached
            .entry(origin.clone())
            .or_insert((first.clone(), max(l), l.tolerance));
    }
    reached
}

/// A layer's `detail` with what its own figures add: how a source within its tolerance came
/// to exceed downstream (`reached`), why a layer within its tolerance is judged by its
/// precision, where a source's exceeding difference comes from, and the float64 truth's word.
fn in_context(
    layer: &Layer,
    cause: Cause,
    finding: Finding,
    mut detail: String,
    is_source: bool,
    reached: &Reached,
) -> String {
    let max = |l: &Layer| l.accumulated.as_ref().map_or(0.0, |s| s.max_abs_diff);
    if is_source && !layer.exceeds_tol && !layer.local_exceeds {
        let (name, d, tol) = reached.get(&layer.name).cloned().unwrap_or((
            "a later layer".to_string(),
            0.0,
            layer.tolerance,
        ));
        // Not amplified when the difference arrives about as large: the later layer is
        // held to a tighter tolerance (it computes in a wider dtype again).
        let how = if d <= 1.5 * max(layer) && tol != layer.tolerance {
            format!(
                "is carried downstream to `{name}`, which computes in a wider dtype again and exceeds its tighter tolerance {tol} with it"
            )
        } else {
            format!("is amplified downstream until `{name}` exceeds it")
        };
        detail = format!(
            "{detail}; on its own this stays within the tolerance {} and {how}",
            layer.tolerance
        );
    }
    if !is_source && !layer.own_exceeds() && layer.own_beyond() && cause != Cause::Approximation {
        detail = if layer.exceeds_tol {
            format!(
                "{detail}; its own error stays within the tolerance {} (local max abs diff {:.3e}), and it exceeds with what it inherits (mostly from `{}`): it is judged by what its precision explains, not by the tolerance",
                layer.tolerance,
                layer.local.as_ref().map_or(0.0, |s| s.max_abs_diff),
                layer.error_from.as_deref().unwrap_or("upstream")
            )
        } else {
            format!(
                "{detail}; its values are small enough that this stays within the tolerance {} (max abs diff {:.3e}): it is judged by what its precision explains, not by the tolerance",
                layer.tolerance,
                max(layer)
            )
        };
    }
    if is_source
        && layer.exceeds_tol
        && !layer.local_exceeds
        && !matches!(cause, Cause::Inherited | Cause::Unknown)
    {
        detail = match &layer.error_from {
            // Its own error is most of what it hands on, within its tolerance alone.
            Some(from) if own_share(layer) >= crate::BORN_HERE => format!(
                "{detail}; its own error is within its tolerance {} and most of the difference it hands on, which exceeds with what comes from upstream (mostly from `{from}`)",
                layer.tolerance
            ),
            Some(from) => format!(
                "{detail}; the difference it hands on comes mostly from upstream, from `{from}`"
            ),
            None => format!(
                "{detail}; the difference it hands on is in its inputs already, born in computation no compared layer covers{}",
                if gradient(layer) {
                    " (the forward pass, for a gradient)"
                } else {
                    ""
                }
            ),
        };
    }
    if !matches!(cause, Cause::Inherited | Cause::Rounding)
        && let Some(f) = &layer.float64
    {
        let dtypes = (
            crate::DType::from_name(&layer.dtype),
            layer.target_dtype.as_deref().map(crate::DType::from_name),
        );
        let said = match dtypes {
            // said already, as what the truth cannot stand for
            _ if detail.contains(truth::TRUTH_FOLLOWS_TARGET) => String::new(),
            _ if finding == Finding::Precision => f.verdict_of_precision(),
            (Ok(r), Some(Ok(t))) if r.narrower_than(t) => f.verdict_beside_coarser(r, t),
            _ => f.verdict(),
        };
        if !said.is_empty() {
            detail = format!("{detail}; {said}");
        }
    }
    detail
}

/// Whether `layer` is a gradient (`layerdiff grad`'s layers are named for what they are the
/// gradient of: a parameter, `inputs[0]`, or what a call's backward hands on, `fc:input`).
fn gradient(layer: &Layer) -> bool {
    let name = layer.name.as_str();
    let name = rank_of(layer).map_or(name, |(of, _)| of);
    name.ends_with(":input")
        || name.starts_with("inputs[")
        || (name.ends_with(".weight") || name.ends_with(".bias"))
}

/// A data-parallel rank's gradient before the all-reduce (`fc.weight:rank1`): what it is the
/// gradient of, and the rank.
pub(crate) fn rank_of(layer: &Layer) -> Option<(&str, &str)> {
    let (of, rank) = layer.name.rsplit_once(":rank")?;
    (!rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit())).then_some((of, rank))
}

/// A layer's own (local) error as a share of its accumulated error (0 when either is missing).
fn own_share(layer: &Layer) -> f64 {
    match (&layer.local, &layer.accumulated) {
        (Some(l), Some(a)) if a.max_abs_diff > 0.0 => l.max_abs_diff / a.max_abs_diff,
        _ => 0.0,
    }
}
