//! Layers whose node a rewrite left without a scope: a quantizer that replaces a MatMul by a
//! MatMulNBits (ONNX Runtime's, as shipped int4 decoders are written) keeps the value names but
//! not the node's metadata, and a quantized value is too far from the float one to be paired
//! by value. Such a layer is paired by its input: the unscoped node, holding a stored weight,
//! that reads the value its feeder is paired with.

use super::*;

/// Leaf-module calls still unpaired whose first input is a paired layer's value, each paired
/// with an unscoped node (in `unscoped`) that reads that value, reads a stored weight and
/// writes a value that can hold the call's output; the readers of one value are taken in graph
/// order by its calls in execution order (a quantizer keeps the order: q, k, v).
pub(super) fn paired_by_input(
    index: &GraphIndex,
    layers: &[LayerCall],
    unscoped: &HashSet<usize>,
    mut mappings: Vec<LayerMapping>,
) -> Vec<LayerMapping> {
    let mut taken: HashSet<String> = mappings
        .iter()
        .filter_map(|m| match m {
            LayerMapping::Mapped { value, .. } => Some(value.clone()),
            LayerMapping::Unmapped { .. } => None,
        })
        .collect();
    for (i, layer) in layers.iter().enumerate() {
        let leaf = layer.op.is_none() && !layer.identity && !layer.constant;
        if !leaf || !layer.feeds_output || matches!(mappings[i], LayerMapping::Mapped { .. }) {
            continue;
        }
        let Some(p) = layer.input_from.filter(|&p| p < i) else {
            continue;
        };
        let LayerMapping::Mapped { value: fed, .. } = &mappings[p] else {
            continue;
        };
        let mut readers: Vec<&NodeInfo> = index
            .consumers(fed)
            .filter(|n| unscoped.contains(&n.index))
            .filter(|n| n.inputs.iter().any(|i| index.is_initializer(i)))
            .collect();
        readers.sort_by_key(|n| n.index);
        let found = readers.iter().find_map(|n| {
            let out = n.outputs.first().filter(|o| !o.is_empty())?;
            (!taken.contains(out) && layer.fits(index, out)).then(|| (out.clone(), *n))
        });
        if let Some((value, n)) = found {
            taken.insert(value.clone());
            mappings[i] = LayerMapping::Mapped {
                value,
                node: n.name.clone(),
                op_type: n.op_type.clone(),
                note: Some(format!(
                    "paired by its input: the {} node `{}` reads `{}`'s value and a stored weight, and carries no scope (a rewrite, such as a quantizer's, dropped it)",
                    n.op_type, n.name, layers[p].name
                )),
            };
        }
    }
    mappings
}
