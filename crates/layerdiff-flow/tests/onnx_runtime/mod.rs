//! What the tests that run ONNX Runtime share: its library from the repository's .venv (as
//! `make test` sets it up), and the options of a per-layer comparison of one file.

use std::path::PathBuf;

use layerdiff_core::Tolerance;
use layerdiff_flow::inputs::InputPlan;
use layerdiff_flow::onnx::OnnxOptions;
use layerdiff_flow::{Float64, Settings};
use layerdiff_runtime::RuntimeSpec;

/// The onnxruntime wheel's library in the repository's .venv, chosen as the one this process
/// loads; `None` without it (the test is then skipped, and says so).
pub fn library() -> Option<PathBuf> {
    let library = wheel_library()?;
    layerdiff_runtime::use_ort_library(Some(&library));
    Some(library)
}

fn wheel_library() -> Option<PathBuf> {
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

/// A per-layer comparison of `model` against ONNX Runtime on the CPU, inputs from seed 0,
/// local error and the float64 truth on.
pub fn options(model: PathBuf) -> OnnxOptions {
    OnnxOptions {
        model,
        vs: None,
        reference: RuntimeSpec::ort_cpu().into(),
        target: None,
        inputs: None,
        generate: InputPlan {
            seed: 0,
            shapes: Vec::new(),
            batch: None,
            int_range: (0, 9),
        },
        settings: Settings::new(Tolerance::PerDtype, true, None, Float64::Truth).unwrap(),
        bisect: false,
        repro: None,
        repro_nodes: 0,
        isolation: Default::default(),
        opaque: false,
    }
}
