//! What an engine is made of ([`EngineParts`]), and what it makes of them before the first
//! segment runs: each layer's local group, the plans that keep the run within its memory
//! budget, and, for a run of one segment, the values each side exposes.

use std::collections::HashMap;

use layerdiff_core::Tensor;

use super::baseline::Baseline;
use super::memory::{self, budget};
use super::plan::{self, Plan, PlannedLayer, plan};
use super::side::{Group, Side};
use super::{Alignment, Header, Settings, Shared};
use crate::Result;
use crate::timings::Stopwatch;

/// The most bytes of pushed values a run whose target ran ahead holds at once (see
/// [`Engine::run_target_ahead`]): enough layers at a time to keep the threads busy.
const STREAM: u64 = 256 << 20;

/// What an engine is made of: what the run is, its layers aligned, its two sides, the float64
/// truth and the baseline where they are measured, the inputs, what it is asked to measure, and
/// its clock so far.
pub struct EngineParts<R: Side, T: Side, F: Side = Box<dyn Side>> {
    /// What the run is (command, model, seed).
    pub header: Header,
    /// Which value of each side every layer is.
    pub alignment: Alignment,
    /// The reference side.
    pub reference: R,
    /// The target side.
    pub target: T,
    /// The float64 truth, where measured.
    pub truth: Option<F>,
    /// Where the local errors' baselines come from, where measured.
    pub baseline: Option<Box<dyn Baseline>>,
    /// The model's inputs.
    pub inputs: Vec<(String, Tensor)>,
    /// What the run is asked to measure.
    pub settings: Settings,
    /// The run's phases timed so far.
    pub clock: Stopwatch,
}

/// The plans of a run: its segments, the stream's plan for a target that runs ahead of a
/// pushed reference, what the summary warns of a run over the default budget, and the memory
/// the process could use where that budget applies.
pub(super) struct Plans {
    pub(super) plan: Plan,
    pub(super) streamed: Option<Plan>,
    pub(super) over_default_budget: Option<String>,
    pub(super) process: Option<u64>,
}

impl<R: Side, T: Side, F: Side> EngineParts<R, T, F> {
    /// Each layer's local group in the target, and the baseline's groups in the reference.
    pub(super) fn groups(
        &mut self,
        reference_of: &HashMap<String, (String, usize)>,
    ) -> Vec<Option<std::result::Result<Group, String>>> {
        let inputs = &self.inputs;
        let is_input = |n: &str| inputs.iter().any(|(name, _)| name == n);
        let groups = local_groups(&self.alignment, reference_of, &is_input, &self.target);
        if let Some(baseline) = self.baseline.as_mut() {
            baseline_groups(baseline.as_mut(), &self.alignment, &is_input);
        }
        groups
    }

