//! The engine on its own, with an in-memory side (`chain`).
//!
//! The golden report (`tests/golden/chain.*`: JSON, Markdown, HTML and the chart) is rewritten
//! by `make golden`.

mod chain;
use chain::*;
use layerdiff_core::{DType, Report, SideInfo, render};
use layerdiff_flow::timings::Stopwatch;
use layerdiff_flow::{Engine, EngineParts, Error, PushedSide};

const WHOLE: u64 = 1 << 30;

#[test]
fn a_budget_one_layer_exceeds_is_an_error_naming_it_and_what_it_needs() {
    let Err(Error::Memory(message)) = run(drifting(), &[], FINE - 1) else {
        panic!("a budget the run cannot keep is refused");
    };
    assert_eq!(
        message,
        "--max-memory 12 KB is too small: the run cannot be cut finer than at `v5`, which holds 12 KB of values at once (both sides' values there, and those still needed after it)\nhint: give --max-memory 16KB or more, or leave it out (half the memory available)"
    );
}

#[test]
fn the_origin_is_the_layer_that_adds_error_and_the_layers_after_it_inherit() {
    let (report, _) = run(drifting(), &[], WHOLE).unwrap();
    let s = &report.summary;
    assert_eq!(s.drift_origin.as_deref(), Some("v2"));
    assert_eq!(s.first_exceeding.as_deref(), Some("v2"));
    assert_eq!(s.verdict, layerdiff_core::Verdict::Defect);
    assert_eq!(s.defects.len(), 1);
    assert_eq!(
        (s.defects[0].layer.as_str(), s.defects[0].cause.name()),
        ("v2", "op_implementation")
    );
    let multiple = layer_multiple(&report, "v2");
    assert!(
        multiple > 100.0,
        "1% of v² is far beyond float32 rounding: {multiple}"
    );
    let layer = |n: &str| report.layers.iter().find(|l| l.name == n).unwrap();
    // the honest layers before it compute the reference's very bits: nothing of their own
    let v1 = layer("v1");
    assert_eq!(v1.local.as_ref().unwrap().max_abs_diff, 0.0);
    assert!(
        v1.baseline.is_none(),
        "no ideal is computed for the same bits"
    );
    assert!(
        (v1.baseline_reason.as_deref().unwrap())
            .starts_with("its own value is the reference's, bit for bit")
    );
    assert!(!layer("v1").exceeds_tol && !layer("v1").local_exceeds);
    assert!(layer("v2").local_exceeds, "its own error");
    for later in ["v3", "v4", "v5"] {
        let l = layer(later);
        if l.exceeds_tol {
            assert_eq!(
                l.cause.map(layerdiff_core::Cause::name),
                Some("inherited"),
                "{later}: {:?}",
                l.detail
            );
            assert!(!l.local_exceeds, "{later} adds nothing of its own");
        }
    }
    assert!(layer("v5").exceeds_tol, "the error reaches the end");
}

/// A layer's own error as a multiple of what float32 explains.
fn layer_multiple(report: &Report, name: &str) -> f64 {
    let layer = report.layers.iter().find(|l| l.name == name).unwrap();
    layer.baseline.as_ref().expect("measured").multiple
}

#[test]
fn segments_change_nothing_in_the_report() {
    let (whole, one) = run(drifting(), &[], WHOLE).unwrap();
    let (split, many) = run(drifting(), &[], FINE).unwrap();
    assert_eq!(one, 1);
    assert!(many > 2, "the budget splits the run ({many} segments)");
    assert_eq!(render::to_json(&whole), render::to_json(&split));
}

#[test]
fn a_layer_fed_what_its_run_read_keeps_its_own_value_and_is_not_run_again() {
    let measured = |same_alone: bool| {
        let mut target = Chain::new(drifting());
        target.same_alone = same_alone;
        let reruns = target.reruns.clone();
        let (report, _) = run_chain(target, &[], WHOLE).unwrap();
        (report, reruns.load(std::sync::atomic::Ordering::Relaxed))
    };
    let (rerun, all) = measured(false);
    let (kept, fewer) = measured(true);
    assert_eq!(all, drifting().len(), "every layer re-run");
    // v0, v1 and v2 read the reference's very values (v2 drifts, but from what v1 handed it)
    assert_eq!(fewer, all - 3);
    assert_eq!(render::to_json(&rerun), render::to_json(&kept));
    assert_eq!(kept.summary.drift_origin.as_deref(), Some("v2"));
}

#[test]
fn a_side_that_disagrees_with_itself_is_nondeterminism() {
    let mut ops = honest();
    // Layer 1 depends on the run: its result changes each time it is computed.
    ops[1] = |v, i, run| v / (1.0 + v.abs()) + if i == 3 { 1e-2 * run as f32 } else { 0.0 };
    let (report, _) = run(ops, &[], WHOLE).unwrap();
    let origin = report.summary.drift_origin.clone().unwrap();
    let layer = report.layers.iter().find(|l| l.name == origin).unwrap();
    assert_eq!(origin, "v1");
    assert_eq!(
        layer.cause.map(layerdiff_core::Cause::name),
        Some("nondeterminism"),
        "{:?}",
        layer.detail
    );
}

#[test]
fn a_layer_without_a_counterpart_is_reported_with_its_reason_and_the_rest_compared() {
    let (report, _) = run(drifting(), &[0], WHOLE).unwrap();
    let v0 = &report.layers[0];
    assert_eq!(v0.reason.as_deref(), Some("not in the target"));
    assert!(v0.accumulated.is_none());
    assert_eq!(report.summary.layers_compared, 5);
    assert_eq!(report.summary.drift_origin.as_deref(), Some("v2"));
    assert!(
        report.layers[1].local_reason.is_some(),
        "v1's input has no counterpart, so v1 cannot be re-run alone"
    );
}

