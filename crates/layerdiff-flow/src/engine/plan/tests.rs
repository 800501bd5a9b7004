//! The segment planner's tests.

use super::*;
use crate::engine::memory::value_sizes;
use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::{GraphIndex, GraphProto, NodeProto, tensor_value_info};

/// `x → v0 → … → v4` (Relu), then `v5 = v4 + v0`: a skip connection that keeps `v0` alive.
/// Every value is 1024 float32 (4 KiB).
fn chain() -> (GraphIndex, Vec<(String, Tensor)>) {
    let value = |n: &str| tensor_value_info(n, 1, &[1, 1024]);
    let mut node = Vec::new();
    let mut last = "x".to_string();
    for i in 0..5 {
        node.push(NodeProto {
            op_type: Some("Relu".into()),
            name: Some(format!("n{i}")),
            input: vec![last.clone()],
            output: vec![format!("v{i}")],
            ..Default::default()
        });
        last = format!("v{i}");
    }
    node.push(NodeProto {
        op_type: Some("Add".into()),
        name: Some("n5".into()),
        input: vec!["v4".into(), "v0".into()],
        output: vec!["v5".into()],
        ..Default::default()
    });
    let graph = GraphProto {
        node,
        input: vec![value("x")],
        output: vec![value("v5")],
        value_info: (0..5).map(|i| value(&format!("v{i}"))).collect(),
        ..Default::default()
    };
    let x = Tensor::new("x", DType::F32, vec![1, 1024], vec![0; 4096]).unwrap();
    (GraphIndex::new(&graph), vec![("x".to_string(), x)])
}

fn planned(budget: Option<u64>) -> Plan {
    planned_with(budget, &[])
}

/// The chain's plan, with some layers' local inputs replaced (`(layer, inputs)`).
fn planned_with(budget: Option<u64>, replaced: &[(usize, &[&str])]) -> Plan {
    let (index, inputs) = chain();
    let names: Vec<String> = (0..6).map(|i| format!("v{i}")).collect();
    let local: Vec<Vec<String>> = (0..6)
        .map(|i| match (i, replaced.iter().find(|(at, _)| *at == i)) {
            (_, Some((_, given))) => given.iter().map(|s| s.to_string()).collect(),
            (0, None) => vec!["x".to_string()],
            (5, None) => vec!["v4".to_string(), "v0".to_string()],
            _ => vec![format!("v{}", i - 1)],
        })
        .collect();
    let layers: Vec<PlannedLayer<'_>> = names
        .iter()
        .zip(&local)
        .map(|(n, l)| PlannedLayer {
            reference: n,
            target: Some(n),
            local_inputs: l,
        })
        .collect();
    let side = || PlanSide {
        graph: Some(&index),
        sizes: value_sizes(&index, &inputs),
        weights: 0,
        step_weights: Vec::new(),
    };
    plan(&side(), &side(), &layers, budget)
}

#[test]
fn without_a_budget_the_whole_graph_is_one_segment() {
    let plan = planned(None);
    assert_eq!(plan.segments.len(), 1);
    let only = &plan.segments[0];
    assert_eq!(only.layers, 0..6);
    assert_eq!(only.reference.nodes, (0..6).collect::<Vec<_>>());
    assert_eq!(only.reference.outputs.len(), 6);
    assert_eq!(plan.total_bytes, 2 * 6 * 4096);
}

