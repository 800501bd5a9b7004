//! The command line: verbs and options, parsed into the engine's own types.
//!
//! The Python package owns the `torch` verb (PyTorch lives there) but not its parsing: it asks
//! [`parse`] for the options, so `--help`, errors and exit codes are the same from either door.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use layerdiff_core::{FailOn, Tolerance};
use layerdiff_flow::Settings;
use layerdiff_flow::audit::{AuditDestinations, AuditOptions};
use layerdiff_flow::inputs::InputPlan;
use layerdiff_flow::onnx_flow::OnnxOptions;
use layerdiff_flow::output::Destinations;
use layerdiff_flow::providers::{ProvidersDestinations, ProvidersOptions};
use layerdiff_flow::torch_side::{TorchSpec, TorchTarget};
use layerdiff_runtime::{OptLevel, Provider, RuntimeSpec};

/// layerdiff: find where numerical drift between two runtimes is born, and why.
#[derive(Debug, Parser)]
#[command(name = "layerdiff", version, max_term_width = 100)]
pub struct Cli {
    /// What to compare.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Compare a PyTorch model with its ONNX export under ONNX Runtime, layer by layer.
    ///
    /// Exit code 0: no layer exceeds its tolerance, or rounding only; 1: a defect (or drift with
    /// `--fail-on drift`); 2: layerdiff could not run.
    Torch(TorchArgs),
    /// Compare every intermediate value of an ONNX model between two runtimes, or two model files.
    ///
    /// Exit code 0: no value exceeds its tolerance, or rounding only; 1: a defect (or drift with
    /// `--fail-on drift`); 2: layerdiff could not run.
    Onnx(OnnxArgs),
    /// Run one ONNX model on every execution provider and optimization level, each against the
    /// CPU provider with optimizations off, per layer: one table, one verdict per cell.
    ///
    /// Exit code 0: every cell that ran is clean or rounding only; 1: a cell has a defect (or
    /// drifts, with `--fail-on drift`); 2: none could run.
    Providers(ProvidersArgs),
    /// List the ops an ONNX model uses and, for each runtime, whether it can run each one
    /// (tried as a single-node model with the model's own shapes and dtypes).
    ///
    /// Exit code 0: every runtime runs every op; 1: one does not; 2: layerdiff could not audit.
    Audit(AuditArgs),
    /// Compare a PyTorch model's gradients (of every parameter, input and module call's input,
    /// in backward order) on another device, precision or compiler against the model as given;
    /// each module's backward is also re-run alone, so every gradient has its own error.
    ///
    /// Exit code 0: no gradient exceeds its tolerance, or rounding only; 1: a defect (or drift
    /// with `--fail-on drift`); 2: layerdiff could not run.
    Grad(GradArgs),
    /// Run single ops (matmul, softmax, conv2d, attention…) on each backend and dtype, each
    /// judged against a float64 computation of the op on the same rounded inputs with the error
    /// the dtype and the op's reduction length predict: one matrix, one verdict per cell.
    ///
    /// Exit code 0: every cell that ran passes; 1: a cell fails or broke; 2: layerdiff could not
    /// run.
    Ops(OpsArgs),
    /// Check a PyTorch model's final outputs against its ONNX export on a runtime: allclose with
    /// `--atol`/`--rtol`, the largest errors and the worst element, in seconds. The first thing
    /// to run; `layerdiff torch` then shows where a difference is born.
    ///
    /// Exit code 0: every output within the bound; 1: one is not; 2: layerdiff could not run.
    Check(CheckArgs),
    /// List the built-in models (`layerdiff torch NAME`), their parameter counts and what each
    /// exercises, and the models installed packages register.
    Zoo,
}

/// Options of `layerdiff check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// A built-in model or a builder, as for `layerdiff torch`.
    pub model: String,
    /// The runtime that runs the ONNX file: `ort` (CPU), `ort:opt=all`, `ort:cuda`…, `tract`.
    #[arg(long, default_value = "ort", value_parser = RuntimeSpec::parse)]
    pub target: RuntimeSpec,
    /// Check this ONNX file of the same model instead of exporting one.
    #[arg(long, value_name = "PATH")]
    pub onnx: Option<PathBuf>,
    /// Which `torch.onnx.export` path produces the ONNX file.
    #[arg(long, value_enum, default_value_t = Exporter::Dynamo)]
    pub exporter: Exporter,
    /// Absolute term of the bound `atol + rtol·|reference|`.
    #[arg(long, default_value_t = 1e-4)]
    pub atol: f64,
    /// Relative term of the bound.
    #[arg(long, default_value_t = 1e-5)]
    pub rtol: f64,
    /// Seed for the model's random weights and the generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the check as JSON here (schema `layerdiff.check/1`).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Print nothing but errors; the exit code still tells the verdict.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Options of `layerdiff ops`.
