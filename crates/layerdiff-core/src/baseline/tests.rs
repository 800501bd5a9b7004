//! The same-precision baseline's rule on hand-made layers.
use super::*;
use crate::Tensor;

mod lanes;

fn tensor(dtype: DType, values: &[f64]) -> Tensor {
    Tensor::from_f64(dtype, values)
}

/// A layer whose exact values are `x`; the reference computes them in float32 exactly; the
/// target returns `t`; the ideal float16 implementation rounds `x` to float16.
fn judged(x: &[f64], t: &[f64]) -> Baseline {
    let reference = tensor(DType::F32, x);
    let own = tensor(DType::F16, t);
    let exact = tensor(DType::F64, x);
    assess_baseline(
        reference.view(),
        own.view(),
        exact.view(),
        DType::F16,
        0,
        false,
        None,
    )
    .unwrap()
}

#[test]
fn a_kernel_that_rounds_once_is_precision_and_one_off_by_a_few_steps_is_not() {
    let x: Vec<f64> = (0..256).map(|i| 1.0 + f64::from(i) * 0.00731).collect();
    let rounded: Vec<f64> = x.iter().map(|&v| DType::F16.round(v)).collect();
    let b = judged(&x, &rounded);
    assert!(!b.beyond() && b.multiple <= 0.5, "{b:?}");
    assert!(b.max_abs_diff > 0.0 && b.max_abs_diff <= DType::F16.step(2.0) / 2.0);
    // three steps off everywhere: beyond one rounding and two honest kernels' worth
    let off: Vec<f64> = x
        .iter()
        .map(|&v| DType::F16.round(v + 3.0 * DType::F16.step(v)))
        .collect();
    let b = judged(&x, &off);
    assert!(b.beyond(), "{b:?}");
}

#[test]
fn where_the_ideal_overflows_a_target_that_overflows_too_is_precision() {
    let x = [1e5, 2.0];
    let b = judged(&x, &[f64::INFINITY, 2.0]);
    assert_eq!(b.overflow, 1);
    assert!(!b.beyond(), "{b:?}");
    let b = judged(&[3.0, 2.0], &[f64::INFINITY, 2.0]);
    assert!(
        b.multiple.is_infinite(),
        "an overflow the ideal does not make"
    );
}

#[test]
fn a_float32_kernel_as_far_from_the_exact_value_as_the_reference_is_precision() {
    // The reference float32 value is off by 2e-5 of its own; the target, summing in
    // another order, by 3e-5 the other way: within two honest kernels.
    let x = [10.0, -4.0, 7.5];
    let y = [10.0 + 2e-5, -4.0 - 2e-5, 7.5 + 2e-5];
    let t = [10.0 - 3e-5, -4.0 + 3e-5, 7.5 - 3e-5];
    let (r, o, e) = (
        tensor(DType::F32, &y),
        tensor(DType::F32, &t),
        tensor(DType::F64, &x),
    );
    let b = assess_baseline(r.view(), o.view(), e.view(), DType::F32, 0, false, None).unwrap();
    assert!(!b.beyond(), "{b:?}");
    let t = [10.0 - 2e-4, -4.0 + 3e-5, 7.5 - 3e-5];
    let o = tensor(DType::F32, &t);
    let b = assess_baseline(r.view(), o.view(), e.view(), DType::F32, 0, false, None).unwrap();
    assert!(b.beyond(), "ten times the reference's own error: {b:?}");
}

#[test]
fn a_coarser_reference_neither_blames_nor_excuses_a_float16_kernel() {
    // A bfloat16 reference of a float16 target: the reference rounds each value to bfloat16,
    // the target's ideal to float16. What the reference rounds away is its own: an exact
    // float16 kernel is precision, one 0.3% off is beyond, though both are within what the
    // reference itself is off by.
    let x: Vec<f64> = (0..512).map(|i| 0.3 + f64::from(i) * 0.00917).collect();
    let y: Vec<f64> = x.iter().map(|&v| DType::BF16.round(v)).collect();
    let judged = |t: &[f64]| {
        let (r, o, e) = (
            tensor(DType::BF16, &y),
            tensor(DType::F16, t),
            tensor(DType::F64, &x),
        );
        assess_baseline(r.view(), o.view(), e.view(), DType::F16, 0, false, None).unwrap()
    };
    let honest: Vec<f64> = x.iter().map(|&v| DType::F16.round(v)).collect();
    let b = judged(&honest);
    assert!(!b.beyond() && b.multiple <= 1.0, "{b:?}");
    let off: Vec<f64> = x.iter().map(|&v| DType::F16.round(v * 1.003)).collect();
    let b = judged(&off);
    assert!(b.beyond(), "{b:?}");
}

