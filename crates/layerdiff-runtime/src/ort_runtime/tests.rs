use super::clean_message;
use super::profile::node_providers;

#[test]
fn a_profile_counts_each_node_once_by_its_provider() {
    let profile = r#"[
        {"cat": "Session", "name": "model_run", "args": {}},
        {"cat": "Node", "name": "conv_fence_before", "args": {"op_name": "Conv"}},
        {"cat": "Node", "name": "conv_kernel_time", "args": {"provider": "CUDAExecutionProvider"}},
        {"cat": "Node", "name": "conv_kernel_time", "args": {"provider": "CUDAExecutionProvider"}},
        {"cat": "Node", "name": "shape_kernel_time", "args": {"provider": "CPUExecutionProvider"}},
        {"cat": "Node", "name": "relu_kernel_time", "args": {"provider": "CUDAExecutionProvider"}}
    ]"#;
    assert_eq!(
        node_providers(profile).unwrap(),
        vec![
            ("CUDAExecutionProvider".to_string(), 2),
            ("CPUExecutionProvider".to_string(), 1)
        ]
    );
    assert!(
        node_providers("not json")
            .unwrap_err()
            .starts_with("not a profile")
    );
}

#[test]
fn source_locations_and_signatures_are_dropped() {
    let raw = "/onnxruntime_src/onnxruntime/core/graph/model.cc:256 onnxruntime::Model::Model(onnx::ModelProto&&, \
               const onnxruntime::PathString&) Unsupported model IR version: 14, max supported IR version: 13";
    assert_eq!(
        clean_message(raw.to_string()),
        "Unsupported model IR version: 14, max supported IR version: 13"
    );
    assert_eq!(clean_message("plain message".to_string()), "plain message");
}

#[test]
fn a_missing_kernel_names_its_node_and_any_other_refusal_is_the_models() {
    let text = "Could not find an implementation for Acosh(9) node with name 'n1'";
    match super::refused(text.to_string()) {
        crate::Error::LacksNode { node, why, message } => {
            assert_eq!(node, "n1");
            assert_eq!(why, "no kernel for Acosh(9) and its input types");
            assert_eq!(
                message,
                format!("ONNX Runtime cannot load the model: {text}")
            );
        }
        other => panic!("{other:?}"),
    }
    let other = super::refused("Invalid model: opset 99".to_string());
    assert!(matches!(other, crate::Error::Session(_)), "{other:?}");
}
