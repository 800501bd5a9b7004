//! A float32 reduction's terms measured on the reference graph: what holds a long reduction
//! summed in another order (tract's Conv over 4608 terms in ResNet-50) to what it explains.
//! Needs the onnxruntime wheel in the repository's .venv (as `make test` sets up); skipped
//! without it.

#[allow(dead_code)] // the comparison options this test does not need
mod onnx_runtime;
use onnx_runtime::library;

use layerdiff_core::{DType, Tensor};
use layerdiff_flow::{Baseline, GraphBaseline};
use layerdiff_onnx::{
    GraphProto, Model, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, tensor_value_info,
};

#[test]
fn a_convs_reduction_terms_are_the_same_conv_of_the_squares_in_the_inputs_shape() {
    // tract's float32 Conv over 4608 terms in ResNet-50 read op_implementation: the terms
    // were fed flattened, no runtime ran the Conv, and the layer was judged without them
    let w: Vec<f32> = (0..8).map(|i| [0.5, -1.0, 2.0, -0.25][i % 4]).collect();
    let proto = ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(18),
        }],
        graph: Some(GraphProto {
            name: Some("conv".into()),
            node: vec![NodeProto {
                op_type: Some("Conv".into()),
                name: Some("conv".into()),
                input: vec!["x".into(), "w".into()],
                output: vec!["out".into()],
                ..Default::default()
            }],
            initializer: vec![TensorProto {
                name: Some("w".into()),
                dims: vec![1, 2, 2, 2],
                data_type: Some(1),
                float_data: w.clone(),
                ..Default::default()
            }],
            input: vec![tensor_value_info("x", 1, &[1, 2, 3, 3])],
            output: vec![tensor_value_info("out", 1, &[1, 1, 2, 2])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let model = Model::from_proto(proto, None);
    let Some(_) = library() else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    let mut baseline = GraphBaseline::new(&model).unwrap();
    baseline.find_groups(&["out"], &|n| n == "x");
    let xs: Vec<f64> = (0..18).map(|i| (i as f64 - 8.5) / 4.0).collect();
    let mut x = Tensor::from_f64(DType::F32, &xs);
    x.shape = vec![1, 2, 3, 3];
    let feed = |n: &str| -> Result<(&Tensor, DType), String> {
        (n == "x")
            .then_some((&x, DType::F32))
            .ok_or(format!("no {n}"))
    };
    let measured = baseline
        .measure_reduction("out", DType::F32, &feed)
        .expect("the Conv's terms are measured");
    let (terms, rss) = (measured.count, measured.rss);
    assert!(measured.each.is_none(), "a graph hands no terms over");
    assert_eq!(terms, 8, "input channels × kernel height × width");
    assert_eq!(rss.shape, vec![1, 1, 2, 2]);
    // the first output element: √Σ (x·w)² over the 2×2 window of both channels
    let at = |c: usize, r: usize, k: usize| xs[c * 9 + r * 3 + k];
    let expected: f64 = (0..2)
        .flat_map(|c| (0..2).flat_map(move |r| (0..2).map(move |k| (c, r, k))))
        .map(|(c, r, k)| (at(c, r, k) * f64::from(w[c * 4 + r * 2 + k])).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!(
        (rss.view().get_f64(0) - expected).abs() < 1e-12,
        "{}",
        rss.view().get_f64(0)
    );
}
