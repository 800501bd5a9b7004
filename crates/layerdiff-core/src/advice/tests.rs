use super::*;
use crate::{DType, TensorView, compare};

/// Statistics of a float32 reference against `target` (element by element).
fn stats(reference: &[f32], target: &[f32]) -> Stats {
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (r, t) = (bytes(reference), bytes(target));
    let shape = [reference.len()];
    compare(
        TensorView::new("r", DType::F32, &shape, &r).unwrap(),
        TensorView::new("t", DType::F32, &shape, &t).unwrap(),
    )
    .unwrap()
}

/// A float16 run of three layers: `a` rounds; overflowing, `b` overflows and `c` inherits
/// the Inf; else both agree.
fn report(overflowing: bool) -> Report {
    let (b_target, c_target) = if overflowing {
        (f32::INFINITY, f32::INFINITY)
    } else {
        (1e5, 3.0)
    };
    let mut layers: Vec<Layer> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut l = Layer::new(i, *name, vec![2], "float32");
            l.status = LayerStatus::Compared;
            l.target_dtype = Some("float16".to_string());
            l
        })
        .collect();
    layers[0].accumulated = Some(stats(&[1.0, 2.0], &[1.0, 2.0]));
    layers[0].local = layers[0].accumulated.clone();
    layers[1].accumulated = Some(stats(&[1e5, 2.0], &[b_target, 2.0]));
    layers[1].local = layers[1].accumulated.clone();
    layers[2].accumulated = Some(stats(&[3.0, 2.0], &[c_target, 2.0]));
    layers[2].local = Some(stats(&[3.0, 2.0], &[3.0, 2.0]));
    layers[2].local_inputs = vec!["b".to_string()];
    Report::of_layers("m", layers)
}

#[test]
fn the_layer_that_overflows_is_kept_not_the_one_that_inherits() {
    let before = report(true);
    assert_eq!(lower_precision_of(&before).as_deref(), Some("float16"));
    let advice = keep_float32(&before, "float16").unwrap();
    let kept: Vec<&str> = advice.layers.iter().map(|k| k.layer.as_str()).collect();
    assert_eq!(kept, ["b"]);
    assert!(
        advice.layers[0]
            .why
            .starts_with("overflows float16's range: 1 element(s)")
    );
    let after = report(false);
    assert!(keep_float32(&after, "float16").is_none(), "nothing drifts");
    let check = check_advice(&before, &after, vec!["b".to_string()]);
    assert_eq!(
        (check.output_nonfinite_before, check.output_nonfinite_after),
        (1, 0)
    );
    assert!(
        check
            .verdict
            .starts_with("keeping 1 layer(s) in float32 removes the drift")
    );
    assert!(
        check
            .verdict
            .contains("`c` NaN or Inf in 1 of 2 elements → mean abs diff")
    );
}

#[test]
fn against_a_reference_that_rounds_as_coarsely_nothing_is_advised() {
    // the same drift, its reference in bfloat16: the rounding is the reference's too, and no
    // float16 layer kept in float32 takes it away
    let mut coarse = report(true);
    for l in &mut coarse.layers {
        l.dtype = "bfloat16".to_string();
    }
    assert!(keep_float32(&coarse, "float16").is_none());
    assert!(keep_float32(&report(true), "float16").is_some());
}

#[test]
fn a_check_that_ends_an_overflow_but_leaves_more_layers_exceeding_says_both() {
    // kept in float32, `b` no longer overflows, but every layer now differs as a number
    let before = report(true);
    let mut after = report(false);
    for l in &mut after.layers {
        l.accumulated = Some(stats(&[1.0, 2.0], &[1.5, 2.5]));
    }
    let after = Report::of_layers("m", after.layers);
    let (b, a) = (
        before.summary.layers_exceeding,
        after.summary.layers_exceeding,
    );
    assert!(a > b, "the case: more exceed after ({a} against {b})");
    let check = check_advice(&before, &after, vec!["b".to_string()]);
    assert!(check.helps, "the output is finite again");
    assert!(
        check.verdict.starts_with(
            "keeping 1 layer(s) in float32 makes the output finite: `c` NaN or Inf in 1 of 2"
        ),
        "{}",
        check.verdict
    );
    assert!(
        check.verdict.ends_with(&format!(
            "more layers exceed their tolerance, {a} (was {b}, 2 of them NaN or Inf on the target, now numbers that still differ)"
        )),
        "{}",
        check.verdict
    );
}

