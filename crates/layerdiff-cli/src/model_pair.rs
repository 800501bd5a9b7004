//! The flow of `layerdiff onnx`: one ONNX model on two runtimes, or two versions of a model.
//! Every intermediate value of the reference model is matched to a target value (by name, then
//! by producing node); each side runs once on the same input bytes, in segments when the values
//! would not fit in memory together, and every pair is compared in the reference's execution
//! order as soon as both sides have it.

use std::collections::HashMap;
use std::path::PathBuf;

use layerdiff_core::{
    DType, Evidence, InputInfo, Layer, LayerStatus, OnnxRef, Report, SCHEMA, SideInfo, Tensor,
    Tolerance, analyse, compare_pair, explain, judge, nothing_compared,
};
use layerdiff_onnx::{
    GraphIndex, LocalGroup, MAX_GROUP_NODES, Model, NCHWC_DOMAIN, NodeInfo, expose_values,
    local_group,
};
use layerdiff_runtime::Runtime;

use crate::Result;
use crate::inputs::check_inputs;
use crate::local::{Rerun, check_weight, disagreement, fit};
use crate::segments::{
    Part, PlanSide, PlannedLayer, Segmentation, Values, part_model, plan, segments_warning,
    value_sizes,
};
use crate::shipped::{Placement, Renames, Shipped};
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
    /// Values an optimizer renamed (given back in the target) or left in a blocked layout.
    pub renames: Renames,
    /// Set when the target runtime optimized the graph first (see [`crate::shipped`]).
    pub shipped: Option<Shipped>,
    /// Where the target runtime really ran the nodes, when it can place them elsewhere.
    pub placement: Option<Placement>,
    /// The inputs, already generated or read.
    pub inputs: Vec<(String, Tensor)>,
    /// Seed of generated inputs (`None` when read from a file).
    pub seed: Option<u64>,
    /// How each layer's tolerance is chosen.
    pub tolerance: Tolerance,
    /// Whether to measure each layer's local error (re-running its target nodes).
    pub local: bool,
    /// The most bytes of intermediate values to hold at once (`None`: no limit): it decides
    /// how the run is split into segments, never its numbers.
    pub max_memory: Option<u64>,
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
fn pair_values(
    reference: &Model,
    target: &Model,
    blocked: &HashMap<String, String>,
) -> Vec<Pairing> {
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
            // A value in a blocked layout holds the same numbers in another order.
            let target_value = target_value.and_then(|v| match blocked.get(&v) {
                Some(why) => Err(format!(
                    "held by the target in a blocked (NCHWc) layout as `{v}`, not given back: {why}"
                )),
                None => Ok(v),
            });
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
fn why_missing(r: &GraphIndex, t: &GraphIndex, node: &NodeInfo) -> String {
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
        .find(|m| !known_readers.contains(&m.name.as_str()) && !is_conversion(m));
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
                None => match computed_downstream(r, t, node) {
                    Some((value, fused)) if fused.index == m.index => format!(
                        "fused or removed: the target's {} node `{}` produces `{value}` without it",
                        m.op_type, m.name
                    ),
                    _ => format!(
                        "replaced: the target's {} node `{}` reads this node's inputs instead",
                        m.op_type, m.name
                    ),
                },
            }
        }
        None if let Some((value, m)) = computed_downstream(r, t, node) => format!(
            "fused or removed: the target's {} node `{}` produces `{value}` without it",
            m.op_type, m.name
        ),
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

/// Whether `node` only converts a value between layouts (ONNX Runtime's NCHWc reorders, and
/// those layerdiff adds to give back a renamed value): it computes nothing a value came from.
fn is_conversion(node: &NodeInfo) -> bool {
    node.domain == NCHWC_DOMAIN && matches!(node.op_type.as_str(), "ReorderInput" | "ReorderOutput")
}

