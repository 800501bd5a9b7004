//! Nodes with no scope of their own that belong to one module: what a quantizer or another
//! tool inserted between a module's nodes.

use std::collections::HashMap;

use super::nodeless::has_scope;
use crate::scope::below;
use crate::{GraphIndex, GraphProto, NodeInfo};

/// Nodes with no scope that a tool put inside a module (a static quantizer's QuantizeLinear →
/// DequantizeLinear pairs, a dynamic quantizer's DynamicQuantizeLinear → MatMulInteger → scaling
/// in place of a Gemm) are that module's: a run of connected such nodes whose every input comes
/// from one module and whose every output goes back to it, and whose weights are no other
/// module's. Else the value the run reads seems to leave the module and is taken for its output
/// (the first Transpose of a ConvNeXt LayerNorm2d, which permutes, normalizes and permutes back;
/// the flattened input of a GPT-2 Conv1D). A run between two calls of one module (a ResNet
/// Bottleneck's ReLU) that computes another module (its Conv, by its weight) stays unscoped.
pub(super) fn inside_one_module(
    graph: &GraphProto,
    index: &GraphIndex,
    modules: &[&str],
    node_module: &mut [Option<String>],
) {
    let nodes = index.nodes();
    let unscoped: Vec<bool> = nodes
        .iter()
        .map(|n| node_module[n.index].is_none() && !has_scope(&graph.node[n.index]))
        .collect();
    // Runs: nodes with no scope joined along the values between them.
    let mut run: Vec<usize> = (0..nodes.len()).collect();
    fn root(run: &mut [usize], mut i: usize) -> usize {
        while run[i] != i {
            run[i] = run[run[i]];
            i = run[i];
        }
        i
    }
    for node in nodes.iter().filter(|n| unscoped[n.index]) {
        for input in &node.inputs {
            if let Some(p) = index.producer(input).filter(|p| unscoped[p.index]) {
                let (a, b) = (root(&mut run, p.index), root(&mut run, node.index));
                run[a] = b;
            }
        }
    }
    let end = |node: &NodeInfo| match &node_module[node.index] {
        Some(m) => Ends::One(m.clone()),
        None => Ends::Outside,
    };
    let graph_outputs = index.graph_outputs();
    let mut from: HashMap<usize, Ends> = HashMap::new();
    let mut to: HashMap<usize, Ends> = HashMap::new();
    let mut weights: HashMap<usize, Vec<&str>> = HashMap::new();
    for node in nodes.iter().filter(|n| unscoped[n.index]) {
        let r = root(&mut run, node.index);
        for input in node.inputs.iter().filter(|i| !i.is_empty()) {
            let ends = match index.producer(input) {
                Some(p) if unscoped[p.index] => continue,
                Some(p) => end(p),
                None if index.is_initializer(input) => {
                    weights.entry(r).or_default().push(input);
                    continue;
                }
                None => Ends::Outside,
            };
            let e = from.entry(r).or_default();
            *e = std::mem::take(e).join(ends);
        }
        for output in node.outputs.iter().filter(|o| !o.is_empty()) {
            let mut ends = Ends::Nothing;
            if graph_outputs.contains(output) {
                ends = Ends::Outside;
            }
            for reader in index.consumers(output).filter(|c| !unscoped[c.index]) {
                ends = ends.join(end(reader));
            }
            let e = to.entry(r).or_default();
            *e = std::mem::take(e).join(ends);
        }
    }
    // The module a weight's dotted name starts with, the longest that names one.
    let owner = |weight: &str| {
        modules
            .iter()
            .filter(|m| below(weight, m))
            .max_by_key(|m| m.len())
            .copied()
    };
    let mut inside: HashMap<usize, String> = HashMap::new();
    for (r, ends) in &from {
        let (Ends::One(a), Some(Ends::One(b))) = (ends, to.get(r)) else {
            continue;
        };
        let own = |w: &&str| owner(w).is_none_or(|m| m == a || below(m, a));
        if a == b && weights.get(r).is_none_or(|w| w.iter().all(own)) {
            inside.insert(*r, a.clone());
        }
    }
    for node in nodes.iter().filter(|n| unscoped[n.index]) {
        if let Some(m) = inside.get(&root(&mut run, node.index)) {
            node_module[node.index] = Some(m.clone());
        }
    }
}

/// Where the values around a run of nodes with no scope come from or go to.
#[derive(Debug, Clone, Default, PartialEq)]
enum Ends {
    #[default]
    Nothing,
    One(String),
    Outside,
}

impl Ends {
    fn join(self, other: Ends) -> Ends {
        match (self, other) {
            (Ends::Nothing, e) | (e, Ends::Nothing) => e,
            (Ends::One(a), Ends::One(b)) if a == b => Ends::One(a),
            _ => Ends::Outside,
        }
    }
}
