//! The page's per-layer table: a row per layer, each number cell sorted by its full value.

use std::fmt::Write;

use crate::{Layer, LayerStatus, Report, Stats};

use super::escape;

/// A number cell: shown in short scientific notation, sorted by its full value.
fn number(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("<td data-v=\"{v:e}\">{v:.3e}</td>"),
        Some(v) => {
            let key = if v.is_nan() { "" } else { "1e400" };
            format!("<td data-v=\"{key}\">{v}</td>")
        }
        None => "<td data-v=\"\"></td>".to_string(),
    }
}

fn ratio(stats: Option<&Stats>) -> Option<f64> {
    stats?.tolerance_multiple()
}

/// The per-layer table, with the filter controls above it.
pub(super) fn table(report: &Report) -> String {
    let origin = report.summary.drift_origin.as_deref();
    let mut out = String::from(
        "<h2>Layers</h2>\n<div class=\"controls\"><input id=\"filter\" type=\"search\" placeholder=\"filter: layer, type, ONNX node, op, cause\"> \
         <select id=\"which\"><option value=\"all\">all layers</option><option value=\"exceeds\">exceeding</option>\
         <option value=\"caused\">with a cause</option><option value=\"compared\">compared</option>\
         <option value=\"unmapped\">not compared</option></select> <span id=\"shown\"></span></div>\n\
         <table id=\"layers\"><thead><tr>",
    );
    let (value, node) = if crate::render::onnx_located(report) {
        ("ONNX value", "ONNX node")
    } else {
        ("target value", "target node")
    };
    for head in [
        "#",
        "layer",
        "type",
        value,
        node,
        "op",
        "shape",
        "dtype",
        "tolerance",
        "max abs diff",
        "× tolerance",
        "local max abs diff",
        "local × tolerance",
        "× what precision explains",
        "mean abs diff",
        "cosine",
        "float64 dist. ref",
        "float64 dist. target",
        "cause",
        "finding",
    ] {
        let _ = write!(out, "<th>{head}</th>");
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for l in &report.layers {
        out.push_str(&row(l, origin == Some(l.name.as_str())));
    }
    out.push_str("</tbody></table>\n");
    out
}

fn row(l: &Layer, origin: bool) -> String {
    let mut classes = vec![match l.status {
        LayerStatus::Unmapped => "unmapped",
        _ => "compared",
    }];
    if l.exceeds_tol || l.local_exceeds || l.status == LayerStatus::ShapeMismatch {
        classes.push("exceeds");
    }
    if l.cause.is_some() {
        classes.push("caused");
    }
    if origin {
        classes.push("origin");
    }
    let onnx = l.location.as_ref();
    let search = [
        Some(l.name.as_str()),
        l.module_type.as_deref(),
        onnx.map(|o| o.value.as_str()),
        onnx.map(|o| o.node.as_str()),
        onnx.map(|o| o.op.as_str()),
        l.cause.map(crate::Cause::name),
        l.finding.map(crate::render::markdown::finding_word),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" ")
    .to_lowercase();
    let text = |v: Option<&str>| format!("<td class=\"t\">{}</td>", escape(v.unwrap_or("")));
    let shape = l.shape_text();
    let dtype = match &l.target_dtype {
        Some(t) => format!("{} → {t}", l.dtype),
        None => l.dtype.clone(),
    };
    let tolerance = match l.status {
        LayerStatus::Unmapped => String::new(),
        _ if l.tolerance.rtol == 0.0 => format!("{:e}", l.tolerance.atol),
        _ => format!("{:e} + {:e}·|x|", l.tolerance.atol, l.tolerance.rtol),
    };
    let acc = l.accumulated.as_ref();
    let local = l.local.as_ref();
    let why = match (&l.cause, l.status) {
        (Some(cause), _) => cause.to_string(),
        (None, LayerStatus::ShapeMismatch) => "shape mismatch".to_string(),
        (None, LayerStatus::Unmapped) => l.reason.clone().unwrap_or_default(),
        (None, LayerStatus::Compared) if l.exceeds_tol => "exceeds".to_string(),
        (None, LayerStatus::Compared) => String::new(),
    };
    let mut out = format!(
        "<tr id=\"layer-{}\" class=\"{}\" data-search=\"{}\"><td data-v=\"{}\">{}</td>",
        l.index,
        classes.join(" "),
        escape(&search),
        l.index,
        l.index
    );
    out.push_str(&text(Some(&l.name)));
    out.push_str(&text(l.module_type.as_deref()));
    out.push_str(&text(onnx.map(|o| o.value.as_str())));
    out.push_str(&text(onnx.map(|o| o.node.as_str())));
    out.push_str(&text(onnx.map(|o| o.op.as_str())));
    out.push_str(&text(Some(&shape)));
    out.push_str(&text(Some(&dtype)));
    out.push_str(&text(Some(&tolerance)));
    out.push_str(&number(acc.map(|s| s.max_abs_diff)));
    out.push_str(&number(ratio(acc)));
    out.push_str(&number(local.map(|s| s.max_abs_diff)));
    out.push_str(&number(ratio(local)));
    out.push_str(&number(l.baseline.as_ref().map(|b| b.multiple)));
    out.push_str(&number(acc.map(|s| s.mean_abs_diff)));
    out.push_str(&match acc.map(|s| s.cosine) {
        Some(c) if c.is_finite() => format!("<td data-v=\"{c:e}\">{c:.6}</td>"),
        c => number(c),
    });
    out.push_str(&number(l.float64.as_ref().map(|f| f.reference)));
    out.push_str(&number(l.float64.as_ref().map(|f| f.target)));
    out.push_str(&text(Some(&why)));
    out.push_str(&text(l.finding.map(crate::render::markdown::finding_word)));
    out.push_str("</tr>\n");
    out
}
