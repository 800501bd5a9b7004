//! The options of the PyTorch verbs, `torch` and `grad`, and what they resolve to.

use super::{Args, Judging, PathBuf, ReportArgs, TargetSpec, TorchSpec, ValueEnum};
use layerdiff_flow::spec::target::resolve_target;
use layerdiff_flow::spec::torch::LowerPrecision;

/// Options of `layerdiff grad`.
#[derive(Debug, Clone, Args)]
pub struct GradArgs {
    /// A built-in model, a builder or a checkpoint folder, as for `layerdiff torch`.
    pub model: String,
    /// The PyTorch side whose gradients are measured: `torch[:DEVICE][:PRECISION][:compile]`
    /// (`torch:cuda`, `torch:bf16`, `torch:amp-fp16`, `torch:compile`). In float16 (`fp16`,
    /// `amp-fp16`) the loss is scaled as `torch.amp.GradScaler` does and the gradients unscaled
    /// before they are compared: what the optimizer would see. `torch[:DEVICE][:PRECISION]:ddp=N`
    /// trains it as DistributedDataParallel in N processes (gloo; NCCL on CUDA), each on its rows
    /// of the batch, against the same side in one process: each rank's gradient before the
    /// all-reduce, and each parameter's after it.
    #[arg(long, value_parser = TorchSpec::parse)]
    pub target: TorchSpec,
    /// The PyTorch side it is measured against (default `torch`: CPU, float32, eager).
    #[arg(long, default_value = "torch", value_parser = TorchSpec::parse)]
    pub reference: TorchSpec,
    /// The loss both sides differentiate: `dot` (the output's dot product with a fixed random
    /// tensor from the seed, so every output element gets its own gradient) or `sum`.
    #[arg(long, value_enum, default_value_t = Loss::Dot)]
    pub loss: Loss,
    /// Seed for the model's random weights, generated inputs and the `dot` loss's tensor.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write a checked minimal reproduction of the headline gradient into this folder: the
    /// backward alone of the module call that computes it, for the output gradient the whole
    /// backward gave that call (its structure, weights, inputs and that gradient), and a
    /// repro.py that runs it on the reference side and the target side. A clean run writes none.
    #[arg(long, value_name = "DIR")]
    pub repro: Option<PathBuf>,
    /// How every layer is judged.
    #[command(flatten)]
    pub judging: Judging,
    /// Where reports go.
    #[command(flatten)]
    pub report: ReportArgs,
}

impl GradArgs {
    /// Whether the options fit together: no repro of a data-parallel target.
    pub fn check(&self) -> Result<(), String> {
        if self.repro.is_some() && self.target.ranks > 1 {
            return Err(format!(
                "--repro writes one module call's backward alone, in one process; `{}` is found \
                 rank by rank (each rank's gradient against one process on its rows), so its \
                 report names the rank and the parameter: leave --repro out",
                self.target
            ));
        }
        Ok(())
    }
}

/// The loss `layerdiff grad` differentiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Loss {
    /// The output's dot product with a fixed random tensor.
    Dot,
    /// The sum of the output.
    Sum,
}