fn float32(y: &[f64], t: &[f64], x: &[f64], expected_values: bool) -> Baseline {
    let (r, o, e) = (
        tensor(DType::F32, y),
        tensor(DType::F32, t),
        tensor(DType::F64, x),
    );
    assess_baseline(
        r.view(),
        o.view(),
        e.view(),
        DType::F32,
        0,
        expected_values,
        None,
    )
    .unwrap()
}

#[test]
fn a_reference_far_from_the_exact_value_is_off_only_where_the_target_is_not() {
    // A wrong expected value: the target is right, the expected value 0.5 off.
    let b = float32(&[2.5, 1.0], &[2.0, 1.0], &[2.0, 1.0], true);
    assert_eq!(b.reference_off, 1, "{b:?}");
    // A long reduction that cancels (Σ|terms| ≫ |x|): both honest sides are a few float32
    // steps of the terms away from a small exact value, beyond float32's tolerance of it,
    // the target less so here and more elsewhere.
    let b = float32(
        &[1e-3 + 9e-4, 1.0],
        &[1e-3 - 1e-4, 1.0 + 8e-4],
        &[1e-3, 1.0],
        true,
    );
    assert_eq!(b.reference_off, 0, "{b:?}");
    // A reference that is a kernel is never judged on its own: one less exact than the
    // target (PyTorch's float32 Conv against ONNX Runtime's, ResNet-50 at batch 8) is
    // rounding, bounded by a reduction's magnitude no per-element tolerance knows.
    let b = float32(
        &[1e-3 + 5e-4, 1.0],
        &[1e-3 + 1e-5, 1.0],
        &[1e-3, 1.0],
        false,
    );
    assert_eq!(b.reference_off, 0, "{b:?}");
    assert!(!b.beyond(), "{b:?}");
}

/// Sums of `terms` random terms for each of `n` elements: the exact sums, the terms' root
/// sums of squares, and the sums a kernel makes that adds them one by one into a running
/// sum held in `dtype`. The first term is `first` times as spread as the others.
fn sums(n: usize, terms: usize, dtype: DType, first: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut random = crate::SplitMix64::new(7);
    let (mut exact, mut rss, mut narrow) = (vec![], vec![], vec![]);
    for _ in 0..n {
        let values: Vec<f64> = (0..terms)
            .map(|k| dtype.round(random.normal() * if k == 0 { first } else { 1.0 }))
            .collect();
        exact.push(values.iter().sum::<f64>());
        rss.push(values.iter().map(|v| v * v).sum::<f64>().sqrt());
        narrow.push(values.iter().fold(0.0, |total, v| dtype.round(total + v)));
    }
    (exact, rss, narrow)
}

/// A target `t` in `dtype` of the sums `x` of `terms` terms each whose root sums of squares
/// are `rss`, judged with its terms measured.
fn narrow_judged(x: &[f64], terms: usize, rss: &[f64], t: &[f64], dtype: DType) -> Baseline {
    let (reference, exact) = (tensor(DType::F32, x), tensor(DType::F64, x));
    let (rss, own) = (tensor(DType::F64, rss), tensor(dtype, t));
    let reduction = Reduction {
        terms: terms as u64,
        rss: rss.view(),
        each: None,
    };
    assess_baseline(
        reference.view(),
        own.view(),
        exact.view(),
        dtype,
        0,
        false,
        Some(reduction),
    )
    .unwrap()
}

