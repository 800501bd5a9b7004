//! Causes: why a layer differs, from a fixed vocabulary, each with a sentence of detail, and
//! what kind of finding that is: a **defect** (the layer computes something its precision does
//! not explain), **precision** (what it adds of its own is what its dtype explains),
//! **inherited**, or **undecided** (nothing measured tells the two apart).
//!
//! The flows gather [`Evidence`] per layer (they know the graphs, weights and runtimes) and
//! measure each layer's own error against the same-precision baseline ([`crate::Baseline`]);
//! this module only decides, in a fixed order, for every layer that exceeds its tolerance
//! (accumulated or locally) and every layer an exceeding layer's error is traced back to:
//!
//! 1. `inherited`: its own (local) error is within tolerance; the difference came from
//!    upstream, mostly from the layer it is traced back to (`error_from`);
//! 2. `layout_permutation` (defect): permuting the target onto the reference restores
//!    agreement; `shape_mismatch` (defect): the target's value has another shape, and no
//!    permutation maps one onto the other;
//! 3. `nondeterminism` (defect): a side run twice disagrees with itself here by more than the
//!    tolerance;
//! 4. `weight_mismatch` (defect): a parameter or initializer the layer uses differs between the
//!    sides beyond its rounding to the target's dtype;
//! 5. `precision_loss` (precision): the target's values overflow its narrower dtype's range to
//!    ±Inf where the reference's are finite;
//! 6. `op_implementation` (defect): an attribute of the target's nodes differs;
//! 7. `precision_loss` (precision): the target's runtime does this float32 layer's products in
//!    lower precision (TF32 on a GPU), a mode it was asked for;
//! 8. against the baseline, where it was measured: own error beyond what the precision explains
//!    is `op_implementation` (defect: the kernel computes differently); within it,
//!    `precision_loss` (a narrower dtype) or `rounding` (the same dtype) (precision);
//! 9. without a baseline: `rounding` (precision) where the float64 truth shows the target no
//!    further from it than twice the reference's own distance, or within its dtype's absolute
//!    tolerance of it, or where a traced origin's own error stays within its tolerance with
//!    nothing else different; otherwise `undecided`, whose detail says how to decide;
//! 10. `unknown` (undecided): the local error could not be measured and nothing else fits; the
//!     detail says what was ruled out.

use crate::{
    DType, Defect, Finding, Layer, LayoutFinding, PrecisionDrift, Summary, TensorView, Verdict,
};

/// A target at most this many times as far from the float64 truth as the reference is only
/// rounding, as the reference does (the same factor that makes the two "about equally far").
pub const ROUNDING_FACTOR: f64 = 2.0;

/// What a flow found out about one layer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// A permutation under which the sides agree.
    pub layout: Option<LayoutFinding>,
    /// A side that disagrees with itself when run twice, and by how much (max abs diff).
    pub self_disagreement: Option<(String, f64)>,
    /// Parameters or initializers used by the layer that differ, with their difference.
    pub weights: Vec<String>,
    /// How the target lowers precision here (`the target's values lie on the float16 grid`).
    pub precision: Option<String>,
    /// Attributes that differ between the sides' nodes (`` `epsilon` 1e-05 → 0.1 ``).
    pub attributes: Vec<String>,
    /// The target's op types in the re-run group, for the kernel sentence (`Conv`).
    pub ops: Vec<String>,
    /// How the target's runtime does this group's float32 math in lower precision (TF32 on a
    /// GPU), in words.
    pub reduced_math: Option<String>,
}

