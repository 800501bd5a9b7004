use super::*;
use crate::{LayerStatus, Stats, Tolerance, Verdict, analyse, compare};

mod naming;
mod truth;

/// Statistics whose max abs diff is `d`.
fn stats(d: f64) -> Stats {
    let (r, t) = (0f32.to_le_bytes(), (d as f32).to_le_bytes());
    let shape = [1];
    compare(
        TensorView::new("r", DType::F32, &shape, &r).unwrap(),
        TensorView::new("t", DType::F32, &shape, &t).unwrap(),
    )
    .unwrap()
}

pub(super) fn layer(index: usize, accumulated: f64, local: Option<f64>, inputs: &[&str]) -> Layer {
    let mut l = Layer::new(index, format!("l{index}"), vec![1], "float32");
    l.status = LayerStatus::Compared;
    l.accumulated = Some(stats(accumulated));
    l.local = local.map(stats);
    l.local_inputs = inputs.iter().map(|s| s.to_string()).collect();
    l
}

#[test]
fn a_kernel_no_further_from_float64_than_the_reference_is_rounding() {
    let judged = |reference: f64, target: f64| {
        let mut layers = vec![layer(0, 5e-4, Some(5e-4), &["x"])];
        layers[0].float64 = Some(crate::Float64Distance { reference, target });
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        explain(&mut layers, &[Evidence::default()], &mut summary);
        (layers[0].cause.unwrap(), layers[0].detail.clone().unwrap())
    };
    let (cause, detail) = judged(1.8e-4, 5.7e-5);
    assert_eq!(
        cause,
        Cause::Rounding,
        "the target is the closer of the two: {detail}"
    );
    assert!(detail.contains("the target is closer to the truth"));
    assert_eq!(judged(2.5e-4, 3e-4).0, Cause::Rounding, "about equally far");
    let (cause, detail) = judged(5e-6, 6e-5);
    assert_eq!(
        cause,
        Cause::Rounding,
        "further, but within float32 rounding of the truth"
    );
    assert!(detail.contains("within its dtype's rounding"), "{detail}");
    let (cause, detail) = judged(1e-4, 6e-4);
    assert_eq!(
        cause,
        Cause::Undecided,
        "no baseline: the truth alone does not blame the kernel"
    );
    assert!(detail.contains("no same-precision baseline"), "{detail}");
    assert!(detail.ends_with("the target is off"), "{detail}");
}

#[test]
fn tf32_products_are_precision_loss_unless_the_truth_calls_them_rounding() {
    let tf32 = Evidence {
        reduced_math: Some("MatMul: the provider multiplies float32 in TF32".into()),
        ..Evidence::default()
    };
    let judged = |truth: Option<(f64, f64)>, dtype: &str| {
        let mut layers = vec![layer(0, 5e-3, Some(5e-3), &["x"])];
        layers[0].dtype = dtype.to_string();
        layers[0].float64 =
            truth.map(|(reference, target)| crate::Float64Distance { reference, target });
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        explain(&mut layers, std::slice::from_ref(&tf32), &mut summary);
        (layers[0].cause.unwrap(), layers[0].detail.clone().unwrap())
    };
    let (cause, detail) = judged(None, "float32");
    assert_eq!(cause, Cause::PrecisionLoss);
    assert!(
        detail.starts_with("MatMul: the provider multiplies"),
        "{detail}"
    );
    let (cause, detail) = judged(Some((2e-5, 5e-3)), "float32");
    assert_eq!(
        cause,
        Cause::PrecisionLoss,
        "the truth says the target is further"
    );
    assert!(
        detail.ends_with("as its precision explains"),
        "precision reads as precision, not as a target that is off: {detail}"
    );
    assert_eq!(judged(Some((4e-3, 5e-3)), "float32").0, Cause::Rounding);
    assert_eq!(
        judged(None, "float16").0,
        Cause::Undecided,
        "TF32 is float32 math: a float16 layer without a baseline is undecided"
    );
}

