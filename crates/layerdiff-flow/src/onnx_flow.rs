//! `layerdiff onnx`: one ONNX model on two runtimes, or two versions of a model. Every value
//! a reference node produces is matched to a target value (by name, then by producing node);
//! values an optimizer fused or removed are explained from the target's structure. The two
//! sides then go through the [`Engine`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use layerdiff_core::{Layer, Location, Report, Tensor, Tolerance};
use layerdiff_onnx::{GraphIndex, MAX_GROUP_NODES, Model, NCHWC_DOMAIN, NodeInfo, to_float64};
use layerdiff_runtime::{ExactElementwise, PerNode, Runtime, RuntimeSpec};

use crate::inputs::{InputPlan, check_inputs, fit_inputs, generate_inputs, read_inputs};
use crate::output::{Destinations, deliver, exit_code};
use crate::shipped::prepare_target;
use crate::timings::{OWN, RUNTIME, Stopwatch};
use crate::{
    Alignment, Baseline, Engine, Error, ExpectedSide, FallbackSide, GraphBaseline, GraphSide,
    Header, Result, Segmentation, Settings, Shared, Side,
};

/// What `layerdiff onnx` is asked to compare, parsed.
#[derive(Debug, Clone)]
pub struct OnnxOptions {
    /// The reference model file.
    pub model: PathBuf,
    /// A second model file to compare against (`None`: the reference file on both sides).
    pub vs: Option<PathBuf>,
    /// The reference side.
    pub reference: RuntimeSpec,
    /// The target side (`None`: tract, or ONNX Runtime on the CPU with `vs`).
    pub target: Option<RuntimeSpec>,
    /// Inputs read from this file (`None`: generated, or stored with expected values).
    pub inputs: Option<PathBuf>,
    /// How inputs are generated.
    pub generate: InputPlan,
    /// Tolerance, local error, memory budget.
    pub settings: Settings,
    /// Whether to run the reference graph in float64 as the numerical truth (`--tolerance
    /// auto` needs it, and implies it).
    pub float64: bool,
    /// Whether to judge each value's own error against its same-precision baseline: the
    /// reference's node in float64 on its inputs rounded to the target's dtype (with local
    /// error only).
    pub baseline: bool,
}

/// A finished run: its report, how it was split, and the inputs both sides were given.
pub struct Outcome {
    /// The report.
    pub report: Report,
    /// How the run was split to bound its memory.
    pub segmentation: Segmentation,
    /// The inputs.
    pub inputs: Vec<(String, Tensor)>,
    /// Their seed, when generated.
    pub seed: Option<u64>,
}

/// Runs the `onnx` verb: compares, writes and prints its outputs (`to`), and returns the exit
/// code (0 clean, 1 drift, 2 could not run, with the error printed to stderr).
pub fn run(options: &OnnxOptions, to: &Destinations, ort_library: Option<&Path>) -> u8 {
    let outcome = compare_on(options, None, ort_library, !to.quiet).and_then(|outcome| {
        let notes: Vec<String> = outcome.segmentation.text().into_iter().collect();
        deliver(
            outcome.report,
            to,
            &outcome.inputs,
            outcome.seed,
            &notes,
            Stopwatch::default(),
        )
    });
    match outcome {
        Ok(report) => exit_code(&report, to.fail_on),
        Err(err) => {
            eprintln!("error: {}", crate::error_chain(&err));
            2
        }
    }
}

/// Compares as `layerdiff onnx` does (ONNX Runtime loaded from `ort_library`, else found).
/// Drift is a finding, not an error.
pub fn compare(options: &OnnxOptions, ort_library: Option<&Path>) -> Result<Outcome> {
    compare_on(options, None, ort_library, false)
}

/// [`compare`] with the target computed by `target` instead of `options.target`: a runtime of
/// one's own (a vendor's backend behind the [`Runtime`] trait) against the reference.
pub fn compare_with(
    options: &OnnxOptions,
    target: Box<dyn Runtime + Send + Sync>,
    ort_library: Option<&Path>,
) -> Result<Outcome> {
    compare_on(options, Some(target), ort_library, false)
}

