//! The one flow every command runs: two sides (and optionally a float64 truth) produce their
//! values segment by segment; each aligned pair is compared as soon as both sides have it,
//! re-run locally on the reference's values, judged, and dropped after its last use; then the
//! drift origin is decided, causes are explained from the evidence gathered, and the report is
//! built. Commands differ only in the sides they build and how they align them
//! ([`crate::onnx_flow`], [`crate::captured`]).

use std::collections::HashMap;

use layerdiff_core::{
    Evidence, InputInfo, Layer, Machine, Report, SCHEMA, Summary, Tensor, TensorView, Tolerance,
    explain, judge, keep_float32, lower_precision_of, nothing_compared, summarise,
};

use crate::baseline::Baseline;
use crate::evidence::disagreement;
use crate::memory::Segmentation;
use crate::memory::budget;
use crate::pairs::Pairs;
use crate::plan::{Plan, PlannedLayer, plan};
use crate::side::{Group, Side};
use crate::timings::{OWN, RUNTIME, Stopwatch};
use crate::{Error, Result};

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

/// What a run is asked to measure, and how.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How each layer's tolerance is chosen.
    pub tolerance: Tolerance,
    /// Whether to measure each layer's local error (re-running the target's own computation of
    /// it on the reference's values).
    pub local: bool,
    /// The most bytes of values to hold at once (`None`: half the memory available at start,
    /// see [`crate::memory::budget`]): it decides how the run is split into segments, never
    /// its numbers.
    pub max_memory: Option<u64>,
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
    pub baseline: Option<Baseline>,
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
    done: usize,
    evidence: Vec<Evidence>,
    summary: Option<Summary>,
    /// Why the float64 truth stopped, when it could not run.
    truth_lost: Option<String>,
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
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        header: Header,
        alignment: Alignment,
        mut reference: R,
        mut target: T,
        truth: Option<F>,
        mut baseline: Option<Baseline>,
        inputs: Vec<(String, Tensor)>,
        settings: Settings,
        clock: Stopwatch,
    ) -> Result<Self> {
        let mut reference_of: HashMap<String, (String, usize)> = HashMap::new();
        for (i, value) in alignment.target.iter().enumerate() {
            if let Some(v) = value {
                let this = (alignment.reference[i].clone(), i);
                match alignment.shared {
                    Shared::FirstLayerOwns => {
                        reference_of.entry(v.clone()).or_insert(this);
                    }
                    Shared::EachLayer => {
                        reference_of.insert(v.clone(), this);
                    }
                }
            }
        }
        let target_of: HashMap<String, String> = alignment
            .reference
            .iter()
            .zip(&alignment.target)
            .filter_map(|(r, t)| Some((r.clone(), t.clone()?)))
            .collect();
        let is_input = |n: &str| inputs.iter().any(|(name, _)| name == n);
        let groups: Vec<_> = alignment
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
            .collect();
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
        let mut reference_view = reference.plan_view();
        // The truth's values (and handed baseline values) are held beside the reference's
        // until compared.
        let held = truth.iter().map(|t| t.plan_view().sizes);
        for sizes in held.chain(baseline.iter().map(Baseline::held_sizes)) {
            for (name, bytes) in sizes {
                *reference_view.sizes.entry(name).or_default() += bytes;
            }
        }
        if let Some(Baseline::Graph(graph)) = baseline.as_mut() {
            // Groups in the reference graph, from the reference values both sides know.
            let compared: std::collections::HashSet<&str> = alignment
                .target
                .iter()
                .zip(&alignment.reference)
                .filter(|(t, _)| t.is_some())
                .map(|(_, r)| r.as_str())
                .collect();
            let values: Vec<&str> = compared.iter().copied().collect();
            graph.find_groups(&values, &|n| is_input(n) || compared.contains(n));
        }
        let plan = plan(
            &reference_view,
            &target.plan_view(),
            &planned,
            budget(settings.max_memory),
        );
        drop((planned, reference_view));
        let mut truth = truth;
        if let [whole] = plan.segments.as_slice() {
            reference.expose(&whole.reference.outputs)?;
            target.expose(&whole.target.outputs)?;
            if let Some(truth) = truth.as_mut() {
                truth.expose(&whole.reference.outputs)?;
            }
        }
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
            plan,
            done: 0,
            evidence: vec![Evidence::default(); n],
            summary: None,
            truth_lost: None,
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
        self.plan.segmentation()
    }

    /// Runs every segment whose values all sides have (all of them, when every side computes).
    pub fn advance(&mut self) -> Result<()> {
        while let Some(segment) = self.plan.segments.get(self.done) {
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

    /// Runs the next segment: both sides' parts, then every comparison in it.
    fn run_segment(&mut self) -> Result<()> {
        let segment = self.plan.segments[self.done].clone();
        let whole = self.plan.segments.len() == 1;
        let clock = &mut self.clock;
        self.reference
            .produce(&segment.reference, whole, clock, "reference run")?;
        self.target
            .produce(&segment.target, whole, clock, "target run")?;
        // The truth computes the reference's part, in float64 (or was handed it over); a truth
        // that cannot run leaves the comparison without it, and says so.
        if let Some(truth) = self.truth.as_mut()
            && let Err(e) = truth.produce(&segment.reference, whole, clock, "float64 run")
        {
            self.truth = None;
            self.truth_lost = Some(crate::error_chain(&e));
        }
        let held = Pairs {
            reference: &self.reference,
            target: &self.target,
            truth: self.truth.as_ref().map(|t| t as &dyn Side),
            reference_values: &self.reference_values,
            target_values: &self.target_values,
            reference_of: &self.reference_of,
            target_of: &self.target_of,
            inputs: &self.inputs,
            shared: self.shared,
            tolerance: self.settings.tolerance,
        };
        let range = segment.layers.clone();
        held.compare(
            &mut self.layers[range.clone()],
            range.start,
            &self.refutable[range],
        );
        self.clock.lap("comparison", OWN);
        if let Some(ticker) = self.progress.as_mut().filter(|_| !self.settings.local) {
            ticker.tick(segment.layers.end);
        }

        if let Some(recompute) = self.target.recompute().filter(|_| self.settings.local) {
            // Outputs are compared in batches (see [`local_batch`]).
            let limit = local_batch(self.settings.max_memory);
            let (mut runs, mut held_bytes) = (Vec::new(), 0);
            for i in segment.layers.clone() {
                let out =
                    held.measure_local(&mut self.layers[i], &mut self.groups[i], recompute, i);
                if let Some(ticker) = self.progress.as_mut() {
                    ticker.tick(i + 1);
                }
                if let Some(out) = out {
                    let exact = self.baseline.as_ref().map(|b| {
                        // the dtype the target computes the layer in: as the framework said,
                        // else the narrower of its output's and its group's narrowest
                        let grid = b.grid_of(&self.reference_values[i]).or_else(|| {
                            let held = layerdiff_core::lower_precision(
                                &self.layers[i].dtype,
                                Some(out.dtype.name()),
                            );
                            let inside = match &self.groups[i] {
                                Some(Ok(group)) => recompute.computes_in(group),
                                _ => None,
                            };
                            match (held, inside) {
                                (Some(h), Some(g)) if g.narrower_than(h) => Some(g),
                                (Some(h), _) => Some(h),
                                (None, g) => g,
                            }
                        });
                        let stages = match (&self.groups[i], grid) {
                            (Some(Ok(group)), Some(grid)) => recompute.rounding_stages(group, grid),
                            _ => 0,
                        };
                        let quantizes = match &self.groups[i] {
                            Some(Ok(group)) => recompute
                                .members(group)
                                .iter()
                                .any(|m| layerdiff_core::quantizing_op(&m.op)),
                            _ => false,
                        };
                        let exact = grid
                            .filter(|g| g.is_float())
                            .ok_or_else(|| "the layer is not a float".to_string())
                            .and_then(|grid| {
                                if quantizes {
                                    return Err("the target quantizes it, which a float baseline does not model".to_string());
                                }
                                b.exact(&self.reference_values[i], grid, &|n| held.baseline_feed(n))
                            });
                        (exact, stages, grid)
                    });
                    held_bytes += out.bytes.len() as u64;
                    held_bytes += exact
                        .as_ref()
                        .and_then(|(e, _, _)| e.as_ref().ok())
                        .map_or(0, |e| e.bytes.len() as u64);
                    runs.push((i, out, exact));
                }
                if held_bytes >= limit {
                    held.compare_local(&mut self.layers, std::mem::take(&mut runs));
                    held_bytes = 0;
                }
            }
            held.compare_local(&mut self.layers, runs);
            self.clock.split_lap(
                "local error: extraction and comparison",
                "local error: inference",
                recompute.take_time(),
            );
        }

        // What the values of an exceeding layer show, while they are held.
        let mut exceeding = false;
        for i in segment.layers.clone() {
            let layer = &mut self.layers[i];
            judge(layer, self.settings.tolerance);
            if !(layer.exceeds_tol || layer.local_exceeds) {
                continue;
            }
            exceeding = true;
            if let Some((r, t)) = held.pair(i) {
                self.evidence[i] = Evidence::from_values(layer, r.view(), t.view());
            }
        }
        self.clock.lap("analysis and causes", OWN);
        if exceeding {
            // Does either side disagree with itself? Two more runs of the segment, one session.
            let r_again = self.reference.again(&segment.reference);
            let t_again = self.target.again(&segment.target);
            for i in segment.layers.clone() {
                let Some(target_value) = &self.target_values[i] else {
                    continue;
                };
                let sides: [(&str, _, &dyn Side, &String); 2] = [
                    (
                        "reference",
                        &r_again,
                        &self.reference,
                        &self.reference_values[i],
                    ),
                    ("target", &t_again, &self.target, target_value),
                ];
                for (side, again, values, name) in sides {
                    let e = &mut self.evidence[i];
                    let d = values.get(name).and_then(|first| {
                        disagreement(first, again.as_ref(), name)
                            .or_else(|| values.disagreement(name))
                    });
                    if let Some(d) = d
                        && e.self_disagreement
                            .as_ref()
                            .is_none_or(|(_, seen)| d > *seen)
                    {
                        e.self_disagreement = Some((side.to_string(), d));
                    }
                }
            }
            // Their values go back before the lap: releasing them is part of the second runs.
            drop((r_again, t_again));
            self.clock.lap("second runs (nondeterminism)", RUNTIME);
        }
        self.reference.free(&segment.reference.free);
        self.target.free(&segment.target.free);
        if let Some(baseline) = self.baseline.as_mut() {
            baseline.free(&self.reference_values[segment.layers.clone()]);
        }
        if let Some(truth) = self.truth.as_mut() {
            // A truth that computes keeps what its later segments read, as the reference does;
            // one handed over holds each value only until it is compared.
            if truth.plan_view().graph.is_some() {
                truth.free(&segment.reference.free);
            } else {
                truth.free(&self.reference_values[segment.layers.clone()]);
            }
        }
        self.done += 1;
        Ok(())
    }

    /// Runs what is left and decides the drift origin; returns the layers whose cause needs
    /// the reference's weights (a side that hands them over on request gets them before
    /// [`Engine::finish`]).
    pub fn conclude(&mut self) -> Result<Vec<usize>> {
        while self.done < self.plan.segments.len() {
            self.run_segment()?;
        }
        // Every layer was judged in its segment (the segments cover every layer).
        let mut summary = summarise(&mut self.layers);
        if summary.drift_origin.is_none() {
            summary.inconclusive = self.inconclusive.take();
        }
        let providers = [
            self.reference.kernels_per_graph(),
            self.target.kernels_per_graph(),
        ];
        summary
            .warnings
            .extend(segments_warning(self.plan.segments.len(), &providers));
        if let Some(why) = self.truth_lost.take() {
            summary.warnings.push(format!(
                "no float64 truth for the layers from where it stopped: it could not run ({why}); those layers are judged without it"
            ));
        }
        if let Some(runtime) = self.reference.rewrites() {
            summary.warnings.push(format!(
                "the reference ({runtime}) optimizes the graph, but the values exposed for comparison keep it from fusing them: the reference measured is not the graph that ships; give the optimized side as --target, which is compared in the graph it optimized"
            ));
        }
        let layers = &self.layers;
        if let Some(why) = nothing_compared(layers, &summary) {
            return Err(Error::NothingCompared(format!(
                "{why}\nhint: {}",
                self.nothing_compared_hint
            )));
        }
        let wanted = (0..layers.len())
            .filter(|&i| {
                summary.needs_evidence(&layers[i]) && matches!(self.groups[i], Some(Ok(_)))
            })
            .collect();
        self.summary = Some(summary);
        Ok(wanted)
    }

    /// The report: causes explained from the evidence of the values and of the target's
    /// groups (their ops, precision, attributes and weights against the reference's).
    pub fn finish(mut self) -> Result<Report> {
        if self.summary.is_none() {
            self.conclude()?;
        }
        let mut summary = self.summary.take().expect("concluded");
        let mut compared: Vec<&str> = Vec::new();
        for value in self.target_values.iter().flatten() {
            if !compared.contains(&value.as_str()) {
                compared.push(value);
            }
        }
        let target_graph = self.target.graph_report(&compared, &mut summary);
        let reference_info = self.reference.describe(&mut summary);
        let target_info = self.target.describe(&mut summary);
        let truth_info = self.truth.as_mut().map(|t| t.describe(&mut summary));
        if let Some(recompute) = self.target.recompute() {
            for (layer, group) in self.layers.iter_mut().zip(&self.groups) {
                if let (Some(location), Some(Ok(group))) = (layer.location.as_mut(), group) {
                    location.nodes = recompute
                        .members(group)
                        .into_iter()
                        .filter_map(|m| m.name)
                        .collect();
                }
            }
            for (i, layer) in self.layers.iter().enumerate() {
                let (true, Some(Ok(group))) = (summary.needs_evidence(layer), &self.groups[i])
                else {
                    continue;
                };
                let e = &mut self.evidence[i];
                e.attributes = recompute
                    .members(group)
                    .iter()
                    .filter_map(|m| Some((m, self.reference.counterpart(m)?)))
                    .flat_map(|(m, reference)| m.changes_from(&reference))
                    .collect();
                let fed = |n: &str| {
                    let (r, _) = self.reference_of.get(n)?;
                    Some((self.reference.dtype(r)?, self.target.dtype(n)?))
                };
                let check = |node: &str,
                             position,
                             name: &str,
                             weight: TensorView<'_>,
                             half_step: Option<TensorView<'_>>| {
                    self.reference
                        .weight_check(i, node, position, name, weight, half_step)
                };
                let computed_in = layerdiff_core::DType::from_name(&layer.dtype).ok();
                recompute.group_evidence(group, computed_in, e, &fed, &check);
            }
        }
        let mut layers = self.layers;
        explain(&mut layers, &self.evidence, &mut summary);
        self.clock.lap("analysis and causes", OWN);
        let mut report = Report {
            schema: SCHEMA,
            command: self.header.command,
            model: self.header.model,
            reference: reference_info,
            target: target_info,
            target_graph,
            truth: truth_info,
            mode: if self.settings.local {
                "local"
            } else {
                "accumulated"
            }
            .to_string(),
            tolerance: self.settings.tolerance.info(),
            seed: self.header.seed,
            inputs: InputInfo::describe(&self.inputs),
            summary,
            layers,
            keep_float32: None,
            machine: Machine::this(),
            timings: Some(self.clock.phases()),
        };
        report.keep_float32 = lower_precision_of(&report).and_then(|p| keep_float32(&report, &p));
        Ok(report)
    }
}

