//! Writing reports and printing the summary. Files are written whole or not at all.

use std::path::{Path, PathBuf};

use layerdiff_core::{Report, render};

/// Writes `contents` to `path` through a temporary file in the same folder, so a failure never
/// leaves half a report behind.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// Writes the JSON and/or Markdown renderings; returns the paths written.
pub fn write_reports(
    report: &Report,
    json: Option<&Path>,
    markdown: Option<&Path>,
) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if let Some(path) = json {
        write_atomic(path, render::to_json(report).as_bytes())?;
        written.push(path.to_path_buf());
    }
    if let Some(path) = markdown {
        write_atomic(path, render::to_markdown(report).as_bytes())?;
        written.push(path.to_path_buf());
    }
    Ok(written)
}

/// The short summary printed to stdout: verdict, counts, origin, worst layers.
pub fn summary_text(report: &Report) -> String {
    let s = &report.summary;
    let mut out = String::new();
    let verdict = match &s.drift_origin {
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
    };
    out.push_str(&format!("{}: {verdict}\n", report.model));
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
    out.push_str(&format!(
        "  layers: {} total, {} compared, {} without an ONNX counterpart\n",
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
    out
}

/// The process exit code for a finished comparison: 0 clean, 1 drift (or a run that cannot
/// rule it out).
pub fn exit_code(report: &Report) -> u8 {
    let s = &report.summary;
    u8::from(s.drift_origin.is_some() || s.inconclusive.is_some())
}
