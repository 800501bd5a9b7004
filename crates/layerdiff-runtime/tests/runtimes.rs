//! Both runtimes on a hand-built graph: intermediate values exposed and returned in our tensors.
//! The ONNX Runtime tests need the onnxruntime wheel in the repository's .venv (as `make test`
//! sets up) and are skipped without it; tract needs nothing.

use std::path::PathBuf;

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::{
    GraphProto, Model, ModelProto, NodeProto, OperatorSetIdProto, expose_values, extract_nodes,
    tensor_value_info,
};
use layerdiff_runtime::{OptLevel, OrtRuntime, Runtime, TractRuntime};
use prost::Message;

fn library() -> Option<PathBuf> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
    std::fs::read_dir(venv).ok()?.flatten().find_map(|e| {
        let capi = e.path().join("site-packages/onnxruntime/capi");
        std::fs::read_dir(capi)
            .ok()?
            .flatten()
            .map(|f| f.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libonnxruntime.so."))
            })
    })
}

/// A model of one graph, opset 18, as a test builds it.
fn model(name: &str, graph: GraphProto) -> Model {
    let proto = ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(18),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            ..graph
        }),
        ..Default::default()
    };
    Model::from_bytes(&proto.encode_to_vec(), name.as_ref(), None).expect("valid model")
}

fn add_relu_model() -> Model {
    let node = |op: &str, inputs: &[&str], out: &str| NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("{op}_node")),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        ..Default::default()
    };
    model(
        "add_relu.onnx",
        GraphProto {
            node: vec![
                node("Add", &["a", "b"], "sum"),
                node("Relu", &["sum"], "out"),
            ],
            input: vec![
                tensor_value_info("a", 1, &[4]),
                tensor_value_info("b", 1, &[4]),
            ],
            output: vec![tensor_value_info("out", 1, &[4])],
            ..Default::default()
        },
    )
}

fn f32_tensor(values: &[f32]) -> Tensor {
    Tensor::new(
        "t",
        DType::F32,
        vec![values.len()],
        values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
    .unwrap()
}

#[test]
fn exposed_intermediate_values_come_back_exactly() {
    let Some(lib) = library() else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    let mut model = add_relu_model();
    expose_values(&mut model, &["sum"]).unwrap();
    let ort = OrtRuntime::new(Some(&lib), OptLevel::Disable).unwrap();
    let inputs = vec![
        ("a".to_string(), f32_tensor(&[1.0, -2.0, 3.0, -4.0])),
        ("b".to_string(), f32_tensor(&[0.5; 4])),
    ];
    let out = ort
        .run(&model, &inputs, &["sum".into(), "out".into()])
        .unwrap();
    assert_eq!(out[0].1, f32_tensor(&[1.5, -1.5, 3.5, -3.5]));
    assert_eq!(out[1].1, f32_tensor(&[1.5, 0.0, 3.5, 0.0]));
    assert!(ort.detail().contains("graph optimizations: disable"));
}

#[test]
fn a_missing_input_is_named() {
    let Some(lib) = library() else { return };
    let ort = OrtRuntime::new(Some(&lib), OptLevel::Disable).unwrap();
    let err = ort
        .run(
            &add_relu_model(),
            &[("a".into(), f32_tensor(&[1.0; 4]))],
            &["out".into()],
        )
        .unwrap_err();
    assert!(err.to_string().contains("needs input `b`"), "{err}");
}

#[test]
fn tract_returns_exposed_values_too() {
    let mut model = add_relu_model();
    expose_values(&mut model, &["sum"]).unwrap();
    let inputs = vec![
        ("a".to_string(), f32_tensor(&[1.0, -2.0, 3.0, -4.0])),
        ("b".to_string(), f32_tensor(&[0.5; 4])),
    ];
    let out = TractRuntime
        .run(&model, &inputs, &["sum".into(), "out".into()])
        .unwrap();
    assert_eq!(
        out[0],
        ("sum".to_string(), f32_tensor(&[1.5, -1.5, 3.5, -3.5]))
    );
    assert_eq!(
        out[1],
        ("out".to_string(), f32_tensor(&[1.5, 0.0, 3.5, 0.0]))
    );
}

#[test]
fn tract_names_a_missing_input() {
    let err = TractRuntime
        .run(
            &add_relu_model(),
            &[("a".into(), f32_tensor(&[1.0; 4]))],
            &["out".into()],
        )
        .unwrap_err();
    assert!(err.to_string().contains("needs input `b`"), "{err}");
}

#[test]
fn an_extracted_node_reruns_on_given_values_on_both_runtimes() {
    // The Relu alone, fed a `sum` we choose: what local error is built on.
    let model = add_relu_model();
    let feeds = vec![("sum".to_string(), f32_tensor(&[-1.0, 2.0, -3.0, 4.0]))];
    let relu = extract_nodes(&model, &[1], &[], &feeds).unwrap();
    assert_eq!(relu.graph().input.len(), 1);
    let expected = f32_tensor(&[0.0, 2.0, 0.0, 4.0]);
    let out = TractRuntime.run(&relu, &feeds, &["out".into()]).unwrap();
    assert_eq!(out[0].1, expected);
    if let Some(lib) = library() {
        let ort = OrtRuntime::new(Some(&lib), OptLevel::Disable).unwrap();
        assert_eq!(
            ort.run(&relu, &feeds, &["out".into()]).unwrap()[0].1,
            expected
        );
    }
    let err = extract_nodes(&model, &[0], &["out".into()], &[]).unwrap_err();
    assert!(
        err.to_string()
            .contains("not produced by the extracted nodes"),
        "{err}"
    );
}

#[test]
fn the_profiler_says_which_provider_ran_each_node() {
    let Some(lib) = library() else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    let ort = OrtRuntime::new(Some(&lib), OptLevel::Disable).unwrap();
    let inputs = vec![
        ("a".to_string(), f32_tensor(&[1.0, -2.0, 3.0, -4.0])),
        ("b".to_string(), f32_tensor(&[0.5; 4])),
    ];
    let placement = ort.node_placement(&add_relu_model(), &inputs).unwrap();
    assert_eq!(placement, vec![("CPUExecutionProvider".to_string(), 2)]);
}

/// A float64 Conv of group 2, strides [2, 1] and dilations [1, 2] padded by `pads`, whose
/// weight and bias are initializers (as a baseline's extract holds them), and its input.
fn float64_conv_model(pads: &[i64]) -> (Model, Tensor) {
    let f64_tensor = |name: &str, shape: &[usize], seed: usize| {
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n)
            .map(|i| (((i + seed) * 7919 % 1013) as f64 - 506.0) / 313.0)
            .collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let proto = layerdiff_onnx::TensorProto {
            name: Some(name.into()),
            dims: shape.iter().map(|&d| d as i64).collect(),
            data_type: Some(11),
            raw_data: Some(bytes.clone().into()),
            ..Default::default()
        };
        let tensor = Tensor::new(name, DType::F64, shape.to_vec(), bytes).unwrap();
        (proto, tensor)
    };
    let attribute = |name: &str, i: Option<i64>, ints: &[i64]| layerdiff_onnx::AttributeProto {
        name: Some(name.into()),
        r#type: Some(if i.is_some() { 2 } else { 7 }),
        i,
        ints: ints.to_vec(),
        ..Default::default()
    };
    let (w, _) = f64_tensor("w", &[8, 2, 3, 3], 1);
    let (b, _) = f64_tensor("b", &[8], 2);
    let (_, x) = f64_tensor("x", &[2, 4, 15, 13], 3);
    let conv = NodeProto {
        op_type: Some("Conv".into()),
        input: vec!["x".into(), "w".into(), "b".into()],
        output: vec!["y".into()],
        attribute: vec![
            attribute("group", Some(2), &[]),
            attribute("strides", None, &[2, 1]),
            attribute("dilations", None, &[1, 2]),
            attribute("pads", None, pads),
        ],
        ..Default::default()
    };
    let graph = GraphProto {
        node: vec![conv],
        input: vec![tensor_value_info("x", 11, &[2, 4, 15, 13])],
        output: vec![tensor_value_info("y", 11, &[])],
        initializer: vec![w, b],
        ..Default::default()
    };
    (model("conv.onnx", graph), x)
}