/// `progress`: a progress line on stderr while the layers run, when it is a terminal.
pub(crate) fn compare_on(
    options: &OnnxOptions,
    target_runtime: Option<Box<dyn Runtime + Send + Sync>>,
    ort_library: Option<&Path>,
    progress: bool,
) -> Result<Outcome> {
    let mut clock = Stopwatch::default();
    let reference_model = Model::load(&options.model)?;
    let target_model = options.vs.as_ref().map(Model::load).transpose()?;
    let target_spec = options.target.clone().unwrap_or(if options.vs.is_some() {
        RuntimeSpec::ort_cpu()
    } else {
        RuntimeSpec::Tract
    });
    clock.lap("loading models", OWN);
    let (reference_label, target_label) = (
        file_name(&options.model),
        file_name(options.vs.as_ref().unwrap_or(&options.model)),
    );
    let expected = |spec: &RuntimeSpec, label: &str, model: &Model| match spec {
        RuntimeSpec::Expected(path) => {
            ExpectedSide::load(path, label.to_string(), model.clone()).map(Some)
        }
        _ => Ok(None),
    };
    let target_file = target_model.as_ref().unwrap_or(&reference_model);
    let reference_expected = expected(&options.reference, &reference_label, &reference_model)?;
    let target_expected = match target_runtime {
        Some(_) => None,
        None => expected(&target_spec, &target_label, target_file)?,
    };
    let build = |spec: &RuntimeSpec| match spec {
        RuntimeSpec::Expected(_) => Ok(None),
        spec => spec.build(ort_library).map(Some),
    };
    let reference_runtime = build(&options.reference)?;
    let target_runtime = match target_runtime {
        Some(runtime) => Some(runtime),
        None => build(&target_spec)?,
    };
    clock.lap("runtime start-up", RUNTIME);
    let stored = [&reference_expected, &target_expected]
        .into_iter()
        .flatten()
        .find_map(|e| e.inputs().map(<[_]>::to_vec));
    let (inputs, seed) = match (&options.inputs, stored) {
        (Some(path), _) => (
            read_inputs(path, &GraphIndex::new(reference_model.graph()))?,
            None,
        ),
        (None, Some(stored)) => (stored, None),
        (None, None) => (
            generate_inputs(&GraphIndex::new(reference_model.graph()), &options.generate)?,
            Some(options.generate.seed),
        ),
    };
    clock.lap("making inputs", OWN);
    let target_file_index = GraphIndex::new(target_file.graph());
    check_inputs(&GraphIndex::new(reference_model.graph()), &inputs)?;
    let (target_inputs, input_notes) = match &target_expected {
        Some(_) => (inputs.clone(), Vec::new()),
        None => fit_inputs(&target_file_index, &inputs),
    };
    check_inputs(&target_file_index, &target_inputs)?;

    let mut renames = crate::shipped::Renames::default();
    let target_holds = target_expected.as_ref().map(ExpectedSide::names);
    let target: Box<dyn Side> = match (target_expected, target_runtime) {
        (Some(expected), _) => Box::new(expected.given(&inputs)),
        (None, Some(runtime)) => {
            let prepared = prepare_target(
                &reference_model,
                target_model,
                runtime,
                &target_inputs,
                &mut clock,
            )?;
            if prepared.shipped.is_some() {
                clock.lap("optimizing the target graph", RUNTIME);
            }
            let model = prepared.model.unwrap_or_else(|| reference_model.clone());
            renames = prepared.renames.clone();
            Box::new(
                GraphSide::new(Some(target_label), model, prepared.runtime, &target_inputs)
                    .shipping(prepared.renames, prepared.shipped, prepared.placement)
                    .noting(input_notes),
            )
        }
        (None, None) => unreachable!("a side is a runtime or expected values"),
    };
    // A file of expected values holds only some values: compare those (on either side).
    let provides = |reference: &str, target: Option<&str>| {
        reference_expected
            .as_ref()
            .is_none_or(|e| e.provides(reference))
            && target_holds
                .as_ref()
                .is_none_or(|held| target.is_some_and(|t| held.iter().any(|h| h == t)))
    };
    let target_graph = match target.plan_view().graph {
        Some(index) => index.clone(),
        None => target_file_index,
    };
    let alignment = align(&reference_model, &target_graph, &renames, &provides);
    let wants_truth = options.float64 || options.settings.tolerance == Tolerance::Auto;
    let truth = if wants_truth {
        Some(float64_truth(
            &options.model,
            &reference_model,
            &inputs,
            ort_library,
        )?)
    } else {
        None
    };
    let baseline = (options.baseline && options.settings.local)
        .then(|| GraphBaseline::new(&reference_model, ort_library))
        .transpose()?
        .map(|b| Baseline::Graph(Box::new(b)));
    let reference: Box<dyn Side> = match (reference_expected, reference_runtime) {
        (Some(expected), _) => Box::new(expected.given(&inputs)),
        (None, Some(runtime)) => Box::new(GraphSide::new(
            Some(reference_label),
            reference_model,
            runtime,
            &inputs,
        )),
        (None, None) => unreachable!("a side is a runtime or expected values"),
    };
    let header = Header {
        command: "onnx".to_string(),
        model: file_name(&options.model),
        seed,
    };
    let mut engine: Engine<_, _, FallbackSide> = Engine::new(
        header,
        alignment,
        reference,
        target,
        truth,
        baseline,
        inputs.clone(),
        options.settings.clone(),
        clock,
    )?;
    engine.clock.lap("pairing values and planning the run", OWN);
    engine.progress = crate::progress::Ticker::for_terminal(engine.layer_count(), !progress);
    let segmentation = engine.segmentation();
    engine.advance()?;
    let report = engine.finish()?;
    Ok(Outcome {
        report,
        segmentation,
        inputs,
        seed,
    })
}

