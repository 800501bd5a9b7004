//! Nodes the target runtime cannot run (an op it lacks, or one it crashes on in a worker
//! process): the comparison goes on without them and without the layers that depend on them,
//! which the report names, with why; the layers before them are compared as usual.

use std::collections::HashSet;
use std::path::Path;

use layerdiff_core::{LayerStatus, Report, Verdict};
use layerdiff_onnx::{GraphIndex, Model, NodeExt, extract_nodes};

use crate::{Error, Result};

/// A node the target cannot run, and what its runtime said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Lacking {
    /// The node's name.
    pub node: String,
    /// Its op.
    pub op: String,
    /// The runtime's words.
    pub why: String,
    /// The values it produces (what finds it when it has no name).
    pub outputs: Vec<String>,
}

/// The node of the target's file (`file`) its error says it cannot run, when the error names one:
/// a runtime that has no kernel for a node names it ([`layerdiff_runtime::Error::LacksNode`],
/// each runtime reading its own words; the node is found by its name); an isolated runtime
/// that crashed names the node it died on, found by the values it produces (see
/// [`layerdiff_runtime::Isolated`]).
pub(super) fn lacking(err: &Error, file: &Path) -> Option<Lacking> {
    if let Error::Runtime(layerdiff_runtime::Error::Crashed(crash)) = err
        && let Some(crashed) = &crash.node
    {
        let how = &crash.how;
        let model = Model::load(file).ok()?;
        let node = model
            .graph()
            .node
            .iter()
            .find(|n| n.output.iter().any(|o| crashed.outputs.contains(o)))?;
        return Some(Lacking {
            node: node.display_name(),
            op: crashed.op.clone(),
            why: format!("crashed with {how}"),
            outputs: node.output.clone(),
        });
    }
    let Error::Runtime(layerdiff_runtime::Error::LacksNode {
        node: name, why, ..
    }) = err
    else {
        return None;
    };
    let model = Model::load(file).ok()?;
    let node = model.graph().node.iter().find(|n| n.name() == name)?;
    Some(Lacking {
        node: node.name().to_string(),
        op: node.op_type().to_string(),
        why: why.clone(),
        outputs: node.output.clone(),
    })
}

/// `model` without the nodes the target lacks and every node that reads what they produce; and
/// the values so removed.
pub(super) fn without(model: &Model, lacking: &[Lacking]) -> Result<(Model, HashSet<String>)> {
    let graph = model.graph();
    let index = GraphIndex::new(graph);
    let mut removed: HashSet<String> = HashSet::new();
    let mut gone = vec![false; graph.node.len()];
    for (i, node) in graph.node.iter().enumerate() {
        // a node's outputs name it in SSA form, where its name may be empty or repeated
        let lacks = lacking.iter().any(|l| l.outputs == node.output);
        if lacks || node.input.iter().any(|v| removed.contains(v)) {
            gone[i] = true;
            removed.extend(node.output.iter().filter(|o| !o.is_empty()).cloned());
        }
    }
    let kept: Vec<usize> = (0..graph.node.len()).filter(|&i| !gone[i]).collect();
    if kept.is_empty() {
        let names: Vec<String> = lacking
            .iter()
            .map(|l| format!("`{}` ({})", l.node, l.op))
            .collect();
        return Err(Error::Usage(format!(
            "the target cannot run {}, on which every layer depends: nothing to compare",
            names.join(", ")
        )));
    }
    // the graph's outputs the kept nodes still produce, else every value they produce
    let outputs: Vec<String> = index
        .graph_outputs()
        .iter()
        .filter(|o| !removed.contains(*o))
        .cloned()
        .collect();
    Ok((extract_nodes(model, &kept, &outputs, &[])?, removed))
}

/// Names, in the report, the layers not compared because the target lacks a node they depend
/// on, and warns of it.
pub(super) fn explain(report: &mut Report, removed: &HashSet<String>, lacking: &[Lacking]) {
    let runtime = report.target.runtime.clone();
    let nodes: Vec<String> = lacking
        .iter()
        .map(|l| format!("`{}` ({}: {})", l.node, l.op, l.why))
        .collect();
    let mut left = 0;
    for layer in report
        .layers
        .iter_mut()
        .filter(|l| l.status == LayerStatus::Unmapped && removed.contains(&l.name))
    {
        layer.reason = Some(format!(
            "not compared: {runtime} cannot run {}, which this layer depends on",
            nodes.join(", ")
        ));
        left += 1;
    }
    report.summary.layers_unmapped -= left;
    report.summary.layers_not_run += left;
    // what was not compared may hold the drift: no verdict of "no drift"
    if report.summary.verdict == Verdict::NoDrift {
        report.summary.verdict = Verdict::Inconclusive;
        report.summary.inconclusive = Some(format!(
            "{runtime} cannot run {}, so the {left} layer(s) that depend on it were not compared",
            nodes.join(", ")
        ));
    }
    report.summary.warnings.insert(
        0,
        format!(
            "{runtime} cannot run {}: the {left} layer(s) that depend on it were not compared; the layers before were",
            nodes.join(", ")
        ),
    );
}
