//! What a framework's model is compared with, in the one side vocabulary: its ONNX file on a
//! runtime (`ort…`, `tract`, `openvino…`), or the framework itself computing differently
//! (`torch[:DEVICE][:PRECISION][:compile]`; Keras under `xla`, reloaded from a `savedmodel`, or
//! converted to `tflite`). Each spelling is parsed here, once, for every door.

use crate::spec::keras::KerasSpec;
use crate::spec::onnx_side::OnnxSide;
use crate::spec::torch::{LowerPrecision, Precision, TorchSpec};

/// The target of a framework's model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// The model's ONNX file run by a runtime (values read from a file parse here, and the
    /// verbs refuse them with what they need, see `verbs::captured::check_options`).
    Onnx(OnnxSide),
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
            OnnxSide::parse(text).map(Self::Onnx).map_err(|why| {
                if !why.starts_with("unknown runtime") {
                    return why;
                }
                // the framework sides this verb also takes
                let head = text.split(':').next().unwrap_or_default();
                let sides = ["torch", "tf", "xla", "savedmodel", "tflite"];
                let side = (!why.contains("did you mean"))
                    .then(|| layerdiff_runtime::nearest(head, &sides))
                    .flatten();
                match side {
                    Some(side) => format!(
                        "unknown side `{head}`; did you mean `{side}`? PyTorch: `torch:bf16`, \
                         `torch:compile`, `torch:cuda`…; TensorFlow: `tf`, `xla`, `savedmodel`, \
                         `tflite[:fp16|int8|dynamic]`; ONNX runtimes: `ort`, `tract`, `openvino`"
                    ),
                    None => format!(
                        "{why}; PyTorch: `torch:bf16`, `torch:compile`…; TensorFlow: `tf`, \
                         `xla`, `savedmodel`, `tflite`"
                    ),
                }
            })
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

/// The rules of a `torch` run's target, its lower precision (`--dtype`, `dtype=`), the layers
/// kept in float32 (`--keep-fp32`, `keep_fp32=`) and a file to use instead of exporting
/// (`--onnx`, `onnx=`), the same for the command line and the Python API. Returns the target
/// with the precision applied: a PyTorch target computes in it; an ONNX runtime target keeps its
/// spelling and its file is converted.
pub fn resolve_target(
    target: &TargetSpec,
    dtype: Option<LowerPrecision>,
    keep_fp32: bool,
    onnx: Option<&std::path::Path>,
) -> std::result::Result<TargetSpec, String> {
    if let Some(why) = target.unfit_for("PyTorch") {
        return Err(why);
    }
    target.file_fits(onnx)?;
    let Some(dtype) = dtype else {
        let lower_torch = matches!(
            target,
            TargetSpec::Torch(spec) if matches!(
                spec.precision,
                Precision::Fp16 | Precision::Bf16 | Precision::AmpFp16 | Precision::AmpBf16
            )
        );
        if keep_fp32 && !lower_torch {
            return Err("--keep-fp32 keeps layers of a lower-precision target in float32: give --dtype fp16, bf16 or int8, or a PyTorch target in fp16 or bf16 (cast or autocast)".to_string());
        }
        return Ok(target.clone());
    };
    match target {
        TargetSpec::Torch(spec) => {
            let wanted = match dtype {
                LowerPrecision::Fp16 => Precision::Fp16,
                LowerPrecision::Bf16 => Precision::Bf16,
                LowerPrecision::Int8 => {
                    return Err(format!(
                        "--dtype int8 quantizes the ONNX export with ONNX Runtime; the target `{}` is PyTorch itself (give --target ort)",
                        spec.spelling()
                    ));
                }
            };
            if spec.precision != Precision::Fp32 && spec.precision != wanted {
                return Err(format!(
                    "--dtype {} and the target `{}` name two precisions: give one",
                    dtype.dtype_name(),
                    spec.spelling()
                ));
            }
            let mut spec = spec.clone();
            spec.precision = wanted;
            Ok(TargetSpec::Torch(spec))
        }
        TargetSpec::Onnx(runtime) if dtype == LowerPrecision::Bf16 => Err(format!(
            "--dtype bf16: ONNX Runtime has no bfloat16 conversion of a model (and few bfloat16 kernels); compare PyTorch in bfloat16 with `--target torch --dtype bf16`, or give --dtype fp16 for `{}`",
            runtime.spelling()
        )),
        TargetSpec::Onnx(_) | TargetSpec::Keras(_) => Ok(target.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_spelling_is_an_onnx_target_and_a_misspelling_is_refused() {
        assert!(matches!(
            TargetSpec::parse("ort:opt=all"),
            Ok(TargetSpec::Onnx(_))
        ));
        assert!(TargetSpec::parse("torchy").is_err());
    }
}
