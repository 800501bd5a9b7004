//! The flow of `layerdiff onnx`: one ONNX model on two runtimes, or two versions of a model.
//! Every intermediate value of the reference model is matched to a target value (by name, then
//! by producing node), both are exposed as outputs, each side runs once on the same input bytes,
//! and every pair is compared in the reference's execution order.

use std::collections::HashMap;
use std::path::PathBuf;

use layerdiff_core::{
    Evidence, InputInfo, Layer, LayerStatus, OnnxRef, Report, SCHEMA, SideInfo, Tensor, Tolerance,
    analyse, compare_pair, explain,
};
use layerdiff_onnx::{GraphIndex, LocalGroup, Model, expose_values};
use layerdiff_runtime::Runtime;

use crate::Result;
use crate::inputs::check_inputs;
use crate::local::{Rerun, check_weight, disagreement, fit};
use crate::timings::{OWN, RUNTIME, Stopwatch};

/// What `layerdiff onnx` compares.
pub struct ModelPair {
    /// The reference model file.
    pub reference: PathBuf,
    /// The reference model, as loaded.
    pub reference_model: Model,
    /// The target model file (`--vs`), or `None` to run the reference file on both sides.
    pub target: Option<PathBuf>,
    /// The target model, as loaded; `None` without `--vs` (the reference model is both).
    pub target_model: Option<Model>,
    /// The reference side.
    pub reference_runtime: Box<dyn Runtime + Send + Sync>,
    /// The target side.
    pub target_runtime: Box<dyn Runtime + Send + Sync>,
    /// The inputs, already generated or read.
    pub inputs: Vec<(String, Tensor)>,
    /// Seed of generated inputs (`None` when read from a file).
    pub seed: Option<u64>,
    /// How each layer's tolerance is chosen.
    pub tolerance: Tolerance,
    /// Whether to measure each layer's local error (re-running its target nodes).
    pub local: bool,
}

/// A reference value and where its counterpart is, or why it has none.
struct Pairing {
    value: String,
    node: String,
    op_type: String,
    target: Result<String, String>,
}

/// Matches each value produced by a reference node to a target value: the same name, else the
/// same output of a node with the same name.
fn pair_values(reference: &Model, target: &Model) -> Vec<Pairing> {
    let (r, t) = (
        GraphIndex::new(reference.graph()),
        GraphIndex::new(target.graph()),
    );
    let mut pairings = Vec::new();
    for node in r.nodes() {
        for (position, value) in node
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
        {
            let target_value = if t.producer(value).is_some() {
                Ok(value.clone())
            } else if let Some(same_node) = t.nodes().iter().find(|n| n.name == node.name) {
                if same_node.op_type != node.op_type || same_node.domain != node.domain {
                    // ONNX Runtime names a fused node after the first node it absorbed.
                    Err(format!(
                        "fused: the target's node `{}` is now a {}, whose output is a later value",
                        same_node.name, same_node.op_type
                    ))
                } else {
                    same_node.outputs.get(position).cloned().ok_or_else(|| {
                        format!("the target's node `{}` has no output {position}", node.name)
                    })
                }
            } else {
                Err(why_missing(&r, &t, node))
            };
            pairings.push(Pairing {
                value: value.clone(),
                node: node.name.clone(),
                op_type: node.op_type.clone(),
                target: target_value,
            });
        }
    }
    pairings
}

/// Why a reference node's value has no counterpart, read from the target's structure: the target
/// node that now reads the same data inputs fused or replaced it; with no reader, it was removed.
fn why_missing(r: &GraphIndex, t: &GraphIndex, node: &layerdiff_onnx::NodeInfo) -> String {
    let data_inputs: Vec<&String> = node
        .inputs
        .iter()
        .filter(|i| !i.is_empty() && !r.is_initializer(i))
        .collect();
    let known_readers: Vec<&str> = data_inputs
        .iter()
        .flat_map(|i| r.consumers(i))
        .map(|n| n.name.as_str())
        .collect();
    let newcomer = data_inputs
        .iter()
        .flat_map(|i| t.consumers(i))
        .find(|m| !known_readers.contains(&m.name.as_str()));
    match newcomer {
        Some(m) => {
            let downstream = m
                .outputs
                .iter()
                .find(|o| r.producer(o).is_some_and(|p| p.index > node.index));
            match downstream {
                Some(out) => format!(
                    "fused or removed: the target's {} node `{}` now reads this node's inputs and produces `{out}` directly",
                    m.op_type, m.name
                ),
                None => format!(
                    "replaced: the target's {} node `{}` reads this node's inputs instead",
                    m.op_type, m.name
                ),
            }
        }
        None if data_inputs
            .iter()
            .any(|i| t.consumers(i).next().is_some() || t.has_value(i)) =>
        {
            "removed from the target (no node of that name or value)".to_string()
        }
        None => {
            "not in the target: neither the value, its node, nor its inputs are there".to_string()
        }
    }
}

