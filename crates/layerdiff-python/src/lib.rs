//! Python binding: extract arguments, run the core with the GIL released, convert the result.
//! No metric, surgery or report logic lives here.

mod axis;
mod captured;
mod check;
mod compiled;
mod exceptions;
mod layer;
mod memory;
mod op_matrix;
mod ops;
mod options;
mod report;
mod repro;
mod spelling;
mod sweep;
mod tensors;

use std::path::PathBuf;

use layerdiff_core::{Fingerprint, render};
use pyo3::prelude::*;

use crate::captured::CapturedRun;
use crate::exceptions::to_py_err;
use crate::options::{Command, Options, parse_cli};
use crate::tensors::FlatTensor;

pub(crate) use crate::report::Report;

/// The line of layers done (the engine's, `layerdiff_flow::progress`), ticked from Python as a
/// PyTorch forward pass streams its layers.
#[pyclass(module = "layerdiff._layerdiff")]
pub(crate) struct Ticker(layerdiff_flow::progress::Ticker);

#[pymethods]
impl Ticker {
    /// A ticker over `total` layers when the command shows its progress and the run is not
    /// `quiet`, else None.
    #[staticmethod]
    fn over(total: usize, quiet: bool) -> Option<Self> {
        layerdiff_flow::progress::Ticker::new(total, quiet).map(Self)
    }
    /// `done` layers are done.
    fn __call__(&mut self, done: usize) {
        self.0.tick(done);
    }
}

/// A phase of the command begins: its line.
#[pyfunction]
fn progress_phase(what: &str) {
    layerdiff_flow::progress::phase(what);
}

/// The ONNX Runtime library this process loads: the package names its interpreter's wheel,
/// once, as it is imported (`None`: the core's search, which honours `LAYERDIFF_ORT_LIB`).
#[pyfunction]
#[pyo3(signature = (library=None))]
fn use_ort_library(library: Option<std::path::PathBuf>) {
    layerdiff_runtime::use_ort_library(library.as_deref());
}

/// The threads `LAYERDIFF_THREADS` gives each of a run's pools, or None (see
/// `layerdiff_runtime::thread_cap`): the command sizes PyTorch's to it.
#[pyfunction]
fn thread_cap() -> PyResult<Option<usize>> {
    layerdiff_runtime::thread_cap().map_err(to_py_err)
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

/// The smallest subset of `items` for which `clean(subset)` is true, given that it is true of
/// all of them (delta debugging by halves, the engine's one search: [`layerdiff_core::smallest_set`]).
#[pyfunction]
fn smallest_set(items: Vec<String>, clean: Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    layerdiff_core::smallest_set(&items, &mut |set: &[String]| {
        clean.call1((set.to_vec(),))?.extract::<bool>()
    })
}

/// Whether every element of `got` is within `atol + rtol·|reference|` of `reference` (the same
/// shape; NaN where the reference has NaN): the core's one allclose.
#[pyfunction]
fn within(reference: FlatTensor<'_>, got: FlatTensor<'_>, atol: f64, rtol: f64) -> PyResult<bool> {
    let (reference, got) = (reference.to_tensor()?, got.to_tensor()?);
    let bound = layerdiff_core::Bound { atol, rtol };
    Ok(layerdiff_core::within(reference.view(), got.view(), bound))
}

/// The torch.compile stage before `stage` (`eager` for one outside the list).
#[pyfunction]
fn stage_before(stage: &str) -> &'static str {
    layerdiff_flow::verbs::bisect::torch::stage_before(stage)
}

/// Writes flat tensors as a safetensors file (through a temporary file, so whole or not at
/// all), with `producer: layerdiff` in its metadata: the one writer of every tensor file.
#[pyfunction]
fn write_safetensors(py: Python<'_>, path: PathBuf, tensors: Vec<FlatTensor<'_>>) -> PyResult<()> {
    let tensors = tensors
        .iter()
        .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
        .collect::<PyResult<Vec<_>>>()?;
    let metadata =
        std::collections::BTreeMap::from([("producer".to_string(), "layerdiff".to_string())]);
    py.detach(|| layerdiff_core::write_safetensors(&path, &tensors, metadata))
        .map_err(to_py_err)
}

