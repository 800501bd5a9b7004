//! `layerdiff sweep`'s index: one row per run (a model against a target, in a precision, at a
//! batch size), its verdict and headline read from its own report, and where that report is.
//! The runs are made by the Python package (each a `layerdiff torch` process, here or as a Ray
//! task); the index is written and printed here, by the same destinations as every report.
//!
//! Its contents depend only on the runs' reports, never on where or when they ran: no host, no
//! time. A run tried again after its process died says so (`retried`).

use layerdiff_core::Machine;
use layerdiff_core::render::html_escape;
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::output::{Destinations, Format, Rendered, publish};

/// Schema of the index.
pub const SWEEP_SCHEMA: &str = "layerdiff.sweep/1";

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// It compared and wrote its report (exit 0 or 1).
    Compared,
    /// It refused its options or its model (exit 2): the row says why.
    CouldNotRun,
    /// Its process died twice (killed, out of memory, a lost node): the row says how.
    Failed,
    /// The sweep was stopped (Ctrl-C, SIGTERM) before it ended.
    NotRun,
}

/// One run of the sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepRow {
    /// The model as given.
    pub model: String,
    /// The target as spelled.
    pub target: String,
    /// The precision (`--dtype`), where one was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// The batch size, where one was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    /// How it ended.
    pub status: RunStatus,
    /// Its exit code (`None`: its process died).
    pub exit: Option<i32>,
    /// Its report's verdict (`defect`, `precision`…), once compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Its report's first line: the headline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headline: Option<String>,
    /// How many defects its report names.
    #[serde(default)]
    pub defects: usize,
    /// The folder of its reports, relative to the index (`runs/resnet18--ort`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// Its page, relative to the index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
    /// The JSON report, relative to the index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<String>,
    /// Why it could not run, or how its process died.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How its first try died, where it was tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried: Option<String>,
    /// The command line that makes the run again.
    pub command: String,
}

/// The index of a sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepIndex {
    /// [`SWEEP_SCHEMA`].
    pub schema: String,
    /// The runs, in the order the sweep lists them (model, then target, precision, batch).
    pub rows: Vec<SweepRow>,
    /// Why the sweep ended before its last run (`interrupted by SIGINT`): the rows not run say
    /// so, and the runs that ended keep their reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// The machine that wrote the index (its runs may have run elsewhere).
    #[serde(skip_deserializing, default = "Machine::this")]
    pub machine: Machine,
}

impl SweepIndex {
    /// The index of `rows`.
    pub fn new(rows: Vec<SweepRow>) -> Self {
        Self {
            schema: SWEEP_SCHEMA.to_string(),
            rows,
            incomplete: None,
            machine: Machine::this(),
        }
    }

    /// The index read back from its JSON (as the Python package hands it over).
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text)
            .map_err(|e| crate::Error::Usage(format!("a sweep index that does not read: {e}")))
    }

    /// How many runs compared, could not run and failed; and of those compared, how many
    /// exited 1.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let of = |s: RunStatus| self.rows.iter().filter(|r| r.status == s).count();
        let failing = (self.rows.iter())
            .filter(|r| r.status == RunStatus::Compared && r.exit == Some(1))
            .count();
        (
            of(RunStatus::Compared),
            of(RunStatus::CouldNotRun),
            of(RunStatus::Failed),
            failing,
        )
    }

    /// 0 when every run compared clean or rounding only; 1 when one fails its `--fail-on`,
    /// could not run or its process died; 2 when none could run.
    pub fn exit_code(&self) -> u8 {
        let (compared, could_not, failed, failing) = self.counts();
        if compared == 0 && failed == 0 {
            2
        } else {
            u8::from(failing > 0 || could_not > 0 || failed > 0)
        }
    }

    /// The sweep in one line.
    fn verdict_line(&self) -> String {
        let (compared, could_not, failed, failing) = self.counts();
        let mut said = format!(
            "{} run(s): {compared} compared ({failing} failing, {} clean or rounding only)",
            self.rows.len(),
            compared - failing
        );
        if could_not > 0 {
            said.push_str(&format!(", {could_not} could not run"));
        }
        if failed > 0 {
            said.push_str(&format!(", {failed} failed (their process died twice)"));
        }
        if let Some(why) = &self.incomplete {
            let left = self.rows.len() - compared - could_not - failed;
            said.push_str(&format!("; INCOMPLETE: {why}, {left} not run"));
        }
        said
    }
}

