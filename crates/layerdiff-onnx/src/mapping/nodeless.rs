//! Calls whose scope holds no node of their own: folded into a neighbour, fused, or computed
//! from constants only; what each such call maps to, and why.

use super::{
    FOLDED, GraphIndex, GraphProto, HashMap, LayerCall, LayerMapping, NO_SCOPE, NodeExt, UNUSED,
};
/// The rules for layers without nodes of their own (see the module docs).
pub(super) fn resolve_nodeless(
    graph: &GraphProto,
    index: &GraphIndex,
    boundary: &HashMap<String, Vec<(String, usize)>>,
    layers: &[LayerCall],
    mut mappings: Vec<LayerMapping>,
) -> Vec<LayerMapping> {
    // A file no node of which carries dynamo's scope metadata (the legacy exporter's, tf2onnx's):
    // a quantizer's nodes carry none in a dynamo export either, so the others tell.
    let unscoped = !graph.node.iter().any(scoped);
    // Layers without nodes of their own, in execution order so chains resolve front to back.
    for (i, layer) in layers.iter().enumerate() {
        // A functional call's mapping says all there is (see crate::functional), but for a
        // batch norm the legacy exporter folded into the Conv before it, and a call that
        // returned its input unchanged with no node of its own.
        let settled = layer.op.as_deref().is_some_and(|op| {
            op != "batch_norm"
                && !(layer.identity
                    && matches!(&mappings[i], LayerMapping::Unmapped { reason } if reason.is_empty()))
        });
        if settled || matches!(mappings[i], LayerMapping::Mapped { .. }) {
            continue;
        }
        let feeder = layer.input_from.filter(|&p| p < i);
        let consumer = layers
            .iter()
            .enumerate()
            .skip(i + 1)
            .find(|(_, l)| l.input_from == Some(i))
            .map(|(j, _)| j);
        // What an identity read may be its feeder's value reshaped by code between them
        // (timm's PatchEmbed flattens and transposes the Conv's output before its Identity
        // norm): then the feeder's value is not its value.
        let reshaped = feeder.filter(|&p| layers[p].shape != layer.shape);
        mappings[i] = if let Some(p) = reshaped.filter(|_| layer.identity) {
            unmapped(&format!(
                "identity at inference, but it read the value of `{}` reshaped between them ({:?} → {:?}), which has no node of its own here",
                layers[p].name, layers[p].shape, layer.shape
            ))
        } else if layer.identity {
            identity(layer, feeder.map(|p| (&layers[p], &mappings[p])))
        } else if !layer.feeds_output {
            // Before the fusion rules: what no output needs is in no output's node.
            unmapped(UNUSED)
        } else if let Some(outputs) = boundary.get(&layer.module) {
            let fitting = outputs.iter().filter(|(v, _)| layer.fits(index, v)).count();
            unmapped(&format!(
                "call {} of `{}`, but the graph holds {} output(s) for that module, {fitting} of them a {} value of {} elements",
                layer.call_index + 1,
                layer.module,
                outputs.len(),
                if layer.dtype.is_float() {
                    "float"
                } else {
                    "non-float"
                },
                layer.shape.iter().product::<usize>(),
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
        } else if let Some((p, (product, product_op))) = feeder
            .filter(|&p| layers[p].shape == layer.shape)
            .and_then(|p| Some((p, folds_forward(graph, index, unscoped, &mappings[p])?)))
        {
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
                "fused with `{}` at export: the {product_op} node `{product}` computes both, so no ONNX value holds this layer's own output",
                layer.name
            ));
            LayerMapping::Mapped {
                value,
                node,
                op_type,
                note: Some(format!("`{}` is fused into this node", layers[p].name)),
            }
        } else if layer.constant {
            unmapped(&format!(
                "{FOLDED}, and no node of the export computes it (exporters fold such values into constants)"
            ))
        } else {
            match &mappings[i] {
                LayerMapping::Unmapped { reason } if !reason.is_empty() => mappings[i].clone(),
                _ => unmapped(NO_SCOPE),
            }
        };
    }
    mappings
}

