//! The op matrix in words: text, Markdown and HTML, with the findings each leads with.

use super::{OpCell, OpsReport, Status, html_escape};
/// A cell in a few characters: `0.31` (its ratio to the bound), `FAIL 12x`, `unsup`, `ERROR`;
/// `*` after one its backend computed in a narrower dtype ([`OpCell::computed_in`]).
fn short(cell: Option<&OpCell>) -> String {
    let Some(cell) = cell else {
        return String::new();
    };
    // a cell that was judged in that dtype; one that broke computed nothing to judge
    let judged_narrower = cell.computed_in.is_some() && cell.check.is_some();
    let mark = if judged_narrower { "*" } else { "" };
    format!("{}{mark}", verdict(cell))
}

fn verdict(cell: &OpCell) -> String {
    match (cell.status, &cell.check) {
        (Status::Pass, Some(c)) => format!("ok {}", ratio(c.ratio)),
        (Status::Fail, Some(c)) => format!("FAIL {}", ratio(c.ratio)),
        (Status::Fail, None) => "FAIL".to_string(),
        (Status::Pass, None) => "ok".to_string(),
        (Status::Unsupported, _) => "unsup".to_string(),
        (Status::Error, _) => "ERROR".to_string(),
    }
}

/// A ratio to the bound, two significant digits (`0.031`, `0.5`, `12x`).
fn ratio(r: f64) -> String {
    if r == 0.0 {
        "0".to_string()
    } else if r.is_infinite() {
        "inf".to_string()
    } else if r >= 10.0 {
        format!("{r:.0}x")
    } else if r >= 1.0 {
        format!("{r:.1}x")
    } else {
        let digits = (-r.log10()).ceil().max(1.0) as usize + 1;
        format!("{r:.digits$}")
    }
}

/// What a failing or broken cell says, in one line.
fn finding(cell: &OpCell) -> String {
    let mut line = format!("{} {} on {}", cell.case, cell.dtype, cell.backend);
    if let Some(grid) = &cell.computed_in {
        line.push_str(&format!(" (computed in {grid})"));
    }
    if let Some(c) = &cell.check {
        line.push_str(&format!(
            ": {} of {} elements outside the bound, max |diff| {:.3e} ({} steps), {}x the bound",
            c.outside,
            c.elements,
            c.max_abs_diff,
            steps(c.max_ulps),
            ratio(c.ratio).trim_end_matches('x')
        ));
        if let Some(w) = &c.worst {
            line.push_str(&format!(
                "; worst at element {}: {:.6e} where the truth is {:.6e} (bound {:.2e})",
                w.index, w.got, w.expected, w.bound
            ));
        }
    }
    if let Some(m) = &cell.message {
        line.push_str(&format!(": {}", one_line(m)));
    }
    line
}

/// Steps of a dtype: `1.9`, `3168`, `4.1e37` (near zero a step is tiny, so counts run high).
fn steps(ulps: f64) -> String {
    if ulps < 100.0 {
        format!("{ulps:.1}")
    } else if ulps < 1e6 {
        format!("{ulps:.0}")
    } else {
        format!("{ulps:.1e}")
    }
}

fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > 300 {
        format!("{}…", line.chars().take(300).collect::<String>())
    } else {
        line
    }
}

/// The cells that fail or broke, in order.
fn findings(report: &OpsReport) -> Vec<&OpCell> {
    report
        .run
        .cells
        .iter()
        .filter(|c| matches!(c.status, Status::Fail | Status::Error))
        .collect()
}

fn verdict_line(report: &OpsReport) -> String {
    let [pass, fail, unsupported, error] = report.counts();
    format!(
        "{} ops × {} backends × {} dtypes: {} cells, {pass} pass, {fail} fail, {unsupported} unsupported, {error} error",
        report.run.cases.len(),
        report.run.backends.len(),
        report.dtypes_run().count(),
        report.run.cells.len()
    )
}