#[derive(Debug, Clone, Args)]
pub struct OpsArgs {
    /// The ops to run (comma-separated case names, `*` wildcards: `matmul,conv*`). Default: all;
    /// `--list` names them.
    #[arg(long, value_delimiter = ',', value_name = "NAME,…")]
    pub ops: Vec<String>,
    /// The backends (comma-separated): `torch[:DEVICE][:compile]` (PyTorch eager or compiled on
    /// a device: `torch`, `torch:compile`, `torch:cuda`), ONNX Runtime spelled as for `layerdiff
    /// onnx` (`ort`, `ort:opt=all`, `ort:cuda`), `tract`, `openvino`. Default: torch, torch:compile, ort,
    /// ort:opt=all and tract, with the GPU PyTorch and ONNX Runtime providers this machine has.
    #[arg(long, value_delimiter = ',', value_name = "BACKEND,…")]
    pub backends: Vec<String>,
    /// The dtypes each op is computed in (comma-separated: float32, float16, bfloat16; or fp32,
    /// fp16, bf16).
    #[arg(long, value_delimiter = ',', value_name = "DTYPE,…", value_parser = op_dtype, default_value = "float32,float16,bfloat16")]
    pub dtypes: Vec<String>,
    /// ONNX opset of the single-op models the ONNX backends run.
    #[arg(long, default_value_t = 18)]
    pub opset: i64,
    /// Which `torch.onnx.export` path makes the single-op models.
    #[arg(long, value_enum, default_value_t = Exporter::Dynamo)]
    pub exporter: Exporter,
    /// Seed of every case's inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Cells run at once, each in its own process (default: the logical cores; 1: in this
    /// process, one after another).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Where the cells run: `local` (processes on this machine) or `ray` (one Ray task per
    /// cell, on the cluster `RAY_ADDRESS` names, else a local Ray instance; needs
    /// `pip install 'layerdiff[ray]'`).
    #[arg(long, value_enum, default_value_t = Executor::Local)]
    pub executor: Executor,
    /// Name the cases and the backends this machine has, and exit.
    #[arg(long)]
    pub list: bool,
    /// Write the HTML matrix here (`--out DIR`: also ops.html).
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,
    /// Where the matrix goes (`--out DIR`: ops.json, ops.md and ops.html).
    #[command(flatten)]
    pub table: TableArgs,
}

/// Where `layerdiff ops` runs its cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Executor {
    /// Processes on this machine.
    Local,
    /// Ray tasks.
    Ray,
}

fn op_dtype(s: &str) -> Result<String, String> {
    Ok(match s {
        "float32" | "fp32" => "float32",
        "float16" | "fp16" | "half" => "float16",
        "bfloat16" | "bf16" => "bfloat16",
        _ => {
            return Err(format!(
                "unknown dtype `{s}` (expected float32, float16 or bfloat16)"
            ));
        }
    }
    .to_string())
}

impl OpsArgs {
    /// Where the matrix goes.
    pub fn destinations(&self) -> layerdiff_flow::ops::OpsDestinations {
        let (json, markdown) = self.table.paths("ops");
        let html = self.table.out.as_ref().map(|d| d.join("ops.html"));
        layerdiff_flow::ops::OpsDestinations {
            json,
            markdown,
            html: self.html.clone().or(html),
            quiet: self.table.quiet,
        }
    }
}

/// Options of `layerdiff grad`.
#[derive(Debug, Clone, Args)]
pub struct GradArgs {
    /// A built-in model or a builder, as for `layerdiff torch`.
    pub model: String,
    /// The PyTorch side whose gradients are measured: `torch[:DEVICE][:PRECISION][:compile]`
    /// (`torch:cuda`, `torch:bf16`, `torch:amp-fp16`, `torch:compile`). In float16 (`fp16`,
    /// `amp-fp16`) the loss is scaled as `torch.amp.GradScaler` does and the gradients unscaled
    /// before they are compared: what the optimizer would see.
    #[arg(long, value_parser = TorchSpec::parse)]
    pub target: TorchSpec,
    /// The PyTorch side it is measured against (default `torch`: CPU, float32, eager).
    #[arg(long, default_value = "torch", value_parser = TorchSpec::parse)]
    pub reference: TorchSpec,
    /// The loss both sides differentiate: `dot` (the output's dot product with a fixed random
    /// tensor from the seed, so every output element gets its own gradient) or `sum`.
    #[arg(long, value_enum, default_value_t = Loss::Dot)]
    pub loss: Loss,
    /// Tolerance, judged per element, as for `layerdiff torch` (`auto`: 4× the reference's own
    /// distance from a float64 run's gradients).
    #[arg(long, default_value = "dtype", value_parser = Tolerance::parse)]
    pub tolerance: Tolerance,
    /// Skip the float64 runs: the numerical truth both sides are measured against, and each
    /// module's backward made exactly on the reference's values rounded to the target's dtype
    /// (the same-precision baseline its own error is judged against).
    #[arg(long)]
    pub no_float64: bool,
    /// Skip re-running each module call's backward alone on the reference's values (its own
    /// error): faster, but the origin is then the first gradient that exceeds.
    #[arg(long)]
    pub no_local: bool,
    /// Seed for the model's random weights, generated inputs and the `dot` loss's tensor.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where reports go.
    #[command(flatten)]
    pub report: ReportArgs,
}

