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

/// A finding in a word for tables.
pub(crate) fn finding_word(f: crate::Finding) -> &'static str {
    match f {
        crate::Finding::Defect => "defect",
        crate::Finding::Precision => "precision",
        crate::Finding::Inherited => "inherited",
        crate::Finding::Undecided => "undecided",
        crate::Finding::Approximation => "approximation",
    }
}

/// Renders a report as Markdown.
pub fn to_markdown(report: &Report) -> String {
    let mut out = String::new();
    header(&mut out, report);
    worst(&mut out, report);
    let s = &report.summary;
    defects(&mut out, s);
    narrow_accumulation(&mut out, s);
    approximations(&mut out, s);
    if let Some(p) = &s.precision {
        let _ = writeln!(
            out,
            "\n**Precision**: {}.",
            super::text::precision_words(p, s.layers_compared)
        );
    }
    layers(&mut out, report);
    causes(&mut out, report);
    keep_float32(&mut out, report);
    if let Some(bisection) = &report.bisection {
        let _ = writeln!(
            out,
            "\n## What turns it on\n\nBisected by halves, each candidate set run, the answer checked by a run of its own: {}.",
            bisection.sentence()
        );
    }
    if let Some(search) = &report.opaque {
        opaque(&mut out, search);
    }
    if let Some(whole) = &report.compiled_whole {
        let _ = writeln!(
            out,
            "\n## Across modules\n\nThe layers above were compiled one leaf at a time; {}.",
            whole.sentence()
        );
    }
    notes(&mut out, report);
    out
}

/// The run: sides, machine, tolerance and counts, warnings, inputs.
fn header(out: &mut String, report: &Report) {
    let s = &report.summary;
    let _ = writeln!(
        out,
        "# {}layerdiff: {}\n",
        super::text::incomplete_mark(report),
        code(&report.model)
    );
    let _ = writeln!(
        out,
        "Reference: **{}** ({}) · target: **{}** ({}) · mode: {}\n",
        report.reference.runtime,
        report.reference.detail,
        report.target.runtime,
        report.target.detail,
        report.mode
    );
    if let Some(placement) = report.target.placement_text() {
        let _ = writeln!(out, "Target placement: {placement}\n");
    }
    if let Some(graph) = &report.target_graph {
        let _ = writeln!(out, "Target graph: {}\n", graph.describe());
    }
    if let Some(truth) = &report.truth {
        let _ = writeln!(
            out,
            "Float64 truth: **{}** ({})\n",
            truth.runtime, truth.detail
        );
    }
    let _ = writeln!(out, "Machine: {}\n", report.machine.describe());
    let origin = s
        .drift_origin
        .as_deref()
        .map_or("none".to_string(), |o| format!("`{o}`"));
    let first = s
        .first_exceeding
        .as_deref()
        .map_or("none".to_string(), |o| format!("`{o}`"));
    let _ = writeln!(
        out,
        "Tolerance: {} · layers: {} ({} compared, {} without a counterpart{}) · exceeding: {} accumulated, {} locally · first exceeding: {first} · drift origin: {}\n",
        report.tolerance.describe(),
        s.layers_total,
        s.layers_compared,
        s.layers_unmapped,
        super::not_run(s),
        s.layers_exceeding,
        s.layers_exceeding_locally,
        origin
    );
    if let Some(incomplete) = &s.incomplete {
        let _ = writeln!(out, "> **Incomplete:** {incomplete}\n");
    }
    for warning in &s.warnings {
        let _ = writeln!(out, "> **Warning:** {warning}\n");
    }
    if let Some(inputs) = report.inputs_words() {
        let _ = writeln!(out, "Inputs: {inputs}\n");
    }
}

/// The worst layers, the layers with most error of their own, and the verdict.
fn worst(out: &mut String, report: &Report) {
    let s = &report.summary;
    let _ = writeln!(out, "## Worst layers\n");
    let _ = writeln!(out, "| metric | layer | value |\n|---|---|---|");
    let row = |out: &mut String, metric: &str, w: &Option<WorstLayer>| {
        if let Some(w) = w {
            let _ = writeln!(out, "| {metric} | {} | {} |", code(&w.layer), sci(w.value));
        }
    };
    row(out, "largest max abs diff", &s.worst.max_abs_diff);
    row(out, "largest mean abs diff", &s.worst.mean_abs_diff);
    row(out, "smallest max abs diff", &s.worst.min_max_abs_diff);
    if let Some(ranked) = s.own_error_text() {
        let _ = writeln!(
            out,
            "\nMost error of their own (local mean abs diff): {ranked}."
        );
    }
    let _ = writeln!(out, "\n**Verdict**: {}.", super::text::verdict(report));
}