impl Evidence {
    /// The target's ops in the group, for a sentence (`Conv → Relu`; `nodes` when unknown).
    fn ops_words(&self) -> String {
        if self.ops.is_empty() {
            "nodes".to_string()
        } else {
            self.ops.join(" → ")
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
    let max = |l: &Layer| l.accumulated.as_ref().map_or(0.0, |s| s.max_abs_diff);
    // For each layer errors are traced back to: the first exceeding layer traced to it, its
    // difference and tolerance, to say how it came to exceed.
    let mut reached: std::collections::HashMap<String, (String, f64, crate::Bound)> =
        std::collections::HashMap::new();
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
    let mut defects: Vec<(usize, Defect)> = Vec::new();
    // Layers whose precision is a quantization's (their grid for the summary).
    let mut quantized: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (i, layer) in layers.iter_mut().enumerate() {
        if !summary.needs_cause(layer) {
            continue;
        }
        let is_source = summary.is_source(layer);
        let e = evidence.get(i).unwrap_or(&none);
        let (cause, mut detail, finding) = decide(layer, e, is_source);
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
        if is_source
            && layer.exceeds_tol
            && !layer.local_exceeds
            && !matches!(cause, "inherited" | "unknown")
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
                    "{detail}; the difference it hands on is in its inputs already, born in computation no compared layer covers (for a gradient: the forward pass)"
                ),
            };
        }
        if !matches!(cause, "inherited" | "rounding")
            && let Some(f) = &layer.float64
        {
            detail = format!("{detail}; {}", f.verdict());
        }
        layer.permutation = match cause {
            "layout_permutation" => e.layout.as_ref().map(|l| l.permutation.clone()),
            _ => None,
        };
        if finding == Finding::Precision && e.ops.iter().any(|op| quantizing_op(op)) {
            quantized.insert(layer.name.clone());
        }
        // A defect already named upstream in the same words (one changed weight two layers
        // re-run) is that defect once.
        let named = defects
            .iter()
            .any(|(_, d)| d.cause == cause && d.detail == detail);
        if finding == Finding::Defect && !named {
            let own = layer.local.as_ref().or(layer.accumulated.as_ref());
            defects.push((
                layer.index,
                Defect {
                    layer: layer.name.clone(),
                    cause: cause.to_string(),
                    multiple: layer
                        .baseline
                        .as_ref()
                        .filter(|b| b.reference_off == 0)
                        .map(|b| b.multiple),
                    tolerance_multiple: own.and_then(crate::Stats::tolerance_multiple),
                    detail: detail.clone(),
                    fix: fix(cause, layer, e),
                },
            ));
        }
        layer.cause = Some(cause.to_string());
        layer.detail = Some(detail);
        layer.finding = Some(finding);
    }
    defects.sort_by(|(ia, a), (ib, b)| b.severity().total_cmp(&a.severity()).then(ia.cmp(ib)));
    summary.defects = defects.into_iter().map(|(_, d)| d).collect();
    conclude(layers, summary, &quantized);
}

/// A layer's own (local) error as a share of its accumulated error (0 when either is missing).
fn own_share(layer: &Layer) -> f64 {
    match (&layer.local, &layer.accumulated) {
        (Some(l), Some(a)) if a.max_abs_diff > 0.0 => l.max_abs_diff / a.max_abs_diff,
        _ => 0.0,
    }
}

/// The summary's verdict, precision drift and drift origin, from the layers' findings
/// (`quantized`: the layers whose precision is an int8 quantization's).
fn conclude(
    layers: &[Layer],
    summary: &mut Summary,
    quantized: &std::collections::HashSet<String>,
) {
    let own = |l: &Layer| l.local_exceeds || (l.local.is_none() && l.exceeds_tol);
    let failing = layers.iter().find(|l| {
        matches!(l.finding, Some(Finding::Defect | Finding::Undecided))
            && (own(l) || summary.is_source(l))
    });
    let precision: Vec<&Layer> = layers
        .iter()
        .filter(|l| l.finding == Some(Finding::Precision))
        .collect();
    let precision_origin = precision
        .iter()
        .find(|l| own(l) || summary.is_source(l))
        .map(|l| l.name.clone());
    summary.precision = precision_origin.as_ref().map(|origin| {
        let mut grids: Vec<(String, usize)> = Vec::new();
        for l in &precision {
            let grid = l.baseline.as_ref().map(|b| b.grid.clone()).or_else(|| {
                if quantized.contains(&l.name) {
                    return Some("int8".to_string());
                }
                crate::lower_precision(&l.dtype, l.target_dtype.as_deref())
                    .map(|d| d.name().to_string())
            });
            if let Some(g) = grid {
                match grids.iter_mut().find(|(d, _)| *d == g) {
                    Some((_, n)) => *n += 1,
                    None => grids.push((g, 1)),
                }
            }
        }
        let output = layers.iter().rev().find(|l| l.accumulated.is_some());
        let stats = output.and_then(|l| l.accumulated.as_ref());
        PrecisionDrift {
            dtype: grids
                .into_iter()
                .max_by_key(|(_, n)| *n)
                .map_or_else(|| "float32".to_string(), |(g, _)| g),
            origin: Some(origin.clone()),
            layers: precision.iter().filter(|l| own(l)).count(),
            overflow: precision.iter().filter(|l| overflows(l)).count(),
            output: output.map(|l| l.name.clone()),
            output_max_abs_diff: stats.map_or(0.0, |s| s.max_abs_diff),
            output_tolerance_multiple: stats
                .and_then(crate::Stats::tolerance_multiple)
                .unwrap_or(0.0),
        }
    });
    if let Some(first) = failing {
        summary.drift_origin = Some(first.name.clone());
    } else if precision_origin.is_some() {
        summary.drift_origin = precision_origin;
    }
    let undecided = layers
        .iter()
        .any(|l| l.finding == Some(Finding::Undecided) && (own(l) || summary.is_source(l)));
    summary.verdict = if !summary.defects.is_empty() {
        Verdict::Defect
    } else if undecided {
        Verdict::Undecided
    } else if summary.precision.is_some() {
        Verdict::Precision
    } else if summary.inconclusive.is_some() {
        Verdict::Inconclusive
    } else {
        Verdict::NoDrift
    };
}

