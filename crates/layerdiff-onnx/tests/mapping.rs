//! Module calls → ONNX values, on small graphs shaped like each exporter's output.

mod common;
use common::*;

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

#[test]
fn nodes_a_quantizer_rewrote_without_scope_pair_by_their_input_or_their_place() {
    // ONNX Runtime's MatMulNBitsQuantizer replaces each MatMul, keeping its value names but not
    // its scope: q and k read the norm's value; o reads a value no layer is paired with.
    let mut g = graph(
        vec![
            node("/norm/Mul", "Mul", &["x", "x"], "n", &[]),
            node("q_Q4", "MatMulNBits", &["n", "wq", "sq"], "q", &[]),
            node("k_Q4", "MatMulNBits", &["n", "wk", "sk"], "k", &[]),
            node("/attn/Add", "Add", &["q", "k"], "a", &[]),
            node("/attn/Reshape", "Reshape", &["a", "shape"], "a2", &[]),
            node("o_Q4", "MatMulNBits", &["a2", "wo", "so"], "o", &[]),
            node("/head/Relu", "Relu", &["o"], "out", &[]),
        ],
        "out",
    );
    // stored weights (packed blocks, 3-D) and their scales (1-D), which alone are no weight
    for (name, dims) in [
        ("wq", vec![4, 1, 16]),
        ("sq", vec![4]),
        ("wk", vec![4, 1, 16]),
        ("sk", vec![4]),
        ("wo", vec![4, 1, 16]),
        ("so", vec![4]),
        ("shape", vec![2]),
    ] {
        g.initializer.push(layerdiff_onnx::TensorProto {
            name: Some(name.into()),
            dims,
            ..Default::default()
        });
    }
    let layers = [
        call("norm", "norm", 0, None),
        call("q", "q", 0, Some(0)),
        call("k", "k", 0, Some(0)),
        call("attn", "attn", 0, Some(1)),
        call("o", "o", 0, None), // a copy came between: no paired input
        call("head", "head", 0, Some(4)),
    ];
    let m = map_layers(&g, &layers);
    let values: Vec<_> = m.iter().map(value).collect();
    assert_eq!(
        values,
        [
            Some("n"),
            Some("q"),
            Some("k"),
            Some("a2"),
            Some("o"),
            Some("out")
        ]
    );
    assert!(
        reason(&m[1])
            .starts_with("paired by its input: the MatMulNBits node `q_Q4` reads `norm`'s value")
    );
    assert!(
        reason(&m[4])
            .starts_with("paired by its place: the one MatMulNBits node between `attn` and `head`"),
        "{}",
        reason(&m[4])
    );
}

