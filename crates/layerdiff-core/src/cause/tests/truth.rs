//! The float64 truth as a check on the baseline: a float64 copy that computes a layer as the
//! target does, not as the reference does (code that branches on the dtype), excuses nothing.

use super::*;

/// A bfloat16 layer against a float32 reference, its own error `multiple` times what bfloat16
/// explains, each side `reference` and `target` away from the float64 truth.
fn judged(multiple: f64, reference: f64, target: f64) -> (Cause, Finding, String) {
    let mut layers = vec![layer(0, 0.77, Some(0.77), &["x"])];
    layers[0].target_dtype = Some("bfloat16".to_string());
    layers[0].baseline = Some(crate::Baseline {
        grid: "bfloat16".to_string(),
        max_abs_diff: 0.7,
        mean_abs_diff: 0.2,
        allowed_max_abs_diff: 0.8,
        allowed_mean_abs_diff: 0.25,
        ..baseline(multiple)
    });
    layers[0].float64 = Some(crate::Float64Distance { reference, target });
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    explain(&mut layers, &[Evidence::default()], &mut summary);
    let l = &layers[0];
    (
        l.cause.unwrap(),
        l.finding.unwrap(),
        l.detail.clone().unwrap(),
    )
}

#[test]
fn a_float32_reference_far_further_from_float64_than_its_bfloat16_target_is_no_rounding() {
    // the norm's epsilon is 1.0 in any dtype but float32: the bfloat16 target, its baseline
    // and the float64 copy all take that path, the reference alone does not
    let (cause, finding, detail) = judged(1.0, 2.24, 5.5e-3);
    assert_eq!(cause, Cause::OpImplementation, "{detail}");
    assert_eq!(finding, Finding::Defect);
    assert!(
        detail.contains("the model's float64 copy computes this layer as the target does"),
        "{detail}"
    );
    // float32's own rounding, however far the target: precision, as before
    let (cause, finding, _) = judged(1.0, 2e-7, 5.5e-3);
    assert_eq!((cause, finding), (Cause::PrecisionLoss, Finding::Precision));
    // both about as far (an input both round): precision, as before
    let (cause, _, _) = judged(1.0, 9e-3, 6e-3);
    assert_eq!(cause, Cause::PrecisionLoss);
}

#[test]
fn its_defect_is_sized_by_its_tolerance_and_fixed_in_the_models_code() {
    let mut layers = vec![layer(0, 0.77, Some(0.77), &["x"])];
    layers[0].target_dtype = Some("bfloat16".to_string());
    layers[0].baseline = Some(baseline(1.0));
    layers[0].float64 = Some(crate::Float64Distance {
        reference: 2.24,
        target: 5.5e-3,
    });
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    explain(&mut layers, &[Evidence::default()], &mut summary);
    let defect = &summary.defects[0];
    // not "1.0× what precision explains": the baseline follows the target's code
    assert_eq!(defect.multiple, None);
    assert!(
        defect
            .fix
            .starts_with("make the code of the target's `l0` compute the same for every dtype"),
        "{}",
        defect.fix
    );
}

#[test]
fn a_reference_the_baseline_found_off_is_said_as_that() {
    let mut layers = vec![layer(0, 0.77, Some(0.77), &["x"])];
    layers[0].target_dtype = Some("bfloat16".to_string());
    layers[0].baseline = Some(crate::Baseline {
        reference_off: 3,
        ..baseline(1.0)
    });
    layers[0].float64 = Some(crate::Float64Distance {
        reference: 2.24,
        target: 5.5e-3,
    });
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    explain(&mut layers, &[Evidence::default()], &mut summary);
    let detail = layers[0].detail.clone().unwrap();
    assert!(detail.starts_with("the reference is off here"), "{detail}");
    assert!(!detail.contains("float64 copy computes this layer as the target does"));
}
