//! A finished comparison as Python holds it: its data, its renderings, and the doors that write
//! it (`deliver`, as the Rust command does; `write`; one point's inputs of an axis).

use std::collections::HashMap;
use std::path::PathBuf;

use layerdiff_core::render;
use layerdiff_flow::output;
use layerdiff_flow::timings::Stopwatch;
use pyo3::prelude::*;

use crate::exceptions::{self, to_py_err};
use crate::options::Command;
use crate::tensors::FlatTensor;

/// A finished comparison. Drift is data: read `drift_origin`, render, or write it.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
pub(crate) struct Report(pub(crate) layerdiff_core::Report);

#[pymethods]
impl Report {
    /// The deterministic JSON report.
    fn to_json(&self) -> String {
        render::to_json(&self.0)
    }
    /// The Markdown report.
    fn to_markdown(&self) -> String {
        render::to_markdown(&self.0)
    }
    /// The HTML report: one self-contained page.
    fn to_html(&self) -> String {
        render::to_html(&self.0)
    }
    /// The error chart as a standalone SVG.
    fn to_svg(&self) -> String {
        render::to_svg(&self.0, false)
    }
    /// Each ONNX node's own error as Model Explorer node data (JSON).
    fn to_node_data(&self) -> String {
        render::to_node_data(&self.0)
    }
    /// The short text summary the CLI prints.
    fn summary_text(&self) -> String {
        render::to_text(&self.0)
    }
    /// The `--timings` breakdown of the report's phases.
    fn timings_text(&self) -> String {
        let phases = self.0.timings.clone().unwrap_or_default();
        layerdiff_flow::timings::timings_text(&phases)
    }
    /// Writes a command's outputs (reports, `inputs` with their `seed`) and prints `notes`,
    /// the summary and the files written, as the Rust command does; returns the exit code.
    fn deliver(
        &self,
        py: Python<'_>,
        command: &Command,
        inputs: Vec<FlatTensor<'_>>,
        seed: Option<u64>,
        notes: Vec<String>,
    ) -> PyResult<u8> {
        let inputs = inputs
            .iter()
            .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
            .collect::<PyResult<Vec<_>>>()?;
        let report = self.0.clone();
        let to = command.destinations();
        let done = py
            .detach(|| output::deliver(report, &to, &inputs, seed, &notes, Stopwatch::default()))
            .map_err(to_py_err)?;
        Ok(output::exit_code(&done, to.fail_on))
    }
    /// Writes the inputs of one point of an axis (`point`: `prefill`, `1`, a batch size) to
    /// `path` with the command line that made the run, beside that point's JSON report, so that
    /// `layerdiff reduce` cuts that point's repro.
    fn write_point_inputs(
        &self,
        py: Python<'_>,
        command: &Command,
        path: PathBuf,
        inputs: Vec<FlatTensor<'_>>,
        point: String,
    ) -> PyResult<()> {
        let inputs = inputs
            .iter()
            .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
            .collect::<PyResult<Vec<_>>>()?;
        let (seed, invocation) = (command.seed(), command.invocation_of());
        py.detach(|| {
            output::write_inputs(&path, &inputs, Some(seed), Some(invocation), Some(&point))
        })
        .map_err(to_py_err)
    }
    /// This report with `warnings` added to its summary's (what a reader must know before
    /// trusting the verdict).
    fn warned(&self, warnings: Vec<String>) -> Report {
        let mut report = self.0.clone();
        report.summary.warnings.extend(warnings);
        Report(report)
    }
    /// This report with its keep-in-float32 advice for a target computing in `precision`
    /// (`float16`, `bfloat16`, `int8`), replacing any advice it had.
    fn advised(&self, precision: &str) -> Report {
        let mut report = self.0.clone();
        report.keep_float32 = layerdiff_core::keep_float32(&report, precision);
        Report(report)
    }
    /// This report with its keep-in-float32 advice replaced by `layers` (`(layer, why)`, in
    /// order) for a target computing in `precision`: what a bisection found, not a guess.
    fn advised_layers(&self, precision: &str, layers: Vec<(String, String)>) -> Report {
        let mut report = self.0.clone();
        let nodes = |name: &str| {
            report
                .layers
                .iter()
                .find(|l| l.name == name)
                .and_then(|l| l.location.as_ref())
                .map(|o| o.nodes.clone())
                .unwrap_or_default()
        };
        let kept = layers
            .into_iter()
            .map(|(layer, why)| layerdiff_core::KeptLayer {
                nodes: nodes(&layer),
                layer,
                why,
            })
            .collect();
        report.keep_float32 = Some(layerdiff_core::KeepFloat32 {
            precision: precision.to_string(),
            layers: kept,
            check: None,
        });
        Report(report)
    }
    /// This report with its keep-in-float32 advice by module (`owners`: each layer's module,
    /// for layers that are gradients: the backward of a module is what can run in float32).
    fn advised_by_module(&self, owners: HashMap<String, String>) -> Report {
        let mut report = self.0.clone();
        if let Some(keep) = &report.keep_float32 {
            report.keep_float32 =
                Some(keep.by_module(&|layer| owners.get(layer).cloned(), &report.summary.defects));
        }
        Report(report)
    }
    /// The layers a lower-precision run checks in float32: `given` (the user's), else those
    /// this report (the plain run) advises (`layerdiff_core::layers_to_check`).
    fn layers_to_check(&self, given: Vec<String>) -> Vec<String> {
        layerdiff_core::layers_to_check(&self.0, &given)
    }
    /// The report of a checked lower-precision run, this report being the plain run and
    /// `with_kept` the run with `kept` in float32 (`given`: the user named them; see
    /// `layerdiff_core::advice_checked`).
    fn advice_checked(
        &self,
        with_kept: &Report,
        kept: Vec<String>,
        given: bool,
        precision: &str,
    ) -> Report {
        let checked = layerdiff_core::advice_checked;
        Report(checked(&self.0, &with_kept.0, kept, given, precision))
    }
    /// 1 when the run fails: a defect, an undecided layer, an inconclusive run or values that
    /// overflow the target's dtype (rounding alone is 0), as the command exits by default.
    #[getter]
    fn exit_code(&self) -> u8 {
        output::exit_code(&self.0, layerdiff_core::FailOn::Defect)
    }
    /// The layer a repro shows (the first defect's, else the first whose own error exceeds its
    /// tolerance; a module whose compiled form differs, where that is the first defect) as
    /// `(name, None)`, or `(None, why)` where there is none.
    #[getter]
    fn headline(&self) -> (Option<String>, Option<String>) {
        if let Some((module, _)) = self.0.compiled_headline() {
            return (Some(module.to_string()), None);
        }
        match self.0.headline() {
            Ok(layer) => (Some(layer.name.clone()), None),
            Err(why) => (None, Some(why)),
        }
    }
    /// How `--bisect` goes for a PyTorch `target` (its spelling) on this report, planned by the
    /// core (`layerdiff_flow::verbs::bisect::torch`). `kept`: layers are kept in float32
    /// already; `module_of`: each listed layer's module (None: a functional call).
    fn bisection_plan(
        &self,
        target: &str,
        kept: bool,
        module_of: Vec<(String, Option<String>)>,
    ) -> PyResult<BisectionPlan> {
        use layerdiff_flow::verbs::bisect::torch::TorchBisection;
        let spec = layerdiff_flow::spec::torch::TorchSpec::parse(target)
            .map_err(exceptions::UsageError::new_err)?;
        Ok(
            match TorchBisection::plan(&self.0, &spec, kept, &module_of) {
                TorchBisection::Nothing(note) => BisectionPlan::Nothing { note },
                TorchBisection::Stages {
                    layer,
                    backend,
                    stages,
                    inductor,
                } => BisectionPlan::Stages {
                    layer,
                    backend,
                    stages,
                    inductor,
                },
                TorchBisection::KeepFloat32 {
                    precision,
                    candidates,
                    defects,
                } => BisectionPlan::KeepFloat32 {
                    precision: precision.to_string(),
                    candidates,
                    defects,
                },
            },
        )
    }

