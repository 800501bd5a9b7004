//! OpenVINO's spelling: `openvino[:precision=f32|f16|bf16][:lib=PATH]`, its parts in any order,
//! each once (`lib=`: another release's `libopenvino_c`, run in a worker process of its own, as
//! OpenVINO is loaded once per process). What such a side builds, and its repro.

use std::path::{Path, PathBuf};

use super::Plugin;
use crate::spec::{py_str, release_note};
use crate::{
    Configured, OPENVINO_PRECISIONS, OpenVinoRuntime, Result, Runtime, RuntimeKind, RuntimeSpec,
};

inventory::submit!(RuntimeKind {
    name: "openvino",
    listed: "`openvino` (`openvino:precision=bf16`…)",
    rank: 2,
    parse: |text| OpenVinoSpec::parse(text).map(RuntimeSpec::from),
    op_backends: || vec!["openvino".to_string()],
    wheel: Some(&super::OPENVINO_WHEEL),
});

/// OpenVINO's CPU plugin as a spelling sets it up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenVinoSpec {
    /// Its inference-precision hint (`None`: the plugin's default).
    pub precision: Option<String>,
    /// The OpenVINO C library it runs on where it is not the one layerdiff finds.
    pub release: Option<PathBuf>,
}

impl OpenVinoSpec {
    /// Parses `openvino[:precision=P][:lib=PATH]`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let unknown = || {
            format!(
                "unknown runtime `{text}` (expected `openvino[:precision=f32|f16|bf16][:lib=LIBRARY]`, \
                 LIBRARY another release's libopenvino_c)"
            )
        };
        let mut parts = text.split(':');
        if parts.next() != Some("openvino") {
            return Err(unknown());
        }
        let mut spec = Self::default();
        for part in parts {
            if let Some(p) = part.strip_prefix("precision=") {
                if spec.precision.replace(p.to_string()).is_some() {
                    return Err(unknown());
                }
                if !OPENVINO_PRECISIONS.contains(&p) {
                    return Err(format!(
                        "`{text}`: unknown OpenVINO precision `{p}` (expected {})",
                        OPENVINO_PRECISIONS.join(", ")
                    ));
                }
            } else if let Some(path) = part.strip_prefix("lib=").filter(|p| !p.is_empty()) {
                if spec.release.replace(PathBuf::from(path)).is_some() {
                    return Err(unknown());
                }
            } else {
                return Err(unknown());
            }
        }
        Ok(spec)
    }
}

impl Configured for OpenVinoSpec {
    fn spelling(&self) -> String {
        let mut s = "openvino".to_string();
        if let Some(p) = &self.precision {
            s.push_str(&format!(":precision={p}"));
        }
        if let Some(library) = &self.release {
            s.push_str(&format!(":lib={}", library.display()));
        }
        s
    }

    fn build_here(&self, _as_saved: bool) -> Result<Box<dyn Runtime + Send + Sync>> {
        Ok(Box::new(OpenVinoRuntime::new(
            self.release.as_deref(),
            self.precision.as_deref(),
        )?))
    }

    fn described_here(
        &self,
        as_saved: bool,
        facts: Option<&serde_json::Value>,
    ) -> Result<Box<dyn Runtime + Send + Sync>> {
        if self.release.is_none() {
            return self.build_here(as_saved);
        }
        Ok(Box::new(OpenVinoRuntime::described(
            self.precision.as_deref(),
            facts
                .and_then(Plugin::from_json)
                .unwrap_or_else(Plugin::unknown),
        )))
    }

    fn release(&self) -> Option<&Path> {
        self.release.as_deref()
    }

    fn asks_worker(&self) -> bool {
        // the build of another release's CPU plugin, the precision it resolved
        self.release.is_some()
    }

    fn told(&self, facts: &serde_json::Value) -> bool {
        Plugin::from_json(facts).is_some()
    }

    fn repro(&self, _inputs: &[String]) -> (&'static str, String) {
        let config = (self.precision.as_ref())
            .map(|p| format!("{{\"INFERENCE_PRECISION_HINT\": {}}}", py_str(p)))
            .unwrap_or_else(|| "{}".to_string());
        (
            "openvino",
            format!(
                "{}    import openvino as ov\n\n    compiled = ov.Core().compile_model(str(HERE / \"model.onnx\"), \"CPU\", {config})\n    result = compiled(inputs)\n    return {{out.get_any_name(): result[out] for out in compiled.outputs}}\n",
                release_note(self.release.as_deref())
            ),
        )
    }
}