/// The nearest value downstream of `node` that the target computes (breadth first over the
/// reference's readers, each step in graph order), and the target node that computes it: where
/// an optimizer fused the node's work. Behind a layout conversion, the node is the one whose
/// output it converts.
fn computed_downstream<'t>(
    r: &GraphIndex,
    t: &'t GraphIndex,
    node: &NodeInfo,
) -> Option<(String, &'t NodeInfo)> {
    let mut frontier: Vec<&NodeInfo> = vec![node];
    let mut seen = std::collections::HashSet::new();
    while !frontier.is_empty() && seen.len() < MAX_GROUP_NODES {
        let mut next: Vec<&NodeInfo> = Vec::new();
        for n in frontier {
            for out in n.outputs.iter().filter(|o| !o.is_empty()) {
                if n.index != node.index
                    && let Some(mut producer) = t.producer(out)
                {
                    while is_conversion(producer) {
                        producer = t.producer(producer.inputs.first()?)?;
                    }
                    return Some((out.clone(), producer));
                }
                next.extend(r.consumers(out).filter(|c| seen.insert(c.index)));
            }
        }
        next.sort_by_key(|n| n.index);
        frontier = next;
    }
    None
}

/// Runs the comparison and returns the report. Drift is a finding, not an error.
///
/// The run is planned in segments (see [`crate::segments`]) so that the values held at once fit
/// `max_memory`; when everything fits, there is one segment and the values compared are made
/// outputs of the models in place (a model is never copied: a large one is gigabytes). Without
/// `--vs` the one model serves both sides.
pub fn compare_models(
    pair: &mut ModelPair,
    clock: &mut Stopwatch,
) -> Result<(Report, Segmentation)> {
    let (r_index, t_index, pairings) = {
        let reference = &pair.reference_model;
        let target = pair.target_model.as_ref().unwrap_or(reference);
        let (r_index, t_index) = (
            GraphIndex::new(reference.graph()),
            GraphIndex::new(target.graph()),
        );
        check_inputs(&r_index, &pair.inputs)?;
        check_inputs(&t_index, &pair.inputs)?;
        // A file of expected values holds only some values: compare those.
        let pairings: Vec<Pairing> = pair_values(reference, target, &pair.renames.blocked)
            .into_iter()
            .filter(|p| pair.reference_runtime.provides(&p.value))
            .collect();
        (r_index, t_index, pairings)
    };
    // The reference's value behind each compared target value.
    let reference_of: HashMap<&str, &str> = pairings
        .iter()
        .filter_map(|p| Some((p.target.as_ref().ok()?.as_str(), p.value.as_str())))
        .collect();
    let is_input = |n: &str| pair.inputs.iter().any(|(name, _)| name == n);
    // Each compared layer's local group: the target nodes re-run on the reference's values.
    let mut groups: Vec<Option<std::result::Result<LocalGroup, String>>> = pairings
        .iter()
        .map(|p| {
            let target = p.target.as_ref().ok().filter(|_| pair.local)?;
            let known = |n: &str| reference_of.contains_key(n) || is_input(n);
            Some(local_group(&t_index, target, &known))
        })
        .collect();
    let planned: Vec<PlannedLayer<'_>> = pairings
        .iter()
        .zip(&groups)
        .map(|(p, g)| PlannedLayer {
            reference: &p.value,
            target: p.target.as_ref().ok().map(String::as_str),
            local_inputs: match g {
                Some(Ok(group)) => &group.inputs,
                _ => &[],
            },
        })
        .collect();
    let side = |index, rt: &(dyn Runtime + Send + Sync)| PlanSide {
        graph: rt.computes().then_some(index),
        sizes: value_sizes(index, &pair.inputs),
    };
    let plan = plan(
        &side(&r_index, pair.reference_runtime.as_ref()),
        &side(&t_index, pair.target_runtime.as_ref()),
        &planned,
        pair.max_memory,
    );
    let whole = plan.segments.len() == 1;
    let segmentation = plan.segmentation();
    if whole {
        let outputs = |part: &Part| part.outputs.clone();
        let (r_out, t_out) = (
            outputs(&plan.segments[0].reference),
            outputs(&plan.segments[0].target),
        );
        expose_values(&mut pair.reference_model, &r_out)?;
        match pair.target_model.as_mut() {
            Some(target) => expose_values(target, &t_out)?,
            None => expose_values(&mut pair.reference_model, &t_out)?,
        }
    }
    clock.lap("pairing values and planning the run", OWN);
    let mut shipped = pair.shipped.take();
    let placement = pair.placement.take();
    let pair = &*pair;
    let reference = &pair.reference_model;
    let target = pair.target_model.as_ref().unwrap_or(reference);
    let (reference_rt, target_rt) = (&pair.reference_runtime, &pair.target_runtime);

    let mut layers: Vec<Layer> = pairings
        .iter()
        .enumerate()
        .map(|(index, p)| {
            let mut layer = Layer::new(index, p.value.clone(), Vec::new(), String::new());
            layer.onnx = Some(OnnxRef {
                value: p.value.clone(),
                node: p.node.clone(),
                op_type: p.op_type.clone(),
            });
            match &p.target {
                Err(reason) => layer.reason = Some(reason.clone()),
                Ok(_) if pair.renames.restored.contains_key(&p.value) => {
                    layer.reason = pair.renames.restored.get(&p.value).cloned();
                }
                Ok(name) if name != &p.value => {
                    layer.reason = Some(format!("matched by node: the target calls it `{name}`"));
                }
                Ok(_) => {}
            }
            layer
        })
        .collect();
    let mut evidence = vec![Evidence::default(); layers.len()];
    // Each value's dtype on both sides, kept after the tensors are dropped.
    let (mut r_dtypes, mut t_dtypes): (HashMap<String, DType>, HashMap<String, DType>) =
        Default::default();
    let mut r_live = Values::new(pair.inputs.clone());
    let mut t_live = Values::new(pair.inputs.clone());
    let rerun = Rerun::new(target, target_rt.as_ref());

    for segment in &plan.segments {
        let r_model = part_model(
            reference,
            &segment.reference,
            whole,
            reference_rt.as_ref(),
            &r_live,
        )?;
        let t_model = part_model(target, &segment.target, whole, target_rt.as_ref(), &t_live)?;
        clock.lap("extracting segments", OWN);
        r_live.run(
            reference_rt.as_ref(),
            &r_model,
            &segment.reference,
            &mut r_dtypes,
        )?;
        clock.lap("reference run", RUNTIME);
        t_live.run(target_rt.as_ref(), &t_model, &segment.target, &mut t_dtypes)?;
        clock.lap("target run", RUNTIME);
        if let Some(shipped) = shipped.as_mut() {
            shipped.check_outputs(&t_live);
        }

        for i in segment.layers.clone() {
            let p = &pairings[i];
            let (Ok(target_name), Some(r)) = (&p.target, r_live.get(&p.value)) else {
                continue;
            };
            let t = t_live
                .get(target_name)
                .expect("every compared value is requested from both sides");
            let layer = &mut layers[i];
            layer.shape = r.shape.clone();
            layer.dtype = r.dtype.name().to_string();
            let outcome = compare_pair(r.view(), t.view());
            layer.status = outcome.status;
            layer.accumulated = outcome.stats;
            layer.target_shape = outcome.target_shape;
            layer.target_dtype = outcome.target_dtype;
        }
        clock.lap("comparison", OWN);

        // Local error: each target value recomputed from the reference's values of its inputs.
        let feed = |n: &str| -> std::result::Result<Tensor, String> {
            let Some(&r) = reference_of.get(n) else {
                return r_live
                    .get(n)
                    .cloned()
                    .ok_or_else(|| format!("`{n}` is not known"));
            };
            let (Some(reference), Some(t)) = (r_live.get(r), t_live.get(n)) else {
                return Err(format!("`{n}` is no longer held"));
            };
            fit(r, reference.clone(), t.dtype, &t.shape)
        };
        for i in segment.layers.clone() {
            let (layer, p) = (&mut layers[i], &pairings[i]);
            let (Ok(target_name), Some(r)) = (&p.target, r_live.get(&p.value)) else {
                continue;
            };
            if layer.status != LayerStatus::Compared {
                continue;
            }
            let name_of = |n: &str| reference_of.get(n).map_or(n, |r| r).to_string();
            rerun.measure_local(
                layer,
                &mut groups[i],
                target_name,
                r.view(),
                &feed,
                &name_of,
            );
        }
        clock.split_lap(
            "local error: extraction and comparison",
            "local error: inference",
            rerun.inference.take(),
        );

        // What the values of an exceeding layer show, while they are held.
        let mut exceeding = Vec::new();
        for i in segment.layers.clone() {
            let layer = &mut layers[i];
            judge(layer, pair.tolerance);
            if !(layer.exceeds_tol || layer.local_exceeds) {
                continue;
            }
            let p = &pairings[i];
            if let (Ok(target_name), Some(r)) = (&p.target, r_live.get(&p.value))
                && let Some(t) = t_live.get(target_name)
            {
                evidence[i] = Evidence::from_values(layer, r.view(), t.view());
            }
            exceeding.push(i);
        }
        clock.lap("analysis and causes", OWN);
        if !exceeding.is_empty() {
            // Does either side disagree with itself? Two more runs of the segment, one session.
            let again =
                |rt: &(dyn Runtime + Send + Sync), model: &Model, live: &Values, part: &Part| {
                    rt.run_twice(model, live.all(), &part.outputs).ok()
                };
            let r_again = again(reference_rt.as_ref(), &r_model, &r_live, &segment.reference);
            let t_again = again(target_rt.as_ref(), &t_model, &t_live, &segment.target);
            for i in segment.layers.clone() {
                let p = &pairings[i];
                let Ok(target_name) = &p.target else { continue };
                for (side, again, live, name) in [
                    ("reference", &r_again, &r_live, &p.value),
                    ("target", &t_again, &t_live, target_name),
                ] {
                    let e = &mut evidence[i];
                    if let Some(first) = live.get(name)
                        && let Some(d) = disagreement(first, again.as_ref(), name)
                        && e.self_disagreement
                            .as_ref()
                            .is_none_or(|(_, seen)| d > *seen)
                    {
                        e.self_disagreement = Some((side.to_string(), d));
                    }
                }
            }
            clock.lap("second runs (nondeterminism)", RUNTIME);
        }
        r_live.free(&segment.reference.free);
        t_live.free(&segment.target.free);
    }
    drop((r_live, t_live));
    let mut summary = analyse(&mut layers, pair.tolerance);
    let providers = [
        reference_rt.kernels_per_graph(),
        target_rt.kernels_per_graph(),
    ];
    summary
        .warnings
        .extend(segments_warning(plan.segments.len(), &providers));
    if reference_rt.rewrites() {
        summary.warnings.push(format!(
            "the reference ({}) optimizes the graph, but the values exposed for comparison keep it from fusing them: the reference measured is not the graph that ships; give the optimized side as --target, which is compared in the graph it optimized",
            reference_rt.detail()
        ));
    }
    let target_graph = shipped.map(|shipped| {
        let surviving = pairings.iter().filter(|p| p.target.is_ok());
        shipped.finish(
            surviving.map(|p| p.value.as_str()),
            &pair.renames,
            &mut summary,
        )
    });
    if let Some(why) = nothing_compared(&layers, &summary) {
        return Err(crate::Error::NothingCompared(format!(
            "{why}\nhint: values are paired by name, then by producing node; `--vs` must be a version of the same model, and `expected:` files must hold values named as in the model"
        )));
    }

    // Evidence from the graphs, for the layers that need a cause.
    for (i, layer) in layers.iter().enumerate() {
        let (true, Some(Ok(group))) = (summary.needs_cause(layer), &groups[i]) else {
            continue;
        };
        let e = &mut evidence[i];
        e.attributes = rerun.attribute_changes(reference, group);
        let fed = |n: &str| Some((*r_dtypes.get(*reference_of.get(n)?)?, *t_dtypes.get(n)?));
        let check = |node, position, name: &str, weight: &Tensor| {
            let theirs = reference_weight(pair, &rerun, node, position, name)?;
            Some(check_weight(name, theirs.view(), weight.view()))
        };
        rerun.group_evidence(group, e, &fed, &check);
    }
    explain(&mut layers, &evidence, &summary);
    clock.lap("analysis and causes", OWN);

    let side = |path: &PathBuf, rt: &(dyn Runtime + Send + Sync)| {
        SideInfo::new(rt.name(), format!("{} · {}", file_name(path), rt.detail()))
    };
    let mut target_side = side(
        pair.target.as_ref().unwrap_or(&pair.reference),
        target_rt.as_ref(),
    );
    if let Some(placement) = placement {
        placement.report(&mut target_side, &mut summary);
    }
    let report = Report {
        schema: SCHEMA,
        command: "onnx".to_string(),
        model: file_name(&pair.reference),
        reference: side(&pair.reference, reference_rt.as_ref()),
        target: target_side,
        target_graph,
        mode: if pair.local { "local" } else { "accumulated" }.to_string(),
        tolerance: pair.tolerance.info(),
        seed: pair.seed,
        inputs: InputInfo::describe(&pair.inputs),
        summary,
        layers,
        machine: layerdiff_core::Machine::this(),
        timings: Some(clock.phases()),
    };
    Ok((report, segmentation))
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