/// The loss `layerdiff grad` differentiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Loss {
    /// The output's dot product with a fixed random tensor.
    Dot,
    /// The sum of the output.
    Sum,
}

/// How the inputs of an ONNX model are made: generated from a seed, or read from a file.
#[derive(Debug, Clone, Args)]
pub struct InputArgs {
    /// Seed of the generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Shape of one input, for dynamic dimensions: `--shape input_ids=1,128` (repeatable).
    #[arg(long, value_name = "NAME=D,D,…", value_parser = shape_spec)]
    pub shape: Vec<(String, Vec<usize>)>,
    /// Size of dynamic leading (batch) dimensions.
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Inclusive range of generated integer inputs (token ids, indices).
    #[arg(long, value_name = "LO,HI", default_value = "0,9", value_parser = int_range)]
    pub int_range: (i64, i64),
    /// Read the inputs from a file instead of generating them: safetensors, .npz, or an ONNX test
    /// data folder (input_0.pb, …).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["shape", "batch"])]
    pub inputs: Option<PathBuf>,
}

impl InputArgs {
    /// How inputs are generated.
    pub fn plan(&self) -> InputPlan {
        InputPlan {
            seed: self.seed,
            shapes: self.shape.clone(),
            batch: self.batch,
            int_range: self.int_range,
        }
    }
}

/// Options of `layerdiff providers`.
#[derive(Debug, Clone, Args)]
pub struct ProvidersArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// Execution providers to try (comma-separated: cpu, cuda, tensorrt, rocm, openvino,
    /// coreml, directml). Default: all of them; those this ONNX Runtime or machine cannot use
    /// are listed with the reason.
    #[arg(long, value_delimiter = ',', value_parser = provider)]
    pub providers: Vec<Provider>,
    /// Graph optimization levels to try each provider at (comma-separated: disable, basic,
    /// extended, all). Default: all four.
    #[arg(long, value_delimiter = ',', value_parser = level)]
    pub levels: Vec<OptLevel>,
    /// Other runtimes to measure beside ONNX Runtime's providers, a cell each (comma-separated,
    /// spelled as for `layerdiff onnx`: `tract`, `openvino`, `openvino:precision=bf16`).
    #[arg(long, value_delimiter = ',', value_parser = RuntimeSpec::parse)]
    pub runtimes: Vec<RuntimeSpec>,
    /// The inputs, the same for every cell.
    #[command(flatten)]
    pub input: InputArgs,
    /// Tolerance, as for `layerdiff onnx`.
    #[arg(long, default_value = "dtype", value_parser = Tolerance::parse)]
    pub tolerance: Tolerance,
    /// Also run the whole reference graph in float64 in each cell (implied by `--tolerance
    /// auto`).
    #[arg(long, conflicts_with = "no_float64")]
    pub float64: bool,
    /// Skip every float64 computation in each cell: the same-precision baseline (each node's
    /// own error is then `undecided` between rounding and a defect) and the truth.
    #[arg(long)]
    pub no_float64: bool,
    /// Skip the local error in each cell.
    #[arg(long)]
    pub no_local: bool,
    /// When the run exits 1: `defect` (the default: a cell has a defect, an undecided layer,
    /// layers that could not be paired, or values that overflow; rounding alone exits 0) or
    /// `drift` (a cell with any layer beyond its tolerance, rounding included).
    #[arg(long, value_name = "WHEN", default_value = "defect", value_parser = FailOn::parse)]
    pub fail_on: FailOn,
    /// Where the table goes (`--out DIR`: providers.json, providers.md and each cell's whole
    /// report under cells/).
    #[command(flatten)]
    pub table: TableArgs,
}

fn provider(s: &str) -> Result<Provider, String> {
    Provider::ALL
        .into_iter()
        .find(|p| p.spelling() == s)
        .ok_or_else(|| format!("unknown execution provider `{s}`"))
}