#[test]
fn nothing_compared_is_an_error_that_says_how_layers_are_paired() {
    let Err(Error::NothingCompared(message)) = run(honest(), &[0, 1, 2, 3, 4, 5], WHOLE) else {
        panic!("a run that compares nothing has no verdict");
    };
    assert!(message.ends_with("hint: pair something"), "{message}");
}

/// A reference handed over layer by layer: segments run only once their layers are in.
#[test]
fn a_pushed_reference_runs_each_segment_once_its_layers_are_in() {
    let layers = 6;
    let listed = (0..layers).map(|i| (format!("v{i}"), DType::F32, (N * 4) as u64));
    let reference = PushedSide::new(SideInfo::new("pushed", "test"), listed);
    let mut engine: Engine<PushedSide, Chain> = Engine::new(EngineParts {
        header: header(),
        alignment: alignment(layers, &[]),
        reference,
        target: Chain::new(drifting()),
        truth: None,
        baseline: None,
        inputs: vec![("x".to_string(), input())],
        settings: settings(6 * N as u64 * 4),
        clock: Stopwatch::default(),
    })
    .unwrap();
    assert!(engine.segmentation().segments > 2);
    let honest_chain = Chain::new(honest());
    let mut value = input();
    for i in 0..layers {
        engine.advance().unwrap();
        value = honest_chain.apply(i, &value);
        engine.reference.push(i, Some(value.clone()));
    }
    engine.advance().unwrap();
    engine.conclude().unwrap();
    let report = engine.finish().unwrap();
    assert_eq!(report.summary.drift_origin.as_deref(), Some("v2"));
    assert_eq!(report.reference.runtime, "pushed");
}

#[test]
fn the_golden_report_of_the_drifting_chain() {
    let (report, _) = run(drifting(), &[], WHOLE).unwrap();
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    for (file, text) in [
        ("chain.json", render::to_json(&report)),
        ("chain.md", render::to_markdown(&report)),
        ("chain.html", render::to_html(&report)),
        ("chain.svg", render::to_svg(&report, false)),
    ] {
        let path = golden.join(file);
        if std::env::var_os("LAYERDIFF_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let expected = std::fs::read_to_string(&path).expect("make golden writes it");
        assert_eq!(
            text, expected,
            "{file} changed: if on purpose, run `make golden`"
        );
    }
}

/// A reference whose runtime computes its float32 layers in bfloat16 (OpenVINO's inference
/// precision given as the reference) against an honest float32 target: the drift is the
/// reference's rounding. The report warns so, its precision is bfloat16, and a layer within
/// what its precision explains names the reference's grid, never the target's precision loss.
#[test]
fn a_reference_that_computes_in_bfloat16_is_named_as_the_rounding() {
    const OPS: [&str; 6] = ["op0", "op1", "op2", "op3", "op4", "op5"];
    let report = |says_so: bool| {
        let mut reference = Chain::new(vec![
            |v, _, _| bf16(v * 1.5 + 0.25),
            |v, _, _| bf16(v / (1.0 + v.abs())),
            |v, _, _| bf16(v * v),
            |v, _, _| bf16(v - 0.5),
            |v, _, _| bf16(v.max(0.0)),
            |v, _, _| bf16(v * 2.0),
        ]);
        reference.reduced = says_so.then(|| layerdiff_runtime::ReducedMath {
            ops: &OPS,
            grid: Some(DType::BF16),
            how: "the chain computes float32 in bf16".to_string(),
        });
        let layers = OPS.len();
        let mut engine: Engine<Chain, Chain> = Engine::new(EngineParts {
            header: header(),
            alignment: alignment(layers, &[]),
            reference,
            target: Chain::new(honest()),
            truth: None,
            baseline: Some(baseline(layers)),
            inputs: vec![("x".to_string(), input())],
            settings: settings(WHOLE),
            clock: Stopwatch::default(),
        })
        .unwrap();
        engine.advance().unwrap();
        engine.finish().unwrap()
    };
    let said = report(true);
    let s = &said.summary;
    assert_eq!(s.verdict, layerdiff_core::Verdict::Precision);
    assert_eq!(s.precision.as_ref().unwrap().dtype, "bfloat16");
    assert!(
        s.warnings
            .iter()
            .any(|w| w.starts_with("the reference does not compute as its file says: the chain")),
        "{:?}",
        s.warnings
    );
    let origin = said.layers.iter().find(|l| l.name == "v0").unwrap();
    assert_eq!(origin.cause, Some(layerdiff_core::Cause::Rounding));
    let detail = origin.detail.as_deref().unwrap();
    assert!(
        detail.starts_with("the reference computes this layer in bfloat16 (the chain computes"),
        "{detail}"
    );
    // the same numbers from a reference that does not say so: the evidence decides the words
    let unsaid = report(false);
    assert_eq!(unsaid.summary.precision.as_ref().unwrap().dtype, "float32");
    assert!(
        unsaid.summary.warnings.is_empty(),
        "{:?}",
        unsaid.summary.warnings
    );
}

/// `v` rounded to the nearest bfloat16 (ties to even).
fn bf16(v: f32) -> f32 {
    let b = v.to_bits();
    f32::from_bits((b + 0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
}