/// The defects, most severe first.
fn defects(out: &mut String, s: &crate::Summary) {
    if !s.defects.is_empty() {
        let _ = writeln!(
            out,
            "\n## Defects\n\nMost severe first: each computes something its precision does not explain.\n"
        );
        let _ = writeln!(
            out,
            "| layer | cause | × what precision explains | × tolerance | detail | fix |\n|---|---|---:|---:|---|---|"
        );
        let times = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
        for d in &s.defects {
            let _ = writeln!(
                out,
                "| {} | **{}** | {} | {} | {} | {} |",
                code(&d.layer),
                d.cause,
                times(d.multiple),
                times(d.tolerance_multiple),
                cell(&d.detail),
                cell(&d.fix)
            );
        }
    }
}

/// The kernels that approximate within every tolerance.
fn approximations(out: &mut String, s: &crate::Summary) {
    if s.approximations.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n## Approximations\n\nKernels beyond what an honest kernel in their precision explains, whose effect stays within every tolerance of the run: not defects (`--fail-on approximation` fails on them).\n"
    );
    let _ = writeln!(
        out,
        "| layer | ops | × what precision explains | × its tolerance | fix |\n|---|---|---:|---:|---|"
    );
    for a in &s.approximations {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.2} | {} |",
            code(&a.layer),
            cell(&a.ops),
            a.multiple,
            a.tolerance_multiple,
            cell(&a.fix)
        );
    }
}

/// The honest kernels that add up in the narrow dtype.
fn narrow_accumulation(out: &mut String, s: &crate::Summary) {
    if !s.narrow_accumulation.is_empty() {
        let _ = writeln!(
            out,
            "\n## Narrow accumulation\n\nHonest kernels that add their terms up in the narrow dtype: not defects, but each loses more than a float32-accumulating kernel would.\n"
        );
        let _ = writeln!(
            out,
            "| layer | dtype | terms | × float32-accumulating | × narrow-accumulating | fix |\n|---|---|---:|---:|---:|---|"
        );
        for k in &s.narrow_accumulation {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.1} | {:.2} | {} |",
                code(&k.layer),
                k.dtype,
                k.terms,
                k.multiple,
                k.narrow_multiple,
                cell(&k.fix)
            );
        }
    }
}

/// Every layer, a row each.
fn layers(out: &mut String, report: &Report) {
    let _ = writeln!(out, "\n## Layers\n");
    let located = if super::onnx_located(report) {
        "ONNX value"
    } else {
        "target value"
    };
    let _ = writeln!(
        out,
        "| # | layer | type | {located} (op) | shape | tolerance | max abs diff | mean ULPs / × tolerance needed | local max abs diff | × what precision explains | mean abs diff | cosine | float64 distance (ref / target) | verdict |"
    );
    let _ = writeln!(
        out,
        "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|:---|"
    );
    for l in &report.layers {
        layer_row(out, l);
    }
}

fn layer_row(out: &mut String, l: &crate::Layer) {
    let onnx = l.location.as_ref().map_or("—".to_string(), |o| {
        format!("{} ({})", code(&o.value), cell(&o.op))
    });
    let shape = l.shape_text();
    let kind = cell(l.module_type.as_deref().unwrap_or(""));
    let (max, mean, cos) = match &l.accumulated {
        Some(st) => (
            sci(st.max_abs_diff),
            sci(st.mean_abs_diff),
            format!("{:.6}", st.cosine),
        ),
        None => Default::default(),
    };
    let local = l.local.as_ref().map_or(String::new(), |st| {
        let mark = if l.local_exceeds { " **>**" } else { "" };
        format!("{}{mark}", sci(st.max_abs_diff))
    });
    // The own error against the same-precision baseline (above 1: a defect).
    let baseline = l.baseline.as_ref().map_or(String::new(), |b| {
        let mark = if b.beyond() { " **>**" } else { "" };
        format!("{:.2}{mark}", b.multiple)
    });
    let truth = l.float64.as_ref().map_or(String::new(), |f| {
        format!("{} / {}", sci(f.reference), sci(f.target))
    });
    let tolerance = match l.status {
        LayerStatus::Unmapped => String::new(),
        _ if l.tolerance.rtol == 0.0 => format!("{:e}", l.tolerance.atol),
        _ => format!("{:e} + {:e}·\\|x\\|", l.tolerance.atol, l.tolerance.rtol),
    };
    // How far the elements are in steps of the dtype on average, and how many times its
    // tolerance the layer would have needed (above 1: exceeding).
    let rounding = l
        .accumulated
        .as_ref()
        .and_then(|st| st.rounding.as_ref())
        .map_or(String::new(), |r| {
            format!("{:.2} / {:.2}", r.mean_ulp_diff, r.tolerance_needed)
        });
    let flag = match (&l.cause, l.status) {
        (Some(cause), _) => match l.finding {
            Some(f) if f != crate::Finding::Inherited => {
                format!("**{cause}** ({})", finding_word(f))
            }
            _ => format!("**{cause}**"),
        },
        (None, LayerStatus::Compared) if l.exceeds_tol => "**exceeds**".to_string(),
        (None, LayerStatus::Compared) => String::new(),
        (None, LayerStatus::ShapeMismatch) => "**shape**".to_string(),
        (None, LayerStatus::Unmapped) => "n/a".to_string(),
    };
    let _ = writeln!(
        out,
        "| {} | {} | {kind} | {onnx} | {shape} | {tolerance} | {max} | {rounding} | {local} | {baseline} | {mean} | {cos} | {truth} | {flag} |",
        l.index,
        code(&l.name)
    );
}

