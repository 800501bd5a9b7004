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
//! and only when both sides count the same number: an exporter that folded, fused or decomposed
//! one of them leaves positions that no longer line up, and pairing then would compare the wrong
//! values. Those calls are reported unmapped, with the two counts.

use std::collections::HashMap;

use crate::scope::{ScopeResolver, parse_python_str_list};
use crate::{GraphIndex, GraphProto, LayerCall, LayerMapping, NodeExt, NodeProto};

/// Maps each functional call among `layers` (those with an `op`); the others are absent.
pub(crate) fn map_functional(
    graph: &GraphProto,
    index: &GraphIndex,
    layers: &[LayerCall],
) -> HashMap<usize, LayerMapping> {
    let mut calls: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (i, layer) in layers.iter().enumerate() {
        if let Some(op) = &layer.op {
            calls.entry((&layer.module, op)).or_default().push(i);
        }
    }
    if calls.is_empty() {
        return HashMap::new();
    }
    // Every module a node may belong to: leaves (so their nodes are not the owner's own) and
    // the owners of functional calls.
    let modules: Vec<&str> = layers.iter().map(|l| l.module.as_str()).collect();
    let resolver = ScopeResolver::new(&modules);
    let mut found: HashMap<(String, String), Vec<String>> = HashMap::new();
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
        let values = found.entry((owner, op)).or_default();
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
                if let Some(call) = call {
                    position.insert(call, values.len());
                }
                values.push(value.clone());
            }
        }
    }
    let mut mappings = HashMap::new();
    for ((module, op), rows) in calls {
        let values = found
            .get(&(module.to_string(), op.to_string()))
            .map_or(&[][..], Vec::as_slice);
        let owner = if module.is_empty() {
            "the model's top level".to_string()
        } else {
            format!("`{module}`")
        };
        for (k, &i) in rows.iter().enumerate() {
            let layer = &layers[i];
            mappings.insert(
                i,
                if values.len() != rows.len() {
                    unmapped(format!(
                        "PyTorch made {} `{op}` call(s) in {owner} and the export has {} `{op}` node(s) of its own there (an exporter folds, fuses or decomposes some), so they are not paired by position",
                        rows.len(),
                        values.len()
                    ))
                } else if !layer.fits(index, &values[k]) {
                    unmapped(format!(
                        "mapping problem: `{}`, the export's `{op}` #{} in {owner}, cannot hold this call's {} {:?} output",
                        values[k],
                        k + 1,
                        layer.dtype.name(),
                        layer.shape
                    ))
                } else {
                    let node = index.producer(&values[k]).expect("a node's output");
                    LayerMapping::Mapped {
                        value: values[k].clone(),
                        node: node.name.clone(),
                        op_type: node.op_type.clone(),
                        note: None,
                    }
                },
            );
        }
    }
    mappings
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
