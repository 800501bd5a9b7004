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

fn add_relu_model() -> Model {
    let node = |op: &str, inputs: &[&str], out: &str| NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("{op}_node")),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        ..Default::default()
    };
    let proto = ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(18),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
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
        }),
        ..Default::default()
    };
    Model::from_bytes(&proto.encode_to_vec(), "add_relu.onnx".as_ref(), None).expect("valid model")
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
