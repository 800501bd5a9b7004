//! `layerdiff onnx`: arguments → inputs → [`crate::model_pair`] → reports and exit code.

use std::path::{Path, PathBuf};

use layerdiff_core::{Tolerance, write_safetensors};
use layerdiff_onnx::{GraphIndex, Model};
use layerdiff_runtime::{ExpectedValues, OptLevel, Provider, Runtime, RuntimeSpec};

use crate::cli::OnnxArgs;
use crate::inputs::{InputPlan, generate_inputs, read_inputs};
use crate::model_pair::{ModelPair, compare_models};
use crate::output::{exit_code, summary_text, write_reports};
use crate::segments::default_budget;
use crate::shipped::prepare_target;
use crate::timings::{OWN, RUNTIME, Stopwatch, timings_text};

/// Why `layerdiff onnx` could not run.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The flow failed.
    #[error(transparent)]
    Flow(#[from] crate::Error),
    /// A report could not be written.
    #[error("cannot write `{path}`: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

pub(crate) fn run(args: &OnnxArgs, ort_library: Option<&Path>) -> Result<u8, CommandError> {
    let mut clock = Stopwatch::default();
    if args.tolerance == Tolerance::Auto {
        return Err(crate::Error::Usage(
            "`--tolerance auto` needs a float64 run of the model, which only `layerdiff torch` makes; give a number or `dtype`".to_string(),
        )
        .into());
    }
    let reference = Model::load(&args.model).map_err(crate::Error::from)?;
    let target = match &args.vs {
        Some(path) => Some(Model::load(path).map_err(crate::Error::from)?),
        None => None,
    };
    let target_spec = args.target.clone().unwrap_or(if args.vs.is_some() {
        RuntimeSpec::Ort(Provider::Cpu, OptLevel::Disable)
    } else {
        RuntimeSpec::Tract
    });
    clock.lap("loading models", OWN);
    let runtime_err = |e| crate::Error::from(e);
    let (reference_runtime, stored_inputs) = match &args.reference {
        RuntimeSpec::Expected(path) => {
            let expected = ExpectedValues::load(path, &reference).map_err(runtime_err)?;
            let inputs = expected.inputs().map(<[_]>::to_vec);
            (Box::new(expected) as Box<dyn Runtime + Send + Sync>, inputs)
        }
        spec => (
            spec.build(ort_library, &reference).map_err(runtime_err)?,
            None,
        ),
    };
    let target_runtime = target_spec
        .build(ort_library, target.as_ref().unwrap_or(&reference))
        .map_err(runtime_err)?;
    clock.lap("runtime start-up", RUNTIME);
    let (inputs, seed) = match (&args.inputs, stored_inputs) {
        (Some(path), _) => (
            read_inputs(path, &GraphIndex::new(reference.graph()))?,
            None,
        ),
        (None, Some(stored)) => (stored, None),
        (None, None) => {
            let plan = InputPlan {
                seed: args.seed,
                shapes: args.shape.clone(),
                batch: args.batch,
                int_range: args.int_range,
            };
            (
                generate_inputs(&GraphIndex::new(reference.graph()), &plan)?,
                Some(args.seed),
            )
        }
    };
    clock.lap("making inputs", OWN);
    let target = prepare_target(&reference, target, target_runtime, &inputs)?;
    if target.shipped.is_some() {
        clock.lap("optimizing the target graph", RUNTIME);
    }
    let mut pair = ModelPair {
        reference: args.model.clone(),
        reference_model: reference,
        target: args.vs.clone(),
        target_model: target.model,
        reference_runtime,
        target_runtime: target.runtime,
        renames: target.renames,
        shipped: target.shipped,
        placement: target.placement,
        inputs,
        seed,
        tolerance: args.tolerance,
        local: !args.no_local,
        max_memory: args.max_memory.or_else(default_budget),
    };
    let (mut report, segmentation) = compare_models(&mut pair, &mut clock)?;
    if !args.report.timings {
        report.timings = None;
    }

    let (json, markdown) = (args.report.json_path(), args.report.markdown_path());
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CommandError::Write { path, source }
    };
    let mut written =
        write_reports(&report, json.as_deref(), markdown.as_deref()).map_err(write_err(
            json.as_deref()
                .or(markdown.as_deref())
                .unwrap_or(Path::new(".")),
        ))?;
    if let Some(path) = args.report.inputs_path() {
        let mut metadata =
            std::collections::BTreeMap::from([("producer".to_string(), "layerdiff".to_string())]);
        if let Some(seed) = seed {
            metadata.insert("seed".to_string(), seed.to_string());
        }
        write_safetensors(&path, &pair.inputs, metadata).map_err(crate::Error::from)?;
        written.push(path);
    }
    clock.lap("rendering and writing reports", OWN);
    if !args.report.quiet {
        if let Some(text) = segmentation.text() {
            eprintln!("{text}");
        }
        print!("{}", summary_text(&report));
        for path in written {
            eprintln!("wrote {}", path.display());
        }
    }
    if args.report.timings {
        eprint!("{}", timings_text(&clock.phases()));
    }
    Ok(exit_code(&report))
}
