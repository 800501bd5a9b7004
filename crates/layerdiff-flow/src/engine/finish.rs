//! The end of the run: the drift origin decided, causes explained from the evidence of the
//! values and of the target's groups, and the report built.

use super::{
    Engine, Error, Evidence, Group, InputInfo, Machine, OWN, Report, Result, SCHEMA, Side,
    TensorView, explain, keep_float32, lower_precision_of, nothing_compared, segments_warning,
    summarise,
};
use crate::engine::evidence::{MATCHED_BY_SHAPE, WeightCheck};
use layerdiff_core::{LayerStatus, Summary};
impl<R: Side, T: Side, F: Side> Engine<R, T, F> {
    /// Runs what is left and decides the drift origin; returns the layers whose cause needs
    /// the reference's weights (a side that hands them over on request gets them before
    /// [`Engine::finish`]).
    pub fn conclude(&mut self) -> Result<Vec<usize>> {
        while self.done < self.plan.segments.len() && !self.stopping() {
            self.run_segment()?;
        }
        self.run_deferred_again();
        // the layers past the cut that would have been compared (those with a counterpart)
        let left = (self.stopped_at).map_or(0, |cut| {
            self.target_values[cut.min(self.target_values.len())..]
                .iter()
                .flatten()
                .count()
        });
        let incomplete = self.stopped_at.map(|cut| self.cut(cut)).transpose()?;
        // Every layer was judged in its segment (the segments cover every layer).
        let mut summary = summarise(&mut self.layers);
        summary.incomplete = incomplete;
        if let (Some(_), None, 1..) = (self.stopped_at, &summary.drift_origin, left) {
            let were = if left == 1 {
                "layer was"
            } else {
                "layers were"
            };
            self.inconclusive = Some(format!(
                "the run was interrupted before the other {left} {were} compared"
            ));
        }
        if summary.drift_origin.is_none() {
            summary.inconclusive = self.inconclusive.take();
        }
        let providers = [
            self.reference.kernels_per_graph(),
            self.target.kernels_per_graph(),
        ];
        summary
            .warnings
            .extend(segments_warning(self.reported.segments, &providers));
        summary.warnings.extend(self.over_default_budget.take());
        if let Some(why) = self.truth_lost.take() {
            summary.warnings.push(format!(
                "no float64 truth for the layers from where it stopped: it could not run ({why}); those layers are judged without it"
            ));
        }
        if let Some(reduced) = self.reference.reduced_math() {
            summary.warnings.push(format!(
                "the reference does not compute as its file says: {}. The target is measured against values that carry that rounding, so nothing finer than it can show",
                reduced.how
            ));
        }
        if let Some(runtime) = self.reference.rewrites() {
            summary.warnings.push(format!(
                "the reference ({runtime}) optimizes the graph, but the values exposed for comparison keep it from fusing them: the reference measured is not the graph that ships; give the optimized side as --target, which is compared in the graph it optimized"
            ));
        }
        let layers = &self.layers;
        if let Some(why) = nothing_compared(layers, &summary) {
            if let Some(signal) = self.stopped_at.and(crate::interrupt::requested()) {
                return Err(Error::Interrupted(signal));
            }
            return Err(Error::NothingCompared(format!(
                "{why}\nhint: {}",
                self.nothing_compared_hint
            )));
        }
        self.summary = Some(summary);
        Ok(self.evidence_wanted())
    }

    /// The layers whose causes need the evidence of their groups (their ops, attributes and
    /// weights against the reference's), after [`Engine::conclude`]: each with the layers that
    /// compute inside it (without a counterpart of their own), whose parameters are its weights
    /// too; where every weight is read ([`Engine::read_every_weight`]), every compared layer.
    pub fn evidence_wanted(&self) -> Vec<usize> {
        let Some(summary) = self.summary.as_ref() else {
            return Vec::new();
        };
        (0..self.layers.len())
            .filter(|&i| {
                let layer = &self.layers[i];
                let weights = self.every_weight && layer.status == LayerStatus::Compared;
                (summary.needs_evidence(layer) || weights) && matches!(self.groups[i], Some(Ok(_)))
            })
            .collect()
    }

