//! Mapping functional calls between modules onto ONNX values.
//!
//! A module's `forward` computes between its submodules: ResNet's residual `out += identity`,
//! an attention's `matmul`, `softmax` and scaling, a transformer block's residual adds. These are
//! captured on the PyTorch side as calls of an op (`add`, `matmul`…, and the normalizations a
//! module computes itself, like timm's `BatchNormAct2d`) owned by the module whose `forward`
//! made them. Both exporters record them in that module's own scope: dynamo with the
//! aten op in `pkg.torch.onnx.class_hierarchy` (`aten.add.Tensor`), the legacy exporter as an op
//! node directly under the module's path (`/layer1/layer1.0/Add`).
//!
//! The calls of one op in one module pair with that module's own nodes of that op *by position*,
//! when both sides count the same number. When they do not, an exporter folded, fused or
//! decomposed some, and positions no longer line up; the calls are then split the way
//! exporters treat them:
//!
//! - calls that no model input's values reach (relative positions, rotary tables: computed from
//!   parameters, constants and shapes alone) pair by position with the nodes the graph inputs
//!   do not reach, or, where the export has none, are reported folded into constants;
//! - the other calls pair by position with the nodes the graph inputs reach (the legacy
//!   exporter writes a shape computation's `Mul` in an attention's scope), leaving out, where
//!   that makes the counts agree, calls that returned their input's values unchanged (`x *
//!   1.0`, which dynamo drops: compared against the value they read);
//! - calls still not paired are matched by their values with those nodes in the flow (see
//!   [`crate::CallGroup`]), each the first in order holding its numbers, or left unmapped
//!   with the two counts: pairing the wrong values would report drift that is not there.

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};

use super::{CallGroup, FOLDED, trace_order};
use crate::scope::{ScopeResolver, parse_python_str_list};
use crate::{GraphIndex, GraphProto, LayerCall, LayerMapping, NodeExt, NodeProto};

/// What [`map_functional`] found: a mapping for each functional call it could settle, and the
/// calls left to pair by value.
pub(crate) struct Functional {
    pub(crate) mappings: HashMap<usize, LayerMapping>,
    pub(crate) by_values: Vec<CallGroup>,
}

/// Maps each functional call among `layers` (those with an `op`); the others are absent.
pub(crate) fn map_functional(
    graph: &GraphProto,
    index: &GraphIndex,
    layers: &[LayerCall],
) -> Functional {
    let mut calls: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (i, layer) in layers.iter().enumerate() {
        if let Some(op) = &layer.op {
            calls.entry((&layer.module, op)).or_default().push(i);
        }
    }
    let mut mapped = Functional {
        mappings: HashMap::new(),
        by_values: Vec::new(),
    };
    if calls.is_empty() {
        return mapped;
    }
    let found = own_values(graph, layers, &calls);
    // Needed only where counts differ: one pass over the graph then.
    let inputs_reach = OnceCell::new();
    for ((module, op), rows) in calls {
        let values = found
            .get(&(module.to_string(), op.to_string()))
            .map_or(&[][..], Vec::as_slice);
        let owner = if module.is_empty() {
            "the model's top level".to_string()
        } else {
            format!("`{module}`")
        };
        let group = Group {
            index,
            layers,
            op,
            owner: &owner,
        };
        let mappings = &mut mapped.mappings;
        if values.len() == rows.len() {
            group.by_position(&rows, values, mappings);
            continue;
        }
        let counts = format!(
            "PyTorch made {} `{op}` call(s) in {owner} and the export has {} `{op}` node(s) of its own there (an exporter folds, fuses or decomposes some), so they are not paired by position",
            rows.len(),
            values.len()
        );
        let (constant, data): (Vec<usize>, Vec<usize>) =
            rows.iter().partition(|&&i| layers[i].constant);
        let inputs_reach = inputs_reach.get_or_init(|| reached_by(graph, index.graph_inputs()));
        let (reached, unreached): (Vec<String>, Vec<String>) = values
            .iter()
            .cloned()
            .partition(|v| inputs_reach.contains(v));

        if constant.len() == unreached.len() {
            group.by_position(&constant, &unreached, mappings);
        } else {
            let why = if unreached.is_empty() {
                format!(
                    "{FOLDED}, and the export has no `{op}` node in {owner} that the graph inputs do not reach (exporters fold such values into constants)"
                )
            } else {
                counts.clone()
            };
            for &i in &constant {
                mappings.insert(i, unmapped(why.clone()));
            }
        }

        if data.len() == reached.len() {
            group.by_position(&data, &reached, mappings);
            continue;
        }
        let (unchanged, kept): (Vec<usize>, Vec<usize>) =
            data.iter().partition(|&&i| layers[i].identity);
        for &i in &unchanged {
            // Resolved as an identity: compared against the value it read.
            mappings.insert(i, unmapped(String::new()));
        }
        if kept.len() == reached.len() {
            group.by_position(&kept, &reached, mappings);
            continue;
        }
        for &i in &kept {
            mappings.insert(i, unmapped(counts.clone()));
        }
        if !kept.is_empty() && !reached.is_empty() {
            mapped.by_values.push(CallGroup {
                layers: kept,
                values: reached,
            });
        }
    }
    mapped
}

