//! What re-running one layer needs from a graph: the group of nodes that computes a value from
//! values both sides know, and how two versions of a node differ in their attributes.

use std::collections::HashSet;

use crate::{AttributeProto, GraphIndex};

/// The most nodes a local group may hold; beyond it the layer is not local any more.
pub const MAX_GROUP_NODES: usize = 256;

/// The nodes between some known values and one value.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalGroup {
    /// Node indices, in graph order.
    pub nodes: Vec<usize>,
    /// The known values the group reads (not initializers), in first-read order.
    pub inputs: Vec<String>,
}

/// The nodes that compute `value` from values for which `known` holds, walking back from its
/// producer until every path reaches a known value or an initializer. `known` should hold for
/// graph inputs. `Err` says why there is no such group.
pub fn local_group(
    index: &GraphIndex,
    value: &str,
    known: &dyn Fn(&str) -> bool,
) -> Result<LocalGroup, String> {
    group_of_at_most(index, value, known, MAX_GROUP_NODES)
}

/// [`local_group`] of at most `most` nodes: a stretch of a graph, not a layer, where the caller
/// says how far it may reach.
pub fn group_of_at_most(
    index: &GraphIndex,
    value: &str,
    known: &dyn Fn(&str) -> bool,
    most: usize,
) -> Result<LocalGroup, String> {
    let Some(producer) = index.producer(value) else {
        return Err(format!("`{value}` is not produced by a node"));
    };
    let mut nodes: Vec<usize> = Vec::new();
    let mut inputs: Vec<String> = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack = vec![producer.index];
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        if seen.len() > most {
            return Err(format!(
                "more than {most} nodes lie between it and the nearest values known on both sides"
            ));
        }
        nodes.push(n);
        for input in &index.nodes()[n].inputs {
            if input.is_empty() || index.is_initializer(input) {
                continue;
            }
            if known(input) {
                if !inputs.contains(input) {
                    inputs.push(input.clone());
                }
            } else if let Some(p) = index.producer(input) {
                stack.push(p.index);
            } else {
                return Err(format!(
                    "its input `{input}` is neither computed in the graph nor known on both sides"
                ));
            }
        }
    }
    nodes.sort_unstable();
    Ok(LocalGroup { nodes, inputs })
}

/// An attribute's value in words: numbers as written, lists in brackets.
pub fn attribute_text(a: &AttributeProto) -> String {
    let float = |v: f32| {
        let a = v.abs();
        if a != 0.0 && !(1e-3..1e4).contains(&a) {
            format!("{v:e}")
        } else {
            format!("{v}")
        }
    };
    let list = |items: Vec<String>| format!("[{}]", items.join(", "));
    if let Some(f) = a.f {
        float(f)
    } else if let Some(i) = a.i {
        i.to_string()
    } else if let Some(s) = &a.s {
        format!("{:?}", String::from_utf8_lossy(s))
    } else if !a.floats.is_empty() {
        list(a.floats.iter().map(|&v| float(v)).collect())
    } else if !a.ints.is_empty() {
        list(a.ints.iter().map(i64::to_string).collect())
    } else if !a.strings.is_empty() {
        list(
            a.strings
                .iter()
                .map(|s| format!("{:?}", String::from_utf8_lossy(s)))
                .collect(),
        )
    } else if let Some(t) = &a.t {
        format!(
            "tensor {:?} ({} bytes)",
            t.dims,
            t.raw_data.as_ref().map_or(0, |r| r.len())
        )
    } else if a.g.is_some() {
        "a subgraph".to_string()
    } else {
        "(empty)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_float_attribute_is_written_as_a_reader_would() {
        let epsilon = |f: f32| AttributeProto {
            name: Some("epsilon".into()),
            f: Some(f),
            r#type: Some(1),
            ..Default::default()
        };
        assert_eq!(attribute_text(&epsilon(1e-5)), "1e-5");
        assert_eq!(attribute_text(&epsilon(0.1)), "0.1");
    }
}

/// Whether `text` (as [`attribute_text`] writes it) is the value the ONNX operator `op` gives
/// its attribute `name` when a file leaves it unset: a file that writes it says no more than one
/// that does not (ONNX Runtime's saved optimized graphs write `auto_pad` "NOTSET" on every Conv
/// in some releases). The common ops' defaults; an attribute not listed is never a default.
pub fn is_default_attribute(op: &str, name: &str, text: &str) -> bool {
    let all = |item: &str| {
        text.strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .is_some_and(|t| t.split(", ").all(|v| v == item))
    };
    const POOLS: [&str; 7] = [
        "Conv",
        "ConvTranspose",
        "ConvInteger",
        "QLinearConv",
        "MaxPool",
        "AveragePool",
        "LpPool",
    ];
    let pooled = POOLS.contains(&op);
    match (op, name) {
        (_, "auto_pad") if pooled => text == "\"NOTSET\"",
        (_, "dilations" | "strides") if pooled => all("1"),
        (_, "pads") if pooled => all("0"),
        ("Conv" | "ConvTranspose" | "ConvInteger" | "QLinearConv", "group") => text == "1",
        ("MaxPool" | "AveragePool", "ceil_mode") | ("MaxPool", "storage_order") => text == "0",
        ("AveragePool", "count_include_pad") => text == "0",
        ("Gemm", "alpha" | "beta") => text == "1",
        ("Gemm", "transA" | "transB") => text == "0",
        ("LayerNormalization", "axis") => text == "-1",
        ("LayerNormalization", "stash_type") => text == "1",
        ("LayerNormalization" | "BatchNormalization" | "InstanceNormalization", "epsilon") => {
            text == "1e-5"
        }
        ("BatchNormalization", "momentum") => text == "0.9",
        ("Gelu", "approximate") => text == "\"none\"",
        ("LeakyRelu", "alpha") => text == "0.01",
        ("Elu", "alpha") => text == "1",
        ("Flatten", "axis") => text == "1",
        ("Cast" | "QuantizeLinear", "saturate") => text == "1",
        ("QuantizeLinear" | "DequantizeLinear", "axis") => text == "1",
        ("QuantizeLinear" | "DequantizeLinear", "block_size") => text == "0",
        ("Reshape", "allowzero") => text == "0",
        (op, "keepdims") if op.starts_with("Reduce") || op.starts_with("Arg") => text == "1",
        ("Gather" | "GatherElements" | "Split", "axis") => text == "0",
        ("TopK", "axis") => text == "-1",
        ("TopK", "largest" | "sorted") => text == "1",
        _ => false,
    }
}

#[cfg(test)]
mod default_tests {
    use super::is_default_attribute;

    #[test]
    fn an_attribute_written_at_its_default_is_a_default() {
        assert!(is_default_attribute("Conv", "auto_pad", "\"NOTSET\""));
        assert!(is_default_attribute("Conv", "dilations", "[1, 1]"));
        assert!(is_default_attribute("MaxPool", "pads", "[0, 0, 0, 0]"));
        assert!(is_default_attribute(
            "LayerNormalization",
            "epsilon",
            "1e-5"
        ));
        assert!(!is_default_attribute("Conv", "auto_pad", "\"SAME_UPPER\""));
        assert!(!is_default_attribute("Conv", "pads", "[1, 1, 1, 1]"));
        assert!(!is_default_attribute("Conv", "strides", "[2, 2]"));
        assert!(!is_default_attribute(
            "LayerNormalization",
            "epsilon",
            "0.1"
        ));
        assert!(
            !is_default_attribute("Softmax", "axis", "-1"),
            "its default is the opset's"
        );
    }
}