    /// The run planned in segments that fit the memory budget (`--max-memory`, else half of
    /// what the process could use once what it holds and a runtime's weights are counted).
    pub(super) fn plans(
        &mut self,
        groups: &[Option<std::result::Result<Group, String>>],
    ) -> Result<Plans> {
        let (alignment, settings) = (&self.alignment, &self.settings);
        let planned: Vec<PlannedLayer<'_>> = (0..alignment.layers.len())
            .map(|i| PlannedLayer {
                reference: &alignment.reference[i],
                target: alignment.target[i].as_deref(),
                local_inputs: match &groups[i] {
                    Some(Ok(group)) if settings.local => &group.inputs,
                    _ => &[],
                },
            })
            .collect();
        let mut reference_view = self.reference.plan_view();
        // The truth's values (and handed baseline values) are held beside the reference's
        // until compared.
        let held = self.truth.iter().map(|t| t.plan_view().sizes);
        for sizes in held.chain(self.baseline.iter().map(|b| b.held_sizes())) {
            for (name, bytes) in sizes {
                *reference_view.sizes.entry(name).or_default() += bytes;
            }
        }
        let target_view = self.target.plan_view();
        // Without --max-memory the whole process is kept within half the memory it could use:
        // the values get what is left once what it holds and a runtime's weights are counted
        // (the target's are counted segment by segment facing a reference that hands its
        // values over: see `plan`).
        let default = settings
            .max_memory
            .is_none()
            .then(memory::DefaultBudget::now)
            .flatten();
        let per_segment = reference_view.graph.is_none();
        let weights = [&reference_view, &target_view]
            .iter()
            .filter(|v| !(per_segment && v.graph.is_some()))
            .map(|v| v.weights)
            .chain(self.truth.as_ref().map(|t| t.plan_view().weights))
            .max()
            .unwrap_or(0);
        let kept_to = match default {
            Some(default) => Some(default.values(weights)),
            None => budget(settings.max_memory),
        };
        let plan = plan(&reference_view, &target_view, &planned, kept_to);
        let over_default_budget =
            plan.budget_kept(alignment, settings.max_memory, kept_to, || {
                plan::plan(&reference_view, &target_view, &planned, Some(0)).over_budget
            })?;
        // A target that computes can run the whole graph before a pushed reference hands over
        // anything (see `Engine::run_target_ahead`); the pushed values are then taken in
        // stretches of the stream's size, each dropped once compared, as a split run would, at
        // no cost to the target.
        let n = alignment.layers.len();
        let ahead = n > 0 && self.target.has_layers(n) && !self.reference.has_layers(n);
        let streamed = (plan.segments.len() == 1 && ahead).then(|| {
            let stream = kept_to.map_or(STREAM, |b| b.min(STREAM));
            plan::plan(&reference_view, &target_view, &planned, Some(stream))
        });
        Ok(Plans {
            plan,
            streamed,
            over_default_budget,
            process: default.map(|d| d.process),
        })
    }

    /// A run of one segment: each side (and the truth) asked once for every value it hands
    /// back.
    pub(super) fn expose_whole(&mut self, plan: &Plan) -> Result<()> {
        if let [whole] = plan.segments.as_slice() {
            self.reference.expose(&whole.reference.outputs)?;
            self.target.expose(&whole.target.outputs)?;
            if let Some(truth) = self.truth.as_mut() {
                truth.expose(&whole.reference.outputs)?;
            }
        }
        Ok(())
    }
}

/// Each layer's local group in the target (the nodes that compute it from values the run
/// knows), for the layer that owns its value; found without local error too, since their
/// evidence explains causes.
fn local_groups<T: Side>(
    alignment: &Alignment,
    reference_of: &HashMap<String, (String, usize)>,
    is_input: &dyn Fn(&str) -> bool,
    target: &T,
) -> Vec<Option<std::result::Result<Group, String>>> {
    alignment
        .target
        .iter()
        .enumerate()
        .map(|(i, value)| {
            let owns = |v: &str| match alignment.shared {
                Shared::FirstLayerOwns => reference_of[v].1 == i,
                Shared::EachLayer => true,
            };
            // Groups are found without local error too: their evidence explains causes.
            let value = value.as_deref().filter(|v| owns(v))?;
            let known = |n: &str| n != value && (is_input(n) || reference_of.contains_key(n));
            Some(target.recompute()?.local_group(value, &known))
        })
        .collect()
}

/// The baseline's groups in the reference graph, from the reference values both sides know.
fn baseline_groups(
    baseline: &mut dyn Baseline,
    alignment: &Alignment,
    is_input: &dyn Fn(&str) -> bool,
) {
    let compared: std::collections::HashSet<&str> = alignment
        .target
        .iter()
        .zip(&alignment.reference)
        .filter(|(t, _)| t.is_some())
        .map(|(_, r)| r.as_str())
        .collect();
    let values: Vec<&str> = compared.iter().copied().collect();
    baseline.find_groups(&values, &|n| is_input(n) || compared.contains(n));
}