/// The reference graph in float64, computed by ONNX Runtime on the CPU or, where it lacks a
/// float64 kernel (Conv, Erf), by tract, or, where each lacks one (a CNN: Conv and Gemm), node by
/// node on whichever has it: the truth both sides are measured against.
fn float64_truth(
    model_path: &Path,
    reference: &Model,
    inputs: &[(String, Tensor)],
    ort_library: Option<&Path>,
) -> Result<FallbackSide> {
    let wide = to_float64(reference)
        .map_err(|e| Error::Usage(format!("cannot make the float64 copy of the model: {e}")))?;
    let inputs: Vec<(String, Tensor)> = inputs
        .iter()
        .map(|(n, t)| {
            let t = if t.dtype.is_float() {
                t.clone().cast(layerdiff_core::DType::F64)
            } else {
                t.clone()
            };
            (n.clone(), t)
        })
        .collect();
    let runtimes = || -> Result<[Box<dyn Runtime + Send + Sync>; 2]> {
        Ok([
            RuntimeSpec::ort_cpu().build(ort_library)?,
            RuntimeSpec::Tract.build(ort_library)?,
        ])
    };
    let [ort, tract] = runtimes()?;
    let label = format!("float64 copy of {}", file_name(model_path));
    Ok(FallbackSide::new(vec![
        GraphSide::new(Some(label.clone()), wide.clone(), ort, &inputs),
        GraphSide::new(Some(label.clone()), wide.clone(), tract, &inputs),
        GraphSide::new(
            Some(label),
            wide,
            Box::new(PerNode::new({
                let [ort, tract] = runtimes()?;
                vec![ort, tract, Box::new(ExactElementwise)]
            })),
            &inputs,
        ),
    ]))
}

/// Pairs each value a reference node produces with a target value, in the reference's order,
/// keeping the pairs whose values both sides `provide` (reference value, target value).
fn align(
    reference: &Model,
    target: &GraphIndex,
    renames: &crate::shipped::Renames,
    provides: &dyn Fn(&str, Option<&str>) -> bool,
) -> Alignment {
    let pairings: Vec<Pairing> = pair_values(reference, target, &renames.blocked)
        .into_iter()
        .filter(|p| provides(&p.value, p.target.as_deref().ok()))
        .collect();
    let layers = pairings
        .iter()
        .enumerate()
        .map(|(index, p)| {
            let mut layer = Layer::new(index, p.value.clone(), Vec::new(), String::new());
            layer.location = Some(Location::onnx(&p.value, &p.node, &p.op_type));
            layer.reason = match &p.target {
                Err(reason) => Some(reason.clone()),
                Ok(_) if renames.restored.contains_key(&p.value) => {
                    renames.restored.get(&p.value).cloned()
                }
                Ok(name) if name != &p.value => {
                    Some(format!("matched by node: the target calls it `{name}`"))
                }
                Ok(_) => None,
            };
            layer
        })
        .collect();
    Alignment {
        layers,
        reference: pairings.iter().map(|p| p.value.clone()).collect(),
        refutable: vec![false; pairings.len()],
        target: pairings.into_iter().map(|p| p.target.ok()).collect(),
        inconclusive: None,
        nothing_compared_hint: "values are paired by name, then by producing node; `--vs` must be a version of the same model, and `expected:` files must hold values named as in the model".to_string(),
        shared: Shared::EachLayer,
    }
}

/// A reference value and where its counterpart is, or why it has none.
struct Pairing {
    value: String,
    node: String,
    op_type: String,
    target: Result<String, String>,
}

