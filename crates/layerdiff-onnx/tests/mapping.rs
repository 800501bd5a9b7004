//! Module calls → ONNX values, on small graphs shaped like each exporter's output.

use layerdiff_onnx::{
    CallGroup, GraphProto, LayerCall, LayerMapping, NodeProto, ScopeMapping,
    StringStringEntryProto, ValueInfoProto, map_layers,
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
        constant: false,
        feeds_output: true,
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
fn a_layer_whose_output_no_model_output_needs_is_explained() {
    // BERT's pooler when only the hidden states are returned: the export drops it.
    let g = graph(
        vec![node("/encoder/Add", "Add", &["x", "x"], "out", &[])],
        "out",
    );
    let layers = [
        call("encoder", "encoder", 0, None),
        LayerCall {
            feeds_output: false,
            ..call("pooler.dense", "pooler.dense", 0, Some(0))
        },
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(value(&m[0]), Some("out"), "{}", reason(&m[0]));
    assert_eq!(value(&m[1]), None);
    assert!(
        reason(&m[1]).starts_with("its output reaches none of the model's outputs"),
        "{}",
        reason(&m[1])
    );
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
fn an_identity_that_read_its_feeder_reshaped_is_not_compared_with_the_feeder() {
    // timm's PatchEmbed: `norm` (an Identity) reads the Conv's output flattened and
    // transposed by code between them; the Conv's value has another shape than what the
    // Identity returned, so it is not the Identity's value (it was a shape_mismatch "defect").
    let g = graph(vec![node("/proj/Conv", "Conv", &["x", "w"], "y", &[])], "y");
    let mut proj = call("proj", "proj", 0, None);
    proj.shape = vec![1, 192, 6, 6];
    let mut norm = call("norm", "norm", 0, Some(0));
    norm.identity = true;
    norm.shape = vec![1, 36, 192];
    let m = map_layers(&g, &[proj, norm]);
    assert_eq!(value(&m[1]), None);
    assert!(
        reason(&m[1]).contains("reshaped between them"),
        "{}",
        reason(&m[1])
    );
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

#[test]
fn a_shape_computation_in_a_modules_scope_does_not_shift_its_calls() {
    // Legacy Llama: the attention's scope holds PyTorch's two rotary `mul`s and a `Mul` of a
    // shape computation (ConstantOfShape × constant) between them.
    let g = graph(
        vec![
            node("/attn/Mul", "Mul", &["x", "cos"], "/attn/Mul_output_0", &[]),
            node("/attn/Shape", "Shape", &["x"], "/attn/Shape_output_0", &[]),
            node(
                "/attn/ConstantOfShape",
                "ConstantOfShape",
                &["/attn/Shape_output_0"],
                "/attn/ConstantOfShape_output_0",
                &[],
            ),
            node(
                "/attn/Mul_1",
                "Mul",
                &["/attn/ConstantOfShape_output_0", "c"],
                "/attn/Mul_1_output_0",
                &[],
            ),
            node(
                "/attn/Mul_2",
                "Mul",
                &["/attn/Mul_output_0", "sin"],
                "out",
                &[],
            ),
        ],
        "out",
    );
    let layers = [
        function("attn:mul", "attn", "mul", 0),
        function("attn:mul#2", "attn", "mul", 1),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(
        value(&m[0]),
        Some("/attn/Mul_output_0"),
        "{}",
        reason(&m[0])
    );
    assert_eq!(value(&m[1]), Some("out"), "{}", reason(&m[1]));
}

#[test]
fn calls_from_constants_only_are_folded_and_a_call_that_changed_nothing_reads_its_input() {
    // T5 through dynamo: the relative positions' `mul` is computed from constants (folded),
    // the scores' `* 1.0` after the matmul returned its input (dropped); neither has a node.
    let g = graph(
        vec![
            node("/attn/MatMul", "MatMul", &["x", "x"], "scores", &[]),
            node("/attn/Add", "Add", &["scores", "bias"], "out", &[]),
        ],
        "out",
    );
    let layers = [
        LayerCall {
            constant: true,
            ..function("attn:mul", "attn", "mul", 0)
        },
        function("attn:matmul", "attn", "matmul", 0),
        LayerCall {
            identity: true,
            input_from: Some(1),
            ..function("attn:mul#2", "attn", "mul", 1)
        },
        LayerCall {
            constant: true,
            ..call(
                "attn.relative_attention_bias",
                "attn.relative_attention_bias",
                0,
                None,
            )
        },
        function("attn:add", "attn", "add", 0),
    ];
    let m = map_layers(&g, &layers);
    assert!(
        reason(&m[0]).starts_with("computed from constants only"),
        "{}",
        reason(&m[0])
    );
    assert_eq!(value(&m[1]), Some("scores"));
    assert_eq!(value(&m[2]), Some("scores"), "{}", reason(&m[2]));
    assert!(reason(&m[2]).contains("compared against the value of `attn:matmul`"));
    assert_eq!(value(&m[3]), None);
    assert!(
        reason(&m[3]).starts_with("computed from constants only"),
        "{}",
        reason(&m[3])
    );
    assert_eq!(value(&m[4]), Some("out"));
}

#[test]
fn calls_the_export_outnumbers_are_left_to_pairing_by_value_within_their_module() {
    // The export adds the attention mask as a second `Add` that PyTorch skipped.
    let g = graph(
        vec![
            node(
                "/attn/Add",
                "Add",
                &["x", "bias"],
                "/attn/Add_output_0",
                &[],
            ),
            node(
                "/attn/Add_1",
                "Add",
                &["/attn/Add_output_0", "mask"],
                "out",
                &[],
            ),
        ],
        "out",
    );
    let layers = [function("attn:add", "attn", "add", 0)];
    let scoped = ScopeMapping::new(&g, &layers);
    let request = scoped.request().expect("a request").clone();
    assert_eq!(
        request.calls,
        vec![CallGroup {
            layers: vec![0],
            values: vec!["/attn/Add_output_0".into(), "out".into()],
        }]
    );
    assert_eq!(request.wanted(), vec![0]);
    let found = ScopeMapping::new(&g, &layers).finish(
        &g,
        &layers,
        vec![Ok((
            "/attn/Add_output_0".into(),
            "matched by values".into(),
        ))],
    );
    assert_eq!(value(&found[0]), Some("/attn/Add_output_0"));
    let missed = scoped.finish(&g, &layers, vec![Err("none holds its numbers".into())]);
    assert!(
        reason(&missed[0]).starts_with("PyTorch made 1 `add` call(s) in `attn`")
            && reason(&missed[0]).ends_with("; none holds its numbers"),
        "{}",
        reason(&missed[0])
    );
}