/// Whether the target's own values of a layer overflow to ±Inf where the reference's are
/// finite.
fn overflows(layer: &Layer) -> bool {
    let own = layer.local.as_ref().or(layer.accumulated.as_ref());
    own.is_some_and(|s| nonfinite_target(s) > 0)
}

/// How many of a layer's values are ±Inf or NaN on the target where the reference's are not
/// (an overflow, or what a later op makes of one: a LayerNorm of ±Inf is NaN).
fn nonfinite_target(s: &crate::Stats) -> u64 {
    (s.inf_target + s.nan_target).saturating_sub(s.inf_reference + s.nan_reference)
}

/// A cause, its detail and the finding it makes, for one layer (see the module docs).
fn decide(layer: &Layer, e: &Evidence, is_source: bool) -> (&'static str, String, Finding) {
    let max = |s: &Option<crate::Stats>| s.as_ref().map_or(0.0, |s| s.max_abs_diff);
    let tol = layer.tolerance;
    if layer.local.is_some() && !layer.local_exceeds && !is_source {
        let from = layer
            .error_from
            .as_deref()
            .map_or(String::new(), |o| format!(", mostly from `{o}`"));
        return (
            "inherited",
            format!(
                "its own error (local max abs diff {:.3e}) is within the tolerance {tol}; the difference ({:.3e}) comes from upstream{from}",
                max(&layer.local),
                max(&layer.accumulated)
            ),
            Finding::Inherited,
        );
    }
    if let Some(found) = &e.layout {
        return ("layout_permutation", found.detail(), Finding::Defect);
    }
    if let Some(theirs) = layer
        .target_shape
        .as_ref()
        .filter(|_| layer.status == crate::LayerStatus::ShapeMismatch)
    {
        return (
            "shape_mismatch",
            format!(
                "the target gives a {theirs:?} value where the reference gives {:?}, and no axis permutation maps one onto the other: it computes another shape here (a dimension fixed at export, a broadcast, a reshape)",
                layer.shape
            ),
            Finding::Defect,
        );
    }
    if let Some((side, d)) = &e.self_disagreement
        && *d > tol.atol
    {
        return (
            "nondeterminism",
            format!("the {side} run twice disagrees with itself here by up to {d:.3e}"),
            Finding::Defect,
        );
    }
    if !e.weights.is_empty() {
        return ("weight_mismatch", e.weights.join("; "), Finding::Defect);
    }
    let lower = layer
        .target_dtype
        .as_deref()
        .and_then(|t| DType::from_name(t).ok())
        .filter(|t| DType::from_name(&layer.dtype).is_ok_and(|r| t.narrower_than(r)));
    if let Some(t) = lower
        && overflows(layer)
    {
        let own = layer.local.as_ref().or(layer.accumulated.as_ref());
        let n = own.map_or(0, nonfinite_target);
        return (
            "precision_loss",
            format!(
                "the target computes this layer in {t}, the reference in {}, and {n} of its values overflow {t}'s range (±Inf, or NaN made of it) where the reference's are finite: keep it in {}",
                layer.dtype, layer.dtype
            ),
            Finding::Precision,
        );
    }
    if !e.attributes.is_empty() {
        return (
            "op_implementation",
            format!("an attribute differs: {}", e.attributes.join(", ")),
            Finding::Defect,
        );
    }
    if let Some(how) = &e.reduced_math
        && layer.dtype == "float32"
    {
        // A mode the runtime was asked for: precision, unless the baseline or the truth
        // shows plain float32 rounding.
        if let Some(b) = layer.baseline.as_ref().filter(|b| !b.beyond()) {
            return against_baseline(layer, b, e, lower);
        }
        if let Some(detail) = truth_rounding(layer) {
            return ("rounding", detail, Finding::Precision);
        }
        return ("precision_loss", how.clone(), Finding::Precision);
    }
    if let Some(b) = &layer.baseline {
        return against_baseline(layer, b, e, lower);
    }
    without_baseline(layer, e, lower, is_source)
}

