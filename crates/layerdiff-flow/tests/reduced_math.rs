//! CPU stand-ins for runtimes that narrow float32 math. A GPU provider with TF32 on: a target runtime that rounds each MatMul's
//! operands to a 10-bit mantissa (TF32's; float16 has the same) before ONNX Runtime's CPU
//! multiplies them. Against the float64 truth the MatMul layers are `precision_loss` when the
//! runtime says it does reduced math, and a kernel that "computes differently" when it hides
//! it: the evidence, not the numbers, makes the verdict. And OpenVINO at its bfloat16
//! inference precision (on CPUs with AVX-512 BF16, its default): operands and results on the
//! bfloat16 grid, each such layer judged against an ideal bfloat16 computation, so that an
//! honest one is bfloat16 rounding and one 2% off is a kernel that computes differently. Needs the onnxruntime wheel in the
//! repository's .venv (as `make test` sets up); skipped without it.

use std::path::{Path, PathBuf};

mod onnx_runtime;
use onnx_runtime::{library, options};

use layerdiff_core::{Report, Tensor};
use layerdiff_flow::onnx::compare_with;
use layerdiff_onnx::{
    AttributeProto, GraphProto, Model, ModelProto, NodeProto, OperatorSetIdProto, tensor_value_info,
};
use layerdiff_runtime::{ReducedMath, Runtime, RuntimeSpec};

fn node(op: &str, inputs: &[&str], out: &str) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("{out}_node")),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        ..Default::default()
    }
}

/// `input` cast to the ONNX element type `to`, as `out`.
fn cast(input: &str, to: i64, out: String) -> NodeProto {
    NodeProto {
        attribute: vec![AttributeProto {
            name: Some("to".into()),
            r#type: Some(2),
            i: Some(to),
            ..Default::default()
        }],
        ..node("Cast", &[input], &out)
    }
}

