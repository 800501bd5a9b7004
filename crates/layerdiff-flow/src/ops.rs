//! `layerdiff ops`: the op matrix. The cases and the backends that compute them live in the
//! Python package (PyTorch makes the inputs, the float64 truth and the single-op ONNX files);
//! each cell is judged by [`layerdiff_core::check_op`], and its ONNX runs go through
//! [`run_model`]. This module holds the matrix as a report and its renderings: JSON,
//! Markdown, HTML and the text printed.

use std::path::{Path, PathBuf};

use layerdiff_core::render::html_escape;
use layerdiff_core::{Machine, OpCheck, Tensor, render};
use layerdiff_onnx::Model;
use layerdiff_runtime::RuntimeSpec;
use serde::{Deserialize, Serialize};

use crate::output::write_texts;
use crate::{Error, Result};

/// Schema of the op matrix.
pub const OPS_SCHEMA: &str = "layerdiff.ops/1";

/// A cell's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Every element within the bound its dtype and reduction predict.
    Pass,
    /// Some element outside it: the numbers and the bound are in the cell.
    Fail,
    /// The backend has no kernel for the op in this dtype, or cannot run here (the message says).
    Unsupported,
    /// The cell broke in a way that says nothing about the op (the message says how).
    Error,
}

impl Status {
    /// As reports spell it: `PASS`, `FAIL`, `UNSUPPORTED`, `ERROR`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Unsupported => "UNSUPPORTED",
            Self::Error => "ERROR",
        }
    }
}

/// One op as the matrix runs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpCase {
    /// The case's name (`matmul`, `softmax_masked`).
    pub name: String,
    /// The PyTorch call (`torch.matmul`, `F.gelu(approximate='tanh')`).
    pub op: String,
    /// What it reads: kind, shape and values of each input.
    pub inputs: Vec<String>,
    /// Terms reduced into one output element.
    pub reduction: usize,
    /// Intermediate results the op's usual decomposition rounds to the dtype.
    pub stages: u32,
    /// What the error scales with (`terms`, `value`, `input`, `normalized`, `attention`).
    pub magnitude: String,
}

/// A backend as the matrix ran it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpsBackend {
    /// As spelled on the command line (`torch:compile`, `ort:opt=all`, `tract`).
    pub name: String,
    /// Version, device and options, in words.
    pub detail: String,
}

/// One op on one backend in one dtype.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpCell {
    /// The case's name.
    pub case: String,
    /// The backend's name.
    pub backend: String,
    /// The dtype the inputs were rounded to and the op computed in.
    pub dtype: String,
    /// The verdict.
    pub status: Status,
    /// The numbers and the bound (PASS and FAIL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<OpCheck>,
    /// Why a cell is UNSUPPORTED or ERROR, or a FAIL that is not about values (a wrong shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The ONNX ops the exported single-op model holds (ONNX backends).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub onnx_ops: Vec<String>,
}

/// What the Python side ran: everything in the report but the rule and the machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpsRun {
    /// The ONNX opset the single-op models were exported at.
    pub opset: i64,
    /// The `torch.onnx.export` path.
    pub exporter: String,
    /// Seed of every case's inputs.
    pub seed: u64,
    /// Library versions that change the numbers (`torch`, `onnxruntime`).
    pub versions: Vec<(String, String)>,
    /// The backends, in column order.
    pub backends: Vec<OpsBackend>,
    /// The dtypes.
    pub dtypes: Vec<String>,
    /// The cases, in row order.
    pub cases: Vec<OpCase>,
    /// Every cell, case by case, dtype by dtype, backend by backend.
    pub cells: Vec<OpCell>,
}

/// The op matrix.
#[derive(Debug, Clone, Serialize)]
pub struct OpsReport {
    /// [`OPS_SCHEMA`].
    pub schema: &'static str,
    /// The verdict rule, in one line (docs/ops.md says why).
    pub rule: &'static str,
    /// What ran.
    #[serde(flatten)]
    pub run: OpsRun,
    /// The machine.
    pub machine: Machine,
}

/// The rule every cell is judged by.
pub const RULE: &str = "|got - float64 truth on the same rounded inputs| <= n·step(dtype, |truth|) + \
     (stages·u_dtype + (ceil(log2 K) + n)·u_float32)·magnitude, element by element (values below \
     the dtype's normal range may flush to zero); n = 1 step in float16 and bfloat16, 4 in float32";

