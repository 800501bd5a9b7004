//! One try of a comparison of an ONNX model, one method per step: the files read, the sides
//! made as spelled, the inputs, the target's graph, the layers aligned, the engine run, and
//! what the report adds after it.

use layerdiff_core::{Report, Tensor};
use layerdiff_onnx::{GraphIndex, Model};
use layerdiff_runtime::Runtime;

use super::pairing::align;
use super::setup::{
    Float64Sides, Loaded, MadeInputs, Said, TargetFile, float64_sides, graph_target, loaded,
    made_inputs, narrow_fusion,
};
use super::{Lacking, OnnxOptions, OnnxSide, Outcome, file_name, reach_of, subgraphs_note};
use crate::inputs::check_inputs;
use crate::sides::graph::shipped::Renames;
use crate::timings::{OWN, RUNTIME, Stopwatch};
use crate::{Alignment, Engine, EngineParts, ExpectedSide, GraphSide, Header, Result, Side};

/// A side as spelled: a file of expected values, loaded, or a runtime, started.
pub(super) enum Spelled {
    Expected(Box<ExpectedSide>),
    Runtime(Box<dyn Runtime + Send + Sync>),
}

impl Spelled {
    /// `spec` made: its file of values loaded (`label` names it, `model` is the file it holds
    /// values of), or its runtime started (in a worker process where `--isolate` says).
    fn of(spec: &OnnxSide, label: &str, model: &Model, options: &OnnxOptions) -> Result<Self> {
        Ok(match spec {
            OnnxSide::Expected(path) => Self::Expected(Box::new(ExpectedSide::load(
                path,
                label.to_string(),
                model.clone(),
            )?)),
            OnnxSide::Runs(runtime) => Self::Runtime(runtime.build_isolated(options.isolation)?),
        })
    }

    fn expected(&self) -> Option<&ExpectedSide> {
        match self {
            Self::Expected(expected) => Some(expected),
            Self::Runtime(_) => None,
        }
    }
}

/// The target as the engine runs it, with the graph its layers are aligned on (optimized,
/// where its runtime optimizes) and the renames its optimizer made.
struct Target {
    side: Box<dyn Side>,
    graph: GraphIndex,
    renames: Renames,
    /// The values it holds, where it is a file of expected values (which holds only some).
    holds: Option<Vec<String>>,
}

/// One try of a comparison: what it is asked, and its clock.
pub(super) struct Comparison<'a> {
    options: &'a OnnxOptions,
    /// The nodes the target's runtime lacks, left out of its graph ([`super::lacking`]).
    lacks: &'a [Lacking],
    /// Only the graph's outputs compared, so the target runs its graph as the file holds it
    /// (an opaque target's whole-graph check).
    outputs_only: bool,
    /// A progress line on stderr while it runs.
    progress: bool,
    /// The target's name in the progress lines: its runtime's, or as spelled.
    target_name: String,
    clock: Stopwatch,
}

impl<'a> Comparison<'a> {
    pub(super) fn new(options: &'a OnnxOptions, lacks: &'a [Lacking], progress: bool) -> Self {
        Self {
            options,
            lacks,
            outputs_only: false,
            progress,
            target_name: String::new(),
            clock: Stopwatch::default(),
        }
    }

    /// Only the graph's outputs compared.
    pub(super) fn outputs_only(self) -> Self {
        Self {
            outputs_only: true,
            ..self
        }
    }