#[test]
fn an_origin_within_its_tolerance_with_nothing_else_different_only_rounds() {
    // l0 rounds (1e-5 of its own, within 1e-4); l1 amplifies it past the tolerance.
    let mut layers = vec![
        layer(0, 1e-5, Some(1e-5), &["x"]),
        layer(1, 5e-4, Some(0.0), &["l0"]),
    ];
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    assert_eq!(summary.drift_origin.as_deref(), Some("l0"));
    explain(
        &mut layers,
        &[Evidence::default(), Evidence::default()],
        &mut summary,
    );
    assert_eq!(layers[0].cause, Some(Cause::Rounding));
    let detail = layers[0].detail.as_deref().unwrap();
    assert!(
        detail.starts_with("the target rounds here as its dtype allows"),
        "{detail}"
    );
    assert!(
        detail.ends_with("amplified downstream until `l1` exceeds it"),
        "{detail}"
    );
    assert_eq!(layers[1].cause, Some(Cause::Inherited));
}

#[test]
fn an_amplified_difference_is_born_upstream_and_inherited_downstream() {
    // l1 adds 6e-5 itself (below 1e-4); l2 passes it on; l3 amplifies it past 1e-4.
    let mut layers = vec![
        layer(0, 1e-7, Some(1e-7), &["x"]),
        layer(1, 6e-5, Some(6e-5), &["l0"]),
        layer(2, 6e-5, Some(0.0), &["l1"]),
        layer(3, 5e-4, Some(2e-6), &["l2", "l0"]),
    ];
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    assert_eq!(summary.first_exceeding.as_deref(), Some("l3"));
    assert_eq!(summary.drift_origin.as_deref(), Some("l1"));
    let mut evidence = vec![Evidence::default(); 4];
    evidence[1].weights.push("`w` differs".into());
    explain(&mut layers, &evidence, &mut summary);
    assert_eq!(layers[3].cause, Some(Cause::Inherited));
    assert_eq!(layers[1].cause, Some(Cause::WeightMismatch));
    assert!(
        layers[1]
            .detail
            .as_ref()
            .unwrap()
            .contains("amplified downstream until `l3`")
    );
    assert_eq!(layers[2].cause, None, "within tolerance and not the origin");
}

#[test]
fn a_weight_fix_names_the_nodes_that_read_it_not_the_layers_relu() {
    let mut layers = vec![layer(0, 5e-3, Some(5e-3), &["x"])];
    let mut location = crate::Location::onnx("r", "relu", "Relu");
    location.nodes = vec!["conv".into(), "relu".into()];
    layers[0].location = Some(location);
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    let mut evidence = vec![Evidence::default()];
    evidence[0].weights.push("`w` differs".into());
    evidence[0].weight_readers.push("conv".into());
    explain(&mut layers, &evidence, &mut summary);
    let fix = &summary.defects[0].fix;
    assert!(
        fix.contains("the target's node(s) `conv` read weights"),
        "{fix}"
    );
    assert!(!fix.contains("relu"), "{fix}");
}

#[test]
fn causes_follow_the_fixed_order_and_unknown_says_what_was_ruled_out() {
    let mut layers = vec![
        layer(0, 1e-3, None, &[]),
        layer(1, 1e-3, Some(1e-3), &["l0"]),
    ];
    layers[0].local_reason = Some("its nodes use a custom op".into());
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    let mut evidence = vec![Evidence::default(); 2];
    evidence[1].precision = Some("float16 grid".into());
    evidence[1].self_disagreement = Some(("target".into(), 5e-3));
    explain(&mut layers, &evidence, &mut summary);
    assert_eq!(layers[0].cause, Some(Cause::Unknown));
    let detail = layers[0].detail.as_deref().unwrap();
    assert!(detail.contains("ruled out: layout permutation, nondeterminism"));
    assert!(detail.contains("its nodes use a custom op"));
    assert_eq!(
        layers[1].cause,
        Some(Cause::Nondeterminism),
        "before precision"
    );
}

