//! One ONNX model on two runtimes, or two versions of a model: the comparison every ONNX verb
//! runs (`onnx`, `providers`, `bisect`, `reduce`). Every value a reference node produces is
//! matched to a target value (by name, then by producing node); values an optimizer fused or
//! removed are explained from the target's structure. The two sides then go through the
//! [`Engine`]. Pieces of the target's file run alone on its runtime (`pieces`) answer where
//! inside a fusion a difference is born (`fusion`), and make the repros of `reduce`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::spec::onnx_side::OnnxSide;
use layerdiff_core::{Layer, Location, Report, Tensor, Tolerance};
use layerdiff_onnx::{GraphIndex, MAX_GROUP_NODES, Model, NCHWC_DOMAIN, NodeInfo, to_float64_lazy};
use layerdiff_runtime::{Isolation, PerNode, Runtime, RuntimeSpec, Widened};

use crate::inputs::{InputPlan, check_inputs, fit_inputs, generate_inputs, read_inputs};
use crate::sides::graph::shipped::prepare_target;
use crate::timings::{OWN, RUNTIME, Stopwatch};
use crate::{
    Alignment, Baseline, Engine, EngineParts, Error, ExpectedSide, FallbackSide, GraphBaseline,
    GraphSide, Header, Result, Segmentation, Settings, Shared, Side,
};

mod exposure;
mod fusion;
mod lacking;
mod pairing;
mod setup;
use setup::*;
mod opaque;
pub(crate) mod pieces;
pub use fusion::inside_fusion;
use lacking::Lacking;
use pairing::align;

/// The most nodes a repro grows to by default: beyond a handful, a repro is a model again.
pub const MOST_NODES: usize = 5;

/// What `layerdiff onnx` is asked to compare, parsed.
#[derive(Debug, Clone)]
pub struct OnnxOptions {
    /// The reference model file.
    pub model: PathBuf,
    /// A second model file to compare against (`None`: the reference file on both sides).
    pub vs: Option<PathBuf>,
    /// The reference side.
    pub reference: OnnxSide,
    /// The target side (`None`: see [`OnnxOptions::target_spec`]).
    pub target: Option<OnnxSide>,
    /// Inputs read from this file (`None`: generated, or stored with expected values).
    pub inputs: Option<PathBuf>,
    /// How inputs are generated.
    pub generate: InputPlan,
    /// Tolerance, local error, memory budget, and the float64 computations: the truth is the
    /// reference graph run in float64, the baseline each node in float64 on its inputs rounded
    /// to the target's dtype.
    pub settings: Settings,
    /// Whether to bisect what turns a difference on (`--bisect`): the ONNX Runtime optimizers
    /// of a target at `opt=basic|extended|all` ([`crate::verbs::bisect::ort_optimizers`]).
    pub bisect: bool,
    /// Where to write the repro of the headline defect (`--repro DIR`, [`crate::verbs::reduce`]).
    pub repro: Option<PathBuf>,
    /// The most nodes the repro may grow to.
    pub repro_nodes: usize,
    /// Which sides run in a worker process, so that a crash costs only its layers.
    pub isolation: Isolation,
    /// Whether the target runs its graph unmodified (`--opaque`): on node ranges fed with the
    /// reference's values, halved to the node that deviates ([`opaque`]), instead of with every
    /// value it computes marked an output.
    pub opaque: bool,
}

