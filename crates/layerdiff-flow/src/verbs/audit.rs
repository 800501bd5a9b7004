//! `layerdiff audit`: the ops a model uses (domain, op type, how often, under which opset) and,
//! for each runtime, whether it can run each one, found by trying it: the op's first node as a
//! single-node model with the model's own opsets, fed the very values it reads in a run of the
//! whole model (ONNX Runtime on the CPU, else tract). Ops some runtime cannot run come first.

use std::collections::BTreeMap;
use std::path::PathBuf;

use layerdiff_core::{Machine, Tensor};
use layerdiff_onnx::{GraphIndex, Model, NodeExt, expose_values, extract_nodes};
use layerdiff_runtime::{Isolation, RuntimeSpec};
use serde::Serialize;

use crate::inputs::{InputPlan, check_inputs, generate_inputs, read_inputs};
use crate::output::{Destinations, Format, Rendered, publish, table_forms};
use crate::{Error, Result, error_chain};

/// Schema of the audit.
pub const AUDIT_SCHEMA: &str = "layerdiff.audit/1";

/// What `layerdiff audit` is asked to check.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// The model file.
    pub model: PathBuf,
    /// The runtimes to try each op on.
    pub runtimes: Vec<RuntimeSpec>,
    /// Inputs read from this file (`None`: generated).
    pub inputs: Option<PathBuf>,
    /// How inputs are generated.
    pub generate: InputPlan,
}

/// One opset the model imports.
#[derive(Debug, Clone, Serialize)]
pub struct Opset {
    /// The domain (`ai.onnx` for the default one).
    pub domain: String,
    /// Its version.
    pub version: i64,
}

/// Whether one runtime runs one op.
#[derive(Debug, Clone, Serialize)]
pub struct Support {
    /// The runtime, as layerdiff spells it.
    pub runtime: String,
    /// `runs`, `fails`, or `untested` (the node could not be tried alone).
    pub status: String,
    /// What the runtime (or the extraction) said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One op the model uses.
#[derive(Debug, Clone, Serialize)]
pub struct OpUse {
    /// Its domain (`ai.onnx` for the default one).
    pub domain: String,
    /// The op type.
    pub op_type: String,
    /// The opset version it is used under.
    pub opset: Option<i64>,
    /// How many nodes use it.
    pub count: usize,
    /// The node tried.
    pub node: String,
    /// What that node reads: dtype and shape of each input.
    pub inputs: Vec<String>,
    /// Runtime by runtime.
    pub support: Vec<Support>,
}

/// The audit.
#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    /// [`AUDIT_SCHEMA`].
    pub schema: &'static str,
    /// The model file's name.
    pub model: String,
    /// The IR version of the file.
    pub ir_version: i64,
    /// The opsets the model imports.
    pub opsets: Vec<Opset>,
    /// The runtime whose run of the whole model gave each op its inputs.
    pub inputs_from: String,
    /// The runtimes tried.
    pub runtimes: Vec<String>,
    /// Runtimes asked for that this machine or ONNX Runtime build cannot use, with the reason.
    pub unavailable: Vec<Support>,
    /// Ops some runtime cannot run first, then by how often they are used.
    pub ops: Vec<OpUse>,
    /// The machine.
    pub machine: Machine,
}

impl AuditReport {
    /// 0 when every runtime runs every op it could try, 1 when one does not.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.ops.iter().any(uncovered))
    }
}

fn uncovered(op: &OpUse) -> bool {
    op.support.iter().any(|s| s.status == "fails")
}

/// The default domain's name in reports.
fn domain_name(domain: &str) -> &str {
    if domain.is_empty() { "ai.onnx" } else { domain }
}

