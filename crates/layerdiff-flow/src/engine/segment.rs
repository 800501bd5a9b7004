//! One segment of the run: both sides produce their part, then every pair in it is compared,
//! re-run locally on the reference's values, measured against the baseline, and dropped after
//! its last use.

use super::memory::budget;
use super::{
    Baseline, Engine, Evidence, Exact, Group, Layer, OWN, Pairs, RUNTIME, Result, Side, Tensor,
    disagreement, judge,
};
use crate::Recompute;
use crate::engine::plan::Segment;

/// The segment's pairs of values as the engine holds them (a macro: each field is borrowed on
/// its own, so the layers stay free to change).
macro_rules! pairs {
    ($engine:expr) => {
        Pairs {
            reference: &$engine.reference,
            target: &$engine.target,
            truth: $engine.truth.as_ref().map(|t| t as &dyn Side),
            reference_values: &$engine.reference_values,
            target_values: &$engine.target_values,
            reference_of: &$engine.reference_of,
            target_of: &$engine.target_of,
            inputs: &$engine.inputs,
            shared: $engine.shared,
            tolerance: $engine.settings.tolerance,
        }
    };
}

impl<R: Side, T: Side, F: Side> Engine<R, T, F> {
    /// Runs the next segment: both sides' parts, then every comparison in it.
    pub(super) fn run_segment(&mut self) -> Result<()> {
        let segment = self.plan.segments[self.done].clone();
        self.produce(&segment)?;
        let held = pairs!(self);
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

        // The layers judged in this segment: all of them, unless a signal stops the run first.
        let mut judged = segment.layers.clone();
        // A target that runs its model whole: each layer's own error on its own inputs.
        let mut own = vec![false; self.layers.len()];
        if self.settings.local {
            for i in segment.layers.clone() {
                own[i] = held.own_error(&mut self.layers[i], i);
            }
        }
        if let Some(stopped) = self.local_errors(&segment, &own) {
            self.stopped_at = Some(stopped);
            judged = segment.layers.start..stopped;
        }
        let held = pairs!(self);

        // What the values of an exceeding layer show, while they are held.
        let mut exceeding = false;
        for i in judged.clone() {
            let layer = &mut self.layers[i];
            judge(layer, self.settings.tolerance);
            if !(layer.exceeds_tol || layer.local_exceeds) {
                continue;
            }
            exceeding = true;
            if let Some((r, t)) = held.pair(i) {
                self.evidence[i] = Evidence::from_values(layer, r.view(), t.view());
            }
            if let Some(recompute) = self.target.recompute() {
                let group = self.groups[i].as_ref().and_then(|g| g.as_ref().ok());
                self.evidence[i].clipped = held.clipped(recompute, group, i);
            }
        }
        self.clock.lap("analysis and causes", OWN);
        if exceeding {
            self.second_runs(&segment, judged);
        }
        self.free_segment(&segment);
        self.done += 1;
        Ok(())
    }

