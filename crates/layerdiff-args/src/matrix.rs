//! The options of the matrix verbs (`ops`, `providers`, `audit`) and of `check`.

use super::{
    Args, AuditOptions, Destinations, Exporter, FailOn, InputArgs, Isolation, Judging, OnnxSide,
    OptLevel, PathBuf, Provider, ProvidersOptions, RuntimeSpec, ValueEnum,
};
/// Options of `layerdiff check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// A built-in model, a builder or a checkpoint folder, as for `layerdiff torch`.
    pub model: String,
    /// The runtime that runs the ONNX file: `ort` (CPU), `ort:opt=all`, `ort:cuda`…, `tract`.
    #[arg(long, default_value = "ort", value_parser = OnnxSide::runtime_only)]
    pub target: RuntimeSpec,
    /// Check this ONNX file of the same model instead of exporting one; it is also read against
    /// the model's own export, and a weight, constant or attribute that differs fails the check.
    #[arg(long, value_name = "PATH")]
    pub onnx: Option<PathBuf>,
    /// Which `torch.onnx.export` path produces the ONNX file.
    #[arg(long, value_enum, default_value_t = Exporter::Dynamo)]
    pub exporter: Exporter,
    /// Export anew instead of reusing an export of the same model kept from an earlier run
    /// (exports are kept in `LAYERDIFF_CACHE_DIR`, else `~/.cache/layerdiff`, keyed by the
    /// weights, the model's code, the inputs, the exporter and its versions).
    #[arg(long)]
    pub no_cache: bool,
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
    /// onnx` (`ort`, `ort:opt=all`, `ort:cuda`), `tract`, `openvino`, TensorFlow eager (`tf`)
    /// and under XLA (`xla`); `torch[:DEVICE]:ddp=N` runs the collectives (all_reduce,
    /// reduce_scatter, all_gather, broadcast) across N processes (gloo; NCCL on CUDA). Default:
    /// torch, torch:compile and torch:ddp=2, each ONNX runtime's own that starts here (ort,
    /// ort:opt=all and the GPU providers this machine has; tract; openvino where installed), tf
    /// and xla where installed, and the GPU PyTorch backends.
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

pub(crate) fn op_dtype(s: &str) -> Result<String, String> {
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
    pub fn destinations(&self) -> Destinations {
        Destinations {
            html: self
                .html
                .clone()
                .or_else(|| self.table.under("ops", "html")),
            ..self.table.destinations("ops")
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
    /// spelled as for `layerdiff onnx`: `tract`, `openvino`, `openvino:precision=bf16`, another
    /// ONNX Runtime release or build `ort:lib=PATH`, `ort:opt=all:lib=PATH`, an execution
    /// provider's plugin library `ort:ep_lib=PATH[:ep=NAME]`, an EP through the device API
    /// `ort:ep=NAME`; one that offers no device here is listed with the devices there are).
    #[arg(long, value_delimiter = ',', value_parser = OnnxSide::runtime_only)]
    pub runtimes: Vec<RuntimeSpec>,
    /// The inputs, the same for every cell.
    #[command(flatten)]
    pub input: InputArgs,
    /// How every layer of every cell is judged.
    #[command(flatten)]
    pub judging: Judging,
    /// When the run exits 1: `defect` (the default: a cell has a defect, an undecided layer,
    /// layers that could not be paired, or values that overflow; rounding alone exits 0),
    /// `accumulation` (as `defect`, and a cell with a kernel that accumulates in the narrow
    /// dtype), `approximation` (as `accumulation`, and a cell with a kernel that approximates
    /// within every tolerance) or `drift` (a cell with any layer beyond its tolerance, rounding
    /// included).
    #[arg(long, value_name = "WHEN", default_value = "defect", value_parser = FailOn::parse)]
    pub fail_on: FailOn,
    /// Which sides run in a worker process, so that a crash in native code (a segfault or an
    /// abort in a provider or a custom-op library) costs only the layers of that cell that depend
    /// on the node it dies on: `auto` (the default: sides that load a custom-op library), `always`, `never`.
    /// The layers left out are named in the report, with how the runtime died.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = Isolation::parse)]
    pub isolate: Isolation,
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
    /// The options, as the engine takes them, or why they do not fit together.
    pub fn options(&self) -> Result<ProvidersOptions, String> {
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
        Ok(ProvidersOptions {
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
            settings: self.judging.settings(false)?,
            fail_on: self.fail_on,
            isolation: self.isolate,
        })
    }

    /// Where the table goes.
    pub fn destinations(&self) -> Destinations {
        Destinations {
            parts: self.table.out.as_ref().map(|d| d.join("cells")),
            ..self.table.destinations("providers")
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
    /// Where the table goes: the JSON and Markdown given, else `--out`/NAME.json and NAME.md.
    fn destinations(&self, name: &str) -> Destinations {
        Destinations {
            json: self.json.clone().or_else(|| self.under(name, "json")),
            markdown: self.markdown.clone().or_else(|| self.under(name, "md")),
            quiet: self.quiet,
            ..Destinations::default()
        }
    }

    /// `--out`/NAME.EXT, when `--out` is given.
    fn under(&self, name: &str, ext: &str) -> Option<PathBuf> {
        self.out.as_ref().map(|d| d.join(format!("{name}.{ext}")))
    }
}

/// Options of `layerdiff audit`.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// The runtimes to try each op on (comma-separated, spelled as for `layerdiff onnx`:
    /// `ort`, `ort:cuda`, `tract`…).
    #[arg(long, value_delimiter = ',', default_value = "ort,tract", value_parser = OnnxSide::runtime_only)]
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
    pub fn destinations(&self) -> Destinations {
        self.table.destinations("audit")
    }
}