fn level(s: &str) -> Result<OptLevel, String> {
    [
        OptLevel::Disable,
        OptLevel::Basic,
        OptLevel::Extended,
        OptLevel::All,
    ]
    .into_iter()
    .find(|l| l.name() == s)
    .ok_or_else(|| format!("unknown optimization level `{s}`"))
}

impl ProvidersArgs {
    /// The options, as the engine takes them.
    pub fn options(&self) -> ProvidersOptions {
        let or_all = |given: &Vec<OptLevel>| {
            if given.is_empty() {
                vec![
                    OptLevel::Disable,
                    OptLevel::Basic,
                    OptLevel::Extended,
                    OptLevel::All,
                ]
            } else {
                given.clone()
            }
        };
        ProvidersOptions {
            model: self.model.clone(),
            providers: if self.providers.is_empty() {
                Provider::ALL.to_vec()
            } else {
                self.providers.clone()
            },
            levels: or_all(&self.levels),
            runtimes: self.runtimes.clone(),
            inputs: self.input.inputs.clone(),
            generate: self.input.plan(),
            settings: Settings {
                tolerance: self.tolerance,
                local: !self.no_local,
                max_memory: None,
            },
            float64: self.float64 || self.tolerance == Tolerance::Auto,
            baseline: !self.no_float64,
            fail_on: self.fail_on,
        }
    }

    /// Where the table goes.
    pub fn destinations(&self) -> ProvidersDestinations {
        let (json, markdown) = self.table.paths("providers");
        ProvidersDestinations {
            json,
            markdown,
            cells: self.table.out.as_ref().map(|d| d.join("cells")),
            quiet: self.table.quiet,
        }
    }
}

/// Where a table (`providers`, `audit`, `ops`) goes.
#[derive(Debug, Clone, Args)]
pub struct TableArgs {
    /// Write the verb's files into this folder (NAME.json, NAME.md).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Write the JSON here.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write the Markdown here.
    #[arg(long, value_name = "PATH")]
    pub markdown: Option<PathBuf>,
    /// Print nothing but errors; the exit code still tells the verdict.
    #[arg(long, short)]
    pub quiet: bool,
}

impl TableArgs {
    /// The JSON and Markdown paths: given, else `--out`/NAME.json and NAME.md.
    fn paths(&self, name: &str) -> (Option<PathBuf>, Option<PathBuf>) {
        let under = |ext: &str| self.out.as_ref().map(|d| d.join(format!("{name}.{ext}")));
        (
            self.json.clone().or_else(|| under("json")),
            self.markdown.clone().or_else(|| under("md")),
        )
    }
}

/// Options of `layerdiff audit`.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// The runtimes to try each op on (comma-separated, spelled as for `layerdiff onnx`:
    /// `ort`, `ort:cuda`, `tract`…).
    #[arg(long, value_delimiter = ',', default_value = "ort,tract", value_parser = RuntimeSpec::parse)]
    pub runtimes: Vec<RuntimeSpec>,
    /// The inputs of the run that gives each op the values it reads.
    #[command(flatten)]
    pub input: InputArgs,
    /// Where the audit goes (`--out DIR`: audit.json and audit.md).
    #[command(flatten)]
    pub table: TableArgs,
}

impl AuditArgs {
    /// The options, as the engine takes them.
    pub fn options(&self) -> AuditOptions {
        AuditOptions {
            model: self.model.clone(),
            runtimes: self.runtimes.clone(),
            inputs: self.input.inputs.clone(),
            generate: self.input.plan(),
        }
    }

    /// Where the audit goes.
    pub fn destinations(&self) -> AuditDestinations {
        let (json, markdown) = self.table.paths("audit");
        AuditDestinations {
            json,
            markdown,
            quiet: self.table.quiet,
        }
    }
}