    /// Reads every compared layer's weights against the reference's, not only those of a layer
    /// that drifts: a file the user gives may hold a weight edited by less than any tolerance
    /// shows (one element of a bias moved by 2e-5), which no layer's value then points to, and
    /// the file is not the model all the same. A weight that differs at a layer whose cause
    /// needs no evidence is a defect of its own ([`layerdiff_core::unseen_differences`]).
    pub fn read_every_weight(&mut self) {
        self.every_weight = true;
    }

    /// Gathers layer `i`'s evidence now, from the parameters the sides hold at this moment (a
    /// framework hands a layer's over, then takes them back: a model larger than memory is
    /// never held whole); [`Engine::finish`] leaves a layer so gathered as it is.
    pub fn evidence_of(&mut self, i: usize) {
        let summary = self.summary.take().expect("concluded");
        self.gather_evidence(i, &summary);
        self.summary = Some(summary);
    }

    fn gather_evidence(&mut self, i: usize, summary: &Summary) {
        if self.gathered.contains(&i) {
            return;
        }
        let Some(recompute) = self.target.recompute() else {
            return;
        };
        let layer = &self.layers[i];
        let needed = summary.needs_evidence(layer);
        let weights_only = !needed && self.every_weight && layer.status == LayerStatus::Compared;
        let (true, Some(Ok(group))) = (needed || weights_only, &self.groups[i]) else {
            return;
        };
        self.gathered.insert(i);
        if weights_only {
            let found = self.weights_that_differ(i, group);
            self.unseen_weights.extend(found);
            return;
        }
        let reference_reduced = self.reference.reduced_math();
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
        let value = self.target_values[i].as_deref().unwrap_or_default();
        recompute.group_evidence(group, value, computed_in, e, &fed, &check);
        e.reference_lowered = reference_lowers(reference_reduced.as_ref(), layer, e);
    }

    /// The weights of layer `i` (computed by `group` on the target) that differ from the
    /// reference's, each as a difference of the file.
    fn weights_that_differ(&self, i: usize, group: &Group) -> Vec<layerdiff_core::FileDifference> {
        let Some(recompute) = self.target.recompute() else {
            return Vec::new();
        };
        let layer = &self.layers[i];
        let mut e = Evidence::default();
        // where no layer drifts, a weight matched by its shape alone that differs in every
        // element is a form the file computes from several (an optimizer's Conv fused with the
        // Mul after it), with which the layer computes its value: no edit
        let check = |node: &str,
                     position,
                     name: &str,
                     weight: TensorView<'_>,
                     half_step: Option<TensorView<'_>>| {
            let found = (self.reference).weight_check(i, node, position, name, weight, half_step);
            found.filter(|c| !matches!(c, WeightCheck::Differs(t) if rewritten_form(t)))
        };
        let fed = |_: &str| None;
        let computed_in = layerdiff_core::DType::from_name(&layer.dtype).ok();
        let value = self.target_values[i].as_deref().unwrap_or_default();
        recompute.group_evidence(group, value, computed_in, &mut e, &fed, &check);
        let readers: Vec<String> = e.weight_readers.iter().map(|n| format!("`{n}`")).collect();
        let readers = if readers.is_empty() {
            format!("the target's `{}`", layer.name)
        } else {
            format!("the target's node(s) {}", readers.join(", "))
        };
        (e.weights.into_iter())
            .map(|text| layerdiff_core::FileDifference {
                layer: layer.name.clone(),
                cause: layerdiff_core::Cause::WeightMismatch,
                fix: layerdiff_core::weights_fix(&readers, std::slice::from_ref(&text)),
                detail: text,
            })
            .collect()
    }

    /// A run a signal stopped at layer `cut`: the layers from there on go (they were not
    /// compared), and the summary says so; nothing compared yet is [`Error::Interrupted`].
    fn cut(&mut self, cut: usize) -> Result<String> {
        let signal = crate::interrupt::requested().unwrap_or(crate::interrupt::SIGINT);
        if cut == 0 {
            return Err(Error::Interrupted(signal));
        }
        let total = self.layers.len();
        self.layers.truncate(cut);
        Ok(format!(
            "the run was interrupted by {} after {cut} of the model's {total} layers: the report holds the layers compared and judged before it, the others were not compared, and a defect among them would not show",
            crate::interrupt::name(signal)
        ))
    }

    /// Whether some layer is beyond what its precision explains and within its target's nodes
    /// computed as the file writes them: the runtime computes what the file says, and the file
    /// is not the reference's computation there.
    pub fn computes_as_written(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.own_beyond() && l.computes_as_written().is_some())
    }

    /// The report: causes explained from the evidence of the values and of the target's
    /// groups (their ops, precision, attributes and weights against the reference's).
    pub fn finish(mut self) -> Result<Report>
    where
        R: 'static,
        T: 'static,
        F: 'static,
    {
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
        let reference_reduced = self.reference.reduced_math();
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
        }
        for i in 0..self.layers.len() {
            self.gather_evidence(i, &summary);
        }
        let mut layers = self.layers;
        explain(&mut layers, &self.evidence, &mut summary);
        if summary.incomplete.is_none() {
            layerdiff_core::unseen_differences(&mut layers, &mut summary, self.unseen_weights);
        }
        // the drift's precision is the reference's where it rounds on a narrower grid
        if let (Some(p), Some(grid)) = (
            summary.precision.as_mut(),
            reference_reduced.and_then(|r| r.grid),
        ) && layerdiff_core::DType::from_name(&p.dtype).is_ok_and(|d| grid.narrower_than(d))
        {
            p.dtype = grid.name().to_string();
        }
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
            bisection: None,
            opaque: None,
            compiled_whole: None,
            machine: Machine::this(),
            timings: Some(self.clock.phases()),
        };
        report.keep_float32 = lower_precision_of(&report).and_then(|p| keep_float32(&report, &p));
        // The values the last segment left (see `free_segment`) are handed back while the
        // caller writes the report (here, where no thread can be made: a failed spawn drops
        // what it was given).
        let sides = (self.reference, self.target, self.truth);
        let _ = std::thread::Builder::new().spawn(move || drop(sides));
        Ok(report)
    }
}

