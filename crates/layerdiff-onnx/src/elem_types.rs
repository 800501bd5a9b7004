//! Element types of values a file does not declare.
//!
//! Files from the TorchScript exporter usually carry no `value_info`, yet the mapping must not
//! pair a float layer with an int64 shape computation. Element types follow from a few rules
//! per op (constants, shape ops, casts, comparisons) and otherwise from the first typed input,
//! in one pass over the topologically sorted nodes. Shapes are not inferred: where a file
//! declares none, the comparison itself finds a shape that does not fit.

use std::collections::HashMap;

use crate::{AttributeProto, NodeExt, NodeProto};

const FLOAT: i32 = 1;
const UINT8: i32 = 2;
const INT64: i32 = 7;
const BOOL: i32 = 9;

/// Fills in the element type of every node output that `known` lacks, where the rules give one.
pub(crate) fn infer_elem_types(nodes: &[NodeProto], known: &mut HashMap<String, i32>) {
    for node in nodes {
        let input = |i: usize| {
            node.input
                .get(i)
                .filter(|n| !n.is_empty())
                .and_then(|n| known.get(n))
                .copied()
        };
        let first_typed = || (0..node.input.len()).find_map(input);
        let inferred = match node.op_type() {
            "Constant" => node.attribute.first().and_then(attribute_elem_type),
            "ConstantOfShape" => Some(
                node.attr("value")
                    .and_then(attribute_elem_type)
                    .unwrap_or(FLOAT),
            ),
            "Cast" | "RandomNormal" | "RandomUniform" | "EyeLike" => node
                .attr(if node.op_type() == "Cast" {
                    "to"
                } else {
                    "dtype"
                })
                .and_then(|a| a.i)
                .map(|t| t as i32)
                .or(Some(FLOAT)),
            "CastLike" => input(1),
            "Shape" | "Size" | "NonZero" | "ArgMax" | "ArgMin" => Some(INT64),
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "Not" | "And"
            | "Or" | "Xor" | "IsNaN" | "IsInf" => Some(BOOL),
            "QuantizeLinear" | "DynamicQuantizeLinear" => input(2).or(Some(UINT8)),
            "DequantizeLinear" => input(1).or(Some(FLOAT)),
            "Where" => input(1).or_else(|| input(2)),
            _ => first_typed(),
        };
        let Some(t) = inferred else { continue };
        for (position, out) in node.output.iter().enumerate() {
            if out.is_empty() || known.contains_key(out) {
                continue;
            }
            // Index outputs (TopK's, MaxPool's, Unique's) are int64 whatever the data is.
            let index_output = position > 0
                && matches!(
                    node.op_type(),
                    "TopK" | "MaxPool" | "Unique" | "DynamicQuantizeLinear"
                );
            let t = match (node.op_type(), index_output) {
                ("DynamicQuantizeLinear", true) => {
                    if position == 1 {
                        FLOAT
                    } else {
                        UINT8
                    }
                }
                (_, true) => INT64,
                _ => t,
            };
            known.insert(out.clone(), t);
        }
    }
}

/// The element type of a `Constant`'s value attribute.
fn attribute_elem_type(a: &AttributeProto) -> Option<i32> {
    match a.name() {
        "value" => a.t.as_ref().map(|t| t.data_type()),
        "value_float" | "value_floats" => Some(FLOAT),
        "value_int" | "value_ints" => Some(INT64),
        _ => None,
    }
}

/// Whether an ONNX element type is a floating-point one.
pub fn is_float_elem_type(code: i32) -> bool {
    matches!(code, 1 | 10 | 11 | 16 | 17..=20 | 23)
}