    /// Each layer of `segment` re-run locally on the reference's values (but those whose own
    /// error the target had, `own`), compared, and measured against its baseline. Returns the
    /// layer a signal stopped the run before, if one did.
    fn local_errors(&mut self, segment: &Segment, own: &[bool]) -> Option<usize> {
        let recompute = self.target.recompute().filter(|_| self.settings.local)?;
        let held = pairs!(self);
        let mut stopped = None;
        // Outputs are compared in batches (see [`local_batch`]).
        let limit = local_batch(self.settings.max_memory);
        let (mut runs, mut held_bytes) = (Vec::new(), 0);
        for i in segment.layers.clone() {
            if crate::interrupt::requested().is_some() {
                // the layers from here on are not judged: the run stops before them
                stopped = Some(i);
                break;
            }
            if own[i] {
                continue;
            }
            let out = held.measure_local(&mut self.layers[i], &mut self.groups[i], recompute, i);
            if let Some(ticker) = self.progress.as_mut() {
                ticker.tick(i + 1);
            }
            if let Some(out) = out {
                // A value bit for bit the reference's has no error of its own: its
                // multiple is 0 whatever the ideal, and where the layer stays within its
                // tolerance nothing else reads the ideal, so none is computed. (One that
                // exceeds is judged against it: the ideal explains its difference.)
                let same = self.baseline.is_some() && {
                    layerdiff_core::judge(&mut self.layers[i], self.settings.tolerance);
                    !self.layers[i].exceeds_tol
                        && (self.reference.get(&self.reference_values[i]))
                            .is_some_and(|r| r.dtype == out.dtype && r.bytes == out.bytes)
                };
                if same {
                    self.layers[i].baseline_reason = Some(layerdiff_core::SAME_BITS.to_string());
                }
                let exact = self.baseline.as_deref().filter(|_| !same).map(|b| {
                    let group = self.groups[i].as_ref().and_then(|g| g.as_ref().ok());
                    let value = &self.reference_values[i];
                    let feed = |n: &str| held.baseline_feed(n);
                    if !out.dtype.is_float() {
                        // (the group's inputs by the target's names: a framework reference
                        // names its values otherwise)
                        let holds = |n: &str| {
                            (held.target.dtype(n)).or_else(|| feed(n).ok().map(|(_, d)| d))
                        };
                        return index_exact(b, value, group, recompute, &feed, &holds);
                    }
                    baseline_exact(b, value, &self.layers[i], &out, group, recompute, &feed)
                });
                held_bytes += out.bytes.len() as u64;
                if let Some(e) = &exact {
                    let value = e.value.as_ref().map_or(0, |v| v.bytes.len());
                    let terms = e.reduction.as_ref().map_or(0, |t| t.bytes());
                    held_bytes += (value + terms) as u64;
                }
                runs.push((i, out, exact));
            }
            if held_bytes >= limit {
                let beyond = held.compare_local(&mut self.layers, std::mem::take(&mut runs));
                let beyond =
                    held.with_reductions(&mut self.layers, self.baseline.as_deref(), beyond);
                held.as_written(&mut self.layers, &self.groups, recompute, beyond);
                held_bytes = 0;
            }
        }
        let beyond = held.compare_local(&mut self.layers, runs);
        let beyond = held.with_reductions(&mut self.layers, self.baseline.as_deref(), beyond);
        held.as_written(&mut self.layers, &self.groups, recompute, beyond);
        // the baseline's float64 evaluation is inference too, as PyTorch's is where it
        // hands its float64 values over
        let float64 = self
            .baseline
            .as_ref()
            .map_or_else(Default::default, |b| b.take_time());
        let mut inference = vec![("local error: inference", recompute.take_time())];
        if !float64.is_zero() {
            inference.push(("local error: float64 inference", float64));
        }
        self.clock
            .split_lap("local error: extraction and comparison", &inference);
        stopped
    }

    /// Both sides produce their part of `segment` (a target that ran ahead has it already),
    /// and the truth computes the reference's part, in float64 (or was handed it over); a
    /// truth that cannot run leaves the comparison without it, and says so.
    fn produce(&mut self, segment: &Segment) -> Result<()> {
        let whole = self.plan.segments.len() == 1;
        let clock = &mut self.clock;
        self.reference
            .produce(&segment.reference, whole, clock, "reference run")?;
        if self.target_ahead.is_none() {
            self.target
                .produce(&segment.target, whole, clock, "target run")?;
        }
        if let Some(truth) = self.truth.as_mut()
            && let Err(e) = truth.produce(&segment.reference, whole, clock, "float64 run")
        {
            self.truth = None;
            self.truth_lost = Some(crate::error_chain(&e));
        }
        Ok(())
    }