/// A running digest of bytes, for the keys of what is kept between runs (the core's BLAKE3
/// [`layerdiff_core::Digest`]; a large buffer is hashed on every core, the GIL released).
#[pyclass(module = "layerdiff._layerdiff")]
#[derive(Default)]
struct Digest(layerdiff_core::Digest);

#[pymethods]
impl Digest {
    #[new]
    fn new() -> Self {
        Self::default()
    }
    /// Adds `data`: bytes, or a contiguous uint8 numpy array (a tensor's bytes, not copied).
    fn update(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(bytes) = data.cast::<pyo3::types::PyBytes>() {
            self.0.update(bytes.as_bytes());
            return Ok(());
        }
        let array: numpy::PyReadonlyArray1<'_, u8> = data.extract()?;
        let bytes = array.as_slice().map_err(|e| {
            exceptions::InputError::new_err(format!("the bytes to digest are not contiguous: {e}"))
        })?;
        let digest = &mut self.0;
        py.detach(|| digest.update(bytes));
        Ok(())
    }
    /// The digest of everything added, as 64 hex characters.
    fn hexdigest(&self) -> String {
        self.0.hex()
    }
}

/// A flat tensor's fingerprint, `(element count, samples)`: what pairs a layer with an ONNX
/// value by value where the file names no module scope.
#[pyfunction]
fn fingerprint(tensor: FlatTensor<'_>) -> PyResult<(usize, Vec<f64>)> {
    let print = Fingerprint::of(tensor.view()?);
    Ok((print.count, print.samples))
}

