//! What a comparison of an ONNX model ([`super::comparison`], and `--opaque`'s search) is set
//! up from and ends with: the files read, a side's runtime started, the inputs, the float64
//! sides, the target's graph, and what the report adds after the engine's run.

use layerdiff_core::{Report, Tensor, Tolerance};
use layerdiff_onnx::{GraphIndex, Model};
use layerdiff_runtime::Runtime;

use super::fusion::inside_fusion;
use super::lacking::{self, Lacking};
use super::{OnnxOptions, OnnxSide, float64_truth};
use crate::inputs::{check_inputs, fit_inputs, generate_inputs, read_inputs};
use crate::sides::graph::shipped::prepare_target;
use crate::timings::{RUNTIME, Stopwatch};
use crate::{Baseline, ExpectedSide, FallbackSide, GraphBaseline, GraphSide, Result};

/// A side spelled as a runtime, started (in a worker process where `--isolate` says);
/// `None` for a file of expected values.
pub(super) fn built(
    spec: &OnnxSide,
    options: &OnnxOptions,
) -> Result<Option<Box<dyn Runtime + Send + Sync>>> {
    (spec.runtime())
        .map(|runtime| runtime.build_isolated(options.isolation))
        .transpose()
        .map_err(Into::into)
}

/// The two files of a comparison, read: the reference's, the target's where it is another
/// (`--vs`), what differs between them (reported whatever the values show), and the target
/// without the nodes its runtime `lacks` (those removed).
pub(super) struct Loaded {
    pub(super) reference_model: Model,
    pub(super) target_model: Option<Model>,
    pub(super) differences: Vec<layerdiff_core::FileDifference>,
    pub(super) removed: std::collections::HashSet<String>,
}

pub(super) fn loaded(options: &OnnxOptions, lacks: &[Lacking]) -> Result<Loaded> {
    let reference_model = Model::load(&options.model)?;
    let mut target_model = options.vs.as_ref().map(Model::load).transpose()?;
    let differences = target_model
        .as_ref()
        .map(|t| crate::engine::evidence::file_differences(&reference_model, t))
        .unwrap_or_default();
    let mut removed = std::collections::HashSet::new();
    if !lacks.is_empty() {
        let (pruned, gone) =
            lacking::without(target_model.as_ref().unwrap_or(&reference_model), lacks)?;
        (target_model, removed) = (Some(pruned), gone);
    }
    Ok(Loaded {
        reference_model,
        target_model,
        differences,
        removed,
    })
}

/// The float64 truth and the baseline, where asked for.
pub(super) type Float64Sides = (Option<FallbackSide>, Option<Box<dyn Baseline>>);

/// The float64 computations the settings ask for: the reference graph run whole in float64
/// (the truth), and each node's same-precision baseline, of groups of up to `reach` nodes.
pub(super) fn float64_sides(
    options: &OnnxOptions,
    reference_model: &Model,
    inputs: &[(String, Tensor)],
    reach: usize,
) -> Result<Float64Sides> {
    let truth = if options.settings.truth() {
        Some(float64_truth(&options.model, reference_model, inputs)?)
    } else {
        None
    };
    let baseline = options
        .settings
        .baseline()
        .then(|| GraphBaseline::new(reference_model))
        .transpose()?
        .map(|b| Box::new(b.reaching(reach)) as Box<dyn Baseline>);
    Ok((truth, baseline))
}

/// The target's file as the comparison runs it: its model (`None`: the reference's own), its
/// label, the comparison's inputs (fitted to it as it declares them), and whether it is
/// another file than the reference's (`--vs`).
pub(super) struct TargetFile<'a> {
    pub(super) model: Option<Model>,
    pub(super) label: String,
    pub(super) inputs: &'a [(String, Tensor)],
    pub(super) other: bool,
    /// Whether its values are asked for (not only its outputs): a runtime that compiles its
    /// graph is then measured with and without them ([`super::exposure`]), by `tolerance`.
    pub(super) exposes: bool,
    pub(super) tolerance: Tolerance,
}