    /// The comparison, its target computed by `own` (a runtime of one's own) where given.
    pub(super) fn run(mut self, own: Option<Box<dyn Runtime + Send + Sync>>) -> Result<Outcome> {
        let own_target = own.is_some();
        let mut files = self.load()?;
        let (reference, target) = self.sides(&files, own)?;
        let MadeInputs {
            inputs,
            seed,
            batch_note,
        } = made_inputs(
            self.options,
            &files.reference_model,
            &[reference.expected(), target.expected()],
        )?;
        self.clock.lap("making inputs", OWN);
        let target = self.target(&mut files, target, &inputs)?;
        let alignment = self.align(&files.reference_model, &reference, &target);
        let reach = reach_of(self.outputs_only);
        let float64 = float64_sides(self.options, &files.reference_model, &inputs, reach)?;
        let subgraphs = subgraphs_note(files.reference_model.graph());
        let label = file_name(&self.options.model);
        let reference = match reference {
            Spelled::Expected(expected) => Box::new(expected.given(&inputs)) as Box<dyn Side>,
            Spelled::Runtime(runtime) => Box::new(GraphSide::new(
                Some(label),
                files.reference_model,
                runtime,
                &inputs,
            )),
        };
        let (options, lacks) = (self.options, self.lacks);
        let (mut report, segmentation) =
            self.engine(alignment, (reference, target.side), float64, &inputs, seed)?;
        Said {
            differences: files.differences,
            subgraphs,
            batch_note,
            removed: &files.removed,
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

    fn phase(&self, what: String) {
        if self.progress {
            crate::progress::phase(&what);
        }
    }

    /// The files read, the target's without the nodes its runtime lacks.
    fn load(&mut self) -> Result<Loaded> {
        self.phase(format!("reading {}", self.options.model.display()));
        let files = loaded(self.options, self.lacks)?;
        self.clock.lap("loading models", OWN);
        Ok(files)
    }

    /// Both sides made as spelled; the target as `own` where given.
    fn sides(
        &mut self,
        files: &Loaded,
        own: Option<Box<dyn Runtime + Send + Sync>>,
    ) -> Result<(Spelled, Spelled)> {
        let options = self.options;
        self.target_name = own
            .as_ref()
            .map_or_else(|| options.target_spec().spelling(), |r| r.name().into());
        self.phase(format!(
            "starting {} and {}",
            options.reference, self.target_name
        ));
        let reference_label = file_name(&options.model);
        let reference = Spelled::of(
            &options.reference,
            &reference_label,
            &files.reference_model,
            options,
        )?;
        let target = match own {
            Some(runtime) => Spelled::Runtime(runtime),
            None => Spelled::of(
                &options.target_spec(),
                &self.target_label(),
                files
                    .target_model
                    .as_ref()
                    .unwrap_or(&files.reference_model),
                options,
            )?,
        };
        self.clock.lap("runtime start-up", RUNTIME);
        Ok((reference, target))
    }

    fn target_label(&self) -> String {
        file_name(self.options.vs.as_ref().unwrap_or(&self.options.model))
    }

    /// The target as a side: its file of values given the inputs, or its runtime on the graph
    /// it runs (optimized, where its runtime optimizes: what the layers are aligned on).
    fn target(
        &mut self,
        files: &mut Loaded,
        spelled: Spelled,
        inputs: &[(String, Tensor)],
    ) -> Result<Target> {
        match spelled {
            Spelled::Expected(expected) => {
                let file = files
                    .target_model
                    .as_ref()
                    .unwrap_or(&files.reference_model);
                let graph = GraphIndex::new(file.graph());
                check_inputs(&graph, inputs)?;
                Ok(Target {
                    holds: Some(expected.names()),
                    side: Box::new(expected.given(inputs)),
                    graph,
                    renames: Renames::default(),
                })
            }
            Spelled::Runtime(runtime) => {
                let options = self.options;
                self.phase(format!("preparing {}'s graph", self.target_name));
                let file = TargetFile {
                    model: files.target_model.take(),
                    label: self.target_label(),
                    inputs,
                    other: options.vs.is_some(),
                    exposes: !self.outputs_only,
                    tolerance: options.settings.tolerance,
                };
                let side = graph_target(&files.reference_model, file, runtime, &mut self.clock)?
                    .reaching(reach_of(self.outputs_only));
                Ok(Target {
                    renames: side.renames.clone(),
                    graph: side.index.clone(),
                    side: Box::new(side),
                    holds: None,
                })
            }
        }
    }

    /// Each reference value paired with the target's: a file of expected values holds only
    /// some values, and only those are compared (on either side); only the graph's outputs
    /// where only they are asked for.
    fn align(&self, reference_model: &Model, reference: &Spelled, target: &Target) -> Alignment {
        let outputs = reference_model.graph().output.iter().map(|o| o.name());
        let provides = |r: &str, t: Option<&str>| {
            reference.expected().is_none_or(|e| e.provides(r))
                && (target.holds.as_ref())
                    .is_none_or(|held| t.is_some_and(|t| held.iter().any(|h| h == t)))
                && (!self.outputs_only || outputs.clone().any(|o| o == r))
        };
        align(reference_model, &target.graph, &target.renames, &provides)
    }

    /// The engine run on the comparison's sides: planned, advanced segment by segment (with a
    /// progress line on a terminal), concluded; with how it was split.
    fn engine(
        self,
        alignment: Alignment,
        (reference, target): (Box<dyn Side>, Box<dyn Side>),
        (truth, baseline): Float64Sides,
        inputs: &[(String, Tensor)],
        seed: Option<u64>,
    ) -> Result<(Report, crate::Segmentation)> {
        let progress = self.progress;
        let mut engine = Engine::new(EngineParts {
            header: Header {
                command: "onnx".to_string(),
                model: file_name(&self.options.model),
                seed,
            },
            alignment,
            reference,
            target,
            truth,
            baseline,
            inputs: inputs.to_vec(),
            settings: self.options.settings.clone(),
            clock: self.clock,
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
}
