//! A new runtime is one module and one registration line (`standin/mod.rs`): the command line
//! then takes it as a target, runs the comparison on it, finds a fault planted in its kernel at
//! its node, keeps a clean run clean, and names it when misspelled. Needs the onnxruntime wheel
//! in the repository's .venv for the float64 truth (as `make test` sets up); skipped without it.

mod standin;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use layerdiff_onnx::tensor_value_info;
use layerdiff_onnx::{GraphProto, Model, ModelProto, NodeProto, OperatorSetIdProto, TensorProto};

/// `x` through 6 nodes (`MatMul` by a weight, then `Relu`, three times) to `y`.
fn stack(folder: &Path) -> PathBuf {
    let (mut node, mut initializer) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let input = if i == 0 {
            "x".to_string()
        } else {
            format!("r{}", i - 1)
        };
        let w = format!("w{i}");
        initializer.push(TensorProto {
            name: Some(w.clone()),
            dims: vec![16, 16],
            data_type: Some(1),
            float_data: (0..256)
                .map(|k| ((k * 7 + i * 3) % 11) as f32 / 20.0 - 0.2)
                .collect(),
            ..Default::default()
        });
        let out = if i == 2 {
            "y".to_string()
        } else {
            format!("r{i}")
        };
        for (op, inputs, output) in [
            ("MatMul", vec![input, w], format!("m{i}")),
            ("Relu", vec![format!("m{i}")], out),
        ] {
            node.push(NodeProto {
                op_type: Some(op.into()),
                name: Some(format!("{}{i}", op.to_lowercase())),
                input: inputs,
                output: vec![output],
                ..Default::default()
            });
        }
    }
    let proto = ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(18),
        }],
        graph: Some(GraphProto {
            name: Some("stack".into()),
            node,
            initializer,
            input: vec![tensor_value_info("x", 1, &[4, 16])],
            output: vec![tensor_value_info("y", 1, &[4, 16])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = folder.join("stack.onnx");
    std::fs::write(&path, Model::from_proto(proto, None).to_bytes()).unwrap();
    path
}

/// The onnxruntime wheel's library in the repository's .venv.
fn ort_library() -> Option<PathBuf> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
    std::fs::read_dir(venv).ok()?.flatten().find_map(|e| {
        let capi = e.path().join("site-packages/onnxruntime/capi");
        (std::fs::read_dir(capi).ok()?.flatten().map(|f| f.path())).find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so."))
        })
    })
}

/// `layerdiff onnx MODEL --reference tract --target TARGET --json FOLDER/r.json`: its exit code
/// and report.
fn onnx(model: &Path, target: &str) -> (ExitCode, Option<serde_json::Value>) {
    let json = model.with_file_name(format!("{}.json", target.replace([':', '='], "_")));
    let argv: Vec<OsString> = [
        "layerdiff",
        "onnx",
        "--reference",
        "tract",
        "--target",
        target,
        "-q",
    ]
    .iter()
    .map(OsString::from)
    .chain([model.into(), "--json".into(), json.clone().into()])
    .collect();
    let code = layerdiff_cli::main(argv);
    let report = std::fs::read(&json)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap());
    (code, report)
}

#[test]
fn a_runtime_added_by_one_module_is_a_target_of_the_command_line() {
    let Some(library) = ort_library() else {
        eprintln!("skipped: no onnxruntime wheel in .venv (`make test` installs it)");
        return;
    };
    layerdiff_runtime::use_ort_library(Some(&library));
    let folder = tempfile::tempdir().unwrap();
    let model = stack(folder.path());

    let (code, report) = onnx(&model, "standin:off=matmul1");
    let report = report.expect("a report");
    assert_eq!(code, ExitCode::from(1), "{report}");
    let summary = &report["summary"];
    assert_eq!(summary["drift_origin"], "m1", "{summary}");
    assert_eq!(summary["defects"][0]["layer"], "m1", "{summary}");
    assert_eq!(report["target"]["runtime"], "standin");
    assert!(
        report["target"]["detail"]
            .as_str()
            .unwrap()
            .ends_with("tract with node `matmul1` 1% off")
    );

    let (code, report) = onnx(&model, "standin");
    assert_eq!(code, ExitCode::from(0), "{}", report.unwrap()["summary"]);

    // a slip of its name is named, as a built-in runtime's is
    let (code, report) = onnx(&model, "standn");
    assert_eq!(code, ExitCode::from(2));
    assert!(report.is_none());
}
