//! One side of a comparison of ONNX files: a runtime that computes the file's values (any
//! registered runtime's spelling, see `layerdiff_runtime::RuntimeSpec`), or values read from a
//! file (`expected:PATH`: safetensors, or an ONNX test data folder), which computes nothing.

use std::path::PathBuf;

use layerdiff_runtime::{OtherSpelling, RuntimeSpec};

/// The spelling of values read from a file.
const EXPECTED: OtherSpelling = OtherSpelling {
    name: "expected",
    suggested: "expected:PATH",
    listed: "`expected:PATH` (values from a file)",
};

/// A side of an ONNX comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnnxSide {
    /// The file's values as a runtime computes them.
    Runs(RuntimeSpec),
    /// Values read from a file (`expected:PATH`).
    Expected(PathBuf),
}

impl From<RuntimeSpec> for OnnxSide {
    fn from(runtime: RuntimeSpec) -> Self {
        Self::Runs(runtime)
    }
}

impl std::fmt::Display for OnnxSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.spelling())
    }
}

impl OnnxSide {
    /// Parses `expected:PATH` or a runtime's spelling.
    pub fn parse(text: &str) -> Result<Self, String> {
        let head = text.split(':').next().unwrap_or_default();
        if head == EXPECTED.name {
            return match text.strip_prefix("expected:").filter(|p| !p.is_empty()) {
                Some(path) => Ok(Self::Expected(path.into())),
                None => Err(format!(
                    "`{text}`: expected values need their file, `expected:PATH` (a safetensors \
                     file or an ONNX test_data_set folder)"
                )),
            };
        }
        RuntimeSpec::parse_among(text, &[EXPECTED]).map(Self::Runs)
    }

    /// Parses a runtime's spelling where only a runtime will do (`check --target`, `providers
    /// --runtimes`, `audit --runtimes`): expected values are refused as what they are.
    pub fn runtime_only(text: &str) -> Result<RuntimeSpec, String> {
        if text.split(':').next() == Some(EXPECTED.name) {
            return Err(format!(
                "`{text}` is a file of values, not a runtime: this option takes a runtime that \
                 computes the file (`ort`, `ort:opt=all`, `tract`, `openvino`…)"
            ));
        }
        RuntimeSpec::parse(text)
    }

    /// The spelling that parses back to it.
    pub fn spelling(&self) -> String {
        match self {
            Self::Runs(runtime) => runtime.spelling(),
            Self::Expected(path) => format!("expected:{}", path.display()),
        }
    }

    /// The runtime, where this side computes.
    pub fn runtime(&self) -> Option<&RuntimeSpec> {
        match self {
            Self::Runs(runtime) => Some(runtime),
            Self::Expected(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_values_are_a_side_and_no_runtime() {
        let side = OnnxSide::parse("expected:run/out.safetensors").unwrap();
        assert_eq!(side, OnnxSide::Expected("run/out.safetensors".into()));
        assert_eq!(side.spelling(), "expected:run/out.safetensors");
        assert!(side.runtime().is_none());
        assert!(RuntimeSpec::parse("expected:run/out.safetensors").is_err());
        let said = OnnxSide::parse("expected:").unwrap_err();
        assert!(said.contains("need their file, `expected:PATH`"), "{said}");
        assert_eq!(
            OnnxSide::parse("ort:opt=all").unwrap().runtime(),
            Some(&RuntimeSpec::parse("ort:opt=all").unwrap())
        );
        // a slip of either kind of side is named, and the short list names both
        let said = OnnxSide::parse("expectd:v.safetensors").unwrap_err();
        assert!(
            said.starts_with("unknown runtime `expectd`; did you mean `expected:PATH`?"),
            "{said}"
        );
        let said = OnnxSide::parse("tvm").unwrap_err();
        assert!(
            said.contains("`tract`, `openvino`") && said.contains("`expected:PATH`"),
            "{said}"
        );
        let said = OnnxSide::parse("openvno").unwrap_err();
        assert!(said.contains("did you mean `openvino`?"), "{said}");
        // where only a runtime will do, expected values are named as what they are
        let said = OnnxSide::runtime_only("expected:v.safetensors").unwrap_err();
        assert!(
            said.starts_with("`expected:v.safetensors` is a file of values, not a runtime"),
            "{said}"
        );
        assert!(OnnxSide::runtime_only("tract").is_ok());
    }
}
