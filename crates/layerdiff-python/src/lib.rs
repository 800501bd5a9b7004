//! Python binding: extract arguments, run the core with the GIL released, convert the result.
//! No metric, surgery or report logic lives here.

mod exceptions;
mod tensors;

use std::path::PathBuf;

use layerdiff_cli::captured::{
    CapturedComparison, CapturedLayer, compare_captured as run_captured,
};
use layerdiff_cli::cli::{self, Parsed};
use layerdiff_cli::output;
use layerdiff_core::{SideInfo, Timing, Tolerance, render};
use layerdiff_onnx::LayerCall;
use layerdiff_runtime::RuntimeSpec;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::exceptions::to_py_err;
use crate::tensors::FlatTensor;

/// A finished comparison. Drift is data: read `drift_origin`, render, or write it.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
struct Report(layerdiff_core::Report);

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
    /// The short text summary the CLI prints.
    fn summary_text(&self) -> String {
        output::summary_text(&self.0)
    }
    /// The `--timings` breakdown: the report's phases, then `after` (phase, by, seconds).
    fn timings_text(&self, after: Vec<(String, String, f64)>) -> String {
        let mut phases = self.0.timings.clone().unwrap_or_default();
        phases.extend(after.iter().map(|(p, b, s)| Timing::new(p, b, *s)));
        layerdiff_cli::timings::timings_text(&phases)
    }
    /// 0 when no layer exceeds the tolerance, 1 when drift was found.
    #[getter]
    fn exit_code(&self) -> u8 {
        output::exit_code(&self.0)
    }
    /// The layer where drift is born, or None.
    #[getter]
    fn drift_origin(&self) -> Option<String> {
        self.0.summary.drift_origin.clone()
    }
    /// Writes the JSON and/or Markdown report (each file whole or not at all).
    #[pyo3(signature = (json=None, markdown=None))]
    fn write(&self, json: Option<PathBuf>, markdown: Option<PathBuf>) -> PyResult<Vec<PathBuf>> {
        output::write_reports(&self.0, json.as_deref(), markdown.as_deref())
            .map_err(|e| exceptions::OutputError::new_err(format!("cannot write the report: {e}")))
    }
}

/// Parses a command line with the same parser as the Rust binary.
/// Returns `("torch", options)`, or `("exit", code)` when parsing (or an ONNX verb, run here)
/// already did the work.
#[pyfunction]
fn parse_cli(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> PyResult<(String, Py<PyAny>)> {
    let exit = |code: u8| -> PyResult<(String, Py<PyAny>)> {
        Ok((
            "exit".to_string(),
            code.into_pyobject(py)?.into_any().unbind(),
        ))
    };
    match cli::parse(argv) {
        Parsed::Exit(code) => exit(code),
        // The ONNX verbs run wholly in Rust, with the GIL released.
        Parsed::Onnx(args) => exit(py.detach(|| cli::run_onnx(&args))),
        Parsed::Torch(a) => {
            let d = PyDict::new(py);
            d.set_item("model", a.model)?;
            d.set_item("tolerance", a.tolerance.to_string())?;
            d.set_item("local", !a.no_local)?;
            d.set_item("float64", !a.no_float64)?;
            d.set_item("seed", a.seed)?;
            d.set_item("exporter", format!("{:?}", a.exporter).to_lowercase())?;
            d.set_item("onnx", a.onnx)?;
            d.set_item("target", a.target.spelling())?;
            d.set_item("out", a.report.out.clone())?;
            d.set_item("json", a.report.json_path())?;
            d.set_item("markdown", a.report.markdown_path())?;
            d.set_item("inputs_path", a.report.inputs_path())?;
            d.set_item("quiet", a.report.quiet)?;
            d.set_item("timings", a.report.timings)?;
            Ok(("torch".to_string(), d.into_any().unbind()))
        }
    }
}

/// Compares captured reference layers against an ONNX model run by ONNX Runtime.
///
/// `inputs`: list of `(name, dtype, shape, uint8 buffer)`. `layers`: list of dicts with `name`,
/// `module`, `module_type`, `call_index`, `identity`, `input_from`, and `tensor` (a flat tensor tuple).
#[pyfunction]
#[pyo3(signature = (*, command, model, onnx_path, inputs, layers, tolerance, seed, reference_runtime, reference_detail, target="ort", ort_library=None, local=true, timings=None))]
#[allow(clippy::too_many_arguments)]
fn compare_captured(
    py: Python<'_>,
    command: String,
    model: String,
    onnx_path: PathBuf,
    inputs: Vec<FlatTensor<'_>>,
    layers: &Bound<'_, PyList>,
    tolerance: &str,
    seed: Option<u64>,
    reference_runtime: String,
    reference_detail: String,
    target: &str,
    ort_library: Option<PathBuf>,
    local: bool,
    timings: Option<Vec<(String, String, f64)>>,
) -> PyResult<Report> {
    let target = RuntimeSpec::parse(target).map_err(exceptions::UsageError::new_err)?;
    let tolerance = Tolerance::parse(tolerance).map_err(exceptions::UsageError::new_err)?;
    let inputs = inputs
        .iter()
        .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
        .collect::<PyResult<Vec<_>>>()?;
    type Entry<'py> = (
        LayerCall,
        String,
        FlatTensor<'py>,
        Option<FlatTensor<'py>>,
        Vec<FlatTensor<'py>>,
    );
    let mut flat: Vec<Entry<'_>> = Vec::with_capacity(layers.len());
    for item in layers.iter() {
        let d = item.cast::<PyDict>()?;
        let get = |k: &str| {
            d.get_item(k)?.ok_or_else(|| {
                exceptions::UsageError::new_err(format!("layer entry without `{k}`"))
            })
        };
        let call = LayerCall {
            name: get("name")?.extract()?,
            module: get("module")?.extract()?,
            call_index: get("call_index")?.extract()?,
            identity: get("identity")?.extract()?,
            input_from: get("input_from")?.extract()?,
        };
        flat.push((
            call,
            get("module_type")?.extract()?,
            get("tensor")?.extract()?,
            d.get_item("float64")?
                .map(|v| v.extract())
                .transpose()?
                .flatten(),
            d.get_item("parameters")?
                .map(|v| v.extract())
                .transpose()?
                .unwrap_or_default(),
        ));
    }
    let captured: Vec<CapturedLayer<'_>> = flat
        .iter()
        .map(|(call, module_type, t, float64, parameters)| {
            Ok(CapturedLayer {
                call: call.clone(),
                module_type: module_type.clone(),
                value: t.view()?,
                float64: float64.as_ref().map(FlatTensor::view).transpose()?,
                parameters: parameters
                    .iter()
                    .map(|p| Ok((p.name().to_string(), p.view()?)))
                    .collect::<PyResult<_>>()?,
            })
        })
        .collect::<PyResult<_>>()?;
    let request = CapturedComparison {
        command,
        model,
        onnx_path,
        inputs,
        seed,
        layers: captured,
        tolerance,
        local,
        reference: SideInfo {
            runtime: reference_runtime,
            detail: reference_detail,
        },
        target,
        ort_library,
    };
    let keep = timings.is_some();
    let before = timings
        .unwrap_or_default()
        .iter()
        .map(|(p, b, s)| Timing::new(p, b, *s))
        .collect();
    let mut clock = layerdiff_cli::timings::Stopwatch::start(before);
    let mut report = py
        .detach(|| run_captured(&request, &mut clock))
        .map_err(to_py_err)?;
    if !keep {
        report.timings = None;
    }
    Ok(Report(report))
}

