//! Keras sides spelled like runtimes, parsed once: the model compiled by XLA (`xla`), reloaded
//! from a SavedModel (`savedmodel`), or converted by the TFLite converter and run by its
//! interpreter (`tflite[:fp32|fp16|int8|dynamic]`). The Python package computes them (TensorFlow lives
//! there) and hands their values over layer by layer.

use std::fmt;

/// What the TFLite converter is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TflitePrecision {
    /// Float32 throughout.
    F32,
    /// Weights stored in float16 (`target_spec.supported_types = [tf.float16]`), computed in
    /// float32 on a CPU.
    F16,
    /// Full-integer quantization: int8 weights and activations, calibrated on a representative
    /// dataset; float inputs and outputs.
    Int8,
    /// Dynamic-range quantization: int8 weights (the larger ones), float activations that the
    /// kernels quantize to int8 as they run.
    Dynamic,
}

/// A Keras side that TensorFlow computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KerasSpec {
    /// TensorFlow eager: what computes a Keras model's reference, so an op backend
    /// (`layerdiff ops --backends tf`) and never a Keras model's target.
    Tf,
    /// The model under `tf.function(jit_compile=True)`: XLA's fusions and kernels.
    Xla,
    /// The model saved as a SavedModel and loaded back with `tf.saved_model.load`.
    SavedModel,
    /// The model converted to TFLite and run by the TFLite interpreter.
    Tflite(TflitePrecision),
}

impl KerasSpec {
    /// Whether `text` names a Keras side rather than a runtime.
    pub fn names_keras(text: &str) -> bool {
        matches!(text, "tf" | "xla" | "savedmodel" | "tflite") || text.starts_with("tflite:")
    }

    /// Parses `tf`, `xla`, `savedmodel`, `tflite`, `tflite:fp16`, `tflite:int8`,
    /// `tflite:dynamic`.
    pub fn parse(text: &str) -> Result<Self, String> {
        Ok(match text {
            "tf" => Self::Tf,
            "xla" => Self::Xla,
            "savedmodel" => Self::SavedModel,
            "tflite" | "tflite:fp32" => Self::Tflite(TflitePrecision::F32),
            "tflite:fp16" => Self::Tflite(TflitePrecision::F16),
            "tflite:int8" => Self::Tflite(TflitePrecision::Int8),
            "tflite:dynamic" => Self::Tflite(TflitePrecision::Dynamic),
            _ => {
                return Err(format!(
                    "unknown Keras side `{text}` (expected tf, xla, savedmodel, tflite, tflite:fp16, tflite:int8 or tflite:dynamic)"
                ));
            }
        })
    }

    /// The spelling that parses back to it.
    pub fn spelling(&self) -> String {
        match self {
            Self::Tf => "tf",
            Self::Xla => "xla",
            Self::SavedModel => "savedmodel",
            Self::Tflite(TflitePrecision::F32) => "tflite",
            Self::Tflite(TflitePrecision::F16) => "tflite:fp16",
            Self::Tflite(TflitePrecision::Int8) => "tflite:int8",
            Self::Tflite(TflitePrecision::Dynamic) => "tflite:dynamic",
        }
        .to_string()
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
        for text in [
            "tf",
            "xla",
            "savedmodel",
            "tflite",
            "tflite:fp16",
            "tflite:int8",
            "tflite:dynamic",
        ] {
            assert!(KerasSpec::names_keras(text));
            assert_eq!(KerasSpec::parse(text).unwrap().spelling(), text);
        }
        assert_eq!(
            KerasSpec::parse("tflite:fp32").unwrap().spelling(),
            "tflite"
        );
        let err = KerasSpec::parse("tflite:int4").unwrap_err();
        assert!(err.contains("unknown Keras side `tflite:int4`"), "{err}");
        assert!(!KerasSpec::names_keras("ort"));
    }
}
