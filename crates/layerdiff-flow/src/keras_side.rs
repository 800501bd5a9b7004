//! Keras sides spelled like runtimes, parsed once: the model compiled by XLA (`xla`), reloaded
//! from a SavedModel (`savedmodel`), or converted by the TFLite converter and run by its
//! interpreter (`tflite`). The Python
//! package computes them (TensorFlow lives there) and hands their values over layer by layer.

use std::fmt;

/// A Keras side that TensorFlow computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KerasSpec {
    /// The model under `tf.function(jit_compile=True)`: XLA's fusions and kernels.
    Xla,
    /// The model saved as a SavedModel and loaded back with `tf.saved_model.load`.
    SavedModel,
    /// The model converted to TFLite (float32) and run by the TFLite interpreter.
    Tflite,
}

impl KerasSpec {
    /// Whether `text` names a Keras side rather than a runtime.
    pub fn names_keras(text: &str) -> bool {
        matches!(text, "xla" | "savedmodel" | "tflite") || text.starts_with("tflite:")
    }

    /// Parses `xla`, `savedmodel`, `tflite`.
    pub fn parse(text: &str) -> Result<Self, String> {
        Ok(match text {
            "xla" => Self::Xla,
            "savedmodel" => Self::SavedModel,
            "tflite" | "tflite:fp32" => Self::Tflite,
            _ => {
                return Err(format!(
                    "unknown Keras side `{text}` (expected xla, savedmodel or tflite; TFLite's float16 and int8 conversions are not compared yet)"
                ));
            }
        })
    }

    /// The spelling that parses back to it.
    pub fn spelling(&self) -> String {
        match self {
            Self::Xla => "xla".to_string(),
            Self::SavedModel => "savedmodel".to_string(),
            Self::Tflite => "tflite".to_string(),
        }
    }
}

impl fmt::Display for KerasSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spelling())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keras_sides_parse_back_and_misspellings_name_the_choices() {
        for text in ["xla", "savedmodel", "tflite"] {
            assert!(KerasSpec::names_keras(text));
            assert_eq!(KerasSpec::parse(text).unwrap().spelling(), text);
        }
        let err = KerasSpec::parse("tflite:int4").unwrap_err();
        assert!(err.contains("unknown Keras side `tflite:int4`"), "{err}");
        assert!(!KerasSpec::names_keras("ort"));
    }
}
