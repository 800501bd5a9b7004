//! The values of two ONNX graphs paired: by name where both have it, by value where an
//! optimizer renamed them, and why a value has no counterpart.

use std::collections::HashMap;

use layerdiff_core::{Layer, Location};
use layerdiff_onnx::{
    GraphIndex, MAX_GROUP_NODES, Model, NCHWC_DOMAIN, NodeInfo, data_inputs, reads_the_same,
};

use crate::{Alignment, Shared};

/// Pairs each value a reference node produces with a target value, in the reference's order,
/// keeping the pairs whose values both sides `provide` (reference value, target value).
pub(super) fn align(
    reference: &Model,
    target: &GraphIndex,
    renames: &crate::sides::graph::shipped::Renames,
    provides: &dyn Fn(&str, Option<&str>) -> bool,
) -> Alignment {
    let pairings: Vec<Pairing> = pair_values(reference, target, &renames.blocked)
        .into_iter()
        .filter(|p| provides(&p.value, p.target.as_deref().ok()))
        .collect();
    let layers = pairings
        .iter()
        .enumerate()
        .map(|(index, p)| {
            let mut layer = Layer::new(index, p.value.clone(), Vec::new(), String::new());
            layer.location = Some(Location::onnx(&p.value, &p.node, &p.op_type));
            layer.reason = match &p.target {
                Err(reason) => Some(reason.clone()),
                Ok(_) if renames.restored.contains_key(&p.value) => {
                    renames.restored.get(&p.value).cloned()
                }
                Ok(name) if name != &p.value => {
                    Some(format!("matched by node: the target calls it `{name}`"))
                }
                Ok(_) => None,
            };
            layer
        })
        .collect();
    Alignment {
        layers,
        reference: pairings.iter().map(|p| p.value.clone()).collect(),
        refutable: vec![false; pairings.len()],
        target: pairings.into_iter().map(|p| p.target.ok()).collect(),
        inconclusive: None,
        nothing_compared_hint: "values are paired by name, then by producing node; `--vs` must be a version of the same model, and `expected:` files must hold values named as in the model".to_string(),
        shared: Shared::EachLayer,
    }
}

/// A reference value and where its counterpart is, or why it has none.
struct Pairing {
    value: String,
    node: String,
    op_type: String,
    target: Result<String, String>,
}