impl OnnxOptions {
    /// The runtime the target is computed on: as given, else ONNX Runtime on the CPU against
    /// another file (`--vs`), else tract (the same file on another runtime). Resolved here,
    /// once, for the run and for what is said of it.
    pub fn target_spec(&self) -> OnnxSide {
        (self.target.clone()).unwrap_or_else(|| {
            OnnxSide::Runs(if self.vs.is_some() {
                RuntimeSpec::ort_cpu()
            } else {
                RuntimeSpec::tract()
            })
        })
    }
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

/// Compares as `layerdiff onnx` does (ONNX Runtime loaded as the process chose, see
/// [`layerdiff_runtime::use_ort_library`]).
/// Drift is a finding, not an error.
pub fn compare(options: &OnnxOptions) -> Result<Outcome> {
    compare_on(options, None, false)
}

/// [`compare`] with the target computed by `target` instead of `options.target`: a runtime of
/// one's own (a vendor's backend behind the [`Runtime`] trait) against the reference.
pub fn compare_with(
    options: &OnnxOptions,
    target: Box<dyn Runtime + Send + Sync>,
) -> Result<Outcome> {
    compare_on(options, Some(target), false)
}

/// `progress`: a progress line on stderr while the layers run, when it is a terminal. A node
/// the target runtime cannot run (an op it lacks) is left out of the target's graph with every
/// node after it that reads what it produces, and the run is made again: the layers before it
/// are compared, the others reported as not compared, and why (see [`lacking`]).
pub(crate) fn compare_on(
    options: &OnnxOptions,
    mut target_runtime: Option<Box<dyn Runtime + Send + Sync>>,
    progress: bool,
) -> Result<Outcome> {
    if options.opaque {
        return opaque::compare(options, target_runtime, progress);
    }
    let own_target = target_runtime.is_some();
    let mut lacks: Vec<Lacking> = Vec::new();
    loop {
        let outcome = compare_once(options, target_runtime.take(), progress, &lacks, false);
        let Err(err) = &outcome else {
            return outcome;
        };
        let target_file = options.vs.as_ref().unwrap_or(&options.model);
        match lacking::lacking(err, target_file) {
            Some(node) if !own_target && !lacks.contains(&node) && lacks.len() < 16 => {
                lacks.push(node)
            }
            _ => return outcome,
        }
    }
}

/// One try of [`compare_on`], the target's graph without the nodes it `lacks`;
/// `outputs_only`: only the graph's outputs are compared, so the target runs its graph as the
/// file holds it (an opaque target's whole-graph check).
fn compare_once(
    options: &OnnxOptions,
    target_runtime: Option<Box<dyn Runtime + Send + Sync>>,
    progress: bool,
    lacks: &[Lacking],
    outputs_only: bool,
) -> Result<Outcome> {
    let mut clock = Stopwatch::default();
    let phase = |what: String| progress.then(|| crate::progress::phase(&what));
    phase(format!("reading {}", options.model.display()));
    let own_target = target_runtime.is_some();
    let Loaded {
        reference_model,
        target_model,
        differences,
        removed,
    } = loaded(options, lacks)?;
    clock.lap("loading models", OWN);
    let reference_label = file_name(&options.model);
    let target_label = file_name(options.vs.as_ref().unwrap_or(&options.model));
    let target_file = target_model.as_ref().unwrap_or(&reference_model);
    let spelled = |spec: &OnnxSide, label: &str, model: &Model| -> Result<Spelled> {
        Ok((expected(spec, label, model)?, built(spec, options)?))
    };
    let target_name = target_name(options, &target_runtime);
    phase(format!("starting {} and {target_name}", options.reference));
    let (reference_expected, reference_runtime) =
        spelled(&options.reference, &reference_label, &reference_model)?;
    let (target_expected, target_runtime) = match target_runtime {
        Some(runtime) => (None, Some(runtime)),
        None => spelled(&options.target_spec(), &target_label, target_file)?,
    };
    clock.lap("runtime start-up", RUNTIME);
    let expecting = [&reference_expected, &target_expected];
    let MadeInputs {
        inputs,
        seed,
        batch_note,
    } = made_inputs(options, &reference_model, &expecting)?;
    clock.lap("making inputs", OWN);
    let reach = reach_of(outputs_only);
    let mut renames = crate::sides::graph::shipped::Renames::default();
    let target_holds = target_expected.as_ref().map(ExpectedSide::names);
    // The graph the target runs (optimized, where its runtime optimizes), to align with.
    let (target, target_graph) = match (target_expected, target_runtime) {
        (Some(expected), _) => {
            let index = GraphIndex::new(target_file.graph());
            check_inputs(&index, &inputs)?;
            (Box::new(expected.given(&inputs)) as Box<dyn Side>, index)
        }
        (None, Some(runtime)) => {
            phase(format!("preparing {target_name}'s graph"));
            let file = TargetFile {
                model: target_model,
                label: target_label,
                inputs: &inputs,
                other: options.vs.is_some(),
                exposes: !outputs_only,
                tolerance: options.settings.tolerance,
            };
            let side = graph_target(&reference_model, file, runtime, &mut clock)?.reaching(reach);
            renames = side.renames.clone();
            let graph = side.index.clone();
            (Box::new(side) as Box<dyn Side>, graph)
        }
        (None, None) => unreachable!("a side is a runtime or expected values"),
    };
    // A file of expected values holds only some values: compare those (on either side).
    let outputs = reference_model.graph().output.iter().map(|o| o.name());
    let provides = |r: &str, t: Option<&str>| {
        held_by(reference_expected.as_ref(), target_holds.as_deref(), r, t)
            && (!outputs_only || outputs.clone().any(|o| o == r))
    };
    let alignment = align(&reference_model, &target_graph, &renames, &provides);
    let float64 = float64_sides(options, &reference_model, &inputs, reach)?;
    let subgraphs = subgraphs_note(reference_model.graph());
    let reference = reference_side(
        (reference_expected, reference_runtime),
        reference_label,
        reference_model,
        &inputs,
    );
    let header = Header {
        command: "onnx".to_string(),
        model: file_name(&options.model),
        seed,
    };
    let (mut report, segmentation) = run_engine(
        header,
        alignment,
        (reference, target),
        float64,
        inputs.clone(),
        options.settings.clone(),
        (clock, progress),
    )?;
    Said {
        differences,
        subgraphs,
        batch_note,
        removed: &removed,
        lacks,
    }
    .add_to(&mut report);
    if options.settings.local && !own_target && report.summary.incomplete.is_none() {
        narrow_fusion(options, &mut report, &inputs);
    }
    Ok(Outcome {
        report,
        segmentation,
        inputs,
        seed,
    })
}

/// The most nodes a layer's group may hold: every node behind an output where only the
/// outputs are compared.
fn reach_of(outputs_only: bool) -> usize {
    if outputs_only {
        usize::MAX
    } else {
        MAX_GROUP_NODES
    }
}

/// The reference as a side: its file of values, or its file run by its runtime.
fn reference_side(
    spelled: Spelled,
    label: String,
    model: Model,
    inputs: &[(String, Tensor)],
) -> Box<dyn Side> {
    match spelled {
        (Some(expected), _) => Box::new(expected.given(inputs)),
        (None, Some(runtime)) => Box::new(GraphSide::new(Some(label), model, runtime, inputs)),
        (None, None) => unreachable!("a side is a runtime or expected values"),
    }
}

/// What a report must say of a graph whose nodes run subgraphs (If, Loop, Scan): such a node
/// is compared by its outputs, as one layer; the nodes inside are not compared one by one.
fn subgraphs_note(graph: &layerdiff_onnx::GraphProto) -> Option<String> {
    use layerdiff_onnx::NodeExt;
    fn inside(graph: &layerdiff_onnx::GraphProto) -> usize {
        let nested = |n: &layerdiff_onnx::NodeProto| n.subgraphs().map(inside).sum::<usize>();
        graph.node.iter().map(|n| 1 + nested(n)).sum()
    }
    let holders: Vec<(String, usize)> = graph
        .node
        .iter()
        .filter(|n| n.subgraphs().next().is_some())
        .map(|n| {
            let nodes = n.subgraphs().map(inside).sum();
            (format!("`{}` ({})", n.display_name(), n.op_type()), nodes)
        })
        .collect();
    if holders.is_empty() {
        return None;
    }
    let nodes: usize = holders.iter().map(|(_, n)| n).sum();
    let named: Vec<&str> = holders.iter().take(3).map(|(h, _)| h.as_str()).collect();
    let more = if holders.len() > 3 {
        format!(" and {} more", holders.len() - 3)
    } else {
        String::new()
    };
    Some(format!(
        "{} node(s) run subgraphs ({}{more}): each is compared by its outputs, as one layer; the {nodes} node(s) inside them are not compared one by one",
        holders.len(),
        named.join(", "),
    ))
}

/// The reference graph in float64, computed by ONNX Runtime on the CPU or, where it lacks a
/// float64 kernel (Conv, Erf), node by node on whichever of layerdiff's own float64 kernels, ONNX
/// Runtime and tract has it ([`PerNode::float64`]), else by tract whole (a node that cannot run
/// alone): the truth both sides are measured against.
fn float64_truth(
    model_path: &Path,
    reference: &Model,
    inputs: &[(String, Tensor)],
) -> Result<FallbackSide> {
    let wide = to_float64_lazy(reference, None)
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
    // `wide` holds its weights as stored: each side widens them as it runs
    let ort = Box::new(Widened(RuntimeSpec::ort_cpu().build()?));
    let tract = Box::new(Widened(RuntimeSpec::tract().build()?));
    let label = format!("float64 copy of {}", file_name(model_path));
    // ONNX Runtime has no float64 Conv: a CNN is not handed to it whole (a copy of its weights
    // in float64, read and refused)
    let whole = !reference.graph().node.iter().any(|n| n.op_type() == "Conv");
    let first = whole.then(|| GraphSide::new(Some(label.clone()), wide.clone(), ort, &inputs));
    Ok(FallbackSide::new(
        first
            .into_iter()
            .chain([
                GraphSide::new(
                    Some(label.clone()),
                    wide.clone(),
                    Box::new(PerNode::float64()?),
                    &inputs,
                ),
                GraphSide::new(Some(label), wide, tract, &inputs),
            ])
            .collect(),
    ))
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