#[test]
fn a_module_output_a_quantizer_dequantizes_after_it_is_the_dequantized_value() {
    // ONNX Runtime's dynamic quantizer stores an embedding table in int8: the module's Gather
    // now writes int8 and an unscoped DequantizeLinear gives the float value the model's
    // readers take. The embedding read "unmapped: the graph holds 1 output(s) for that module,
    // 0 of them a float value", and its quantization was blamed on the next layer.
    fn scoped(s: &str) -> [(&str, &str); 1] {
        [("pkg.torch.onnx.name_scopes", s)]
    }
    let mut g = graph(
        vec![
            node(
                "node_embedding",
                "Gather",
                &["table_quantized", "x"],
                "embedding_quantized",
                &scoped("['', 'embed', 'embedding']"),
            ),
            node(
                "embedding_DequantizeLinear",
                "DequantizeLinear",
                &["embedding_quantized", "scale", "zero"],
                "embedding",
                &[],
            ),
            node(
                "node_mul",
                "Mul",
                &["embedding", "embedding"],
                "out",
                &scoped("['', 'norm', 'mul']"),
            ),
        ],
        "out",
    );
    let typed = layerdiff_onnx::tensor_value_info;
    g.value_info = vec![
        typed("embedding_quantized", 3, &[1, 4]),
        typed("embedding", 1, &[1, 4]),
    ];
    let layers = [
        call("embed", "embed", 0, None),
        call("norm", "norm", 0, Some(0)),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(value(&m[0]), Some("embedding"), "{:?}", m[0]);
    assert_eq!(value(&m[1]), Some("out"));
}

#[test]
fn a_dynamic_int8_projection_pairs_by_its_input_past_the_integer_kernel() {
    // ONNX Runtime's dynamic quantizer: the norm's value is put on an integer grid once
    // (DynamicQuantizeLinear), each projection is a MatMulInteger on its int8 weight, then a
    // Cast and a Mul by the scales give the float value back under the original name; the
    // quantizer sorted the graph again, so k's nodes come before q's. They were paired by value
    // only, so a projection whose weight scale was off could not be paired at all, and the
    // fault went unseen ("rounding only").
    let mut g = graph(
        vec![
            node("/norm/Mul", "Mul", &["x", "x"], "n", &[]),
            node(
                "n_quant",
                "DynamicQuantizeLinear",
                &["n"],
                "n_quantized",
                &[],
            ),
        ],
        "out",
    );
    for (v, w) in [("linear_1", "wk"), ("linear", "wq")] {
        let int = format!("{v}_int");
        let cast = format!("{v}_cast");
        g.node.extend([
            node(
                &format!("{v}_quant"),
                "MatMulInteger",
                &["n_quantized", &format!("{w}_quantized")],
                &int,
                &[],
            ),
            node(&format!("{v}_to_float"), "Cast", &[&int], &cast, &[]),
            node(
                &format!("{v}_scale_mul"),
                "Mul",
                &[&cast, &format!("{w}_scale")],
                v,
                &[],
            ),
        ]);
    }
    g.node.push(node(
        "/attn/Add",
        "Add",
        &["linear", "linear_1"],
        "out",
        &[],
    ));
    for name in ["wq_quantized", "wk_quantized"] {
        g.initializer.push(layerdiff_onnx::TensorProto {
            name: Some(name.into()),
            dims: vec![4, 4],
            data_type: Some(3),
            ..Default::default()
        });
    }
    let typed = layerdiff_onnx::tensor_value_info;
    g.value_info = vec![
        typed("linear_int", 6, &[1, 4]),
        typed("linear_1_int", 6, &[1, 4]),
        typed("linear", 1, &[1, 4]),
        typed("linear_1", 1, &[1, 4]),
    ];
    let layers = [
        call("norm", "norm", 0, None),
        call("q", "q", 0, Some(0)),
        call("k", "k", 0, Some(0)),
        call("attn", "attn", 0, Some(1)),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(value(&m[1]), Some("linear"), "{:?}", m[1]);
    assert_eq!(value(&m[2]), Some("linear_1"), "{:?}", m[2]);
    assert!(
        reason(&m[1]).starts_with("paired by its input: the Mul node `linear_scale_mul`"),
        "{}",
        reason(&m[1])
    );
}

#[test]
fn an_optimizers_fused_node_pairs_with_the_module_whose_output_it_writes() {
    // ONNX Runtime's offline optimizer on a legacy export: conv1 → relu fused into one node
    // that keeps the Conv's name and writes the Relu's output, and fc's MatMul + Add into a
    // Gemm named `…/MatMul/MatMulAddFusion`. The fused value is relu's output (conv1 once
    // took it, and a clean file read as a defect at every such layer); fc's node is still fc's.
    let g = graph(
        vec![
            node(
                "/conv1/Conv",
                "FusedConv",
                &["x", "w"],
                "/relu/Relu_output_0",
                &[],
            ),
            node(
                "/fc/MatMul/MatMulAddFusion",
                "Gemm",
                &["/relu/Relu_output_0", "w2", "b2"],
                "out",
                &[],
            ),
        ],
        "out",
    );
    let layers = [
        call("conv1", "conv1", 0, None),
        call("relu", "relu", 0, Some(0)),
        call("fc", "fc", 0, Some(1)),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(value(&m[0]), None, "{}", reason(&m[0]));
    assert_eq!(
        value(&m[1]),
        Some("/relu/Relu_output_0"),
        "{}",
        reason(&m[1])
    );
    assert_eq!(value(&m[2]), Some("out"), "{}", reason(&m[2]));
}

#[test]
fn a_relu_a_quantizer_removed_leaves_the_conv_its_value() {
    // ONNX Runtime's static quantizer removes the ReLU its uint8 range clips as well and
    // keeps the ReLU's output name on the Conv's value, which only a QuantizeLinear reads:
    // that value is the Conv's (here the BatchNorm's folded into it), not the ReLU's.
    let g = graph(
        vec![
            node(
                "/conv1/Conv",
                "Conv",
                &["x", "w"],
                "/relu/Relu_output_0",
                &[],
            ),
            node(
                "/relu/Relu_output_0_QuantizeLinear",
                "QuantizeLinear",
                &["/relu/Relu_output_0", "s", "z"],
                "q",
                &[],
            ),
            node(
                "/relu/Relu_output_0_DequantizeLinear",
                "DequantizeLinear",
                &["q", "s", "z"],
                "dq",
                &[],
            ),
            node("/fc/Gemm", "Gemm", &["dq", "w2"], "out", &[]),
        ],
        "out",
    );
    let layers = [
        call("conv1", "conv1", 0, None),
        call("bn1", "bn1", 0, Some(0)),
        call("relu", "relu", 0, Some(1)),
        call("fc", "fc", 0, Some(2)),
    ];
    let m = map_layers(&g, &layers);
    assert_eq!(
        value(&m[1]),
        Some("/relu/Relu_output_0"),
        "{}",
        reason(&m[1])
    );
    assert_eq!(value(&m[2]), Some("dq"), "{}", reason(&m[2]));
}
