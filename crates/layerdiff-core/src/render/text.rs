//! The short text summary the command prints: verdict, counts, origin, worst layers.

use crate::cause::overflows;
use crate::{Approximation, Defect, NarrowKernel, PrecisionDrift, Report, Verdict};

/// The short summary printed to stdout: verdict, counts, origin, worst layers.
pub fn to_text(report: &Report) -> String {
    let mut out = format!(
        "{}{}: {}\n",
        incomplete_mark(report),
        report.model,
        verdict(report)
    );
    sides(&mut out, report);
    counts(&mut out, report);
    worst(&mut out, report);
    findings(&mut out, report);
    origin(&mut out, report);
    keep_float32(&mut out, report);
    if let Some(bisection) = &report.bisection {
        out.push_str(&format!("  bisected: {}\n", bisection.sentence()));
    }
    if let Some(search) = &report.opaque {
        out.push_str(&format!("  opaque target: {}\n", search.sentence()));
    }
    if let Some(whole) = &report.compiled_whole {
        out.push_str(&format!("  compiled whole: {}\n", whole.sentence()));
    }
    out
}

/// `INCOMPLETE: ` where a signal cut the run short: the first words of every report a person
/// reads (the summary, the Markdown, the page).
pub(crate) fn incomplete_mark(report: &Report) -> &'static str {
    if report.summary.incomplete.is_some() {
        "INCOMPLETE: "
    } else {
        ""
    }
}

/// The sides: reference, target (where it placed the graph, what graph it ran), truth.
fn sides(out: &mut String, report: &Report) {
    out.push_str(&format!(
        "  reference: {} ({})\n  target:    {} ({})\n",
        report.reference.runtime,
        report.reference.detail,
        report.target.runtime,
        report.target.detail
    ));
    if let Some(placement) = report.target.placement_text() {
        out.push_str(&format!("  target placement: {placement}\n"));
    }
    if let Some(graph) = &report.target_graph {
        out.push_str(&format!("  target graph: {}\n", graph.describe()));
    }
    if let Some(truth) = &report.truth {
        out.push_str(&format!(
            "  truth:     {} ({})\n",
            truth.runtime, truth.detail
        ));
    }
}

/// The layers counted, what stopped or warns, the tolerance.
fn counts(out: &mut String, report: &Report) {
    let s = &report.summary;
    let counterpart = if super::onnx_located(report) {
        "an ONNX counterpart"
    } else {
        "a counterpart"
    };
    out.push_str(&format!(
        "  layers: {} total, {} compared, {} without {counterpart}{}\n",
        s.layers_total,
        s.layers_compared,
        s.layers_unmapped,
        super::not_run(s)
    ));
    if let Some(incomplete) = &s.incomplete {
        out.push_str(&format!("  INCOMPLETE: {incomplete}\n"));
    }
    for warning in &s.warnings {
        out.push_str(&format!("  warning: {warning}\n"));
    }
    out.push_str(&format!(
        "  tolerance: {}; error measured {}\n",
        report.tolerance.describe(),
        if report.mode == "local" {
            "accumulated and local (each layer re-run on the reference's inputs)"
        } else {
            "accumulated only"
        }
    ));
}

/// The largest differences.
fn worst(out: &mut String, report: &Report) {
    let s = &report.summary;
    if let Some(w) = &s.worst.max_abs_diff {
        out.push_str(&format!(
            "  largest max abs diff:  {:.3e} at `{}`\n",
            w.value, w.layer
        ));
    }
    if let Some(w) = &s.worst.mean_abs_diff {
        out.push_str(&format!(
            "  largest mean abs diff: {:.3e} at `{}`\n",
            w.value, w.layer
        ));
    }
}

/// The defects, the kernels that accumulate in the narrow dtype, precision.
fn findings(out: &mut String, report: &Report) {
    let s = &report.summary;
    for d in s.defects.iter().take(SHOWN_DEFECTS) {
        out.push_str(&format!(
            "  defect at `{}`: {}: {}\n    fix: {}\n",
            d.layer, d.cause, d.detail, d.fix
        ));
    }
    if s.defects.len() > SHOWN_DEFECTS {
        out.push_str(&format!(
            "  … and {} more defect(s), in the report\n",
            s.defects.len() - SHOWN_DEFECTS
        ));
    }
    let narrow = (s.narrow_accumulation.iter())
        .map(|k| (k.layer.as_str(), narrow_words(k), k.fix.as_str()))
        .collect();
    kernel_lines(
        out,
        "narrow accumulation",
        narrow,
        "layer(s) that accumulate in the narrow dtype",
    );
    let approximations = (s.approximations.iter())
        .map(|a| (a.layer.as_str(), approximation_words(a), a.fix.as_str()))
        .collect();
    kernel_lines(out, "approximation", approximations, "approximation(s)");
    if let Some(p) = &s.precision {
        out.push_str(&format!(
            "  precision: {}\n",
            precision_words(p, s.layers_compared)
        ));
    }
}

