//! `layerdiff providers`: one ONNX model on every execution provider ONNX Runtime offers, at
//! every graph optimization level, each against the CPU provider with optimizations off, per
//! layer (an optimized graph is measured as it ships: values that survive optimization, and the
//! outputs). One cell per provider and level, one verdict per cell, the origin of each failing
//! cell; a provider this ONNX Runtime or machine cannot use is listed with the reason. Other
//! runtimes (`tract`, `openvino`…) join the table as one cell each, against the same reference.
//!
//! Each cell is one `layerdiff onnx` comparison ([`crate::onnx::compare`]) with the same
//! inputs; its whole report can be kept beside the table.

use std::path::PathBuf;

use layerdiff_core::{FailOn, InputInfo, Machine, Report, SideInfo, ToleranceInfo, floats, render};
use layerdiff_runtime::{Isolation, OptLevel, OrtSpec, Provider, RuntimeSpec};
use serde::Serialize;

use crate::inputs::InputPlan;
use crate::onnx::{OnnxOptions, compare_on};
use crate::output::{Destinations, Format, Rendered, publish, table_forms, write_atomic};
use crate::{Error, Result, Settings, error_chain};

/// Schema of the providers table.
pub const PROVIDERS_SCHEMA: &str = "layerdiff.providers/1";

/// What `layerdiff providers` is asked to run.
#[derive(Debug, Clone)]
pub struct ProvidersOptions {
    /// The model file.
    pub model: PathBuf,
    /// The providers to try, in order.
    pub providers: Vec<Provider>,
    /// The optimization levels to try each at.
    pub levels: Vec<OptLevel>,
    /// Other runtimes, a cell each (`tract`, `openvino:precision=bf16`).
    pub runtimes: Vec<RuntimeSpec>,
    /// Inputs read from this file (`None`: generated).
    pub inputs: Option<PathBuf>,
    /// How inputs are generated.
    pub generate: InputPlan,
    /// Tolerance, local error, memory budget and float64 computations, for every cell.
    pub settings: Settings,
    /// When a cell fails the run.
    pub fail_on: FailOn,
    /// Which cells' runtimes run in a worker process.
    pub isolation: Isolation,
}

/// One provider at one optimization level.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// ONNX Runtime's name for the provider (`CUDAExecutionProvider`), or the other runtime's
    /// name (`openvino`).
    pub provider: String,
    /// The optimization level (`–` for a runtime other than ONNX Runtime).
    pub level: String,
    /// The target as layerdiff spells it (`ort:cuda:opt=all`).
    pub target: String,
    /// The run's verdict (`no_drift`, `precision`, `defect`, `undecided`, `inconclusive`), or
    /// `unavailable` or `error`.
    pub verdict: String,
    /// Whether the cell fails (a defect, an undecided layer, an inconclusive run, or values
    /// that overflow the dtype; rounding alone passes).
    pub fails: bool,
    /// Why a cell is unavailable or failed, or what a clean or drifting cell's run was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Layers compared, of all.
    pub layers_compared: usize,
    /// Layers in the run.
    pub layers_total: usize,
    /// Layers whose difference exceeds their tolerance.
    pub layers_exceeding: usize,
    /// Where drift is born, and its cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift_origin: Option<String>,
    /// The origin's cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<layerdiff_core::Cause>,
    /// The largest difference of any layer.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "floats::float_opt"
    )]
    pub max_abs_diff: Option<f64>,
    /// Which provider ran how many nodes, where ONNX Runtime's profile says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
}

/// The whole table.
#[derive(Debug, Clone, Serialize)]
pub struct ProvidersReport {
    /// [`PROVIDERS_SCHEMA`].
    pub schema: &'static str,
    /// The model file's name.
    pub model: String,
    /// What every cell is measured against.
    pub reference: String,
    /// The tolerance policy every cell uses.
    pub tolerance: ToleranceInfo,
    /// The inputs every cell is given.
    pub inputs: Vec<InputInfo>,
    /// Provider by provider, level by level.
    pub cells: Vec<Cell>,
    /// The machine.
    pub machine: Machine,
}

impl ProvidersReport {
    /// The exit code: 0 when every cell that ran passes, 1 when one fails (a defect, an
    /// undecided or inconclusive run; any drift with `--fail-on drift`), 2 when none could run.
    pub fn exit_code(&self) -> u8 {
        let ran = |c: &&Cell| !matches!(c.verdict.as_str(), "unavailable" | "error");
        if !self.cells.iter().any(|c| ran(&c)) {
            return 2;
        }
        u8::from(self.cells.iter().any(|c| c.fails))
    }
}

