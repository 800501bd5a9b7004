//! The command line: verbs and options, parsed into the engine's own types.
//!
//! Both doors, the Rust binary and the Python command, call the one [`dispatch`]: it parses,
//! runs the verbs that need only the engine, and hands back the verbs that need PyTorch (the
//! Python package owns PyTorch, not their parsing), so `--help`, errors and exit codes are the
//! same from either door.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use layerdiff_core::{FailOn, Invocation, Tolerance};
use layerdiff_flow::Settings;
use layerdiff_flow::inputs::InputPlan;
use layerdiff_flow::onnx::OnnxOptions;
use layerdiff_flow::output::Destinations;
use layerdiff_flow::spec::onnx_side::OnnxSide;
use layerdiff_flow::spec::target::TargetSpec;
use layerdiff_flow::spec::torch::TorchSpec;
use layerdiff_flow::verbs::audit::AuditOptions;
use layerdiff_flow::verbs::providers::ProvidersOptions;
use layerdiff_runtime::{Isolation, OptLevel, Provider, RuntimeSpec};

mod torch;
pub use torch::{Exporter, GradArgs, Loss, TargetDtype, TorchArgs};
mod onnx;
pub use onnx::{InputArgs, OnnxArgs};
mod matrix;
pub use matrix::{AuditArgs, CheckArgs, Executor, OpsArgs, ProvidersArgs, TableArgs};
mod report;
pub use report::ReportArgs;
mod judging;
pub use judging::Judging;
mod keras;
pub use keras::KerasArgs;
mod reduce;
pub use reduce::{Recorded, ReduceArgs};
mod sweep;
pub use sweep::SweepArgs;

/// A choice (`--exporter`, `--loss`, `--executor`…) as the command line spells it: the one
/// spelling Python receives too.
pub fn spelling<T: ValueEnum>(choice: &T) -> String {
    choice
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

/// The option `option` (`exporter`, `loss`, `executor`, `op dtype`) given as `text` from the
/// Python API, parsed by the rule the command line's parser keeps: its spelling, or an error
/// naming the ones taken.
pub fn choice(option: &str, text: &str) -> Result<String, String> {
    fn of<T: ValueEnum>(option: &str, text: &str) -> Result<String, String> {
        T::from_str(text, false).map(|v| spelling(&v)).map_err(|_| {
            let taken: Vec<String> = T::value_variants().iter().map(spelling).collect();
            format!(
                "unknown {option} `{text}` (expected {})",
                taken.join(" or ")
            )
        })
    }
    match option {
        "exporter" => of::<Exporter>(option, text),
        "loss" => of::<Loss>(option, text),
        "executor" => of::<Executor>(option, text),
        "op dtype" => matrix::op_dtype(text),
        _ => Err(format!("no option `{option}`")),
    }
}

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
    /// Compare a Keras model, layer by layer, with its ONNX conversion (tf2onnx) on a runtime,
    /// or with TensorFlow computing it another way: XLA, a SavedModel loaded back, TFLite.
    ///
    /// Exit code 0: no layer exceeds its tolerance, or rounding only; 1: a defect (or drift with
    /// `--fail-on drift`); 2: layerdiff could not run.
    Keras(KerasArgs),
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
    /// `--atol`/`--rtol`, the largest errors and the worst element, in seconds; and each side's
    /// distance from the outputs computed in float64, so that a file computing something else
    /// fails even where its outputs stay within the bound (the target more than 4× as far from
    /// them as PyTorch, held to a float16 file's own rounding; a quantized file is judged by
    /// the bound alone). The first thing to run; `layerdiff torch` then shows where a difference
    /// is born.
    ///
    /// Exit code 0: every output within the bound and as near float64 as rounding explains; 1:
    /// one is not; 2: layerdiff could not run.
    Check(CheckArgs),
    /// List the built-in models (`layerdiff torch NAME`), their parameter counts and what each
    /// exercises, and the models installed packages register.
    Zoo,
    /// Cut a report's headline defect down to a checked minimal reproduction: the report's
    /// command is run again where it ran, on the inputs saved beside it, and the few ONNX nodes
    /// (an ONNX target, fed the reference's values) or the one module (a PyTorch target; its
    /// backward, for a gradient of `grad`) that still show the difference are written with
    /// their inputs, the reference's values and a repro.py that needs only the target's runtime
    /// and numpy (torch and your code, for a module). The same as `--repro DIR` on the
    /// comparison.
    ///
    /// Exit code 0: a repro written and checked; 1: none (a clean run, drift that only
    /// accumulates, or not shown within --nodes), said why; 2: layerdiff could not run.
    Reduce(ReduceArgs),
    /// Run `layerdiff torch` for every model × target (× precision × batch size), each run in a
    /// process of its own, here (`--jobs`) or as Ray tasks (`--executor ray`), and write one
    /// index of their verdicts (index.json, index.md, index.html), each row linking to its run's
    /// reports. A run whose process dies (killed, out of memory, a lost node) is tried once
    /// more, then listed as failed; nothing else is lost.
    ///
    /// Exit code 0: every run is clean or rounding only; 1: a run has a defect (as `--fail-on`
    /// says), could not run or failed; 2: no run could start.
    Sweep(SweepArgs),
}