/// The cause at the origin, the layers that only inherit, the layers that exceed.
fn origin(out: &mut String, report: &Report) {
    let s = &report.summary;
    let origin = report
        .layers
        .iter()
        .find(|l| Some(&l.name) == s.drift_origin.as_ref())
        .filter(|_| s.defects.is_empty());
    if let Some((cause, detail)) =
        origin.and_then(|l| Some((l.cause.as_ref()?, l.detail.as_deref().unwrap_or(""))))
    {
        out.push_str(&format!("  cause at the origin: {cause}: {detail}\n"));
    }
    let inherited = report
        .layers
        .iter()
        .filter(|l| l.cause == Some(crate::Cause::Inherited))
        .count();
    if inherited > 0 {
        out.push_str(&format!(
            "  {inherited} exceeding layer(s) only inherited their error from upstream\n"
        ));
    }
    let exceeding: Vec<&str> = report
        .layers
        .iter()
        .filter(|l| l.exceeds_tol)
        .map(|l| l.name.as_str())
        .take(5)
        .collect();
    if !exceeding.is_empty() {
        let more = s.layers_exceeding.saturating_sub(exceeding.len());
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        out.push_str(&format!("  exceeding: {}{tail}\n", exceeding.join(", ")));
        if let Some(ranked) = s.own_error_text() {
            out.push_str(&format!(
                "  most error of their own (local mean abs diff): {ranked}\n"
            ));
        }
    }
}

/// The keep-in-float32 advice and its check.
fn keep_float32(out: &mut String, report: &Report) {
    if let Some(keep) = &report.keep_float32 {
        let names: Vec<String> = keep
            .layers
            .iter()
            .map(|k| format!("`{}`", k.layer))
            .collect();
        if !names.is_empty() {
            let how = if keep.advised() {
                "keep in float32"
            } else {
                "tried in float32, without help"
            };
            out.push_str(&format!(
                "  {how} (the target computes in {}): {}\n",
                keep.precision,
                names.join(", ")
            ));
        }
        if let Some(check) = &keep.check {
            out.push_str(&format!("  checked: {}\n", check.verdict));
        }
    }
}

/// Kernel findings that are not defects, `what` at each layer with its words and fix, the
/// first [`SHOWN_DEFECTS`], then how many `more` the report holds.
fn kernel_lines(out: &mut String, what: &str, rows: Vec<(&str, String, &str)>, more: &str) {
    for (layer, words, fix) in rows.iter().take(SHOWN_DEFECTS) {
        out.push_str(&format!("  {what} at `{layer}`: {words}\n    fix: {fix}\n"));
    }
    if rows.len() > SHOWN_DEFECTS {
        let left = rows.len() - SHOWN_DEFECTS;
        out.push_str(&format!("  … and {left} more {more}, in the report\n"));
    }
}

/// Defects the summary spells out (all are in the report).
const SHOWN_DEFECTS: usize = 5;

/// An output compared exactly (a class index): how many of its elements differ.
fn exact_output_words(output: &str, e: &crate::ExactOutput) -> String {
    let what = format!("; the output `{output}` ({}, compared exactly)", e.dtype);
    match e.differ {
        0 => format!("{what} is the reference's in all {} elements", e.elements),
        n => format!(
            "{what} differs in {n} of {} elements ({})",
            e.elements,
            share_words(n, e.elements)
        ),
    }
}

/// `k` of `n` as a percentage that a nonzero share never reads as 0: `0.018%`, `2.5%`.
pub(crate) fn share_words(k: u64, n: u64) -> String {
    let percent = 100.0 * k as f64 / n.max(1) as f64;
    let decimals = if percent == 0.0 || percent >= 1.0 {
        1
    } else {
        (1.0 - percent.log10().floor()).min(9.0) as usize // two significant digits
    };
    format!("{percent:.decimals$}%")
}

