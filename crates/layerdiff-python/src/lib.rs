//! Python binding: extract arguments, run the core with the GIL released, convert the result.
//! No metric, surgery or report logic lives here.

mod exceptions;
mod tensors;

use std::path::PathBuf;

use std::collections::HashMap;

use layerdiff_args::{Parsed, TorchArgs};
use layerdiff_core::{DType, Fingerprint, SideInfo, Timing, Tolerance, render};
use layerdiff_flow::captured::{self, CapturedComparison, ListedLayer, check_options};
use layerdiff_flow::output;
use layerdiff_flow::timings::Stopwatch;
use layerdiff_flow::{Settings, memory};
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
        command: &TorchCommand,
        inputs: Vec<FlatTensor<'_>>,
        seed: Option<u64>,
        notes: Vec<String>,
    ) -> PyResult<u8> {
        let inputs = inputs
            .iter()
            .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
            .collect::<PyResult<Vec<_>>>()?;
        let report = self.0.clone();
        let to = command.args.report.destinations();
        let done = py
            .detach(|| output::deliver(report, &to, &inputs, seed, &notes, Stopwatch::default()))
            .map_err(to_py_err)?;
        Ok(output::exit_code(&done))
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
        output::write_reports(&self.0, json.as_deref(), markdown.as_deref()).map_err(to_py_err)
    }
}

/// How a comparison is run, parsed once: tolerance, local error, memory budget, the runtime
/// that runs the ONNX file, and whether PyTorch's float64 run is the truth.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
#[derive(Clone)]
struct Options {
    settings: Settings,
    target: RuntimeSpec,
    float64: bool,
}

#[pymethods]
impl Options {
    /// Parses the options as the Python API takes them (`tolerance`: a number, `dtype` or
    /// `auto`; `max_memory`: bytes or a size such as `4G`; `target`: `ort`, `ort:opt=all`,
    /// `tract`…).
    #[new]
    #[pyo3(signature = (*, tolerance="dtype".to_string(), local=true, max_memory=None, target="ort", float64=true))]
    fn new(
        tolerance: String,
        local: bool,
        max_memory: Option<String>,
        target: &str,
        float64: bool,
    ) -> PyResult<Self> {
        let usage = |e: String| exceptions::UsageError::new_err(e);
        let settings = Settings {
            tolerance: Tolerance::parse(&tolerance).map_err(usage)?,
            local,
            max_memory: max_memory
                .as_deref()
                .map(memory::parse_memory)
                .transpose()
                .map_err(usage)?,
        };
        let target = RuntimeSpec::parse(target).map_err(usage)?;
        check_options(&settings, &target, float64).map_err(to_py_err)?;
        Ok(Self {
            settings,
            target,
            float64,
        })
    }

    /// Whether PyTorch's float64 run is the truth both sides are measured against.
    #[getter]
    fn float64(&self) -> bool {
        self.float64
    }
}

/// `layerdiff torch` as parsed from a command line.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
struct TorchCommand {
    args: TorchArgs,
    options: Options,
}

#[pymethods]
impl TorchCommand {
    /// The model: a built-in name or a builder spec.
    #[getter]
    fn model(&self) -> String {
        self.args.model.clone()
    }
    /// Seed of the model's weights and of generated inputs.
    #[getter]
    fn seed(&self) -> u64 {
        self.args.seed
    }
    /// `dynamo` or `legacy`.
    #[getter]
    fn exporter(&self) -> String {
        format!("{:?}", self.args.exporter).to_lowercase()
    }
    /// An ONNX file to compare against instead of exporting one.
    #[getter]
    fn onnx(&self) -> Option<PathBuf> {
        self.args.onnx.clone()
    }
    /// The folder the reports (and the exported model) go to.
    #[getter]
    fn out(&self) -> Option<PathBuf> {
        self.args.report.out.clone()
    }
    /// Print nothing but errors.
    #[getter]
    fn quiet(&self) -> bool {
        self.args.report.quiet
    }
    /// Measure and print where the time went.
    #[getter]
    fn timings(&self) -> bool {
        self.args.report.timings
    }
    /// How the comparison runs.
    #[getter]
    fn options(&self) -> Options {
        self.options.clone()
    }
}

