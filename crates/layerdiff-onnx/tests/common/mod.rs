//! Small graphs shaped like each exporter's output, and layer calls to map onto them, shared by
//! the mapping tests.
#![allow(dead_code)] // each test file uses some of them

pub use layerdiff_onnx::{
    GraphProto, LayerCall, LayerMapping, NodeProto, StringStringEntryProto, ValueInfoProto,
    map_layers,
};

pub fn node(
    name: &str,
    op: &str,
    inputs: &[&str],
    output: &str,
    meta: &[(&str, &str)],
) -> NodeProto {
    NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        metadata_props: meta
            .iter()
            .map(|(k, v)| StringStringEntryProto {
                key: Some(k.to_string()),
                value: Some(v.to_string()),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn graph(nodes: Vec<NodeProto>, output: &str) -> GraphProto {
    GraphProto {
        node: nodes,
        input: vec![ValueInfoProto {
            name: Some("x".into()),
            ..Default::default()
        }],
        output: vec![ValueInfoProto {
            name: Some(output.into()),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub fn call(name: &str, module: &str, k: usize, input_from: Option<usize>) -> LayerCall {
    LayerCall {
        name: name.into(),
        module: module.into(),
        call_index: k,
        identity: false,
        constant: false,
        feeds_output: true,
        input_from,
        shape: vec![1, 4],
        dtype: layerdiff_core::DType::F32,
        fingerprint: None,
        op: None,
    }
}

pub fn value(m: &LayerMapping) -> Option<&str> {
    match m {
        LayerMapping::Mapped { value, .. } => Some(value),
        LayerMapping::Unmapped { .. } => None,
    }
}

pub fn reason(m: &LayerMapping) -> &str {
    match m {
        LayerMapping::Unmapped { reason } => reason,
        LayerMapping::Mapped { note, .. } => note.as_deref().unwrap_or(""),
    }
}
