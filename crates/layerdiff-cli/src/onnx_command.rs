//! `layerdiff onnx`: arguments → the engine ([`layerdiff_flow::onnx_flow`]) → outputs and exit
//! code.

use std::path::Path;

use layerdiff_flow::output::{deliver, exit_code};
use layerdiff_flow::timings::Stopwatch;
use layerdiff_flow::{Result, onnx_flow};

use crate::args::OnnxArgs;

pub(crate) fn run(args: &OnnxArgs, ort_library: Option<&Path>) -> Result<u8> {
    let outcome = onnx_flow::compare(&args.options(), ort_library)?;
    let notes: Vec<String> = outcome.segmentation.text().into_iter().collect();
    let report = deliver(
        outcome.report,
        &args.report.destinations(),
        &outcome.inputs,
        outcome.seed,
        &notes,
        Stopwatch::default(),
    )?;
    Ok(exit_code(&report))
}