/// Audits the model.
pub fn audit(options: &AuditOptions) -> Result<AuditReport> {
    let model = Model::load(&options.model)?;
    let graph = model.graph();
    let index = GraphIndex::new(graph);
    let inputs = match &options.inputs {
        Some(path) => read_inputs(path, &index)?,
        None => generate_inputs(&index, &options.generate)?,
    };
    check_inputs(&index, &inputs)?;
    let opsets: BTreeMap<String, i64> = model
        .proto
        .opset_import
        .iter()
        .map(|o| (domain_name(o.domain()).to_string(), o.version()))
        .collect();

    let first = first_nodes(graph);
    let is_input = |n: &str| inputs.iter().any(|(name, _)| name == n);
    let mut wanted: Vec<String> = Vec::new();
    for &(_, _, i, _) in &first {
        for name in graph.node[i].input.iter().filter(|n| !n.is_empty()) {
            if !index.is_initializer(name) && !is_input(name) && !wanted.contains(name) {
                wanted.push(name.clone());
            }
        }
    }
    let (values, inputs_from) = whole_run(&model, &inputs, &wanted)?;
    let value = |name: &str| {
        inputs
            .iter()
            .chain(values.iter())
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    };

    let (runtimes, unavailable) = started(&options.runtimes)?;
    let mut ops = Vec::new();
    for (domain, op_type, i, count) in first {
        let node = &graph.node[i];
        let feeds: Vec<(String, Tensor)> = node
            .input
            .iter()
            .filter(|n| !n.is_empty() && !index.is_initializer(n))
            .filter_map(|n| value(n).map(|t| (n.clone(), t.clone())))
            .collect();
        let described = node
            .input
            .iter()
            .filter(|n| !n.is_empty())
            .map(|n| {
                match value(n).map(|t| (t.dtype, t.shape.clone())).or_else(|| {
                    let t = model.initializer(n)?.ok()?;
                    Some((t.dtype, t.shape))
                }) {
                    Some((dtype, shape)) => format!("{dtype}{shape:?}"),
                    None => format!("`{n}`"),
                }
            })
            .collect();
        let outputs: Vec<String> = node
            .output
            .iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .collect();
        let extract = extract_nodes(&model, &[i], &outputs, &feeds);
        let support = supported(&runtimes, &extract, &feeds, &outputs);
        ops.push(OpUse {
            opset: opsets.get(&domain).copied(),
            domain,
            op_type,
            count,
            node: node.display_name().to_string(),
            inputs: described,
            support,
        });
    }
    ops.sort_by(|a, b| {
        uncovered(b)
            .cmp(&uncovered(a))
            .then(b.count.cmp(&a.count))
            .then_with(|| (&a.domain, &a.op_type).cmp(&(&b.domain, &b.op_type)))
    });
    Ok(AuditReport {
        schema: AUDIT_SCHEMA,
        model: options
            .model
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        ir_version: model.proto.ir_version(),
        opsets: opsets
            .into_iter()
            .map(|(domain, version)| Opset { domain, version })
            .collect(),
        inputs_from,
        runtimes: runtimes.into_iter().map(|(s, _)| s).collect(),
        unavailable,
        ops,
        machine: Machine::this(),
    })
}

/// The first node of each op (domain, op type, its index) and how many nodes use it, in
/// graph order.
fn first_nodes(graph: &layerdiff_onnx::GraphProto) -> Vec<(String, String, usize, usize)> {
    let mut first: Vec<(String, String, usize, usize)> = Vec::new();
    for (i, node) in graph.node.iter().enumerate() {
        let (domain, op) = (
            domain_name(node.domain()).to_string(),
            node.op_type().to_string(),
        );
        match first
            .iter_mut()
            .find(|(d, o, _, _)| *d == domain && *o == op)
        {
            Some(entry) => entry.3 += 1,
            None => first.push((domain, op, i, 1)),
        }
    }
    first
}

/// A runtime the audit runs each op on, by its spelling.
type Started = (String, Box<dyn layerdiff_runtime::Runtime + Send + Sync>);

/// The runtimes asked for, started (one that loads a custom-op library checks each op in a
/// worker process: a kernel that crashes fails its op, not the audit), and those that cannot
/// run here, with why; refused when none can.
fn started(specs: &[RuntimeSpec]) -> Result<(Vec<Started>, Vec<Support>)> {
    let (mut runtimes, mut unavailable) = (Vec::new(), Vec::new());
    for spec in specs {
        match spec.build_isolated(Isolation::Auto) {
            Ok(runtime) => runtimes.push((spec.spelling(), runtime)),
            Err(e) => unavailable.push(Support {
                runtime: spec.spelling(),
                status: "unavailable".to_string(),
                error: Some(error_chain(&e)),
            }),
        }
    }
    if runtimes.is_empty() {
        let why: Vec<String> = unavailable
            .iter()
            .map(|u| u.error.clone().unwrap_or_default())
            .collect();
        return Err(Error::Usage(format!(
            "no runtime asked for can run here: {}",
            why.join("; ")
        )));
    }
    Ok((runtimes, unavailable))
}

/// Whether each runtime runs one op alone (`extract`, fed `feeds`, giving `outputs`).
fn supported(
    runtimes: &[Started],
    extract: &layerdiff_onnx::Result<Model>,
    feeds: &[(String, Tensor)],
    outputs: &[String],
) -> Vec<Support> {
    runtimes
        .iter()
        .map(|(spelling, runtime)| {
            let (status, error) = match extract {
                Err(e) => (
                    "untested",
                    Some(format!("could not be taken out alone: {e}")),
                ),
                Ok(extract) => match runtime.run(extract, feeds, outputs) {
                    Ok(_) => ("runs", None),
                    Err(e) => ("fails", Some(error_chain(&e))),
                },
            };
            Support {
                runtime: spelling.clone(),
                status: status.to_string(),
                error,
            }
        })
        .collect()
}

/// The values `wanted` from a run of the whole model, on ONNX Runtime's CPU provider or else
/// tract, and which of them ran it (none when nothing is wanted).
fn whole_run(
    model: &Model,
    inputs: &[(String, Tensor)],
    wanted: &[String],
) -> Result<(Vec<(String, Tensor)>, String)> {
    if wanted.is_empty() {
        // Every op reads only the model's inputs and weights: nothing to run.
        return Ok((Vec::new(), "the model's own inputs".to_string()));
    }
    let mut exposed = model.clone();
    expose_values(&mut exposed, wanted)?;
    let mut failures = Vec::new();
    for spec in [RuntimeSpec::ort_cpu(), RuntimeSpec::tract()] {
        let outcome = spec
            .build()
            .and_then(|runtime| runtime.run(&exposed, inputs, wanted));
        match outcome {
            Ok(values) => return Ok((values, spec.spelling())),
            Err(e) => failures.push(format!("{}: {}", spec.spelling(), error_chain(&e))),
        }
    }
    Err(Error::Usage(format!(
        "cannot take each op's inputs from a run of the whole model: {}",
        failures.join("; ")
    )))
}