#[test]
fn a_budget_splits_the_run_and_frees_each_value_after_its_last_use() {
    let budget = 40 * 1024;
    let plan = planned(Some(budget));
    assert!(plan.segments.len() >= 3, "{:?}", plan.segments);
    assert!(plan.peak_bytes <= budget, "{} > {budget}", plan.peak_bytes);
    let mut freed = Vec::new();
    for (k, segment) in plan.segments.iter().enumerate() {
        for part in [&segment.reference, &segment.target] {
            // Every node runs once, in the segment of its layer.
            assert_eq!(part.nodes, segment.layers.clone().collect::<Vec<_>>());
            for layer in segment.layers.clone() {
                assert!(part.outputs.contains(&format!("v{layer}")), "compared here");
            }
        }
        let has_v0 = segment.layers.contains(&0);
        let has_add = segment.layers.contains(&5);
        if has_v0 && !has_add {
            assert!(segment.reference.outputs.contains(&"v0".to_string()));
            assert!(
                !segment.reference.free.contains(&"v0".to_string()),
                "read later"
            );
        }
        if segment.reference.free.contains(&"v0".to_string()) {
            assert!(
                has_add,
                "`v0` is held until the skip connection reads it (segment {k})"
            );
        }
        freed.extend(segment.reference.free.iter().cloned());
    }
    freed.sort();
    let all: Vec<String> = (0..6).map(|i| format!("v{i}")).collect();
    assert_eq!(freed, all, "each value freed exactly once");
}

#[test]
fn a_node_larger_than_the_budget_still_runs_alone() {
    let plan = planned(Some(1));
    assert_eq!(plan.segments.len(), 6);
}

#[test]
fn a_local_re_run_fed_from_a_value_the_reference_makes_later_shares_its_segment() {
    // Two files may order their nodes differently: the target's group for layer 2 reads the
    // value the reference produces at position 4 (ViT's scale Cast after its Div, in a
    // float16 file against its float32 one). A boundary between them would leave the re-run
    // without it, so a segmented run would differ from the whole one.
    let plan = planned_with(Some(1), &[(2, &["v4"])]);
    let holding = plan
        .segments
        .iter()
        .find(|s| s.layers.contains(&2))
        .expect("layer 2 is compared");
    assert!(holding.layers.contains(&4), "{:?}", plan.segments);
    assert!(holding.reference.outputs.contains(&"v4".to_string()));
    assert_eq!(plan.segments.len(), 4, "still split wherever it can be");
}

/// Facing a reference that hands its values over (PyTorch), the target's runtime loads each
/// segment's weights with its nodes: a budget that fits the values alone is cut finer once the
/// weights count, and the figures say so; a computing reference leaves them out (both runtimes
/// hold their own).
#[test]
fn facing_values_handed_over_a_segment_costs_the_weights_its_nodes_load() {
    let (index, inputs) = chain();
    let names: Vec<String> = (0..6).map(|i| format!("v{i}")).collect();
    let none: Vec<Vec<String>> = vec![Vec::new(); 6];
    let layers: Vec<PlannedLayer<'_>> = names
        .iter()
        .zip(&none)
        .map(|(n, l)| PlannedLayer {
            reference: n,
            target: Some(n),
            local_inputs: l,
        })
        .collect();
    let sizes = value_sizes(&index, &inputs);
    let pushed = PlanSide {
        graph: None,
        sizes: sizes.clone(),
        weights: 0,
        step_weights: Vec::new(),
    };
    // 16 KiB of weights read by each node
    let target = |step_weights: Vec<u64>| PlanSide {
        graph: Some(&index),
        sizes: sizes.clone(),
        weights: 6 * 16384,
        step_weights,
    };
    let budget = Some(40 * 1024);
    let light = plan(&pushed, &target(Vec::new()), &layers, budget);
    let heavy = plan(&pushed, &target(vec![16384; 6]), &layers, budget);
    assert!(!light.weights_counted && heavy.weights_counted);
    assert!(
        heavy.segments.len() > light.segments.len(),
        "{} segments with the weights, {} without",
        heavy.segments.len(),
        light.segments.len()
    );
    assert!(heavy.peak_bytes <= 40 * 1024, "{}", heavy.peak_bytes);
    let computing = target(vec![16384; 6]);
    let both = plan(&computing, &target(vec![16384; 6]), &layers, budget);
    assert!(!both.weights_counted);
}
