//! The `torch` flow's run, driven from Python: layers go in as PyTorch's hooks produce them.

use std::collections::HashMap;
use std::path::PathBuf;

use layerdiff_core::{DType, Fingerprint, SideInfo, Timing};
use layerdiff_flow::captured::{self, CapturedComparison, ListedLayer};
use layerdiff_flow::timings::Stopwatch;
use layerdiff_onnx::LayerCall;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::Report;
use crate::exceptions::{self, to_py_err};
use crate::options::Options;
use crate::tensors::FlatTensor;

/// A comparison of PyTorch's layers against an ONNX model, fed layer by layer from forward
/// hooks: `add` each layer's value as it is produced (segments of the ONNX run follow as soon
/// as their layers are in), then `conclude`, then `finish` with the parameters it asks for.
#[pyclass(module = "layerdiff._layerdiff")]
pub(crate) struct CapturedRun {
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
