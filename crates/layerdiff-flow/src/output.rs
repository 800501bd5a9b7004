//! A finished run's outputs, the same from every verb and every entry point: one
//! [`Destinations`] says where each [`Format`] goes, every kind of report is [`Rendered`] in the
//! formats it offers, each file is written whole or not at all; then the inputs beside them, the
//! summary and the timings printed. Adding a format is a variant of [`Format`], its destination,
//! and its renderer in each kind of report that offers it.

use std::path::{Path, PathBuf};

pub use layerdiff_core::write_atomic;
use layerdiff_core::{FailOn, Invocation, Report, Tensor, Timing, render, write_safetensors};

use crate::timings::{OWN, Stopwatch, timings_text};
use crate::{Error, Result};

/// A form a report is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON, for programs and CI diffs.
    Json,
    /// Markdown.
    Markdown,
    /// One self-contained HTML page.
    Html,
    /// The error chart alone, as SVG.
    Svg,
    /// Each ONNX node's own error, as Model Explorer node data.
    NodeData,
    /// The summary printed to the terminal.
    Text,
}

impl Format {
    /// The formats written to files, in the order they are written.
    pub const FILES: [Format; 5] = [
        Format::Json,
        Format::Markdown,
        Format::Html,
        Format::Svg,
        Format::NodeData,
    ];

    /// Its name in words.
    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "JSON",
            Format::Markdown => "Markdown",
            Format::Html => "HTML",
            Format::Svg => "SVG",
            Format::NodeData => "Model Explorer node data",
            Format::Text => "text",
        }
    }
}

/// A kind of report (a comparison, the op matrix, the provider table, the audit, the check, an
/// axis): the report in each format it offers.
pub trait Rendered {
    /// The report in `format`; `None` when this kind of report has no such form.
    fn render(&self, format: Format) -> Option<String>;

    /// Whether the report is whole: not one a signal cut short, marked incomplete.
    fn whole(&self) -> bool {
        true
    }
}

impl Rendered for Report {
    fn whole(&self) -> bool {
        self.summary.incomplete.is_none()
    }

    fn render(&self, format: Format) -> Option<String> {
        Some(match format {
            Format::Json => render::to_json(self),
            Format::Markdown => render::to_markdown(self),
            Format::Html => render::to_html(self),
            Format::Svg => render::to_svg(self, false),
            Format::NodeData => render::to_node_data(self),
            Format::Text => render::to_text(self),
        })
    }
}

impl Rendered for layerdiff_core::AxisReport {
    fn render(&self, format: Format) -> Option<String> {
        table_forms(
            self,
            format,
            layerdiff_core::axis_markdown,
            layerdiff_core::axis_text,
        )
    }
}

/// A table's report (`providers`, `audit`, an axis) in its forms: JSON, Markdown and the
/// printed text; no page, chart or node data.
pub fn table_forms<T: serde::Serialize>(
    report: &T,
    format: Format,
    markdown: fn(&T) -> String,
    text: fn(&T) -> String,
) -> Option<String> {
    match format {
        Format::Json => Some(render::to_json_value(report)),
        Format::Markdown => Some(markdown(report)),
        Format::Text => Some(text(report)),
        Format::Html | Format::Svg | Format::NodeData => None,
    }
}

/// A table's report with a page too (`ops`'s matrix, `sweep`'s index) in its forms: JSON,
/// Markdown, one HTML page and the printed text; no chart or node data.
pub fn page_forms<T: serde::Serialize>(
    report: &T,
    format: Format,
    markdown: fn(&T) -> String,
    html: fn(&T) -> String,
    text: fn(&T) -> String,
) -> Option<String> {
    match format {
        Format::Html => Some(html(report)),
        _ => table_forms(report, format, markdown, text),
    }
}

