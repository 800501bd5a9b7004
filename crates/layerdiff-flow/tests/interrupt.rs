//! A signal in the middle of a run (see `layerdiff_flow::interrupt`), made deterministic: the
//! target's op of one layer asks the run to stop as it computes. A test binary of its own, so
//! the request, which is process-wide, reaches no other test.

mod chain;
use chain::*;
use layerdiff_flow::Error;
use layerdiff_flow::interrupt::{SIGINT, clear, request, requested};

/// The drifting chain (layer 2 adds 1%) whose layer 4 asks the run to stop as it is computed.
fn stopping_at_4() -> Vec<Op> {
    let mut ops = drifting();
    ops[4] = |v, _, _| {
        request(SIGINT);
        v.max(0.0)
    };
    ops
}

#[test]
fn a_stopped_run_reports_the_layers_judged_before_it_or_nothing() {
    // One layer a segment: the first four are compared and judged before the target computes
    // layer 4; the report holds them, says it is incomplete, and the defect at `v2` stands.
    let (full, _) = run(drifting(), &[], FINE).unwrap();
    let (report, segments) = run(stopping_at_4(), &[], FINE).unwrap();
    assert_eq!(segments, 6);
    assert_eq!(requested(), Some(SIGINT));
    let names: Vec<&str> = report.layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["v0", "v1", "v2", "v3"]);
    assert_eq!(
        report.layers,
        full.layers[..4],
        "the same layers, judged the same"
    );
    let s = &report.summary;
    assert_eq!(s.drift_origin.as_deref(), Some("v2"));
    assert_eq!(s.layers_total, 4);
    let incomplete = s.incomplete.as_deref().expect("marked incomplete");
    assert!(
        incomplete.starts_with(
            "the run was interrupted by SIGINT (Ctrl-C) after 4 of the model's 6 layers"
        ),
        "{incomplete}"
    );
    assert!(full.summary.incomplete.is_none());
    let json = layerdiff_core::render::to_json(&report);
    assert!(json.contains("\"incomplete\""));
    assert!(!layerdiff_core::render::to_json(&full).contains("\"incomplete\""));
    assert!(
        layerdiff_core::render::to_markdown(&report)
            .contains("> **Incomplete:** the run was interrupted")
    );

    clear();
    // An honest chain stopped after layer 3 has no drift so far: it cannot say "no drift".
    let (honest_stopped, _) = run(
        {
            let mut ops = honest();
            ops[4] = stopping_at_4()[4];
            ops
        },
        &[],
        FINE,
    )
    .unwrap();
    let s = &honest_stopped.summary;
    assert_eq!(s.verdict, layerdiff_core::Verdict::Inconclusive);
    assert_eq!(
        s.inconclusive.as_deref(),
        Some("the run was interrupted before the other 2 layers were compared")
    );

    clear();
    // Only the layers with a counterpart were left to compare: a layer the target has no value
    // for is not one the interrupt kept from being compared (the count read 65 - 31 where 17
    // were left).
    let (unpaired_stopped, _) = run(
        {
            let mut ops = honest();
            ops[4] = stopping_at_4()[4];
            ops
        },
        &[5],
        FINE,
    )
    .unwrap();
    assert_eq!(
        unpaired_stopped.summary.inconclusive.as_deref(),
        Some("the run was interrupted before the other 1 layer was compared")
    );

    clear();
    // The whole run in one segment: the target computes every layer before any is judged, so
    // none was: an error, and no report.
    let Err(Error::Interrupted(signal)) = run(stopping_at_4(), &[], 1 << 30) else {
        panic!("a run stopped before any layer is compared has no report");
    };
    assert_eq!(signal, SIGINT);
    assert_eq!(
        Error::Interrupted(signal).to_string(),
        "interrupted by SIGINT (Ctrl-C) before any layer was compared: no report written"
    );
}