    /// Does either side disagree with itself? Two more runs of the segment, one session,
    /// handing back only the exceeding layers' values among `judged`: the others' would be
    /// held twice more beside everything the segment holds, and nothing reads them.
    fn second_runs(&mut self, segment: &Segment, judged: std::ops::Range<usize>) {
        let exceeds = |i: usize| self.layers[i].exceeds_tol || self.layers[i].local_exceeds;
        let exceeding_layers = || judged.clone().filter(|&i| exceeds(i));
        let r_keep = kept(
            &segment.reference,
            exceeding_layers().map(|i| &self.reference_values[i]),
        );
        let r_again = self.reference.again(&segment.reference, &r_keep);
        // A target that ran the whole graph ahead runs it again once, at the end, when
        // the reference's values are gone (its copy of the model beside them is what the
        // run ahead avoided): its first values of these layers are kept until then.
        let t_again = if self.target_ahead.is_some() {
            for i in exceeding_layers() {
                let Some(value) = &self.target_values[i] else {
                    continue;
                };
                if let Some(first) = self.target.get(value) {
                    self.deferred.push((i, value.clone(), first.clone()));
                }
            }
            None
        } else {
            let t_keep = kept(
                &segment.target,
                exceeding_layers().filter_map(|i| self.target_values[i].as_ref()),
            );
            self.target.again(&segment.target, &t_keep)
        };
        for i in exceeding_layers() {
            let Some(target_value) = &self.target_values[i] else {
                continue;
            };
            // (a target that ran ahead has no second runs yet: its part comes at the end)
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
                let d = values.get(name).and_then(|first| {
                    disagreement(first, again.as_ref(), name).or_else(|| values.disagreement(name))
                });
                self.evidence[i].disagrees(side, d);
            }
        }
        // Their values go back before the lap: releasing them is part of the second runs.
        drop((r_again, t_again));
        self.clock.lap("second runs (nondeterminism)", RUNTIME);
    }

    /// Drops what the segment's layers no longer need, on every side, and hands it back.
    fn free_segment(&mut self, segment: &Segment) {
        if let Some(baseline) = self.baseline.as_mut() {
            baseline.free(&self.reference_values[segment.layers.clone()]);
        }
        // After the last segment nothing reads the sides' values again (but a target's deferred
        // second runs): they are dropped once the report is made, on a thread of their own (see
        // `finish`). Unmapping them here took 20 ms of a ResNet-50 run, in every other run.
        let last = self.done + 1 >= self.plan.segments.len() && self.deferred.is_empty();
        if last {
            return;
        }
        self.reference.free(&segment.reference.free);
        self.target.free(&segment.target.free);
        if let Some(truth) = self.truth.as_mut() {
            // A truth that computes keeps what its later segments read, as the reference does;
            // one handed over holds each value only until it is compared.
            if truth.plan_view().graph.is_some() {
                truth.free(&segment.reference.free);
            } else {
                truth.free(&self.reference_values[segment.layers.clone()]);
            }
        }
        // Where the budget cut the run, what the segment freed goes back to the system before
        // the next one takes its own. glibc raises its mmap threshold (up to 32 MB) each time a
        // large block is freed, so later values of a few megabytes come from the heap, which
        // keeps what they free: in a segmented `layerdiff torch` run of the decoder at 4 × 1024
        // tokens the low point between segments climbed from 4.6 to 10.3 GB and the peak
        // reached 14.4 GB; with this, 10.6 GB and no slower. (A fixed 1 MiB threshold gave
        // 10.1 GB, but every value was then a fresh mapping: ResNet-18 ran 1.5× slower.)
        // A run whose values fit the budget whole, and half the machine's memory, keeps what a
        // stretch freed for the next, which takes about as much again (see
        // `memory::give_back_freed`).
        if self.hands_back_freed {
            crate::engine::memory::give_back_freed();
        }
    }
}

impl<R: Side, T: Side, F: Side> Engine<R, T, F> {
    /// The second runs a target that ran ahead left for the end (see [`Engine::run_segment`]):
    /// one session, two runs of the whole graph, handing back the exceeding layers' values.
    pub(super) fn run_deferred_again(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        let deferred = std::mem::take(&mut self.deferred);
        // (what the stretches freed, kept where the run fits: the session takes it)
        if self.hands_back_freed {
            crate::engine::memory::give_back_freed();
        }
        let whole = self
            .target_ahead
            .as_ref()
            .expect("deferred only after running ahead");
        let keep = kept(whole, deferred.iter().map(|(_, name, _)| name));
        let again = self.target.again(whole, &keep);
        for (i, name, first) in &deferred {
            let d = disagreement(first, again.as_ref(), name)
                .or_else(|| self.target.disagreement(name));
            self.evidence[*i].disagrees("target", d);
        }
        drop((again, deferred));
        self.clock.lap("second runs (nondeterminism)", RUNTIME);
    }
}

/// The values of `part` among `values`, each once, in the part's order: what second runs hand
/// back (a value several layers share is asked for once; one an earlier part produced is not
/// this part's to hand back).
fn kept<'a>(
    part: &crate::engine::plan::Part,
    values: impl Iterator<Item = &'a String>,
) -> Vec<String> {
    let wanted: std::collections::HashSet<&String> = values.collect();
    part.outputs
        .iter()
        .filter(|o| wanted.contains(o))
        .cloned()
        .collect()
}