impl Command {
    /// The verb as typed (`onnx`, `torch`…).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Torch(_) => "torch",
            Self::Keras(_) => "keras",
            Self::Onnx(_) => "onnx",
            Self::Providers(_) => "providers",
            Self::Audit(_) => "audit",
            Self::Grad(_) => "grad",
            Self::Ops(_) => "ops",
            Self::Check(_) => "check",
            Self::Zoo => "zoo",
            Self::Reduce(_) => "reduce",
            Self::Sweep(_) => "sweep",
        }
    }

    /// The files and folders the verb reads that the command line names (a model file, a
    /// builder's file, a checkpoint folder, `--vs`, `--onnx`, `--inputs`, a report to reduce):
    /// no report may be written over one of them.
    fn reads(&self) -> Vec<PathBuf> {
        // a built-in name reads no file; a builder `FILE.py:FUNCTION` reads FILE.py
        let spec = |model: &str| {
            let path = PathBuf::from(model.rsplit_once(':').map_or(model, |(file, _)| file));
            path.exists().then_some(path)
        };
        let mut read: Vec<Option<PathBuf>> = match self {
            Self::Torch(a) => vec![spec(&a.model), a.onnx.clone()],
            Self::Grad(a) => vec![spec(&a.model)],
            Self::Keras(a) => vec![spec(&a.model), a.onnx.clone(), a.weight_map.clone()],
            Self::Check(a) => vec![spec(&a.model), a.onnx.clone()],
            Self::Onnx(a) => vec![Some(a.model.clone()), a.vs.clone(), a.input.inputs.clone()],
            Self::Providers(a) => vec![Some(a.model.clone()), a.input.inputs.clone()],
            Self::Audit(a) => vec![Some(a.model.clone()), a.input.inputs.clone()],
            Self::Reduce(a) => vec![Some(a.report.clone())],
            Self::Sweep(a) => a.models.iter().map(|m| spec(m)).collect(),
            Self::Ops(_) | Self::Zoo => Vec::new(),
        };
        if let Self::Onnx(a) = self {
            // a side of values read from a file (`expected:PATH`)
            for side in [Some(&a.reference), a.target.as_ref()]
                .into_iter()
                .flatten()
            {
                if let OnnxSide::Expected(path) = side {
                    read.push(Some(path.clone()));
                }
            }
        }
        read.into_iter().flatten().collect()
    }

    /// The folders the verb fills (`--out`, `--repro`, a table's folder): what a run a signal
    /// stops made in them goes (see `layerdiff_flow::made`).
    fn fills(&self) -> Vec<PathBuf> {
        let folders = match self {
            Self::Torch(a) => vec![a.report.out.clone(), a.repro.clone()],
            Self::Grad(a) => vec![a.report.out.clone(), a.repro.clone()],
            Self::Onnx(a) => vec![a.report.out.clone(), a.repro.clone()],
            Self::Keras(a) => vec![a.report.out.clone()],
            Self::Providers(a) => vec![a.table.out.clone()],
            Self::Audit(a) => vec![a.table.out.clone()],
            Self::Ops(a) => vec![a.table.out.clone()],
            Self::Reduce(a) => vec![a.out.clone()],
            Self::Sweep(a) => vec![Some(a.out.clone())],
            Self::Check(_) | Self::Zoo => Vec::new(),
        };
        folders.into_iter().flatten().collect()
    }

    /// Where the verb writes its reports, checked before any work starts.
    fn destinations(&self) -> Option<Destinations> {
        match self {
            Self::Torch(a) => Some(a.report.destinations()),
            Self::Keras(a) => Some(a.report.destinations()),
            Self::Onnx(a) => Some(a.report.destinations()),
            Self::Grad(a) => Some(a.report.destinations()),
            Self::Providers(a) => Some(a.destinations()),
            Self::Audit(a) => Some(a.destinations()),
            Self::Ops(a) => Some(a.destinations()),
            Self::Check(a) => Some(Destinations {
                json: a.json.clone(),
                quiet: a.quiet,
                ..Default::default()
            }),
            Self::Reduce(a) => Some(Destinations {
                parts: a.out.clone(),
                quiet: a.quiet,
                ..Default::default()
            }),
            Self::Sweep(a) => Some(a.destinations()),
            Self::Zoo => None,
        }
    }
}