/// Options of `layerdiff onnx`.
#[derive(Debug, Clone, Args)]
pub struct OnnxArgs {
    /// The reference ONNX model.
    pub model: PathBuf,
    /// Compare against this second model file (same inputs), e.g. before and after an optimizer.
    #[arg(long, value_name = "OTHER.onnx")]
    pub vs: Option<PathBuf>,
    /// Runtime of the reference side: `ort` (CPU, optimizations off), `ort:cuda`,
    /// `ort:opt=basic|extended|all`, combinations (`ort:cuda:opt=all`), a provider's options in
    /// ONNX Runtime's names (`ort:cuda:use_tf32=0`), `tract`, `openvino` (OpenVINO's CPU plugin;
    /// `openvino:precision=f16|bf16` hints its inference precision), or `expected:PATH` (values from a
    /// safetensors file or an ONNX test_data_set folder).
    #[arg(long, default_value = "ort", value_parser = RuntimeSpec::parse)]
    pub reference: RuntimeSpec,
    /// Runtime of the target side (same spellings). Default: `tract`, or `ort` with --vs. With
    /// `opt=…`, ONNX Runtime optimizes the file first and the values of the graph it saved are
    /// compared, so the graph measured is the one that ships.
    #[arg(long, value_parser = RuntimeSpec::parse)]
    pub target: Option<RuntimeSpec>,
    /// The inputs.
    #[command(flatten)]
    pub input: InputArgs,
    /// Tolerance, judged per element (exceeded when an element's difference is strictly
    /// greater): a number for every element, `dtype` (the default, by the lower-precision side:
    /// atol + rtol·|x| with float32 1e-4 + 1e-5, float16 5e-4 + 1e-3, bfloat16 4e-3 + 8e-3, so
    /// rounding is judged at each value's magnitude), or `auto` (4× the reference's own
    /// distance from the float64 run, per value; runs it, see --float64).
    #[arg(long, default_value = "dtype", value_parser = Tolerance::parse)]
    pub tolerance: Tolerance,
    /// Also run the whole reference graph in float64 (ONNX Runtime on the CPU, or tract where
    /// ONNX Runtime has no float64 kernel) as the numerical truth: each value gets both sides'
    /// distance from it. Implied by `--tolerance auto`.
    #[arg(long, conflicts_with = "no_float64")]
    pub float64: bool,
    /// Skip every float64 computation: the same-precision baseline each node's own error is
    /// judged against (the reference's node in float64 on its inputs rounded to the target's
    /// dtype), and the truth. Without it, an exceeding node is `undecided` between rounding and
    /// a defect.
    #[arg(long)]
    pub no_float64: bool,
    /// Skip the local error (re-running each node on the reference's inputs): faster on large
    /// models, but the drift origin is then the first value whose accumulated error exceeds.
    #[arg(long)]
    pub no_local: bool,
    /// The most memory the intermediate values may take at once (`4G`, `512M`): the graph then
    /// runs in segments, each value compared as soon as both sides have it and dropped after its
    /// last use. Default: half the memory available at start. The numbers do not depend on it.
    #[arg(long, value_name = "SIZE", value_parser = layerdiff_flow::memory::parse_memory)]
    pub max_memory: Option<u64>,
    /// Where reports go.
    #[command(flatten)]
    pub report: ReportArgs,
}

