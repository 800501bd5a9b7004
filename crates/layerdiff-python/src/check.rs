//! `layerdiff check` across the boundary: its parsed options, and the outputs of both sides
//! judged and delivered by the engine.

use std::path::PathBuf;

use layerdiff_args::CheckArgs;
use layerdiff_core::Bound;
use layerdiff_flow::output::Destinations;
use layerdiff_flow::verbs::check::{CheckReport, against_export, deliver};
use pyo3::prelude::*;

use crate::exceptions::to_py_err;
use crate::tensors::FlatTensor;

/// `layerdiff check` as parsed from a command line.
#[pyclass(module = "layerdiff._layerdiff", frozen, get_all)]
pub(crate) struct CheckCommand {
    /// A built-in model or a builder.
    model: String,
    /// The runtime, as spelled (`ort`, `tract`).
    target: String,
    /// An ONNX file to check instead of exporting one.
    onnx: Option<PathBuf>,
    /// `dynamo` or `legacy`.
    exporter: String,
    /// Whether an export kept from an earlier run may be reused.
    cache: bool,
    /// The bound's terms.
    atol: f64,
    rtol: f64,
    /// Seed of the weights and inputs.
    seed: u64,
    /// Where the JSON goes.
    json: Option<PathBuf>,
    /// Print nothing but errors.
    quiet: bool,
}

impl CheckCommand {
    pub(crate) fn new(a: CheckArgs) -> Self {
        Self {
            model: a.model,
            target: a.target.spelling(),
            onnx: a.onnx,
            exporter: layerdiff_args::spelling(&a.exporter),
            cache: !a.no_cache,
            atol: a.atol,
            rtol: a.rtol,
            seed: a.seed,
            json: a.json,
            quiet: a.quiet,
        }
    }
}

/// Judges the target's outputs against the reference's (same order), and both against the
/// outputs computed in float64 where given, the target held to the rounding of `computed_in`
/// (the narrower dtype it computes in, by name, and how: see `runtime_computes_in`); the file
/// given (`--onnx`) read against the model's own `export` where one was made; writes and
/// prints the check; returns the exit code.
#[pyfunction]
#[pyo3(signature = (command, sides, reference, target, truth=None, computed_in=None, export=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn deliver_check(
    py: Python<'_>,
    command: &CheckCommand,
    sides: (String, String),
    reference: Vec<FlatTensor<'_>>,
    target: Vec<FlatTensor<'_>>,
    truth: Option<Vec<FlatTensor<'_>>>,
    computed_in: Option<(String, String)>,
    export: Option<PathBuf>,
) -> PyResult<u8> {
    let computed_in = computed_in
        .map(|(d, how)| {
            Ok::<_, layerdiff_core::Error>((layerdiff_core::DType::from_name(&d)?, how))
        })
        .transpose()
        .map_err(to_py_err)?;
    let owned = |ts: &[FlatTensor<'_>]| {
        ts.iter()
            .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
            .collect::<PyResult<Vec<_>>>()
    };
    let (reference, target) = (owned(&reference)?, owned(&target)?);
    let truth = truth.as_deref().map(owned).transpose()?;
    let bound = Bound {
        atol: command.atol,
        rtol: command.rtol,
    };
    let to = Destinations {
        json: command.json.clone(),
        quiet: command.quiet,
        ..Destinations::default()
    };
    py.detach(|| {
        let report = CheckReport::new(
            &command.model,
            (&sides.0, &sides.1),
            bound,
            &reference,
            &target,
            truth.as_deref(),
            computed_in,
        )?;
        // where the file is the model's own computation, only the runtime differs
        let report = match (&command.onnx, &export) {
            (Some(path), Some(export)) => {
                let read = against_export(export, path)?;
                let report = (report.of_file(&path.display().to_string()))
                    .with_file_differences(read.differences);
                if read.same_graph {
                    report.of_the_models_computation()
                } else {
                    report
                }
            }
            (Some(path), None) => report.of_file(&path.display().to_string()),
            (None, _) => report.of_the_models_computation(),
        };
        deliver(&report, &to)
    })
    .map_err(to_py_err)
}

/// The narrower dtype `runtime` computes the ONNX model `model` (its bytes) in, by name, and
/// how in words: where it narrows one of its ops (OpenVINO's bfloat16 inference precision),
/// else the file's own (a float16 file's float16, a quantized file's integers); `None` where
/// it computes in float32.
#[pyfunction]
#[pyo3(signature = (model, runtime))]
pub(crate) fn runtime_computes_in(
    py: Python<'_>,
    model: &[u8],
    runtime: &str,
) -> PyResult<Option<(&'static str, String)>> {
    let grid = py.detach(|| layerdiff_flow::verbs::ops::computes_in(model, runtime));
    Ok(grid.map_err(to_py_err)?.map(|(d, how)| (d.name(), how)))
}
