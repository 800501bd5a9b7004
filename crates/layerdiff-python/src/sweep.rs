//! `layerdiff sweep` across the boundary: its parsed options, and the index of its runs
//! (made by the Python package) written and printed by the engine's renderers.

use std::path::PathBuf;

use layerdiff_args::SweepArgs;
use layerdiff_flow::verbs::sweep::{SweepIndex, deliver};
use pyo3::prelude::*;

use crate::exceptions::to_py_err;

/// `layerdiff sweep` as parsed from a command line.
#[pyclass(module = "layerdiff._layerdiff", frozen, get_all)]
pub(crate) struct SweepCommand {
    /// The models, as given.
    models: Vec<String>,
    /// The targets, as spelled.
    targets: Vec<String>,
    /// The precisions (`None`: as the target computes).
    dtypes: Vec<Option<String>>,
    /// The batch sizes (empty: the example inputs as they are).
    batch_sizes: Vec<usize>,
    /// Seed of every run.
    seed: u64,
    /// Runs at once (`None`: one per two logical cores).
    jobs: Option<usize>,
    /// `local` or `ray`.
    executor: String,
    /// Each run's `--fail-on`, as spelled.
    fail_on: String,
    /// The folder the sweep fills.
    out: PathBuf,
    /// Print nothing but errors.
    quiet: bool,
}

impl SweepCommand {
    pub(crate) fn new(a: SweepArgs) -> Self {
        Self {
            models: a.models,
            targets: a.targets.iter().map(|t| t.spelling()).collect(),
            dtypes: a
                .dtypes
                .iter()
                .map(|d| d.as_ref().map(layerdiff_args::spelling))
                .collect(),
            batch_sizes: a.batch_sizes,
            seed: a.seed,
            jobs: a.jobs,
            executor: layerdiff_args::spelling(&a.executor),
            fail_on: a.fail_on.clone(),
            out: a.out.clone(),
            quiet: a.quiet,
        }
    }
}

/// Writes and prints the index (its JSON, as the package made it) into the command's folder;
/// returns the exit code.
#[pyfunction]
#[pyo3(signature = (command, index))]
pub(crate) fn deliver_sweep(py: Python<'_>, command: &SweepCommand, index: &str) -> PyResult<u8> {
    let to = layerdiff_flow::output::Destinations {
        json: Some(command.out.join("index.json")),
        markdown: Some(command.out.join("index.md")),
        html: Some(command.out.join("index.html")),
        quiet: command.quiet,
        ..Default::default()
    };
    py.detach(|| deliver(&SweepIndex::from_json(index)?, &command.out, &to))
        .map_err(to_py_err)
}
