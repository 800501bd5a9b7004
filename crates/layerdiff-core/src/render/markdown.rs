//! Markdown: a header line, the worst-layer table, and the per-layer table.

use std::fmt::Write;

use crate::{LayerStatus, Report, WorstLayer};

/// Short scientific notation for tables (`9.537e-06`).
fn sci(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3e}")
    } else {
        v.to_string()
    }
}

/// Renders a report as Markdown.
pub fn to_markdown(report: &Report) -> String {
    let s = &report.summary;
    let mut out = String::new();
    let _ = writeln!(out, "# layerdiff: `{}`\n", report.model);
    let _ = writeln!(
        out,
        "Reference: **{}** ({}) · target: **{}** ({}) · mode: {}\n",
        report.reference.runtime,
        report.reference.detail,
        report.target.runtime,
        report.target.detail,
        report.mode
    );
    let origin = s
        .drift_origin
        .as_deref()
        .map_or("none".to_string(), |o| format!("`{o}`"));
    let _ = writeln!(
        out,
        "Tolerance: {} · layers: {} ({} compared, {} without a counterpart) · layers exceeding: {} · drift origin: {}\n",
        report.tolerance,
        s.layers_total,
        s.layers_compared,
        s.layers_unmapped,
        s.layers_exceeding,
        origin
    );
    if !report.inputs.is_empty() {
        let inputs: Vec<String> = report
            .inputs
            .iter()
            .map(|i| format!("`{}` {} {:?}", i.name, i.dtype, i.shape))
            .collect();
        let seed = report
            .seed
            .map(|s| format!(" (seed {s})"))
            .unwrap_or_default();
        let _ = writeln!(out, "Inputs{seed}: {}\n", inputs.join(", "));
    }

    let _ = writeln!(out, "## Worst layers\n");
    let _ = writeln!(out, "| metric | layer | value |\n|---|---|---|");
    let row = |out: &mut String, metric: &str, w: &Option<WorstLayer>| {
        if let Some(w) = w {
            let _ = writeln!(out, "| {metric} | `{}` | {} |", w.layer, sci(w.value));
        }
    };
    row(&mut out, "largest max abs diff", &s.worst.max_abs_diff);
    row(&mut out, "largest mean abs diff", &s.worst.mean_abs_diff);
    row(&mut out, "smallest max abs diff", &s.worst.min_max_abs_diff);
    let verdict = match &s.drift_origin {
        None => format!(
            "\nNo drift: no layer exceeds {} across {} compared layers.\n",
            report.tolerance, s.layers_compared
        ),
        Some(o) => format!(
            "\n**Drift found**: {} layer(s) exceed {}; the first, in execution order, is `{o}`.\n",
            s.layers_exceeding, report.tolerance
        ),
    };
    out.push_str(&verdict);

    let _ = writeln!(out, "\n## Layers\n");
    let _ = writeln!(
        out,
        "| # | layer | type | ONNX value (op) | shape | max abs diff | mean abs diff | max rel diff | cosine | > tol |"
    );
    let _ = writeln!(out, "|---:|---|---|---|---|---:|---:|---:|---:|:---:|");
    for l in &report.layers {
        let onnx = l.onnx.as_ref().map_or("—".to_string(), |o| {
            format!("`{}` ({})", o.value, o.op_type)
        });
        let shape = l
            .shape
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("×");
        let kind = l.module_type.as_deref().unwrap_or("");
        let (max, mean, rel, cos) = match &l.stats {
            Some(st) => (
                sci(st.max_abs_diff),
                sci(st.mean_abs_diff),
                sci(st.max_rel_diff),
                format!("{:.6}", st.cosine),
            ),
            None => Default::default(),
        };
        let flag = match l.status {
            _ if l.cause.as_deref() == Some("layout_permutation") => "**layout**",
            LayerStatus::Compared if l.target_dtype.is_some() => "**dtype**",
            LayerStatus::Compared if l.exceeds_tol => "**yes**",
            LayerStatus::Compared => "",
            LayerStatus::ShapeMismatch => "**shape**",
            LayerStatus::Unmapped => "n/a",
        };
        let _ = writeln!(
            out,
            "| {} | `{}` | {kind} | {onnx} | {shape} | {max} | {mean} | {rel} | {cos} | {flag} |",
            l.index, l.name
        );
    }
    let causes: Vec<_> = report.layers.iter().filter(|l| l.cause.is_some()).collect();
    if !causes.is_empty() {
        let _ = writeln!(out, "\n## Causes\n");
        for l in causes {
            let cause = l.cause.as_deref().unwrap_or_default();
            let permutation = l
                .permutation
                .as_ref()
                .map(|p| format!(" {p:?}"))
                .unwrap_or_default();
            let detail = l.detail.as_deref().unwrap_or_default();
            let _ = writeln!(out, "- `{}`: **{cause}**{permutation}: {detail}", l.name);
        }
    }
    let notes: Vec<_> = report
        .layers
        .iter()
        .filter_map(|l| l.reason.as_ref().map(|r| (l, r)))
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n## Notes on layers\n");
        for (l, reason) in notes {
            let _ = writeln!(out, "- `{}`: {reason}", l.name);
        }
    }
    out
}
