//! The one flow every command runs: two sides (and optionally a float64 truth) produce their
//! values segment by segment; each aligned pair is compared as soon as both sides have it,
//! re-run locally on the reference's values, judged, and dropped after its last use; then the
//! drift origin is decided, causes are explained from the evidence gathered, and the report is
//! built. Commands differ only in the sides they build and how they align them
//! ([`crate::onnx`], [`crate::verbs::captured`]).

use std::collections::HashMap;

use layerdiff_core::{
    Evidence, InputInfo, Layer, Machine, Report, SCHEMA, Summary, Tensor, TensorView, Tolerance,
    explain, judge, keep_float32, lower_precision_of, nothing_compared, summarise,
};

use crate::timings::{OWN, RUNTIME, Stopwatch};
use crate::{Error, Result};

pub(crate) mod baseline;
pub(crate) mod evidence;
mod finish;
pub(crate) mod group;
mod local;
pub mod memory;
pub(crate) mod pairs;
pub(crate) use pairs::{quantized_codes, recoded};
mod parts;
pub(crate) mod plan;
mod segment;
pub(crate) mod side;

use baseline::Baseline;
use evidence::disagreement;
use local::Exact;
use memory::Segmentation;
use pairs::Pairs;
use plan::Plan;
use segment::segments_warning;
use side::{Group, Side};

pub use parts::EngineParts;
use parts::Plans;

/// Which value of each side every layer is, as alignment found it.
pub struct Alignment {
    /// The layers in the reference's order, with what alignment knows of each (its ONNX node,
    /// module type, and the reason it has no counterpart or how it was matched).
    pub layers: Vec<Layer>,
    /// Each layer's value on the reference side.
    pub reference: Vec<String>,
    /// Each layer's value on the target side (`None`: not compared).
    pub target: Vec<Option<String>>,
    /// Layers paired by a guess that the values' sizes can refute (module scopes): a pair that
    /// cannot hold the same value is reported as a mapping problem, not compared.
    pub refutable: Vec<bool>,
    /// Why the verdict stays open when nothing exceeds: part of the model was not recognised.
    pub inconclusive: Option<String>,
    /// What to tell a user when no layer could be compared.
    pub nothing_compared_hint: String,
    /// What it means when several layers are paired with one target value.
    pub shared: Shared,
}

/// What it means when several layers are paired with one target value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    /// The value is the first layer's; the later ones compute nothing of their own (module
    /// calls: an identity module, or one the export folded into the module before it). One
    /// whose reference value is the first layer's too hands it on unchanged on both sides: its
    /// own error is none.
    FirstLayerOwns,
    /// Each layer is the value, computed by the same target nodes (values of two graphs: an
    /// optimizer fused several nodes into one); a re-run fed from it takes the last layer's
    /// value, which is what the fused nodes compute.
    EachLayer,
}

/// What a run is asked to measure, and how: the judging options every comparing verb shares,
/// made by [`Settings::new`], which resolves and checks them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How each layer's tolerance is chosen.
    pub tolerance: Tolerance,
    /// Whether to measure each layer's local error (re-running the target's own computation of
    /// it on the reference's values).
    pub local: bool,
    /// The most bytes of values to hold at once (`None`: what keeps the whole process within
    /// half the memory it could use at start, see [`memory::DefaultBudget`]): it
    /// decides how the run is split into segments, never its numbers.
    pub max_memory: Option<u64>,
    /// The float64 computations the run makes (see [`Settings::truth`] and
    /// [`Settings::baseline`]).
    pub float64: Float64,
}

/// Which float64 computations a run makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Float64 {
    /// None (`--no-float64`): a layer beyond its tolerance is then `undecided` between
    /// rounding and a defect.
    Skip,
    /// The same-precision baseline each layer's own error is judged against: the reference's
    /// computation in float64 on its inputs rounded to the target's dtype (with local error).
    Baseline,
    /// The baseline, and the float64 truth both sides are measured against (a float64 run of
    /// the whole reference).
    Truth,
}

impl Settings {
    /// The settings, checked: `--tolerance auto` measures each value against the float64
    /// truth, so it makes the truth where it was not asked for, and cannot be had where every
    /// float64 computation is skipped. The one rule every verb and door asks.
    pub fn new(
        tolerance: Tolerance,
        local: bool,
        max_memory: Option<u64>,
        float64: Float64,
    ) -> Result<Self> {
        let float64 = match (tolerance, float64) {
            (Tolerance::Auto, Float64::Skip) => {
                return Err(Error::Usage(
                    "tolerance `auto` needs the float64 run; drop --no-float64".to_string(),
                ));
            }
            (Tolerance::Auto, _) => Float64::Truth,
            (_, asked) => asked,
        };
        Ok(Self {
            tolerance,
            local,
            max_memory,
            float64,
        })
    }