fn shape_spec(s: &str) -> Result<(String, Vec<usize>), String> {
    let (name, dims) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not NAME=D,D,… (e.g. x=1,3,224,224)"))?;
    let dims = dims
        .split(',')
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{d}` in `{s}` is not a dimension size"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_string(), dims))
}

fn int_range(s: &str) -> Result<(i64, i64), String> {
    let parsed = s
        .split_once(',')
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
    match parsed {
        Some((lo, hi)) if lo <= hi => Ok((lo, hi)),
        _ => Err(format!("`{s}` is not LO,HI with LO <= HI")),
    }
}

/// Options of `layerdiff torch`.
#[derive(Debug, Clone, Args)]
pub struct TorchArgs {
    /// A built-in model (`layerdiff zoo` lists them: `resnet18`, `vit_b_16`, `llama`, `t5`…),
    /// one an installed package registers, or a builder: `path/to/file.py:build` or
    /// `package.module:build`, where `build()` returns
    /// `(model, example_inputs)`.
    pub model: String,
    /// Tolerance, judged per element (exceeded when an element's difference is strictly
    /// greater): a number for every element, `dtype` (the default, by the lower-precision side:
    /// atol + rtol·|x| with float32 1e-4 + 1e-5, float16 5e-4 + 1e-3, bfloat16 4e-3 + 8e-3), or
    /// `auto` (4× PyTorch's own distance from a float64 run of the model, per layer).
    #[arg(long, default_value = "dtype", value_parser = Tolerance::parse)]
    pub tolerance: Tolerance,
    /// Skip the local error (re-running each layer's ONNX nodes on PyTorch's inputs).
    #[arg(long)]
    pub no_local: bool,
    /// Skip the float64 run of the model (the numerical truth both sides are measured against).
    #[arg(long)]
    pub no_float64: bool,
    /// Seed for the model's random weights and for generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Which `torch.onnx.export` path produces the ONNX file.
    #[arg(long, value_enum, default_value_t = Exporter::Dynamo)]
    pub exporter: Exporter,
    /// Compare against this ONNX file of the same model instead of exporting one.
    #[arg(long, value_name = "PATH")]
    pub onnx: Option<PathBuf>,
    /// What the model is compared with. The runtime that runs its ONNX file: `ort` (CPU, graph
    /// optimizations off, so every value exists as written), `ort:opt=basic|extended|all`
    /// (optimized first: the values of the graph ONNX Runtime saved are compared), `ort:cuda`…
    /// (`ort:cuda:use_tf32=0`: a provider's options in ONNX Runtime's names), `tract`, or
    /// `openvino[:precision=f32|f16|bf16]` (OpenVINO's CPU plugin). Or
    /// PyTorch itself computing differently, layer by layer:
    /// `torch[:DEVICE][:PRECISION][:compile[=BACKEND]]`, DEVICE as torch.device takes it (`cpu`,
    /// `cuda`, `cuda:1`, `mps`), PRECISION one of `fp32`, `tf32`, `fp16`, `bf16`, `amp-fp16`,
    /// `amp-bf16` (e.g. `torch:cuda:bf16`, `torch:compile`).
    #[arg(long, default_value = "ort", value_parser = TorchTarget::parse)]
    pub target: TorchTarget,
    /// The PyTorch side the target is measured against, spelled as a PyTorch --target
    /// (`torch:cuda`); default `torch`, the model as given: CPU, float32, eager. Other than
    /// `torch` only with a PyTorch target.
    #[arg(long, default_value = "torch", value_parser = TorchSpec::parse)]
    pub reference: TorchSpec,
    /// The most memory our copies of the layers' values may take at once (`4G`, `512M`): the
    /// ONNX run then goes in segments, each fed from PyTorch's hooks as the forward pass
    /// reaches it, and each value is dropped after its last use. Default: half the memory
    /// available at start. The numbers do not depend on it.
    #[arg(long, value_name = "SIZE", value_parser = layerdiff_flow::memory::parse_memory)]
    pub max_memory: Option<u64>,
    /// The precision the target computes in, against the float32 model. With an ONNX runtime
    /// target, `fp16` converts the export with ONNX Runtime's float16 converter (inputs and
    /// outputs kept float32) and `int8` quantizes it with ONNX Runtime's static QDQ quantizer,
    /// calibrated on the inputs and variations of them; with a PyTorch target, `fp16` and `bf16`
    /// are its PRECISION (`--target torch --dtype bf16` is `torch:bf16`). When the target
    /// drifts, the report names the layers to keep in float32 and checks that advice by
    /// re-running with them kept.
    #[arg(long, value_enum)]
    pub dtype: Option<TargetDtype>,
    /// Layers to keep in float32 in a lower-precision target (`--dtype`, or a PyTorch target in
    /// fp16 or bf16, cast or under autocast), comma-separated, named as in the report; the run
    /// is checked against the same target without them kept.
    #[arg(long, value_delimiter = ',', value_name = "LAYERS")]
    pub keep_fp32: Vec<String>,
    /// Compare at each of these batch sizes (`1,8,32`): the model is exported once with a
    /// dynamic batch dimension and checked at each, with inputs generated like the example's;
    /// the axis report says which sizes drift and which layers pass at one size and fail at
    /// another (`--out`: axis.json, axis.md, and each size's reports in batch-N/).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "SIZES",
        value_parser = positive,
        conflicts_with = "shapes"
    )]
    pub batch_sizes: Vec<usize>,
    /// Compare at these input shapes, one `--shapes` per point: each input's shape, the inputs
    /// separated by commas (`--shapes 1x3x224x224 --shapes 4x3x160x160`; two inputs:
    /// `2x128,2x128`). The dimensions that differ are exported dynamic.
    #[arg(long, value_name = "SHAPES", value_parser = parse_shapes)]
    pub shapes: Vec<Vec<Vec<usize>>>,
    /// Where reports go.
    #[command(flatten)]
    pub report: ReportArgs,
}

/// A count above zero.
fn positive(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{text}` is not a size above zero")),
    }
}

/// The shapes of one point: each input's dimensions joined by `x`, inputs by commas.
fn parse_shapes(text: &str) -> Result<Vec<Vec<usize>>, String> {
    text.split(',')
        .map(|shape| {
            shape
                .trim()
                .split('x')
                .map(positive)
                .collect::<Result<Vec<usize>, String>>()
                .map_err(|_| format!("`{shape}` is not a shape such as 1x3x224x224"))
        })
        .collect()
}

/// The precision a lower-precision target computes in (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetDtype {
    /// float16.
    Fp16,
    /// bfloat16 (a PyTorch target).
    Bf16,
    /// int8, quantized with ONNX Runtime's static QDQ quantizer (an ONNX runtime target).
    Int8,
}

