//! `layerdiff reduce REPORT.json`: the report's command run again, in the folder it ran in and
//! on the inputs saved beside it, with its headline defect cut down to a checked repro.

use super::{
    Args, Cli, Command, Dispatched, FailOn, Handed, OnnxArgs, OnnxSide, Parser, PythonVerb,
    ReportArgs, usage,
};
use std::path::{Path, PathBuf};

use layerdiff_core::Invocation;

/// Options of `layerdiff reduce`.
#[derive(Debug, Clone, Args)]
pub struct ReduceArgs {
    /// A JSON report written by a layerdiff command (`--json`, `--out`).
    pub report: PathBuf,
    /// The repro's folder. Default: `repro/` beside the report.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The most nodes a repro may grow to when fewer do not show the difference (a fusion).
    #[arg(long, value_name = "N", default_value_t = layerdiff_flow::onnx::MOST_NODES)]
    pub nodes: usize,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What a report and the inputs saved beside it say about how it was made.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The verb (`onnx`, `torch`…).
    pub command: String,
    /// Its command line.
    pub invocation: Invocation,
    /// The inputs saved beside it.
    pub inputs: PathBuf,
    /// The layer it headlined (the first defect's), if any.
    pub headline: Option<String>,
    /// The point of an axis it is the report of (`prefill`, `1`, a batch size), where it is one
    /// point's (`--decode-steps`, `--batch-sizes`, `--shapes` with `--out`).
    pub point: Option<String>,
}

impl ReduceArgs {
    /// The repro's folder, absolute.
    pub fn folder(&self) -> PathBuf {
        let folder = self
            .out
            .clone()
            .unwrap_or_else(|| self.report.parent().unwrap_or(Path::new(".")).join("repro"));
        absolute(&folder)
    }