    /// Whether the run makes the float64 truth.
    pub fn truth(&self) -> bool {
        self.float64 == Float64::Truth
    }

    /// Whether each layer's own error is judged against its same-precision baseline (it needs
    /// the local error).
    pub fn baseline(&self) -> bool {
        self.local && self.float64 != Float64::Skip
    }
}

/// What the report says the run was.
#[derive(Debug, Clone)]
pub struct Header {
    /// The command (`onnx`, `torch`).
    pub command: String,
    /// The model's display name.
    pub model: String,
    /// Seed of generated inputs (`None`: read from a file).
    pub seed: Option<u64>,
}

/// A comparison under way (see the module docs).
pub struct Engine<R: Side, T: Side, F: Side = Box<dyn Side>> {
    /// The reference side.
    pub reference: R,
    /// The target side.
    pub target: T,
    /// The float64 truth, by the reference's value names.
    pub truth: Option<F>,
    /// Where each layer's same-precision baseline comes from.
    pub baseline: Option<Box<dyn Baseline>>,
    layers: Vec<Layer>,
    /// Each layer's value on either side, and whether its pairing can be refuted.
    reference_values: Vec<String>,
    target_values: Vec<Option<String>>,
    refutable: Vec<bool>,
    inconclusive: Option<String>,
    nothing_compared_hint: String,
    shared: Shared,
    header: Header,
    settings: Settings,
    inputs: Vec<(String, Tensor)>,
    /// The first reference value behind each compared target value, and its layer.
    reference_of: HashMap<String, (String, usize)>,
    /// The target value paired with each reference value.
    target_of: HashMap<String, String>,
    /// Each layer's local group (for the first layer of each target value).
    groups: Vec<Option<std::result::Result<Group, String>>>,
    plan: Plan,
    /// How the run is split, as the report says: the target's segments.
    reported: Segmentation,
    /// The plan that replaces a one-segment plan once the target ran ahead.
    streamed: Option<Plan>,
    /// Whether memory freed between segments goes back to the system (see
    /// [`memory::hands_back_freed`]).
    hands_back_freed: bool,
    done: usize,
    /// The target already ran the whole graph, this part of it (see
    /// [`Engine::run_target_ahead`]).
    target_ahead: Option<plan::Part>,
    /// Exceeding layers whose target value awaits its second runs, with that value (a target
    /// that ran ahead runs them at the end).
    deferred: Vec<(usize, String, Tensor)>,
    evidence: Vec<Evidence>,
    /// The layers whose evidence is gathered already ([`Engine::evidence_of`]).
    gathered: std::collections::HashSet<usize>,
    /// Whether every compared layer's weights are read against the reference's, not only a
    /// drifting layer's ([`Engine::read_every_weight`]).
    every_weight: bool,
    /// The weights that differ at layers whose cause needs no evidence: reported as defects
    /// of the file all the same.
    unseen_weights: Vec<layerdiff_core::FileDifference>,
    summary: Option<Summary>,
    /// Why the float64 truth stopped, when it could not run.
    truth_lost: Option<String>,
    /// What the summary warns of a run that holds more at once than the default budget.
    over_default_budget: Option<String>,
    /// Where a signal stopped the run (see [`crate::interrupt`]): the layers before this one
    /// were compared and judged, the others were not.
    stopped_at: Option<usize>,
    /// Attributes each stretch of the run to a phase.
    pub clock: Stopwatch,
    /// The progress line on a terminal, ticked as layers are done.
    pub progress: Option<crate::progress::Ticker>,
}

impl<R: Side, T: Side, F: Side> Engine<R, T, F> {
    /// The float64 truth stopped (`why`, a framework's copy of the model that could not run in
    /// float64): the summary warns that the layers after it are judged without it.
    pub fn truth_stopped(&mut self, why: String) {
        self.truth_lost.get_or_insert(why);
    }