/// Ops whose output depends on their input's shape only, never its numbers.
const SHAPE_ONLY: [&str; 4] = ["Shape", "Size", "ConstantOfShape", "EyeLike"];

/// The values the graph inputs' numbers reach (through any chain of nodes but those that read
/// only a shape), in one pass in graph order: not what is computed from initializers,
/// constants and shapes alone, the values an exporter may fold into constants. A node with a
/// subgraph (`If`, `Loop`) may read any outer value, so its outputs count as reached.
fn reached_by(graph: &GraphProto, inputs: &[String]) -> HashSet<String> {
    let mut reached: HashSet<String> = inputs.iter().cloned().collect();
    for node in &graph.node {
        let subgraph = node.subgraphs().next().is_some();
        let reads =
            !SHAPE_ONLY.contains(&node.op_type()) && node.input.iter().any(|i| reached.contains(i));
        if subgraph || reads {
            reached.extend(node.output.iter().filter(|o| !o.is_empty()).cloned());
        }
    }
    reached
}

/// The values of each module's own nodes of each op that some call in `calls` names, in the
/// order PyTorch made the calls: a dynamo export's by its calls' trace order (`cat`, `cat_1`,
/// … are numbered as the trace made them), which a tool that sorts the graph again (ONNX
/// Runtime's quantizers) does not keep; a legacy export's in graph order.
fn own_values(
    graph: &GraphProto,
    layers: &[LayerCall],
    calls: &HashMap<(&str, &str), Vec<usize>>,
) -> HashMap<(String, String), Vec<String>> {
    let mut found = own_values_in_graph_order(graph, layers, calls);
    for (values, order) in found.values_mut() {
        if let Some(order) = order.iter().copied().collect::<Option<Vec<u64>>>() {
            let mut paired: Vec<(u64, String)> = order.into_iter().zip(values.drain(..)).collect();
            paired.sort_by_key(|(k, _)| *k); // stable: a tie keeps the graph's order
            values.extend(paired.into_iter().map(|(_, v)| v));
        }
    }
    found
        .into_iter()
        .map(|(k, (values, _))| (k, values))
        .collect()
}

/// [`own_values`] in graph order, each value with its call's [`trace_order`] (`None` for a
/// node of no dynamo call).
#[allow(clippy::type_complexity)]
fn own_values_in_graph_order(
    graph: &GraphProto,
    layers: &[LayerCall],
    calls: &HashMap<(&str, &str), Vec<usize>>,
) -> HashMap<(String, String), (Vec<String>, Vec<Option<u64>>)> {
    // Every module a node may belong to: leaves (so their nodes are not the owner's own) and
    // the owners of functional calls.
    let modules: Vec<&str> = layers.iter().map(|l| l.module.as_str()).collect();
    let resolver = ScopeResolver::new(&modules);
    let mut found: HashMap<(String, String), (Vec<String>, Vec<Option<u64>>)> = HashMap::new();
    // Where each dynamo call's value sits in its list.
    let mut position: HashMap<String, usize> = HashMap::new();
    for node in &graph.node {
        let owner = resolver
            .module_of(node)
            .map(|(m, _)| m)
            .or_else(|| at_legacy_root(node));
        let (Some(owner), Some((op, call))) = (owner, torch_op(node)) else {
            continue;
        };
        if !calls.contains_key(&(owner.as_str(), op.as_str())) {
            continue;
        }
        let Some(value) = node.output.first().filter(|o| !o.is_empty()) else {
            continue;
        };
        let (values, order) = found.entry((owner, op)).or_default();
        // The nodes of one dynamo call (an aten op lowered to several nodes) are one value:
        // the one named after the call, else the last node's.
        match call {
            Some(call) if position.contains_key(&call) => {
                let at = position[&call];
                if *value == call || values[at] != call {
                    values[at].clone_from(value);
                }
            }
            call => {
                order.push(call.as_deref().map(trace_order));
                if let Some(call) = call {
                    position.insert(call, values.len());
                }
                values.push(value.clone());
            }
        }
    }
    found
}

