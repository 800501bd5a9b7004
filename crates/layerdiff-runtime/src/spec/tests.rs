use std::path::Path;

use super::*;
use crate::{OptLevel, OrtSpec, Provider};

#[test]
fn spellings_round_trip() {
    for s in [
        "ort",
        "ort:opt=basic",
        "ort:opt=all",
        "ort:cuda",
        "ort:tensorrt:opt=extended",
        "ort:cuda:opt=all:use_tf32=0:cudnn_conv_algo_search=HEURISTIC",
        "ort:opt=all:without=NchwcTransformer,ConvActivationFusion",
        "ort:cuda:opt=all:custom_ops=/opt/vendor/libops.so,libmore.so:use_tf32=0",
        "ort:opt=all:lib=/opt/ort-1.30/libonnxruntime.so.1.30.0",
        "tract",
        "openvino",
        "openvino:precision=f16",
        "openvino:lib=/opt/ov-2026.4.0/libopenvino_c.so.2640",
        "openvino:precision=f32:lib=/opt/ov-2026.4.0/libopenvino_c.so.2640",
    ] {
        assert_eq!(RuntimeSpec::parse(s).unwrap().spelling(), s);
    }
    assert_eq!(
        RuntimeSpec::parse("ort:opt=all:cuda"),
        RuntimeSpec::parse("ort:cuda:opt=all")
    );
    assert_eq!(RuntimeSpec::parse("ort:cpu").unwrap().spelling(), "ort");
    assert_eq!(
        RuntimeSpec::parse("openvino:lib=/a.so:precision=bf16")
            .unwrap()
            .spelling(),
        "openvino:precision=bf16:lib=/a.so"
    );
    for (bad, said) in [
        (
            "ort:opt=most",
            "unknown optimization level `most` (expected disable, basic, extended or all)",
        ),
        (
            "ort:gpu",
            "unknown execution provider `gpu` (expected one of cpu, cuda",
        ),
        ("ort:cuda:rocm", "two execution providers"),
        ("ort:cuda:use_tf32", "unknown execution provider `use_tf32`"),
        ("ort:opt=all:opt=basic", "`opt=` is given twice"),
        (
            "openvino:precision=f8",
            "unknown OpenVINO precision `f8` (expected f32, f16, bf16)",
        ),
        (
            "openvino:precision=f8:lib=/opt/libopenvino_c.so",
            "unknown OpenVINO precision `f8`",
        ),
    ] {
        let err = RuntimeSpec::parse(bad).unwrap_err();
        assert!(err.starts_with(&format!("`{bad}`: {said}")), "{bad}: {err}");
    }
    for bad in [
        "onnxruntime",
        "ort:cuda:=0",
        "openvino:f16",
        "openvino:precision=f16:opt=all",
        "openvino:lib=",
        "openvino:lib=a.so:lib=b.so",
        "openvino:precision=f32:precision=f16",
        "ort:opt=all:without=",
        "ort:opt=all:without=a;b",
        "ort:custom_ops=",
        "ort:custom_ops=a.so,",
        "ort:custom_ops=a.so:custom_ops=b.so",
        "ort:lib=",
        "ort:lib=a.so:lib=b.so",
    ] {
        let err = RuntimeSpec::parse(bad).unwrap_err();
        assert!(
            err.contains(&format!("unknown runtime `{bad}`")),
            "{bad}: {err}"
        );
    }
}

#[test]
fn optimizers_are_disabled_only_at_a_level_that_runs_them() {
    let err = RuntimeSpec::parse("ort:without=NchwcTransformer").unwrap_err();
    assert!(err.contains("run only at `opt=basic`"), "{err}");
}