/// The matrix as printed: a grid per dtype (each cell's ratio to its bound), then the findings.
pub fn to_text(report: &OpsReport) -> String {
    let mut out = format!("op matrix: {}\n", verdict_line(report));
    let width = report
        .run
        .cases
        .iter()
        .map(|c| c.name.len())
        .chain(report.run.dtypes.iter().map(String::len))
        .max()
        .unwrap_or(4);
    for dtype in report.dtypes_run() {
        let columns: Vec<usize> = report
            .run
            .backends
            .iter()
            .map(|b| b.name.len().max(9))
            .collect();
        out.push_str(&format!("\n  {dtype:<width$}"));
        for (b, w) in report.run.backends.iter().zip(&columns) {
            out.push_str(&format!("  {:<w$}", b.name));
        }
        out.push('\n');
        for case in &report.run.cases {
            out.push_str(&format!("  {:<width$}", case.name));
            for (b, w) in report.run.backends.iter().zip(&columns) {
                out.push_str(&format!(
                    "  {:<w$}",
                    short(report.cell(&case.name, dtype, &b.name))
                ));
            }
            out.push('\n');
        }
    }
    let findings = findings(report);
    if !findings.is_empty() {
        out.push('\n');
    }
    for cell in findings {
        out.push_str(&format!(
            "  {} {}\n",
            if cell.status == Status::Fail {
                "FAIL "
            } else {
                "ERROR"
            },
            finding(cell)
        ));
    }
    out.push_str(
        "\n  numbers are each cell's largest error as a fraction of the bound its dtype and \
         reduction allow (ok ≤ 1); unsup: no kernel or backend for it here\n",
    );
    if let Some(said) = narrowed_note(report) {
        out.push_str(&format!("  {said}\n"));
    }
    out
}

/// What a `*` cell is, where the matrix has one: the backend computed the op in a narrower
/// dtype than the cell's, so its inputs were rounded to that dtype and it was judged by its
/// rule (`None`: no such cell).
fn narrowed_note(report: &OpsReport) -> Option<String> {
    let mut which: Vec<String> = Vec::new();
    for cell in &report.run.cells {
        if let Some(grid) = &cell.computed_in {
            let said = format!("`{}` in {grid}", cell.backend);
            if !which.contains(&said) {
                which.push(said);
            }
        }
    }
    (!which.is_empty()).then(|| {
        format!(
            "*: computed in a narrower dtype than the column's, as the backend computes float math here ({}: its inference precision, see its detail); inputs rounded to that dtype, judged by its rule",
            which.join(", ")
        )
    })
}