/// The precision drift in one line: where it is born, how many layers it takes past their
/// tolerance, how far it grows, and any overflow.
pub(crate) fn precision_words(p: &PrecisionDrift, compared: usize) -> String {
    let born = born_words(p);
    let output = p.output.as_deref().map_or(String::new(), |o| match (&p.output_exact, p.output_nonfinite) {
        (Some(exact), _) => exact_output_words(o, exact),
        (None, 0) => format!(
            "; the output `{o}` is off by {:.3e} ({:.1}× its tolerance)",
            p.output_max_abs_diff, p.output_tolerance_multiple
        ),
        (None, n) => format!(
            "; the output `{o}` is NaN or ±Inf in {n} element(s) where the reference's are finite"
        ),
    });
    let overflow = match p.overflow {
        0 => String::new(),
        n => format!(
            "; {n} layer(s) overflow {}'s range to ±Inf (keep them in float32)",
            p.dtype
        ),
    };
    let own = match p.layers {
        0 => {
            "no layer's own rounding exceeds its tolerance, it grows past it downstream".to_string()
        }
        n => format!(
            "{n} of {compared} compared layers exceed their tolerance by their own rounding"
        ),
    };
    format!("{} rounding{born}: {own}{output}{overflow}", p.dtype)
}

/// Where the precision drift shows, in words: `, born at `o`` where the origin's own
/// rounding exceeds its tolerance, `, first past its tolerance at `o`, from the rounding of
/// `s`` where it carries another's past it; empty without an origin.
pub(crate) fn born_words(p: &PrecisionDrift) -> String {
    match (p.origin.as_deref(), p.source.as_deref()) {
        (None, _) => String::new(),
        (Some(o), None) => format!(", born at `{o}`"),
        (Some(o), Some(s)) => {
            format!(", first past its tolerance at `{o}`, from the rounding of `{s}`")
        }
    }
}

/// A layer that accumulates in the narrow dtype, in words.
pub(crate) fn narrow_words(k: &NarrowKernel) -> String {
    format!(
        "its kernel sums {} terms per element in {d}: {:.1}× what a float32-accumulating kernel's error explains, {:.2}× a {d}-accumulating one's",
        k.terms,
        k.multiple,
        k.narrow_multiple,
        d = k.dtype
    )
}

/// A layer whose kernel approximates, in words.
pub(crate) fn approximation_words(a: &Approximation) -> String {
    format!(
        "its {} is {:.1}× what an honest {} kernel's error explains, within every tolerance (its own error {:.2}× its tolerance)",
        a.ops, a.multiple, a.dtype, a.tolerance_multiple
    )
}

/// The layers whose kernel approximates, for the verdict's line (empty when none).
fn approximation_clause(s: &crate::Summary) -> String {
    let Some(first) = s.approximations.first() else {
        return String::new();
    };
    let n = s.approximations.len();
    let named = first_three(
        (s.approximations.iter()).map(|a| format!("`{}` {} ({:.1}×)", a.layer, a.ops, a.multiple)),
    );
    format!(
        "{n} kernel(s) approximate beyond what an honest {} kernel explains, within every tolerance: {named}",
        first.dtype
    )
}

/// The layers that accumulate in the narrow dtype, for the verdict's line (empty when none).
fn narrow_clause(s: &crate::Summary) -> String {
    let Some(first) = s.narrow_accumulation.first() else {
        return String::new();
    };
    let n = s.narrow_accumulation.len();
    let named = first_three(
        (s.narrow_accumulation.iter()).map(|k| format!("`{}` ({:.1}×)", k.layer, k.multiple)),
    );
    format!(
        "{n} layer(s) accumulate in {}, beyond a float32-accumulating kernel and within a {}-accumulating one: {named}",
        first.dtype, first.dtype
    )
}

