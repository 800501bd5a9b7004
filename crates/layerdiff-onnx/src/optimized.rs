//! Values an optimizer renamed, traced back to the values of the original graph they hold.
//!
//! ONNX Runtime's layout transform (`opt=all` on CPU) moves convolutions and pools into the
//! `com.microsoft.nchwc` domain: they compute in a blocked channel layout (NCHWc), write values
//! called `reorder_token_N`, and convert back to NCHW only where a plain op reads the value. So
//! the optimized graph holds a Conv's, a residual Add's or a ReLU's value under another name and
//! in another memory order. Each such node is named after the value it first computed
//! (`getitem_6` → `getitem_6_nchwc`), and what it fused afterwards is in its inputs and
//! attributes: a fourth input is a residual sum, `activation` an activation. From that, its
//! output is traced to the original value it holds, and that value is given back in the
//! optimized graph, in NCHW, under its original name:
//!
//! ```text
//! before:  Conv_nchwc ─► T ─► (nchwc readers of T)
//! after:   Conv_nchwc ─► T/blocked ─► ReorderOutput ─► V ─► ReorderInput ─► T ─► (readers)
//! ```
//!
//! Both conversions are pure data movement, so the kernels that run are the optimized graph's
//! and its outputs keep their bits (the flow checks this against an unmodified run). Because
//! the readers now read `V` through a conversion, a layer's local re-run starts from `V` given
//! in NCHW, like any other value.

use std::collections::{HashMap, HashSet};

use crate::{
    AttributeProto, GraphIndex, MAX_GROUP_NODES, Model, NodeExt, NodeInfo, NodeProto,
    graph::Dimension,
};

/// The domain of ONNX Runtime's blocked-layout ops.
pub const NCHWC_DOMAIN: &str = "com.microsoft.nchwc";

/// An original value given back in an optimized graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Restored {
    /// The value's name in the original graph, now also in the optimized one.
    pub origin: String,
    /// How the optimized graph computes it, in words.
    pub how: String,
}

/// What [`restore_renamed`] did to an optimized graph.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Restoration {
    /// The values given back, in graph order.
    pub restored: Vec<Restored>,
    /// Values still in a blocked layout, and why each could not be given back: they must never
    /// be compared with a value in NCHW, whatever their name.
    pub blocked: Vec<(String, String)>,
}

/// Gives back, in `optimized`, each value of `original` that ONNX Runtime's NCHWc transform
/// holds in blocked layout, under its original name and in NCHW (see the module docs). A value
/// is blocked when an NCHWc op other than `ReorderOutput` writes it, or any op that reads a
/// blocked value (ONNX Runtime runs elementwise ops on blocked data). Its origin is the value
/// an NCHWc node is named after, followed through what it fused, or the output of the
/// original node of the same name and op.
pub fn restore_renamed(original: &Model, optimized: &mut Model) -> Restoration {
    let before = GraphIndex::new(original.graph());
    let after = GraphIndex::new(optimized.graph());
    let blocked = blocked_values(&after);
    let mut done = Restoration::default();
    if blocked.is_empty() {
        return done;
    }
    let declared = |name: &str| {
        let graph = original.graph();
        graph
            .value_info
            .iter()
            .chain(&graph.output)
            .find(|v| v.name() == name)
            .cloned()
    };
    let mut rewired: HashMap<String, String> = HashMap::new();
    let mut added_info = Vec::new();
    let mut nodes: Vec<NodeProto> = Vec::with_capacity(optimized.graph().node.len());
    let taken = std::mem::take(&mut optimized.graph_mut().node);
    for (info, mut node) in after.nodes().iter().zip(taken) {
        for input in &mut node.input {
            if let Some(now) = rewired.get(input) {
                input.clone_from(now);
            }
        }
        for extra in info
            .outputs
            .iter()
            .skip(1)
            .filter(|o| blocked.contains(o.as_str()))
        {
            done.blocked.push((
                extra.clone(),
                "a blocked value that is not a node's first output".into(),
            ));
        }
        let Some(value) = info
            .outputs
            .first()
            .filter(|o| blocked.contains(o.as_str()))
        else {
            nodes.push(node);
            continue;
        };
        let origin = origin_of(original, (&before, &after), info, &node);
        let (origin, fused, channels) = match origin {
            Ok(found) => found,
            Err(why) => {
                done.blocked.push((value.clone(), why));
                nodes.push(node);
                continue;
            }
        };
        let computed = format!("{value}/blocked");
        node.output[0].clone_from(&computed);
        // Readers read the value converted back from NCHW, so that a local re-run starts from
        // it; ONNX Runtime converts only channel counts that are a multiple of 4, so other
        // readers read the computed value itself.
        let reread = channels % 4 == 0;
        let reblocked = match (reread, *value == origin) {
            (true, false) => value.clone(),
            (true, true) => format!("{value}/reblocked"),
            (false, _) => computed.clone(),
        };
        if reblocked != *value {
            rewired.insert(value.clone(), reblocked.clone());
        }
        let how = format!(
            "renamed by the optimizer: `{}` ({}{}) computes it in NCHWc layout as `{value}`; read back in NCHW",
            info.name,
            info.op_type,
            fused.iter().map(|f| format!(" + {f}")).collect::<String>()
        );
        nodes.push(node);
        nodes.push(conversion(
            "ReorderOutput",
            &computed,
            &origin,
            vec![int_attribute("channels", channels)],
        ));
        if reread {
            nodes.push(conversion("ReorderInput", &origin, &reblocked, Vec::new()));
        }
        added_info.extend(declared(&origin));
        done.restored.push(Restored { origin, how });
    }
    let graph = optimized.graph_mut();
    graph.node = nodes;
    graph.value_info.extend(added_info);
    done
}

