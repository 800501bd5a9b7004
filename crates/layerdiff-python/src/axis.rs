//! A model along an axis (batch sizes, input shapes) across the boundary: the points' reports
//! made into one axis report, rendered and written by the core.

use std::path::PathBuf;

use layerdiff_core::render::to_json_value;
use layerdiff_core::{AxisReport, along_axis, axis_markdown, axis_text};
use layerdiff_flow::output::{Destinations, write_reports};
use pyo3::prelude::*;

use crate::Report;
use crate::exceptions::{self, to_py_err};
use crate::options::Command;

/// The comparisons of one model at several points of an axis.
#[pyclass(module = "layerdiff._layerdiff", frozen, name = "AxisReport")]
pub(crate) struct PyAxisReport(AxisReport);

#[pymethods]
impl PyAxisReport {
    /// `axis` (`batch size`), the points' labels and their reports, in the same order.
    #[new]
    fn new(axis: &str, points: Vec<String>, reports: Vec<PyRef<'_, Report>>) -> PyResult<Self> {
        if points.is_empty() || points.len() != reports.len() {
            return Err(exceptions::UsageError::new_err(
                "an axis needs one report per point, and at least one point",
            ));
        }
        let reports: Vec<layerdiff_core::Report> = reports.iter().map(|r| r.0.clone()).collect();
        Ok(Self(along_axis(axis, &points, &reports)))
    }
    /// The deterministic JSON.
    fn to_json(&self) -> String {
        to_json_value(&self.0)
    }
    /// The Markdown report.
    fn to_markdown(&self) -> String {
        axis_markdown(&self.0)
    }
    /// The short summary the command prints.
    fn summary_text(&self) -> String {
        axis_text(&self.0)
    }
    /// `print(axis)` reads as the command prints it.
    fn __str__(&self) -> String {
        axis_text(&self.0)
    }
    /// What varies (`batch size`, `input shapes`).
    #[getter]
    fn axis(&self) -> String {
        self.0.axis.clone()
    }
    /// The whole report as a dict (parsed from its JSON).
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("json")?
            .call_method1("loads", (to_json_value(&self.0),))
    }
    /// 1 when a point fails (a defect, an undecided layer, an inconclusive run or an
    /// overflow; rounding alone passes), else 0.
    #[getter]
    fn exit_code(&self) -> u8 {
        self.0.exit_code(layerdiff_core::FailOn::Defect)
    }
    /// Writes the axis report where the command says (`--json`, `--markdown`, else `axis.json`
    /// and `axis.md` under `--out`), prints `notes`, the summary and what was written (with
    /// `points`: each point's folder and the files in it) as the command does, and returns the
    /// exit code.
    #[pyo3(signature = (command, notes, points=Vec::new()))]
    fn deliver(
        &self,
        command: &Command,
        notes: Vec<String>,
        points: Vec<(PathBuf, Vec<String>)>,
    ) -> PyResult<u8> {
        let r = &command.report;
        let under = |file: &str| r.out.as_ref().map(|d| d.join(file));
        let json = r.json.clone().or_else(|| under("axis.json"));
        let markdown = r.markdown.clone().or_else(|| under("axis.md"));
        self.write(json.clone(), markdown.clone())?;
        if !r.quiet {
            for note in notes {
                eprintln!("{note}");
            }
            print!("{}", axis_text(&self.0));
            for path in [json, markdown].into_iter().flatten() {
                eprintln!("wrote {}", path.display());
            }
            if let Some((_, files)) = points.first() {
                let folders: Vec<String> = points
                    .iter()
                    .map(|(folder, _)| format!("{}/", folder.display()))
                    .collect();
                eprintln!(
                    "wrote each point's reports ({}) in {}",
                    files.join(", "),
                    folders.join(", ")
                );
            }
        }
        Ok(self.0.exit_code(r.fail_on))
    }
    /// Writes the JSON and/or Markdown (each whole or not at all).
    #[pyo3(signature = (json=None, markdown=None))]
    fn write(&self, json: Option<PathBuf>, markdown: Option<PathBuf>) -> PyResult<()> {
        let to = Destinations {
            json,
            markdown,
            ..Destinations::default()
        };
        write_reports(&self.0, &to).map(drop).map_err(to_py_err)
    }
}