/// `out = MatMul(Relu(MatMul(x, w1)), w2)`, float32, long enough products for TF32 to show.
fn two_matmuls(folder: &Path) -> PathBuf {
    let proto = ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(18),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: vec![
                node("MatMul", &["x", "w1"], "hidden"),
                node("Relu", &["hidden"], "active"),
                node("MatMul", &["active", "w2"], "out"),
            ],
            input: vec![
                tensor_value_info("x", 1, &[16, 512]),
                tensor_value_info("w1", 1, &[512, 256]),
                tensor_value_info("w2", 1, &[256, 64]),
            ],
            output: vec![tensor_value_info("out", 1, &[16, 64])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = folder.join("two_matmuls.onnx");
    std::fs::write(&path, Model::from_proto(proto, None).to_bytes()).unwrap();
    path
}

/// ONNX Runtime on the CPU with each MatMul's operands rounded through float16 first.
struct Tf32Like {
    cpu: Box<dyn Runtime + Send + Sync>,
    says_so: bool,
}

impl Tf32Like {
    fn rounded(model: &Model) -> Model {
        let mut model = model.clone();
        let graph = model.graph_mut();
        let mut nodes = Vec::new();
        for mut n in std::mem::take(&mut graph.node) {
            if n.op_type() == "MatMul" {
                for input in n.input.iter_mut() {
                    let (half, back) = (format!("{input}_as_f16"), format!("{input}_tf32"));
                    nodes.push(cast(input, 10, half.clone()));
                    nodes.push(cast(&half, 1, back.clone()));
                    *input = back;
                }
            }
            nodes.push(n);
        }
        graph.node = nodes;
        model
    }
}

impl Runtime for Tf32Like {
    fn name(&self) -> &str {
        "tf32-like"
    }
    fn detail(&self) -> String {
        "onnxruntime CPU, MatMul operands rounded to 10-bit mantissas".into()
    }
    fn reduced_math(&self) -> Option<ReducedMath> {
        self.says_so.then(|| ReducedMath {
            ops: &["MatMul"],
            grid: None,
            how: "this side multiplies float32 in TF32".into(),
        })
    }
    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> layerdiff_runtime::Result<Vec<(String, Tensor)>> {
        self.cpu.run(&Self::rounded(model), inputs, outputs)
    }
}

fn report(says_so: bool) -> Option<Report> {
    library()?;
    let cpu = RuntimeSpec::ort_cpu().build().unwrap();
    report_on(Box::new(Tf32Like { cpu, says_so }))
}

fn report_on(target: Box<dyn Runtime + Send + Sync>) -> Option<Report> {
    let folder = tempfile::tempdir().unwrap();
    let options = options(two_matmuls(folder.path()));
    Some(compare_with(&options, target).unwrap().report)
}

fn verdict(report: &Report, value: &str) -> (Option<layerdiff_core::Cause>, String) {
    let layer = report.layers.iter().find(|l| l.name == value).unwrap();
    (layer.cause, layer.detail.clone().unwrap_or_default())
}

#[test]
fn tf32_products_are_precision_loss_and_the_truth_says_the_target_is_further() {
    let Some(report) = report(true) else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    assert_eq!(report.summary.drift_origin.as_deref(), Some("hidden"));
    let (cause, detail) = verdict(&report, "hidden");
    assert_eq!(
        cause,
        Some(layerdiff_core::Cause::PrecisionLoss),
        "{detail}"
    );
    assert!(
        detail.starts_with("MatMul: this side multiplies float32 in TF32"),
        "{detail}"
    );
    assert!(
        detail.contains("the target is further from float64")
            && detail.ends_with("as its precision explains"),
        "{detail}"
    );
    let (cause, detail) = verdict(&report, "out");
    assert_eq!(
        cause,
        Some(layerdiff_core::Cause::PrecisionLoss),
        "it rounds its own operands too: {detail}"
    );
}

#[test]
fn the_same_rounding_unexplained_is_a_kernel_that_computes_differently() {
    let Some(report) = report(false) else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    let (cause, detail) = verdict(&report, "hidden");
    assert_eq!(
        cause,
        Some(layerdiff_core::Cause::OpImplementation),
        "{detail}"
    );
}

/// ONNX Runtime on the CPU computing each MatMul as OpenVINO does at bfloat16: operands and
/// result rounded to bfloat16, the result scaled by `off` first (1.0: honest).
struct Bf16Like {
    cpu: Box<dyn Runtime + Send + Sync>,
    off: f32,
}

impl Bf16Like {
    fn rounded(&self, model: &Model) -> Model {
        let mut model = model.clone();
        let graph = model.graph_mut();
        let mut nodes = Vec::new();
        for mut n in std::mem::take(&mut graph.node) {
            if n.op_type() != "MatMul" {
                nodes.push(n);
                continue;
            }
            for input in n.input.iter_mut() {
                let (narrow, back) = (format!("{input}_as_bf16"), format!("{input}_bf16"));
                nodes.push(cast(input, 16, narrow.clone()));
                nodes.push(cast(&narrow, 1, back.clone()));
                *input = back;
            }
            let out = n.output[0].clone();
            let wide = format!("{out}_wide");
            n.output[0] = wide.clone();
            nodes.push(n);
            let factor = format!("{out}_factor");
            nodes.push(NodeProto {
                attribute: vec![AttributeProto {
                    name: Some("value_float".into()),
                    r#type: Some(1),
                    f: Some(self.off),
                    ..Default::default()
                }],
                ..node("Constant", &[], &factor)
            });
            let scaled = format!("{out}_scaled");
            nodes.push(node("Mul", &[&wide, &factor], &scaled));
            nodes.push(cast(&scaled, 16, format!("{out}_as_bf16")));
            nodes.push(NodeProto {
                name: Some(format!("{out}_back")),
                ..cast(&format!("{out}_as_bf16"), 1, out)
            });
        }
        graph.node = nodes;
        model
    }
}

impl Runtime for Bf16Like {
    fn name(&self) -> &str {
        "bf16-like"
    }
    fn detail(&self) -> String {
        "onnxruntime CPU, MatMul in bfloat16".into()
    }
    fn reduced_math(&self) -> Option<ReducedMath> {
        Some(ReducedMath {
            ops: &["MatMul"],
            grid: Some(layerdiff_core::DType::BF16),
            how: "this side computes float32 MatMuls in bfloat16".into(),
        })
    }
    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> layerdiff_runtime::Result<Vec<(String, Tensor)>> {
        self.cpu.run(&self.rounded(model), inputs, outputs)
    }
}

fn bf16_report(off: f32) -> Option<Report> {
    library()?;
    let cpu = RuntimeSpec::ort_cpu().build().unwrap();
    report_on(Box::new(Bf16Like { cpu, off }))
}

#[test]
fn a_side_computing_in_bfloat16_is_judged_against_an_ideal_bfloat16_computation() {
    let Some(report) = bf16_report(1.0) else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    for value in ["hidden", "out"] {
        let layer = report.layers.iter().find(|l| l.name == value).unwrap();
        let baseline = layer.baseline.as_ref().expect("a baseline");
        assert_eq!(baseline.grid, "bfloat16", "{value}");
        assert!(baseline.multiple <= 1.0, "{value}: {}", baseline.multiple);
        assert_eq!(
            layer.cause,
            Some(layerdiff_core::Cause::PrecisionLoss),
            "{value}"
        );
    }
    assert!(
        report.summary.defects.is_empty(),
        "{:?}",
        report.summary.defects
    );
    let precision = report.summary.precision.as_ref().expect("precision drift");
    assert_eq!(precision.dtype, "bfloat16");
}

#[test]
fn a_bfloat16_kernel_two_percent_off_computes_differently() {
    let Some(report) = bf16_report(1.02) else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    let (cause, detail) = verdict(&report, "hidden");
    assert_eq!(
        cause,
        Some(layerdiff_core::Cause::OpImplementation),
        "{detail}"
    );
    // both MatMuls are off: two defects, each at its layer
    let mut defects: Vec<&str> = report
        .summary
        .defects
        .iter()
        .map(|d| d.layer.as_str())
        .collect();
    defects.sort_unstable();
    assert_eq!(defects, ["hidden", "out"]);
}