    /// This report with the torch.compile stage search on `path` alone recorded: `responsible`
    /// first shows the difference, among `candidates`; `clean`: the stage before agrees.
    fn stages_bisected(
        &self,
        path: &str,
        candidates: usize,
        responsible: Vec<String>,
        clean: bool,
        runs: usize,
    ) -> Report {
        let mut report = self.0.clone();
        report.bisection = Some(layerdiff_flow::verbs::bisect::torch::stages_found(
            path,
            candidates,
            responsible,
            clean,
            runs,
        ));
        Report(report)
    }
    /// This report with the keep-in-float32 search recorded (`plan`: precision, candidates,
    /// defects left out; `found`, whether keeping `everything` made the output clean, `runs`,
    /// and the checking comparison's layers compared and exceeding), and what it says beside
    /// (`failed`: why sets could not run).
    #[allow(clippy::too_many_arguments)]
    fn kept_bisected(
        &self,
        plan: (String, usize, usize),
        found: Vec<String>,
        everything: bool,
        runs: usize,
        compared: usize,
        exceeding_after: usize,
        failed: Vec<String>,
    ) -> (Report, Vec<String>) {
        use layerdiff_flow::verbs::bisect::torch::{kept_found, kept_notes};
        let (precision, candidates, defects) = plan;
        let notes = kept_notes(&precision, candidates, found.len(), runs - 1, &failed);
        let check = layerdiff_core::BisectionCheck {
            compared,
            exceeding_before: self.0.summary.layers_exceeding,
            exceeding_after,
        };
        let mut report = self.0.clone();
        report.bisection = Some(kept_found(
            (&precision, candidates, defects),
            found,
            everything,
            runs,
            check,
        ));
        (Report(report), notes)
    }
    /// The layer where drift is born, or None.
    #[getter]
    fn drift_origin(&self) -> Option<String> {
        self.0.summary.drift_origin.clone()
    }
    /// Writes the JSON, Markdown, HTML report, the chart as SVG and the Model Explorer node
    /// data, those given (each file whole or not at all).
    #[pyo3(signature = (json=None, markdown=None, html=None, svg=None, node_data=None))]
    fn write(
        &self,
        json: Option<PathBuf>,
        markdown: Option<PathBuf>,
        html: Option<PathBuf>,
        svg: Option<PathBuf>,
        node_data: Option<PathBuf>,
    ) -> PyResult<Vec<PathBuf>> {
        let to = output::Destinations {
            json,
            markdown,
            html,
            svg,
            node_data,
            ..Default::default()
        };
        // as the command does: never over a file layerdiff did not write, nor two to one file
        to.check(&[]).map_err(to_py_err)?;
        output::write_reports(&self.0, &to).map_err(to_py_err)
    }
}

/// What `--bisect` searches for a PyTorch target, as the core plans it
/// (`layerdiff_flow::verbs::bisect::torch::TorchBisection`): one class per kind of search, its
/// fields typed.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
pub(crate) enum BisectionPlan {
    /// No search: `note` says why.
    Nothing { note: String },
    /// torch.compile's stages on the headline `layer`'s module alone: `stages` in order (the
    /// target's `backend` last), or PyTorch's own compiler bisector where `inductor`.
    Stages {
        layer: String,
        backend: String,
        stages: Vec<String>,
        inductor: bool,
    },
    /// The smallest set of `candidates` to keep in float32 for a target in `precision`;
    /// `defects`: layers left out for their defect.
    KeepFloat32 {
        precision: String,
        candidates: Vec<String>,
        defects: usize,
    },
}