/// Options of `layerdiff torch`.
#[derive(Debug, Clone, Args)]
pub struct TorchArgs {
    /// A built-in model (`layerdiff zoo` lists them: `resnet18`, `vit_b_16`, `llama`, `t5`…),
    /// one an installed package registers, a builder: `path/to/file.py:build` or
    /// `package.module:build`, where `build()` returns `(model, example_inputs)`; or a
    /// transformers checkpoint folder (`path/to/folder`: the config.json and weights
    /// `save_pretrained` writes), loaded from local files in float32 with the head its config
    /// names, its cache off, run on token ids from the seed.
    pub model: String,
    /// Seed for the model's random weights and for generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Which `torch.onnx.export` path produces the ONNX file.
    #[arg(long, value_enum, default_value_t = Exporter::Dynamo)]
    pub exporter: Exporter,
    /// Export anew instead of reusing an export of the same model kept from an earlier run
    /// (exports are kept in `LAYERDIFF_CACHE_DIR`, else `~/.cache/layerdiff`, keyed by the
    /// weights, the model's code, the inputs, the exporter and its versions).
    #[arg(long)]
    pub no_cache: bool,
    /// Compare against this ONNX file of the same model instead of exporting one.
    #[arg(long, value_name = "PATH")]
    pub onnx: Option<PathBuf>,
    /// What the model is compared with. The runtime that runs its ONNX file: `ort` (CPU, graph
    /// optimizations off, so every value exists as written), `ort:opt=basic|extended|all`
    /// (optimized first: the values of the graph ONNX Runtime saved are compared), `ort:cuda`…
    /// (`ort:cuda:use_tf32=0`: a provider's options in ONNX Runtime's names), `tract`, or
    /// `openvino[:precision=f32|f16|bf16]` (OpenVINO's CPU plugin). Or
    /// PyTorch itself computing differently, layer by layer:
    /// `torch[:DEVICE][:PRECISION][:compile[=BACKEND]]`, DEVICE as torch.device takes it (`cpu`,
    /// `cuda`, `cuda:1`, `mps`), PRECISION one of `fp32`, `tf32`, `fp16`, `bf16`, `amp-fp16`,
    /// `amp-bf16` (e.g. `torch:cuda:bf16`, `torch:compile`).
    #[arg(long, default_value = "ort", value_parser = TargetSpec::parse)]
    pub target: TargetSpec,
    /// The PyTorch side the target is measured against, spelled as a PyTorch --target
    /// (`torch:cuda`); default `torch`, the model as given: CPU, float32, eager. Other than
    /// `torch` only with a PyTorch target.
    #[arg(long, default_value = "torch", value_parser = TorchSpec::parse)]
    pub reference: TorchSpec,
    /// The precision the target computes in, against the float32 model. With an ONNX runtime
    /// target, `fp16` converts the export with ONNX Runtime's float16 converter (inputs and
    /// outputs kept float32) and `int8` quantizes it with ONNX Runtime's static QDQ quantizer,
    /// calibrated on the inputs and variations of them; with a PyTorch target, `fp16` and `bf16`
    /// are its PRECISION (`--target torch --dtype bf16` is `torch:bf16`). When the target
    /// drifts, the report names the layers to keep in float32 and checks that advice by
    /// re-running with them kept.
    #[arg(long, value_enum)]
    pub dtype: Option<TargetDtype>,
    /// Layers to keep in float32 in a lower-precision target (`--dtype`, or a PyTorch target in
    /// fp16 or bf16, cast or under autocast), comma-separated, named as in the report; the run
    /// is checked against the same target without them kept.
    #[arg(long, value_delimiter = ',', value_name = "LAYERS")]
    pub keep_fp32: Vec<String>,
    /// With a PyTorch target that drifts, find what turns the difference on: a torch.compile
    /// target, the first compiler stage that shows the headline's difference on its module
    /// alone (eager → aot_eager → aot_eager_decomp_partition → inductor) and, with Inductor,
    /// the subsystem (a graph pass, a lowering, a config: PyTorch's own bisector); a float16 or
    /// bfloat16 target, the smallest set of layers to keep in float32 that brings the output
    /// within its tolerance. Each answer is checked by a run, and named in the report.
    #[arg(long)]
    pub bisect: bool,
    /// Write a checked minimal reproduction of the headline defect into this folder. Against
    /// an ONNX target: the layer's ONNX nodes (model.onnx) fed PyTorch's values at their inputs,
    /// PyTorch's value of the layer, and a repro.py that runs them on the target's runtime with
    /// numpy alone. Against a PyTorch target: its module alone (its structure, module.pt; its
    /// weights and the reference's inputs to it as safetensors), the reference's output, and a
    /// repro.py that imports the module's class (and your model's file) from your code and
    /// runs reference and target. With a README.md; a clean run writes none. Along an axis
    /// (`--decode-steps`, `--batch-sizes`, `--shapes`): the first point with a headline defect.
    #[arg(long, value_name = "DIR")]
    pub repro: Option<PathBuf>,
    /// Compare at each of these batch sizes (`1,8,32`): the model is exported once with a
    /// dynamic batch dimension and checked at each, with inputs generated like the example's;
    /// the axis report says which sizes drift and which layers pass at one size and fail at
    /// another (`--out`: axis.json, axis.md, and each size's reports in batch-N/).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "SIZES",
        value_parser = positive,
        conflicts_with = "shapes"
    )]
    pub batch_sizes: Vec<usize>,
    /// Compare at these input shapes, one `--shapes` per point: each input's shape, the inputs
    /// separated by commas (`--shapes 1x3x224x224 --shapes 4x3x160x160`; two inputs:
    /// `2x128,2x128`). The dimensions that differ are exported dynamic.
    #[arg(long, value_name = "SHAPES", value_parser = parse_shapes)]
    pub shapes: Vec<Vec<Vec<usize>>>,
    /// Compare a transformers decoder as it generates: the prefill, then N single-token steps
    /// that read the key/value cache, both sides fed the reference's greedy tokens and its
    /// cache at every step; every layer of every step judged, the axis report naming the step
    /// and the layer where a fault is born (`--out`: axis.json, axis.md, each step's reports in
    /// prefill/ and step-N/). The ONNX file takes the cache as inputs and gives it as outputs,
    /// its token count and cache length dynamic (`--onnx`: such a file of yours).
    #[arg(
        long,
        value_name = "N",
        value_parser = positive,
        conflicts_with_all = ["batch_sizes", "shapes", "dtype", "keep_fp32", "bisect"]
    )]
    pub decode_steps: Option<usize>,
    /// How every layer is judged.
    #[command(flatten)]
    pub judging: Judging,
    /// Where reports go.
    #[command(flatten)]
    pub report: ReportArgs,
}

