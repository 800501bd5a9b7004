//! Repros of a framework's headline: an ONNX target's nodes fed the framework's values
//! (written wholly in Rust), and a PyTorch module alone, whose tensors and structure the adapter
//! saves and whose script, README and verdict are Rust's
//! (`layerdiff_flow::verbs::reduce::ModuleRepro`).

use std::path::PathBuf;

use layerdiff_flow::verbs::reduce;
use pyo3::prelude::*;

use crate::Report;
use crate::exceptions::{self, to_py_err};
use crate::tensors::FlatTensor;

/// Writes the repro of `report`'s layer `layer` against an ONNX target (`layerdiff torch`
/// against the export): its ONNX `nodes` of `model_path` fed `feeds` (the framework's values,
/// by ONNX value name), held to `expected`, run on `target`; returns the repro in a sentence and
/// whether it shows the difference.
#[pyfunction]
#[pyo3(signature = (report, layer, model_path, nodes, feeds, expected, target, command, folder))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_framework_repro(
    py: Python<'_>,
    report: &Report,
    layer: &str,
    model_path: PathBuf,
    nodes: Vec<String>,
    feeds: Vec<FlatTensor<'_>>,
    expected: FlatTensor<'_>,
    target: &str,
    command: &str,
    folder: PathBuf,
) -> PyResult<(String, bool)> {
    let feeds = feeds
        .iter()
        .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
        .collect::<PyResult<Vec<_>>>()?;
    let expected = expected.to_tensor()?;
    let target =
        layerdiff_runtime::RuntimeSpec::parse(target).map_err(exceptions::UsageError::new_err)?;
    let repro = py
        .detach(|| {
            layerdiff_flow::verbs::reduce::framework_piece(
                &report.0,
                layer,
                &model_path,
                &nodes,
                feeds,
                expected,
                &target,
                command,
                &folder,
            )
        })
        .map_err(to_py_err)?;
    Ok((repro.sentence(), repro.found()))
}

/// A PyTorch module's repro: what the adapter found (the module, its class and how to import
/// it, its arguments as Python source, the sides), and the files and verdict Rust writes.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
pub(crate) struct ModuleRepro(reduce::ModuleRepro);

/// A side as the adapter gives it: (spelling, words, device, precision, compile backend).
type Side = (String, String, String, String, Option<String>);

fn side((spelling, words, device, precision, compile): Side) -> reduce::ModuleSide {
    reduce::ModuleSide {
        spelling,
        words,
        device,
        precision,
        compile,
    }
}

#[pymethods]
impl ModuleRepro {
    #[new]
    #[pyo3(signature = (*, layer, path, where_, class_module, class_name, imports, code_dir, args, kwargs, gradient, reference, target, command))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        layer: String,
        path: String,
        where_: String,
        class_module: String,
        class_name: String,
        imports: String,
        code_dir: Option<String>,
        args: String,
        kwargs: String,
        gradient: Option<(String, f64)>,
        reference: Side,
        target: Side,
        command: String,
    ) -> Self {
        Self(reduce::ModuleRepro {
            layer,
            path,
            where_,
            class_module,
            class_name,
            imports,
            code_dir,
            args,
            kwargs,
            gradient,
            reference: side(reference),
            target: side(target),
            command,
        })
    }

    /// Writes repro.py into `folder`, judged by the tolerance `report` judged the layer by.
    fn write_script(&self, report: &Report, folder: PathBuf) -> PyResult<()> {
        self.0.write_script(&report.0, &folder).map_err(to_py_err)
    }

    /// Writes README.md into `folder`, with what repro.py's run printed.
    fn write_readme(
        &self,
        report: &Report,
        stdout: &str,
        stderr: &str,
        folder: PathBuf,
    ) -> PyResult<()> {
        let shown = reduce::Shown { stdout, stderr };
        self.0
            .write_readme(&report.0, shown, &folder)
            .map_err(to_py_err)
    }

    /// What the repro in `folder` shows, in a sentence, and whether it reproduces the
    /// difference (only repro.py's own last line is believed).
    fn verdict(&self, stdout: &str, stderr: &str, folder: PathBuf) -> (String, bool) {
        self.0.verdict(reduce::Shown { stdout, stderr }, &folder)
    }
}