#[test]
fn options_need_a_provider_that_takes_them() {
    let err = RuntimeSpec::parse("ort:use_tf32=0").unwrap_err();
    assert_eq!(
        err,
        "`ort:use_tf32=0`: options (use_tf32=0) are for an execution provider that takes them, \
         such as `ort:cuda:use_tf32=0`; CPUExecutionProvider takes none"
    );
    assert_eq!(
        RuntimeSpec::parse("ort:use_tf32=0:cuda").unwrap(),
        RuntimeSpec::from(OrtSpec {
            options: vec![("use_tf32".into(), "0".into())],
            ..OrtSpec::on(Provider::Cuda, OptLevel::Disable)
        })
    );
}

#[test]
fn an_execution_provider_through_the_device_api_is_spelled_and_read_back() {
    let spec = RuntimeSpec::parse("ort:ep_lib=/opt/libvendor_ep.so:ep=VendorEP:mode=fast").unwrap();
    let ort = spec.ort().unwrap();
    let (provider, options, plugin) = (ort.provider, &ort.options, ort.plugin.as_ref().unwrap());
    assert_eq!(provider, Provider::Cpu);
    assert_eq!(
        plugin.library.as_deref(),
        Some(Path::new("/opt/libvendor_ep.so"))
    );
    assert_eq!(plugin.ep.as_deref(), Some("VendorEP"));
    // the options are the EP's own, whatever its built-in counterpart takes
    assert_eq!(options, &vec![("mode".to_string(), "fast".to_string())]);
    assert_eq!(
        spec.spelling(),
        "ort:ep_lib=/opt/libvendor_ep.so:ep=VendorEP:mode=fast"
    );
    assert_eq!(RuntimeSpec::parse(&spec.spelling()).unwrap(), spec);
    let built_in = RuntimeSpec::parse("ort:ep=CPUExecutionProvider").unwrap();
    assert_eq!(built_in.spelling(), "ort:ep=CPUExecutionProvider");
    for bad in ["ort:cuda:ep=X", "ort:ep=A:ep=B", "ort:ep_lib=", "ort:ep="] {
        assert!(RuntimeSpec::parse(bad).is_err(), "{bad}");
    }
    assert!(
        RuntimeSpec::parse("ort:cuda:ep=X")
            .unwrap_err()
            .contains("give one of them")
    );
}

#[test]
fn a_misspelled_runtime_is_named_with_the_one_it_slips_from_and_nothing_else_is() {
    let said = RuntimeSpec::parse("openvno").unwrap_err();
    assert!(said.starts_with("unknown runtime `openvno`; did you mean `openvino`?"));
    assert!(said.len() < 300, "the short list, not the grammar: {said}");
    assert_eq!(
        nearest("trac", &["ort", "tract", "openvino"]),
        Some("tract")
    );
    assert_eq!(nearest("tvm", &["torch", "tf", "xla"]), None);
    let said = RuntimeSpec::parse("onnxruntime:cuda").unwrap_err();
    assert!(said.contains("did you mean `ort`?"), "{said}");
}

#[test]
fn each_runtime_is_registered_once_by_its_module() {
    let names: Vec<&str> = kinds().iter().map(|k| k.name).collect();
    // the built-in ones, first in the short list, each once (a runtime added later joins
    // after them, by its rank)
    assert_eq!(names[..3], ["ort", "tract", "openvino"]);
    for name in &names {
        assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{names:?}");
    }
    let said = RuntimeSpec::parse("tvm").unwrap_err();
    assert!(
        said.contains(
            "Runtimes: `ort` (ONNX Runtime: `ort:cuda`, `ort:opt=all`…), `tract`, `openvino`"
        ),
        "{said}"
    );
    // each spelling is its own module's, and reads back as its settings
    let spec = RuntimeSpec::parse("openvino:precision=bf16").unwrap();
    assert_eq!(
        spec.get::<crate::OpenVinoSpec>()
            .unwrap()
            .precision
            .as_deref(),
        Some("bf16")
    );
    assert!(spec.ort().is_none());
    let said = RuntimeSpec::parse("tract:opt=all").unwrap_err();
    assert!(said.contains("`tract`, which takes no options"), "{said}");
}