/// A count above zero.
pub(crate) fn positive(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{text}` is not a size above zero")),
    }
}

/// The shapes of one point: each input's dimensions joined by `x`, inputs by commas.
fn parse_shapes(text: &str) -> Result<Vec<Vec<usize>>, String> {
    text.split(',')
        .map(|shape| {
            shape
                .trim()
                .split('x')
                .map(positive)
                .collect::<Result<Vec<usize>, String>>()
                .map_err(|_| format!("`{shape}` is not a shape such as 1x3x224x224"))
        })
        .collect()
}

/// The precision a lower-precision target computes in (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetDtype {
    /// float16.
    Fp16,
    /// bfloat16 (a PyTorch target).
    Bf16,
    /// int8, quantized with ONNX Runtime's static QDQ quantizer (an ONNX runtime target).
    Int8,
}

impl TargetDtype {
    /// The engine's name for it.
    pub fn lower(self) -> LowerPrecision {
        match self {
            Self::Fp16 => LowerPrecision::Fp16,
            Self::Bf16 => LowerPrecision::Bf16,
            Self::Int8 => LowerPrecision::Int8,
        }
    }
}

/// Export paths of `torch.onnx.export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Exporter {
    /// `dynamo=True`, the default exporter.
    Dynamo,
    /// `dynamo=False`, the TorchScript-based exporter.
    Legacy,
}

impl TorchArgs {
    /// The target with `--dtype` applied (the rules are the engine's, shared with the Python
    /// API: [`layerdiff_flow::spec::target::resolve_target`]), and the dtype.
    pub fn dtype_target(&self) -> Result<(TargetSpec, Option<TargetDtype>), String> {
        let target = resolve_target(
            &self.target,
            self.dtype.map(TargetDtype::lower),
            !self.keep_fp32.is_empty(),
            self.onnx.as_deref(),
        )?;
        if self.bisect && !matches!(target, TargetSpec::Torch(_)) {
            return Err(
                "`--bisect` works on a PyTorch target here (`--target torch:bf16`, \
                 `torch:compile`…); against the ONNX export, run `layerdiff onnx` on the export \
                 (`--out DIR` saves it as model.onnx) with `--target ort:opt=…` and `--bisect`"
                    .to_string(),
            );
        }
        Ok((target, self.dtype))
    }
}