/// Bytes of local re-run outputs held before they are compared, all at once across the threads
/// (one by one, most are too small to keep the threads busy): a sixteenth of the memory budget,
/// at most 64 MiB; one output is held whatever its size.
pub(super) fn local_batch(max_memory: Option<u64>) -> u64 {
    const MOST: u64 = 64 << 20;
    budget(max_memory).map_or(MOST, |b| (b / 16).min(MOST))
}

/// The warning a run in `segments` segments owes when a side runs on a provider that picks its
/// kernels per graph: there, a segment may compute a value with other bits than the whole run
/// (on the CPU the bits are the same, which the tests check).
pub(super) fn segments_warning(
    segments: usize,
    providers: &[Option<&'static str>],
) -> Option<String> {
    let provider = providers.iter().flatten().next().filter(|_| segments > 1)?;
    Some(format!(
        "ran in {segments} segments on {provider}, which picks its kernels for each graph it is given: values may differ in their last bits from a run of the whole graph (use a --max-memory that fits the whole run to compare with one)"
    ))
}

/// A layer's exact value on the baseline `b` (`value` the reference's name of it), on the grid
/// the target computes it in: as the framework said, else the narrower of its output's dtype
/// (`out`: the target's, [`layerdiff_core::computing_grid`]) and its group's narrowest; with the roundings an honest kernel makes on the way and
/// the reduction's terms, where the baseline measured them.
fn baseline_exact<'a>(
    b: &dyn Baseline,
    value: &str,
    layer: &Layer,
    out: &Tensor,
    group: Option<&Group>,
    recompute: &dyn Recompute,
    feed: &dyn Fn(&str) -> crate::engine::baseline::Fed<'a>,
) -> Exact {
    let grid = b.grid_of(value).or_else(|| {
        let held = layerdiff_core::computing_grid(&layer.dtype, out.dtype);
        let inside = group.and_then(|g| recompute.computes_in(g));
        match (held, inside) {
            (Some(h), Some(g)) if g.narrower_than(h) => Some(g),
            (Some(h), _) => Some(h),
            (None, g) => g,
        }
    });
    let stages = match (group, grid) {
        (Some(group), Some(grid)) => recompute.rounding_stages(group, grid),
        _ => 0,
    };
    let quantizes = group.is_some_and(|g| {
        recompute
            .members(g)
            .iter()
            .any(|m| layerdiff_core::quantizing_op(&m.op))
    });
    let exact = grid
        .filter(|g| g.is_float())
        .ok_or_else(|| "the layer is not a float".to_string())
        .and_then(|grid| {
            if quantizes {
                return Err(
                    "the target quantizes it, which a float baseline does not model".to_string(),
                );
            }
            b.exact(value, grid, feed)
        });
    Exact {
        value: exact,
        stages,
        grid,
        reduction: b.reduction_of(value),
    }
}

/// The exact value of a layer of indices (ArgMax, ArgMin), which rounds nothing itself: the
/// same op on its inputs as the target holds them (`holds`), on the narrowest float grid they
/// are held in. Where its group computes floats before it (a MatMul whose result the target
/// rounds), no such ideal is exact, and none is computed.
fn index_exact<'a>(
    b: &dyn Baseline,
    value: &str,
    group: Option<&Group>,
    recompute: &dyn Recompute,
    feed: &dyn Fn(&str) -> crate::engine::baseline::Fed<'a>,
    holds: &dyn Fn(&str) -> Option<layerdiff_core::DType>,
) -> Exact {
    let grid = b.grid_of(value).or_else(|| {
        let held = group?.inputs.iter().filter_map(|n| holds(n));
        held.filter(|d| d.is_float())
            .reduce(|a, d| if d.narrower_than(a) { d } else { a })
    });
    let exact = match (group, grid) {
        (Some(g), _) if recompute.computes_in(g).is_some() => Err(
            "its indices are taken of float values its group computes first, which the target rounds as no exact computation does".to_string(),
        ),
        (_, None) => Err("it takes no float input whose indices could be picked exactly".to_string()),
        (_, Some(grid)) => b.exact(value, grid, feed),
    };
    Exact {
        value: exact,
        stages: 0,
        grid,
        reduction: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_runs_ask_for_each_value_of_the_part_once() {
        let part = crate::engine::plan::Part {
            outputs: vec!["a".into(), "b".into(), "c".into()],
            ..Default::default()
        };
        // `b` shared by two exceeding layers; `x` produced by an earlier part
        let asked = ["c", "b", "b", "x"].map(String::from);
        assert_eq!(kept(&part, asked.iter()), ["b", "c"]);
    }

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