/// The audit as text: a line per op, then what each failing runtime said.
pub fn to_text(report: &AuditReport) -> String {
    let opsets: Vec<String> = report
        .opsets
        .iter()
        .map(|o| format!("{} {}", o.domain, o.version))
        .collect();
    let failing = report.ops.iter().filter(|o| uncovered(o)).count();
    let untried = report
        .ops
        .iter()
        .filter(|o| o.support.iter().any(|s| s.status == "untested"))
        .count();
    let verdict = match (failing, untried) {
        (0, 0) => "every runtime runs every op".to_string(),
        (0, n) => format!(
            "every runtime runs every op it was tried on; {n} op(s) could not be tried alone"
        ),
        (f, 0) => format!("{f} op(s) that some runtime cannot run"),
        (f, n) => {
            format!("{f} op(s) that some runtime cannot run; {n} op(s) could not be tried alone")
        }
    };
    let mut out = format!(
        "{}: {} ops (opsets: {}; IR version {}), tried on {} with the values they read in {}: {verdict}\n",
        report.model,
        report.ops.len(),
        opsets.join(", "),
        report.ir_version,
        report.runtimes.join(", "),
        if report.inputs_from.starts_with("the model") {
            report.inputs_from.clone()
        } else {
            format!("a run on {}", report.inputs_from)
        },
    );
    let width = report
        .ops
        .iter()
        .map(|o| o.domain.len() + o.op_type.len() + 2)
        .max()
        .unwrap_or(2);
    out.push_str(&format!("  {:<width$}  {:>5}", "op", "nodes"));
    for r in &report.runtimes {
        out.push_str(&format!("  {r:<8}"));
    }
    out.push('\n');
    for op in &report.ops {
        let name = format!("{}::{}", op.domain, op.op_type);
        out.push_str(&format!("  {name:<width$}  {:>5}", op.count));
        for s in &op.support {
            out.push_str(&format!("  {:<8}", s.status));
        }
        out.push('\n');
    }
    for u in &report.unavailable {
        out.push_str(&format!(
            "  {} is unavailable here: {}\n",
            u.runtime,
            u.error.as_deref().unwrap_or("")
        ));
    }
    for op in &report.ops {
        for s in op.support.iter().filter(|s| s.status != "runs") {
            out.push_str(&format!(
                "  {} {} {} (node `{}`, reading {}): {}\n",
                s.runtime,
                if s.status == "fails" {
                    "cannot run"
                } else {
                    "did not try"
                },
                op.op_type,
                op.node,
                op.inputs.join(", "),
                s.error.as_deref().unwrap_or("")
            ));
        }
    }
    out
}

/// The audit as Markdown.
pub fn to_markdown(report: &AuditReport) -> String {
    let mut out = format!(
        "# layerdiff audit: {}\n\nIR version {}; opsets: {}. Each op's first node tried alone on each runtime, fed the values it reads (from: {}).\n\n| op | nodes | reads |",
        report.model,
        report.ir_version,
        report
            .opsets
            .iter()
            .map(|o| format!("{} {}", o.domain, o.version))
            .collect::<Vec<_>>()
            .join(", "),
        report.inputs_from
    );
    for r in &report.runtimes {
        out.push_str(&format!(" `{r}` |"));
    }
    out.push_str("\n|---|---|---|");
    out.push_str(&"---|".repeat(report.runtimes.len()));
    out.push('\n');
    for op in &report.ops {
        out.push_str(&format!(
            "| `{}::{}` | {} | {} |",
            op.domain,
            op.op_type,
            op.count,
            op.inputs.join(", ")
        ));
        for s in &op.support {
            let cell = match &s.error {
                Some(e) if s.status != "runs" => {
                    format!("{}: {}", s.status, e.replace('|', "\\|").replace('\n', " "))
                }
                _ => s.status.clone(),
            };
            out.push_str(&format!(" {cell} |"));
        }
        out.push('\n');
    }
    out
}

impl Rendered for AuditReport {
    fn render(&self, format: Format) -> Option<String> {
        table_forms(self, format, to_markdown, to_text)
    }
}

/// Runs the `audit` verb; returns the exit code (0 every runtime runs every op, 1 one does not,
/// 2 layerdiff could not audit the model).
pub fn run(options: &AuditOptions, to: &Destinations) -> u8 {
    let done = audit(options).and_then(|report| {
        publish(&report, to)?;
        Ok(report)
    });
    match done {
        Ok(report) => crate::interrupt::exit_code().unwrap_or(report.exit_code()),
        Err(err) => err.exit(),
    }
}
