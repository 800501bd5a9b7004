include!("onnx.rs");