/// Matches each value produced by a reference node to a target value: the same name, else the
/// same output of a node with the same name.
fn pair_values(
    reference: &Model,
    t: &GraphIndex,
    blocked: &HashMap<String, String>,
) -> Vec<Pairing> {
    let r = GraphIndex::new(reference.graph());
    let mut pairings = Vec::new();
    for node in r.nodes() {
        for (position, value) in node
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
        {
            let target_value = if t.producer(value).is_some() {
                Ok(value.clone())
            } else if let Some(same_node) = t.nodes().iter().find(|n| n.name == node.name) {
                if same_node.op_type != node.op_type || same_node.domain != node.domain {
                    // ONNX Runtime names a fused node after the first node it absorbed.
                    Err(format!(
                        "fused: the target's node `{}` is now a {}, whose output is a later value",
                        same_node.name, same_node.op_type
                    ))
                } else {
                    same_node.outputs.get(position).cloned().ok_or_else(|| {
                        format!("the target's node `{}` has no output {position}", node.name)
                    })
                }
            } else {
                Err(why_missing(&r, t, node))
            };
            // A value in a blocked layout holds the same numbers in another order.
            let target_value = target_value.and_then(|v| match blocked.get(&v) {
                Some(why) => Err(format!(
                    "held by the target in a blocked (NCHWc) layout as `{v}`, not given back: {why}"
                )),
                None => Ok(v),
            });
            pairings.push(Pairing {
                value: value.clone(),
                node: node.name.clone(),
                op_type: node.op_type.clone(),
                target: target_value,
            });
        }
    }
    pairings
}

/// Why a reference node's value has no counterpart, read from the target's structure: the target
/// node that now reads the same data inputs fused or replaced it; with no reader, it was removed.
fn why_missing(r: &GraphIndex, t: &GraphIndex, node: &NodeInfo) -> String {
    let data_inputs: Vec<&String> = node
        .inputs
        .iter()
        .filter(|i| !i.is_empty() && !r.is_initializer(i))
        .collect();
    let known_readers: Vec<&str> = data_inputs
        .iter()
        .flat_map(|i| r.consumers(i))
        .map(|n| n.name.as_str())
        .collect();
    let newcomer = data_inputs
        .iter()
        .flat_map(|i| t.consumers(i))
        .find(|m| !known_readers.contains(&m.name.as_str()) && !is_conversion(m));
    match newcomer {
        Some(m) => {
            let downstream = m
                .outputs
                .iter()
                .find(|o| r.producer(o).is_some_and(|p| p.index > node.index));
            match downstream {
                Some(out) => format!(
                    "fused or removed: the target's {} node `{}` now reads this node's inputs and produces `{out}` directly",
                    m.op_type, m.name
                ),
                None => match computed_downstream(r, t, node) {
                    Some((value, fused)) if fused.index == m.index => format!(
                        "fused or removed: the target's {} node `{}` produces `{value}` without it",
                        m.op_type, m.name
                    ),
                    _ => format!(
                        "replaced: the target's {} node `{}` reads this node's inputs instead",
                        m.op_type, m.name
                    ),
                },
            }
        }
        None if let Some((value, m)) = computed_downstream(r, t, node) => format!(
            "fused or removed: the target's {} node `{}` produces `{value}` without it",
            m.op_type, m.name
        ),
        None if data_inputs
            .iter()
            .any(|i| t.consumers(i).next().is_some() || t.has_value(i)) =>
        {
            "removed from the target (no node of that name or value)".to_string()
        }
        None => {
            "not in the target: neither the value, its node, nor its inputs are there".to_string()
        }
    }
}

/// Whether `node` only converts a value between layouts (ONNX Runtime's NCHWc reorders, and
/// those layerdiff adds to give back a renamed value): it computes nothing a value came from.
fn is_conversion(node: &NodeInfo) -> bool {
    node.domain == NCHWC_DOMAIN && matches!(node.op_type.as_str(), "ReorderInput" | "ReorderOutput")
}

/// The nearest value downstream of `node` that the target computes (breadth first over the
/// reference's readers, each step in graph order), and the target node that computes it: where
/// an optimizer fused the node's work. Behind a layout conversion, the node is the one whose
/// output it converts.
fn computed_downstream<'t>(
    r: &GraphIndex,
    t: &'t GraphIndex,
    node: &NodeInfo,
) -> Option<(String, &'t NodeInfo)> {
    let mut frontier: Vec<&NodeInfo> = vec![node];
    let mut seen = std::collections::HashSet::new();
    while !frontier.is_empty() && seen.len() < MAX_GROUP_NODES {
        let mut next: Vec<&NodeInfo> = Vec::new();
        for n in frontier {
            for out in n.outputs.iter().filter(|o| !o.is_empty()) {
                if n.index != node.index
                    && let Some(mut producer) = t.producer(out)
                {
                    while is_conversion(producer) {
                        producer = t.producer(producer.inputs.first()?)?;
                    }
                    return Some((out.clone(), producer));
                }
                next.extend(r.consumers(out).filter(|c| seen.insert(c.index)));
            }
        }
        next.sort_by_key(|n| n.index);
        frontier = next;
    }
    None
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
