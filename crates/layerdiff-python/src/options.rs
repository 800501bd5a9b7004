//! Options parsed once: by the command line's parser (`parse_cli`) or from the Python API's
//! keyword arguments (`Options`), then handed to the engine as they are.

use std::path::PathBuf;

use layerdiff_args::{Dispatched, PyTorchVerb, ReportArgs};
use layerdiff_core::Tolerance;
use layerdiff_flow::captured::check_options;
use layerdiff_flow::torch_side::{TorchSpec, TorchTarget};
use layerdiff_flow::{Settings, memory};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::exceptions::{self, to_py_err};

/// How a comparison is run, parsed once: tolerance, local error, memory budget, the PyTorch
/// reference, the target (a runtime that runs the ONNX file, or PyTorch computing
/// differently), and whether PyTorch's float64 run is the truth.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) settings: Settings,
    pub(crate) reference: TorchSpec,
    pub(crate) target: TorchTarget,
    pub(crate) float64: bool,
}

#[pymethods]
impl Options {
    /// Parses the options as the Python API takes them (`tolerance`: a number, `dtype` or
    /// `auto`; `max_memory`: bytes or a size such as `4G`; `target`: `ort`, `ort:opt=all`,
    /// `tract`, `torch:bf16`…; `reference`: `torch`, `torch:cuda`…).
    #[new]
    #[pyo3(signature = (*, tolerance="dtype".to_string(), local=true, max_memory=None, target="ort", float64=true, reference="torch"))]
    fn new(
        tolerance: String,
        local: bool,
        max_memory: Option<String>,
        target: &str,
        float64: bool,
        reference: &str,
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
        let target = TorchTarget::parse(target).map_err(usage)?;
        let reference = TorchSpec::parse(reference).map_err(usage)?;
        check_options(&settings, &reference, &target, float64).map_err(to_py_err)?;
        Ok(Self {
            settings,
            reference,
            target,
            float64,
        })
    }

    /// Whether PyTorch's float64 run is the truth both sides are measured against.
    #[getter]
    fn float64(&self) -> bool {
        self.float64
    }

    /// Whether each layer's local error is measured.
    #[getter]
    fn local(&self) -> bool {
        self.settings.local
    }

    /// The PyTorch reference: a dict of `spelling`, `device`, `precision` and `compile`.
    #[getter]
    fn reference<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        torch_dict(py, &self.reference)
    }

    /// A PyTorch target as `reference` gives it, or None for a runtime that runs the ONNX file.
    #[getter]
    fn torch_target<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match &self.target {
            TorchTarget::Torch(spec) => torch_dict(py, spec).map(Some),
            TorchTarget::Onnx(_) => Ok(None),
        }
    }
}

fn torch_dict<'py>(py: Python<'py>, spec: &TorchSpec) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("spelling", spec.spelling())?;
    d.set_item("device", &spec.device)?;
    d.set_item("precision", spec.precision.spelling())?;
    d.set_item("compile", spec.compile.as_deref())?;
    Ok(d)
}

/// A verb that needs PyTorch (`torch`, `grad`) as parsed from a command line.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
pub(crate) struct Command {
    model: String,
    seed: u64,
    pub(crate) report: ReportArgs,
    options: Options,
    /// `torch`: the export path and a file to use instead.
    exporter: Option<String>,
    onnx: Option<PathBuf>,
    /// `grad`: the loss.
    loss: Option<String>,
    /// `torch`: the precision of the target (`fp16`, `bf16`, `int8`) and the layers kept in
    /// float32 in it.
    dtype: Option<String>,
    keep_fp32: Vec<String>,
    /// `torch`: the points of an axis: batch sizes, or each point's input shapes.
    batch_sizes: Vec<usize>,
    shapes: Vec<Vec<Vec<usize>>>,
}

