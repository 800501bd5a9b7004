//! A finished run's outputs, the same from every entry point: the reports (each file written
//! whole or not at all), the inputs beside them, the summary and the timings printed.

use std::path::{Path, PathBuf};

use layerdiff_core::{FailOn, Report, Tensor, Timing, render, write_safetensors};

use crate::timings::{OWN, Stopwatch, timings_text};
use crate::{Error, Result};

/// Where a run's outputs go, and what is printed.
#[derive(Debug, Clone, Default)]
pub struct Destinations {
    /// The JSON report.
    pub json: Option<PathBuf>,
    /// The Markdown report.
    pub markdown: Option<PathBuf>,
    /// The HTML report (one self-contained page).
    pub html: Option<PathBuf>,
    /// The error chart, as SVG.
    pub svg: Option<PathBuf>,
    /// Each ONNX node's own error, as Model Explorer node data.
    pub node_data: Option<PathBuf>,
    /// The inputs, as safetensors (with their seed).
    pub inputs: Option<PathBuf>,
    /// Print nothing but errors.
    pub quiet: bool,
    /// Keep the phases in the JSON report and print them (stderr).
    pub timings: bool,
    /// When the run fails (exit code 1).
    pub fail_on: FailOn,
}

/// Writes the reports and the inputs, prints `notes` (stderr), the summary (stdout) and the
/// files written, then, with `timings`, where the time went (`clock` times the writing).
pub fn deliver(
    mut report: Report,
    to: &Destinations,
    inputs: &[(String, Tensor)],
    seed: Option<u64>,
    notes: &[String],
    mut clock: Stopwatch,
) -> Result<Report> {
    if !to.timings {
        report.timings = None;
    }
    let mut written = write_reports(&report, to)?;
    if let Some(path) = &to.inputs {
        let mut metadata =
            std::collections::BTreeMap::from([("producer".to_string(), "layerdiff".to_string())]);
        if let Some(seed) = seed {
            metadata.insert("seed".to_string(), seed.to_string());
        }
        write_safetensors(path, inputs, metadata)?;
        written.push(path.clone());
    }
    clock.lap("rendering and writing reports", OWN);
    if !to.quiet {
        for note in notes {
            eprintln!("{note}");
        }
        print!("{}", render::to_text(&report));
        for path in written {
            eprintln!("wrote {}", path.display());
        }
    }
    if to.timings {
        let mut phases: Vec<Timing> = report.timings.clone().unwrap_or_default();
        phases.extend(clock.phases());
        eprint!("{}", timings_text(&phases));
    }
    Ok(report)
}

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

/// Writes each `(path, text)` whose path is given, atomically.
pub fn write_texts(texts: &[(&Option<PathBuf>, String)]) -> Result<()> {
    for (path, text) in texts {
        if let Some(path) = path {
            write_atomic(path, text.as_bytes()).map_err(|source| Error::Write {
                path: path.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Writes the renderings `to` names (JSON, Markdown, HTML, the chart as SVG, Model Explorer node
/// data), each whole or not at all; returns the paths written.
pub fn write_reports(report: &Report, to: &Destinations) -> Result<Vec<PathBuf>> {
    type Render = fn(&Report) -> String;
    let renderings: [(&Option<PathBuf>, Render); 5] = [
        (&to.json, render::to_json),
        (&to.markdown, render::to_markdown),
        (&to.html, render::to_html),
        (&to.svg, |r| render::to_svg(r, false)),
        (&to.node_data, render::to_node_data),
    ];
    let mut written = Vec::new();
    for (path, render) in renderings {
        if let Some(path) = path {
            write_atomic(path, render(report).as_bytes()).map_err(|source| Error::Write {
                path: path.clone(),
                source,
            })?;
            written.push(path.clone());
        }
    }
    Ok(written)
}

/// The process exit code for a finished comparison: 1 when it fails under `fail_on` (a
/// defect, an undecided layer, an inconclusive run or an overflow; with [`FailOn::Drift`] any
/// layer beyond its tolerance), else 0.
pub fn exit_code(report: &Report, fail_on: FailOn) -> u8 {
    u8::from(report.summary.fails(fail_on))
}