    /// Reads what the report records of its run. `Err`: why it cannot be run again.
    pub fn recorded(&self) -> Result<Recorded, String> {
        let shown = self.report.display();
        let text = std::fs::read_to_string(&self.report)
            .map_err(|e| format!("cannot read the report `{shown}`: {e}"))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("`{shown}` is not a JSON report: {e}"))?;
        let schema = json["schema"].as_str().unwrap_or_default();
        if schema.starts_with("layerdiff.axis/") {
            return Err(format!(
                "`{shown}` is an axis report (one verdict per point); reduce one point's \
                 report: with `--out DIR`, each point has its own (`DIR/step-1/report.json`, \
                 `DIR/batch-8/report.json`)"
            ));
        }
        if !schema.starts_with("layerdiff.report/") {
            return Err(format!(
                "`{shown}` is not a layerdiff comparison report (its schema is `{schema}`)"
            ));
        }
        let stem = self
            .report
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let inputs = self
            .report
            .with_file_name(format!("{stem}.inputs.safetensors"));
        let rerun = "hint: run the comparison again with `--repro DIR`";
        if !inputs.is_file() {
            return Err(format!(
                "`{shown}` has no `{}` beside it, which holds its inputs and the command that \
                 made it\n{rerun}",
                inputs.display()
            ));
        }
        let metadata = layerdiff_core::read_safetensors_metadata(&inputs)
            .map_err(|e| format!("cannot read the inputs beside the report: {e}"))?;
        let invocation: Invocation = metadata
            .get("invocation")
            .and_then(|text| serde_json::from_str(text).ok())
            .ok_or_else(|| {
                format!(
                    "`{shown}` does not record the command that made it (a report of the \
                     Python API, or of an older layerdiff)\n{rerun}"
                )
            })?;
        Ok(Recorded {
            command: json["command"].as_str().unwrap_or_default().to_string(),
            invocation,
            inputs: absolute(&inputs),
            headline: json["summary"]["defects"][0]["layer"]
                .as_str()
                .map(str::to_string),
            point: metadata.get("point").cloned(),
        })
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Runs `reduce`: the report's command line parsed again and run in its folder, without its
/// reports, for its headline's repro; the one driver of every verb's reduce. A report of
/// `layerdiff onnx` is run here, on its saved inputs; one of `torch` or `grad` is handed to the
/// caller (which owns PyTorch) with the repro asked for. Exit code 0: a repro written and
/// checked; 1: none (a clean run, drift that only accumulates, or not shown within `--nodes`);
/// 2: it could not run.
pub(crate) fn run(args: &ReduceArgs) -> Dispatched {
    // The paths given are the user's, from here: the run goes on in the folder the report's
    // command ran in (a `reduce report.json` from inside `run/` wrote its repro beside the
    // command's folder instead, where the next reduce overwrote it).
    let args = &ReduceArgs {
        report: absolute(&args.report),
        out: args.out.as_deref().map(absolute),
        ..args.clone()
    };
    let refuse = |why: String| Dispatched::Exit(usage(&why));
    let recorded = match args.recorded() {
        Ok(recorded) => recorded,
        Err(why) => return refuse(why),
    };
    let text = recorded.invocation.text();
    let verb = &recorded.command;
    let mut argv = vec!["layerdiff".to_string()];
    argv.extend(recorded.invocation.argv.iter().cloned());
    let command = match Cli::try_parse_from(&argv) {
        Ok(cli) if cli.command.name() == verb => cli.command,
        _ => {
            return refuse(format!(
                "the command line the report records does not parse as `layerdiff {verb}` any \
                 more: `{text}`"
            ));
        }
    };
    if !matches!(
        command,
        Command::Onnx(_) | Command::Torch(_) | Command::Grad(_)
    ) {
        return refuse(format!(
            "`layerdiff reduce` cuts down reports of `layerdiff onnx`, `torch` and `grad`; this \
             one is of `layerdiff {verb}`"
        ));
    }
    if let Command::Grad(a) = &command
        && a.target.ranks > 1
    {
        let named = (recorded.headline.as_ref()).map_or(String::new(), |h| format!(" (`{h}`)"));
        return refuse(format!(
            "`layerdiff reduce` cuts a finding down to one module call's backward in one \
             process, which cannot show what one rank of `{}` does; the report names the rank \
             and the parameter already{named}, and `{text}` is its repro",
            a.target
        ));
    }
    // Its paths are relative to where it ran.
    if let Err(e) = std::env::set_current_dir(&recorded.invocation.cwd) {
        return refuse(format!(
            "cannot enter `{}`, where the report's command ran: {e}",
            recorded.invocation.cwd
        ));
    }
    if !args.quiet {
        let point = (recorded.point.as_ref()).map_or(String::new(), |p| format!(" (at {p})"));
        eprintln!("running the report's command again{point}: {text}");
    }
    let folder = args.folder();
    let verb = match command {
        Command::Onnx(a) => return Dispatched::Exit(onnx(args, &recorded, &a)),
        Command::Torch(mut a) => {
            (a.repro, a.bisect, a.report) = (Some(folder), false, args.no_reports());
            PythonVerb::Torch(a)
        }
        Command::Grad(mut a) => {
            (a.repro, a.report) = (Some(folder), args.no_reports());
            PythonVerb::Grad(a)
        }
        _ => unreachable!("refused above"),
    };
    Dispatched::Python(Handed {
        verb,
        invocation: recorded.invocation,
        reducing: true,
        point: recorded.point,
    })
}

impl ReduceArgs {
    /// A comparison run again for its repro writes no reports, and prints as `reduce` does.
    fn no_reports(&self) -> ReportArgs {
        ReportArgs {
            out: None,
            json: None,
            markdown: None,
            html: None,
            svg: None,
            node_data: None,
            quiet: self.quiet,
            fail_on: FailOn::default(),
            timings: false,
        }
    }
}

/// `reduce` of a report of `layerdiff onnx` (`onnx_args`, its command line parsed again): the
/// comparison run again on the saved inputs, and the repro written.
fn onnx(args: &ReduceArgs, recorded: &Recorded, onnx_args: &OnnxArgs) -> u8 {
    let folder = args.folder();
    let mut options = match onnx_args.options() {
        Ok(options) => options,
        Err(why) => return usage(&why),
    };
    options.bisect = false;
    options.repro = None;
    if options.inputs.is_none() && !matches!(options.reference, OnnxSide::Expected(_)) {
        options.inputs = Some(recorded.inputs.clone());
    }
    let say = |line: &str| {
        if !args.quiet {
            eprintln!("{line}");
        }
    };
    let outcome = match layerdiff_flow::onnx::compare(&options) {
        Ok(outcome) => outcome,
        Err(e) => return e.exit(),
    };
    let headline = match outcome.report.headline() {
        Ok(layer) => layer.name.clone(),
        Err(why) => {
            say(&format!("no repro written: {why}"));
            return 1;
        }
    };
    if let Some(before) = recorded.headline.as_ref().filter(|b| **b != headline) {
        say(&format!(
            "note: the report's headline was `{before}`; run again here it is `{headline}`"
        ));
    }
    match layerdiff_flow::verbs::reduce::onnx(
        &options,
        &outcome.report,
        &outcome.inputs,
        &folder,
        args.nodes,
        &recorded.invocation.text(),
    ) {
        Ok(repro) => {
            if !args.quiet {
                println!("{}", repro.sentence());
            }
            u8::from(!repro.found())
        }
        Err(e) => e.exit(),
    }
}