/// Where a run's outputs go, and what is printed: the one destinations type of every verb.
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
    /// A folder for each part's whole report, where a verb makes several (`providers`: one
    /// per cell, `ort-cuda-opt-all.json`…).
    pub parts: Option<PathBuf>,
    /// Print nothing but errors.
    pub quiet: bool,
    /// Keep the phases in the JSON report and print them (stderr).
    pub timings: bool,
    /// When the run fails (exit code 1).
    pub fail_on: FailOn,
    /// The command line the outputs are made by (`None`: a run from the Python API), kept with
    /// the inputs so that `layerdiff reduce` can run it again, and named in a repro.
    pub invocation: Option<Invocation>,
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
        write_inputs(path, inputs, seed, to.invocation.as_ref(), None)?;
        crate::made::wrote(std::slice::from_ref(path), report.whole());
        written.push(path.clone());
    }
    clock.lap("rendering and writing reports", OWN);
    if !to.quiet {
        for note in notes {
            eprintln!("{note}");
        }
        print!("{}", render::to_text(&report));
        if let Some(why) = report.summary.failed_by(to.fail_on) {
            eprintln!("{why}");
        }
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

/// Writes a run's inputs as safetensors with what `layerdiff reduce` reads back: their `seed`,
/// the command line that made the run (`invocation`) and, for one point of an axis, its label
/// (`point`: `prefill`, `1`, a batch size).
pub fn write_inputs(
    path: &Path,
    inputs: &[(String, Tensor)],
    seed: Option<u64>,
    invocation: Option<&Invocation>,
    point: Option<&str>,
) -> Result<()> {
    let mut metadata =
        std::collections::BTreeMap::from([("producer".to_string(), "layerdiff".to_string())]);
    if let Some(seed) = seed {
        metadata.insert("seed".to_string(), seed.to_string());
    }
    if let Some(invocation) = invocation {
        let json = serde_json::to_string(invocation).expect("strings serialise");
        metadata.insert("invocation".to_string(), json);
    }
    if let Some(point) = point {
        metadata.insert("point".to_string(), point.to_string());
    }
    Ok(write_safetensors(path, inputs, metadata)?)
}

impl Destinations {
    /// Checks, before any work starts, that every file can be written where it is asked for:
    /// not a folder itself, under a folder that exists or can be made (its nearest existing
    /// ancestor a folder this process may write in), not one of the files the run `reads` (a
    /// model, its other file, its inputs; a folder's files), and not an existing file that
    /// layerdiff did not write. A mistake found only after the run would lose its result; one
    /// found by writing would lose the user's file.
    pub fn check(&self, reads: &[PathBuf]) -> Result<()> {
        self.each_its_own_file()?;
        let files = Format::FILES
            .into_iter()
            .filter_map(|f| self.path(f))
            .chain(&self.inputs);
        let folders = self.parts.iter();
        for (path, is_folder) in files.map(|p| (p, false)).chain(folders.map(|p| (p, true))) {
            let refused = writable(path, is_folder).and_then(|()| {
                if is_folder {
                    return Ok(());
                }
                crate::overwrite::kept(path, reads)
            });
            refused
                .map_err(|why| Error::Usage(format!("cannot write `{}`: {why}", path.display())))?;
        }
        Ok(())
    }

    /// Two outputs named to one file would leave only the last written: refused, naming both.
    fn each_its_own_file(&self) -> Result<()> {
        let named = (Format::FILES.into_iter())
            .filter_map(|f| Some((format!("{} report", f.name()), self.path(f)?)))
            .chain(self.inputs.iter().map(|p| ("inputs file".to_string(), p)));
        let mut seen: Vec<(String, PathBuf)> = Vec::new();
        for (what, path) in named {
            let key = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            if let Some((first, _)) = seen.iter().find(|(_, k)| *k == key) {
                return Err(Error::Usage(format!(
                    "cannot write `{}`: the {first} and the {what} both name it, and only the \
                     last written would be left: give each its own file",
                    path.display()
                )));
            }
            seen.push((what, key));
        }
        Ok(())
    }

    /// Where `format` goes, when it is written to a file.
    pub fn path(&self, format: Format) -> Option<&PathBuf> {
        match format {
            Format::Json => self.json.as_ref(),
            Format::Markdown => self.markdown.as_ref(),
            Format::Html => self.html.as_ref(),
            Format::Svg => self.svg.as_ref(),
            Format::NodeData => self.node_data.as_ref(),
            Format::Text => None,
        }
    }
}

/// Checks, before any work starts, that each folder a verb fills (`--repro`) can be made and
/// written in: found only after the run, the mistake would lose its result.
pub fn check_folders(folders: &[PathBuf]) -> Result<()> {
    for folder in folders {
        writable(folder, true)
            .map_err(|why| Error::Usage(format!("cannot write `{}`: {why}", folder.display())))?;
    }
    Ok(())
}

/// Why `path` (a file, or a folder where `is_folder`) cannot be written, if it cannot.
fn writable(path: &std::path::Path, is_folder: bool) -> std::result::Result<(), String> {
    if !is_folder && path.is_dir() {
        return Err("it is a folder".to_string());
    }
    let mut folder = if is_folder {
        path
    } else {
        path.parent().unwrap_or(std::path::Path::new(""))
    };
    // the nearest ancestor that exists: it must be a folder, and writable
    loop {
        let shown = if folder.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            folder
        };
        match std::fs::metadata(shown) {
            Ok(m) if !m.is_dir() => {
                return Err(format!("`{}` is a file, not a folder", shown.display()));
            }
            Ok(_) => {
                return tempfile::tempfile_in(shown)
                    .map(drop)
                    .map_err(|e| format!("no file can be made in `{}` ({e})", shown.display()));
            }
            Err(_) => match folder.parent() {
                Some(up) => folder = up,
                None => return Err(format!("`{}` does not exist", shown.display())),
            },
        }
    }
}

