//! The decision for one layer, in the order the module docs give: the cause, its detail and
//! the finding, against the same-precision baseline where it was measured and without it
//! where not, and what fixes each defect.

use super::quantized::quantized;
use super::truth::{truth_follows_target, truth_rounding};
use super::{Cause, DType, Evidence, Finding, Layer, overflows, quantizing_op};

/// A cause, its detail and the finding it makes, for one layer (see the module docs): a kernel
/// beyond what its precision explains whose effect stays within every tolerance is an
/// approximation, not a defect.
pub(super) fn decide(layer: &Layer, e: &Evidence, is_source: bool) -> (Cause, String, Finding) {
    let (cause, detail, finding) = decide_cause(layer, e, is_source);
    if cause == Cause::OpImplementation
        && finding == Finding::Defect
        && within_every_tolerance(layer, is_source)
        && layer
            .baseline
            .as_ref()
            .is_some_and(|b| b.reference_off == 0)
    {
        let own = layer.local.as_ref().map_or(0.0, |s| s.max_abs_diff);
        let value = layer.accumulated.as_ref().map_or(0.0, |s| s.max_abs_diff);
        return (
            Cause::Approximation,
            format!(
                "{detail}: an approximation, within every tolerance: its own error ({own:.3e}) and its value's difference ({value:.3e}) stay within the tolerance {}, and no layer after it exceeds by it",
                layer.tolerance
            ),
            Finding::Approximation,
        );
    }
    (cause, detail, finding)
}

/// Whether what a layer computes of its own stays within every tolerance: its own re-run and
/// its value within its tolerance, and no exceeding layer's error traced back to it
/// (`is_source`): a kernel beyond what its precision explains moves nothing past a tolerance
/// there.
fn within_every_tolerance(layer: &Layer, is_source: bool) -> bool {
    layer.status == crate::LayerStatus::Compared
        && layer.local.is_some()
        && !layer.exceeds_tol
        && !layer.local_exceeds
        && !is_source
}

/// [`decide`] before the approximation is told from a defect.
fn decide_cause(layer: &Layer, e: &Evidence, is_source: bool) -> (Cause, String, Finding) {
    let tol = layer.tolerance;
    if let Some(found) = unmeasured(layer, e, is_source) {
        return found;
    }
    if let Some((side, d)) = &e.self_disagreement
        && *d > tol.atol
    {
        return (
            Cause::Nondeterminism,
            format!("the {side} run twice disagrees with itself here by up to {d:.3e}"),
            Finding::Defect,
        );
    }
    if !e.weights.is_empty() {
        return (Cause::WeightMismatch, e.weights.join("; "), Finding::Defect);
    }
    if let Some(grid) = &layer.quantization {
        return quantized(layer, grid, layer.baseline.as_ref(), e);
    }
    // a range that clips much of what the model computes, whatever the kernel does on it
    if let Some(clipped) = e.clipped.as_ref().filter(|c| c.grid.too_narrow()) {
        let own = layer.local.as_ref().or(layer.accumulated.as_ref());
        return (
            Cause::QuantizationRange,
            format!(
                "{} (its own error is up to {:.3e})",
                clipped.grid.clips(&clipped.what),
                own.map_or(0.0, |s| s.max_abs_diff)
            ),
            Finding::Defect,
        );
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
        let n = own.map_or(0, crate::Stats::nonfinite_target);
        return (
            Cause::PrecisionLoss,
            format!(
                "the target computes this layer in {t}, the reference in {}, and {n} of its values overflow {t}'s range (±Inf, or NaN made of it) where the reference's are finite: keep it in {}",
                layer.dtype, layer.dtype
            ),
            Finding::Precision,
        );
    }
    if !e.attributes.is_empty() {
        let differs = super::attributes_differ(&e.attributes);
        if let Some(w) = layer.computes_as_written() {
            return (
                Cause::FileDiffers,
                format!(
                    "{differs}; the target computes what its file says (its own error is {:.2}× what {} explains against the file's nodes computed exactly): the file differs from the reference here, not the runtime",
                    w.multiple, w.grid
                ),
                Finding::Defect,
            );
        }
        return (Cause::OpImplementation, differs, Finding::Defect);
    }
    // The target's own code passes the call other numbers or flags, and what they compute is
    // beyond what its precision explains (its local re-run took them).
    if !e.arguments.is_empty()
        && layer
            .baseline
            .as_ref()
            .map_or(layer.local_exceeds, crate::Baseline::beyond)
    {
        let multiple = layer.baseline.as_ref().map_or(String::new(), |b| {
            format!(
                "; with them its own error is {:.1}× what {} explains",
                b.multiple, b.grid
            )
        });
        return (
            Cause::ArgumentMismatch,
            format!(
                "the target's own code passes this call other arguments than the reference's: {}{multiple}",
                e.arguments.join(", ")
            ),
            Finding::Defect,
        );
    }
    // A float64 copy that computes the layer as the target does, not as the reference does:
    // the baseline, computed in float64 too, then excuses the target by its own path.
    if let Some(detail) = truth_follows_target(layer, e, lower) {
        return (Cause::OpImplementation, detail, Finding::Defect);
    }
    if let Some(how) = &e.reduced_math
        && layer.dtype == "float32"
    {
        // A mode the runtime was asked for: precision, unless the baseline or the truth
        // shows plain float32 rounding; a baseline on the narrower grid the runtime computes
        // in (OpenVINO's bfloat16) models the mode, so it decides either way.
        if let Some(b) = layer
            .baseline
            .as_ref()
            .filter(|b| !b.beyond() || b.grid != layer.dtype)
        {
            return against_baseline(layer, b, e, lower);
        }
        if let Some(detail) = truth_rounding(layer) {
            return (Cause::Rounding, detail, Finding::Precision);
        }
        return (Cause::PrecisionLoss, how.clone(), Finding::Precision);
    }
    if let Some(b) = &layer.baseline {
        return against_baseline(layer, b, e, lower);
    }
    without_baseline(layer, e, lower, is_source)
}