impl TargetDtype {
    /// Its name as a dtype (`float16`, `bfloat16`, `int8`).
    pub fn dtype_name(self) -> &'static str {
        match self {
            Self::Fp16 => "float16",
            Self::Bf16 => "bfloat16",
            Self::Int8 => "int8",
        }
    }
}

/// Report options shared by every verb.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Write report.json, report.md, report.html, report.svg (the error chart),
    /// report.node-data.json (Model Explorer) and report.inputs.safetensors into this folder
    /// (and, for `torch`, the exported model.onnx).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Write the JSON report here (the inputs are saved beside it as NAME.inputs.safetensors).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write the Markdown report here.
    #[arg(long, value_name = "PATH")]
    pub markdown: Option<PathBuf>,
    /// Write the HTML report here: one self-contained page (summary, error chart, sortable
    /// per-layer table, causes) that opens offline.
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,
    /// Write the error chart here, as SVG (each layer's error against its tolerance, log scale,
    /// the drift origin marked): for READMEs and issue trackers.
    #[arg(long, value_name = "PATH")]
    pub svg: Option<PathBuf>,
    /// Write each ONNX node's own error (its layer's error as a multiple of the tolerance) as
    /// Model Explorer node data, to colour the graph by where error is born
    /// (`onnxvis model.onnx --node_data_paths=PATH`).
    #[arg(long, value_name = "PATH")]
    pub node_data: Option<PathBuf>,
    /// Print nothing but errors; the exit code still tells the verdict.
    #[arg(long, short)]
    pub quiet: bool,
    /// When the run exits 1: `defect` (the default: a layer computes something its precision
    /// does not explain, a layer exceeds and nothing tells rounding from a defect, part of the
    /// model could not be paired, or values overflow the target's dtype; rounding alone exits
    /// 0) or `drift` (any layer beyond its tolerance, rounding included).
    #[arg(long, value_name = "WHEN", default_value = "defect", value_parser = FailOn::parse)]
    pub fail_on: FailOn,
    /// Print where the time went, phase by phase (stderr), and add it to the JSON report (times
    /// vary from run to run, so they are left out of the JSON otherwise).
    #[arg(long)]
    pub timings: bool,
}

impl ReportArgs {
    /// The JSON report's path: `--json`, else `--out`/report.json.
    pub fn json_path(&self) -> Option<PathBuf> {
        self.json
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.json")))
    }

    /// The Markdown report's path: `--markdown`, else `--out`/report.md.
    pub fn markdown_path(&self) -> Option<PathBuf> {
        self.markdown
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.md")))
    }

    /// The HTML report's path: `--html`, else `--out`/report.html.
    pub fn html_path(&self) -> Option<PathBuf> {
        self.html
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.html")))
    }

    /// The node data's path: `--node-data`, else `--out`/report.node-data.json.
    pub fn node_data_path(&self) -> Option<PathBuf> {
        self.node_data
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.node-data.json")))
    }

    /// The chart's path: `--svg`, else `--out`/report.svg.
    pub fn svg_path(&self) -> Option<PathBuf> {
        self.svg
            .clone()
            .or_else(|| self.out.as_ref().map(|d| d.join("report.svg")))
    }

    /// Where the inputs are saved: beside the JSON report, as `NAME.inputs.safetensors`.
    pub fn inputs_path(&self) -> Option<PathBuf> {
        let json = self.json_path()?;
        let stem = json
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Some(json.with_file_name(format!("{stem}.inputs.safetensors")))
    }
}

/// Export paths of `torch.onnx.export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Exporter {
    /// `dynamo=True`, the default exporter.
    Dynamo,
    /// `dynamo=False`, the TorchScript-based exporter.
    Legacy,
}

/// The result of parsing a command line.
#[derive(Debug)]
pub enum Parsed {
    /// Run `torch` with these options (the caller owns PyTorch).
    Torch(TorchArgs),
    /// Run `onnx` with these options ([`run_onnx`]).
    Onnx(OnnxArgs),
    /// Run `grad` with these options (the caller owns PyTorch).
    Grad(GradArgs),
    /// Run `providers` with these options.
    Providers(ProvidersArgs),
    /// Run `audit` with these options.
    Audit(AuditArgs),
    /// Run `ops` with these options (the caller owns PyTorch).
    Ops(OpsArgs),
    /// List the model zoo (the caller owns PyTorch).
    Zoo,
    /// Run `check` with these options (the caller owns PyTorch).
    Check(CheckArgs),
    /// Parsing already did everything (help, version, a usage error): exit with this code.
    Exit(u8),
}

