//! Mapping PyTorch module calls onto ONNX values.
//!
//! A layer is one call of a leaf module. Its ONNX counterpart is a *boundary output* of the
//! module's scope: a value produced by one of the module's nodes and read outside it (or a graph
//! output). The k-th call of a module maps to its k-th boundary output in graph order.
//!
//! Layers with no node of their own are explained: identity modules at inference (Dropout in
//! eval) are compared against the value of the layer that fed them; a layer folded into its
//! neighbour at export (Conv + BatchNorm) leaves one value that holds the *later* layer's output,
//! so the later layer maps to it and the earlier one is listed as fused.

use std::collections::{HashMap, HashSet};

use crate::scope::ScopeResolver;
use crate::{GraphIndex, GraphProto, NodeExt};

/// One call of a leaf module, as captured on the PyTorch side.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerCall {
    /// Display name: the module path, with `#2`, `#3`… for repeated calls.
    pub name: String,
    /// Qualified module path, e.g. `layer1.0.relu`.
    pub module: String,
    /// 0 for the first call of this module, 1 for the second…
    pub call_index: usize,
    /// Whether the call returned its input unchanged (e.g. Dropout in eval mode).
    pub identity: bool,
    /// The earlier layer whose output this call read as its first input, if any.
    pub input_from: Option<usize>,
}

/// Where a layer's value lives in the ONNX graph, or why it has none.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerMapping {
    /// The layer's output is the ONNX value `value`, produced by `node`.
    Mapped {
        /// The ONNX value name.
        value: String,
        /// Name of the node producing it.
        node: String,
        /// Op type of that node.
        op_type: String,
        /// Extra context, e.g. that the value also holds a fused neighbour's work.
        note: Option<String>,
    },
    /// No ONNX value holds this layer's output.
    Unmapped {
        /// Why, in words.
        reason: String,
    },
}

/// Maps each layer call to an ONNX value of `graph` (see the module docs for the rules).
pub fn map_layers(graph: &GraphProto, layers: &[LayerCall]) -> Vec<LayerMapping> {
    let index = GraphIndex::new(graph);
    let modules: Vec<&str> = layers.iter().map(|l| l.module.as_str()).collect();
    let resolver = ScopeResolver::new(&modules);
    let node_module: Vec<Option<String>> = graph
        .node
        .iter()
        .map(|n| resolver.module_of(n).map(|(m, _)| m))
        .collect();

    let mut boundary: HashMap<&str, Vec<(String, usize)>> = HashMap::new();
    let graph_outputs: HashSet<&str> = index.graph_outputs().iter().map(String::as_str).collect();
    for (i, node) in index.nodes().iter().enumerate() {
        let Some(module) = node_module[i].as_deref() else {
            continue;
        };
        for out in node.outputs.iter().filter(|o| !o.is_empty()) {
            let read_outside = index
                .consumers(out)
                .any(|c| node_module[c.index].as_deref() != Some(module));
            if read_outside || graph_outputs.contains(out.as_str()) {
                boundary.entry(module).or_default().push((out.clone(), i));
            }
        }
    }

    let mut mappings: Vec<LayerMapping> = layers
        .iter()
        .map(|layer| {
            match boundary
                .get(layer.module.as_str())
                .and_then(|b| b.get(layer.call_index))
            {
                Some((value, node)) => {
                    let n = &index.nodes()[*node];
                    LayerMapping::Mapped {
                        value: value.clone(),
                        node: n.name.clone(),
                        op_type: n.op_type.clone(),
                        note: None,
                    }
                }
                None => LayerMapping::Unmapped {
                    reason: String::new(),
                },
            }
        })
        .collect();

    // Layers without nodes of their own, in execution order so chains resolve front to back.
    for (i, layer) in layers.iter().enumerate() {
        if matches!(mappings[i], LayerMapping::Mapped { .. }) {
            continue;
        }
        let feeder = layer.input_from.filter(|&p| p < i);
        let consumer = layers
            .iter()
            .enumerate()
            .skip(i + 1)
            .find(|(_, l)| l.input_from == Some(i))
            .map(|(j, _)| j);
        mappings[i] = if layer.identity {
            match feeder.map(|p| (p, mappings[p].clone())) {
                Some((
                    p,
                    LayerMapping::Mapped {
                        value,
                        node,
                        op_type,
                        ..
                    },
                )) => LayerMapping::Mapped {
                    value,
                    node,
                    op_type,
                    note: Some(format!(
                        "identity at inference: compared against the value of `{}`",
                        layers[p].name
                    )),
                },
                _ => unmapped("identity at inference and removed from the graph"),
            }
        } else if let Some(outputs) = boundary.get(layer.module.as_str()) {
            unmapped(&format!(
                "call {} of `{}`, but the graph holds only {} output(s) for that module",
                layer.call_index + 1,
                layer.module,
                outputs.len()
            ))
        } else if let Some((j, rule)) =
            consumer.and_then(|j| fusion_rule(graph, &mappings[j]).map(|r| (j, r)))
        {
            // Rewritten into the consumer's node (dynamo's FuseBatchNormIntoConv keeps the BN's scope).
            let LayerMapping::Mapped { node, op_type, .. } = &mappings[j] else {
                unreachable!()
            };
            unmapped(&format!(
                "fused into `{}` at export ({rule}): the {op_type} node `{node}` computes both, so no ONNX value holds this layer's own output",
                layers[j].name
            ))
        } else if let Some(p) = feeder.filter(|&p| folds_forward(graph, &mappings[p])) {
            // Folded into the node of the layer that fed it (the legacy exporter folds BatchNorm
            // into the preceding Conv): that node's value now holds this layer's output.
            let LayerMapping::Mapped {
                value,
                node,
                op_type,
                ..
            } = mappings[p].clone()
            else {
                unreachable!()
            };
            mappings[p] = unmapped(&format!(
                "fused with `{}` at export: the {op_type} node `{node}` computes both, so no ONNX value holds this layer's own output",
                layer.name
            ));
            LayerMapping::Mapped {
                value,
                node,
                op_type,
                note: Some(format!("`{}` is fused into this node", layers[p].name)),
            }
        } else {
            unmapped("no ONNX node carries this module's scope")
        };
    }
    mappings
}

/// The `Fuse…` rewrite rule recorded on a mapped layer's node, if the exporter fused into it.
fn fusion_rule(graph: &GraphProto, mapping: &LayerMapping) -> Option<String> {
    let LayerMapping::Mapped { node, .. } = mapping else {
        return None;
    };
    let node = graph.node.iter().find(|n| n.display_name() == *node)?;
    let rules = node.metadata("pkg.onnxscript.rewriter.rule_name")?;
    rules
        .split(", ")
        .find(|r| r.starts_with("Fuse"))
        .map(str::to_string)
}

/// Whether a mapped layer's node can hold a following layer folded into it: a node named by the
/// legacy exporter (no dynamo metadata) that is not already shared.
fn folds_forward(graph: &GraphProto, mapping: &LayerMapping) -> bool {
    let LayerMapping::Mapped {
        node, note: None, ..
    } = mapping
    else {
        return false;
    };
    graph
        .node
        .iter()
        .find(|n| n.display_name() == *node)
        .is_some_and(|n| n.metadata("pkg.torch.onnx.name_scopes").is_none())
}

fn unmapped(reason: &str) -> LayerMapping {
    LayerMapping::Unmapped {
        reason: reason.to_string(),
    }
}