/// The target as a graph run by `runtime`: the graph that ships where the runtime optimizes
/// it; another file than the reference's, run as written, also computes a layer beyond what
/// its precision explains as that file writes it, to tell the file from the runtime (an
/// optimized graph is the runtime's own work).
pub(super) fn graph_target(
    reference_model: &Model,
    file: TargetFile<'_>,
    runtime: Box<dyn Runtime + Send + Sync>,
    clock: &mut Stopwatch,
) -> Result<GraphSide> {
    let index = GraphIndex::new(file.model.as_ref().unwrap_or(reference_model).graph());
    let (inputs, mut notes) = fit_inputs(&index, file.inputs);
    check_inputs(&index, &inputs)?;
    // a graph of one node fuses nothing
    let model = file.model.as_ref().unwrap_or(reference_model);
    if runtime.compiles_graph() && file.exposes && model.graph().node.len() > 1 {
        notes.extend(super::exposure::note(
            runtime.as_ref(),
            model,
            &inputs,
            file.tolerance,
        ));
        clock.lap("the target's graph as written", RUNTIME);
    }
    let prepared = prepare_target(reference_model, file.model, runtime, &inputs, clock)?;
    if prepared.shipped.is_some() {
        clock.lap("optimizing the target graph", RUNTIME);
    }
    let as_written = file.other && prepared.shipped.is_none();
    let model = prepared.model.unwrap_or_else(|| reference_model.clone());
    let side = GraphSide::new(Some(file.label), model, prepared.runtime, &inputs)
        .shipping(prepared.renames, prepared.shipped, prepared.placement)
        .noting(notes);
    Ok(if as_written {
        side.computing_as_written()
    } else {
        side
    })
}

/// The inputs of the comparison, checked against the reference's graph: read from a file,
/// stored with a side's `expected` values, or generated (with their seed, and a note where a
/// dynamic batch took its default).
pub(super) fn made_inputs(
    options: &OnnxOptions,
    reference_model: &Model,
    expected: &[Option<&ExpectedSide>],
) -> Result<MadeInputs> {
    let stored = expected
        .iter()
        .flatten()
        .find_map(|e| e.inputs().map(<[_]>::to_vec));
    let mut batch_note = None;
    let (inputs, seed) = match (&options.inputs, stored) {
        (Some(path), _) => (
            read_inputs(path, &GraphIndex::new(reference_model.graph()))?,
            None,
        ),
        (None, Some(stored)) => (stored, None),
        (None, None) => {
            let index = GraphIndex::new(reference_model.graph());
            batch_note = crate::inputs::defaulted_batch(&index, &options.generate);
            (
                generate_inputs(&index, &options.generate)?,
                Some(options.generate.seed),
            )
        }
    };
    check_inputs(&GraphIndex::new(reference_model.graph()), &inputs)?;
    Ok(MadeInputs {
        inputs,
        seed,
        batch_note,
    })
}

/// The comparison's inputs, their seed where generated, and a note where a dynamic batch
/// took its default.
pub(super) struct MadeInputs {
    pub(super) inputs: Vec<(String, Tensor)>,
    pub(super) seed: Option<u64>,
    pub(super) batch_note: Option<String>,
}

/// What the comparison adds to its report beyond the engine's: the files' differences no
/// defect names, warnings about subgraphs and a defaulted batch, the nodes the target lacks.
pub(super) struct Said<'a> {
    pub(super) differences: Vec<layerdiff_core::FileDifference>,
    pub(super) subgraphs: Option<String>,
    pub(super) batch_note: Option<String>,
    pub(super) removed: &'a std::collections::HashSet<String>,
    pub(super) lacks: &'a [Lacking],
}

impl Said<'_> {
    pub(super) fn add_to(self, report: &mut Report) {
        if report.summary.incomplete.is_none() {
            layerdiff_core::unseen_differences(
                &mut report.layers,
                &mut report.summary,
                self.differences,
            );
        }
        report.summary.warnings.extend(self.subgraphs);
        report.summary.warnings.extend(self.batch_note);
        if !self.lacks.is_empty() {
            lacking::explain(report, self.removed, self.lacks);
        }
    }
}

/// Narrows the headline inside the target's fusion, where it was born in one, node by node.
pub(super) fn narrow_fusion(
    options: &OnnxOptions,
    report: &mut Report,
    inputs: &[(String, Tensor)],
) {
    match inside_fusion(options, report, inputs) {
        Ok(Some((layer, inside))) => report.narrowed(&layer, inside),
        Ok(None) => {}
        Err(e) => report.summary.warnings.push(format!(
            "the headline's fused region could not be narrowed node by node: {}",
            crate::error_chain(&e)
        )),
    }
}