/// Whether a weight check's words say the weight was matched by its shape alone and differs
/// in every element (`… (N of N elements differ) (the reference's `w`, matched by shape)`).
fn rewritten_form(said: &str) -> bool {
    let counted = said
        .split_once(" elements differ)")
        .and_then(|(before, _)| before.rsplit_once('('))
        .and_then(|(_, counts)| counts.split_once(" of "));
    said.contains(MATCHED_BY_SHAPE) && counted.is_some_and(|(moved, of)| moved == of)
}

/// The grid the reference's runtime computes `layer` on, where it lowers one of the group's
/// ops (`evidence.ops`) below the layer's dtype, and how, in words.
fn reference_lowers(
    reduced: Option<&layerdiff_runtime::ReducedMath>,
    layer: &layerdiff_core::Layer,
    evidence: &layerdiff_core::Evidence,
) -> Option<(layerdiff_core::DType, String)> {
    let reduced = reduced?;
    let grid = reduced.grid?;
    let dtype = layerdiff_core::DType::from_name(&layer.dtype).ok()?;
    (grid.narrower_than(dtype)
        && evidence
            .ops
            .iter()
            .any(|op| reduced.ops.contains(&op.as_str())))
    .then(|| (grid, reduced.how.clone()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_weight_matched_by_shape_that_differs_everywhere_is_a_rewritten_form() {
        let fused = "`ConvMulFusion_W_fc2.weight` differs: max abs diff 8.273e-2 (6400 of 6400 elements differ) (the reference's `fc2.weight`, matched by shape)";
        assert!(super::rewritten_form(fused));
        // one element edited in a folded Conv weight: an edit
        let edited = "`onnx::Conv_193` differs: max abs diff 2.000e-5 (1 of 73728 elements differ) (the reference's `layer2.0.conv1.weight`, matched by shape)";
        assert!(!super::rewritten_form(edited));
        // matched by name: always the model's weight
        assert!(!super::rewritten_form(
            "`fc.bias` differs: max abs diff 2.000e-5 (1000 of 1000 elements differ)"
        ));
    }
}