/// Compares two flat tensors and returns the statistics as deterministic JSON.
#[pyfunction]
fn compare_tensors_json(
    py: Python<'_>,
    reference: FlatTensor<'_>,
    target: FlatTensor<'_>,
) -> PyResult<String> {
    let (r, t) = (reference.view()?, target.view()?);
    let stats = py
        .detach(|| layerdiff_core::compare(r, t))
        .map_err(to_py_err)?;
    Ok(render::to_json_value(&stats))
}

/// Saves flat tensors as safetensors with string metadata (written whole or not at all).
#[pyfunction]
fn save_tensors(
    path: PathBuf,
    tensors: Vec<FlatTensor<'_>>,
    metadata: std::collections::BTreeMap<String, String>,
) -> PyResult<()> {
    let owned = tensors
        .iter()
        .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
        .collect::<PyResult<Vec<_>>>()?;
    layerdiff_core::write_safetensors(&path, &owned, metadata).map_err(to_py_err)
}

/// `(name, dtype name, dims)` of a declared model input.
type DeclaredInput = (String, Option<String>, Option<Vec<Py<PyAny>>>);

/// The runtime inputs a model declares: `(name, dtype name or None, dims)`, dims as ints or
/// symbolic names (None when anonymous).
#[pyfunction]
fn model_inputs(py: Python<'_>, path: PathBuf) -> PyResult<Vec<DeclaredInput>> {
    let model = layerdiff_onnx::Model::load(&path).map_err(to_py_err)?;
    let index = layerdiff_onnx::GraphIndex::new(model.graph());
    index
        .graph_inputs()
        .iter()
        .map(|name| {
            let declared = index.value_type(name);
            let dtype = declared
                .and_then(|t| layerdiff_core::DType::from_onnx_code(t.elem_type).ok())
                .map(|d| d.name().to_string());
            let dims = match declared.and_then(|t| t.dims.as_ref()) {
                None => None,
                Some(dims) => Some(
                    dims.iter()
                        .map(|d| match d {
                            layerdiff_onnx::Dimension::Fixed(v) => {
                                Ok(v.into_pyobject(py)?.into_any().unbind())
                            }
                            layerdiff_onnx::Dimension::Symbolic(p) => {
                                Ok(p.clone().into_pyobject(py)?.into_any().unbind())
                            }
                        })
                        .collect::<PyResult<Vec<_>>>()?,
                ),
            };
            Ok((name.clone(), dtype, dims))
        })
        .collect()
}

#[pymodule]
fn _layerdiff(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Report>()?;
    m.add_function(wrap_pyfunction!(parse_cli, m)?)?;
    m.add_function(wrap_pyfunction!(compare_captured, m)?)?;
    m.add_function(wrap_pyfunction!(compare_tensors_json, m)?)?;
    m.add_function(wrap_pyfunction!(save_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(model_inputs, m)?)?;
    exceptions::register(m)?;
    Ok(())
}