/// The verdict of a layer whose own error was measured against the same-precision baseline.
fn against_baseline(
    layer: &Layer,
    b: &crate::Baseline,
    e: &Evidence,
    lower: Option<DType>,
) -> (&'static str, String, Finding) {
    let own = layer
        .local
        .as_ref()
        .map_or((0.0, 0.0), |s| (s.max_abs_diff, s.mean_abs_diff));
    let numbers = format!(
        "an ideal {g} implementation on the same inputs errs by up to {:.3e} (mean {:.3e}), the target by {:.3e} (mean {:.3e})",
        b.max_abs_diff,
        b.mean_abs_diff,
        own.0,
        own.1,
        g = b.grid
    );
    if b.reference_off > 0 {
        return (
            "op_implementation",
            format!(
                "the reference is off here: in {} element(s) its value is further from the exact computation on the same inputs than its dtype's tolerance ({numbers}), so the target cannot be held to it: check the reference",
                b.reference_off
            ),
            Finding::Defect,
        );
    }
    if b.beyond() {
        let ops = e.ops_words();
        let multiple = if b.multiple.is_finite() {
            format!("{:.1}×", b.multiple)
        } else {
            "infinitely many times".to_string()
        };
        return (
            "op_implementation",
            format!(
                "its own error is {multiple} what {} explains ({numbers}): the target's {ops} computes differently",
                b.grid
            ),
            Finding::Defect,
        );
    }
    let explained = format!(
        "its own error is {:.2}× what {} explains ({numbers})",
        b.multiple, b.grid
    );
    // A grid narrower than the layer's dtype is a lower precision too (autocast: float32
    // values computed in float16).
    let grid = DType::from_name(&b.grid)
        .ok()
        .filter(|g| DType::from_name(&layer.dtype).is_ok_and(|d| g.narrower_than(d)));
    match lower.or(grid) {
        Some(t) => (
            "precision_loss",
            match e.precision.as_deref().filter(|_| lower.is_none()) {
                Some(how) => format!(
                    "the target computes this layer in {t}, the reference in {} ({how}); {explained}",
                    layer.dtype
                ),
                None => format!(
                    "the target computes this layer in {t}, the reference in {}; {explained}",
                    layer.dtype
                ),
            },
            Finding::Precision,
        ),
        None => (
            "rounding",
            format!(
                "the target rounds as an honest {} kernel does: {explained}",
                b.grid
            ),
            Finding::Precision,
        ),
    }
}