/// Parses a command line with the same parser as the Rust binary.
/// Returns `("torch", options)`, or `("exit", code)` when parsing (or an ONNX verb, run here
/// with ONNX Runtime from `ort_library`, the one the running interpreter has) already did the
/// work.
#[pyfunction]
#[pyo3(signature = (argv, ort_library=None))]
fn parse_cli(
    py: Python<'_>,
    argv: Vec<std::ffi::OsString>,
    ort_library: Option<PathBuf>,
) -> PyResult<(String, Py<PyAny>)> {
    let exit = |code: u8| -> PyResult<(String, Py<PyAny>)> {
        Ok((
            "exit".to_string(),
            code.into_pyobject(py)?.into_any().unbind(),
        ))
    };
    match layerdiff_args::parse(argv) {
        Parsed::Exit(code) => exit(code),
        // The ONNX verbs run wholly in Rust, with the GIL released.
        Parsed::Onnx(a) => {
            let (options, to) = (a.options(), a.report.destinations());
            exit(
                py.detach(|| layerdiff_flow::onnx_flow::run(&options, &to, ort_library.as_deref())),
            )
        }
        Parsed::Torch(a) => {
            let settings = a.settings();
            if let Err(e) = check_options(&settings, &a.target, !a.no_float64) {
                eprintln!("error: {}", layerdiff_flow::error_chain(&e));
                return exit(2);
            }
            let options = Options {
                settings,
                target: a.target.clone(),
                float64: !a.no_float64,
            };
            let command = TorchCommand { args: a, options };
            Ok(("torch".to_string(), Py::new(py, command)?.into_any()))
        }
    }
}

/// A comparison of PyTorch's layers against an ONNX model, fed layer by layer from forward
/// hooks: `add` each layer's value as it is produced (segments of the ONNX run follow as soon
/// as their layers are in), then `conclude`, then `finish` with the parameters it asks for.
#[pyclass(module = "layerdiff._layerdiff")]
struct CapturedRun {
    run: Option<captured::CapturedRun>,
    keep_timings: bool,
}

