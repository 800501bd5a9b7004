//! Layers whose node a rewrite left without a scope: a quantizer that replaces a MatMul by a
//! MatMulNBits (ONNX Runtime's, as shipped int4 decoders are written) keeps the value names but
//! not the node's metadata, and a quantized value is too far from the float one to be paired
//! by value. Such a layer is paired by its input: the unscoped node, holding a stored weight,
//! that reads the value its feeder is paired with; or, where a copy came between, by its place.

use super::{
    GraphIndex, GraphProto, HashSet, LayerCall, LayerMapping, NO_SCOPE, NodeExt, NodeInfo,
    ValueRequest,
};
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

/// One file's unscoped nodes and the calls left to pair with them.
pub(super) struct Rewritten<'a> {
    graph: &'a GraphProto,
    index: &'a GraphIndex,
    layers: &'a [LayerCall],
    /// The nodes that carry no scope.
    unscoped: HashSet<usize>,
    /// Stored weights: initializers of two dimensions or more (not a scale, a zero point).
    weights: HashSet<&'a str>,
}

/// Nodes that carry a value onto or off a quantized grid: never a module's own computation.
const GRID: [&str; 3] = [
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
];

impl<'a> Rewritten<'a> {
    /// The unscoped nodes of a file whose other nodes carry scopes (none in a wholly unscoped
    /// file: it is paired by value, and what values do not pair is left unpaired).
    pub fn new(
        graph: &'a GraphProto,
        index: &'a GraphIndex,
        layers: &'a [LayerCall],
        request: &ValueRequest,
    ) -> Self {
        let unscoped = match request.unscoped_file {
            true => HashSet::new(),
            false => request.candidates.iter().map(|(_, n)| *n).collect(),
        };
        let weights = graph
            .initializer
            .iter()
            .filter(|t| t.dims.len() >= 2)
            .filter_map(|t| t.name.as_deref())
            .collect();
        Self {
            graph,
            index,
            layers,
            unscoped,
            weights,
        }
    }

    /// Both passes: by input, then by place.
    pub fn pair(&self, mappings: Vec<LayerMapping>) -> Vec<LayerMapping> {
        self.by_place(self.by_input(mappings))
    }

    /// Whether call `i` is a leaf module's whose output the model needs, unpaired because no
    /// node carries its scope (not fused, folded or an identity: those are settled).
    fn wanted(&self, i: usize, mappings: &[LayerMapping]) -> bool {
        let l = &self.layers[i];
        let unpaired = matches!(
            &mappings[i],
            LayerMapping::Unmapped { reason } if reason.starts_with(NO_SCOPE)
        );
        l.op.is_none() && !l.identity && !l.constant && l.feeds_output && unpaired
    }

    /// Whether `node` may be call `i`'s: unscoped, computing (not quantizing) with a stored
    /// weight, writing a value that can hold the call's output (a MatMulNBits: with the
    /// output's last dimension as its `N` columns).
    fn may_be(&self, node: &NodeInfo, i: usize) -> bool {
        let layer = &self.layers[i];
        let columns = node.op_type != "MatMulNBits"
            || self.graph.node[node.index].attr_i64("N").map_or(true, |n| {
                usize::try_from(n).ok() == layer.shape.last().copied()
            });
        let op = node.op_type.as_str();
        // QLinearConv, MatMulInteger…: integers out, no module's float value
        let integer = op.starts_with("QLinear") || op.ends_with("Integer");
        self.unscoped.contains(&node.index)
            && !GRID.contains(&op)
            && !integer
            && node
                .inputs
                .iter()
                .any(|v| self.weights.contains(v.as_str()))
            && node
                .outputs
                .first()
                .is_some_and(|o| !o.is_empty() && layer.fits(self.index, o))
            && columns
    }

    /// Call `i` paired with `node`'s output, and how.
    fn mapped(node: &NodeInfo, how: String) -> LayerMapping {
        LayerMapping::Mapped {
            value: node.outputs[0].clone(),
            node: node.name.clone(),
            op_type: node.op_type.clone(),
            note: Some(format!(
                "{how} and carries no scope (a rewrite, such as a quantizer's, dropped it)"
            )),
        }
    }

    /// The nodes that read `value`, directly or past up to four layout ops, or past the
    /// DynamicQuantizeLinear that puts it on an integer grid for the nodes after it.
    fn readers(&self, value: &str) -> Vec<&NodeInfo> {
        let (mut found, mut frontier) = (Vec::new(), vec![value.to_string()]);
        for _ in 0..5 {
            let mut next = Vec::new();
            for v in &frontier {
                for n in self.index.consumers(v) {
                    if LAYOUT.contains(&n.op_type.as_str()) {
                        next.extend(n.outputs.iter().filter(|o| !o.is_empty()).cloned());
                    } else if n.op_type == "DynamicQuantizeLinear" {
                        next.extend(n.outputs.first().filter(|o| !o.is_empty()).cloned());
                    } else {
                        found.push(n);
                    }
                }
            }
            frontier = next;
        }
        found.sort_by_key(|n| n.index);
        found
    }