/// Matches each value produced by a reference node to a target value: the same name, else the
/// same output of a node with the same name that reads the same values (an optimizer that
/// rewires a node, as the transpose optimizer does, can leave its name on another computation)
/// and does not write a value the reference computes apart (a fusion's).
fn pair_values(
    reference: &Model,
    t: &GraphIndex,
    blocked: &HashMap<String, String>,
) -> Vec<Pairing> {
    let r = GraphIndex::new(reference.graph());
    let mut pairings = Vec::new();
    // Reference value → target value, for the values paired so far (graph order).
    let mut paired: HashMap<String, String> = HashMap::new();
    for node in r.nodes() {
        for (position, value) in node
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
        {
            let target_value = if let Some(theirs) = t.producer(value) {
                Ok(clamped_after(t, node, theirs, value).unwrap_or_else(|| value.clone()))
            } else if let Some(same_node) = t.nodes().iter().find(|n| n.name == node.name) {
                if same_node.op_type != node.op_type || same_node.domain != node.domain {
                    // ONNX Runtime names a fused node after the first node it absorbed.
                    Err(format!(
                        "fused: the target's node `{}` is now a {}, whose output is a later value",
                        same_node.name, same_node.op_type
                    ))
                } else if let Some(why) = rewired(&r, t, node, same_node, &paired) {
                    Err(why)
                } else if let Some(later) = (same_node.outputs.get(position)).filter(|out| {
                    *out != value
                        && r.producer(out)
                            .is_some_and(|p| !CLAMPS.contains(&p.op_type.as_str()))
                }) {
                    // ONNX Runtime's Conv that absorbed the Mul after it keeps its name and
                    // writes the Mul's value, which the reference computes apart
                    Err(format!(
                        "fused or removed: the target's {} node `{}` produces `{later}` without it",
                        same_node.op_type, same_node.name
                    ))
                } else {
                    same_node.outputs.get(position).cloned().ok_or_else(|| {
                        format!("the target's node `{}` has no output {position}", node.name)
                    })
                }
            } else {
                Err(why_missing(&r, t, node))
            };
            // A value in a blocked layout holds the same numbers in another order.
            let target_value = target_value.and_then(|v| match blocked.get(&v) {
                Some(why) => Err(format!(
                    "held by the target in a blocked (NCHWc) layout as `{v}`, not given back: {why}"
                )),
                None => Ok(v),
            });
            let target_value = target_value.and_then(|v| match recoded(&r, t, value, &v) {
                Some(why) => Err(why),
                None => Ok(v),
            });
            if let Ok(target) = &target_value {
                paired.insert(value.clone(), target.clone());
            }
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

/// Why a value both sides hold as quantized codes of other integer types is not compared as
/// stored (`None`: it is; see [`crate::engine::recoded`]). Each side's type is read from what
/// produces the value, through ops that keep it: ONNX Runtime's saved optimized graph
/// declares the types the file had, not the uint8 its rewrite made.
fn recoded(r: &GraphIndex, t: &GraphIndex, value: &str, target: &str) -> Option<String> {
    use layerdiff_core::DType;
    let (ours, theirs) = (stored_type(r, value, 0)?, stored_type(t, target, 0)?);
    let dtype = |code| DType::from_onnx_code(code).ok();
    let (ours, theirs) = (dtype(ours)?, dtype(theirs)?);
    // ONNX Runtime moves a DequantizeLinear after the Reshape it fed (and so on), which keeps
    // its name: there it reshapes the codes, not the numbers
    if ours.is_float() && crate::engine::quantized_codes(theirs) {
        return Some(format!(
            "the target's node now computes on quantized codes: it holds `{target}` as {}, the reference this value as {} (an optimizer moved the dequantization past it)",
            theirs.name(),
            ours.name()
        ));
    }
    crate::engine::recoded(ours, theirs, target)
}

/// The element type `index` holds `value` in, read from its producer: a QuantizeLinear's is its
/// zero point's, an op that moves elements keeps its input's; else as declared or inferred.
fn stored_type(index: &GraphIndex, value: &str, depth: usize) -> Option<i32> {
    const KEEPS: &[&str] = &[
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Identity",
        "Slice",
        "Gather",
        "Split",
        "Concat",
        "Expand",
        "Tile",
        "MaxPool",
        "DepthToSpace",
        "SpaceToDepth",
    ];
    let Some(node) = index.producer(value).filter(|_| depth < 64) else {
        return index.elem_type(value);
    };
    match node.op_type.as_str() {
        "QuantizeLinear" => node
            .inputs
            .get(2)
            .filter(|z| !z.is_empty())
            .and_then(|z| index.elem_type(z))
            .or(Some(2)), // uint8 without a zero point
        op if KEEPS.contains(&op) => stored_type(index, node.inputs.first()?, depth + 1),
        _ => index.elem_type(value),
    }
}

/// Ops a quantizer drops after a node, its QuantizeLinear's range clamping in their place: the
/// node's output then bears their value's name and still holds the node's own value.
const CLAMPS: &[&str] = &["Relu", "Clip"];

/// Where the target holds the value of the reference's Relu or Clip `node` that a quantizer
/// dropped (see [`CLAMPS`]): the target's `theirs`, another op, writes the value before it
/// under its name, and the QuantizeLinear that reads it clamps in its place, so the value is
/// its DequantizeLinear's. `None` where no QuantizeLinear reads it: the target computes the
/// clamp itself (ONNX Runtime's Conv fused with its Relu writes the Relu's value).
fn clamped_after(
    t: &GraphIndex,
    node: &NodeInfo,
    theirs: &NodeInfo,
    value: &str,
) -> Option<String> {
    if !CLAMPS.contains(&node.op_type.as_str()) || CLAMPS.contains(&theirs.op_type.as_str()) {
        return None;
    }
    (t.consumers(value))
        .filter(|q| q.op_type == "QuantizeLinear")
        .filter_map(|q| q.outputs.first())
        .flat_map(|codes| t.consumers(codes))
        .find(|dq| dq.op_type == "DequantizeLinear")
        .and_then(|dq| dq.outputs.first().cloned())
}

/// Why the target's node of the same name and op as the reference's `node` computes another
/// value (see [`reads_the_same`]), or `None` when it reads the same ones.
fn rewired(
    r: &GraphIndex,
    t: &GraphIndex,
    node: &NodeInfo,
    same: &NodeInfo,
    paired: &HashMap<String, String>,
) -> Option<String> {
    if reads_the_same(r, t, node, same, paired) {
        return None;
    }
    let (theirs, ours) = (data_inputs(t, same), data_inputs(r, node));
    let list = |values: &[&String]| {
        values
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(format!(
        "rewired: the target's {} node `{}` reads {} where the reference's reads {}, so it computes another value (an optimizer moved work across it)",
        same.op_type,
        same.name,
        list(&theirs),
        list(&ours)
    ))
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