/// Runs every cell.
pub fn providers(options: &ProvidersOptions, to: &Destinations) -> Result<ProvidersReport> {
    let mut table = ProvidersReport {
        schema: PROVIDERS_SCHEMA,
        model: options
            .model
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        reference: RuntimeSpec::ort_cpu().spelling(),
        tolerance: options.settings.tolerance.info(),
        inputs: Vec::new(),
        cells: Vec::new(),
        machine: Machine::this(),
    };
    // Each group of targets is one runtime: a provider at each level, or another runtime.
    let mut groups: Vec<Vec<(String, String, RuntimeSpec)>> = options
        .providers
        .iter()
        .map(|&provider| {
            options
                .levels
                .iter()
                .map(|&level| {
                    let name = provider.ort_name().to_string();
                    (
                        name,
                        level.name().to_string(),
                        OrtSpec::on(provider, level).into(),
                    )
                })
                .collect()
        })
        .collect();
    for spec in &options.runtimes {
        let name = spec
            .spelling()
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string();
        groups.push(vec![(name, "–".to_string(), spec.clone())]);
    }
    // A runtime that is missing is one cell for all its levels: known before counting them.
    for group in &mut groups {
        let missing = group.first().is_some_and(|(_, _, target)| {
            matches!(
                target.build(),
                Err(layerdiff_runtime::Error::ProviderUnavailable { .. }
                    | layerdiff_runtime::Error::LibraryNotFound { .. }
                    | layerdiff_runtime::Error::LibraryLoad { .. })
            )
        });
        if missing {
            group.truncate(1);
        }
    }
    let cells: usize = groups.iter().map(Vec::len).sum();
    let mut at = 0;
    for group in groups {
        for (provider, level, target) in group {
            at += 1;
            crate::progress::phase(&format!("cell {at}/{cells}: {}", target.spelling()));
            let labels = (provider, level);
            let (cell, available) = cell(options, to, &target, labels, &mut table.inputs)?;
            if let Some(signal) = crate::interrupt::requested() {
                // a table of some cells would read as the whole matrix: none is written
                return Err(Error::Interrupted(signal));
            }
            table.cells.push(cell);
            if !available {
                // The runtime itself is missing: the one cell says so for all its levels.
                break;
            }
        }
    }
    Ok(table)
}

/// One cell, and whether its runtime is there (`false`: unavailable, its other levels too);
/// the first cell that runs gives the table its `inputs`.
fn cell(
    options: &ProvidersOptions,
    to: &Destinations,
    target: &RuntimeSpec,
    (provider, level): (String, String),
    inputs: &mut Vec<InputInfo>,
) -> Result<(Cell, bool)> {
    let run = OnnxOptions {
        model: options.model.clone(),
        vs: None,
        reference: RuntimeSpec::ort_cpu().into(),
        target: Some(target.clone().into()),
        inputs: options.inputs.clone(),
        generate: options.generate.clone(),
        settings: options.settings.clone(),
        bisect: false,
        repro: None,
        repro_nodes: 0,
        isolation: options.isolation,
        opaque: false,
    };
    let mut cell = Cell {
        provider,
        level,
        target: target.spelling(),
        verdict: String::new(),
        fails: false,
        reason: None,
        layers_compared: 0,
        layers_total: 0,
        layers_exceeding: 0,
        drift_origin: None,
        cause: None,
        max_abs_diff: None,
        placement: None,
    };
    // the cell's line says what runs; a line per phase of each cell would bury the table's
    match compare_on(&run, None, false) {
        Ok(outcome) => {
            if inputs.is_empty() {
                inputs.clone_from(&outcome.report.inputs);
            }
            fill(&mut cell, &outcome.report, options.fail_on);
            if let Some(folder) = &to.parts {
                let name = cell.target.replace([':', '='], "-");
                let path = folder.join(format!("{name}.json"));
                write_atomic(&path, render::to_json(&outcome.report).as_bytes())
                    .map_err(|source| Error::Write { path, source })?;
            }
        }
        // The runtime itself is missing (a provider this build lacks, a library not installed).
        Err(Error::Runtime(
            e @ (layerdiff_runtime::Error::ProviderUnavailable { .. }
            | layerdiff_runtime::Error::LibraryNotFound { .. }
            | layerdiff_runtime::Error::LibraryLoad { .. }),
        )) => {
            cell.verdict = "unavailable".to_string();
            cell.reason = Some(e.to_string());
            // a provider unavailable at one level is at every level; a release or a device-API
            // EP keeps its spelling
            if let Some(ort) = target.ort()
                && ort.release.is_none()
                && ort.plugin.is_none()
            {
                cell.level = "any".to_string();
                cell.target =
                    RuntimeSpec::from(OrtSpec::on(ort.provider, OptLevel::Disable)).spelling();
            }
            return Ok((cell, false));
        }
        // Inputs or the model itself: no cell can run; say so once.
        // Or a signal stopped the run: the table would be part of one.
        Err(
            e @ (Error::Inputs(_) | Error::Onnx(_) | Error::Expected(_) | Error::Interrupted(_)),
        ) => {
            return Err(e);
        }
        Err(e) => {
            cell.verdict = "error".to_string();
            cell.reason = Some(error_chain(&e));
        }
    }
    Ok((cell, true))
}