/// Each cause, said once with the layers it applies to.
fn causes(out: &mut String, report: &Report) {
    let causes: Vec<_> = report.layers.iter().filter(|l| l.cause.is_some()).collect();
    if !causes.is_empty() {
        let _ = writeln!(out, "\n## Causes\n");
        for group in super::alike::causes(causes) {
            let l = group[0];
            let cause = l.cause.map_or("", crate::Cause::name);
            let permutation = l
                .permutation
                .as_ref()
                .map(|p| format!(" {p:?}"))
                .unwrap_or_default();
            let detail = l.detail.as_deref().unwrap_or_default();
            let _ = writeln!(
                out,
                "- {}: **{cause}**{permutation}: {detail}{}",
                code(&l.name),
                alike_tail(group[1..].iter().map(|o| o.name.clone()).collect())
            );
        }
    }
}

/// The keep-in-float32 advice and its check.
fn keep_float32(out: &mut String, report: &Report) {
    if let Some(keep) = &report.keep_float32 {
        let _ = writeln!(out, "\n## Keep in float32\n\n{}:\n", keep.heading());
        let _ = writeln!(out, "| layer | why | ONNX nodes |\n|---|---|---|");
        for k in &keep.layers {
            let nodes: Vec<String> = k.nodes.iter().map(|n| code(n)).collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                code(&k.layer),
                cell(&k.why),
                nodes.join(" ")
            );
        }
        if let Some(check) = &keep.check {
            let _ = writeln!(
                out,
                "\n**Checked** by re-running with them kept: {}.",
                check.verdict
            );
        }
    }
}

/// Why a layer was not compared, or not measured locally or against a baseline. The layers
/// that need no baseline (their own value is the reference's bit for bit) are counted in one
/// line, not listed.
fn notes(out: &mut String, report: &Report) {
    let same = |l: &&crate::Layer| l.baseline_reason.as_deref() == Some(crate::SAME_BITS);
    let same_bits = report.layers.iter().filter(same).count();
    let notes: Vec<_> = report
        .layers
        .iter()
        .filter_map(|l| {
            let local = l
                .local_reason
                .as_ref()
                .map(|r| format!("local error not measured: {r}"));
            let baseline = (l.baseline_reason.as_ref())
                .filter(|r| r.as_str() != crate::SAME_BITS)
                .map(|r| format!("no same-precision baseline: {r}"));
            let text: Vec<String> = l
                .reason
                .iter()
                .cloned()
                .chain(local)
                .chain(baseline)
                .collect();
            (!text.is_empty()).then(|| (l, text.join("; ")))
        })
        .collect();
    if !notes.is_empty() || same_bits > 0 {
        let _ = writeln!(out, "\n## Notes on layers\n");
        for group in super::alike::alike(notes, |(_, reason)| Some(super::alike::masked(reason))) {
            let (l, reason) = &group[0];
            let _ = writeln!(
                out,
                "- {}: {reason}{}",
                code(&l.name),
                alike_tail(group[1..].iter().map(|(o, _)| o.name.clone()).collect())
            );
        }
        if same_bits > 0 {
            let (n, each) = match same_bits {
                1 => ("1 layer needs".to_string(), "its own value is"),
                n => (format!("{n} layers need"), "each one's own value is"),
            };
            let _ = writeln!(
                out,
                "- {n} no same-precision baseline: {each} the reference's, bit for bit (no error of its own to judge)"
            );
        }
    }
}

/// After a finding said once: the other layers it applies to, or nothing.
fn alike_tail(others: Vec<String>) -> String {
    if others.is_empty() {
        String::new()
    } else {
        format!("; {}", super::alike::others_words(&others, code))
    }
}

/// A name as inline code that sits safely in a table cell or a line: its `|` escaped, a line
/// break turned into a space, and (holding a backtick) fenced with two.
fn code(name: &str) -> String {
    let text = name.replace('\n', " ").replace('|', "\\|");
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

/// Text for a table cell: its `|` escaped and line breaks turned into spaces.
fn cell(text: &str) -> String {
    text.replace('\n', " ").replace('|', "\\|")
}

/// How an opaque target was searched: the sentence, then each range it ran.
fn opaque(out: &mut String, search: &crate::OpaqueSearch) {
    let _ = writeln!(
        out,
        "\n## How the opaque target was searched\n\n{}.\n\n| range | nodes | outputs | × precision | deviates |\n|---|---:|---:|---:|---|",
        search.sentence()
    );
    for r in &search.ranges {
        let _ = writeln!(
            out,
            "| {} … {} | {} | {} | {:.3} | {} |",
            code(&r.first),
            code(&r.last),
            r.nodes,
            r.outputs,
            r.multiple,
            if r.deviates { "yes" } else { "no" }
        );
    }
}