/// Parses `argv` (program name first). Help and usage errors are printed here.
pub fn parse(argv: Vec<OsString>) -> Parsed {
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Torch(args),
        }) => Parsed::Torch(args),
        Ok(Cli {
            command: Command::Onnx(args),
        }) => Parsed::Onnx(args),
        Ok(Cli {
            command: Command::Grad(args),
        }) => Parsed::Grad(args),
        Ok(Cli {
            command: Command::Providers(args),
        }) => Parsed::Providers(args),
        Ok(Cli {
            command: Command::Audit(args),
        }) => Parsed::Audit(args),
        Ok(Cli {
            command: Command::Ops(args),
        }) => Parsed::Ops(args),
        Ok(Cli {
            command: Command::Zoo,
        }) => Parsed::Zoo,
        Ok(Cli {
            command: Command::Check(args),
        }) => Parsed::Check(args),
        Err(err) => {
            let _ = err.print();
            Parsed::Exit(if err.use_stderr() { 2 } else { 0 })
        }
    }
}

impl ReportArgs {
    /// Where the run's outputs go, and what is printed.
    pub fn destinations(&self) -> Destinations {
        Destinations {
            json: self.json_path(),
            markdown: self.markdown_path(),
            html: self.html_path(),
            svg: self.svg_path(),
            node_data: self.node_data_path(),
            inputs: self.inputs_path(),
            quiet: self.quiet,
            timings: self.timings,
            fail_on: self.fail_on,
        }
    }
}

impl OnnxArgs {
    /// The options, as the engine takes them.
    pub fn options(&self) -> OnnxOptions {
        OnnxOptions {
            model: self.model.clone(),
            vs: self.vs.clone(),
            reference: self.reference.clone(),
            target: self.target.clone(),
            inputs: self.input.inputs.clone(),
            generate: self.input.plan(),
            settings: Settings {
                tolerance: self.tolerance,
                local: !self.no_local,
                max_memory: self.max_memory,
            },
            float64: self.float64,
            baseline: !self.no_float64,
        }
    }
}

impl GradArgs {
    /// Tolerance, own error and memory budget, as the engine takes them.
    pub fn settings(&self) -> Settings {
        Settings {
            tolerance: self.tolerance,
            local: !self.no_local,
            max_memory: None,
        }
    }
}

impl TorchArgs {
    /// The target with `--dtype` applied: a PyTorch target computes in it; an ONNX runtime
    /// target keeps its spelling and its file is converted (the dtype is returned for that).
    /// Errors where the two do not fit together.
    pub fn dtype_target(&self) -> Result<(TorchTarget, Option<TargetDtype>), String> {
        use layerdiff_flow::torch_side::Precision;
        let Some(dtype) = self.dtype else {
            let lower_torch = matches!(
                &self.target,
                TorchTarget::Torch(spec) if matches!(
                    spec.precision,
                    Precision::Fp16 | Precision::Bf16 | Precision::AmpFp16 | Precision::AmpBf16
                )
            );
            if !self.keep_fp32.is_empty() && !lower_torch {
                return Err("--keep-fp32 keeps layers of a lower-precision target in float32: give --dtype fp16, bf16 or int8, or a PyTorch target in fp16 or bf16 (cast or autocast)".to_string());
            }
            return Ok((self.target.clone(), None));
        };
        match &self.target {
            TorchTarget::Torch(spec) => {
                let wanted = match dtype {
                    TargetDtype::Fp16 => Precision::Fp16,
                    TargetDtype::Bf16 => Precision::Bf16,
                    TargetDtype::Int8 => {
                        return Err(format!(
                            "--dtype int8 quantizes the ONNX export with ONNX Runtime; the target `{}` is PyTorch itself (give --target ort)",
                            spec.spelling()
                        ));
                    }
                };
                if spec.precision != Precision::Fp32 && spec.precision != wanted {
                    return Err(format!(
                        "--dtype {} and the target `{}` name two precisions: give one",
                        dtype.dtype_name(),
                        spec.spelling()
                    ));
                }
                let mut spec = spec.clone();
                spec.precision = wanted;
                Ok((TorchTarget::Torch(spec), Some(dtype)))
            }
            TorchTarget::Onnx(runtime) if dtype == TargetDtype::Bf16 => Err(format!(
                "--dtype bf16: ONNX Runtime has no bfloat16 conversion of a model (and few bfloat16 kernels); compare PyTorch in bfloat16 with `--target torch --dtype bf16`, or give --dtype fp16 for `{}`",
                runtime.spelling()
            )),
            TorchTarget::Onnx(_) => Ok((self.target.clone(), Some(dtype))),
        }
    }

    /// Tolerance, local error and memory budget, as the engine takes them.
    pub fn settings(&self) -> Settings {
        Settings {
            tolerance: self.tolerance,
            local: !self.no_local,
            max_memory: self.max_memory,
        }
    }
}
