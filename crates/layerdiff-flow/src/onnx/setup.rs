//! What one comparison of an ONNX model is set up from and ends with: the files read, the sides
//! as spelled (expected values or runtimes), the inputs, the float64 sides, the target's graph,
//! the engine's run, and what the report adds after it.

use super::{
    Baseline, Engine, EngineParts, ExpectedSide, FallbackSide, GraphBaseline, GraphIndex,
    GraphSide, Header, Lacking, Model, OWN, OnnxOptions, OnnxSide, RUNTIME, Report, Result,
    Runtime, Side, Stopwatch, Tensor, Tolerance, check_inputs, fit_inputs, float64_truth,
    generate_inputs, inside_fusion, lacking, prepare_target, read_inputs,
};
/// The engine run on the comparison's sides: planned, advanced segment by segment (with a progress
/// line on a terminal where `progress`), concluded; with how it was split.
pub(super) fn run_engine(
    header: Header,
    alignment: crate::Alignment,
    (reference, target): (Box<dyn Side>, Box<dyn Side>),
    (truth, baseline): Float64Sides,
    inputs: Vec<(String, Tensor)>,
    settings: crate::Settings,
    (clock, progress): (Stopwatch, bool),
) -> Result<(Report, crate::Segmentation)> {
    let mut engine = Engine::new(EngineParts {
        header,
        alignment,
        reference,
        target,
        truth,
        baseline,
        inputs,
        settings,
        clock,
    })?;
    engine.clock.lap("pairing values and planning the run", OWN);
    if progress {
        crate::progress::phase("comparing the layers");
    }
    engine.progress = crate::progress::Ticker::new(engine.layer_count(), !progress);
    let segmentation = engine.segmentation();
    engine.advance()?;
    Ok((engine.finish()?, segmentation))
}

/// The target's name in the progress lines: its runtime's, or as spelled.
pub(super) fn target_name(
    options: &OnnxOptions,
    given: &Option<Box<dyn Runtime + Send + Sync>>,
) -> String {
    given
        .as_ref()
        .map_or_else(|| options.target_spec().spelling(), |r| r.name().into())
}

/// Whether the values `reference` and `target` are both held, where a side is a file of
/// expected values, which holds only some: those are compared (on either side).
pub(super) fn held_by(
    reference_expected: Option<&ExpectedSide>,
    target_holds: Option<&[String]>,
    reference: &str,
    target: Option<&str>,
) -> bool {
    reference_expected.is_none_or(|e| e.provides(reference))
        && target_holds.is_none_or(|held| target.is_some_and(|t| held.iter().any(|h| h == t)))
}

/// A side as spelled: a file of expected values, or a runtime started.
pub(super) type Spelled = (Option<ExpectedSide>, Option<Box<dyn Runtime + Send + Sync>>);

/// A side spelled as a file of expected values, loaded (`label` names it, `model` is the file
/// it holds values of); `None` for a runtime.
pub(super) fn expected(
    spec: &OnnxSide,
    label: &str,
    model: &Model,
) -> Result<Option<ExpectedSide>> {
    match spec {
        OnnxSide::Expected(path) => {
            ExpectedSide::load(path, label.to_string(), model.clone()).map(Some)
        }
        _ => Ok(None),
    }
}

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
    expected: &[&Option<ExpectedSide>],
) -> Result<MadeInputs> {
    let stored = expected
        .iter()
        .filter_map(|e| e.as_ref())
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
