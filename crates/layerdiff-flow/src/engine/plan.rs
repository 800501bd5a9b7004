//! Bounded memory for `layerdiff onnx`: the graph runs in segments, so only the values still
//! needed are held at any time. Each value is compared as soon as both sides have it and dropped
//! after its last use: the last node that reads it, or the last local re-run fed from it.
//!
//! Segments follow the reference's node order. With each segment the target runs the nodes its
//! compared values need that have not run yet (for one model on two runtimes: the same nodes).
//! A segment ends where the values held on entry, plus the values both sides produce in it,
//! would pass the memory budget. Each side feeds a segment from its *own* earlier values, so the
//! numbers are those of one run of the whole graph.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use crate::engine::memory::{Segmentation, bytes_text};

/// What one side runs in one segment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Part {
    /// Node indices, in graph order.
    pub nodes: Vec<usize>,
    /// The values the side hands back: compared in this segment, or read by a later one.
    pub outputs: Vec<String>,
    /// The values dropped once the segment is done.
    pub free: Vec<String>,
}

/// One stretch of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// The layers (positions in the reference's value order) compared in it.
    pub layers: Range<usize>,
    /// What the reference runs.
    pub reference: Part,
    /// What the target runs.
    pub target: Part,
}

/// One reference value in order, as the plan needs it.
pub struct PlannedLayer<'a> {
    /// The reference's value.
    pub reference: &'a str,
    /// The target's value it is compared with (`None`: not compared).
    pub target: Option<&'a str>,
    /// The target values its local re-run is fed from.
    pub local_inputs: &'a [String],
}

/// The order a side computes its values in: steps, in an order that runs, each reading and
/// writing named values (an ONNX graph's nodes; a traced graph's ops).
pub trait Dataflow {
    /// How many steps.
    fn steps(&self) -> usize;
    /// The values step `step` reads.
    fn reads(&self, step: usize) -> &[String];
    /// The values step `step` writes (an empty name: an output left out).
    fn writes(&self, step: usize) -> &[String];
    /// The step that writes `value` (`None`: an input or a constant).
    fn producer(&self, value: &str) -> Option<usize>;
}

/// One side of the plan.
pub struct PlanSide<'a> {
    /// The steps the side computes its values by; `None` for a side that hands its values
    /// over (a file of expected values, PyTorch's hooks).
    pub graph: Option<&'a dyn Dataflow>,
    /// Estimated bytes of each value the side holds, by name (see [`super::memory::value_sizes`]).
    pub sizes: HashMap<String, u64>,
    /// Bytes a run of the side takes beside its values (its runtime's copy of the weights); 0
    /// for a side whose weights are already in memory (PyTorch's) or that has none.
    pub weights: u64,
    /// For a side that computes: the bytes of the weights each step reads first (in step
    /// order), which a segment's run loads with its steps; empty for other sides.
    pub step_weights: Vec<u64>,
}

impl Plan {
    /// Whether the run keeps its budget: a `--max-memory` (`given`) that the run cut as finely as
    /// it can (`finest`) still exceeds cannot be kept, and is refused before running, with where
    /// and how much it needs; the default budget (`kept_to`, from half the memory available) is
    /// only warned of, since the run may still fit and no one asked for less (the warning, if
    /// any).
    pub(crate) fn budget_kept(
        &self,
        alignment: &crate::Alignment,
        given: Option<u64>,
        kept_to: Option<u64>,
        finest: impl FnOnce() -> Option<(String, u64)>,
    ) -> crate::Result<Option<String>> {
        // the layer whose reference value a plan names
        let layer_of = |value: &str| {
            alignment
                .reference
                .iter()
                .position(|r| r == value)
                .map_or(value, |i| alignment.layers[i].name.as_str())
                .to_string()
        };
        if let Some(given) = given
            && let Some((value, needs)) = finest()
            && needs > given
        {
            let held = if self.weights_counted {
                "of values and weights at once (both sides' values there, those still needed after it, and the weights the runtime loads for it)"
            } else {
                "of values at once (both sides' values there, and those still needed after it)"
            };
            return Err(crate::Error::Memory(format!(
                "--max-memory {} is too small: the run cannot be cut finer than at `{}`, which holds {} {held}\nhint: give --max-memory {} or more, or leave it out (half the memory available)",
                bytes_text(given),
                layer_of(&value),
                bytes_text(needs),
                bytes_text(needs.next_power_of_two()).replace(' ', ""),
            )));
        }
        Ok(match (given, &self.over_budget, kept_to) {
            (None, Some((value, needs)), Some(left)) => Some(format!(
                "the run holds about {} of values at once at `{}`, more than the {} that half the memory available leaves them: it may run out of memory",
                bytes_text(*needs),
                layer_of(value),
                bytes_text(left),
            )),
            _ => None,
        })
    }

    /// How the run is split, in figures.
    pub fn segmentation(&self) -> Segmentation {
        Segmentation {
            segments: self.segments.len(),
            total_bytes: self.total_bytes,
            peak_bytes: self.peak_bytes,
            process: None,
            weights_counted: self.weights_counted,
        }
    }
}

