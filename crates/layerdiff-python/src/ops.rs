//! `layerdiff ops` across the boundary: its parsed options, a single-op ONNX run, and the
//! matrix (`op_matrix`) delivered (written and printed) by the engine's renderers.

use std::path::PathBuf;

use layerdiff_args::OpsArgs;
use layerdiff_core::render;
use layerdiff_flow::output::{Destinations, write_reports};
use layerdiff_flow::verbs::ops::OpsReport;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::exceptions::to_py_err;
use crate::op_matrix::OpsRun;
use crate::tensors::FlatTensor;

/// `layerdiff ops` as parsed from a command line.
#[pyclass(module = "layerdiff._layerdiff", frozen, get_all)]
pub(crate) struct OpsCommand {
    /// Case names or patterns (empty: all).
    ops: Vec<String>,
    /// Backends (empty: this machine's defaults).
    backends: Vec<String>,
    /// `float32`, `float16`, `bfloat16`.
    dtypes: Vec<String>,
    /// Opset of the single-op models.
    opset: i64,
    /// `dynamo` or `legacy`.
    exporter: String,
    /// Seed of the inputs.
    seed: u64,
    /// Cells at once (`None`: the logical cores).
    jobs: Option<usize>,
    /// `local` or `ray`.
    executor: String,
    /// Only name the cases and backends.
    list: bool,
    /// Print nothing but errors.
    quiet: bool,
    /// Where the JSON, Markdown and HTML go.
    json: Option<PathBuf>,
    markdown: Option<PathBuf>,
    html: Option<PathBuf>,
}

impl OpsCommand {
    pub(crate) fn new(a: OpsArgs) -> Self {
        let to = a.destinations();
        Self {
            ops: a.ops,
            backends: a.backends,
            dtypes: a.dtypes,
            opset: a.opset,
            exporter: layerdiff_args::spelling(&a.exporter),
            seed: a.seed,
            jobs: a.jobs,
            executor: layerdiff_args::spelling(&a.executor),
            list: a.list,
            quiet: to.quiet,
            json: to.json,
            markdown: to.markdown,
            html: to.html,
        }
    }
}

/// A tensor handed back to Python: `(name, dtype, shape, bytes)`.
type Returned<'py> = (String, String, Vec<usize>, Bound<'py, PyBytes>);

/// Runs a single-op ONNX model (its bytes) on `runtime` and returns its outputs as
/// `(name, dtype, shape, bytes)`.
#[pyfunction]
#[pyo3(signature = (model, runtime, inputs))]
pub(crate) fn run_model<'py>(
    py: Python<'py>,
    model: &[u8],
    runtime: &str,
    inputs: Vec<FlatTensor<'py>>,
) -> PyResult<Vec<Returned<'py>>> {
    let inputs = inputs
        .iter()
        .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
        .collect::<PyResult<Vec<_>>>()?;
    let outputs = py
        .detach(|| layerdiff_flow::verbs::ops::run_model(model, runtime, &inputs))
        .map_err(to_py_err)?;
    Ok(outputs
        .into_iter()
        .map(|(name, t)| {
            let bytes = PyBytes::new(py, &t.bytes);
            (name, t.dtype.name().to_string(), t.shape, bytes)
        })
        .collect())
}

/// Writes and prints the matrix of a run; returns the exit code.
#[pyfunction]
pub(crate) fn deliver_ops(py: Python<'_>, command: &OpsCommand, run: &OpsRun) -> PyResult<u8> {
    let to = Destinations {
        json: command.json.clone(),
        markdown: command.markdown.clone(),
        html: command.html.clone(),
        quiet: command.quiet,
        ..Destinations::default()
    };
    let run = run.0.clone();
    py.detach(|| layerdiff_flow::verbs::ops::deliver(run, &to))
        .map_err(to_py_err)
}

/// What an ONNX backend (`ort:opt=all`, `tract`) is here, in words; an error saying why it
/// cannot run here.
#[pyfunction]
#[pyo3(signature = (runtime))]
pub(crate) fn describe_runtime(py: Python<'_>, runtime: &str) -> PyResult<String> {
    py.detach(|| layerdiff_flow::verbs::ops::describe_runtime(runtime))
        .map_err(to_py_err)
}

/// The report of a run as JSON, written to the paths given.
#[pyfunction]
#[pyo3(signature = (run, json=None, markdown=None, html=None))]
pub(crate) fn ops_report(
    py: Python<'_>,
    run: &OpsRun,
    json: Option<PathBuf>,
    markdown: Option<PathBuf>,
    html: Option<PathBuf>,
) -> PyResult<String> {
    let to = Destinations {
        json,
        markdown,
        html,
        quiet: true,
        ..Destinations::default()
    };
    let run = run.0.clone();
    let report = py
        .detach(|| {
            let report = OpsReport::new(run);
            write_reports(&report, &to)?;
            Ok::<_, layerdiff_flow::Error>(report)
        })
        .map_err(to_py_err)?;
    Ok(render::to_json_value(&report))
}

/// The ONNX runtimes' default op-matrix backends that start here (`ort`, `ort:opt=all`, a
/// device's provider, `tract`, `openvino`), as each runtime's module lists them.
#[pyfunction]
pub(crate) fn op_backends(py: Python<'_>) -> Vec<String> {
    py.detach(layerdiff_runtime::op_backends)
}
