//! Options parsed once: by the command line's parser (`parse_cli`) or from the Python API's
//! keyword arguments (`Options`), then handed to the engine as they are.

use std::path::PathBuf;

use layerdiff_args::{Dispatched, GradArgs, KerasArgs, PythonVerb, ReportArgs, TorchArgs};
use layerdiff_core::{Invocation, Tolerance};
use layerdiff_flow::spec::target::TargetSpec;
use layerdiff_flow::spec::target::resolve_target;
use layerdiff_flow::spec::torch::{LowerPrecision, TorchSpec};
use layerdiff_flow::verbs::captured::check_options;
use layerdiff_flow::{Float64, Settings, memory};
use pyo3::prelude::*;

use crate::exceptions::{self, to_py_err};
use crate::spelling::SideSpec;

/// How a comparison is run, parsed once: tolerance, local error, memory budget, whether
/// PyTorch's float64 run is the truth (and the baseline made), the PyTorch reference, the
/// target (a runtime that runs the ONNX file, or PyTorch computing differently).
#[pyclass(module = "layerdiff._layerdiff", frozen)]
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) settings: Settings,
    pub(crate) reference: TorchSpec,
    pub(crate) target: TargetSpec,
}

#[pymethods]
impl Options {
    /// Parses the options as the Python API takes them (`tolerance`: a number, `dtype` or
    /// `auto`; `max_memory`: bytes or a size such as `4G`; `target`: `ort`, `ort:opt=all`,
    /// `tract`, `torch:bf16`, `xla`, `tflite:fp16`…; `reference`: `torch`, `torch:cuda`…;
    /// `framework`: the model's, `PyTorch` or `Keras`, whose sides the target may name).
    #[new]
    #[pyo3(signature = (*, tolerance=None, local=true, max_memory=None, target="ort", float64=true, reference="torch", framework="PyTorch"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        tolerance: Option<&Bound<'_, PyAny>>,
        local: bool,
        max_memory: Option<&Bound<'_, PyAny>>,
        target: &str,
        float64: bool,
        reference: &str,
        framework: &str,
    ) -> PyResult<Self> {
        let usage = |e: String| exceptions::UsageError::new_err(e);
        let tolerance = match tolerance {
            Some(given) => spelled(given)?,
            None => "dtype".to_string(),
        };
        let max_memory = max_memory
            .map(spelled)
            .transpose()?
            .as_deref()
            .map(memory::parse_memory)
            .transpose()
            .map_err(usage)?;
        let float64 = if float64 {
            Float64::Truth
        } else {
            Float64::Skip
        };
        let tolerance = Tolerance::parse(&tolerance).map_err(usage)?;
        let settings = Settings::new(tolerance, local, max_memory, float64).map_err(to_py_err)?;
        let target = TargetSpec::parse(target).map_err(usage)?;
        if let Some(why) = target.unfit_for(framework) {
            return Err(usage(why));
        }
        let reference = TorchSpec::parse(reference).map_err(usage)?;
        Self::checked(settings, reference, target).map_err(usage)
    }

    /// The options with a `torch` run's lower precision (`dtype`: `fp16`, `bf16` or `int8`),
    /// kept layers and a file to use instead of exporting (`onnx`) applied, by the rules the
    /// command line keeps (`layerdiff_flow::spec::target::resolve_target`).
    #[pyo3(signature = (*, dtype=None, keep_fp32=false, onnx=None))]
    fn resolved(
        &self,
        dtype: Option<&str>,
        keep_fp32: bool,
        onnx: Option<PathBuf>,
    ) -> PyResult<Self> {
        let usage = |e: String| exceptions::UsageError::new_err(e);
        let dtype = dtype
            .map(LowerPrecision::parse)
            .transpose()
            .map_err(usage)?;
        let target =
            resolve_target(&self.target, dtype, keep_fp32, onnx.as_deref()).map_err(usage)?;
        Ok(Self {
            target,
            ..self.clone()
        })
    }

    /// Refuses an ONNX file given to use instead of a conversion (`onnx`) that the target
    /// cannot run, or that does not exist: the command line's rule for `--onnx`.
    #[pyo3(signature = (onnx=None))]
    fn check_file(&self, onnx: Option<PathBuf>) -> PyResult<()> {
        self.target
            .file_fits(onnx.as_deref())
            .map_err(exceptions::UsageError::new_err)
    }

    /// Whether a checkpoint whose weights take `weights` bytes in float32 is held one module
    /// at a time, read from its files as the forward pass reaches each module (the core's
    /// rule: `layerdiff_flow::memory::streams_weights`).
    fn streams_weights(&self, weights: u64) -> bool {
        memory::streams_weights(weights, self.settings.max_memory)
    }

    /// Whether PyTorch's float64 run is the truth both sides are measured against.
    #[getter]
    fn float64(&self) -> bool {
        self.settings.truth()
    }

    /// Whether each layer's local error is measured.
    #[getter]
    fn local(&self) -> bool {
        self.settings.local
    }

    /// The PyTorch reference, as a `SideSpec`.
    #[getter]
    fn reference(&self) -> SideSpec {
        SideSpec::of(&TargetSpec::Torch(self.reference.clone()))
    }

    /// A PyTorch target as a `SideSpec`, or None for a runtime that runs the ONNX file.
    #[getter]
    fn torch_target(&self) -> Option<SideSpec> {
        match &self.target {
            TargetSpec::Torch(_) => Some(SideSpec::of(&self.target)),
            TargetSpec::Onnx(_) | TargetSpec::Keras(_) => None,
        }
    }

    /// The target as the command line spells it (`ort:opt=all`, `torch:bf16`, `tflite`).
    #[getter]
    fn target_spelling(&self) -> String {
        self.target.spelling()
    }

    /// A Keras target (`xla`, `savedmodel`, `tflite…`) as a `SideSpec`, or None for a runtime
    /// that runs the ONNX file.
    #[getter]
    fn keras_target(&self) -> Option<SideSpec> {
        matches!(self.target, TargetSpec::Keras(_)).then(|| SideSpec::of(&self.target))
    }
}

