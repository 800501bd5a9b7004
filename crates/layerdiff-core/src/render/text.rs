//! The short text summary the command prints: verdict, counts, origin, worst layers.

use crate::Report;

/// The short summary printed to stdout: verdict, counts, origin, worst layers.
pub fn to_text(report: &Report) -> String {
    let s = &report.summary;
    let mut out = String::new();
    out.push_str(&format!("{}: {}\n", report.model, verdict(report)));
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
    let counterpart = if report.target.runtime == "pytorch" {
        "a counterpart"
    } else {
        "an ONNX counterpart"
    };
    out.push_str(&format!(
        "  layers: {} total, {} compared, {} without {counterpart}\n",
        s.layers_total, s.layers_compared, s.layers_unmapped
    ));
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
    let origin = report
        .layers
        .iter()
        .find(|l| Some(&l.name) == s.drift_origin.as_ref());
    if let Some((cause, detail)) =
        origin.and_then(|l| Some((l.cause.as_ref()?, l.detail.as_deref().unwrap_or(""))))
    {
        out.push_str(&format!("  cause at the origin: {cause}: {detail}\n"));
    }
    let inherited = report
        .layers
        .iter()
        .filter(|l| l.cause.as_deref() == Some("inherited"))
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
    if let Some(keep) = &report.keep_float32 {
        let names: Vec<String> = keep
            .layers
            .iter()
            .map(|k| format!("`{}`", k.layer))
            .collect();
        if !names.is_empty() {
            out.push_str(&format!(
                "  keep in float32 (the target computes in {}): {}\n",
                keep.precision,
                names.join(", ")
            ));
        }
        if let Some(check) = &keep.check {
            out.push_str(&format!("  checked: {}\n", check.verdict));
        }
    }
    out
}

/// The verdict in one line: drift and where it is born, inconclusive and why, or no drift.
pub(crate) fn verdict(report: &Report) -> String {
    let s = &report.summary;
    match &s.drift_origin {
        Some(origin) => {
            let first = match &s.first_exceeding {
                Some(f) if f != origin => format!(" (first exceeding: `{f}`)"),
                _ => String::new(),
            };
            format!(
                "drift found: {} of {} compared layers exceed their tolerance; born at `{origin}`{first}",
                s.layers_exceeding, s.layers_compared
            )
        }
        None => match &s.inconclusive {
            Some(why) => format!(
                "inconclusive: the {} compared layers are within tolerance, but {why}",
                s.layers_compared
            ),
            None => format!(
                "no drift: all {} compared layers within tolerance",
                s.layers_compared
            ),
        },
    }
}