    /// The node whose value may be call `i`'s, of the reader `node`: the reader itself, or
    /// where it is an integer matrix product with a stored weight (ONNX Runtime's dynamic
    /// quantizer's MatMulInteger), the last of the unscoped Cast and Mul nodes that take its
    /// integers back to the float value the model computes (its scales), which keeps the
    /// original value's name.
    fn candidate<'n>(&'n self, node: &'n NodeInfo, i: usize) -> Option<&'n NodeInfo> {
        if self.may_be(node, i) {
            return Some(node);
        }
        // MatMulInteger only: a ConvInteger's rescaled value is often a Conv and the
        // BatchNorm the quantizer folded into it (MobileNetV3's, ResNet-50's), the later
        // layer's value, which pairing by value and the fused-layer rule place right
        let integer = node.op_type == "MatMulInteger"
            && self.unscoped.contains(&node.index)
            && (node.inputs.iter()).any(|v| self.weights.contains(v.as_str()));
        if !integer {
            return None;
        }
        let (mut at, mut last) = (node, None);
        for _ in 0..4 {
            let Some(out) = at.outputs.first().filter(|o| !o.is_empty()) else {
                break;
            };
            let mut readers = self.index.consumers(out);
            let (Some(next), None) = (readers.next(), readers.next()) else {
                break;
            };
            let rescales = ["Cast", "Mul"].contains(&next.op_type.as_str())
                && self.unscoped.contains(&next.index);
            if !rescales {
                break;
            }
            at = next;
            if (at.outputs.first())
                .is_some_and(|o| !o.is_empty() && self.layers[i].fits(self.index, o))
            {
                last = Some(at);
            }
        }
        last
    }

    /// Calls whose first input is a paired layer's value, each paired with a node that may be
    /// theirs reading that value; the readers of one value are taken by its calls in
    /// execution order, in the order PyTorch made them where the export's value names say it
    /// (`linear`, `linear_1`, `linear_2`: q, k, v, whatever order a quantizer sorted the graph
    /// in), else in graph order.
    fn by_input(&self, mut mappings: Vec<LayerMapping>) -> Vec<LayerMapping> {
        let mut taken: HashSet<String> = mappings.iter().filter_map(value_of).collect();
        for i in 0..self.layers.len() {
            if !self.wanted(i, &mappings) {
                continue;
            }
            let Some(p) = self.layers[i].input_from.filter(|&p| p < i) else {
                continue;
            };
            let Some(fed) = value_of(&mappings[p]) else {
                continue;
            };
            let mut found: Vec<&NodeInfo> = (self.readers(&fed).into_iter())
                .filter_map(|n| self.candidate(n, i))
                .filter(|n| !taken.contains(&n.outputs[0]))
                .collect();
            found.sort_by_key(|n| (super::trace_order(&n.outputs[0]), n.index));
            if let Some(&n) = found.first() {
                taken.insert(n.outputs[0].clone());
                let how = format!(
                    "paired by its input: the {} node `{}` reads `{}`'s value and a stored weight,",
                    n.op_type, n.name, self.layers[p].name
                );
                mappings[i] = Self::mapped(n, how);
            }
        }
        mappings
    }

    /// A call whose input is no paired layer's value (a copy came between, `.contiguous()`
    /// after an attention's heads), paired by its place where it is the one unpaired call
    /// between two paired layers and one node that may be its lies between theirs.
    fn by_place(&self, mut mappings: Vec<LayerMapping>) -> Vec<LayerMapping> {
        let node_of = |m: &LayerMapping| Some(self.index.producer(&value_of(m)?)?.index);
        let taken: HashSet<usize> = mappings.iter().filter_map(node_of).collect();
        for i in 0..self.layers.len() {
            if !self.wanted(i, &mappings) {
                continue;
            }
            let before = (0..i).rev().find_map(|j| Some((j, node_of(&mappings[j])?)));
            let after = (i + 1..self.layers.len()).find_map(|j| Some((j, node_of(&mappings[j])?)));
            let (Some((p, from)), Some((q, to))) = (before, after) else {
                continue;
            };
            let alone = (p + 1..q).filter(|&j| self.wanted(j, &mappings)).count() == 1;
            if !alone || from >= to {
                continue;
            }
            let nodes = &self.index.nodes()[from + 1..to];
            let candidates: Vec<&NodeInfo> = nodes
                .iter()
                .filter(|n| !taken.contains(&n.index) && self.may_be(n, i))
                .collect();
            if let [n] = candidates[..] {
                let (a, b) = (&self.layers[p].name, &self.layers[q].name);
                let how = format!(
                    "paired by its place: the one {} node between `{a}` and `{b}` that reads a stored weight",
                    n.op_type
                );
                mappings[i] = Self::mapped(n, how);
            }
        }
        mappings
    }
}

fn value_of(m: &LayerMapping) -> Option<String> {
    match m {
        LayerMapping::Mapped { value, .. } => Some(value.clone()),
        LayerMapping::Unmapped { .. } => None,
    }
}