impl OpsReport {
    /// The report of a run (cells put in row, dtype and column order).
    pub fn new(mut run: OpsRun) -> Self {
        let mut cells = std::mem::take(&mut run.cells);
        let position = |c: &OpCell| {
            (
                run.cases.iter().position(|k| k.name == c.case),
                run.dtypes.iter().position(|d| *d == c.dtype),
                run.backends.iter().position(|b| b.name == c.backend),
            )
        };
        cells.sort_by_key(|c| position(c));
        run.cells = cells;
        Self {
            schema: OPS_SCHEMA,
            rule: RULE,
            run,
            machine: Machine::this(),
        }
    }

    /// Cells with each status, in [`Status`] order.
    pub fn counts(&self) -> [usize; 4] {
        let mut counts = [0; 4];
        for c in &self.run.cells {
            counts[c.status as usize] += 1;
        }
        counts
    }

    /// 0 when every cell that ran passed; 1 when one fails or broke.
    pub fn exit_code(&self) -> u8 {
        let [_, fail, _, error] = self.counts();
        u8::from(fail + error > 0)
    }

    fn cell(&self, case: &str, dtype: &str, backend: &str) -> Option<&OpCell> {
        self.run
            .cells
            .iter()
            .find(|c| c.case == case && c.dtype == dtype && c.backend == backend)
    }

    /// The dtypes that have cells, in order.
    fn dtypes_run(&self) -> impl Iterator<Item = &String> {
        self.run
            .dtypes
            .iter()
            .filter(|d| self.run.cells.iter().any(|c| &c.dtype == *d))
    }
}

/// A cell in a few characters: `0.31` (its ratio to the bound), `FAIL 12x`, `unsup`, `ERROR`.
fn short(cell: Option<&OpCell>) -> String {
    let Some(cell) = cell else {
        return String::new();
    };
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
    out
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

/// Where the matrix goes.
#[derive(Debug, Clone, Default)]
pub struct OpsDestinations {
    /// As JSON.
    pub json: Option<PathBuf>,
    /// As Markdown.
    pub markdown: Option<PathBuf>,
    /// As HTML.
    pub html: Option<PathBuf>,
    /// Print nothing but errors.
    pub quiet: bool,
}

/// The report of a run (`run_json`, an [`OpsRun`] as JSON), written where `to` says.
pub fn report(run_json: &str, to: &OpsDestinations) -> Result<OpsReport> {
    let run: OpsRun = serde_json::from_str(run_json)
        .map_err(|e| Error::Usage(format!("not an op matrix run: {e}")))?;
    let report = OpsReport::new(run);
    write_texts(&[
        (&to.json, render::to_json_value(&report)),
        (&to.markdown, to_markdown(&report)),
        (&to.html, to_html(&report)),
    ])?;
    Ok(report)
}

/// Writes and prints the matrix of a run; returns the exit code (0 every cell that ran
/// passed, 1 one failed or broke).
pub fn deliver(run_json: &str, to: &OpsDestinations) -> Result<u8> {
    let report = report(run_json, to)?;
    if !to.quiet {
        print!("{}", to_text(&report));
    }
    Ok(report.exit_code())
}

/// Runs an ONNX model (its bytes: a single-op model, or a whole one for `layerdiff check`) on
/// `runtime` (`ort`, `ort:opt=all`, `tract`…) and returns its outputs, in the graph's order.
pub fn run_model(
    model: &[u8],
    runtime: &str,
    inputs: &[(String, Tensor)],
    ort_library: Option<&Path>,
) -> Result<Vec<(String, Tensor)>> {
    let spec = RuntimeSpec::parse(runtime).map_err(Error::Usage)?;
    let runtime = spec.build(ort_library)?;
    let model = Model::from_bytes(model, Path::new("single-op model"), None)?;
    let outputs: Vec<String> = model
        .graph()
        .output
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    Ok(runtime.run(&model, inputs, &outputs)?)
}

/// What `runtime` is here, in words (version, provider and options), or why it cannot run here.
pub fn describe_runtime(runtime: &str, ort_library: Option<&Path>) -> Result<String> {
    let spec = RuntimeSpec::parse(runtime).map_err(Error::Usage)?;
    Ok(spec.build(ort_library)?.detail())
}
