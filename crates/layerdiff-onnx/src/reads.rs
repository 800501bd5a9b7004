//! Whether a node of one graph and its namesake in another read the same values: through
//! the conversions a quantizer, a float16 conversion or a layout transformer puts between two
//! nodes, weights aside. An optimizer that rewires a node (ONNX Runtime's transpose optimizer
//! moves a Transpose across a Split, which keeps its name and splits another axis) leaves its
//! name on another computation.

use std::collections::HashMap;

use crate::{GraphIndex, NodeInfo};

/// Ops that hand on the value they read, in another dtype, encoding or layout: what a
/// quantizer (Q/DQ pairs), a float16 conversion (Casts) or ONNX Runtime's layout transformer
/// (NCHWc reorders) puts between two nodes without changing what they compute.
pub const CONVERSIONS: &[&str] = &[
    "QuantizeLinear",
    "DequantizeLinear",
    "Cast",
    "Identity",
    "ReorderInput",
    "ReorderOutput",
];

/// The value `value` converts, through any chain of [`CONVERSIONS`] (itself when none).
pub fn converted_from<'g>(index: &'g GraphIndex, value: &'g str) -> &'g str {
    let mut at = value;
    for _ in 0..8 {
        match index.producer(at) {
            Some(p) if CONVERSIONS.contains(&p.op_type.as_str()) => match p.inputs.first() {
                Some(input) if !input.is_empty() => at = input,
                _ => break,
            },
            _ => break,
        }
    }
    at
}

/// A node's data inputs: not an initializer (dequantized or cast as it may be: an optimizer may
/// fold constants into new weights), not an empty optional input.
pub fn data_inputs<'g>(index: &'g GraphIndex, node: &'g NodeInfo) -> Vec<&'g String> {
    let data = |v: &String| !v.is_empty() && !index.is_initializer(converted_from(index, v));
    node.inputs.iter().filter(|v| data(v)).collect()
}

/// Whether the target's node `same` (in `t`) reads what the reference's `node` (in `r`) reads:
/// each data input ([`data_inputs`]) is the reference's input itself, or the target value it
/// was paired with (`paired`, reference value → target value), either maybe through
/// [`CONVERSIONS`] (a quantized file's Q/DQ pairs, a float16 file's Casts).
pub fn reads_the_same(
    r: &GraphIndex,
    t: &GraphIndex,
    node: &NodeInfo,
    same: &NodeInfo,
    paired: &HashMap<String, String>,
) -> bool {
    let (theirs, ours) = (data_inputs(t, same), data_inputs(r, node));
    let same_value = |o: &String, theirs: &String| {
        let ours = [o.as_str(), converted_from(r, o)];
        let theirs = [theirs.as_str(), converted_from(t, theirs)];
        ours.iter()
            .any(|o| (theirs.iter()).any(|t| o == t || paired.get(*o).is_some_and(|p| p == t)))
    };
    theirs.len() == ours.len() && ours.iter().zip(&theirs).all(|(o, t)| same_value(o, t))
}
