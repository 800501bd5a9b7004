//! Which layer a finding is named at: the rounding's, not the target's; one defect re-run by two
//! layers is that defect once.

use super::*;

#[test]
fn a_reference_that_rounds_on_a_narrower_grid_is_named_as_the_rounding_not_the_target() {
    // OpenVINO at bf16 as the reference: a float32 layer within what its precision explains
    let how = "the reference's plugin computes float32 in bf16".to_string();
    let judged = |grid: &str, reference: Option<DType>| {
        let mut layers = vec![layer(0, 5e-3, Some(5e-3), &["x"])];
        layers[0].baseline = Some(crate::Baseline {
            grid: grid.to_string(),
            ..baseline(0.4)
        });
        let e = Evidence {
            ops: vec!["MatMul".to_string()],
            reference_lowered: reference.map(|g| (g, how.clone())),
            ..Evidence::default()
        };
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        explain(&mut layers, &[e], &mut summary);
        (layers[0].cause.unwrap(), layers[0].detail.clone().unwrap())
    };
    // the target in float32 against a bfloat16 reference: the reference's rounding
    let (cause, detail) = judged("float32", Some(DType::BF16));
    assert_eq!(cause, Cause::Rounding, "{detail}");
    assert!(
        detail.starts_with("the reference computes this layer in bfloat16 (the reference's"),
        "{detail}"
    );
    assert!(detail.contains(", the target in float32:"), "{detail}");
    // both in bfloat16 (two releases of one runtime): shared rounding
    let (cause, detail) = judged("bfloat16", Some(DType::BF16));
    assert_eq!(cause, Cause::Rounding, "{detail}");
    assert!(
        detail.starts_with("both sides compute this layer in bfloat16"),
        "{detail}"
    );
    // a reference that computes as its file says: the target's precision loss, as before
    let (cause, detail) = judged("bfloat16", None);
    assert_eq!(cause, Cause::PrecisionLoss, "{detail}");
    assert!(
        detail.starts_with("the target computes this layer in bfloat16, the reference in float32"),
        "{detail}"
    );
}

#[test]
fn a_file_difference_two_layers_re_run_is_one_defect() {
    // A decoder's file with its position ids one too far: the rotary table's cos is a layer;
    // its sin is not, so the layer after it that reads sin re-runs the edited nodes too. It
    // read as 5 `file_differs` defects for one edit.
    let mut layers = vec![
        layer(0, 5e-1, Some(5e-1), &["position_ids"]),
        layer(1, 2e-1, Some(2e-1), &["q", "position_ids"]),
        layer(2, 3e-1, Some(3e-1), &["x"]),
    ];
    let groups = [
        &["po_positions", "node_unsqueeze", "node_cos"][..],
        &["po_positions", "node_unsqueeze", "node_sin", "node_mul_6"][..],
        &["node_other"][..],
    ];
    for (l, nodes) in layers.iter_mut().zip(groups) {
        l.baseline = Some(baseline(5e5));
        l.as_written = Some(baseline(0.1));
        let mut location = crate::Location::onnx("v", nodes.last().unwrap(), "Mul");
        location.nodes = nodes.iter().map(|n| n.to_string()).collect();
        l.location = Some(location);
    }
    let mut summary = analyse(&mut layers, Tolerance::PerDtype);
    let e = Evidence {
        ops: vec!["Mul".to_string()],
        ..Evidence::default()
    };
    explain(&mut layers, &[e.clone(), e.clone(), e], &mut summary);
    let named: Vec<&str> = summary.defects.iter().map(|d| d.layer.as_str()).collect();
    assert_eq!(named, ["l0", "l2"], "{:?}", summary.defects);
    assert_eq!(layers[1].cause, Some(Cause::FileDiffers));
    let detail = layers[1].detail.as_deref().unwrap();
    assert!(
        detail.contains("re-runs nodes of `l0`'s group (`po_positions`, `node_unsqueeze`)"),
        "{detail}"
    );
}

#[test]
fn the_precision_origin_is_the_first_layer_past_its_tolerance_and_its_source_only_what_it_amplifies()
 {
    // l0 rounds within its tolerance; l1 exceeds. Where l1 adds little of its own, it is the
    // origin and l0 the source whose rounding it amplifies; where its own rounding is most of
    // what it hands on (a deep MLP's layer `6`, from `4`), the drift is born there: no source.
    let run = |own: f64, accumulated: f64| {
        let mut layers = vec![
            layer(0, 6e-5, Some(6e-5), &["x"]),
            layer(1, accumulated, Some(own), &["l0"]),
        ];
        for l in &mut layers {
            let d = l.local.as_ref().unwrap().max_abs_diff;
            l.float64 = Some(crate::Float64Distance {
                reference: d,
                target: d,
            });
        }
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        explain(
            &mut layers,
            &[Evidence::default(), Evidence::default()],
            &mut summary,
        );
        summary
    };
    let amplified = run(2e-6, 5e-4);
    let p = amplified.precision.as_ref().expect("precision");
    assert_eq!(p.origin.as_deref(), Some("l1"));
    assert_eq!(p.source.as_deref(), Some("l0"));
    let born = run(9e-5, 1.2e-4);
    let p = born.precision.as_ref().expect("precision");
    assert_eq!(p.origin.as_deref(), Some("l1"));
    assert_eq!(p.source, None, "{p:?}");
}

#[test]
fn a_data_parallel_ranks_defect_is_fixed_on_that_rank_not_in_a_kernel() {
    let fix_of = |name: &str| {
        let mut layers = vec![layer(0, 5e-3, Some(5e-3), &[])];
        layers[0].name = name.to_string();
        layers[0].baseline = Some(baseline(40.0));
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        explain(&mut layers, &[Evidence::default()], &mut summary);
        summary.defects[0].fix.clone()
    };
    let fix = fix_of("fc.weight:rank1");
    assert!(
        fix.starts_with("rank 1's gradient of `fc.weight` before the all-reduce"),
        "{fix}"
    );
    // a layer whose name only ends like one keeps the kernel's fix
    for name in ["fc.weight", "blocks:rankx", "fc:rank"] {
        assert!(!fix_of(name).contains("before the all-reduce"), "{name}");
    }
}
