//! What a framework's model is compared with, in the one side vocabulary: its ONNX file on a
//! runtime (`ort…`, `tract`, `openvino…`), or the framework itself computing differently
//! (`torch[:DEVICE][:PRECISION][:compile]`; Keras under `xla`, reloaded from a `savedmodel`, or
//! converted to `tflite`). Each spelling is parsed here, once, for every door.

use layerdiff_runtime::RuntimeSpec;

use crate::spec::keras::KerasSpec;
use crate::spec::torch::TorchSpec;

/// The target of a framework's model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// The model's ONNX file run by a runtime.
    Onnx(RuntimeSpec),
    /// PyTorch on a device, in a precision, eager or compiled.
    Torch(TorchSpec),
    /// Keras computed another way by TensorFlow (XLA, a SavedModel, TFLite).
    Keras(KerasSpec),
}

impl TargetSpec {
    /// Parses a PyTorch side (`torch…`), a Keras side (`xla`, `savedmodel`, `tflite…`) or a
    /// runtime (`ort…`, `tract`, `openvino…`, `expected:`).
    pub fn parse(text: &str) -> Result<Self, String> {
        if TorchSpec::names_torch(text) {
            TorchSpec::parse(text).map(Self::Torch)
        } else if KerasSpec::names_keras(text) {
            KerasSpec::parse(text).map(Self::Keras)
        } else {
            RuntimeSpec::parse(text).map(Self::Onnx)
        }
    }

    /// The spelling that parses back to it.
    pub fn spelling(&self) -> String {
        match self {
            Self::Onnx(runtime) => runtime.spelling(),
            Self::Torch(torch) => torch.spelling(),
            Self::Keras(keras) => keras.spelling(),
        }
    }

    /// Whether an ONNX file given to use instead of a conversion (`--onnx`, `onnx=`) fits this
    /// target: one that runs an ONNX file, and a file that exists.
    pub fn file_fits(&self, onnx: Option<&std::path::Path>) -> Result<(), String> {
        let Some(onnx) = onnx else { return Ok(()) };
        let itself = match self {
            Self::Onnx(_) => None,
            Self::Torch(_) => Some("PyTorch"),
            Self::Keras(_) => Some("TensorFlow"),
        };
        if let Some(framework) = itself {
            return Err(format!(
                "--onnx names a file for an ONNX runtime target; the target `{}` is {framework} itself",
                self.spelling()
            ));
        }
        if !onnx.is_file() {
            return Err(format!("ONNX file `{}` does not exist", onnx.display()));
        }
        Ok(())
    }

    /// Why this target does not fit a model of `framework` (`PyTorch`, `Keras`), if it does not.
    pub fn unfit_for(&self, framework: &str) -> Option<String> {
        if *self == Self::Keras(KerasSpec::Tf) {
            return Some(
                "`tf` is TensorFlow eager, which computes a Keras model's reference itself: it is an op backend (`layerdiff ops --backends tf,xla`); a Keras model's target is a runtime for its ONNX file (`ort`, `tract`, `openvino`) or `xla`, `savedmodel`, `tflite`".to_string(),
            );
        }
        let (side, verb) = match self {
            Self::Torch(_) if framework != "PyTorch" => ("a PyTorch side", "torch"),
            Self::Keras(_) if framework != "Keras" => ("a Keras side", "keras"),
            _ => return None,
        };
        Some(format!(
            "`{}` is {side}: compare it with `layerdiff {verb}`; a {framework} model's target is a runtime for its ONNX file (`ort`, `tract`, `openvino`){}",
            self.spelling(),
            match framework {
                "PyTorch" => " or a PyTorch side (`torch:bf16`, `torch:cuda`)",
                _ => " or a Keras side (`xla`, `savedmodel`, `tflite`)",
            }
        ))
    }
}