fn md_escape(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

/// The matrix as Markdown.
pub fn to_markdown(report: &OpsReport) -> String {
    let mut out = format!(
        "# layerdiff op matrix\n\n{}.\n\nEach cell: the op on the backend, inputs rounded to the dtype, \
         judged against a float64 computation on the same rounded inputs; the number is the largest \
         error as a fraction of the bound (pass ≤ 1). Bound: `{}`. ONNX backends run each op \
         exported alone (`torch.onnx.export`, {}, opset {}).\n\n",
        verdict_line(report),
        report.rule,
        report.run.exporter,
        report.run.opset
    );
    out.push_str(&format!("Machine: {}.", report.machine.describe()));
    for (library, version) in &report.run.versions {
        out.push_str(&format!(" {library} {version}."));
    }
    out.push_str("\n\n| backend | what ran |\n|---|---|\n");
    for b in &report.run.backends {
        out.push_str(&format!("| `{}` | {} |\n", b.name, md_escape(&b.detail)));
    }
    for dtype in report.dtypes_run() {
        out.push_str(&format!("\n## {dtype}\n\n| op | K |"));
        for b in &report.run.backends {
            out.push_str(&format!(" `{}` |", b.name));
        }
        out.push_str("\n|---|---|");
        out.push_str(&"---|".repeat(report.run.backends.len()));
        out.push('\n');
        for case in &report.run.cases {
            out.push_str(&format!("| {} | {} |", case.name, case.reduction));
            for b in &report.run.backends {
                let cell = report.cell(&case.name, dtype, &b.name);
                let text = short(cell);
                let text = if text.starts_with("FAIL") || text == "ERROR" {
                    format!("**{text}**")
                } else {
                    text
                };
                out.push_str(&format!(" {text} |"));
            }
            out.push('\n');
        }
    }
    if let Some(said) = narrowed_note(report) {
        out.push_str(&format!("\n{}\n", md_escape(&said)));
    }
    let listed = |status: Status| -> Vec<&OpCell> {
        report
            .run
            .cells
            .iter()
            .filter(|c| c.status == status)
            .collect()
    };
    for (status, title) in [
        (Status::Fail, "Failures"),
        (Status::Error, "Errors"),
        (Status::Unsupported, "Unsupported"),
    ] {
        let cells = listed(status);
        if cells.is_empty() {
            continue;
        }
        out.push_str(&format!("\n## {title}\n\n"));
        for cell in cells {
            out.push_str(&format!("- {}\n", md_escape(&finding(cell))));
        }
    }
    out.push_str("\n## Cases\n\n| op | call | inputs | K | stages | magnitude |\n|---|---|---|---|---|---|\n");
    for c in &report.run.cases {
        out.push_str(&format!(
            "| {} | `{}` | {} | {} | {} | {} |\n",
            c.name,
            md_escape(&c.op),
            md_escape(&c.inputs.join("; ")),
            c.reduction,
            c.stages,
            c.magnitude
        ));
    }
    out
}

/// The matrix as one self-contained HTML page: a colored grid per dtype, each cell's numbers in
/// its tooltip, the findings below.
pub fn to_html(report: &OpsReport) -> String {
    let mut out = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>layerdiff op matrix</title>\n<style>\n\
         body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}\n\
         table{border-collapse:collapse;margin:1em 0}\n\
         th,td{border:1px solid #ccc;padding:3px 8px;text-align:center;white-space:nowrap}\n\
         th.op,td.op{text-align:left;font-family:monospace}\n\
         td.PASS{background:#e3f4e3}td.FAIL{background:#f8c9c4;font-weight:bold}\n\
         td.UNSUPPORTED{background:#eee;color:#888}td.ERROR{background:#fbe3b0}\n\
         code{font-size:90%}\n</style></head><body>\n<h1>layerdiff op matrix</h1>\n",
    );
    out.push_str(&format!(
        "<p>{}.</p>\n<p>Each cell: the op on the backend with its inputs rounded to the dtype, judged \
         against a float64 computation on the same rounded inputs. The number is the largest error as a \
         fraction of the bound (pass &le; 1); hover a cell for its numbers. Bound: <code>{}</code>.</p>\n\
         <p>Machine: {}.",
        html_escape(&verdict_line(report)),
        html_escape(report.rule),
        html_escape(&report.machine.describe())
    ));
    for (library, version) in &report.run.versions {
        out.push_str(&format!(
            " {} {}.",
            html_escape(library),
            html_escape(version)
        ));
    }
    out.push_str("</p>\n<ul>\n");
    for b in &report.run.backends {
        out.push_str(&format!(
            "<li><code>{}</code>: {}</li>\n",
            html_escape(&b.name),
            html_escape(&b.detail)
        ));
    }
    out.push_str("</ul>\n");
    for dtype in report.dtypes_run() {
        out.push_str(&format!(
            "<h2>{}</h2>\n<table>\n<tr><th class=\"op\">op</th><th>K</th>",
            html_escape(dtype)
        ));
        for b in &report.run.backends {
            out.push_str(&format!("<th>{}</th>", html_escape(&b.name)));
        }
        out.push_str("</tr>\n");
        for case in &report.run.cases {
            out.push_str(&format!(
                "<tr><td class=\"op\" title=\"{}\">{}</td><td>{}</td>",
                html_escape(&format!("{}: {}", case.op, case.inputs.join("; "))),
                html_escape(&case.name),
                case.reduction
            ));
            for b in &report.run.backends {
                match report.cell(&case.name, dtype, &b.name) {
                    None => out.push_str("<td></td>"),
                    Some(cell) => out.push_str(&format!(
                        "<td class=\"{}\" title=\"{}\">{}</td>",
                        cell.status.name(),
                        html_escape(&finding(cell)),
                        html_escape(&short(Some(cell)))
                    )),
                }
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
    }
    if let Some(said) = narrowed_note(report) {
        out.push_str(&format!("<p>{}</p>\n", html_escape(&said)));
    }
    let findings = findings(report);
    if !findings.is_empty() {
        out.push_str("<h2>Findings</h2>\n<ul>\n");
        for cell in findings {
            out.push_str(&format!(
                "<li><b>{}</b> {}</li>\n",
                cell.status.name(),
                html_escape(&finding(cell))
            ));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</body></html>\n");
    out
}