#[test]
fn a_check_that_changes_nothing_says_so() {
    let before = report(true);
    let check = check_advice(&before, &before.clone(), vec!["b".to_string()]);
    assert!(check.verdict.contains("does not help"), "{}", check.verdict);
    assert!(!check.helps);
    // the reports then say the layers were tried, not that they should stay in float32
    let mut checked = before.clone();
    let mut advice = keep_float32(&before, "float16").unwrap();
    advice.check = Some(check);
    assert!(!advice.advised());
    checked.keep_float32 = Some(advice);
    let text = crate::render::to_text(&checked);
    assert!(
        text.contains("tried in float32, without help (the target computes in float16): `b`"),
        "{text}"
    );
    assert!(!text.contains("keep in float32"), "{text}");
    let markdown = crate::render::to_markdown(&checked);
    assert!(markdown.contains("these layers were tried in float32, and that does not remove the drift (below): not advised"));
    assert!(!markdown.contains("should stay in float32"));
}

#[test]
fn a_check_that_removes_the_drift_keeps_the_advice() {
    let before = report(true);
    let check = check_advice(&before, &report(false), vec!["b".to_string()]);
    assert!(check.helps, "{}", check.verdict);
    let mut advice = keep_float32(&before, "float16").unwrap();
    advice.check = Some(check);
    assert!(advice.advised());
    assert!(advice.heading().contains("should stay in float32"));
}

#[test]
fn the_users_layers_are_checked_and_reported_else_the_advised_ones_on_the_plain_run() {
    let mut plain = report(true);
    plain.keep_float32 = keep_float32(&plain, "float16");
    let with_kept = report(false);
    assert_ne!(
        plain.summary.layers_exceeding,
        with_kept.summary.layers_exceeding
    );
    assert_eq!(layers_to_check(&plain, &[]), ["b"], "the advice");
    let given = ["a".to_string()];
    assert_eq!(
        layers_to_check(&plain, &given),
        ["a"],
        "the user's, not the advice"
    );
    assert!(
        layers_to_check(&report(false), &[]).is_empty(),
        "nothing advised"
    );

    // the plain run is reported
    let advised = advice_checked(&plain, &with_kept, vec!["b".into()], false, "float16");
    assert_eq!(
        advised.summary.layers_exceeding,
        plain.summary.layers_exceeding
    );
    assert!(
        advised.keep_float32.unwrap().advised(),
        "checked, and it helps"
    );

    // the run with the user's layers kept is reported
    let asked = advice_checked(&plain, &with_kept, given.to_vec(), true, "float16");
    assert_eq!(
        asked.summary.layers_exceeding,
        with_kept.summary.layers_exceeding
    );
    let keep = asked.keep_float32.unwrap();
    assert_eq!(
        (keep.precision.as_str(), keep.check.unwrap().kept),
        ("float16", vec!["a".to_string()])
    );
}

#[test]
fn rounding_that_no_layers_value_shows_is_not_a_drift_to_keep_layers_from() {
    // A float16 EfficientNet-B0 (timm): one layer's own re-run exceeds its tolerance by its
    // rounding, no layer's value does, and the output is at 1e-4 of its tolerance. The plain
    // run advised keeping that layer; the check ran the model again and read "helps little:
    // 2 layers exceed (was 0) … the drift is spread over the model".
    let mut layers = vec![Layer::new(0, "a", vec![2], "float32")];
    layers[0].status = LayerStatus::Compared;
    layers[0].target_dtype = Some("float16".to_string());
    layers[0].accumulated = Some(stats(&[1.0, 2.0], &[1.0005, 2.0]));
    layers[0].local = Some(stats(&[1.0, 2.0], &[1.002, 2.0]));
    layers[0].baseline = Some(crate::Baseline {
        grid: "float16".to_string(),
        stages: 0,
        max_abs_diff: 2e-3,
        mean_abs_diff: 1e-3,
        allowed_max_abs_diff: 4e-3,
        allowed_mean_abs_diff: 2e-3,
        multiple: 0.5,
        overflow: 0,
        reference_off: 0,
        narrow: None,
        from_exact: None,
        indices: None,
    });
    let report = Report::of_layers("m", layers);
    assert_eq!(report.summary.layers_exceeding, 0);
    assert_eq!(report.summary.layers_exceeding_locally, 1);
    assert_eq!(report.summary.verdict, crate::Verdict::Precision);
    assert!(keep_float32(&report, "float16").is_none());
}

#[test]
fn an_output_nan_on_the_reference_alone_is_said_not_hidden_behind_the_compared_figures() {
    // the reference's output is NaN in one element, the target's a number: the elements
    // compared agree, but the output does not
    let s = stats(&[f32::NAN, 1.0, 2.0], &[0.5, 1.0, 2.0]);
    assert_eq!(
        super::output_words(Some(&s)),
        "NaN on the reference in 1 of 3 elements, numbers on the target"
    );
    // NaN alike on both sides: the elements compared say it all
    let s = stats(&[f32::NAN, 1.0], &[f32::NAN, 1.5]);
    assert_eq!(
        super::output_words(Some(&s)),
        "mean abs diff 5.000e-1 (max 5.000e-1)"
    );
}