/// A number or its text (`1e-4`, `"dtype"`, `4_000_000_000`, `"4G"`) as the command line would
/// spell it.
fn spelled(given: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(given.str()?.to_string())
}

/// A verb that needs PyTorch (`torch`, `grad`) as parsed from a command line.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
pub(crate) struct Command {
    /// The command line, as the reports record it.
    invocation: Invocation,
    /// Run by `reduce`: the repro's verdict is the exit code, and no reports are written.
    reducing: bool,
    /// Run by `reduce` on one point's report of an axis: that point (`prefill`, `1`…).
    point: Option<String>,
    model: String,
    seed: u64,
    pub(crate) report: ReportArgs,
    options: Options,
    /// `torch`: the export path and a file to use instead.
    exporter: Option<String>,
    onnx: Option<PathBuf>,
    /// `torch`: whether an export kept from an earlier run may be reused.
    cache: bool,
    /// `keras`: the opset tf2onnx converts to.
    opset: Option<u32>,
    /// `keras`: the PyTorch twin, its map of layer names, and whether to copy its weights.
    torch_twin: Option<String>,
    weight_map: Option<PathBuf>,
    copy_weights: bool,
    /// `grad`: the loss.
    loss: Option<String>,
    /// `torch`: the precision of the target (`fp16`, `bf16`, `int8`) and the layers kept in
    /// float32 in it.
    dtype: Option<String>,
    keep_fp32: Vec<String>,
    /// `torch`: whether to bisect what turns a PyTorch target's difference on.
    bisect: bool,
    /// `torch`: where to write the repro of the headline defect.
    repro: Option<PathBuf>,
    /// `torch`: the points of an axis: batch sizes, or each point's input shapes.
    batch_sizes: Vec<usize>,
    shapes: Vec<Vec<Vec<usize>>>,
    /// `torch`: the decode steps after the prefill (none: one forward pass).
    decode_steps: Option<usize>,
}

