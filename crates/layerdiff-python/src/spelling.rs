//! Spellings the API takes as the command line does: a side (`torch:cuda:bf16`, `ort:opt=all`),
//! an option's choice, and another release of a runtime (`onnxruntime==1.30.0`), each parsed
//! by the one parser every door uses.

use layerdiff_flow::spec::onnx_side::OnnxSide;
use layerdiff_flow::spec::target::TargetSpec;
use pyo3::prelude::*;

use crate::exceptions;

/// A lower precision's name as a dtype (`fp16` → `float16`, `bf16` → `bfloat16`, `int8`), by
/// the rule the command line's `--dtype` keeps.
#[pyfunction]
pub(crate) fn precision_name(spelling: &str) -> PyResult<&'static str> {
    layerdiff_flow::spec::torch::LowerPrecision::parse(spelling)
        .map(|p| p.dtype_name())
        .map_err(crate::exceptions::UsageError::new_err)
}

/// A side as spelled on the command line or in the API (`torch:cuda:bf16`, `ort:opt=all`,
/// `tract`, `openvino:precision=f16`, `expected:PATH`), parsed by the one parser every door uses.
#[pyclass(frozen, module = "layerdiff._layerdiff")]
pub(crate) struct SideSpec {
    /// `torch` (PyTorch computes it), `keras` (TensorFlow computes a Keras model another way),
    /// `runtime` (an ONNX runtime runs the file) or `expected` (values read from a file).
    #[pyo3(get)]
    kind: &'static str,
    /// The spelling that parses back to it (defaults left out).
    #[pyo3(get)]
    spelling: String,
    /// PyTorch's device (`cpu`, `cuda:1`); `None` for other kinds.
    #[pyo3(get)]
    device: Option<String>,
    /// PyTorch's precision (`fp32`, `bf16`, `amp-bf16`…); `None` for other kinds.
    #[pyo3(get)]
    precision: Option<&'static str>,
    /// The lower float dtype a PyTorch side computes its layers in (`float16`, `bfloat16`),
    /// whose keep-in-float32 advice is checked; `None` for float32, TF32 and other kinds.
    #[pyo3(get)]
    lower: Option<&'static str>,
    /// `torch.compile`'s backend when compiled; `None` when eager or not PyTorch.
    #[pyo3(get)]
    compile: Option<String>,
    /// The processes DistributedDataParallel trains a PyTorch side in (`torch:ddp=2`: 2); 1
    /// for one process and other kinds.
    #[pyo3(get)]
    ranks: u32,
}

/// The option `option` (`exporter`, `loss`, `executor`, `op dtype`) as the API was given it,
/// parsed by the command line's rule: its spelling; a `UsageError` names the ones taken.
#[pyfunction]
pub(crate) fn choice(option: &str, text: &str) -> PyResult<String> {
    layerdiff_args::choice(option, text).map_err(exceptions::UsageError::new_err)
}

/// Parses a side's spelling; a `UsageError` names what is wrong with it.
#[pyfunction]
pub(crate) fn side_spec(text: &str) -> PyResult<SideSpec> {
    let parsed = TargetSpec::parse(text).map_err(exceptions::UsageError::new_err)?;
    Ok(SideSpec::of(&parsed))
}

impl SideSpec {
    pub(crate) fn of(parsed: &TargetSpec) -> Self {
        let spelling = parsed.spelling();
        match parsed.clone() {
            TargetSpec::Torch(torch) => SideSpec {
                kind: "torch",
                spelling,
                device: Some(torch.device),
                precision: Some(torch.precision.spelling()),
                lower: torch.precision.lower().map(|d| d.name()),
                compile: torch.compile,
                ranks: torch.ranks,
            },
            TargetSpec::Keras(_) => SideSpec {
                kind: "keras",
                spelling,
                device: None,
                precision: None,
                lower: None,
                compile: None,
                ranks: 1,
            },
            TargetSpec::Onnx(runtime) => SideSpec {
                kind: match runtime {
                    OnnxSide::Expected(_) => "expected",
                    OnnxSide::Runs(_) => "runtime",
                },
                spelling,
                device: None,
                precision: None,
                lower: None,
                compile: None,
                ranks: 1,
            },
        }
    }
}

/// Another release as `python -m layerdiff.releases` takes it (`onnxruntime==1.30.0`, a version
/// alone for ONNX Runtime), checked by the registry's rule (`layerdiff_runtime::parse_release`):
/// `(package, version)`; a `UsageError` says what is wrong with it.
#[pyfunction]
pub(crate) fn parse_release(text: &str) -> PyResult<(String, String)> {
    layerdiff_runtime::parse_release(text).map_err(exceptions::UsageError::new_err)
}

/// The runtime whose wheel `package` is, as its own module names it (`layerdiff_runtime::Wheel`).
#[pyclass(frozen, module = "layerdiff._layerdiff")]
pub(crate) struct ReleaseWheel {
    /// The runtime's name, as a side that runs on one of its libraries begins (`ort`, in
    /// `ort:lib=PATH`).
    #[pyo3(get)]
    runtime: &'static str,
    /// Its library under a virtualenv's `site-packages`, as a pattern
    /// (`onnxruntime/capi/libonnxruntime.so.*`).
    #[pyo3(get)]
    library: String,
    wheel: &'static layerdiff_runtime::Wheel,
}

#[pymethods]
impl ReleaseWheel {
    /// What a release at `version` needs installed beside it (`numpy<2`).
    fn needs(&self, version: &str) -> Vec<&'static str> {
        layerdiff_runtime::release_needs(self.wheel, version)
    }
}

/// The wheel `package` is (`onnxruntime-gpu`); a `UsageError` names the packages there are.
#[pyfunction]
pub(crate) fn release_wheel(package: &str) -> PyResult<ReleaseWheel> {
    let (runtime, wheel) =
        layerdiff_runtime::wheel_of(package).map_err(exceptions::UsageError::new_err)?;
    Ok(ReleaseWheel {
        runtime,
        library: format!("{}/{}.*", wheel.folder, wheel.names[0]),
        wheel,
    })
}
