//! The `torch` flow's run, driven from Python: layers go in as PyTorch's hooks produce them.

use std::collections::HashMap;
use std::path::PathBuf;

use layerdiff_core::{DType, SideInfo, TensorView, Timing};
use layerdiff_flow::Computing;
use layerdiff_flow::spec::target::TargetSpec;
use layerdiff_flow::timings::Stopwatch;
use layerdiff_flow::verbs::captured::{self, CapturedComparison, CapturedTarget, Handed};
use pyo3::prelude::*;

use crate::Report;
use crate::exceptions::{self, to_py_err};
use crate::layer::CapturedLayer;
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
    /// `inputs`: flat tensors. `layers`: the `CapturedLayer`s in execution order. The target is the options': a runtime runs `onnx_path`; a
    /// PyTorch target is described by `target_detail` and hands its values over with the
    /// reference's (`target_note`: what was done to the ONNX file before the runtime ran it,
    /// added to the target's description; `reduced_math`: the module types whose float32 products it computes in
    /// lower precision, and how; `lower_precision`: how it computes every layer below the
    /// reference's precision where no dtype shows it).
    #[new]
    /// `channels_last`: the reference holds its values channels-last (Keras), so an ONNX value
    /// held channels-first is compared transposed back. A Keras target (`xla`, `tflite…`)
    /// hands its values over like a PyTorch one, from `target_runtime` (`tensorflow 2.21.0`).
    /// `pushed`: the target is handed over from Python whatever the options' target is (a
    /// Keras model's PyTorch twin), with `unpaired`: the layers it has no counterpart of, and
    /// why.
    #[pyo3(signature = (*, command, model, inputs, layers, options, seed, reference_runtime, reference_detail, onnx_path=None, target_detail=None, target_note=None, reduced_math=None, lower_precision=None, timings=None, channels_last=false, target_runtime=None, pushed=false, unpaired=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        command: String,
        model: String,
        inputs: Vec<FlatTensor<'_>>,
        layers: Vec<PyRef<'_, CapturedLayer>>,
        options: &Options,
        seed: Option<u64>,
        reference_runtime: String,
        reference_detail: String,
        onnx_path: Option<PathBuf>,
        target_detail: Option<String>,
        target_note: Option<String>,
        reduced_math: Option<(Vec<String>, String)>,
        lower_precision: Option<String>,
        timings: Option<Vec<(String, String, f64)>>,
        channels_last: bool,
        target_runtime: Option<String>,
        pushed: bool,
        unpaired: Option<Vec<(usize, String)>>,
    ) -> PyResult<Self> {
        let inputs = inputs
            .iter()
            .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
            .collect::<PyResult<Vec<_>>>()?;
        let listed = layers
            .iter()
            .map(|layer| layer.listed())
            .collect::<PyResult<Vec<_>>>()?;
        let fed_by = layers.iter().map(|layer| layer.fed_by()).collect();
        let target = match &options.target {
            TargetSpec::Onnx(side) if !pushed => CapturedTarget::Onnx {
                path: onnx_path.ok_or_else(|| {
                    exceptions::UsageError::new_err("a runtime target needs the ONNX file")
                })?,
                runtime: side.runtime().cloned().ok_or_else(|| {
                    exceptions::UsageError::new_err(format!(
                        "`{side}` is a file of values: a model's target computes"
                    ))
                })?,
                note: target_note,
            },
            spec => CapturedTarget::Pushed {
                info: SideInfo::new(
                    target_runtime.unwrap_or_else(|| reference_runtime.clone()),
                    target_detail.unwrap_or_else(|| spec.spelling()),
                ),
                computing: Computing {
                    module_types: listed.iter().map(|l| l.module_type.clone()).collect(),
                    reduced_math,
                    fed_by,
                    lower_precision,
                },
                unpaired: unpaired.unwrap_or_default(),
            },
        };
        let request = CapturedComparison {
            command,
            model,
            inputs,
            seed,
            layers: listed,
            settings: options.settings.clone(),
            reference: SideInfo::new(reference_runtime, reference_detail),
            target,
            channels_last,
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

    /// For each layer: whether it is compared, and the dtype name the target holds its value
    /// in (None where the target does not say): what the baseline rounds each value to.
    #[getter]
    fn compared_dtypes(&self) -> PyResult<Vec<(bool, Option<&'static str>)>> {
        Ok(self
            .active()?
            .compared_dtypes()
            .into_iter()
            .map(|(c, d)| (c, d.map(DType::name)))
            .collect())
    }

    /// The float64 copy of the model computing the truth stopped (`why`).
    fn truth_lost(&mut self, why: String) -> PyResult<()> {
        self.active_mut()?.truth_lost(why);
        Ok(())
    }

    /// The float64 copy of the model computing the layers' same-precision baseline stopped
    /// (`why`).
    fn baseline_lost(&mut self, why: String) -> PyResult<()> {
        self.active_mut()?.baseline_lost(why);
        Ok(())
    }

    /// How many segments the ONNX run is split into.
    #[getter]
    fn segments(&self) -> PyResult<usize> {
        Ok(self.active()?.segmentation().segments)
    }

    /// Hands over layer `index`'s value (and its float64 value; for a PyTorch target, its
    /// value there and its module re-run on the reference's inputs, or why that failed:
    /// `local_error`, and how far a second re-run disagreed: `disagreement`); runs the segments
    /// it completes. A target that runs its model whole hands `own_exact` instead of `local`:
    /// the layer computed exactly on the target's own inputs with the reference's weights,
    /// `own_ideal` with the weights the target stores (or `own_why` there is none; `own_slack`:
    /// how far per element it may move by what it cannot model), and
    /// `quantization` = `(dtype, scale, zero_point)` where it quantizes the value.
    /// `reduction` = `(terms, rss)` where the baseline's layer is a reduction whose terms were
    /// measured: how many each element sums, and per element their root sum of squares;
    /// `reduction_terms`: the terms themselves where handed over (`terms` rows of the layer's
    /// elements, in the order the framework holds them).
    /// `arguments`: a functional call's numbers and flags the target's own code passes
    /// otherwise than the reference's, in words (its `local` re-run took them).
    #[pyo3(signature = (index, value, float64=None, target=None, local=None, local_error=None, disagreement=None, baseline=None, baseline_grid=None, own_exact=None, own_ideal=None, own_why=None, own_slack=None, quantization=None, reduction=None, reduction_terms=None, arguments=None))]
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        py: Python<'_>,
        index: usize,
        value: FlatTensor<'_>,
        float64: Option<FlatTensor<'_>>,
        target: Option<FlatTensor<'_>>,
        local: Option<FlatTensor<'_>>,
        local_error: Option<String>,
        disagreement: Option<f64>,
        baseline: Option<FlatTensor<'_>>,
        baseline_grid: Option<String>,
        own_exact: Option<FlatTensor<'_>>,
        own_ideal: Option<FlatTensor<'_>>,
        own_why: Option<String>,
        own_slack: Option<FlatTensor<'_>>,
        quantization: Option<(String, f64, i64)>,
        reduction: Option<(u64, FlatTensor<'_>)>,
        reduction_terms: Option<FlatTensor<'_>>,
        arguments: Option<Vec<String>>,
    ) -> PyResult<()> {
        let quantization = quantization
            .map(|(dtype, scale, zero_point)| {
                layerdiff_core::Quantization::new(&dtype, scale, zero_point)
            })
            .transpose()
            .map_err(exceptions::InputError::new_err)?;
        let baseline_grid = baseline_grid
            .map(|g| DType::from_name(&g))
            .transpose()
            .map_err(to_py_err)?;
        let local = match (view(&local)?, local_error) {
            (Some(t), _) => Some(Ok(t)),
            (None, Some(why)) => Some(Err(why)),
            (None, None) => None,
        };
        let layer = Handed {
            value: value.view()?,
            float64: view(&float64)?,
            target: view(&target)?,
            local,
            disagreement,
            baseline: view(&baseline)?,
            baseline_grid,
            own_exact: view(&own_exact)?,
            own_ideal: view(&own_ideal)?,
            own_why,
            own_slack: view(&own_slack)?,
            quantization,
            reduction: match &reduction {
                Some((terms, rss)) => Some(layerdiff_core::Reduction {
                    terms: *terms,
                    rss: rss.view()?,
                    each: view(&reduction_terms)?,
                }),
                None => None,
            },
            arguments: arguments.unwrap_or_default(),
        };
        let run = self.active_mut()?;
        py.detach(|| run.add(index, layer)).map_err(to_py_err)
    }

    /// Runs what is left and decides the origin; returns the layers whose parameters `finish`
    /// needs.
    fn conclude(&mut self, py: Python<'_>) -> PyResult<Vec<usize>> {
        let run = self.active_mut()?;
        py.detach(|| run.conclude()).map_err(to_py_err)
    }

    /// The layers whose causes need weights (after `conclude`), each with the layers that
    /// compute inside it: the groups `layer_evidence` takes one at a time.
    fn evidence_groups(&self) -> PyResult<Vec<Vec<usize>>> {
        Ok(self.active()?.evidence_groups().to_vec())
    }

    /// Parameters (by layer, as `finish` takes them) held for their groups' evidence; with
    /// `gather`, those groups' causes are gathered now and everything held is dropped: a model
    /// read as it goes is handed over a group at a time, the reference's then the target's.
    #[pyo3(signature = (parameters, target_parameters=None, target_half_steps=None, gather=true))]
    fn layer_evidence(
        &mut self,
        py: Python<'_>,
        parameters: HashMap<usize, Vec<FlatTensor<'_>>>,
        target_parameters: Option<HashMap<usize, Vec<FlatTensor<'_>>>>,
        target_half_steps: Option<HashMap<usize, Vec<FlatTensor<'_>>>>,
        gather: bool,
    ) -> PyResult<()> {
        let target_parameters = target_parameters.unwrap_or_default();
        let target_half_steps = target_half_steps.unwrap_or_default();
        let (reference, target) = (views(&parameters)?, views(&target_parameters)?);
        let half_steps = views(&target_half_steps)?;
        let run = self.active_mut()?;
        py.detach(|| run.layer_evidence(&reference, &target, &half_steps, gather));
        Ok(())
    }

    /// Reads the weights of every compared layer against the model's parameters, not only a
    /// drifting layer's (before `conclude`): a file the user gives may hold an edit that no
    /// layer's value shows.
    fn read_every_weight(&mut self) -> PyResult<()> {
        self.active_mut()?.read_every_weight();
        Ok(())
    }

    /// Whether a layer's target computes what its file says where that is not the model's
    /// computation (after `conclude`): a fresh export set `beside` the file then names what
    /// differs.
    fn file_differs(&self) -> PyResult<bool> {
        Ok(self.active()?.file_differs())
    }

    /// Sets a fresh ONNX export of the model (its path) beside the target's file, before
    /// `finish`: the nodes of a layer the file computes differently are compared with it.
    fn beside(&mut self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let run = self.active_mut()?;
        py.detach(|| run.beside(&path)).map_err(to_py_err)
    }

    /// The report; `parameters` maps a layer index to its flat parameter tensors (and
    /// `target_parameters` to the target's, dequantized where it stores them quantized, with
    /// half a step per element of those in `target_half_steps`, under the same names).
    #[pyo3(signature = (parameters, target_parameters=None, target_half_steps=None))]
    fn finish(
        &mut self,
        py: Python<'_>,
        parameters: HashMap<usize, Vec<FlatTensor<'_>>>,
        target_parameters: Option<HashMap<usize, Vec<FlatTensor<'_>>>>,
        target_half_steps: Option<HashMap<usize, Vec<FlatTensor<'_>>>>,
    ) -> PyResult<Report> {
        // held like a group's, then gathered with every other layer's
        self.layer_evidence(py, parameters, target_parameters, target_half_steps, false)?;
        let run = self.run.take().ok_or_else(finished)?;
        let mut report = py.detach(|| run.finish()).map_err(to_py_err)?;
        if !self.keep_timings {
            report.timings = None;
        }
        Ok(Report(report))
    }
}

/// An optional flat tensor as a view of its bytes.
fn view<'a>(tensor: &'a Option<FlatTensor<'_>>) -> PyResult<Option<TensorView<'a>>> {
    tensor.as_ref().map(FlatTensor::view).transpose()
}

/// Flat parameter tensors by layer, as views of their bytes.
fn views<'a>(
    given: &'a HashMap<usize, Vec<FlatTensor<'_>>>,
) -> PyResult<HashMap<usize, Vec<(String, TensorView<'a>)>>> {
    given
        .iter()
        .map(|(&i, list)| {
            let list = list
                .iter()
                .map(|p| Ok((p.name().to_string(), p.view()?)))
                .collect::<PyResult<Vec<_>>>()?;
            Ok((i, list))
        })
        .collect()
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