/// Whether `tensor` is the value whose fingerprint was `before` (`(count, samples)`), computed
/// again on the same inputs (see `Fingerprint::same_run`).
#[pyfunction]
fn same_run(before: (usize, Vec<f64>), tensor: FlatTensor<'_>) -> PyResult<bool> {
    let (count, samples) = before;
    Ok(Fingerprint { count, samples }.same_run(&Fingerprint::of(tensor.view()?)))
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

/// The `layerdiff` command's handling of Ctrl-C and SIGTERM (see `layerdiff_flow::interrupt`):
/// the first asks a run to stop at its next layer, its report then marked incomplete; the
/// handlers Python had installed still run. Called once by the command, after Python's own.
#[pyfunction]
fn catch_interrupts() {
    layerdiff_flow::interrupt::catch();
}

/// The signal that asked the run to stop, if one did.
#[pyfunction]
fn interrupt_signal() -> Option<i32> {
    layerdiff_flow::interrupt::requested()
}

/// The command's end, with the exit code its run returned (`layerdiff_flow::interrupt::
/// conclude`): where a signal stopped the run (`signal`, where the core's handler did not see
/// it), what the run made besides its reports goes, the last line says what is left, and the
/// exit code is 128 + the signal's number.
#[pyfunction]
#[pyo3(signature = (code, signal=None))]
fn conclude(code: u8, signal: Option<i32>) -> u8 {
    use layerdiff_flow::interrupt;
    if let (None, Some(signal)) = (interrupt::requested(), signal) {
        interrupt::request(signal);
    }
    interrupt::conclude(code)
}

#[pymodule]
fn _layerdiff(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // An isolated side's worker is this interpreter running the package's command
    // (`python -m layerdiff __worker …`): the executable here is Python, not layerdiff.
    let python: std::ffi::OsString = m
        .py()
        .import("sys")?
        .getattr("executable")?
        .extract::<std::path::PathBuf>()?
        .into_os_string();
    layerdiff_runtime::set_worker_command(vec![
        python,
        "-m".into(),
        "layerdiff".into(),
        layerdiff_runtime::WORKER_VERB.into(),
    ]);
    // layerdiff's own pool as `LAYERDIFF_THREADS` sizes it; a value that is not a number is
    // the error of the first run that reads it, not of the import
    let _ = layerdiff_runtime::cap_threads();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_TOLERANCE", layerdiff_core::DEFAULTS_TEXT)?;
    m.add("AUTO_FACTOR", layerdiff_core::AUTO_FACTOR)?;
    // the magnitude from which a float32 value is a mask's sentinel (PyTorch sides hold it so)
    m.add("SENTINEL", layerdiff_core::SENTINEL)?;
    m.add_class::<Report>()?;
    m.add_class::<report::BisectionPlan>()?;
    m.add_class::<Ticker>()?;
    m.add_class::<Digest>()?;
    m.add_class::<axis::PyAxisReport>()?;
    m.add_function(wrap_pyfunction!(parse_cli, m)?)?;
    m.add_function(wrap_pyfunction!(use_ort_library, m)?)?;
    m.add_function(wrap_pyfunction!(catch_interrupts, m)?)?;
    m.add_function(wrap_pyfunction!(memory::settle_heap, m)?)?;
    m.add_function(wrap_pyfunction!(memory::heap_for_streaming, m)?)?;
    m.add_function(wrap_pyfunction!(interrupt_signal, m)?)?;
    m.add_function(wrap_pyfunction!(conclude, m)?)?;
    m.add_function(wrap_pyfunction!(progress_phase, m)?)?;
    m.add_function(wrap_pyfunction!(thread_cap, m)?)?;
    m.add_class::<CapturedRun>()?;
    m.add_class::<compiled::ModuleSearch>()?;
    m.add_class::<layer::CapturedLayer>()?;
    m.add_class::<Options>()?;
    m.add_class::<Command>()?;
    m.add_function(wrap_pyfunction!(compare_tensors_json, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(same_run, m)?)?;
    m.add_function(wrap_pyfunction!(memory::give_back_freed, m)?)?;
    m.add_function(wrap_pyfunction!(write_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(smallest_set, m)?)?;
    m.add_function(wrap_pyfunction!(within, m)?)?;
    m.add_function(wrap_pyfunction!(stage_before, m)?)?;
    m.add_function(wrap_pyfunction!(repro::write_framework_repro, m)?)?;
    m.add_class::<repro::ModuleRepro>()?;
    m.add_function(wrap_pyfunction!(model_inputs, m)?)?;
    m.add_class::<ops::OpsCommand>()?;
    m.add_class::<check::CheckCommand>()?;
    m.add_class::<sweep::SweepCommand>()?;
    m.add_function(wrap_pyfunction!(sweep::deliver_sweep, m)?)?;
    m.add_function(wrap_pyfunction!(check::deliver_check, m)?)?;
    m.add_function(wrap_pyfunction!(check::runtime_computes_in, m)?)?;
    m.add_function(wrap_pyfunction!(op_matrix::runtime_narrowing, m)?)?;
    m.add_class::<op_matrix::Narrowing>()?;
    m.add_class::<op_matrix::OpCase>()?;
    m.add_class::<op_matrix::OpCell>()?;
    m.add_class::<op_matrix::OpsRun>()?;
    m.add_function(wrap_pyfunction!(ops::run_model, m)?)?;
    m.add_function(wrap_pyfunction!(ops::deliver_ops, m)?)?;
    m.add_function(wrap_pyfunction!(ops::describe_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(ops::ops_report, m)?)?;
    m.add_function(wrap_pyfunction!(ops::op_backends, m)?)?;
    m.add_class::<spelling::SideSpec>()?;
    m.add_function(wrap_pyfunction!(spelling::side_spec, m)?)?;
    m.add_function(wrap_pyfunction!(spelling::choice, m)?)?;
    m.add_function(wrap_pyfunction!(spelling::precision_name, m)?)?;
    m.add_function(wrap_pyfunction!(spelling::parse_release, m)?)?;
    m.add_function(wrap_pyfunction!(spelling::release_wheel, m)?)?;
    m.add_class::<spelling::ReleaseWheel>()?;
    m.add_function(wrap_pyfunction!(memory::bytes_text, m)?)?;
    exceptions::register(m)?;
    Ok(())
}