/// Parses `argv` (program name first); `Err`: parsing did everything (help, version, a usage
/// error, printed here): exit with this code.
fn parse(argv: Vec<OsString>) -> Result<Command, u8> {
    match Cli::try_parse_from(argv) {
        Ok(cli) => Ok(cli.command),
        Err(err) => {
            let _ = err.print();
            Err(if err.use_stderr() { 2 } else { 0 })
        }
    }
}

/// A verb whose caller owns the framework it needs (PyTorch, TensorFlow), handed back by
/// [`dispatch`] with its options.
#[derive(Debug)]
pub enum PythonVerb {
    /// `torch`.
    Torch(TorchArgs),
    /// `keras`.
    Keras(KerasArgs),
    /// `grad`.
    Grad(GradArgs),
    /// `ops`.
    Ops(OpsArgs),
    /// `zoo`.
    Zoo,
    /// `check`.
    Check(CheckArgs),
    /// `sweep`.
    Sweep(SweepArgs),
}

impl PythonVerb {
    /// Where the caller runs it: the Python module and its function, which takes the parsed
    /// command and a progress line and returns the exit code; the one dispatch is this
    /// crate's, the caller only imports what it names.
    pub fn runner(&self) -> (&'static str, &'static str) {
        match self {
            Self::Torch(_) => ("layerdiff.torch._command", "torch"),
            Self::Grad(_) => ("layerdiff.torch._command", "grad"),
            Self::Keras(_) => ("layerdiff.keras", "run_command"),
            Self::Ops(_) => ("layerdiff.torch._ops", "run_command"),
            Self::Check(_) => ("layerdiff.torch._check", "run_command"),
            Self::Zoo => ("layerdiff.torch.models", "zoo_command"),
            Self::Sweep(_) => ("layerdiff.sweep", "run_command"),
        }
    }

    /// The verb as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Torch(_) => "torch",
            Self::Keras(_) => "keras",
            Self::Grad(_) => "grad",
            Self::Ops(_) => "ops",
            Self::Zoo => "zoo",
            Self::Check(_) => "check",
            Self::Sweep(_) => "sweep",
        }
    }

    /// The framework it needs, and the package extra that installs it.
    pub fn framework(&self) -> (&'static str, &'static str) {
        match self {
            Self::Keras(_) => ("TensorFlow, Keras and tf2onnx", "layerdiff[tf]"),
            _ => ("PyTorch", "layerdiff[torch]"),
        }
    }
}

/// A verb handed to the caller, with the command line its outputs are made by.
#[derive(Debug)]
pub struct Handed {
    /// The verb and its options.
    pub verb: PythonVerb,
    /// The command line (for `reduce`, the one the report records).
    pub invocation: Invocation,
    /// Run by `reduce`: its options ask for the repro (`repro`) and no reports, and its exit
    /// code is the repro's (0: written and checked; 1: none).
    pub reducing: bool,
    /// Run by `reduce` on the report of one point of an axis (`prefill`, `1`, a batch size):
    /// the point whose repro is cut (`None`: the first with a headline defect).
    pub point: Option<String>,
}

/// What [`dispatch`] did.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per process: boxing would buy nothing
pub enum Dispatched {
    /// The verb ran (or parsing ended it: help, version, a usage error): exit with this code.
    Exit(u8),
    /// The verb needs a Python framework (PyTorch, TensorFlow): the caller runs it.
    Python(Handed),
}