/// Bytes of local re-run outputs held before they are compared, all at once across the threads
/// (one by one, most are too small to keep the threads busy): a sixteenth of the memory budget,
/// at most 64 MiB; one output is held whatever its size.
fn local_batch(max_memory: Option<u64>) -> u64 {
    const MOST: u64 = 64 << 20;
    budget(max_memory).map_or(MOST, |b| (b / 16).min(MOST))
}

/// The warning a run in `segments` segments owes when a side runs on a provider that picks its
/// kernels per graph: there, a segment may compute a value with other bits than the whole run
/// (on the CPU the bits are the same, which the tests check).
fn segments_warning(segments: usize, providers: &[Option<&'static str>]) -> Option<String> {
    let provider = providers.iter().flatten().next().filter(|_| segments > 1)?;
    Some(format!(
        "ran in {segments} segments on {provider}, which picks its kernels for each graph it is given: values may differ in their last bits from a run of the whole graph (use a --max-memory that fits the whole run to compare with one)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_on_a_gpu_provider_are_said_to_differ_possibly() {
        let gpu = [None, Some("CUDAExecutionProvider")];
        let warning = segments_warning(3, &gpu).unwrap();
        assert!(warning.starts_with("ran in 3 segments on CUDAExecutionProvider"));
        assert_eq!(segments_warning(1, &gpu), None, "a whole run owes nothing");
        assert_eq!(
            segments_warning(3, &[None, None]),
            None,
            "CPU bits do not change"
        );
    }
}