/// Runs the comparison and returns the report. Drift is a finding, not an error.
///
/// The values compared are made outputs of the models in place (a model is never copied: a
/// large one is gigabytes); without `--vs` the one model serves both sides.
pub fn compare_models(pair: &mut ModelPair, clock: &mut Stopwatch) -> Result<Report> {
    let pairings: Vec<Pairing> = {
        let reference = &pair.reference_model;
        let target = pair.target_model.as_ref().unwrap_or(reference);
        check_inputs(&GraphIndex::new(reference.graph()), &pair.inputs)?;
        check_inputs(&GraphIndex::new(target.graph()), &pair.inputs)?;
        // A file of expected values holds only some values: compare those.
        pair_values(reference, target)
            .into_iter()
            .filter(|p| pair.reference_runtime.provides(&p.value))
            .collect()
    };
    let reference_values: Vec<String> = pairings
        .iter()
        .filter(|p| p.target.is_ok())
        .map(|p| p.value.clone())
        .collect();
    let target_values: Vec<String> = pairings
        .iter()
        .filter_map(|p| p.target.clone().ok())
        .collect();
    expose_values(&mut pair.reference_model, &reference_values)?;
    if let Some(target) = pair.target_model.as_mut() {
        expose_values(target, &target_values)?;
    }
    clock.lap("pairing values and exposing them", OWN);
    let pair = &*pair;
    let reference = &pair.reference_model;
    let target = pair.target_model.as_ref().unwrap_or(reference);

    let (reference_rt, target_rt) = (&pair.reference_runtime, &pair.target_runtime);
    let reference_out = reference_rt.run(reference, &pair.inputs, &reference_values)?;
    clock.lap("reference run", RUNTIME);
    let target_out = target_rt.run(target, &pair.inputs, &target_values)?;
    clock.lap("target run", RUNTIME);
    let (r_index, t_index) = (by_name(&reference_out), by_name(&target_out));
    let tensors: Vec<(Option<&Tensor>, Option<&Tensor>)> = pairings
        .iter()
        .map(|p| {
            let r = r_index.get(p.value.as_str()).map(|&i| &reference_out[i].1);
            let t = p
                .target
                .as_ref()
                .ok()
                .and_then(|n| t_index.get(n.as_str()))
                .map(|&i| &target_out[i].1);
            (r, t)
        })
        .collect();

    let mut layers: Vec<Layer> = pairings
        .iter()
        .zip(&tensors)
        .enumerate()
        .map(|(index, (p, &(r, t)))| {
            let mut layer = Layer::new(
                index,
                p.value.clone(),
                r.map(|t| t.shape.clone()).unwrap_or_default(),
                r.map(|t| t.dtype.name()).unwrap_or_default(),
            );
            layer.onnx = Some(OnnxRef {
                value: p.value.clone(),
                node: p.node.clone(),
                op_type: p.op_type.clone(),
            });
            match (&p.target, r, t) {
                (Err(reason), _, _) => layer.reason = Some(reason.clone()),
                (Ok(target_name), Some(r), Some(t)) => {
                    if target_name != &p.value {
                        layer.reason = Some(format!(
                            "matched by node: the target calls it `{target_name}`"
                        ));
                    }
                    let outcome = compare_pair(r.view(), t.view());
                    layer.status = outcome.status;
                    layer.accumulated = outcome.stats;
                    layer.target_shape = outcome.target_shape;
                    layer.target_dtype = outcome.target_dtype;
                }
                (Ok(_), _, _) => unreachable!("every paired value was requested from both sides"),
            }
            layer
        })
        .collect();

    clock.lap("comparison", OWN);

    // Local error: each target value recomputed from the reference's values of its inputs.
    let rerun = Rerun::new(target, target_rt.as_ref());
    let mut groups: Vec<Option<LocalGroup>> = vec![None; layers.len()];
    let reference_of: HashMap<&str, &str> = pairings
        .iter()
        .filter_map(|p| Some((p.target.as_ref().ok()?.as_str(), p.value.as_str())))
        .filter(|(_, r)| r_index.contains_key(r))
        .collect();
    if pair.local {
        let input = |n: &str| {
            pair.inputs
                .iter()
                .find(|(name, _)| name == n)
                .map(|(_, t)| t)
        };
        let known = |n: &str| reference_of.contains_key(n) || input(n).is_some();
        let feed = |n: &str| -> std::result::Result<Tensor, String> {
            if let Some(t) = input(n) {
                return Ok(t.clone());
            }
            let r = &reference_out[r_index[reference_of[n]]].1;
            let t = &target_out[t_index[n]].1;
            fit(reference_of[n], r.clone(), t.dtype, &t.shape)
        };
        for ((layer, p), &(r, _)) in layers.iter_mut().zip(&pairings).zip(&tensors) {
            let (Ok(target_name), Some(r)) = (&p.target, r) else {
                continue;
            };
            if layer.status != LayerStatus::Compared {
                continue;
            }
            match rerun.run(target_name, &known, &feed) {
                Ok((group, value)) => {
                    let outcome = compare_pair(r.view(), value.view());
                    layer.local = outcome.stats;
                    layer.local_inputs = group
                        .inputs
                        .iter()
                        .map(|n| {
                            reference_of
                                .get(n.as_str())
                                .map_or(n.clone(), |r| r.to_string())
                        })
                        .collect();
                    groups[layer.index] = Some(group);
                }
                Err(reason) => layer.local_reason = Some(reason),
            }
        }
    }
    clock.split_lap(
        "local error: extraction and comparison",
        "local error: inference",
        rerun.inference.get(),
    );
    let summary = analyse(&mut layers, pair.tolerance);

    // Evidence for the layers that need a cause.
    let needs_cause = |l: &Layer| summary.needs_cause(l);
    let rerun_side = |rt: &(dyn Runtime + Send + Sync), model: &Model, values: &[String]| {
        if layers.iter().any(needs_cause) {
            rt.run_twice(model, &pair.inputs, values).ok()
        } else {
            None
        }
    };
    let reference_again = rerun_side(reference_rt.as_ref(), reference, &reference_values);
    let target_again = rerun_side(target_rt.as_ref(), target, &target_values);
    clock.lap("second runs (nondeterminism)", RUNTIME);
    let mut evidence = vec![Evidence::default(); layers.len()];
    for (i, layer) in layers.iter().enumerate() {
        let ((Some(r), Some(t)), true) = (tensors[i], needs_cause(layer)) else {
            continue;
        };
        let e = &mut evidence[i];
        *e = Evidence::from_values(layer, r.view(), t.view());
        for (side, again, first, name) in [
            ("reference", &reference_again, r, &pairings[i].value),
            (
                "target",
                &target_again,
                t,
                pairings[i].target.as_ref().unwrap_or(&pairings[i].value),
            ),
        ] {
            if let Some(d) = disagreement(first, again.as_ref(), name)
                && e.self_disagreement
                    .as_ref()
                    .is_none_or(|(_, seen)| d > *seen)
            {
                e.self_disagreement = Some((side.to_string(), d));
            }
        }
        if let Some(group) = &groups[i] {
            e.attributes = rerun.attribute_changes(reference, group);
            let fed = |n: &str| {
                let r = &reference_out[*r_index.get(reference_of.get(n)?)?].1;
                Some((r.dtype, target_out[*t_index.get(n)?].1.dtype))
            };
            let check = |node, position, name: &str, weight: &Tensor| {
                let theirs = reference_weight(pair, &rerun, node, position, name)?;
                Some(check_weight(name, theirs.view(), weight.view()))
            };
            rerun.group_evidence(group, e, &fed, &check);
        }
    }
    explain(&mut layers, &evidence, &summary);
    clock.lap("analysis and causes", OWN);

    let side = |path: &PathBuf, rt: &(dyn Runtime + Send + Sync)| SideInfo {
        runtime: rt.name().to_string(),
        detail: format!("{} · {}", file_name(path), rt.detail()),
    };
    Ok(Report {
        schema: SCHEMA,
        command: "onnx".to_string(),
        model: file_name(&pair.reference),
        reference: side(&pair.reference, reference_rt.as_ref()),
        target: side(
            pair.target.as_ref().unwrap_or(&pair.reference),
            target_rt.as_ref(),
        ),
        mode: if pair.local { "local" } else { "accumulated" }.to_string(),
        tolerance: pair.tolerance.info(),
        seed: pair.seed,
        inputs: InputInfo::describe(&pair.inputs),
        summary,
        layers,
        timings: Some(clock.phases()),
    })
}

/// Each output's position by name.
fn by_name(out: &[(String, Tensor)]) -> HashMap<&str, usize> {
    out.iter()
        .enumerate()
        .map(|(i, (n, _))| (n.as_str(), i))
        .collect()
}

/// The reference's counterpart of a target initializer: the one of the same name, else the
/// initializer at the same input position of the reference node with the same name.
fn reference_weight(
    pair: &ModelPair,
    rerun: &Rerun<'_>,
    node: usize,
    position: usize,
    name: &str,
) -> Option<Tensor> {
    let model = &pair.reference_model;
    if let Some(found) = model.initializer(name) {
        return found.ok();
    }
    let node_name = &rerun.index.nodes()[node].name;
    let same = model.graph().node.iter().find(|n| n.name() == node_name)?;
    model.initializer(same.input.get(position)?)?.ok()
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