/// The verdict of a layer whose own error could not be held to a baseline: the float64 truth
/// where it decides, else undecided, with how to decide.
fn without_baseline(
    layer: &Layer,
    e: &Evidence,
    lower: Option<DType>,
    is_source: bool,
) -> (&'static str, String, Finding) {
    let tol = layer.tolerance;
    if let Some(detail) = truth_rounding(layer) {
        return ("rounding", detail, Finding::Precision);
    }
    if e.ops.iter().any(|op| quantizing_op(op)) {
        let how = e
            .precision
            .as_deref()
            .unwrap_or("the target quantizes inside this layer");
        let own = layer.local.as_ref().or(layer.accumulated.as_ref());
        return (
            "precision_loss",
            format!(
                "{how}; its own error (max abs diff {:.3e}) is the quantization's as far as can be told: no float baseline models quantization, and its weights were checked against their scale steps",
                own.map_or(0.0, |s| s.max_abs_diff)
            ),
            Finding::Precision,
        );
    }
    if let Some(local) = &layer.local
        && layer.float64.is_none()
        && !layer.local_exceeds
        && !layer.exceeds_tol
    {
        return (
            "rounding",
            format!(
                "the target rounds here as its dtype allows, and nothing else differs (local max abs diff {:.3e})",
                local.max_abs_diff
            ),
            Finding::Precision,
        );
    }
    let why = layer
        .baseline_reason
        .as_deref()
        .unwrap_or("it was not measured");
    if let Some(local) = &layer.local
        && !layer.local_exceeds
        && is_source
    {
        return (
            "unknown",
            format!(
                "its own computation agrees (local max abs diff {:.3e}, within the tolerance {tol}), yet its inputs already differ by more than any compared layer before it shows: the difference is born in computation no compared layer covers (code a module runs outside its submodules)",
                local.max_abs_diff
            ),
            Finding::Undecided,
        );
    }
    if let Some(local) = &layer.local {
        let ops = e.ops_words();
        let precision = match (lower, local.rounding.as_ref()) {
            (Some(t), Some(r)) => format!(
                "the target computes it in {t} (its own error averages {:.1} ULPs of {t}), which may or may not explain it; ",
                r.mean_ulp_diff
            ),
            _ => String::new(),
        };
        return (
            "undecided",
            format!(
                "same inputs, weights and attributes, yet the target's {ops} differs by up to {:.3e} (local), beyond the tolerance {tol}; {precision}no same-precision baseline was measured ({why}), so rounding cannot be told from a defect: rerun with the float64 baseline (without --no-float64)",
                local.max_abs_diff
            ),
            Finding::Undecided,
        );
    }
    let not_measured = layer.local_reason.as_deref().unwrap_or("it was not re-run");
    (
        "unknown",
        format!(
            "ruled out: layout permutation, nondeterminism, differing weights, overflow, differing attributes; its own error was not measured ({not_measured})"
        ),
        Finding::Undecided,
    )
}

/// Whether an ONNX op quantizes or computes on quantized values (`QuantizeLinear`,
/// `DequantizeLinear`, `QLinearConv`, `MatMulInteger`…): its rounding is the quantization's.
pub fn quantizing_op(op: &str) -> bool {
    matches!(
        op,
        "QuantizeLinear"
            | "DequantizeLinear"
            | "DynamicQuantizeLinear"
            | "MatMulInteger"
            | "ConvInteger"
    ) || op.starts_with("QLinear")
}

/// The float64 truth's word that the target only rounds, where it says so: the target at most
/// [`ROUNDING_FACTOR`] times as far from it as the reference, or within its dtype's absolute
/// tolerance of it.
fn truth_rounding(layer: &Layer) -> Option<String> {
    let f = layer.float64.as_ref()?;
    let within = crate::lower_precision(&layer.dtype, layer.target_dtype.as_deref())
        .map_or(0.0, |d| crate::default_for(d).atol);
    if f.target <= ROUNDING_FACTOR * f.reference && f.reference > 0.0 {
        return Some(f.verdict());
    }
    (f.target <= within).then(|| {
        format!(
            "the target is further from float64 than the reference (target {:.2e}, reference {:.2e}) but within its dtype's rounding of it ({within:e}): rounding, not a bug",
            f.target, f.reference
        )
    })
}