/// The one dispatch of both doors (the Rust binary and the Python command): parses `argv`,
/// runs the verbs that need only the engine (`onnx`, `providers`, `audit`) with ONNX Runtime
/// as the door chose it ([`layerdiff_runtime::use_ort_library`]; found as documented where it
/// chose none), and hands back the verbs that need a Python framework (PyTorch, TensorFlow).
pub fn dispatch(argv: Vec<OsString>) -> Dispatched {
    use layerdiff_flow::verbs::{audit, onnx, providers};
    if argv
        .get(1)
        .is_some_and(|a| a == layerdiff_runtime::WORKER_VERB)
    {
        // an isolated side's worker process, started by a run (not a verb users type)
        return Dispatched::Exit(layerdiff_runtime::serve_worker(&argv[2..]));
    }
    let invocation = Invocation::of(&argv);
    let command = match parse(argv) {
        Ok(command) => command,
        Err(code) => return Dispatched::Exit(code),
    };
    if let Err(e) = layerdiff_runtime::cap_threads() {
        return Dispatched::Exit(usage(&e.to_string()));
    }
    let destinations = command.destinations();
    if let Some(Err(e)) = destinations.as_ref().map(|to| to.check(&command.reads())) {
        eprintln!("error: {e}");
        return Dispatched::Exit(2);
    }
    if let Err(e) = layerdiff_flow::output::check_folders(&command.fills()) {
        eprintln!("error: {e}");
        return Dispatched::Exit(2);
    }
    // the run begins: its progress shown, its folders watched
    layerdiff_flow::progress::start(destinations.is_some_and(|to| to.quiet));
    layerdiff_flow::made::watch(&command.fills());
    // the outputs say which command line made them
    let made = |to: Destinations| Destinations {
        invocation: Some(invocation.clone()),
        ..to
    };
    let python = |verb: PythonVerb| {
        Dispatched::Python(Handed {
            verb,
            invocation: invocation.clone(),
            reducing: false,
            point: None,
        })
    };
    let code = match command {
        Command::Onnx(a) => match a.options() {
            Ok(options) => onnx::run(&options, &made(a.report.destinations())),
            Err(why) => usage(&why),
        },
        Command::Providers(a) => match a.options() {
            Ok(options) => providers::run(&options, &made(a.destinations())),
            Err(why) => usage(&why),
        },
        Command::Audit(a) => audit::run(&a.options(), &made(a.destinations())),
        Command::Torch(a) => return python(PythonVerb::Torch(a)),
        Command::Keras(a) => return python(PythonVerb::Keras(a)),
        Command::Grad(a) => return python(PythonVerb::Grad(a)),
        Command::Ops(a) => return python(PythonVerb::Ops(a)),
        Command::Zoo => return python(PythonVerb::Zoo),
        Command::Check(a) => return python(PythonVerb::Check(a)),
        Command::Sweep(a) => return python(PythonVerb::Sweep(a)),
        Command::Reduce(a) => return reduce::run(&a),
    };
    Dispatched::Exit(code)
}

/// Options that do not fit together: said, and exit code 2.
fn usage(why: &str) -> u8 {
    eprintln!("error: {why}");
    2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_choice_is_spelled_as_the_command_line_takes_it() {
        for exporter in Exporter::value_variants() {
            let spelled = spelling(exporter);
            assert_eq!(Exporter::from_str(&spelled, false).as_ref(), Ok(exporter));
        }
        for loss in Loss::value_variants() {
            assert_eq!(Loss::from_str(&spelling(loss), false).as_ref(), Ok(loss));
        }
        assert_eq!(spelling(&Executor::Ray), "ray");
        assert_eq!(spelling(&Exporter::Legacy), "legacy");
    }

    #[test]
    fn the_api_takes_a_choice_by_the_command_lines_rule() {
        assert_eq!(choice("loss", "sum").as_deref(), Ok("sum"));
        assert_eq!(choice("op dtype", "half").as_deref(), Ok("float16"));
        assert_eq!(
            choice("exporter", "onnxscript").unwrap_err(),
            "unknown exporter `onnxscript` (expected dynamo or legacy)"
        );
        let cli = Cli::try_parse_from(["layerdiff", "grad", "resnet18", "--loss", "mean"]);
        assert!(cli.is_err() && choice("loss", "mean").is_err());
    }
}
