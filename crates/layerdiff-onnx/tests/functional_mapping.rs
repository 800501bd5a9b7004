//! Functional calls between modules (`add`, `matmul`, …) → ONNX values, with either exporter:
//! by position, from constants only, unchanged, or by value within their module.

mod common;
use common::*;
use layerdiff_onnx::{CallGroup, ScopeMapping};

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

#[test]
fn calls_pair_in_the_order_pytorch_made_them_not_the_order_a_quantizer_sorted_the_nodes() {
    // A decoder's attention: `block` concatenates twice (`cat` then `cat_1`); ONNX Runtime's
    // dynamic quantizer sorted the graph again and wrote `cat_1`'s node first. Paired by the
    // file's order, the first call read the second's value (a GQA decoder's cache, of another
    // shape: 'shape_mismatch' on a clean int8 file).
    let cat = |name: &str, input: &str| {
        dynamo_node(
            &format!("node_{name}"),
            "Concat",
            &[input, "x"],
            name,
            &dynamo(&format!("['', 'block', '{name}']"), "aten.cat.default"),
        )
    };
    let sorted = graph(vec![cat("cat_1", "x"), cat("cat", "x")], "cat_1");
    let layers = [
        function("block:cat", "block", "cat", 0),
        function("block:cat#2", "block", "cat", 1),
    ];
    let m = map_layers(&sorted, &layers);
    assert_eq!(value(&m[0]), Some("cat"), "{:?}", m[0]);
    assert_eq!(value(&m[1]), Some("cat_1"), "{:?}", m[1]);
}
