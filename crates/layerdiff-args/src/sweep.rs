//! The options of `layerdiff sweep`: models × targets (× precisions × batch sizes), each a
//! `layerdiff torch` run of its own, and one index of their verdicts.

use super::torch::positive;
use super::{Args, Destinations, Executor, FailOn, PathBuf, TargetDtype, TargetSpec};

/// Options of `layerdiff sweep`.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// The models, comma-separated or one per argument, each as `layerdiff torch` takes it: a
    /// built-in name (`layerdiff zoo`), a builder `path/to/file.py:build`, or a transformers
    /// checkpoint folder.
    #[arg(required = true, value_delimiter = ',', value_name = "MODEL")]
    pub models: Vec<String>,
    /// The targets each model is compared with, comma-separated, each spelled as `layerdiff
    /// torch --target` takes it (`ort`, `ort:opt=all`, `tract`, `openvino`, `torch:bf16`…).
    #[arg(long, value_delimiter = ',', default_value = "ort", value_parser = TargetSpec::parse)]
    pub targets: Vec<TargetSpec>,
    /// The precisions each target computes in (`fp16`, `bf16`, `int8`; `fp32`: as the target
    /// computes), comma-separated: one run each, as `layerdiff torch --dtype`. A precision a
    /// target cannot take (`int8` with a PyTorch target) is a row that could not run, said why.
    #[arg(long, value_delimiter = ',', value_parser = sweep_dtype)]
    pub dtypes: Vec<Option<TargetDtype>>,
    /// The batch sizes each run is made at, comma-separated: one run each, as `layerdiff torch
    /// --batch-sizes N` (default: the model's example inputs as they are).
    #[arg(long, value_delimiter = ',', value_name = "SIZES", value_parser = positive)]
    pub batch_sizes: Vec<usize>,
    /// Seed of every run's weights and inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Runs at once (default: one per two logical cores, at least one): each in a process of
    /// its own, the cores shared among them.
    #[arg(long, value_name = "N", value_parser = positive)]
    pub jobs: Option<usize>,
    /// Where the runs go: `local` (processes on this machine) or `ray` (one Ray task per run,
    /// on the cluster `RAY_ADDRESS` names, else a local Ray instance; needs `pip install
    /// 'layerdiff[ray]'`). The index is the same either way.
    #[arg(long, value_enum, default_value_t = Executor::Local)]
    pub executor: Executor,
    /// When a run counts as failing the sweep (exit 1), as `layerdiff torch --fail-on`.
    #[arg(long, value_name = "WHEN", default_value = "defect", value_parser = fail_on)]
    pub fail_on: String,
    /// The folder the sweep fills: index.json, index.md and index.html, and each run's
    /// reports under runs/.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Print nothing but errors; the exit code still tells the verdict.
    #[arg(long, short)]
    pub quiet: bool,
}

/// A `--fail-on` as spelled, once the rule takes it: each run is given it as it is.
fn fail_on(text: &str) -> Result<String, String> {
    FailOn::parse(text).map(|_| text.to_string())
}

/// A precision of `--dtypes`: `fp32` (as the target computes) or one `--dtype` takes.
fn sweep_dtype(text: &str) -> Result<Option<TargetDtype>, String> {
    use clap::ValueEnum;
    match text {
        "fp32" | "float32" => Ok(None),
        _ => TargetDtype::from_str(text, false)
            .map(Some)
            .map_err(|_| format!("unknown precision `{text}` (expected fp32, fp16, bf16 or int8)")),
    }
}

impl SweepArgs {
    /// Where the index goes: index.json, index.md and index.html in `--out`.
    pub fn destinations(&self) -> Destinations {
        Destinations {
            json: Some(self.out.join("index.json")),
            markdown: Some(self.out.join("index.md")),
            html: Some(self.out.join("index.html")),
            quiet: self.quiet,
            fail_on: FailOn::parse(&self.fail_on).unwrap_or_default(),
            ..Destinations::default()
        }
    }
}
