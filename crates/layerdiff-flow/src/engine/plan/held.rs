//! What each side of a planned run holds, and for how long: every value from the position
//! that produces it to the last that needs it (see [`super::plan`]).

use std::collections::HashMap;

use super::{PlanSide, PlannedLayer};

/// The reference's values in the run: each produced at its step (or, handed over, at its
/// layer's place), and living until its last reader and the last local re-run fed from it (in
/// place of its target counterpart).
pub(super) fn reference_held(
    reference: &PlanSide<'_>,
    layers: &[PlannedLayer<'_>],
    position: &[usize],
    reference_of: &HashMap<&str, &str>,
) -> Vec<Held> {
    let mut held: Vec<Held> = Vec::new();
    let size = |side: &PlanSide<'_>, name: &str| side.sizes.get(name).copied().unwrap_or(0);
    // A reference value lives until its last reader, and until the last local re-run fed from
    // it (in place of its target counterpart).
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (layer, &at) in layers.iter().zip(position) {
        for input in layer.local_inputs {
            if let Some(&v) = reference_of.get(input.as_str()) {
                bump(&mut last, v, at);
            }
        }
    }
    if let Some(r) = reference.graph {
        for step in 0..r.steps() {
            for input in r.reads(step) {
                bump(&mut last, input, step);
            }
        }
        for step in 0..r.steps() {
            for out in r.writes(step).iter().filter(|o| !o.is_empty()) {
                held.push(Held {
                    side: Side::Reference,
                    name: out.clone(),
                    produced: step,
                    last: last.get(out.as_str()).copied().unwrap_or(0).max(step),
                    bytes: size(reference, out),
                });
            }
        }
    } else {
        for (layer, &at) in layers.iter().zip(position) {
            if layer.target.is_some() {
                held.push(Held {
                    side: Side::Reference,
                    name: layer.reference.to_string(),
                    produced: at,
                    last: last.get(layer.reference).copied().unwrap_or(0).max(at),
                    bytes: size(reference, layer.reference),
                });
            }
        }
    }
    held
}

/// The target's values in the run: each produced when the first compared value that depends
/// on its node is (`needed`), living until its last reader; a value handed over lives until it
/// is compared, and until the last local re-run fed in its place.
pub(super) fn target_held(
    target: &PlanSide<'_>,
    layers: &[PlannedLayer<'_>],
    position: &[usize],
    needed: &[Option<usize>],
) -> Vec<Held> {
    let mut held: Vec<Held> = Vec::new();
    let size = |side: &PlanSide<'_>, name: &str| side.sizes.get(name).copied().unwrap_or(0);
    if let Some(t) = target.graph {
        let mut last: HashMap<&str, usize> = HashMap::new();
        for (step, at) in needed.iter().enumerate() {
            let Some(at) = *at else {
                continue;
            };
            for input in t.reads(step) {
                bump(&mut last, input, at);
            }
        }
        for (layer, &at) in layers.iter().zip(position) {
            for value in layer
                .target
                .iter()
                .copied()
                .chain(layer.local_inputs.iter().map(String::as_str))
            {
                bump(&mut last, value, at);
            }
        }
        for (step, at) in needed.iter().enumerate() {
            let Some(at) = *at else {
                continue;
            };
            for out in t.writes(step).iter().filter(|o| !o.is_empty()) {
                held.push(Held {
                    side: Side::Target,
                    name: out.clone(),
                    produced: at,
                    last: last.get(out.as_str()).copied().unwrap_or(0).max(at),
                    bytes: size(target, out),
                });
            }
        }
    } else {
        // A value handed over lives until it is compared, and until the last local re-run
        // that is fed in its place (the re-run takes its dtype and shape).
        let mut last: HashMap<&str, usize> = HashMap::new();
        for (layer, &at) in layers.iter().zip(position) {
            for value in layer.local_inputs {
                bump(&mut last, value, at);
            }
        }
        for (layer, &at) in layers.iter().zip(position) {
            if let Some(value) = layer.target {
                held.push(Held {
                    side: Side::Target,
                    name: value.to_string(),
                    produced: at,
                    last: last.get(value).copied().unwrap_or(0).max(at),
                    bytes: size(target, value),
                });
            }
        }
    }
    held
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Side {
    Reference,
    Target,
}

/// A value a side holds for a while.
pub(super) struct Held {
    pub(super) side: Side,
    pub(super) name: String,
    pub(super) produced: usize,
    pub(super) last: usize,
    pub(super) bytes: u64,
}

fn bump<'a>(last: &mut HashMap<&'a str, usize>, value: &'a str, at: usize) {
    let slot = last.entry(value).or_insert(at);
    *slot = (*slot).max(at);
}