/// What a call that is the identity at inference, with no node of its own, maps to: the value
/// of the call it read (`feeder`, with its mapping), or why none.
fn identity(layer: &LayerCall, feeder: Option<(&LayerCall, &LayerMapping)>) -> LayerMapping {
    match feeder {
        Some((
            fed_by,
            LayerMapping::Mapped {
                value,
                node,
                op_type,
                ..
            },
        )) => LayerMapping::Mapped {
            value: value.clone(),
            node: node.clone(),
            op_type: op_type.clone(),
            note: Some(if layer.op.is_some() {
                format!(
                    "returned its input's values unchanged and has no node of its own in the export: compared against the value of `{}`",
                    fed_by.name
                )
            } else {
                format!(
                    "identity at inference: compared against the value of `{}`",
                    fed_by.name
                )
            }),
        },
        _ if layer.op.is_some() => unmapped(
            "returned its input's values unchanged and has no node of its own in the export, and the value it read has none either",
        ),
        _ => unmapped("identity at inference and removed from the graph"),
    }
}

/// Whether a node records any module scope (dynamo metadata, or a legacy `/scope/Op` name).
pub(super) fn has_scope(node: &crate::NodeProto) -> bool {
    node.metadata("pkg.torch.onnx.name_scopes").is_some()
        || node
            .name()
            .strip_prefix('/')
            .is_some_and(|p| p.contains('/'))
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

/// The product node (its name and op) a mapped layer's value comes from, where it can hold a
/// following layer folded into it: a node named by the legacy exporter or tf2onnx (no dynamo
/// metadata) that is not already shared, and computes a product an affine layer (a BatchNorm at
/// inference) can be folded into; never a Relu. In such a file (`unscoped`), seen through what
/// a quantizer put after the product. `None` where it cannot.
fn folds_forward(
    graph: &GraphProto,
    index: &GraphIndex,
    unscoped: bool,
    mapping: &LayerMapping,
) -> Option<(String, String)> {
    let LayerMapping::Mapped {
        node, note: None, ..
    } = mapping
    else {
        return None;
    };
    let found = graph.node.iter().find(|n| n.display_name() == *node)?;
    let found = match unscoped {
        true => quantized_product(graph, index, found).unwrap_or(found),
        false => found,
    };
    (!scoped(found)
        && matches!(
            found.op_type(),
            "Conv" | "ConvTranspose" | "Gemm" | "MatMul" | "ConvInteger" | "MatMulInteger"
        ))
    .then(|| (found.display_name(), found.op_type().to_string()))
}

fn scoped(node: &crate::NodeProto) -> bool {
    node.metadata("pkg.torch.onnx.name_scopes").is_some()
}

/// The product behind `node` in a file quantized after export, where `node` ends one: the
/// product's value quantized and dequantized (QDQ), or an integer product's cast back, scaled
/// and biased (ONNX Runtime's dynamic quantization: ConvInteger → Cast → Mul → Add). The
/// product folded what followed it all the same.
fn quantized_product<'g>(
    graph: &'g GraphProto,
    index: &GraphIndex,
    node: &'g crate::NodeProto,
) -> Option<&'g crate::NodeProto> {
    let producer = |value: &str| index.producer(value).map(|p| &graph.node[p.index]);
    // the data input: the one another node produces (a bias or a scale is an initializer)
    let fed = |n: &crate::NodeProto| n.input.iter().find_map(|i| producer(i));
    match node.op_type() {
        "DequantizeLinear" => {
            let quantize = producer(node.input.first()?)?;
            (quantize.op_type() == "QuantizeLinear").then_some(())?;
            producer(quantize.input.first()?)
        }
        "Add" | "Mul" => {
            let mut at = node;
            for _ in 0..3 {
                at = fed(at)?;
                if matches!(at.op_type(), "ConvInteger" | "MatMulInteger") {
                    return Some(at);
                }
                matches!(at.op_type(), "Mul" | "Cast").then_some(())?;
            }
            None
        }
        _ => None,
    }
}

pub(super) fn unmapped(reason: &str) -> LayerMapping {
    LayerMapping::Unmapped {
        reason: reason.to_string(),
    }
}
