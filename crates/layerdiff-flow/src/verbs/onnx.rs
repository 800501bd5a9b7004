//! `layerdiff onnx`: one ONNX model on two runtimes, or two versions of a model ([`crate::onnx`]),
//! its reports written, and at the user's asking the optimizers bisected (`--bisect`) and the
//! headline's repro written (`--repro`).

use std::path::Path;

use layerdiff_core::Report;

use crate::Result;
use crate::onnx::{OnnxOptions, Outcome, compare_on};
use crate::output::{Destinations, deliver, exit_code};
use crate::timings::Stopwatch;

/// Runs the `onnx` verb: compares, writes and prints its outputs (`to`), and returns the exit
/// code (0 clean, 1 drift, 2 could not run, with the error printed to stderr).
pub fn run(options: &OnnxOptions, to: &Destinations) -> u8 {
    let outcome = compare_on(options, None, !to.quiet).and_then(|mut outcome| {
        let mut notes: Vec<String> = outcome.segmentation.text().into_iter().collect();
        // an interrupted run writes what it compared, and nothing it would have done after
        let finished = outcome.report.summary.incomplete.is_none();
        if options.bisect && finished {
            let mut progress = |line: &str| {
                if !to.quiet {
                    eprintln!("{line}");
                }
            };
            match crate::verbs::bisect::ort_optimizers(options, &outcome.report, &mut progress)? {
                Some(found) => outcome.report.bisection = Some(found),
                None => notes.push(nothing_to_bisect(options, &outcome.report)),
            }
        }
        if let Some(folder) = options.repro.as_ref().filter(|_| finished) {
            notes.push(repro_note(options, &outcome, folder, to)?);
        }
        deliver(
            outcome.report,
            to,
            &outcome.inputs,
            outcome.seed,
            &notes,
            Stopwatch::default(),
        )
    });
    match outcome {
        Ok(report) => exit_code(&report, to.fail_on),
        Err(err) => err.exit(),
    }
}

/// Writes the repro of the run's headline into `folder` and says what it holds, or says why
/// there is none (a clean run writes nothing).
fn repro_note(
    options: &OnnxOptions,
    outcome: &Outcome,
    folder: &Path,
    to: &Destinations,
) -> Result<String> {
    if let Err(why) = outcome.report.headline() {
        return Ok(format!("--repro: no repro written: {why}"));
    }
    let command = to
        .invocation
        .as_ref()
        .map(|i| i.text())
        .unwrap_or_else(|| format!("layerdiff onnx {}", options.model.display()));
    let repro = crate::verbs::reduce::onnx(
        options,
        &outcome.report,
        &outcome.inputs,
        folder,
        options.repro_nodes,
        &command,
    )?;
    Ok(repro.sentence())
}

/// Why `--bisect` found nothing to bisect.
fn nothing_to_bisect(options: &OnnxOptions, report: &Report) -> String {
    if report.summary.layers_exceeding == 0 {
        "--bisect: nothing to bisect, no layer exceeds its tolerance".to_string()
    } else {
        format!(
            "--bisect: nothing to bisect, the target (`{}`) does not optimize the graph; bisection \
             names the ONNX Runtime optimizers of a target at `opt=basic|extended|all`",
            options.target_spec().spelling()
        )
    }
}