/// What a layer is before any measure of its precision: inherited (its own error within its
/// tolerance and what its precision explains), a layout permutation, or another shape.
fn unmeasured(layer: &Layer, e: &Evidence, is_source: bool) -> Option<(Cause, String, Finding)> {
    let max = |s: &Option<crate::Stats>| s.as_ref().map_or(0.0, |s| s.max_abs_diff);
    let tol = layer.tolerance;
    if layer.local.is_some() && !layer.local_exceeds && !layer.own_beyond() && !is_source {
        let from = layer
            .error_from
            .as_deref()
            .map_or(String::new(), |o| format!(", mostly from `{o}`"));
        return Some((
            Cause::Inherited,
            format!(
                "its own error (local max abs diff {:.3e}) is within the tolerance {tol}; the difference ({:.3e}) comes from upstream{from}",
                max(&layer.local),
                max(&layer.accumulated)
            ),
            Finding::Inherited,
        ));
    }
    if let Some(found) = &e.layout {
        return Some((Cause::LayoutPermutation, found.detail(), Finding::Defect));
    }
    if let Some(theirs) = layer
        .target_shape
        .as_ref()
        .filter(|_| layer.status == crate::LayerStatus::ShapeMismatch)
    {
        return Some((
            Cause::ShapeMismatch,
            format!(
                "the target gives a {theirs:?} value where the reference gives {:?}, and no axis permutation maps one onto the other: it computes another shape here (a dimension fixed at export, a broadcast, a reshape)",
                layer.shape
            ),
            Finding::Defect,
        ));
    }
    None
}

/// What a kernel that sums its terms in the narrow dtype is, in words, with the baseline's
/// `numbers`.
fn narrow_detail(
    e: &Evidence,
    b: &crate::Baseline,
    n: &crate::NarrowIdeal,
    numbers: &str,
) -> String {
    let kernel = if e.ops.is_empty() {
        "kernel".to_string()
    } else {
        e.ops_words()
    };
    format!(
        "the target's {kernel} sums its {} terms per element in {g}: its own error is {:.1}× what a kernel that accumulates in float32 explains, and {:.2}× what one that accumulates in {g} does ({numbers}): honest, but {g} accumulation",
        n.terms,
        b.multiple,
        n.multiple,
        g = b.grid
    )
}

/// Why an own error within what a kernel that accumulates in the narrow dtype errs by is not
/// that kernel's rounding, in words (empty where it is beyond that kernel's error too).
fn not_narrow(b: &crate::Baseline) -> String {
    let Some(n) = b
        .narrow
        .as_ref()
        .filter(|n| n.multiple <= crate::DEFECT_MARGIN)
    else {
        return String::new();
    };
    let why = if !n.leans_as_rounding() {
        format!(
            "{:.0}% of its error pushes the values one way, more than that kernel's rounding does",
            100.0 * n.systematic.abs()
        )
    } else if n.scattered() {
        format!(
            "at {} of its {} elements its error is beyond what that kernel errs by there (an error of one size everywhere, not one that grows with the sums' length and spread)",
            n.elements_beyond, n.judged
        )
    } else {
        return String::new();
    };
    format!(
        "; within what a kernel that sums in {} errs by ({:.2}×), but not its rounding: {why}",
        b.grid, n.multiple
    )
}

/// The own error a baseline's multiple judged, its max and mean, and from what in words: from
/// the exact value where the reference rounds coarser than the grid, else from the reference.
fn judged_own(layer: &Layer, b: &crate::Baseline) -> ((f64, f64), String) {
    match (&b.from_exact, &layer.local) {
        (Some(x), _) => (
            (x.max_abs_diff, x.mean_abs_diff),
            format!(
                " from the exact value (the {} reference's own rounding set aside)",
                layer.dtype
            ),
        ),
        (None, local) => (
            local
                .as_ref()
                .map_or((0.0, 0.0), |s| (s.max_abs_diff, s.mean_abs_diff)),
            String::new(),
        ),
    }
}