#[test]
fn a_kernel_that_sums_in_the_narrow_dtype_is_within_the_narrow_ideal_and_a_wrong_one_is_not() {
    let (terms, dtype) = (512, DType::BF16);
    let (x, rss, narrow) = sums(256, terms, dtype, 1.0);
    let judge = |t: &[f64]| narrow_judged(&x, terms, &rss, t, dtype);
    let rss = tensor(DType::F64, &rss);
    let (reference, exact) = (tensor(DType::F32, &x), tensor(DType::F64, &x));
    // summed in bfloat16: far beyond a float32-accumulating kernel, within the narrow one
    let b = judge(&narrow);
    assert!(b.beyond() && b.accumulates_narrow(), "{b:?}");
    assert_eq!(b.narrow.as_ref().unwrap().terms, 512);
    // rounded once: within both
    let once: Vec<f64> = x.iter().map(|&v| dtype.round(v)).collect();
    let b = judge(&once);
    assert!(!b.beyond() && !b.accumulates_narrow(), "{b:?}");
    // a sum off by half its terms' spread everywhere: beyond both ideals, a defect
    let rss_values: Vec<f64> = (0..x.len()).map(|i| rss.view().get_f64(i)).collect();
    let off: Vec<f64> = x
        .iter()
        .zip(&rss_values)
        .map(|(&v, &r)| dtype.round(v + 0.5 * r))
        .collect();
    let b = judge(&off);
    assert!(b.beyond() && !b.accumulates_narrow(), "{b:?}");
    // the same sizes of error as the narrow sums', each pushing its element outward: a
    // kernel that scales its result, not an accumulation's rounding
    let scaled: Vec<f64> = x
        .iter()
        .zip(&narrow)
        .map(|(&v, &n)| dtype.round(v + (n - v).abs() * v.signum()))
        .collect();
    let b = judge(&scaled);
    let n = b.narrow.as_ref().unwrap();
    assert!(n.systematic > 0.9 && n.multiple <= DEFECT_MARGIN, "{b:?}");
    assert!(b.beyond() && !b.accumulates_narrow(), "{b:?}");
    // without the terms, there is no narrow ideal: beyond is a defect
    let own = tensor(dtype, &narrow);
    let b = assess_baseline(
        reference.view(),
        own.view(),
        exact.view(),
        dtype,
        0,
        false,
        None,
    )
    .unwrap();
    assert!(b.beyond() && b.narrow.is_none(), "{b:?}");
}

#[test]
fn the_errors_of_a_narrow_sum_shuffled_among_its_elements_are_no_accumulation() {
    // A weight's gradient whose rows sum terms of scales over two decades (the inputs'
    // features): a bfloat16 running sum errs most where the terms are largest. The very same
    // errors dealt out to other elements (noise of a rounding's size, a wrong kernel) are as
    // large on average and at most, and no accumulation makes them.
    let (n, terms, dtype) = (2048, 256, DType::BF16);
    let mut random = crate::SplitMix64::new(11);
    let (mut x, mut rss, mut narrow) = (vec![], vec![], vec![]);
    for i in 0..n {
        let scale = 10f64.powf(2.0 * (i % 64) as f64 / 63.0 - 1.0);
        let values: Vec<f64> = (0..terms)
            .map(|_| dtype.round(scale * random.normal()))
            .collect();
        x.push(values.iter().sum::<f64>());
        rss.push(values.iter().map(|v| v * v).sum::<f64>().sqrt());
        narrow.push(values.iter().fold(0.0, |total, v| dtype.round(total + v)));
    }
    let b = narrow_judged(&x, terms, &rss, &narrow, dtype);
    let n_ideal = b.narrow.clone().unwrap();
    assert!(b.beyond() && b.accumulates_narrow(), "{b:?}");
    assert!(
        !n_ideal.scattered() && n_ideal.judged == n as u64,
        "{n_ideal:?}"
    );
    // each element's error moved to another element far along (another scale)
    let errors: Vec<f64> = narrow.iter().zip(&x).map(|(t, v)| t - v).collect();
    let shuffled: Vec<f64> = (0..n).map(|i| x[i] + errors[(i * 37 + 5) % n]).collect();
    let b = narrow_judged(&x, terms, &rss, &shuffled, dtype);
    let m = b.narrow.clone().unwrap();
    assert!(
        m.multiple <= DEFECT_MARGIN && m.leans_as_rounding(),
        "{m:?}"
    );
    assert!(m.scattered(), "{m:?}");
    assert!(b.beyond() && !b.accumulates_narrow(), "{b:?}");
}