/// The segments, and what they hold.
#[derive(Debug, Clone)]
pub struct Plan {
    /// In run order; one segment when everything fits.
    pub segments: Vec<Segment>,
    /// Estimated bytes of all values the two sides produce.
    pub total_bytes: u64,
    /// Estimated most bytes of values held at once.
    pub peak_bytes: u64,
    /// Where the costliest segment over the budget holds the most, and the bytes it holds:
    /// planned with a budget of 0 (cut as finely as the run can be), the least budget the run
    /// can keep and the layer that needs it.
    pub over_budget: Option<(String, u64)>,
    /// Whether a segment's cost counts the weights the target's runtime loads for it (facing a
    /// reference that hands its values over), beside the values.
    pub weights_counted: bool,
}

/// Splits the run into segments whose values fit `budget` bytes (`None`: one segment).
///
/// A reference that computes orders the run by its nodes; one that hands its values over orders
/// it by the layers, as given.
pub fn plan(
    reference: &PlanSide<'_>,
    target: &PlanSide<'_>,
    layers: &[PlannedLayer<'_>],
    budget: Option<u64>,
) -> Plan {
    // Where each layer is compared: its reference producer, or its own place in the order.
    let (positions, position): (usize, Vec<usize>) = match reference.graph {
        Some(r) => (
            r.steps(),
            layers
                .iter()
                .map(|l| r.producer(l.reference).unwrap_or(0))
                .collect(),
        ),
        None => (layers.len(), (0..layers.len()).collect()),
    };
    let needed = needed_at(target, layers, &position);
    // The first reference value behind each compared target value.
    let mut reference_of: HashMap<&str, &str> = HashMap::new();
    for l in layers {
        if let Some(t) = l.target {
            reference_of.entry(t).or_insert(l.reference);
        }
    }

    // Each side's values: (name, produced at, last used at, bytes).
    let mut held = reference_held(reference, layers, &position, &reference_of);
    held.extend(target_held(target, layers, &position, &needed));

    // Bytes produced at each position, and bytes held on entering it.
    let mut produced = vec![0u64; positions + 1];
    let mut delta = vec![0i128; positions + 2];
    for h in &held {
        produced[h.produced] += h.bytes;
        delta[h.produced + 1] += i128::from(h.bytes);
        delta[h.last + 1] -= i128::from(h.bytes);
    }
    let mut entering = vec![0u64; positions + 1];
    let mut running = 0i128;
    for (p, slot) in entering.iter_mut().enumerate() {
        running += delta[p];
        *slot = running.max(0) as u64;
    }
    // A local re-run is fed from the reference's values of its group's inputs, which the
    // reference's node order may put after the layer (two files order their nodes
    // differently): no segment may end between a layer and the last of those.
    let made_at: HashMap<&str, usize> = held
        .iter()
        .filter(|h| h.side == Side::Reference)
        .map(|h| (h.name.as_str(), h.produced))
        .collect();
    let mut feeds_until = vec![0usize; positions + 1];
    for (layer, &at) in layers.iter().zip(&position) {
        for input in layer.local_inputs {
            let made = reference_of
                .get(input.as_str())
                .and_then(|v| made_at.get(v))
                .copied()
                .unwrap_or(0);
            feeds_until[at] = feeds_until[at].max(made);
        }
    }
    // Count what a segment produces twice: a runtime's buffers and our copies of its values
    // overlap by one value at most, but its internal values live in the runtime too.
    let loaded = loaded_at(reference, target, &needed, positions);
    let produced: Vec<u64> = produced
        .iter()
        .zip(&loaded)
        .map(|(&p, &w)| 2 * p + w)
        .collect();
    let (bounds, costs) = cut(&entering, &produced, &feeds_until, budget);
    let peak_bytes = costs.iter().copied().max().unwrap_or(0);
    let total_bytes = held.iter().map(|h| h.bytes).sum();
    let over_budget = budget.and_then(|budget| {
        over(
            budget,
            (&bounds, &costs),
            &produced,
            layers,
            &position,
            &held,
        )
    });

    let segments = segments_of(
        bounds,
        &held,
        layers,
        &position,
        reference.graph.is_some(),
        &needed,
    );
    Plan {
        segments,
        total_bytes,
        peak_bytes,
        over_budget,
        weights_counted: reference.graph.is_none() && loaded.iter().any(|&w| w > 0),
    }
}

/// The weights the target's runtime loads with the nodes first needed at each position, where
/// the reference hands its values over: the target's runtime is then the run's only copy of
/// the weights, and a segment's run loads just its own nodes' (PyTorch may hold its weights one
/// module at a time), so a segment costs them too. Zero everywhere facing a reference that
/// computes (each runtime holds its own).
fn loaded_at(
    reference: &PlanSide<'_>,
    target: &PlanSide<'_>,
    needed: &[Option<usize>],
    positions: usize,
) -> Vec<u64> {
    let mut loaded = vec![0u64; positions + 1];
    if reference.graph.is_none() {
        for (n, &at) in needed.iter().enumerate() {
            if let (Some(at), Some(&bytes)) = (at, target.step_weights.get(n)) {
                loaded[at] += bytes;
            }
        }
    }
    loaded
}

/// The positions cut into segments, each costing what is held on entering it and what it
/// `produced` (values and weights) at most `budget` where it can be cut so (never between a
/// layer and the last value feeding its local re-run: `feeds_until`), and each one's cost.
fn cut(
    entering: &[u64],
    produced: &[u64],
    feeds_until: &[usize],
    budget: Option<u64>,
) -> (Vec<Range<usize>>, Vec<u64>) {
    let positions = produced.len() - 1;
    let cost = |start: usize, made: u64| entering[start] + made;
    let mut bounds: Vec<Range<usize>> = Vec::new();
    let (mut start, mut made, mut reach) = (0usize, 0u64, 0usize);
    for (p, &add) in produced.iter().enumerate().take(positions) {
        if let Some(budget) = budget
            && p > start
            && reach < p
            && cost(start, made + add) > budget
        {
            bounds.push(start..p);
            (start, made) = (p, 0);
        }
        made += add;
        reach = reach.max(feeds_until[p]);
    }
    bounds.push(start..positions);
    let costs = bounds
        .iter()
        .map(|b| cost(b.start, produced[b.clone()].iter().sum()))
        .collect();
    (bounds, costs)
}

/// When each target node is first needed (`None`: never run): the position of the first
/// compared value that depends on it.
fn needed_at(
    target: &PlanSide<'_>,
    layers: &[PlannedLayer<'_>],
    position: &[usize],
) -> Vec<Option<usize>> {
    let Some(t) = target.graph else {
        return Vec::new();
    };
    let mut needed: Vec<Option<usize>> = vec![None; t.steps()];
    for (layer, &at) in layers.iter().zip(position) {
        let Some(value) = layer.target else { continue };
        let mut stack: Vec<usize> = t.producer(value).into_iter().collect();
        while let Some(n) = stack.pop() {
            if needed[n].is_some() {
                continue;
            }
            needed[n] = Some(at);
            stack.extend(t.reads(n).iter().filter_map(|i| t.producer(i)));
        }
    }
    needed
}

/// A segment past the `budget` is one that could not be cut smaller: where the costliest such
/// segment (`bounds` with their `costs`) produces most, named by its layer (or its value), and
/// what that segment costs.
fn over(
    budget: u64,
    (bounds, costs): (&[Range<usize>], &[u64]),
    produced: &[u64],
    layers: &[PlannedLayer<'_>],
    position: &[usize],
    held: &[Held],
) -> Option<(String, u64)> {
    let (b, &worst) = bounds
        .iter()
        .zip(costs)
        .filter(|(_, c)| **c > budget)
        .max_by_key(|(_, c)| **c)?;
    let at = b
        .clone()
        .max_by_key(|&p| (produced[p], std::cmp::Reverse(p)))?;
    let name = layers
        .iter()
        .zip(position)
        .find(|(_, p)| **p == at)
        .map(|(l, _)| l.reference.to_string())
        .or_else(|| {
            held.iter()
                .find(|h| h.produced == at)
                .map(|h| h.name.clone())
        })?;
    Some((name, worst))
}

/// The run's segments, one per range of positions in `bounds`: the layers compared in each,
/// and each side's part (the nodes it runs, where the side `computes` for the reference, the
/// values it hands out, and those it frees after).
fn segments_of(
    bounds: Vec<Range<usize>>,
    held: &[Held],
    layers: &[PlannedLayer<'_>],
    position: &[usize],
    computes: bool,
    needed: &[Option<usize>],
) -> Vec<Segment> {
    let compared: HashSet<(Side, &str)> = layers
        .iter()
        .filter_map(|l| Some([(Side::Reference, l.reference), (Side::Target, l.target?)]))
        .flatten()
        .collect();
    bounds
        .into_iter()
        .map(|b| {
            let part = |side: Side| {
                let mut part = Part::default();
                for h in held.iter().filter(|h| h.side == side) {
                    if b.contains(&h.produced)
                        && (compared.contains(&(side, h.name.as_str())) || h.last >= b.end)
                    {
                        part.outputs.push(h.name.clone());
                    }
                    if b.contains(&h.last) {
                        part.free.push(h.name.clone());
                    }
                }
                part.nodes = match side {
                    Side::Reference if computes => b.clone().collect(),
                    Side::Target => (0..needed.len())
                        .filter(|&n| needed[n].is_some_and(|at| b.contains(&at)))
                        .collect(),
                    Side::Reference => Vec::new(),
                };
                part
            };
            let first = position
                .iter()
                .position(|&p| p >= b.start)
                .unwrap_or(layers.len());
            let end = position
                .iter()
                .position(|&p| p >= b.end)
                .unwrap_or(layers.len());
            Segment {
                layers: first..end,
                reference: part(Side::Reference),
                target: part(Side::Target),
            }
        })
        .collect()
}

mod held;
use held::{Held, Side, reference_held, target_held};

#[cfg(test)]
mod tests;