/// The values of the optimized graph held in blocked layout: written by an NCHWc op other
/// than `ReorderOutput`, or by any op that reads a blocked value.
fn blocked_values(after: &GraphIndex) -> HashSet<&str> {
    let mut blocked: HashSet<&str> = HashSet::new();
    for node in after.nodes() {
        let writes_blocked = if node.domain == NCHWC_DOMAIN {
            node.op_type != "ReorderOutput"
        } else {
            node.inputs.iter().any(|i| blocked.contains(i.as_str()))
        };
        if writes_blocked {
            blocked.extend(
                node.outputs
                    .iter()
                    .filter(|o| !o.is_empty())
                    .map(String::as_str),
            );
        }
    }
    blocked
}

/// Where a blocked value of the optimized graph (written by `node`, `info`) comes from in the
/// original: the original value, the ops the optimizer fused into it, and its channel count;
/// or why it cannot be said.
fn origin_of(
    original: &Model,
    (before, after): (&GraphIndex, &GraphIndex),
    info: &crate::NodeInfo,
    node: &NodeProto,
) -> std::result::Result<(String, Vec<String>, i64), String> {
    let traced = if info.domain == NCHWC_DOMAIN {
        trace(before, node)
    } else {
        same_node(before, info)
    };
    match traced {
        None => Err("its origin in the original graph could not be traced".to_string()),
        Some((origin, _))
            if after
                .producer(&origin)
                .is_some_and(|p| p.index != info.index) =>
        {
            Err(format!(
                "its origin `{origin}` is another value of the optimized graph"
            ))
        }
        Some((origin, fused)) => match channels(original, before, after, &origin) {
            Some(c) => Ok((origin, fused, c)),
            None => Err(format!(
                "neither graph declares the channel count of its origin `{origin}`"
            )),
        },
    }
}

/// A layout conversion between NCHW and ONNX Runtime's blocked layout.
fn conversion(op: &str, input: &str, output: &str, attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        name: Some(format!("layerdiff/{op}/{output}")),
        op_type: Some(op.to_string()),
        domain: Some(NCHWC_DOMAIN.to_string()),
        input: vec![input.to_string()],
        output: vec![output.to_string()],
        attribute,
        ..Default::default()
    }
}

/// The first output of the original node with the same name and op as `node`.
fn same_node(original: &GraphIndex, node: &NodeInfo) -> Option<(String, Vec<String>)> {
    let same = original
        .nodes()
        .iter()
        .find(|n| n.name == node.name && n.op_type == node.op_type)?;
    Some((same.outputs.first()?.clone(), Vec::new()))
}

/// The channel count of `value`: declared in either graph, else read from the original graph:
/// a convolution's filter, or the first data input of an op that keeps channels.
fn channels(model: &Model, before: &GraphIndex, after: &GraphIndex, value: &str) -> Option<i64> {
    let declared = |index: &GraphIndex, v: &str| -> Option<i64> {
        let dims = index.value_type(v)?.dims.as_ref()?;
        match dims.get(1)? {
            Dimension::Fixed(c) if dims.len() >= 3 => Some(*c),
            _ => None,
        }
    };
    let filter = |name: &str| {
        model
            .graph()
            .initializer
            .iter()
            .find(|t| t.name() == name)
            .map(|t| t.dims.clone())
    };
    let mut value = value.to_string();
    for _ in 0..MAX_GROUP_NODES {
        if let Some(c) = declared(before, &value).or_else(|| declared(after, &value)) {
            return Some(c);
        }
        let producer = before.producer(&value)?;
        match producer.op_type.as_str() {
            "Conv" => return filter(producer.inputs.get(1)?)?.first().copied(),
            "ConvTranspose" => return None,
            _ => {}
        }
        value = producer
            .inputs
            .iter()
            .find(|i| !i.is_empty() && !before.is_initializer(i))?
            .clone();
    }
    None
}

/// The original value an NCHWc node's output holds, and the ops it fused after the first:
/// the node is named after the value it first computed; a Conv's fourth input is a residual
/// sum (the Add that read that value); `activation` is the activation after it.
fn trace(original: &GraphIndex, node: &NodeProto) -> Option<(String, Vec<String>)> {
    if matches!(node.op_type(), "ReorderInput" | "ReorderOutput") {
        return None;
    }
    let mut value = node.name().strip_suffix("_nchwc")?.to_string();
    original.producer(&value)?;
    let mut fused = Vec::new();
    let mut then = |value: &mut String, ops: &[&str]| -> Option<()> {
        if ops.contains(&original.producer(value)?.op_type.as_str()) {
            return Some(());
        }
        let next = original
            .consumers(value)
            .find(|n| ops.contains(&n.op_type.as_str()))?;
        fused.push(next.op_type.clone());
        *value = next.outputs.first()?.clone();
        Some(())
    };
    if node.op_type() == "Conv" && node.input.get(3).is_some_and(|s| !s.is_empty()) {
        then(&mut value, &["Add", "Sum"])?;
    }
    if let Some(activation) = node.attr("activation").and_then(|a| a.s.as_deref()) {
        let activation = String::from_utf8_lossy(activation).into_owned();
        then(&mut value, &[activation.as_str()])?;
    }
    Some((value, fused))
}

fn int_attribute(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.to_string()),
        i: Some(value),
        r#type: Some(crate::attribute_proto::AttributeType::Int as i32),
        ..Default::default()
    }
}
