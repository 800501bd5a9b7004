//! The options of `layerdiff keras`: a Keras model against its ONNX file (tf2onnx) on a
//! runtime, or against TensorFlow computing it another way (XLA, a SavedModel, TFLite).

use super::{Args, Judging, PathBuf, ReportArgs, TargetSpec};
/// A target for a Keras model: a runtime for its ONNX file, or a Keras side; PyTorch sides are
/// refused by name.
fn keras_target(text: &str) -> Result<TargetSpec, String> {
    let target = TargetSpec::parse(text)?;
    match target.unfit_for("Keras") {
        Some(why) => Err(why),
        None => Ok(target),
    }
}

/// Options of `layerdiff keras`.
#[derive(Debug, Args)]
pub struct KerasArgs {
    /// A built-in Keras model (`keras_cnn`, `keras_mobilenet_v2`), a `.keras`
    /// file (its inputs generated from the model's input shapes, batch 1), or a builder:
    /// `path/to/file.py:build` or `package.module:build`, where `build()` returns `(model,
    /// example_inputs)`.
    pub model: String,
    /// What the model is compared with. A runtime for its ONNX file (converted by tf2onnx, or
    /// given with --onnx): `ort`, `ort:opt=all`, `tract`, `openvino[:precision=f16]`. Or
    /// TensorFlow computing it another way, layer by layer: `xla` (`jit_compile=True`),
    /// `savedmodel` (saved and loaded back), `tflite` (the TFLite converter and interpreter,
    /// float32), `tflite:fp16` (float16 weights), `tflite:int8` (full-integer quantization,
    /// calibrated on the compared inputs and draws like them; judged in steps of each value's
    /// scale), `tflite:dynamic` (dynamic range: int8 weights, activations quantized as the
    /// kernels run).
    #[arg(long, default_value = "ort", value_parser = keras_target)]
    pub target: TargetSpec,
    /// Compare with the model's PyTorch twin instead: a builder (`path/to/file.py:build`
    /// returning the PyTorch model, which takes the inputs channels-first) or `twin`, a
    /// built-in model's own. Keras layers pair with PyTorch modules by --weight-map, by name,
    /// then in order among the layers that hold weights; 4-D values are compared NHWC, and each
    /// module is re-run on Keras's values of its inputs.
    #[arg(long, value_name = "BUILDER", conflicts_with_all = ["target", "onnx"])]
    pub torch: Option<String>,
    /// A JSON file mapping Keras layer names to the PyTorch module names they pair with
    /// (`{"conv1": "stem.0"}`).
    #[arg(long, value_name = "FILE", requires = "torch")]
    pub weight_map: Option<PathBuf>,
    /// Copy the twin's weights into the Keras model (converted layer by layer, layouts
    /// included) before comparing, so only the architectures are compared. A built-in twin is
    /// always copied.
    #[arg(long, requires = "torch")]
    pub copy_weights: bool,
    /// Compare against this ONNX file of the same model instead of converting one with tf2onnx.
    #[arg(long, value_name = "PATH")]
    pub onnx: Option<PathBuf>,
    /// The ONNX opset tf2onnx converts to.
    #[arg(long, default_value_t = 17)]
    pub opset: u32,
    /// Seed for the model's random weights and for generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How every layer is judged.
    #[command(flatten)]
    pub judging: Judging,
    /// Where reports go.
    #[command(flatten)]
    pub report: ReportArgs,
}

impl KerasArgs {
    /// Why the options do not fit together, if they do not.
    pub fn check(&self) -> Result<(), String> {
        self.target.file_fits(self.onnx.as_deref())
    }
}