/// A row's verdict in words: its headline, or why it has none.
fn said(row: &SweepRow) -> String {
    match row.status {
        RunStatus::Compared => row.headline.clone().unwrap_or_default(),
        RunStatus::CouldNotRun => format!(
            "could not run: {}",
            row.error.as_deref().unwrap_or("no reason given")
        ),
        RunStatus::Failed => format!(
            "failed: {}",
            row.error.as_deref().unwrap_or("its process died")
        ),
        RunStatus::NotRun => "not run: the sweep was stopped first".to_string(),
    }
}

/// The run's coordinates beyond model and target (`fp16`, `batch 8`), in words.
fn point(row: &SweepRow) -> String {
    let mut parts = Vec::new();
    if let Some(d) = &row.dtype {
        parts.push(d.clone());
    }
    if let Some(b) = row.batch {
        parts.push(format!("batch {b}"));
    }
    parts.join(", ")
}

fn verdict_name(row: &SweepRow) -> String {
    match (row.status, &row.verdict) {
        (RunStatus::Compared, Some(v)) => v.clone(),
        (RunStatus::CouldNotRun, _) => "could not run".to_string(),
        (RunStatus::Failed, _) => "failed".to_string(),
        (RunStatus::NotRun, _) => "not run".to_string(),
        (RunStatus::Compared, None) => "compared".to_string(),
    }
}

/// The index as printed: one line per run.
pub fn to_text(index: &SweepIndex) -> String {
    let mut out = format!("sweep: {}\n", index.verdict_line());
    for row in &index.rows {
        let at = point(row);
        let at = if at.is_empty() {
            String::new()
        } else {
            format!(" ({at})")
        };
        let retried = row
            .retried
            .as_ref()
            .map_or(String::new(), |how| format!(" [tried again: {how}]"));
        out.push_str(&format!(
            "  {} · {}{at}: {}{retried}\n",
            row.model,
            row.target,
            said(row)
        ));
    }
    out
}

/// The index as Markdown: a table, each run linked to its page.
pub fn to_markdown(index: &SweepIndex) -> String {
    let md = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = format!(
        "# layerdiff sweep\n\n{}.\n\n| model | target | point | verdict | defects | headline | report |\n|---|---|---|---|---|---|---|\n",
        index.verdict_line()
    );
    for row in &index.rows {
        let report = row
            .report
            .as_ref()
            .map_or(String::new(), |r| format!("[page]({r})"));
        let retried = (row.retried.as_ref())
            .map_or(String::new(), |how| format!(" (tried again: {})", md(how)));
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {} | {} | {}{retried} | {report} |\n",
            md(&row.model),
            md(&row.target),
            md(&point(row)),
            verdict_name(row),
            row.defects,
            md(&said(row)),
        ));
    }
    out
}