#[pymethods]
impl CapturedRun {
    /// `inputs`: flat tensors. `layers`: dicts with `name`, `module`, `module_type`,
    /// `call_index`, `identity`, `input_from`, `shape` and `dtype` (and `op` for a functional
    /// call), in execution order.
    #[new]
    #[pyo3(signature = (*, command, model, onnx_path, inputs, layers, options, seed, reference_runtime, reference_detail, ort_library=None, timings=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        command: String,
        model: String,
        onnx_path: PathBuf,
        inputs: Vec<FlatTensor<'_>>,
        layers: &Bound<'_, PyList>,
        options: &Options,
        seed: Option<u64>,
        reference_runtime: String,
        reference_detail: String,
        ort_library: Option<PathBuf>,
        timings: Option<Vec<(String, String, f64)>>,
    ) -> PyResult<Self> {
        let inputs = inputs
            .iter()
            .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
            .collect::<PyResult<Vec<_>>>()?;
        let mut listed = Vec::with_capacity(layers.len());
        for item in layers.iter() {
            let d = item.cast::<PyDict>()?;
            let get = |k: &str| {
                d.get_item(k)?.ok_or_else(|| {
                    exceptions::UsageError::new_err(format!("layer entry without `{k}`"))
                })
            };
            let dtype: String = get("dtype")?.extract()?;
            listed.push(ListedLayer {
                call: LayerCall {
                    name: get("name")?.extract()?,
                    module: get("module")?.extract()?,
                    call_index: get("call_index")?.extract()?,
                    identity: get("identity")?.extract()?,
                    input_from: get("input_from")?.extract()?,
                    shape: get("shape")?.extract()?,
                    dtype: DType::from_name(&dtype).map_err(to_py_err)?,
                    fingerprint: get("fingerprint")?
                        .extract::<Option<(usize, Vec<f64>)>>()?
                        .map(|(count, samples)| Fingerprint { count, samples }),
                    op: match d.get_item("op")? {
                        Some(op) => op.extract()?,
                        None => None,
                    },
                },
                module_type: get("module_type")?.extract()?,
            });
        }
        let request = CapturedComparison {
            command,
            model,
            onnx_path,
            inputs,
            seed,
            layers: listed,
            settings: options.settings.clone(),
            float64: options.float64,
            reference: SideInfo::new(reference_runtime, reference_detail),
            target: options.target.clone(),
            ort_library,
        };
        let keep_timings = timings.is_some();
        let before = timings
            .unwrap_or_default()
            .iter()
            .map(|(p, b, s)| Timing::new(p, b, *s))
            .collect();
        let clock = Stopwatch::start(before);
        let run = py
            .detach(|| captured::CapturedRun::start(request, clock))
            .map_err(to_py_err)?;
        Ok(Self {
            run: Some(run),
            keep_timings,
        })
    }

    /// The line that says how the run was split to bound its memory, or None for one piece.
    #[getter]
    fn segments_text(&self) -> PyResult<Option<String>> {
        Ok(self.active()?.segmentation().text())
    }

    /// How many segments the ONNX run is split into.
    #[getter]
    fn segments(&self) -> PyResult<usize> {
        Ok(self.active()?.segmentation().segments)
    }

    /// Hands over layer `index`'s value (and its float64 value); runs the segments it completes.
    #[pyo3(signature = (index, value, float64=None))]
    fn add(
        &mut self,
        py: Python<'_>,
        index: usize,
        value: FlatTensor<'_>,
        float64: Option<FlatTensor<'_>>,
    ) -> PyResult<()> {
        let (value, float64) = (
            value.view()?,
            float64.as_ref().map(FlatTensor::view).transpose()?,
        );
        let run = self.active_mut()?;
        py.detach(|| run.add(index, value, float64))
            .map_err(to_py_err)
    }

    /// Runs what is left and decides the origin; returns the layers whose parameters `finish`
    /// needs.
    fn conclude(&mut self, py: Python<'_>) -> PyResult<Vec<usize>> {
        let run = self.active_mut()?;
        py.detach(|| run.conclude()).map_err(to_py_err)
    }

    /// The report; `parameters` maps a layer index to its flat parameter tensors.
    fn finish(
        &mut self,
        py: Python<'_>,
        parameters: HashMap<usize, Vec<FlatTensor<'_>>>,
    ) -> PyResult<Report> {
        let views = parameters
            .iter()
            .map(|(&i, list)| {
                let list = list
                    .iter()
                    .map(|p| Ok((p.name().to_string(), p.view()?)))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok((i, list))
            })
            .collect::<PyResult<HashMap<_, _>>>()?;
        let run = self.run.take().ok_or_else(finished)?;
        let mut report = py.detach(|| run.finish(&views)).map_err(to_py_err)?;
        if !self.keep_timings {
            report.timings = None;
        }
        Ok(Report(report))
    }
}

impl CapturedRun {
    fn active(&self) -> PyResult<&captured::CapturedRun> {
        self.run.as_ref().ok_or_else(finished)
    }
    fn active_mut(&mut self) -> PyResult<&mut captured::CapturedRun> {
        self.run.as_mut().ok_or_else(finished)
    }
}

fn finished() -> PyErr {
    exceptions::UsageError::new_err("this comparison has already finished")
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

/// A flat tensor's fingerprint, `(element count, samples)`: what pairs a layer with an ONNX
/// value by value where the file names no module scope.
#[pyfunction]
fn fingerprint(tensor: FlatTensor<'_>) -> PyResult<(usize, Vec<f64>)> {
    let print = Fingerprint::of(tensor.view()?);
    Ok((print.count, print.samples))
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
    m.add_class::<CapturedRun>()?;
    m.add_class::<Options>()?;
    m.add_class::<TorchCommand>()?;
    m.add_function(wrap_pyfunction!(compare_tensors_json, m)?)?;
    m.add_function(wrap_pyfunction!(save_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(model_inputs, m)?)?;
    exceptions::register(m)?;
    Ok(())
}
