//! Where inside a fusion a defect is born, when the optimizer left no value between it and the
//! values compared before it.

use std::collections::HashSet;

use layerdiff_core::{Inside, Measure, Report, Tensor};
use layerdiff_onnx::Model;

use super::MOST_NODES;
use super::OnnxOptions;
use super::pieces::Pieces;
use crate::Result;

/// Where inside a fusion the headline's difference is born: when the target's runtime
/// rewrites the graph and the nodes between the headline's value and the values compared
/// before it are several (a fusion left none of their values), each is run alone on the
/// target's runtime, in graph order; the first beyond the tolerance carries it. `None` when
/// there is no such region, or no node alone shows it.
pub fn inside_fusion(
    options: &OnnxOptions,
    report: &Report,
    inputs: &[(String, Tensor)],
) -> Result<Option<(String, Inside)>> {
    let Ok(layer) = report.headline() else {
        return Ok(None);
    };
    // The target's own nodes (not the layout conversions layerdiff adds to read values back).
    let fused: Vec<String> = layer
        .location
        .iter()
        .flat_map(|l| &l.nodes)
        .filter(|n| !n.starts_with("layerdiff/"))
        .cloned()
        .collect();
    if report.target_graph.is_none() || fused.is_empty() {
        return Ok(None);
    }
    let mut pieces = Pieces::new(options, inputs)?;
    let target_index = pieces.index();
    let compared: HashSet<&str> = report
        .layers
        .iter()
        .filter(|l| l.status == layerdiff_core::LayerStatus::Compared && l.name != layer.name)
        .map(|l| l.name.as_str())
        .collect();
    let known =
        |v: &str| compared.contains(v) || target_index.graph_inputs().iter().any(|i| i == v);
    let Ok(group) = layerdiff_onnx::local_group(target_index, &layer.name, &known) else {
        return Ok(None);
    };
    if group.nodes.len() < 2 || group.nodes.len() > MOST_NODES * 4 {
        return Ok(None);
    }
    pieces.compute_reference(&group.nodes)?;
    let mut agree = Vec::new();
    for &n in &group.nodes {
        let node = &pieces.index().nodes()[n];
        let Some(value) = node.outputs.first().filter(|v| !v.is_empty()).cloned() else {
            continue;
        };
        // A node alone needs the reference's values at its inputs and output.
        let reads = node.inputs.iter().filter(|i| !i.is_empty());
        if !pieces.known(&value)
            || !reads
                .clone()
                .all(|i| pieces.known(i) || pieces.index().is_initializer(i))
        {
            continue;
        }
        let tried = pieces.run(&[n], &value, &Measure::Tolerance(layer.tolerance))?;
        if tried.multiple > 1.0 {
            let member =
                crate::engine::evidence::node_member(&pieces.target_model().graph().node[n]);
            let attributes =
                crate::engine::evidence::model_counterpart(pieces.reference_model(), &member)
                    .map(|theirs| member.changes_from(&theirs))
                    .unwrap_or_default();
            let weights = node_weights(pieces.target_model(), pieces.reference_model(), n);
            return Ok(Some((
                layer.name.clone(),
                Inside {
                    fused,
                    node: pieces.name(n),
                    op: node.op_type.clone(),
                    value,
                    max_abs_diff: tried.max_abs_diff,
                    tolerance_multiple: tried.multiple,
                    agree,
                    attributes,
                    weights,
                },
            )));
        }
        agree.push(pieces.name(n));
    }
    Ok(None)
}

/// The target file's node `n`'s weights that differ from the reference file's (by name, else
/// by the node's input position), one line each.
fn node_weights(target: &Model, reference: &Model, n: usize) -> Vec<String> {
    let node = &target.graph().node[n];
    let mut differ = Vec::new();
    for (position, input) in node.input.iter().enumerate() {
        let Some(Ok(weight)) = target.stored(input) else {
            continue;
        };
        if !weight.dtype.is_float() {
            continue;
        }
        let check = crate::engine::evidence::model_weight_check(
            reference,
            node.name(),
            position,
            input,
            weight.view(),
            None,
        );
        if let Some(crate::engine::evidence::WeightCheck::Differs(text)) = check {
            differ.push(text);
        }
    }
    differ
}