/// A cell's entries from its report.
fn fill(cell: &mut Cell, report: &Report, fail_on: FailOn) {
    let s = &report.summary;
    cell.verdict = s.verdict.name().to_string();
    cell.fails = s.fails(fail_on);
    cell.reason = s.inconclusive.clone().or_else(|| {
        report.target_graph.as_ref().map(|g| {
            format!(
                "measured in the graph ONNX Runtime optimized: {}",
                g.describe()
            )
        })
    });
    cell.layers_compared = s.layers_compared;
    cell.layers_total = s.layers_total;
    cell.layers_exceeding = s.layers_exceeding;
    cell.drift_origin = s.drift_origin.clone();
    cell.cause = s.drift_origin.as_ref().and_then(|origin| {
        let layer = report.layers.iter().find(|l| &l.name == origin)?;
        layer.cause
    });
    cell.max_abs_diff = s.worst.max_abs_diff.as_ref().map(|w| w.value);
    cell.placement = target_placement(&report.target);
}

fn target_placement(target: &SideInfo) -> Option<String> {
    target.placement_text()
}

/// The table as text: one line per cell.
pub fn to_text(table: &ProvidersReport) -> String {
    let n = table.cells.len();
    let mut out = format!(
        "{}: {n} cell{} against {} ({})\n",
        table.model,
        if n == 1 { "" } else { "s" },
        table.reference,
        table.tolerance.describe()
    );
    // Providers this ONNX Runtime build lacks are said once, after the table.
    let lacking = |c: &Cell| {
        c.verdict == "unavailable"
            && c.reason
                .as_deref()
                .is_some_and(|r| r.contains("was built without"))
    };
    let mut missing = Vec::new();
    for c in &table.cells {
        if lacking(c) {
            missing.push(c.target.as_str());
        } else {
            out.push_str(&format!("  {:<24} {}\n", c.target, cell_words(c)));
        }
    }
    if !missing.is_empty() {
        out.push_str(&format!(
            "  not in this ONNX Runtime build: {} (the report says which build has each; `{}` points at another)\n",
            missing.join(", "),
            layerdiff_runtime::LIBRARY_ENV
        ));
    }
    out
}

/// A cell in words: its verdict with what backs it.
fn cell_words(c: &Cell) -> String {
    match c.verdict.as_str() {
        "no_drift" => format!(
            "no drift: {} of {} layers compared, largest max abs diff {:.3e}",
            c.layers_compared,
            c.layers_total,
            c.max_abs_diff.unwrap_or(0.0)
        ),
        "precision" | "defect" | "undecided" => format!(
            "{}: {} of {} compared layers exceed; born at `{}` ({})",
            c.verdict,
            c.layers_exceeding,
            c.layers_compared,
            c.drift_origin.as_deref().unwrap_or("?"),
            c.cause.map_or("no cause", layerdiff_core::Cause::name)
        ),
        other => format!("{other}: {}", c.reason.as_deref().unwrap_or("")),
    }
}

/// The table as Markdown.
pub fn to_markdown(table: &ProvidersReport) -> String {
    let mut out = format!(
        "# layerdiff providers: {}\n\nEvery cell against `{}`, tolerance {}.\n\n| target | verdict | compared | exceeding | origin | cause | max abs diff | where nodes ran |\n|---|---|---|---|---|---|---|---|\n",
        table.model,
        table.reference,
        table.tolerance.describe()
    );
    for c in &table.cells {
        let ran = !matches!(c.verdict.as_str(), "unavailable" | "error");
        let or_dash = |s: Option<String>| s.unwrap_or_else(|| "–".to_string());
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
            c.target,
            if ran {
                c.verdict.replace('_', " ")
            } else {
                format!(
                    "{}: {}",
                    c.verdict,
                    c.reason.as_deref().unwrap_or("").replace('|', "\\|")
                )
            },
            if ran {
                format!("{} / {}", c.layers_compared, c.layers_total)
            } else {
                "–".to_string()
            },
            if ran {
                c.layers_exceeding.to_string()
            } else {
                "–".to_string()
            },
            or_dash(c.drift_origin.as_ref().map(|o| format!("`{o}`"))),
            or_dash(c.cause.map(|c| c.to_string())),
            or_dash(c.max_abs_diff.map(|d| format!("{d:.3e}"))),
            or_dash(c.placement.clone()),
        ));
    }
    out
}

impl Rendered for ProvidersReport {
    fn render(&self, format: Format) -> Option<String> {
        table_forms(self, format, to_markdown, to_text)
    }
}

/// Runs the `providers` verb: the table to stdout and to the destinations; returns the exit
/// code (0 every cell clean, 1 a cell drifts, 2 none could run or layerdiff could not).
pub fn run(options: &ProvidersOptions, to: &Destinations) -> u8 {
    let done = providers(options, to).and_then(|table| {
        publish(&table, to)?;
        Ok(table)
    });
    match done {
        Ok(table) => {
            if let Some(code) = crate::interrupt::exit_code() {
                return code;
            }
            let code = table.exit_code();
            if code == 2 {
                eprintln!("error: no provider could run the model (see each cell's reason)");
            }
            code
        }
        Err(err) => err.exit(),
    }
}