/// `model` on layerdiff's own float64 kernels, its one output.
fn on_exact_kernels(model: &Model, x: Tensor) -> Tensor {
    let out = layerdiff_runtime::ExactKernels
        .run(model, &[("x".to_string(), x)], &["y".to_string()])
        .unwrap();
    out.into_iter().next().unwrap().1
}

#[test]
fn layerdiffs_float64_conv_agrees_with_tracts() {
    let (model, x) = float64_conv_model(&[1, 2, 1, 2]);
    let ours = on_exact_kernels(&model, x.clone());
    let tract = TractRuntime
        .run(&model, &[("x".to_string(), x)], &["y".to_string()])
        .unwrap();
    let theirs = &tract[0].1;
    assert_eq!(ours.shape, vec![2, 8, 8, 13]);
    assert_eq!(ours.shape, theirs.shape);
    for (p, q) in ours.bytes.chunks_exact(8).zip(theirs.bytes.chunks_exact(8)) {
        let (p, q) = (
            f64::from_le_bytes(p.try_into().unwrap()),
            f64::from_le_bytes(q.try_into().unwrap()),
        );
        assert!(
            (p - q).abs() <= 1e-12 * q.abs().max(1.0),
            "{p} against tract's {q}"
        );
    }
}

#[test]
fn layerdiffs_float64_conv_pads_each_side_as_onnx_says() {
    // pads [top, left, bottom, right] = [1, 2, 0, 1]: 7 × 12 outputs, as ONNX Runtime's float32
    // Conv makes them (tract 0.23.9's float64 Conv makes 8 × 11 of the same node)
    let (model, x) = float64_conv_model(&[1, 2, 0, 1]);
    assert_eq!(on_exact_kernels(&model, x).shape, vec![2, 8, 7, 12]);
}

#[test]
fn tract_runs_a_piece_fed_the_shape_its_graph_computed() {
    // A local re-run of a Reshape whose shape the graph computes (Shape → Concat): the piece
    // takes that shape as an input, which tract would not prepare ("shape input is variable"),
    // and a float16 island in an encoder read "undecided" on tract.
    let node = NodeProto {
        op_type: Some("Reshape".into()),
        name: Some("reshape".into()),
        input: vec!["x".into(), "shape".into()],
        output: vec!["y".into()],
        ..Default::default()
    };
    let piece = model(
        "piece.onnx",
        GraphProto {
            node: vec![node],
            input: vec![
                tensor_value_info("x", 1, &[2, 3]),
                tensor_value_info("shape", 7, &[2]),
            ],
            output: vec![tensor_value_info("y", 1, &[3, 2])],
            ..Default::default()
        },
    );
    let x: Vec<u8> = (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let shape: Vec<u8> = [3i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let inputs = [
        (
            "x".to_string(),
            Tensor::new("x", DType::F32, vec![2, 3], x).unwrap(),
        ),
        (
            "shape".to_string(),
            Tensor::new("shape", DType::I64, vec![2], shape).unwrap(),
        ),
    ];
    let out = TractRuntime
        .run(&piece, &inputs, &["y".to_string()])
        .expect("tract prepares a piece fed its shape");
    assert_eq!(out[0].1.shape, vec![3, 2]);
}
