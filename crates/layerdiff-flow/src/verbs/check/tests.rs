//! The whole-output check's judgement on outputs made by hand.

use super::*;

/// `values` scaled by `by`, rounded to `grid`, held in float32.
fn side(grid: DType, values: &[f64], by: f64) -> Tensor {
    let rounded: Vec<f64> = values.iter().map(|v| grid.round(v * by)).collect();
    Tensor::from_f64(DType::F32, &rounded)
}

#[test]
fn a_target_that_computes_in_bfloat16_is_held_to_bfloat16s_rounding() {
    // OpenVINO computes float32 in bfloat16 on a CPU with AVX512_BF16: a timm EfficientNet
    // read "13016.88x as far from it as the reference: the target computes something else"
    let mut rng = layerdiff_core::SplitMix64::new(3);
    let exact: Vec<f64> = (0..4096).map(|_| rng.normal()).collect();
    let truth = Tensor::from_f64(DType::F64, &exact);
    let reference = side(DType::F32, &exact, 1.0);
    let rounded = side(DType::BF16, &exact, 1.0);
    let judged = |target: &Tensor, grid| {
        TruthCheck::new(truth.view(), reference.view(), target.view(), grid).unwrap()
    };
    assert!(
        judged(&rounded, None).beyond,
        "float32 rounding does not explain it"
    );
    let check = judged(&rounded, Some(DType::BF16));
    assert!(!check.beyond, "{}", check.multiple);
    assert_eq!(check.grid.as_deref(), Some("bfloat16"));
    // 2% off is beyond what bfloat16 explains too
    let off = side(DType::BF16, &exact, 1.02);
    assert!(judged(&off, Some(DType::BF16)).beyond);
}

#[test]
fn an_output_that_fails_by_the_narrower_dtype_s_rounding_says_so_and_how_in_one_sentence() {
    // `layerdiff check … --target openvino` on a CPU with AVX512_BF16 printed FAIL for the
    // output and "rounding" under it, with the how on a line of its own.
    let mut rng = layerdiff_core::SplitMix64::new(5);
    let exact: Vec<f64> = (0..512).map(|_| rng.normal()).collect();
    let out = |t: Tensor| vec![("logits".to_string(), t)];
    let truth = out(Tensor::from_f64(DType::F64, &exact));
    let how = "OpenVINO's CPU plugin computes float32 in bf16 here; `openvino:precision=f32` runs it in full float32";
    let report = CheckReport::new(
        "m",
        ("pytorch", "openvino"),
        Bound {
            atol: 1e-4,
            rtol: 1e-5,
        },
        &out(side(DType::F32, &exact, 1.0)),
        &out(side(DType::BF16, &exact, 1.0)),
        Some(&truth),
        Some((DType::BF16, how.to_string())),
    )
    .unwrap();
    assert!(!report.passed);
    let text = to_text(&report);
    assert!(!text.contains("  the target: "), "{text}");
    assert!(
        text.contains(&format!(
            "it fails the bound only because the target computes in bfloat16, whose rounding this is: {how}"
        )),
        "{text}"
    );
}

#[test]
fn a_runtime_that_approximates_the_models_own_computation_within_the_bound_passes() {
    // tract's Erf on an MLP whose GELU is written with `erf`: every element within the
    // bound, 6x as far from float64 as PyTorch. `check` failed it while the per-layer run
    // named an approximation and exited 0.
    let mut rng = layerdiff_core::SplitMix64::new(7);
    let exact: Vec<f64> = (0..256).map(|_| rng.normal()).collect();
    let out = |t: Tensor| vec![("y".to_string(), t)];
    let approximated: Vec<f64> = exact
        .iter()
        .enumerate()
        .map(|(i, x)| x + if i % 2 == 0 { 2e-6 } else { -2e-6 })
        .collect();
    let judged = || {
        CheckReport::new(
            "m",
            ("pytorch", "tract"),
            Bound {
                atol: 1e-4,
                rtol: 1e-5,
            },
            &out(side(DType::F32, &exact, 1.0)),
            &out(side(DType::F32, &approximated, 1.0)),
            Some(&out(Tensor::from_f64(DType::F64, &exact))),
            None,
        )
        .unwrap()
    };
    let file = judged();
    assert!(
        !file.passed,
        "a file not read against the model: it may compute otherwise"
    );
    let own = judged().of_the_models_computation();
    assert!(own.passed);
    let truth = own.outputs[0].float64.as_ref().unwrap();
    assert!(truth.beyond && truth.approximates);
    assert!(to_text(&own).contains("the runtime's kernels approximate here"));
    let differs = judged()
        .with_file_differences(vec![FileDiffers {
            layer: "div".into(),
            cause: "weight_mismatch".into(),
            detail: "`val_1` differs".into(),
            fix: "export it again".into(),
        }])
        .of_the_models_computation();
    assert!(
        !differs.passed,
        "a file that differs is a defect, whatever the outputs"
    );
    assert!(!differs.outputs[0].passed && !to_text(&differs).contains("approximate"));
}

#[test]
fn an_output_nan_on_the_target_is_said_not_called_rounding() {
    // a file whose bias is NaN: every logit NaN. The line read "0 of 10 elements beyond the
    // bound" and the float64 line "0.00x as far from it as the reference: rounding", under FAIL
    let exact: Vec<f64> = (0..10).map(|i| 0.1 * f64::from(i) - 0.4).collect();
    let out = |t: Tensor| vec![("logits".to_string(), t)];
    let report = CheckReport::new(
        "m",
        ("pytorch", "ort"),
        Bound {
            atol: 1e-4,
            rtol: 1e-5,
        },
        &out(side(DType::F32, &exact, 1.0)),
        &out(Tensor::from_f64(DType::F32, &[f64::NAN; 10])),
        Some(&out(Tensor::from_f64(DType::F64, &exact))),
        None,
    )
    .unwrap();
    assert!(!report.passed);
    let text = to_text(&report);
    assert!(
        text.contains(", and 10 of 10 NaN on one side where the other holds a number"),
        "{text}"
    );
    assert!(
        text.contains("float64 truth: the target is NaN or Inf in 10 of 10 elements where the reference holds a number: no rounding makes that"),
        "{text}"
    );
    assert!(!text.contains(": rounding"), "{text}");
}