#[test]
fn a_narrow_sum_whose_first_term_swamps_the_rest_is_judged_on_its_terms() {
    // A ViT's LayerNorm bias gradient at one thread: 197 positions added one by one in
    // bfloat16, the class token's first and most of the sum; the other 196 share a sign and
    // are each under half a step of it, so many are lost.
    let (n, terms, dtype) = (768, 197, DType::BF16);
    let mut random = crate::SplitMix64::new(11);
    let mut each = vec![0.0; terms * n];
    for e in 0..n {
        let (first, rest) = (0.19 * random.normal(), 0.05 * random.normal() / 196.0);
        each[e] = dtype.round(first);
        for k in 1..terms {
            each[k * n + e] = dtype.round(rest + 0.00027 * random.normal());
        }
    }
    let values = &each;
    let column = |e: usize| (0..terms).map(move |k| values[k * n + e]);
    let x: Vec<f64> = (0..n).map(|e| column(e).sum()).collect();
    let rss: Vec<f64> = (0..n)
        .map(|e| column(e).map(|v| v * v).sum::<f64>().sqrt())
        .collect();
    let narrow: Vec<f64> = (0..n)
        .map(|e| column(e).fold(0.0, |total, v| dtype.round(total + v)))
        .collect();
    let each = tensor(DType::F64, &each);
    let judge = |t: &[f64], handed: bool| {
        let (reference, exact) = (tensor(DType::F32, &x), tensor(DType::F64, &x));
        let (rss, own) = (tensor(DType::F64, &rss), tensor(dtype, t));
        let reduction = Reduction {
            terms: terms as u64,
            rss: rss.view(),
            each: handed.then(|| each.view()),
        };
        let (r, o, e) = (reference.view(), own.view(), exact.view());
        assess_baseline(r, o, e, dtype, 0, false, Some(reduction)).unwrap()
    };
    // from the count and spread of its terms alone, the lost terms look like a defect
    let b = judge(&narrow, false);
    assert!(b.beyond() && !b.accumulates_narrow(), "{b:?}");
    // with the terms themselves, the kernel that adds them one by one is the narrow ideal
    let b = judge(&narrow, true);
    assert!(b.beyond() && b.accumulates_narrow(), "{b:?}");
    // an error of the same size scattered at random, four times over, is no such kernel
    let scattered: Vec<f64> = x
        .iter()
        .zip(&narrow)
        .map(|(&v, &k)| {
            let size = 4.0 * (k - v).abs().max(dtype.step(v));
            dtype.round(v + size * random.normal())
        })
        .collect();
    let b = judge(&scattered, true);
    assert!(b.beyond() && !b.accumulates_narrow(), "{b:?}");
}

#[test]
fn a_layer_just_past_its_allowance_is_still_precision() {
    let x: Vec<f64> = (0..256).map(|i| 1.0 + f64::from(i) * 0.00731).collect();
    let b = judged(
        &x,
        &x.iter().map(|&v| DType::F16.round(v)).collect::<Vec<_>>(),
    );
    let margin = Baseline {
        multiple: DEFECT_MARGIN,
        ..b.clone()
    };
    assert!(!margin.beyond());
    let past = Baseline {
        multiple: DEFECT_MARGIN * 1.01,
        ..b
    };
    assert!(past.beyond());
}

#[test]
fn a_kernel_allowance_steps_as_its_dtype_does() {
    let mut rng = crate::SplitMix64::new(7);
    for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        let kernel = KernelAllowance::new(dtype, 1, 0);
        let n = output_steps(dtype);
        let smallest_normal = dtype.step(0.0) * pow2(dtype.mantissa_bits().unwrap() as i32 - 1);
        let mut values = vec![
            0.0,
            -0.0,
            5e-324,
            1e-310,
            f64::MIN_POSITIVE,
            1e300,
            f64::MAX,
        ];
        values.extend((0..10_000).map(|_| rng.normal() * pow2((rng.normal() * 40.0) as i32)));
        for x in values {
            let flush = if x.abs() < smallest_normal {
                smallest_normal
            } else {
                0.0
            };
            let expected = n * dtype.step(x.abs()) + flush;
            assert_eq!(
                kernel.at(x, 0.0).to_bits(),
                expected.to_bits(),
                "{dtype} at {x:e}"
            );
        }
    }
}

#[test]
fn an_index_layer_is_held_to_the_indices_of_its_rounded_inputs_exactly() {
    let int = |v: &[f64]| tensor(DType::I64, v);
    // the reference's argmax, and the same op on its inputs rounded to float16: one near tie
    // broken at the second element
    let (reference, exact) = (int(&[3., 1., 4., 1., 5.]), int(&[3., 2., 4., 1., 5.]));
    let judge = |own: &Tensor| {
        let (r, o, e) = (reference.view(), own.view(), exact.view());
        assess_baseline(r, o, e, DType::F16, 0, false, None).unwrap()
    };
    let honest = judge(&int(&[3., 2., 4., 1., 5.]));
    assert!(!honest.beyond() && honest.multiple == 1.0, "{honest:?}");
    let ix = honest.indices.unwrap();
    assert_eq!(
        (ix.elements, ix.differ, ix.ideal_differ, ix.off_ideal),
        (5, 1, 1, 0)
    );
    assert_eq!(judge(&reference).multiple, 0.0);
    // the reference's index where the rounding broke a tie is no error of the target's
    assert_eq!(
        judge(&int(&[3., 1., 4., 1., 6.]))
            .indices
            .unwrap()
            .off_ideal,
        1
    );
    assert_eq!(
        judge(&int(&[3., 1., 4., 1., 5.]))
            .indices
            .unwrap()
            .off_ideal,
        0
    );
    // a tie the rounding did not make, broken the other way: the kernel's own
    let other = judge(&int(&[3., 2., 4., 0., 5.]));
    assert!(other.beyond(), "{other:?}");
    assert_eq!(other.indices.unwrap().off_ideal, 1);
}
