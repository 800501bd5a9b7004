//! Layers whose node a rewrite left without a scope: a quantizer that replaces a MatMul by a
//! MatMulNBits (ONNX Runtime's, as shipped int4 decoders are written) keeps the value names but
//! not the node's metadata, and a quantized value is too far from the float one to be paired
//! by value. Such a layer is paired by its input: the unscoped node, holding a stored weight,
//! that reads the value its feeder is paired with.

use super::*;

/// Ops that only lay a value out again (the reshape between an attention's heads and its
/// output projection): a reader past them reads the same values.
const LAYOUT: [&str; 7] = [
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Cast",
    "Identity",
];

/// Whether a blockwise-quantized product can make the call's output: its `N` columns are the
/// output's last dimension (a MatMulNBits says how many; other nodes are not checked).
fn columns_fit(graph: &GraphProto, node: &NodeInfo, layer: &LayerCall) -> bool {
    node.op_type != "MatMulNBits"
        || graph.node[node.index].attr_i64("N").map_or(true, |n| {
            usize::try_from(n).ok() == layer.shape.last().copied()
        })
}

/// The nodes that read `value`, directly or past up to four layout ops.
fn reached<'a>(index: &'a GraphIndex, value: &str) -> Vec<&'a NodeInfo> {
    let (mut found, mut frontier) = (Vec::new(), vec![value.to_string()]);
    for _ in 0..5 {
        let mut next = Vec::new();
        for v in &frontier {
            for n in index.consumers(v) {
                if LAYOUT.contains(&n.op_type.as_str()) {
                    next.extend(n.outputs.iter().filter(|o| !o.is_empty()).cloned());
                } else {
                    found.push(n);
                }
            }
        }
        frontier = next;
    }
    found
}

/// Leaf-module calls still unpaired whose first input is a paired layer's value, each paired
/// with an unscoped node (in `unscoped`) that reads that value (past layout ops at most), reads
/// a stored weight and
/// writes a value that can hold the call's output; the readers of one value are taken in graph
/// order by its calls in execution order (a quantizer keeps the order: q, k, v).
pub(super) fn paired_by_input(
    graph: &GraphProto,
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
        let mut readers: Vec<&NodeInfo> = reached(index, fed)
            .into_iter()
            .filter(|n| unscoped.contains(&n.index))
            .filter(|n| n.inputs.iter().any(|i| index.is_initializer(i)))
            .collect();
        readers.sort_by_key(|n| n.index);
        let found = readers.iter().find_map(|n| {
            let out = n.outputs.first().filter(|o| !o.is_empty())?;
            let fits = layer.fits(index, out) && columns_fit(graph, n, layer);
            (!taken.contains(out) && fits).then(|| (out.clone(), *n))
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

/// What `paired_by_input` left: a leaf call whose input is no paired layer's value (a copy
/// came between, `.contiguous()` after an attention's heads) paired by its place, where it is
/// the one unpaired call between two paired layers and one unscoped node holding a stored
/// weight lies between their nodes.
pub(super) fn paired_by_place(
    graph: &GraphProto,
    index: &GraphIndex,
    layers: &[LayerCall],
    unscoped: &HashSet<usize>,
    mut mappings: Vec<LayerMapping>,
) -> Vec<LayerMapping> {
    let node_of = |m: &LayerMapping| match m {
        LayerMapping::Mapped { value, .. } => index.producer(value).map(|n| n.index),
        LayerMapping::Unmapped { .. } => None,
    };
    let taken: HashSet<usize> = mappings.iter().filter_map(node_of).collect();
    let wanted = |i: usize, mappings: &[LayerMapping]| {
        let l = &layers[i];
        l.op.is_none()
            && !l.identity
            && !l.constant
            && l.feeds_output
            && matches!(mappings[i], LayerMapping::Unmapped { .. })
    };
    for i in 0..layers.len() {
        if !wanted(i, &mappings) {
            continue;
        }
        let before = (0..i).rev().find_map(|j| Some((j, node_of(&mappings[j])?)));
        let after = (i + 1..layers.len()).find_map(|j| Some((j, node_of(&mappings[j])?)));
        let (Some((p, from)), Some((q, to))) = (before, after) else {
            continue;
        };
        if (p + 1..q).filter(|&j| wanted(j, &mappings)).count() != 1 || from >= to {
            continue;
        }
        let candidates: Vec<&NodeInfo> = index.nodes()[from + 1..to]
            .iter()
            .filter(|n| unscoped.contains(&n.index) && !taken.contains(&n.index))
            .filter(|n| n.inputs.iter().any(|i| index.is_initializer(i)))
            .filter(|n| n.outputs.first().is_some_and(|o| layers[i].fits(index, o)))
            .filter(|n| columns_fit(graph, n, &layers[i]))
            .collect();
        let [n] = candidates[..] else {
            continue;
        };
        mappings[i] = LayerMapping::Mapped {
            value: n.outputs[0].clone(),
            node: n.name.clone(),
            op_type: n.op_type.clone(),
            note: Some(format!(
                "paired by its place: the one {} node between `{}` and `{}` that reads a stored weight and carries no scope (a rewrite, such as a quantizer's, dropped it)",
                n.op_type, layers[p].name, layers[q].name
            )),
        };
    }
    mappings
}