#[pymethods]
impl Command {
    /// The model: a built-in name or a builder spec.
    #[getter]
    fn model(&self) -> String {
        self.model.clone()
    }
    /// Seed of the model's weights and of generated inputs.
    #[getter]
    fn seed(&self) -> u64 {
        self.seed
    }
    /// `torch`: `dynamo` or `legacy`.
    #[getter]
    fn exporter(&self) -> Option<String> {
        self.exporter.clone()
    }
    /// `torch`: an ONNX file to compare against instead of exporting one.
    #[getter]
    fn onnx(&self) -> Option<PathBuf> {
        self.onnx.clone()
    }
    /// `torch`: the precision the target computes in (`fp16`, `bf16`, `int8`), or None.
    #[getter]
    fn dtype(&self) -> Option<String> {
        self.dtype.clone()
    }
    /// `torch`: the layers to keep in float32 in a lower-precision target.
    #[getter]
    fn keep_fp32(&self) -> Vec<String> {
        self.keep_fp32.clone()
    }
    /// `torch`: the batch sizes to compare at (empty: the example's only).
    #[getter]
    fn batch_sizes(&self) -> Vec<usize> {
        self.batch_sizes.clone()
    }
    /// `torch`: each point's input shapes (empty: the example's only).
    #[getter]
    fn shapes(&self) -> Vec<Vec<Vec<usize>>> {
        self.shapes.clone()
    }
    /// `grad`: `dot` or `sum`.
    #[getter]
    fn loss(&self) -> Option<String> {
        self.loss.clone()
    }
    /// The folder the reports (and an exported model) go to.
    #[getter]
    fn out(&self) -> Option<PathBuf> {
        self.report.out.clone()
    }
    /// Print nothing but errors.
    #[getter]
    fn quiet(&self) -> bool {
        self.report.quiet
    }
    /// Measure and print where the time went.
    #[getter]
    fn timings(&self) -> bool {
        self.report.timings
    }
    /// How the comparison runs.
    #[getter]
    fn options(&self) -> Options {
        self.options.clone()
    }
}

/// Runs a command line through the one dispatch of the Rust binary
/// ([`layerdiff_args::dispatch`]). Returns `("torch", options)`, `("grad", options)`,
/// `("ops", …)`, `("check", …)` or `("zoo", None)` for the verbs that need PyTorch, or
/// `("exit", code)` when parsing or an engine verb (run here with ONNX Runtime from
/// `ort_library`, the one the running interpreter has) already did the work.
#[pyfunction]
#[pyo3(signature = (argv, ort_library=None))]
pub(crate) fn parse_cli(
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
    // The engine's verbs run wholly in Rust, with the GIL released.
    let verb = match py.detach(|| layerdiff_args::dispatch(argv, ort_library.as_deref())) {
        Dispatched::Exit(code) => return exit(code),
        Dispatched::PyTorch(verb) => verb,
    };
    match verb {
        PyTorchVerb::Torch(a) => {
            let (target, dtype) = match a.dtype_target() {
                Ok(resolved) => resolved,
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit(2);
                }
            };
            let settings = a.settings();
            let command = Command {
                dtype: dtype.map(|d| format!("{d:?}").to_lowercase()),
                keep_fp32: a.keep_fp32,
                batch_sizes: a.batch_sizes,
                shapes: a.shapes,
                model: a.model,
                seed: a.seed,
                options: Options {
                    settings,
                    reference: a.reference,
                    target,
                    float64: !a.no_float64,
                },
                report: a.report,
                exporter: Some(format!("{:?}", a.exporter).to_lowercase()),
                onnx: a.onnx,
                loss: None,
            };
            checked(py, "torch", command)
        }
        PyTorchVerb::Zoo => Ok(("zoo".to_string(), py.None())),
        PyTorchVerb::Check(a) => Ok((
            "check".to_string(),
            Py::new(py, crate::check::CheckCommand::new(a))?.into_any(),
        )),
        PyTorchVerb::Ops(a) => Ok((
            "ops".to_string(),
            Py::new(py, crate::ops::OpsCommand::new(a))?.into_any(),
        )),
        PyTorchVerb::Grad(a) => {
            let settings = a.settings();
            let command = Command {
                model: a.model,
                seed: a.seed,
                options: Options {
                    settings,
                    reference: a.reference,
                    target: TorchTarget::Torch(a.target),
                    float64: !a.no_float64,
                },
                report: a.report,
                exporter: None,
                onnx: None,
                dtype: None,
                keep_fp32: Vec::new(),
                batch_sizes: Vec::new(),
                shapes: Vec::new(),
                loss: Some(format!("{:?}", a.loss).to_lowercase()),
            };
            checked(py, "grad", command)
        }
    }
}

/// `(verb, command)`, or `("exit", 2)` with the message when its options do not fit together.
fn checked(py: Python<'_>, verb: &str, command: Command) -> PyResult<(String, Py<PyAny>)> {
    let o = &command.options;
    if let Err(e) = check_options(&o.settings, &o.reference, &o.target, o.float64) {
        eprintln!("error: {}", layerdiff_flow::error_chain(&e));
        return Ok((
            "exit".to_string(),
            2u8.into_pyobject(py)?.into_any().unbind(),
        ));
    }
    Ok((verb.to_string(), Py::new(py, command)?.into_any()))
}