/// The first three of `named`, joined, then how many more (`a, b, c and 2 more`).
fn first_three(named: impl Iterator<Item = String>) -> String {
    let named: Vec<String> = named.collect();
    let shown = named[..named.len().min(3)].join(", ");
    match named.len().saturating_sub(3) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// A defect's size in words: its multiple of what precision explains, else of its tolerance.
fn defect_size(d: &Defect) -> String {
    match (d.multiple, d.tolerance_multiple) {
        (Some(m), _) if m.is_finite() && m >= 1000.0 => {
            " (over 1000× what precision explains)".to_string()
        }
        (Some(m), _) if m.is_finite() => format!(" ({m:.1}× what precision explains)"),
        (_, Some(t)) if t.is_finite() => format!(" ({t:.1}× its tolerance)"),
        _ => String::new(),
    }
}

/// The verdict in one line: the defects first, most severe first, then the rounding; rounding
/// only; undecided layers; inconclusive and why; or no drift.
pub(crate) fn verdict(report: &Report) -> String {
    let s = &report.summary;
    match s.verdict {
        Verdict::Defect => {
            let n = s.defects.len();
            let named: Vec<String> = s
                .defects
                .iter()
                .take(3)
                .map(|d| format!("`{}` {}{}", d.layer, d.cause, defect_size(d)))
                .collect();
            let more = if n > 3 {
                format!(" and {} more", n - 3)
            } else {
                String::new()
            };
            let besides = s
                .precision
                .as_ref()
                .map_or(String::new(), |p| match p.layers {
                    0 => format!("; besides, {} rounding", p.dtype),
                    n => format!(
                        "; besides, {} rounding takes {n} layer(s) past their tolerance",
                        p.dtype
                    ),
                });
            let narrow: String = [narrow_clause(s), approximation_clause(s)]
                .into_iter()
                .filter(|c| !c.is_empty())
                .map(|c| format!("; besides, {c}"))
                .collect();
            format!(
                "{n} defect{}: {}{more}{narrow}{besides}",
                if n == 1 { "" } else { "s" },
                named.join(", ")
            )
        }
        Verdict::Precision => {
            let p = s.precision.as_ref();
            let dtype = p.map_or("float32", |p| p.dtype.as_str());
            let overflow = p.map_or(0, |p| p.overflow);
            let but = if overflow > 0 {
                // the first that overflows of itself, where the overflow is born
                let first = (report.layers.iter())
                    .find(|l| l.finding == Some(crate::Finding::Precision) && overflows(l))
                    .map_or(String::new(), |l| format!(", first `{}`", l.name));
                format!(", but {overflow} layer(s) overflow {dtype}'s range to ±Inf{first}")
            } else {
                String::new()
            };
            let kernels: Vec<String> = [narrow_clause(s), approximation_clause(s)]
                .into_iter()
                .filter(|c| !c.is_empty())
                .collect();
            if !kernels.is_empty() {
                return format!(
                    "{dtype} precision, no defect, but {}{but}; {} of {} compared layers exceed their tolerance",
                    kernels.join("; "),
                    s.layers_exceeding,
                    s.layers_compared
                );
            }
            // where no layer's value exceeds, layers' own re-runs did: said so, not "born"
            let born = match (
                p.and_then(|p| p.origin.as_deref()),
                s.layers_exceeding_locally,
            ) {
                (None, _) => String::new(),
                (Some(o), n) if s.layers_exceeding == 0 && n > 0 => format!(
                    ", {n} only when re-run alone on the reference's inputs, by its own rounding, at `{o}`"
                ),
                (Some(_), _) => p.map_or(String::new(), born_words),
            };
            format!(
                "{dtype} rounding only: no layer computes differently{but}; {} of {} compared layers exceed their tolerance{born}",
                s.layers_exceeding, s.layers_compared,
            )
        }
        Verdict::Undecided => {
            let undecided = report
                .layers
                .iter()
                .filter(|l| l.finding == Some(crate::Finding::Undecided))
                .count();
            format!(
                "undecided: {undecided} layer(s) exceed their tolerance and nothing measured tells rounding from a defect there, first `{}`",
                s.drift_origin.as_deref().unwrap_or("?")
            )
        }
        Verdict::Inconclusive => format!(
            "inconclusive: the {} compared layers are within tolerance, but {}",
            s.layers_compared,
            s.inconclusive
                .as_deref()
                .unwrap_or("part of the model was not compared")
        ),
        Verdict::NoDrift => {
            let approximations = match approximation_clause(s) {
                c if c.is_empty() => c,
                c => format!("; but {c}"),
            };
            format!(
                "no drift: all {} compared layers within tolerance{approximations}",
                s.layers_compared
            )
        }
    }
}

#[cfg(test)]
mod tests;
