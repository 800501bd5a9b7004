//! Module calls → ONNX values, on small graphs shaped like each exporter's output.

use layerdiff_onnx::{
    GraphProto, LayerCall, LayerMapping, NodeProto, StringStringEntryProto, ValueInfoProto,
    map_layers,
};

fn node(name: &str, op: &str, inputs: &[&str], output: &str, meta: &[(&str, &str)]) -> NodeProto {
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

fn graph(nodes: Vec<NodeProto>, output: &str) -> GraphProto {
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

fn call(name: &str, module: &str, k: usize, input_from: Option<usize>) -> LayerCall {
    LayerCall {
        name: name.into(),
        module: module.into(),
        call_index: k,
        identity: false,
        input_from,
        shape: vec![1, 4],
        dtype: layerdiff_core::DType::F32,
        fingerprint: None,
        op: None,
    }
}

fn value(m: &LayerMapping) -> Option<&str> {
    match m {
        LayerMapping::Mapped { value, .. } => Some(value),
        LayerMapping::Unmapped { .. } => None,
    }
}

fn reason(m: &LayerMapping) -> &str {
    match m {
        LayerMapping::Unmapped { reason } => reason,
        LayerMapping::Mapped { note, .. } => note.as_deref().unwrap_or(""),
    }
}

#[test]
fn legacy_conv_bn_fold_maps_bn_to_the_conv_value_and_repeated_calls_in_order() {
    // conv1 (BN folded in) → relu → fc → relu (second call)
    let g = graph(
        vec![
            node(
                "/conv1/Conv",
                "Conv",
                &["x", "w"],
                "/conv1/Conv_output_0",
                &[],
            ),
            node(
                "/relu/Relu",
                "Relu",
                &["/conv1/Conv_output_0"],
                "/relu/Relu_output_0",
                &[],
            ),
            node(
                "/fc/Gemm",
                "Gemm",
                &["/relu/Relu_output_0", "w2"],
                "/fc/Gemm_output_0",
                &[],
            ),
            node("/relu_1/Relu", "Relu", &["/fc/Gemm_output_0"], "out", &[]),
        ],
        "out",
    );
    let layers = [
        call("conv1", "conv1", 0, None),
        call("bn1", "bn1", 0, Some(0)),
        call("relu", "relu", 0, Some(1)),
        call("fc", "fc", 0, Some(2)),
        call("relu#2", "relu", 1, Some(3)),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(value(&m[0]), None);
    assert!(
        reason(&m[0]).contains("fused with `bn1`"),
        "{}",
        reason(&m[0])
    );
    assert_eq!(value(&m[1]), Some("/conv1/Conv_output_0"));
    assert_eq!(value(&m[2]), Some("/relu/Relu_output_0"));
    assert_eq!(value(&m[4]), Some("out"));
}

#[test]
fn dynamo_fused_conv_carries_the_bn_scope() {
    let bn_meta = [
        (
            "pkg.torch.onnx.name_scopes",
            "['', 'bn1', '_native_batch_norm']",
        ),
        (
            "pkg.onnxscript.rewriter.rule_name",
            "RemoveOptionalBiasFromConv, FuseBatchNormIntoConv",
        ),
    ];
    let g = graph(
        vec![
            node("node_Conv_1", "Conv", &["x", "w"], "getitem", &bn_meta),
            node(
                "node_relu",
                "Relu",
                &["getitem"],
                "relu",
                &[("pkg.torch.onnx.name_scopes", "['', 'relu', 'relu']")],
            ),
        ],
        "relu",
    );
    let layers = [
        call("conv1", "conv1", 0, None),
        call("bn1", "bn1", 0, Some(0)),
        call("relu", "relu", 0, Some(1)),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(value(&m[0]), None);
    assert!(
        reason(&m[0]).contains("fused into `bn1` at export (FuseBatchNormIntoConv)"),
        "{}",
        reason(&m[0])
    );
    assert_eq!(value(&m[1]), Some("getitem"));
    assert_eq!(value(&m[2]), Some("relu"));
}

#[test]
fn identity_layers_compare_against_their_feeder_and_strangers_are_explained() {
    let g = graph(vec![node("/fc/Gemm", "Gemm", &["x", "w"], "y", &[])], "y");
    let mut drop = call("drop", "drop", 0, Some(0));
    drop.identity = true;
    let layers = [
        call("fc", "fc", 0, None),
        drop,
        call("ghost", "ghost", 0, None),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(value(&m[1]), Some("y"));
    assert!(reason(&m[1]).contains("identity at inference"));
    assert_eq!(reason(&m[2]), "no ONNX node carries this module's scope");
}

#[test]
fn a_constant_filed_under_a_module_is_not_its_output() {
    // The legacy exporter puts a Constant read by later Gathers into `conv_proj`'s scope, before
    // the Conv: the layer is the Conv's float value, not the int64 constant.
    let mut constant = node("/conv_proj/Constant", "Constant", &[], "/conv_proj/c", &[]);
    constant.attribute.push(layerdiff_onnx::AttributeProto {
        name: Some("value".into()),
        t: Some(layerdiff_onnx::TensorProto {
            data_type: Some(7),
            ..Default::default()
        }),
        ..Default::default()
    });
    let g = graph(
        vec![
            constant,
            node("/conv_proj/Conv", "Conv", &["x", "w"], "/conv_proj/y", &[]),
            node(
                "/Gather",
                "Gather",
                &["/conv_proj/y", "/conv_proj/c"],
                "out",
                &[],
            ),
        ],
        "out",
    );
    let m = map_layers(&g, &[call("conv_proj", "conv_proj", 0, None)]);
    assert_eq!(value(&m[0]), Some("/conv_proj/y"));
}

fn function(name: &str, owner: &str, op: &str, k: usize) -> LayerCall {
    LayerCall {
        module: owner.into(),
        op: Some(op.into()),
        ..call(name, owner, k, None)
    }
}

fn dynamo(scopes: &str, aten: &str) -> [(&'static str, String); 2] {
    [
        ("pkg.torch.onnx.name_scopes", scopes.to_string()),
        (
            "pkg.torch.onnx.class_hierarchy",
            format!("['Model', 'Block', '{aten}']"),
        ),
    ]
}

fn dynamo_node(
    name: &str,
    op: &str,
    inputs: &[&str],
    output: &str,
    meta: &[(&str, String)],
) -> NodeProto {
    let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (*k, v.as_str())).collect();
    node(name, op, inputs, output, &meta)
}

#[test]
fn a_residual_add_between_modules_gets_its_row_with_either_exporter() {
    // block.conv → (block's own) add with x → block.relu
    let dynamo_graph = graph(
        vec![
            dynamo_node(
                "node_conv",
                "Conv",
                &["x", "w"],
                "conv2d",
                &dynamo(
                    "['', 'block', 'block.conv', 'conv2d']",
                    "aten.conv2d.default",
                ),
            ),
            dynamo_node(
                "node_add_3",
                "Add",
                &["conv2d", "x"],
                "add_3",
                &dynamo("['', 'block', 'add_3']", "aten.add.Tensor"),
            ),
            dynamo_node(
                "node_relu",
                "Relu",
                &["add_3"],
                "relu",
                &dynamo("['', 'block', 'block.relu', 'relu']", "aten.relu.default"),
            ),
        ],
        "relu",
    );
    let legacy_graph = graph(
        vec![
            node(
                "/block/conv/Conv",
                "Conv",
                &["x", "w"],
                "/block/conv/Conv_output_0",
                &[],
            ),
            node(
                "/block/Add",
                "Add",
                &["/block/conv/Conv_output_0", "x"],
                "/block/Add_output_0",
                &[],
            ),
            node(
                "/block/relu/Relu",
                "Relu",
                &["/block/Add_output_0"],
                "out",
                &[],
            ),
        ],
        "out",
    );
    let layers = [
        call("block.conv", "block.conv", 0, None),
        function("block:add", "block", "add", 0),
        call("block.relu", "block.relu", 0, Some(1)),
    ];
    let m = map_layers(&dynamo_graph, &layers);
    assert_eq!(value(&m[1]), Some("add_3"));
    assert_eq!(value(&m[2]), Some("relu"));
    let m = map_layers(&legacy_graph, &layers);
    assert_eq!(value(&m[1]), Some("/block/Add_output_0"));
    assert_eq!(value(&m[0]), Some("/block/conv/Conv_output_0"));
}

#[test]
fn functional_calls_whose_counts_differ_are_not_paired_by_position() {
    // PyTorch made two adds in `block`; the export kept one (it folded the other).
    let g = graph(
        vec![
            node("/block/Add", "Add", &["x", "x"], "/block/Add_output_0", &[]),
            node(
                "/block/relu/Relu",
                "Relu",
                &["/block/Add_output_0"],
                "out",
                &[],
            ),
        ],
        "out",
    );
    let layers = [
        function("block:add", "block", "add", 0),
        function("block:add#2", "block", "add", 1),
        call("block.relu", "block.relu", 0, Some(1)),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!((value(&m[0]), value(&m[1])), (None, None));
    assert!(
        reason(&m[0]).contains("PyTorch made 2 `add` call(s) in `block` and the export has 1"),
        "{}",
        reason(&m[0])
    );
    assert_eq!(value(&m[2]), Some("out"));
}

#[test]
fn an_aten_op_lowered_to_several_nodes_is_the_value_named_after_the_call() {
    // aten.gelu lowered to Mul/Erf/…: every node carries the call's scope; its value is `gelu`.
    let scopes = "['', 'block', 'gelu']";
    let g = graph(
        vec![
            dynamo_node(
                "n1",
                "Div",
                &["x", "c"],
                "val_1",
                &dynamo(scopes, "aten.gelu.default"),
            ),
            dynamo_node(
                "n2",
                "Erf",
                &["val_1"],
                "val_2",
                &dynamo(scopes, "aten.gelu.default"),
            ),
            dynamo_node(
                "n3",
                "Mul",
                &["x", "val_2"],
                "gelu",
                &dynamo(scopes, "aten.gelu.default"),
            ),
            dynamo_node(
                "n4",
                "Relu",
                &["gelu"],
                "out",
                &dynamo("['', 'block', 'block.act', 'relu']", "aten.relu.default"),
            ),
        ],
        "out",
    );
    let layers = [
        function("block:gelu", "block", "gelu", 0),
        call("block.act", "block.act", 0, None),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(value(&m[0]), Some("gelu"));
}