#[test]
fn values_rounded_to_float16_are_on_its_grid() {
    let r: Vec<f32> = (0..64).map(|i| 0.1 + i as f32 * 0.01337).collect();
    let t: Vec<f32> = r.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
    let b: Vec<f32> = r
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (rb, tb, bb) = (bytes(&r), bytes(&t), bytes(&b));
    let shape = [64];
    let view = |b: &'static [u8]| TensorView::new("x", DType::F32, &shape, b).unwrap();
    let (rb, tb, bb): (&'static [u8], &'static [u8], &'static [u8]) = (
        Box::leak(rb.into_boxed_slice()),
        Box::leak(tb.into_boxed_slice()),
        Box::leak(bb.into_boxed_slice()),
    );
    assert_eq!(precision_grid(view(rb), view(tb)), Some("float16"));
    assert_eq!(precision_grid(view(rb), view(bb)), Some("bfloat16"));
    assert_eq!(precision_grid(view(rb), view(rb)), None);
}

/// A float32 baseline whose own error is `multiple` times what float32 explains.
fn baseline(multiple: f64) -> crate::Baseline {
    crate::Baseline {
        grid: "float32".to_string(),
        stages: 0,
        max_abs_diff: 1e-7,
        mean_abs_diff: 1e-8,
        allowed_max_abs_diff: 2e-7,
        allowed_mean_abs_diff: 2e-8,
        multiple,
        overflow: 0,
        reference_off: 0,
        narrow: None,
        from_exact: None,
        indices: None,
    }
}

#[test]
fn a_runtime_that_computes_what_its_file_says_leaves_the_file_to_blame() {
    // the layer is far beyond float32 against the reference's computation; against the
    // target file's own nodes computed exactly it is `as_written` times what float32 explains
    let judged = |as_written: Option<f64>, attributes: &[&str]| {
        let mut layers = vec![layer(0, 5e-4, Some(5e-4), &["x"])];
        layers[0].baseline = Some(baseline(238.0));
        layers[0].as_written = as_written.map(baseline);
        let e = Evidence {
            ops: vec!["Gelu".to_string()],
            written: vec!["`node_gelu` Gelu (approximate \"tanh\")".to_string()],
            attributes: attributes.iter().map(|a| a.to_string()).collect(),
            ..Evidence::default()
        };
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        explain(&mut layers, &[e], &mut summary);
        let fix = summary.defects.first().map(|d| d.fix.clone()).unwrap();
        (
            layers[0].cause.unwrap(),
            layers[0].detail.clone().unwrap(),
            fix,
        )
    };
    let (cause, detail, fix) = judged(Some(0.07), &[]);
    assert_eq!(cause, Cause::FileDiffers, "{detail}");
    assert!(
        detail.contains("the runtime computes what the file says"),
        "{detail}"
    );
    assert!(
        detail.contains("`node_gelu` Gelu (approximate \"tanh\")"),
        "{detail}"
    );
    assert!(fix.contains("the runtime is not at fault"), "{fix}");

    let edited = ["`approximate` \"none\" → \"tanh\" on `node_gelu`"];
    let (cause, detail, fix) = judged(Some(0.07), &edited);
    assert_eq!(cause, Cause::FileDiffers, "{detail}");
    assert!(
        detail.starts_with("an attribute differs: `approximate`"),
        "{detail}"
    );
    assert!(
        fix.contains("the runtime computes the file as written"),
        "{fix}"
    );

    // beyond its own file's nodes too: the kernel, whatever the file says
    for (as_written, attributes) in [
        (Some(3.0), &[][..]),
        (None, &[][..]),
        (Some(3.0), &edited[..]),
    ] {
        let (cause, detail, fix) = judged(as_written, attributes);
        assert_eq!(cause, Cause::OpImplementation, "{as_written:?}: {detail}");
        assert!(!fix.contains("not at fault"), "{fix}");
    }
}

