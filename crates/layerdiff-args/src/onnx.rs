//! The options of `onnx`, and the inputs every verb that runs a model is given.

use super::{Args, InputPlan, Isolation, Judging, OnnxOptions, OnnxSide, PathBuf, ReportArgs};
/// How the inputs of an ONNX model are made: generated from a seed, or read from a file.
#[derive(Debug, Clone, Args)]
pub struct InputArgs {
    /// Seed of the generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Shape of one input, for dynamic dimensions: `--shape input_ids=1,128` (repeatable).
    #[arg(long, value_name = "NAME=D,D,…", value_parser = shape_spec)]
    pub shape: Vec<(String, Vec<usize>)>,
    /// Size of dynamic leading (batch) dimensions.
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Inclusive range of generated integer inputs (token ids, indices).
    #[arg(long, value_name = "LO,HI", default_value = "0,9", value_parser = int_range)]
    pub int_range: (i64, i64),
    /// Read the inputs from a file instead of generating them: safetensors, .npz, or an ONNX test
    /// data folder (input_0.pb, …).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["shape", "batch"])]
    pub inputs: Option<PathBuf>,
}

impl InputArgs {
    /// How inputs are generated.
    pub fn plan(&self) -> InputPlan {
        InputPlan {
            seed: self.seed,
            shapes: self.shape.clone(),
            batch: self.batch,
            int_range: self.int_range,
        }
    }
}

/// Options of `layerdiff onnx`.
#[derive(Debug, Clone, Args)]
pub struct OnnxArgs {
    /// The reference ONNX model.
    pub model: PathBuf,
    /// Compare against this second model file (same inputs), e.g. before and after an optimizer.
    #[arg(long, value_name = "OTHER.onnx")]
    pub vs: Option<PathBuf>,
    /// Runtime of the reference side: `ort` (CPU, optimizations off), `ort:cuda`,
    /// `ort:opt=basic|extended|all`, combinations (`ort:cuda:opt=all`), a provider's options in
    /// ONNX Runtime's names (`ort:cuda:use_tf32=0`), another ONNX Runtime library in a worker
    /// process (`ort:lib=PATH`: an older release, a vendor's build; `python -m layerdiff.releases
    /// onnxruntime==1.30.0` fetches one), an execution provider through ONNX Runtime's device API
    /// (`ort:ep=NAME`; a plugin library registered first: `ort:ep_lib=PATH[:ep=NAME]`, its
    /// options as `:KEY=VALUE`), `tract`, `openvino` (OpenVINO's CPU plugin;
    /// `openvino:precision=f16|bf16` hints its inference precision; `openvino:lib=PATH` runs
    /// another release's `libopenvino_c` in a worker process, `python -m layerdiff.releases
    /// openvino==2026.4.0` fetches one), or `expected:PATH` (values from a safetensors file or an
    /// ONNX test_data_set folder).
    #[arg(long, default_value = "ort", value_parser = OnnxSide::parse)]
    pub reference: OnnxSide,
    /// Runtime of the target side (same spellings). Default: `tract`, or `ort` with --vs. With
    /// `opt=…`, ONNX Runtime optimizes the file first and the values of the graph it saved are
    /// compared, so the graph measured is the one that ships.
    #[arg(long, value_parser = OnnxSide::parse)]
    pub target: Option<OnnxSide>,
    /// The inputs.
    #[command(flatten)]
    pub input: InputArgs,
    /// How every layer is judged.
    #[command(flatten)]
    pub judging: Judging,
    /// When layers exceed their tolerance on ONNX Runtime at `opt=basic|extended|all`, find
    /// which of its graph optimizers turn the difference on: candidate sets are disabled by
    /// halves, each run compared again, and the smallest set whose disabling leaves no layer
    /// beyond its tolerance is named in the report, with the run that checks it and the target
    /// spelled to run without them (`ort:opt=all:without=NchwcTransformer`).
    #[arg(long)]
    pub bisect: bool,
    /// Run the target's graph unmodified, for a target that cannot show its layers without
    /// changing what it runs (a compiled engine fuses what no output reads): whole first, then
    /// on node ranges fed with the reference's values, halved towards the range that deviates
    /// beyond its precision until one node is left (about log2 of the node count runs), which
    /// is then compared alone as a per-layer run compares a layer. The report names the node,
    /// its verdict and cause, every range run and how many runs it took.
    #[arg(long, conflicts_with_all = ["bisect", "repro"])]
    pub opaque: bool,
    /// Write a checked minimal reproduction of the headline defect into this folder: the few
    /// nodes that compute its layer (model.onnx), the reference's values at their inputs and of
    /// the layer (inputs.safetensors, expected.safetensors), a repro.py that runs the piece
    /// with the target's runtime and numpy alone, and a README.md. A clean run writes none.
    #[arg(long, value_name = "DIR")]
    pub repro: Option<PathBuf>,
    /// The most nodes a repro may grow to when fewer do not show the difference (a fusion).
    #[arg(long, value_name = "N", default_value_t = layerdiff_flow::onnx::MOST_NODES)]
    pub repro_nodes: usize,
    /// Which sides run in a worker process, so that a crash in native code (a segfault or an
    /// abort in a provider or a custom-op library) costs only the layers that depend on the node
    /// it dies on: `auto` (the default: sides that load a custom-op library), `always`, `never`.
    /// The layers left out are named in the report, with how the runtime died.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = Isolation::parse)]
    pub isolate: Isolation,
    /// Where reports go.
    #[command(flatten)]
    pub report: ReportArgs,
}

fn shape_spec(s: &str) -> Result<(String, Vec<usize>), String> {
    let (name, dims) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not NAME=D,D,… (e.g. x=1,3,224,224)"))?;
    let dims = dims
        .split(',')
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{d}` in `{s}` is not a dimension size"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_string(), dims))
}

fn int_range(s: &str) -> Result<(i64, i64), String> {
    let parsed = s
        .split_once(',')
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
    match parsed {
        Some((lo, hi)) if lo <= hi => Ok((lo, hi)),
        _ => Err(format!("`{s}` is not LO,HI with LO <= HI")),
    }
}

impl OnnxArgs {
    /// The options, as the engine takes them, or why they do not fit together.
    pub fn options(&self) -> Result<OnnxOptions, String> {
        Ok(OnnxOptions {
            model: self.model.clone(),
            vs: self.vs.clone(),
            reference: self.reference.clone(),
            target: self.target.clone(),
            inputs: self.input.inputs.clone(),
            generate: self.input.plan(),
            settings: self.judging.settings(false)?,
            bisect: self.bisect,
            repro: self.repro.clone(),
            repro_nodes: self.repro_nodes,
            isolation: self.isolate,
            opaque: self.opaque,
        })
    }
}
