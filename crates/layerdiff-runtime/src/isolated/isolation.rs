//! Which sides run in a worker process: what `--isolate` says, and a runtime's own needs.

use crate::RuntimeSpec;

/// Which sides run in a worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Those whose runtime loads code layerdiff does not know (a custom-op library).
    #[default]
    Auto,
    /// Every side that computes.
    Always,
    /// None: everything runs in this process.
    Never,
}

impl Isolation {
    /// The spellings, as the command line takes them.
    pub const NAMES: [&'static str; 3] = ["auto", "always", "never"];

    /// Parses `auto`, `always` or `never`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            _ => Err(format!(
                "unknown isolation `{text}` (expected one of: {})",
                Self::NAMES.join(", ")
            )),
        }
    }

    /// Whether a side on `spec` runs in a worker process: one on another release's library
    /// always does (this process has loaded its own); `Auto`, one that loads a vendor's code (a
    /// custom-op library, an execution provider's plugin library).
    pub fn applies(self, spec: &RuntimeSpec) -> bool {
        let runtime = spec.configured();
        runtime.release().is_some()
            || match self {
                Self::Never => false,
                Self::Always => true,
                Self::Auto => runtime.loads_vendor_code(),
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_applies_to_untrusted_code_by_default() {
        let ort = RuntimeSpec::parse("ort").unwrap();
        let vendor = RuntimeSpec::parse("ort:custom_ops=/opt/libvendor.so").unwrap();
        assert!(!Isolation::Auto.applies(&ort));
        assert!(Isolation::Auto.applies(&vendor));
        assert!(Isolation::Always.applies(&RuntimeSpec::tract()));
        assert!(!Isolation::Never.applies(&vendor));
        // another release of a runtime this process loads once
        for release in [
            "ort:lib=/opt/ort/libonnxruntime.so",
            "openvino:lib=/opt/ov/libopenvino_c.so",
        ] {
            assert!(Isolation::Never.applies(&RuntimeSpec::parse(release).unwrap()));
        }
        assert!(!Isolation::Auto.applies(&RuntimeSpec::parse("openvino").unwrap()));
        assert_eq!(
            Isolation::parse("sometimes").unwrap_err(),
            "unknown isolation `sometimes` (expected one of: auto, always, never)"
        );
    }
}
