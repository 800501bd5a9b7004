//! Where reports go and what they hold: the options every comparing verb shares.

use super::{Args, Destinations, FailOn, PathBuf};
/// Report options shared by every verb.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Write report.json, report.md, report.html, report.svg (the error chart),
    /// report.node-data.json (Model Explorer) and report.inputs.safetensors into this folder
    /// (and, for `torch`, the exported model.onnx). A report given its own path (`--json
    /// PATH`…) is written there instead, the JSON's inputs beside it.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Write the JSON report here (the inputs are saved beside it as NAME.inputs.safetensors).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write the Markdown report here.
    #[arg(long, value_name = "PATH")]
    pub markdown: Option<PathBuf>,
    /// Write the HTML report here: one self-contained page (summary, error chart, sortable
    /// per-layer table, causes) that opens offline.
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,
    /// Write the error chart here, as SVG (each layer's error against its tolerance, log scale,
    /// the drift origin marked): for READMEs and issue trackers.
    #[arg(long, value_name = "PATH")]
    pub svg: Option<PathBuf>,
    /// Write each ONNX node's own error (its layer's error as a multiple of the tolerance) as
    /// Model Explorer node data, to colour the graph by where error is born
    /// (`onnxvis model.onnx --node_data_paths=PATH`).
    #[arg(long, value_name = "PATH")]
    pub node_data: Option<PathBuf>,
    /// Print nothing but errors; the exit code still tells the verdict.
    #[arg(long, short)]
    pub quiet: bool,
    /// When the run exits 1: `defect` (the default: a layer computes something its precision
    /// does not explain and that moves a layer or the output past a tolerance, or a file,
    /// weight or attribute differs, a layer exceeds and nothing tells rounding from a defect,
    /// part of the model could not be paired, or values overflow the target's dtype; rounding,
    /// and kernels that approximate within every tolerance, exit 0), `accumulation` (as
    /// `defect`, and a layer whose kernel accumulates in the narrow dtype:
    /// `narrow_accumulation`), `approximation` (as `accumulation`, and a kernel beyond what its
    /// precision explains within every tolerance: the strict reading a runtime's validation
    /// asks for) or `drift` (any layer beyond its tolerance, rounding included).
    #[arg(long, value_name = "WHEN", default_value = "defect", value_parser = FailOn::parse)]
    pub fail_on: FailOn,
    /// Print where the time went, phase by phase (stderr), and add it to the JSON report (times
    /// vary from run to run, so they are left out of the JSON otherwise).
    #[arg(long)]
    pub timings: bool,
}

impl ReportArgs {
    /// The JSON report's path: `--json`, else `--out`/report.json.
    pub fn json_path(&self) -> Option<PathBuf> {
        self.json
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.json")))
    }

    /// The Markdown report's path: `--markdown`, else `--out`/report.md.
    pub fn markdown_path(&self) -> Option<PathBuf> {
        self.markdown
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.md")))
    }

    /// The HTML report's path: `--html`, else `--out`/report.html.
    pub fn html_path(&self) -> Option<PathBuf> {
        self.html
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.html")))
    }

    /// The node data's path: `--node-data`, else `--out`/report.node-data.json.
    pub fn node_data_path(&self) -> Option<PathBuf> {
        self.node_data
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.node-data.json")))
    }

    /// The chart's path: `--svg`, else `--out`/report.svg.
    pub fn svg_path(&self) -> Option<PathBuf> {
        self.svg
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.svg")))
    }

    /// Where the inputs are saved: beside the JSON report, as `NAME.inputs.safetensors`.
    pub fn inputs_path(&self) -> Option<PathBuf> {
        let json = self.json_path()?;
        let stem = json
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Some(json.with_file_name(format!("{stem}.inputs.safetensors")))
    }
}

impl ReportArgs {
    /// Where the run's outputs go, and what is printed.
    pub fn destinations(&self) -> Destinations {
        Destinations {
            json: self.json_path(),
            markdown: self.markdown_path(),
            html: self.html_path(),
            svg: self.svg_path(),
            node_data: self.node_data_path(),
            inputs: self.inputs_path(),
            parts: None,
            quiet: self.quiet,
            timings: self.timings,
            fail_on: self.fail_on,
            invocation: None,
        }
    }
}