#[pymethods]
impl Command {
    /// The command line as one would type it (`layerdiff torch resnet18 --target torch:bf16`),
    /// as the reports record it: what a repro names.
    #[getter]
    fn invocation(&self) -> String {
        self.invocation.text()
    }
    /// Whether `layerdiff reduce` runs it: the repro's verdict is the exit code (0: written
    /// and checked), and no reports are written.
    #[getter]
    fn reducing(&self) -> bool {
        self.reducing
    }
    /// Run by `layerdiff reduce` on the report of one point of an axis: that point's label
    /// (`prefill`, `1`, a batch size), whose repro is cut; None: the first point with a
    /// headline defect.
    #[getter]
    fn point(&self) -> Option<String> {
        self.point.clone()
    }
    /// The model: a built-in name or a builder spec.
    #[getter]
    fn model(&self) -> String {
        self.model.clone()
    }
    /// Seed of the model's weights and of generated inputs.
    #[getter]
    pub(crate) fn seed(&self) -> u64 {
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
    /// `torch`: whether an export kept from an earlier run may be reused (not `--no-cache`).
    #[getter]
    fn cache(&self) -> bool {
        self.cache
    }
    /// `keras`: the opset tf2onnx converts to.
    #[getter]
    fn opset(&self) -> Option<u32> {
        self.opset
    }
    /// `keras`: the PyTorch twin's builder (or `twin`), or None.
    #[getter]
    fn torch_twin(&self) -> Option<String> {
        self.torch_twin.clone()
    }
    /// `keras`: the JSON file mapping Keras layer names to PyTorch module names.
    #[getter]
    fn weight_map(&self) -> Option<PathBuf> {
        self.weight_map.clone()
    }
    /// `keras`: whether the twin's weights are copied into the Keras model first.
    #[getter]
    fn copy_weights(&self) -> bool {
        self.copy_weights
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
    /// `torch`: whether to bisect what turns a PyTorch target's difference on (`--bisect`).
    #[getter]
    fn bisect(&self) -> bool {
        self.bisect
    }
    /// `torch`: the folder for the repro of the headline defect (`--repro`), or None.
    #[getter]
    fn repro(&self) -> Option<PathBuf> {
        self.repro.clone()
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
    /// `torch`: the decode steps after the prefill (None: one forward pass, no cache).
    #[getter]
    fn decode_steps(&self) -> Option<usize> {
        self.decode_steps
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
/// ([`layerdiff_args::dispatch`]). Returns `("exit", code)` when parsing or an engine verb
/// (run here with ONNX Runtime as the package chose it, the one the running interpreter has)
/// already did the work, or refused the options; else `("run", (verb, module, function,
/// framework, extra, command))`: the Python function the dispatch names for the verb, what it
/// needs installed (and the package extra that installs it), and its parsed command (None for
/// `zoo`).
#[pyfunction]
#[pyo3(signature = (argv))]
pub(crate) fn parse_cli(
    py: Python<'_>,
    argv: Vec<std::ffi::OsString>,
) -> PyResult<(String, Py<PyAny>)> {
    let exit = |code: u8| -> PyResult<(String, Py<PyAny>)> {
        Ok((
            "exit".to_string(),
            code.into_pyobject(py)?.into_any().unbind(),
        ))
    };
    // The engine's verbs run wholly in Rust, with the GIL released.
    let handed = match py.detach(|| layerdiff_args::dispatch(argv)) {
        Dispatched::Exit(code) => return exit(code),
        Dispatched::Python(handed) => handed,
    };
    let verb = handed.verb.name();
    let (module, function) = handed.verb.runner();
    let (framework, extra) = handed.verb.framework();
    let (invocation, reducing, point) = (handed.invocation, handed.reducing, handed.point);
    let made = |command: Result<Command, String>| -> PyResult<Result<Py<PyAny>, String>> {
        match command {
            Ok(command) => Ok(Ok(Py::new(py, command)?.into_any())),
            Err(why) => Ok(Err(why)),
        }
    };
    let command = match handed.verb {
        PythonVerb::Torch(a) => {
            made(Command::torch(a, invocation, reducing).map(|c| Command { point, ..c }))?
        }
        PythonVerb::Grad(a) => made(Command::grad(a, invocation, reducing))?,
        PythonVerb::Keras(a) => made(Command::keras(a, invocation))?,
        PythonVerb::Check(a) => Ok(Py::new(py, crate::check::CheckCommand::new(a))?.into_any()),
        PythonVerb::Ops(a) => Ok(Py::new(py, crate::ops::OpsCommand::new(a))?.into_any()),
        PythonVerb::Sweep(a) => Ok(Py::new(py, crate::sweep::SweepCommand::new(a))?.into_any()),
        PythonVerb::Zoo => Ok(py.None()),
    };
    let command = match command {
        Ok(command) => command,
        Err(why) => {
            eprintln!("error: {why}");
            return exit(2);
        }
    };
    let run = (verb, module, function, framework, extra, command);
    Ok((
        "run".to_string(),
        run.into_pyobject(py)?.into_any().unbind(),
    ))
}

impl Command {
    /// A command with `options` and nothing verb-specific yet.
    fn of(
        model: String,
        seed: u64,
        options: Options,
        report: ReportArgs,
        invocation: Invocation,
        reducing: bool,
    ) -> Self {
        Self {
            invocation,
            reducing,
            point: None,
            model,
            seed,
            options,
            report,
            exporter: None,
            onnx: None,
            cache: true,
            opset: None,
            torch_twin: None,
            weight_map: None,
            copy_weights: false,
            loss: None,
            dtype: None,
            keep_fp32: Vec::new(),
            bisect: false,
            repro: None,
            batch_sizes: Vec::new(),
            shapes: Vec::new(),
            decode_steps: None,
        }
    }

    /// `layerdiff torch`, or why its options do not fit together.
    fn torch(a: TorchArgs, invocation: Invocation, reducing: bool) -> Result<Self, String> {
        let (target, dtype) = a.dtype_target()?;
        let settings = a.judging.settings(true)?;
        let options = Options::checked(settings, a.reference, target)?;
        let mut command = Self::of(a.model, a.seed, options, a.report, invocation, reducing);
        command.dtype = dtype.map(|d| format!("{d:?}").to_lowercase());
        command.keep_fp32 = a.keep_fp32;
        command.bisect = a.bisect;
        command.repro = a.repro;
        command.batch_sizes = a.batch_sizes;
        command.shapes = a.shapes;
        command.decode_steps = a.decode_steps;
        command.exporter = Some(layerdiff_args::spelling(&a.exporter));
        command.onnx = a.onnx;
        command.cache = !a.no_cache;
        Ok(command)
    }

    /// `layerdiff grad`, or why its options do not fit together.
    fn grad(a: GradArgs, invocation: Invocation, reducing: bool) -> Result<Self, String> {
        a.check()?;
        let settings = a.judging.settings(true)?;
        let options = Options::checked(settings, a.reference, TargetSpec::Torch(a.target))?;
        let mut command = Self::of(a.model, a.seed, options, a.report, invocation, reducing);
        command.repro = a.repro;
        command.loss = Some(layerdiff_args::spelling(&a.loss));
        Ok(command)
    }

    /// `layerdiff keras`, or why its options do not fit together.
    fn keras(a: KerasArgs, invocation: Invocation) -> Result<Self, String> {
        a.check()?;
        let settings = a.judging.settings(true)?;
        let options = Options::checked(settings, TorchSpec::default(), a.target)?;
        let mut command = Self::of(a.model, a.seed, options, a.report, invocation, false);
        command.onnx = a.onnx;
        command.opset = Some(a.opset);
        command.torch_twin = a.torch;
        command.weight_map = a.weight_map;
        command.copy_weights = a.copy_weights;
        Ok(command)
    }

    /// The command line its outputs are made by.
    pub(crate) fn invocation_of(&self) -> &Invocation {
        &self.invocation
    }

    /// Where its outputs go, and the command line they are made by.
    pub(crate) fn destinations(&self) -> layerdiff_flow::output::Destinations {
        layerdiff_flow::output::Destinations {
            invocation: Some(self.invocation.clone()),
            ..self.report.destinations()
        }
    }
}

impl Options {
    /// The options of a parsed command line, or why the reference and the target do not fit
    /// together.
    fn checked(
        settings: Settings,
        reference: TorchSpec,
        target: TargetSpec,
    ) -> Result<Self, String> {
        check_options(&reference, &target).map_err(|e| layerdiff_flow::error_chain(&e))?;
        Ok(Self {
            settings,
            reference,
            target,
        })
    }
}