/// The index as one self-contained HTML page: a table of verdicts, each linking to its run's
/// page and JSON.
pub fn to_html(index: &SweepIndex) -> String {
    let mut out = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>layerdiff sweep</title>\n<style>\n\
         body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}\n\
         table{border-collapse:collapse;margin:1em 0}\n\
         th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\n\
         td.defect,td.failed{background:#f8c9c4;font-weight:bold}\n\
         td.undecided,td.inconclusive,td.could{background:#fbe3b0}\n\
         td.precision,td.no_drift{background:#e3f4e3}\n\
         code{font-size:90%}\n</style></head><body>\n<h1>layerdiff sweep</h1>\n",
    );
    out.push_str(&format!(
        "<p>{}.</p>\n<p>Index written on {}.</p>\n<table>\n<tr><th>model</th><th>target</th><th>point</th><th>verdict</th><th>defects</th><th>headline</th><th>reports</th></tr>\n",
        html_escape(&index.verdict_line()),
        html_escape(&index.machine.describe())
    ));
    for row in &index.rows {
        let verdict = verdict_name(row);
        let class = verdict.split(' ').next().unwrap_or_default().to_string();
        let mut links = Vec::new();
        if let Some(page) = &row.report {
            links.push(format!("<a href=\"{}\">page</a>", html_escape(page)));
        }
        if let Some(json) = &row.json {
            links.push(format!("<a href=\"{}\">JSON</a>", html_escape(json)));
        }
        let retried = row.retried.as_ref().map_or(String::new(), |how| {
            format!("<br><small>tried again: {}</small>", html_escape(how))
        });
        out.push_str(&format!(
            "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td title=\"{}\">{}{retried}</td><td>{}</td></tr>\n",
            html_escape(&row.model),
            html_escape(&row.target),
            html_escape(&point(row)),
            html_escape(&verdict),
            row.defects,
            html_escape(&row.command),
            html_escape(&said(row)),
            links.join(" · ")
        ));
    }
    out.push_str("</table>\n</body></html>\n");
    out
}

impl Rendered for SweepIndex {
    fn whole(&self) -> bool {
        self.incomplete.is_none()
    }

    fn render(&self, format: Format) -> Option<String> {
        crate::output::page_forms(self, format, to_markdown, to_html, to_text)
    }
}

/// Writes and prints the index, its runs' reports under `out` kept as reports (a sweep a
/// signal stops keeps every run that ended); returns the exit code ([`SweepIndex::exit_code`]).
pub fn deliver(index: &SweepIndex, out: &std::path::Path, to: &Destinations) -> Result<u8> {
    let mut reports = Vec::new();
    for folder in index.rows.iter().filter_map(|r| r.folder.as_ref()) {
        files_under(&out.join(folder), &mut reports);
    }
    // the runs' reports are whole, whether or not the sweep ended
    crate::made::wrote(&reports, true);
    publish(index, to)?;
    Ok(index.exit_code())
}

/// Every file under `folder`, into `found`.
fn files_under(folder: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() {
            files_under(&path, found);
        } else {
            found.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: RunStatus, exit: Option<i32>) -> SweepRow {
        SweepRow {
            model: "resnet18".into(),
            target: "ort".into(),
            dtype: None,
            batch: None,
            status,
            exit,
            verdict: (status == RunStatus::Compared).then(|| "precision".to_string()),
            headline: Some("resnet18: float32 rounding only".into()),
            defects: 0,
            folder: Some("runs/resnet18-ort".into()),
            report: Some("runs/resnet18-ort/report.html".into()),
            json: Some("runs/resnet18-ort/report.json".into()),
            error: None,
            retried: None,
            command: "layerdiff torch resnet18 --target ort".into(),
        }
    }

    #[test]
    fn a_sweep_fails_on_a_failing_run_or_a_dead_one_and_cannot_run_without_any() {
        let clean = SweepIndex::new(vec![row(RunStatus::Compared, Some(0))]);
        assert_eq!(clean.exit_code(), 0);
        let failing = SweepIndex::new(vec![
            row(RunStatus::Compared, Some(0)),
            row(RunStatus::Compared, Some(1)),
        ]);
        assert_eq!(failing.exit_code(), 1);
        let died = SweepIndex::new(vec![
            row(RunStatus::Compared, Some(0)),
            row(RunStatus::Failed, None),
        ]);
        assert_eq!(died.exit_code(), 1);
        let refused = SweepIndex::new(vec![
            row(RunStatus::Compared, Some(0)),
            row(RunStatus::CouldNotRun, Some(2)),
        ]);
        assert_eq!(refused.exit_code(), 1);
        let none = SweepIndex::new(vec![row(RunStatus::CouldNotRun, Some(2))]);
        assert_eq!(none.exit_code(), 2);
        assert!(to_text(&died).contains("1 failed (their process died twice)"));
    }

    #[test]
    fn the_index_reads_back_what_it_writes_and_links_each_run() {
        let index = SweepIndex::new(vec![row(RunStatus::Compared, Some(0))]);
        let json = layerdiff_core::render::to_json_value(&index);
        let back = SweepIndex::from_json(&json).unwrap();
        assert_eq!(layerdiff_core::render::to_json_value(&back), json);
        let page = to_html(&index);
        assert!(page.contains("<a href=\"runs/resnet18-ort/report.html\">page</a>"));
        assert!(to_markdown(&index).contains("[page](runs/resnet18-ort/report.html)"));
    }
}
