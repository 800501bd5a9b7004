//! Model Explorer node data: each ONNX node of a compared layer with that layer's own error as a
//! multiple of its tolerance (the local error where it was measured, else the accumulated), so
//! the graph can be coloured by where error is born. The format is Model Explorer's
//! `GraphNodeData` (`results` by node name, `thresholds` with colours), which its ONNX adapter
//! (`model-explorer-onnx`) matches by node name.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{Report, Stats};

#[derive(Serialize)]
struct GraphNodeData {
    results: BTreeMap<String, NodeResult>,
    thresholds: Vec<Threshold>,
}

#[derive(Serialize)]
struct NodeResult {
    #[serde(serialize_with = "crate::floats::float")]
    value: f64,
}

#[derive(Serialize)]
struct Threshold {
    value: f64,
    #[serde(rename = "bgColor")]
    bg_color: &'static str,
}

/// Colours by the error's multiple of the tolerance: greens well within it, amber near it, reds
/// beyond. Model Explorer colours a value by the first threshold at or above it.
const THRESHOLDS: [(f64, &str); 6] = [
    (0.1, "#388e3c"),
    (0.5, "#8bc34a"),
    (1.0, "#dcedc8"),
    (10.0, "#ffa000"),
    (100.0, "#ff5722"),
    (f64::MAX, "#d32f2f"),
];

/// The report as Model Explorer node data (JSON). A node shared by several layers keeps the
/// largest value; a value beyond any number (an overflow) is written as the largest float.
pub fn to_node_data(report: &Report) -> String {
    let mut results: BTreeMap<String, NodeResult> = BTreeMap::new();
    for layer in &report.layers {
        let Some(onnx) = layer.location.as_ref().filter(|l| l.kind == "onnx") else {
            continue;
        };
        let own = layer.local.as_ref().or(layer.accumulated.as_ref());
        let Some(ratio) = own.and_then(Stats::tolerance_multiple) else {
            continue;
        };
        let value = if ratio.is_finite() { ratio } else { f64::MAX };
        let nodes = if onnx.nodes.is_empty() {
            std::slice::from_ref(&onnx.node)
        } else {
            onnx.nodes.as_slice()
        };
        for node in nodes {
            let slot = results.entry(node.clone()).or_insert(NodeResult { value });
            slot.value = slot.value.max(value);
        }
    }
    let data = GraphNodeData {
        results,
        thresholds: THRESHOLDS
            .iter()
            .map(|&(value, bg_color)| Threshold { value, bg_color })
            .collect(),
    };
    super::to_json_value(&data)
}