/// The calls of one op in one module.
struct Group<'a> {
    index: &'a GraphIndex,
    layers: &'a [LayerCall],
    op: &'a str,
    owner: &'a str,
}

impl Group<'_> {
    /// Pairs `rows` with `values` (as many) in order.
    fn by_position(
        &self,
        rows: &[usize],
        values: &[String],
        into: &mut HashMap<usize, LayerMapping>,
    ) {
        let (op, owner) = (self.op, self.owner);
        for (k, (&i, value)) in rows.iter().zip(values).enumerate() {
            let layer = &self.layers[i];
            into.insert(
                i,
                if !layer.fits(self.index, value) {
                    unmapped(format!(
                        "mapping problem: `{value}`, the export's `{op}` #{} in {owner}, cannot hold this call's {} {:?} output",
                        k + 1,
                        layer.dtype.name(),
                        layer.shape
                    ))
                } else {
                    let node = self.index.producer(value).expect("a node's output");
                    LayerMapping::Mapped {
                        value: value.clone(),
                        node: node.name.clone(),
                        op_type: node.op_type.clone(),
                        note: None,
                    }
                },
            );
        }
    }
}

/// The PyTorch op a node computes, as captured calls name it (`add`, `matmul`), and for dynamo
/// the call it belongs to (`add_7`).
fn torch_op(node: &NodeProto) -> Option<(String, Option<String>)> {
    if let Some(classes) = node.metadata("pkg.torch.onnx.class_hierarchy") {
        // `aten.add.Tensor` → `add`; `aten._softmax.default` → `softmax`.
        let aten = parse_python_str_list(classes).pop()?;
        let op = aten.strip_prefix("aten.")?.split('.').next()?;
        let call = node
            .metadata("pkg.torch.onnx.name_scopes")
            .and_then(|s| parse_python_str_list(s).pop());
        let op = op.trim_matches('_');
        // The normalizations reach ONNX as their native forms
        // (`aten._native_batch_norm_legit_no_training`, `aten.native_layer_norm`).
        let op = ["batch_norm", "group_norm", "layer_norm"]
            .into_iter()
            .find(|norm| op.contains(norm))
            .unwrap_or(op);
        return Some((op.to_string(), call));
    }
    let op = match node.op_type() {
        "Add" => "add",
        "Sub" => "sub",
        "Mul" => "mul",
        "Div" => "div",
        "MatMul" => "matmul",
        "Softmax" => "softmax",
        "Relu" => "relu",
        "Gelu" => "gelu",
        "Sigmoid" => "sigmoid",
        "Tanh" => "tanh",
        "Concat" => "cat",
        "LayerNormalization" => "layer_norm",
        "BatchNormalization" => "batch_norm",
        _ => return None,
    };
    Some((op.to_string(), None))
}

/// `""` (the model itself) for a legacy node named `/Op`: an op of the top-level `forward`.
fn at_legacy_root(node: &NodeProto) -> Option<String> {
    let op = node.name().strip_prefix('/')?;
    (node.metadata("pkg.torch.onnx.name_scopes").is_none() && !op.contains('/')).then(String::new)
}

fn unmapped(reason: String) -> LayerMapping {
    LayerMapping::Unmapped { reason }
}
