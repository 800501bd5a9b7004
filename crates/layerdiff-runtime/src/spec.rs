//! Runtimes are spelled the same way everywhere: `ort` (CPU execution provider, optimizations
//! off), `ort:opt=basic|extended|all`, `tract`, `expected:PATH`.

use std::path::Path;

use layerdiff_onnx::Model;

use crate::{ExpectedValues, OptLevel, OrtRuntime, Result, Runtime, TractRuntime};

/// A runtime named on the command line or in the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeSpec {
    /// ONNX Runtime, CPU execution provider, with this graph optimization level.
    Ort(OptLevel),
    /// tract.
    Tract,
    /// Values read from a file: `expected:PATH` (safetensors, or an ONNX test data folder).
    Expected(std::path::PathBuf),
}

impl RuntimeSpec {
    /// Parses `ort`, `ort:opt=LEVEL` or `tract`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let level = |l: &str| match l {
            "disable" => Some(OptLevel::Disable),
            "basic" => Some(OptLevel::Basic),
            "extended" => Some(OptLevel::Extended),
            "all" => Some(OptLevel::All),
            _ => None,
        };
        match text {
            "ort" => Ok(Self::Ort(OptLevel::Disable)),
            "tract" => Ok(Self::Tract),
            other if other.starts_with("expected:") && other.len() > "expected:".len() => {
                Ok(Self::Expected(other["expected:".len()..].into()))
            }
            other => other
                .strip_prefix("ort:opt=")
                .and_then(level)
                .map(Self::Ort)
                .ok_or_else(|| format!("unknown runtime `{other}` (expected `ort`, `ort:opt=disable|basic|extended|all`, `tract` or `expected:PATH`)")),
        }
    }

    /// The spelling that parses back to this spec.
    pub fn spelling(&self) -> String {
        match self {
            Self::Ort(OptLevel::Disable) => "ort".to_string(),
            Self::Ort(level) => format!("ort:opt={}", level.name()),
            Self::Tract => "tract".to_string(),
            Self::Expected(path) => format!("expected:{}", path.display()),
        }
    }

    /// Builds the runtime for `model` (loading ONNX Runtime from `ort_library`, or found, when
    /// needed; reading expected values for this model's inputs and outputs).
    pub fn build(
        &self,
        ort_library: Option<&Path>,
        model: &Model,
    ) -> Result<Box<dyn Runtime + Send + Sync>> {
        Ok(match self {
            Self::Ort(level) => Box::new(OrtRuntime::new(ort_library, *level)?),
            Self::Tract => Box::new(TractRuntime),
            Self::Expected(path) => Box::new(ExpectedValues::load(path, model)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for s in [
            "ort",
            "ort:opt=basic",
            "ort:opt=extended",
            "ort:opt=all",
            "tract",
        ] {
            assert_eq!(RuntimeSpec::parse(s).unwrap().spelling(), s);
        }
        assert!(
            RuntimeSpec::parse("ort:cuda")
                .unwrap_err()
                .contains("unknown runtime `ort:cuda`")
        );
    }
}