/// What fixes a defect, by its cause.
fn fix(cause: &str, layer: &Layer, e: &Evidence) -> String {
    let nodes = layer
        .location
        .as_ref()
        .map(|o| {
            if o.nodes.is_empty() {
                vec![o.node.clone()]
            } else {
                o.nodes.clone()
            }
        })
        .unwrap_or_default();
    let where_ = if nodes.is_empty() {
        match &layer.module_type {
            Some(t) => format!("the target's `{}` ({t})", layer.name),
            None => format!("the target's `{}`", layer.name),
        }
    } else {
        let shown: Vec<String> = nodes.iter().take(6).map(|n| format!("`{n}`")).collect();
        let more = nodes.len().saturating_sub(shown.len());
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!("the target's node(s) {}{tail}", shown.join(", "))
    };
    match cause {
        "weight_mismatch" => format!(
            "use the reference's weights: {where_} read weights that are not the model's ({}); export or convert the file again from the model, or find what edited it",
            e.weights.join("; ")
        ),
        "layout_permutation" => format!(
            "{where_} hold(s) the values in another axis order ({:?}): a layout conversion (NHWC/NCHW) is missing or applied twice before or inside it",
            layer.permutation.as_deref().unwrap_or_default()
        ),
        "shape_mismatch" => format!(
            "{where_} compute(s) a {:?} value where the model computes {:?}: export with that dimension dynamic (`dynamic_axes`/`dynamic_shapes`), or feed the shape the file was exported for",
            layer.target_shape.as_deref().unwrap_or_default(),
            layer.shape
        ),
        "nondeterminism" => format!(
            "{where_} give(s) other values on every run: make the kernels deterministic (e.g. `torch.use_deterministic_algorithms(True)`, cuDNN's deterministic mode), or compare at a tolerance above that spread"
        ),
        _ if !e.attributes.is_empty() => format!(
            "set the attribute back to the reference's: {} on {where_}",
            e.attributes.join(", ")
        ),
        _ if layer.baseline.as_ref().is_some_and(|b| b.reference_off > 0) => {
            "the reference's own value is off from the exact computation on its inputs: check the reference (its runtime, or the expected values it reads) before the target".to_string()
        }
        _ => format!(
            "{where_} compute(s) differently from an honest {} kernel on the same inputs: reproduce it on that layer alone (its inputs are the reference's values), and report it to the runtime, or run this layer on another kernel or provider; keeping it in float32 hides a fault rather than fixing it",
            layer
                .baseline
                .as_ref()
                .map_or("same-precision", |b| b.grid.as_str())
        ),
    }
}

/// Elements [`precision_grid`] looks at: a float32 value off a 10-bit grid lands on it by
/// chance about once in 8192, so this many on it is no chance.
pub const GRID_SAMPLE: usize = 4096;
/// The sample is taken in evenly spaced runs of this many neighbours (a few cache lines each,
/// where single elements far apart would each cost a trip to memory).
const GRID_RUN: usize = 64;