    /// Plans the run in segments that fit the memory budget, with each layer's local group.
    pub fn new(mut parts: EngineParts<R, T, F>) -> Result<Self> {
        let (reference_of, target_of) = parts.alignment.correspondence();
        let groups = parts.groups(&reference_of);
        let Plans {
            plan,
            streamed,
            over_default_budget,
            process,
        } = parts.plans(&groups)?;
        parts.expose_whole(&plan)?;
        let EngineParts {
            header,
            alignment,
            reference,
            target,
            truth,
            baseline,
            inputs,
            settings,
            clock,
        } = parts;
        let n = alignment.layers.len();
        Ok(Self {
            reference,
            target,
            truth,
            baseline,
            layers: alignment.layers,
            reference_values: alignment.reference,
            target_values: alignment.target,
            refutable: alignment.refutable,
            inconclusive: alignment.inconclusive,
            nothing_compared_hint: alignment.nothing_compared_hint,
            shared: alignment.shared,
            header,
            settings,
            inputs,
            reference_of,
            target_of,
            groups,
            hands_back_freed: memory::hands_back_freed(&plan.segmentation()),
            reported: memory::Segmentation {
                process,
                ..plan.segmentation()
            },
            plan,
            streamed,
            done: 0,
            target_ahead: None,
            deferred: Vec::new(),
            evidence: vec![Evidence::default(); n],
            gathered: std::collections::HashSet::new(),
            every_weight: false,
            unseen_weights: Vec::new(),
            summary: None,
            truth_lost: None,
            over_default_budget,
            stopped_at: None,
            clock,
            progress: None,
        })
    }

    /// Layers in the run.
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// How the run is split.
    pub fn segmentation(&self) -> Segmentation {
        self.reported
    }

    /// A target that computes the whole graph from the inputs alone runs it now, before the
    /// reference hands over any value: the runtime's copy of the model is gone again before
    /// the reference's values (and their float64 truth) are held, so the two never take memory
    /// at once. The pushed values are then compared in stretches (the stream's plan), each
    /// dropped once done, instead of all held until the end. Nothing else changes: the values
    /// are the same whenever it runs, and the report says one segment, as the target ran.
    pub fn run_target_ahead(&mut self) -> Result<()> {
        let [whole] = self.plan.segments.as_slice() else {
            return Ok(());
        };
        // a side that computes has its values whenever asked; a pushed one does not yet
        if self.done > 0 || self.target_ahead.is_some() || !self.target.has_layers(whole.layers.end)
        {
            return Ok(());
        }
        let part = whole.target.clone();
        if self.hands_back_freed {
            memory::give_back_freed();
        }
        self.target
            .produce(&part, true, &mut self.clock, "target run")?;
        self.target_ahead = Some(part);
        if let Some(streamed) = self.streamed.take() {
            self.plan = streamed;
        }
        Ok(())
    }

    /// Whether a signal asked the run to stop (see [`crate::interrupt`]): it stops where it
    /// is, before the next segment or the next layer's local error.
    fn stopping(&mut self) -> bool {
        if self.stopped_at.is_none()
            && crate::interrupt::requested().is_some()
            && let Some(next) = self.plan.segments.get(self.done)
        {
            self.stopped_at = Some(next.layers.start);
        }
        self.stopped_at.is_some()
    }

    /// Runs every segment whose values all sides have (all of them, when every side computes).
    pub fn advance(&mut self) -> Result<()> {
        while !self.stopping()
            && let Some(segment) = self.plan.segments.get(self.done)
        {
            let end = segment.layers.end;
            let ready = self.reference.has_layers(end)
                && self.target.has_layers(end)
                && self.truth.as_ref().is_none_or(|t| t.has_layers(end));
            if !ready {
                break;
            }
            self.run_segment()?;
        }
        Ok(())
    }
}

impl Alignment {
    /// Which reference value (and layer) each target value stands for, and which target value
    /// each reference value is compared with.
    fn correspondence(&self) -> (HashMap<String, (String, usize)>, HashMap<String, String>) {
        let mut reference_of: HashMap<String, (String, usize)> = HashMap::new();
        for (i, value) in self.target.iter().enumerate() {
            if let Some(v) = value {
                let this = (self.reference[i].clone(), i);
                match self.shared {
                    Shared::FirstLayerOwns => {
                        reference_of.entry(v.clone()).or_insert(this);
                    }
                    Shared::EachLayer => {
                        reference_of.insert(v.clone(), this);
                    }
                }
            }
        }
        let target_of: HashMap<String, String> = self
            .reference
            .iter()
            .zip(&self.target)
            .filter_map(|(r, t)| Some((r.clone(), t.clone()?)))
            .collect();
        (reference_of, target_of)
    }
}