/// The verdict of a layer whose own error was measured against the same-precision baseline.
pub(super) fn against_baseline(
    layer: &Layer,
    b: &crate::Baseline,
    e: &Evidence,
    lower: Option<DType>,
) -> (Cause, String, Finding) {
    if let Some(ix) = &b.indices {
        return super::index::indices(layer, b, ix, e);
    }
    let (own, from) = judged_own(layer, b);
    // the multiple is the larger of the target's to the honest kernel's, at the maxima and
    // on average: both are here
    let numbers = format!(
        "the target errs by up to {:.3e} (mean {:.3e}){from} on the same inputs, an honest {g} kernel may by up to {:.3e} (mean {:.3e}), the ideal {g} implementation does by {:.3e} (mean {:.3e})",
        own.0,
        own.1,
        b.allowed_max_abs_diff,
        b.allowed_mean_abs_diff,
        b.max_abs_diff,
        b.mean_abs_diff,
        g = b.grid
    );
    if b.reference_off > 0 {
        return (
            Cause::OpImplementation,
            format!(
                "the reference is off here: in {} element(s) its value is further from the exact computation on the same inputs than its dtype's tolerance ({numbers}), so the target cannot be held to it: check the reference",
                b.reference_off
            ),
            Finding::Defect,
        );
    }
    if let Some(n) = b.narrow.as_ref().filter(|_| b.accumulates_narrow()) {
        let detail = narrow_detail(e, b, n, &numbers);
        return (Cause::NarrowAccumulation, detail, Finding::Precision);
    }
    if b.beyond()
        && let Some(w) = layer.computes_as_written()
    {
        let written = e.written_words();
        return (
            Cause::FileDiffers,
            format!(
                "its own error is {:.1}× what {g} explains against the reference's computation, and {:.2}× against the target file's own nodes computed exactly on the same inputs: the runtime computes what the file says, and the file computes differently from the reference here ({written}): an export that lost or changed something, a folded constant, or an edit ({numbers})",
                b.multiple,
                w.multiple,
                g = b.grid
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
            Cause::OpImplementation,
            format!(
                "its own error is {multiple} what {} explains ({numbers}): the target's {ops} computes differently{}",
                b.grid,
                not_narrow(b)
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
    if let Some(found) = super::reference::rounding_shared(layer, e, lower.or(grid), &explained) {
        return found;
    }
    match lower.or(grid) {
        Some(t) => (
            Cause::PrecisionLoss,
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
        None => match e.precision.as_deref() {
            // the values' dtype is the reference's, yet the side computes below it (float16
            // weights computed in float32)
            Some(how) => (
                Cause::PrecisionLoss,
                format!("{how}; {explained}"),
                Finding::Precision,
            ),
            None => (
                Cause::Rounding,
                format!(
                    "the target rounds as an honest {} kernel does: {explained}",
                    b.grid
                ),
                Finding::Precision,
            ),
        },
    }
}

/// The verdict of a layer whose own error could not be held to a baseline: the float64 truth
/// where it decides, else undecided, with how to decide.
pub(super) fn without_baseline(
    layer: &Layer,
    e: &Evidence,
    lower: Option<DType>,
    is_source: bool,
) -> (Cause, String, Finding) {
    let tol = layer.tolerance;
    if let Some(detail) = truth_rounding(layer) {
        return (Cause::Rounding, detail, Finding::Precision);
    }
    if e.ops.iter().any(|op| quantizing_op(op)) {
        let how = e
            .precision
            .as_deref()
            .unwrap_or("the target quantizes inside this layer");
        let own = layer.local.as_ref().or(layer.accumulated.as_ref());
        return (
            Cause::PrecisionLoss,
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
            Cause::Rounding,
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
            Cause::Unknown,
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
        // Off, the baseline is a rerun away; where it failed, no rerun makes it.
        let next = [
            ": rerun with the float64 baseline (without --no-float64)",
            ", nor which side computes it right",
        ][usize::from(layer.baseline_reason.is_some())];
        let ulps = (local.rounding.as_ref().filter(|_| lower.is_none()))
            .map(|r| format!(" ({:.0} ULPs of {} on average)", r.mean_ulp_diff, r.grid));
        let ulps = ulps.unwrap_or_default();
        return (
            Cause::Undecided,
            format!(
                "same inputs, weights and attributes, yet the target's {ops} differs by up to {:.3e} (local){ulps}, beyond the tolerance {tol}; {precision}no same-precision baseline was measured ({why}), so rounding cannot be told from a defect{next}",
                local.max_abs_diff
            ),
            Finding::Undecided,
        );
    }
    let not_measured = layer.local_reason.as_deref().unwrap_or("it was not re-run");
    (
        Cause::Unknown,
        format!(
            "ruled out: layout permutation, nondeterminism, differing weights, overflow, differing attributes; its own error was not measured ({not_measured})"
        ),
        Finding::Undecided,
    )
}
