#![no_main]
//! See layerdiff_fuzz::onnx_model.

libfuzzer_sys::fuzz_target!(|data: &[u8]| layerdiff_fuzz::onnx_model(data));