/// Whether the target's values lie on a lower-precision grid the reference's do not: every
/// finite target value of an even sample ([`GRID_SAMPLE`]) survives a round trip through
/// float16 (or bfloat16), while fewer than half of the reference's do. Names the grid.
pub fn precision_grid(reference: TensorView<'_>, target: TensorView<'_>) -> Option<&'static str> {
    let bits = target.dtype.mantissa_bits()?;
    // The coarser grid first: bfloat16 values within float16's range are float16 values too.
    type Grid = (&'static str, u32, fn(f64) -> f64);
    let grids: [Grid; 2] = [
        ("bfloat16", 8, |v| half::bf16::from_f64(v).to_f64()),
        ("float16", 11, |v| half::f16::from_f64(v).to_f64()),
    ];
    let n = target.numel().min(reference.numel());
    if n == 0 {
        return None;
    }
    // Where each run starts: spread over the whole tensor, or the whole of a small one.
    let runs = GRID_SAMPLE / GRID_RUN;
    let starts: Vec<usize> = if n <= GRID_SAMPLE {
        (0..n).step_by(GRID_RUN).collect()
    } else {
        (0..runs).map(|k| k * (n - GRID_RUN) / (runs - 1)).collect()
    };
    let sample = |view: &TensorView<'_>| {
        let size = view.dtype.size();
        let mut values = Vec::with_capacity(GRID_SAMPLE);
        let mut run = [0.0f64; GRID_RUN];
        for &start in &starts {
            let len = GRID_RUN.min(n - start);
            let bytes = &view.bytes[start * size..(start + len) * size];
            crate::compare::decode(view.dtype, bytes, &mut run[..len]);
            values.extend_from_slice(&run[..len]);
        }
        values
    };
    let (t_values, r_values) = (sample(&target), sample(&reference));
    grids.into_iter().find_map(|(name, grid_bits, round)| {
        if grid_bits >= bits {
            return None;
        }
        let on = |values: &[f64]| {
            values
                .iter()
                .filter(|v| v.is_finite() && **v != 0.0)
                .map(|&v| round(v) == v)
                .fold((0usize, 0usize), |(on, all), hit| {
                    (on + usize::from(hit), all + 1)
                })
        };
        let (t_on, t_all) = on(&t_values);
        let (r_on, r_all) = on(&r_values);
        (t_all > 0 && t_on == t_all && 2 * r_on < r_all).then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LayerStatus, Stats, Tolerance, analyse, compare};

    /// Statistics whose max abs diff is `d`.
    fn stats(d: f64) -> Stats {
        let (r, t) = (0f32.to_le_bytes(), (d as f32).to_le_bytes());
        let shape = [1];
        compare(
            TensorView::new("r", DType::F32, &shape, &r).unwrap(),
            TensorView::new("t", DType::F32, &shape, &t).unwrap(),
        )
        .unwrap()
    }

    fn layer(index: usize, accumulated: f64, local: Option<f64>, inputs: &[&str]) -> Layer {
        let mut l = Layer::new(index, format!("l{index}"), vec![1], "float32");
        l.status = LayerStatus::Compared;
        l.accumulated = Some(stats(accumulated));
        l.local = local.map(stats);
        l.local_inputs = inputs.iter().map(|s| s.to_string()).collect();
        l
    }

    #[test]
    fn a_kernel_no_further_from_float64_than_the_reference_is_rounding() {
        let judged = |reference: f64, target: f64| {
            let mut layers = vec![layer(0, 5e-4, Some(5e-4), &["x"])];
            layers[0].float64 = Some(crate::Float64Distance { reference, target });
            let mut summary = analyse(&mut layers, Tolerance::PerDtype);
            explain(&mut layers, &[Evidence::default()], &mut summary);
            (
                layers[0].cause.clone().unwrap(),
                layers[0].detail.clone().unwrap(),
            )
        };
        let (cause, detail) = judged(1.8e-4, 5.7e-5);
        assert_eq!(
            cause, "rounding",
            "the target is the closer of the two: {detail}"
        );
        assert!(detail.contains("the target is closer to the truth"));
        assert_eq!(judged(2.5e-4, 3e-4).0, "rounding", "about equally far");
        let (cause, detail) = judged(5e-6, 6e-5);
        assert_eq!(
            cause, "rounding",
            "further, but within float32 rounding of the truth"
        );
        assert!(detail.contains("within its dtype's rounding"), "{detail}");
        let (cause, detail) = judged(1e-4, 6e-4);
        assert_eq!(
            cause, "undecided",
            "no baseline: the truth alone does not blame the kernel"
        );
        assert!(detail.contains("no same-precision baseline"), "{detail}");
        assert!(detail.ends_with("the target is off"), "{detail}");
    }

    #[test]
    fn tf32_products_are_precision_loss_unless_the_truth_calls_them_rounding() {
        let tf32 = Evidence {
            reduced_math: Some("MatMul: the provider multiplies float32 in TF32".into()),
            ..Evidence::default()
        };
        let judged = |truth: Option<(f64, f64)>, dtype: &str| {
            let mut layers = vec![layer(0, 5e-3, Some(5e-3), &["x"])];
            layers[0].dtype = dtype.to_string();
            layers[0].float64 =
                truth.map(|(reference, target)| crate::Float64Distance { reference, target });
            let mut summary = analyse(&mut layers, Tolerance::PerDtype);
            explain(&mut layers, std::slice::from_ref(&tf32), &mut summary);
            (
                layers[0].cause.clone().unwrap(),
                layers[0].detail.clone().unwrap(),
            )
        };
        let (cause, detail) = judged(None, "float32");
        assert_eq!(cause, "precision_loss");
        assert!(
            detail.starts_with("MatMul: the provider multiplies"),
            "{detail}"
        );
        let (cause, detail) = judged(Some((2e-5, 5e-3)), "float32");
        assert_eq!(cause, "precision_loss", "the truth says the target is off");
        assert!(detail.ends_with("the target is off"), "{detail}");
        assert_eq!(judged(Some((4e-3, 5e-3)), "float32").0, "rounding");
        assert_eq!(
            judged(None, "float16").0,
            "undecided",
            "TF32 is float32 math: a float16 layer without a baseline is undecided"
        );
    }

    #[test]
    fn an_origin_within_its_tolerance_with_nothing_else_different_only_rounds() {
        // l0 rounds (1e-5 of its own, within 1e-4); l1 amplifies it past the tolerance.
        let mut layers = vec![
            layer(0, 1e-5, Some(1e-5), &["x"]),
            layer(1, 5e-4, Some(0.0), &["l0"]),
        ];
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        assert_eq!(summary.drift_origin.as_deref(), Some("l0"));
        explain(
            &mut layers,
            &[Evidence::default(), Evidence::default()],
            &mut summary,
        );
        assert_eq!(layers[0].cause.as_deref(), Some("rounding"));
        let detail = layers[0].detail.as_deref().unwrap();
        assert!(
            detail.starts_with("the target rounds here as its dtype allows"),
            "{detail}"
        );
        assert!(
            detail.ends_with("amplified downstream until `l1` exceeds it"),
            "{detail}"
        );
        assert_eq!(layers[1].cause.as_deref(), Some("inherited"));
    }

    #[test]
    fn an_amplified_difference_is_born_upstream_and_inherited_downstream() {
        // l1 adds 6e-5 itself (below 1e-4); l2 passes it on; l3 amplifies it past 1e-4.
        let mut layers = vec![
            layer(0, 1e-7, Some(1e-7), &["x"]),
            layer(1, 6e-5, Some(6e-5), &["l0"]),
            layer(2, 6e-5, Some(0.0), &["l1"]),
            layer(3, 5e-4, Some(2e-6), &["l2", "l0"]),
        ];
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        assert_eq!(summary.first_exceeding.as_deref(), Some("l3"));
        assert_eq!(summary.drift_origin.as_deref(), Some("l1"));
        let mut evidence = vec![Evidence::default(); 4];
        evidence[1].weights.push("`w` differs".into());
        explain(&mut layers, &evidence, &mut summary);
        assert_eq!(layers[3].cause.as_deref(), Some("inherited"));
        assert_eq!(layers[1].cause.as_deref(), Some("weight_mismatch"));
        assert!(
            layers[1]
                .detail
                .as_ref()
                .unwrap()
                .contains("amplified downstream until `l3`")
        );
        assert_eq!(layers[2].cause, None, "within tolerance and not the origin");
    }

    #[test]
    fn causes_follow_the_fixed_order_and_unknown_says_what_was_ruled_out() {
        let mut layers = vec![
            layer(0, 1e-3, None, &[]),
            layer(1, 1e-3, Some(1e-3), &["l0"]),
        ];
        layers[0].local_reason = Some("its nodes use a custom op".into());
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        let mut evidence = vec![Evidence::default(); 2];
        evidence[1].precision = Some("float16 grid".into());
        evidence[1].self_disagreement = Some(("target".into(), 5e-3));
        explain(&mut layers, &evidence, &mut summary);
        assert_eq!(layers[0].cause.as_deref(), Some("unknown"));
        let detail = layers[0].detail.as_deref().unwrap();
        assert!(detail.contains("ruled out: layout permutation, nondeterminism"));
        assert!(detail.contains("its nodes use a custom op"));
        assert_eq!(
            layers[1].cause.as_deref(),
            Some("nondeterminism"),
            "before precision"
        );
    }

    #[test]
    fn values_rounded_to_float16_are_on_its_grid() {
        let r: Vec<f32> = (0..64).map(|i| 0.1 + i as f32 * 0.01337).collect();
        let t: Vec<f32> = r.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        let b: Vec<f32> = r
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (rb, tb, bb) = (bytes(&r), bytes(&t), bytes(&b));
        let shape = [64];
        let view = |b: &'static [u8]| TensorView::new("x", DType::F32, &shape, b).unwrap();
        let (rb, tb, bb): (&'static [u8], &'static [u8], &'static [u8]) = (
            Box::leak(rb.into_boxed_slice()),
            Box::leak(tb.into_boxed_slice()),
            Box::leak(bb.into_boxed_slice()),
        );
        assert_eq!(precision_grid(view(rb), view(tb)), Some("float16"));
        assert_eq!(precision_grid(view(rb), view(bb)), Some("bfloat16"));
        assert_eq!(precision_grid(view(rb), view(rb)), None);
    }
}
