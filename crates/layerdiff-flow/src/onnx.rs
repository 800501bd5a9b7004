//! One ONNX model on two runtimes, or two versions of a model: the comparison every ONNX verb
//! runs (`onnx`, `providers`, `bisect`, `reduce`). Every value a reference node produces is
//! matched to a target value (by name, then by producing node); values an optimizer fused or
//! removed are explained from the target's structure. The two sides then go through the
//! [`Engine`]. Pieces of the target's file run alone on its runtime (`pieces`) answer where
//! inside a fusion a difference is born (`fusion`), and make the repros of `reduce`.

use std::path::{Path, PathBuf};

use layerdiff_core::{Report, Tensor};
use layerdiff_onnx::{MAX_GROUP_NODES, Model, to_float64_lazy};
use layerdiff_runtime::{Isolation, PerNode, Runtime, RuntimeSpec, Widened};

use crate::inputs::InputPlan;
use crate::spec::onnx_side::OnnxSide;
use crate::{Error, FallbackSide, GraphSide, Result, Segmentation, Settings};

mod comparison;
mod exposure;
mod fusion;
mod lacking;
mod opaque;
mod pairing;
pub(crate) mod pieces;
mod setup;
use comparison::Comparison;
pub use fusion::inside_fusion;
use lacking::Lacking;

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
        let outcome = Comparison::new(options, &lacks, progress).run(target_runtime.take());
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

/// The most nodes a layer's group may hold: every node behind an output where only the
/// outputs are compared.
fn reach_of(outputs_only: bool) -> usize {
    if outputs_only {
        usize::MAX
    } else {
        MAX_GROUP_NODES
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