#[test]
fn other_arguments_are_the_cause_only_where_they_compute_beyond_precision() {
    let judged = |multiple: f64| {
        let mut layers = vec![layer(0, 5e-2, Some(5e-2), &["x"])];
        layers[0].baseline = Some(baseline(multiple));
        let e = Evidence {
            arguments: vec!["`eps` 1e-05 → 0.5".to_string()],
            ..Evidence::default()
        };
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        explain(&mut layers, &[e], &mut summary);
        let fix = summary.defects.first().map(|d| d.fix.clone());
        (
            layers[0].cause.unwrap(),
            layers[0].detail.clone().unwrap(),
            fix,
        )
    };
    let (cause, detail, fix) = judged(163.0);
    assert_eq!(cause, Cause::ArgumentMismatch, "{detail}");
    assert!(detail.contains("`eps` 1e-05 → 0.5"), "{detail}");
    assert!(detail.contains("163.0× what float32 explains"), "{detail}");
    assert!(
        fix.unwrap()
            .contains("make them the same for every dtype and device")
    );
    // a value that differs and computes nothing precision does not explain is no defect
    let (cause, detail, fix) = judged(0.8);
    assert_eq!(cause, Cause::Rounding, "{detail}");
    assert!(fix.is_none());
}

#[test]
fn a_layer_beyond_its_precision_under_the_absolute_tolerance_is_judged_all_the_same() {
    // l1's values are about 1e-3: 9% off stays under 1e-4 + 1e-5·|x|, and nothing after it
    // exceeds. Its own error is far beyond what float32 explains, judged so whatever the
    // tolerance: its kernel approximates, within every tolerance: named, not a defect.
    let judged = |downstream: f64| {
        let mut layers = vec![
            layer(0, 1e-7, Some(1e-7), &["x"]),
            layer(1, 9e-5, Some(9e-5), &["l0"]),
            layer(2, downstream, Some(1e-7), &["l1"]),
        ];
        layers[0].baseline = Some(baseline(0.4));
        layers[1].baseline = Some(baseline(130_000.0));
        layers[2].baseline = Some(baseline(0.5));
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        explain(&mut layers, &vec![Evidence::default(); 3], &mut summary);
        (layers, summary)
    };
    let (layers, summary) = judged(9e-5);
    assert!(!layers.iter().any(|l| l.exceeds_tol || l.local_exceeds));
    assert_eq!(summary.verdict, Verdict::NoDrift);
    assert!(summary.defects.is_empty(), "{:?}", summary.defects);
    let named: Vec<(&str, f64)> = (summary.approximations.iter())
        .map(|a| (a.layer.as_str(), a.multiple))
        .collect();
    assert_eq!(named, [("l1", 130_000.0)]);
    assert_eq!(layers[1].finding, Some(Finding::Approximation));
    let detail = layers[1].detail.as_deref().unwrap();
    assert!(
        detail.contains("an approximation, within every tolerance"),
        "{detail}"
    );
    assert!(!summary.fails(crate::FailOn::Defect) && summary.fails(crate::FailOn::Approximation));
    assert_eq!(layers[0].cause, None, "within what float32 explains");
    assert_eq!(layers[2].cause, None, "within what float32 explains");
    // where a layer after it exceeds with what it hands on, its kernel moved something past a
    // tolerance: a defect, and the origin
    let (_, summary) = judged(5e-4);
    assert_eq!(summary.verdict, Verdict::Defect);
    assert_eq!(summary.drift_origin.as_deref(), Some("l1"));
    let defects: Vec<(&str, &str)> = (summary.defects.iter())
        .map(|d| (d.layer.as_str(), d.cause.name()))
        .collect();
    assert_eq!(defects, [("l1", "op_implementation")]);
    assert!(summary.approximations.is_empty());
    // near the boundary it is precision's: no cause, no finding (within its tolerance a layer
    // has more margin: honest kernels reach 1.3× on small gradients)
    let mut near = vec![layer(0, 9e-5, Some(9e-5), &["x"])];
    near[0].baseline = Some(baseline(crate::WITHIN_TOLERANCE_MARGIN));
    let mut summary = analyse(&mut near, Tolerance::PerDtype);
    explain(&mut near, &[Evidence::default()], &mut summary);
    assert_eq!(
        (summary.verdict, near[0].cause.map(crate::Cause::name)),
        (Verdict::NoDrift, None)
    );
}

