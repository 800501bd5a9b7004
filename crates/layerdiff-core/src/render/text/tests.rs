//! The verdict's sentence on reports that once read wrong.

use super::*;

#[test]
fn rounding_that_exceeds_only_in_a_layers_own_re_run_is_not_said_to_be_born_of_none() {
    // A float16 EfficientNet-B0 (timm): no layer's value exceeds its tolerance, one layer's
    // own re-run does, by its rounding. It read "0 of 264 compared layers exceed their
    // tolerance, born at `blocks.0.0.bn1`".
    let mut report = Report::of_layers("m", Vec::new());
    let s = &mut report.summary;
    (s.verdict, s.layers_compared, s.layers_exceeding) = (Verdict::Precision, 264, 0);
    s.layers_exceeding_locally = 1;
    s.precision = Some(PrecisionDrift {
        dtype: "float16".into(),
        origin: Some("bn1".into()),
        source: None,
        layers: 1,
        overflow: 0,
        output: Some("classifier".into()),
        output_max_abs_diff: 6e-8,
        output_tolerance_multiple: 1e-4,
        output_nonfinite: 0,
        output_exact: None,
    });
    assert_eq!(
        verdict(&report),
        "float16 rounding only: no layer computes differently; 0 of 264 compared layers exceed their tolerance, 1 only when re-run alone on the reference's inputs, by its own rounding, at `bn1`"
    );
    report.summary.layers_exceeding = 45;
    assert_eq!(
        verdict(&report),
        "float16 rounding only: no layer computes differently; 45 of 264 compared layers exceed their tolerance, born at `bn1`"
    );
}

#[test]
fn an_output_that_overflowed_is_said_so_not_off_by_nothing() {
    // A naive softmax in float16 (torch:fp16): its exp overflows, the output is NaN in
    // all 80 elements. It read "the output `fc2` is off by 0.000e0 (inf× its tolerance)".
    let mut p = PrecisionDrift {
        dtype: "float16".into(),
        origin: Some("fc1".into()),
        source: None,
        layers: 3,
        overflow: 1,
        output: Some("fc2".into()),
        output_max_abs_diff: 0.0,
        output_tolerance_multiple: f64::INFINITY,
        output_nonfinite: 80,
        output_exact: None,
    };
    assert_eq!(
        precision_words(&p, 6),
        "float16 rounding, born at `fc1`: 3 of 6 compared layers exceed their tolerance by their own rounding; the output `fc2` is NaN or ±Inf in 80 element(s) where the reference's are finite; 1 layer(s) overflow float16's range to ±Inf (keep them in float32)"
    );
    (
        p.output_nonfinite,
        p.output_max_abs_diff,
        p.output_tolerance_multiple,
    ) = (0, 2e-3, 4.0);
    assert!(
        precision_words(&p, 6)
            .contains("; the output `fc2` is off by 2.000e-3 (4.0× its tolerance)")
    );
}

#[test]
fn an_integer_output_says_how_many_elements_differ_not_a_multiple_of_no_tolerance() {
    // A classifier whose output is its argmax, against its dynamic int8 file: 41 of 512
    // predictions change. It read "the output `8` is off by 9.000e0 (0.0× its tolerance)".
    let mut p = PrecisionDrift {
        dtype: "int8".into(),
        origin: Some("fc1".into()),
        source: None,
        layers: 2,
        overflow: 0,
        output: Some("8".into()),
        output_max_abs_diff: 9.0,
        output_tolerance_multiple: 0.0,
        output_nonfinite: 0,
        output_exact: Some(crate::ExactOutput {
            dtype: "int64".into(),
            differ: 41,
            elements: 512,
        }),
    };
    assert!(
        precision_words(&p, 4).ends_with(
            "; the output `8` (int64, compared exactly) differs in 41 of 512 elements (8.0%)"
        ),
        "{}",
        precision_words(&p, 4)
    );
    p.output_exact.as_mut().unwrap().differ = 0;
    assert!(precision_words(&p, 4).ends_with(
        "; the output `8` (int64, compared exactly) is the reference's in all 512 elements"
    ));
}