/// Writes the renderings `to` names, each whole or not at all; returns the paths written. A
/// format this kind of report does not offer is an error that names it, before any file is
/// written.
pub fn write_reports(report: &dyn Rendered, to: &Destinations) -> Result<Vec<PathBuf>> {
    crate::progress::done(); // the work is done: no heartbeat while the result is written
    let mut texts = Vec::new();
    for format in Format::FILES {
        let Some(path) = to.path(format) else {
            continue;
        };
        let text = report.render(format).ok_or_else(|| {
            Error::Usage(format!(
                "this report has no {} form (asked for `{}`)",
                format.name(),
                path.display()
            ))
        })?;
        texts.push((path, text));
    }
    let mut written = Vec::new();
    for (path, text) in texts {
        write_atomic(path, text.as_bytes()).map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path.clone());
    }
    crate::made::wrote(&written, report.whole());
    Ok(written)
}

/// Writes a report where `to` says and prints its summary unless `quiet`: how every verb but
/// the comparisons (which add inputs, notes and timings: [`deliver`]) ends.
pub fn publish(report: &dyn Rendered, to: &Destinations) -> Result<()> {
    write_reports(report, to)?;
    if !to.quiet
        && let Some(text) = report.render(Format::Text)
    {
        print!("{text}");
    }
    Ok(())
}

/// The process exit code for a finished comparison: 1 when it fails under `fail_on` (a
/// defect, an undecided layer, an inconclusive run or an overflow; with [`FailOn::Drift`] any
/// layer beyond its tolerance), else 0; 128 + the signal's number when one stopped the run
/// (its report, marked incomplete, holds what was compared before).
pub fn exit_code(report: &Report, fail_on: FailOn) -> u8 {
    crate::interrupt::exit_code().unwrap_or(u8::from(report.summary.fails(fail_on)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report that offers JSON only.
    struct JsonOnly;

    impl Rendered for JsonOnly {
        fn render(&self, format: Format) -> Option<String> {
            (format == Format::Json).then(|| "{}".to_string())
        }
    }

    #[test]
    fn a_format_the_report_lacks_is_an_error_naming_it_and_nothing_is_written() {
        let folder = tempfile::tempdir().unwrap();
        let to = Destinations {
            json: Some(folder.path().join("r.json")),
            html: Some(folder.path().join("r.html")),
            ..Destinations::default()
        };
        let err = write_reports(&JsonOnly, &to).unwrap_err().to_string();
        assert!(err.contains("no HTML form"), "{err}");
        assert!(err.contains("r.html"), "{err}");
        assert!(!folder.path().join("r.json").exists(), "nothing is written");
        let to = Destinations {
            json: Some(folder.path().join("r.json")),
            ..Destinations::default()
        };
        assert_eq!(
            write_reports(&JsonOnly, &to).unwrap(),
            vec![folder.path().join("r.json")]
        );
        assert!(!folder.path().join("r.html").exists());
    }
}