#[test]
fn a_float_layer_of_a_quantized_run_is_judged_like_any_other() {
    // A static int8 file: l0 quantizes (no float baseline); l1, a float op between quantized
    // values re-run on the reference's inputs, is held to its float32 ideal within its
    // tolerance as anywhere (on the calibration corpus such layers measure at most 0.6x once
    // paired right): far beyond it and within every tolerance, an approximation.
    let mut layers = vec![
        layer(0, 1e-2, Some(1e-2), &["x"]),
        layer(1, 6e-5, Some(6e-5), &["l0"]),
    ];
    layers[0].quantization = Some(crate::Quantization::new("int8", 0.02, 0).unwrap());
    layers[1].baseline = Some(baseline(79.0));
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    explain(
        &mut layers,
        &[Evidence::default(), Evidence::default()],
        &mut summary,
    );
    // far beyond it within every tolerance: its kernel approximates, named
    assert!(summary.defects.is_empty(), "{:?}", summary.defects);
    let named: Vec<&str> = summary
        .approximations
        .iter()
        .map(|a| a.layer.as_str())
        .collect();
    assert_eq!(named, ["l1"]);
}

#[test]
fn a_layer_that_exceeds_with_what_it_inherits_is_judged_on_its_own_error() {
    // l0 is a defect that takes everything after it past the tolerance; l2's own error stays
    // within its tolerance (a second, smaller edit) but is far beyond what float32 explains:
    // a defect of its own, not "inherited". l1 at what float32 explains is inherited.
    let mut layers = vec![
        layer(0, 1e-1, Some(1e-1), &["x"]),
        layer(1, 1e-1, Some(1e-7), &["l0"]),
        layer(2, 1e-1, Some(1.5e-6), &["l1"]),
    ];
    layers[0].baseline = Some(baseline(50_000.0));
    layers[1].baseline = Some(baseline(0.4));
    layers[2].baseline = Some(baseline(12.0));
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    assert!(layers[2].exceeds_tol && !layers[2].local_exceeds);
    explain(&mut layers, &vec![Evidence::default(); 3], &mut summary);
    let defects: Vec<&str> = summary.defects.iter().map(|d| d.layer.as_str()).collect();
    assert_eq!(defects, ["l0", "l2"]);
    assert_eq!(layers[1].cause, Some(Cause::Inherited));
    let detail = layers[2].detail.as_deref().unwrap();
    assert!(
        detail.contains("it exceeds with what it inherits (mostly from `l0`)"),
        "{detail}"
    );
}

#[test]
fn a_range_that_clips_much_of_what_the_model_computes_is_the_defect_not_its_rounding() {
    // A QDQ layer (no float baseline models its quantization): its grid counted against the
    // reference's values. A third of them clipped is a calibration defect, named at the node
    // that quantizes; a few outliers clipped are the quantization's rounding.
    let judged = |saturated: u64| {
        let mut layers = vec![layer(0, 3.0, Some(3.0), &["x"])];
        layers[0].baseline_reason = Some("the target quantizes it".to_string());
        let mut grid = crate::Quantization::new("int8", 1.5e-3, -128).unwrap();
        (grid.saturated, grid.elements) = (saturated, 1000);
        let e = Evidence {
            ops: vec!["QuantizeLinear".into(), "DequantizeLinear".into()],
            clipped: Some(Clipped {
                what: "this layer".into(),
                node: "relu_QuantizeLinear".into(),
                grid,
            }),
            ..Evidence::default()
        };
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        explain(&mut layers, &[e], &mut summary);
        summary
    };
    let clipped = judged(355);
    let [defect] = &clipped.defects[..] else {
        panic!("{:?}", clipped.defects)
    };
    assert_eq!(defect.cause, Cause::QuantizationRange);
    assert!(
        defect
            .detail
            .starts_with("355 of the reference's 1000 values of this layer (35.5%)"),
        "{}",
        defect.detail
    );
    assert!(
        defect
            .fix
            .starts_with("the target's node(s) `relu_QuantizeLinear` clip(s)"),
        "{}",
        defect.fix
    );
    let outliers = judged(3);
    assert!(outliers.defects.is_empty(), "{:?}", outliers.defects);
    assert_eq!(outliers.verdict, Verdict::Precision);
}
