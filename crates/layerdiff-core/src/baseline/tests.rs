//! The same-precision baseline's rule on hand-made layers.
use super::*;
use crate::Tensor;

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
/// sum held in `dtype`.
fn sums(n: usize, terms: usize, dtype: DType) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut random = crate::SplitMix64::new(7);
    let (mut exact, mut rss, mut narrow) = (vec![], vec![], vec![]);
    for _ in 0..n {
        let values: Vec<f64> = (0..terms).map(|_| dtype.round(random.normal())).collect();
        exact.push(values.iter().sum::<f64>());
        rss.push(values.iter().map(|v| v * v).sum::<f64>().sqrt());
        narrow.push(values.iter().fold(0.0, |total, v| dtype.round(total + v)));
    }
    (exact, rss, narrow)
}

#[test]
fn a_kernel_that_sums_in_the_narrow_dtype_is_within_the_narrow_ideal_and_a_wrong_one_is_not() {
    let (terms, dtype) = (512, DType::BF16);
    let (x, rss, narrow) = sums(256, terms, dtype);
    let (reference, exact) = (tensor(DType::F32, &x), tensor(DType::F64, &x));
    let rss = tensor(DType::F64, &rss);
    let judge = |t: &[f64]| {
        let own = tensor(dtype, t);
        let reduction = Reduction {
            terms: terms as u64,
            rss: rss.view(),
        };
        let b = assess_baseline(
            reference.view(),
            own.view(),
            exact.view(),
            dtype,
            0,
            false,
            Some(reduction),
        );
        b.unwrap()
    };
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

/// The lane-wise path of a finite block gives what the element-wise one does: the maxima and
/// counts exactly, the sums to their last bits (summed in another order).
#[test]
fn a_finite_block_by_lanes_agrees_with_the_element_wise_path() {
    let mut rng = crate::SplitMix64::new(3);
    for grid in [DType::F32, DType::F16, DType::BF16] {
        for same_precision in [false, true] {
            let rule = lane_rule(grid, same_precision);
            let what = format!("{grid} same={same_precision}");
            let len = 4093; // not a multiple of the lanes
            // magnitudes from the grid's subnormals to far below its largest value
            let scale =
                |rng: &mut crate::SplitMix64| pow2(((rng.normal() * 6.0) as i32).clamp(-28, 12));
            let x: Vec<f64> = (0..len).map(|_| rng.normal() * scale(&mut rng)).collect();
            let (y, t) = reference_and_target(&mut rng, grid, &x);
            let spread = vec![0.0; len];
            let values = (&y[..], &t[..], &x[..], &spread[..]);
            let by_lanes = rule.finite_block(grid, values).expect("a finite block");
            let by_element = rule.block(values, |v| grid.round(v));
            let maxima = |s: &Sums| [s.base_max, s.own_max, s.allowed_max, s.target_from_exact];
            same_bits(&maxima(&by_lanes), &maxima(&by_element), &what);
            assert_eq!(by_lanes.count, by_element.count);
            for (a, b) in [
                (by_lanes.base_sum, by_element.base_sum),
                (by_lanes.own_sum, by_element.own_sum),
                (by_lanes.allowed_sum, by_element.allowed_sum),
            ] {
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs(),
                    "{grid} same={same_precision}: {a:e} {b:e}"
                );
            }
            // a value that is not finite sends the block to the element-wise path
            let mut broken = t.clone();
            broken[17] = f64::NAN;
            assert!(
                rule.finite_block(grid, (&y[..], &broken[..], &x[..], &spread[..]))
                    .is_none()
            );
        }
    }
}

/// The AVX2 and AVX-512 lane loops give the portable one's sums to the last bit (the same
/// operations on the same lanes), and say `None` where it does: a NaN or an infinity on any
/// side, an exact value beyond the grid's largest. Each runs where the CPU has it.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_vector_lane_loops_give_the_portable_ones_bits() {
    use crate::compare::Kernel;
    let kernels = Kernel::available();
    if kernels == [Kernel::Portable] {
        eprintln!("skipped: this CPU has no AVX2 and FMA");
    }
    for kernel in kernels.into_iter().filter(|&k| k != Kernel::Portable) {
        lane_loop_gives_the_portable_ones_bits(kernel);
    }
}

#[cfg(target_arch = "x86_64")]
fn lane_loop_gives_the_portable_ones_bits(kernel: crate::compare::Kernel) {
    let mut rng = crate::SplitMix64::new(11);
    for grid in [DType::F32, DType::F16, DType::BF16] {
        let max_finite = grid.max_finite().unwrap();
        for same_precision in [false, true] {
            let rule = lane_rule(grid, same_precision);
            let what = format!("{kernel:?}, {grid} same={same_precision}");
            let len = 4096;
            // magnitudes from below the grid's subnormals to near its largest values, and zeros
            let scale =
                |rng: &mut crate::SplitMix64| pow2(((rng.normal() * 12.0) as i32).clamp(-40, 12));
            let mut x: Vec<f64> = (0..len).map(|_| rng.normal() * scale(&mut rng)).collect();
            x[5] = 0.0;
            x[6] = -0.0;
            x[7] = max_finite.min(1e30) / 2.0;
            let (y, t) = reference_and_target(&mut rng, grid, &x);
            let sums = |(y, t, x): (&[f64], &[f64], &[f64])| {
                // SAFETY: the CPU has the kernel's features (Kernel::available); one length,
                // 4096.
                let vector = unsafe {
                    if kernel == crate::compare::Kernel::Avx512 {
                        super::rule::avx512::lane_sums(&rule, grid, max_finite, (y, t, x))
                    } else {
                        super::rule::avx2::lane_sums(&rule, grid, max_finite, (y, t, x))
                    }
                };
                let portable = rule.lanes(grid, max_finite, y, t, x);
                (vector, portable)
            };
            let (vector, portable) = sums((&y, &t, &x));
            let (vector, portable) = (
                vector.unwrap_or_else(|| panic!("{grid} same={same_precision}: vector None")),
                portable.unwrap_or_else(|| panic!("{grid} same={same_precision}: portable None")),
            );
            same_bits(&summed_values(&vector), &summed_values(&portable), &what);
            assert_eq!(vector.count, portable.count);
            // what is not finite, or beyond the grid, in each place
            for (side, at, value) in [
                (0, 100, f64::NAN),
                (1, 2000, f64::NAN),
                (2, 3000, f64::NAN),
                (0, 9, f64::INFINITY),
                (1, 4095, f64::NEG_INFINITY),
                (2, 0, f64::INFINITY),
                (2, 77, -2.0 * max_finite),
            ] {
                let mut broken = [y.clone(), t.clone(), x.clone()];
                broken[side][at] = value;
                let (vector, portable) = sums((&broken[0], &broken[1], &broken[2]));
                assert!(
                    vector.is_none() && portable.is_none(),
                    "{grid}: {value} at {at} of side {side}"
                );
            }
        }
    }
}

/// The rule of a layer judged by lanes: `grid`, two stages, neither expected values nor
/// measured terms.
fn lane_rule(grid: DType, same_precision: bool) -> Rule {
    Rule {
        kernel: KernelAllowance::new(grid, 1, 2),
        same_precision,
        expected_values: false,
        honest: crate::default_for(DType::F32),
        narrow: false,
        unit: 0.0,
        terms: 0,
        tail: 0.0,
    }
}

/// The float sums a block's lanes make, in one order.
fn summed_values(s: &Sums) -> [f64; 7] {
    [
        s.base_max,
        s.base_sum,
        s.own_max,
        s.own_sum,
        s.allowed_max,
        s.allowed_sum,
        s.target_from_exact,
    ]
}

/// Asserts two paths' values the same to the last bit.
fn same_bits(a: &[f64], b: &[f64], what: &str) {
    for (a, b) in a.iter().zip(b) {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: {a:e} {b:e}");
    }
}

/// A float32 reference a hair off exact values `x`, and a target on `grid` a thousandth off.
fn reference_and_target(
    rng: &mut crate::SplitMix64,
    grid: DType,
    x: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let y = x
        .iter()
        .map(|&v| DType::F32.round(v * (1.0 + 1e-7 * rng.normal())))
        .collect();
    let t = x
        .iter()
        .map(|&v| grid.round(v * (1.0 + 1e-3 * rng.normal())))
        .collect();
    (y, t)
}

/// Read straight from their bytes in their own dtypes (the AVX-512 kernel widens them as it
/// reads), a layer's values are summed exactly as the same values held in float64 are: blocks
/// all finite, one with a NaN (summed element by element), one past the grid's largest, and a
/// tail off the lanes.
#[test]
fn a_layer_read_in_its_own_dtypes_is_summed_as_its_values_held_in_float64() {
    let mut rng = crate::SplitMix64::new(21);
    let n = 4 * BLOCK + 13;
    for (grid, y_dtype, t_dtype) in [
        (DType::F16, DType::F32, DType::F16),
        (DType::BF16, DType::F32, DType::BF16),
        (DType::F32, DType::F32, DType::F32),
        (DType::F16, DType::F16, DType::F16),
        (DType::BF16, DType::BF16, DType::F32),
    ] {
        let x: Vec<f64> = (0..n).map(|_| rng.normal() * 3.0).collect();
        let (mut y, mut t) = reference_and_target(&mut rng, grid, &x);
        y[BLOCK + 5] = f64::NAN;
        t[2 * BLOCK + 7] = 1e39; // beyond float32, bfloat16 and float16 alike
        let narrow = [tensor(y_dtype, &y), tensor(t_dtype, &t)];
        let wide = narrow.clone().map(|v| v.cast(DType::F64));
        let exact = tensor(DType::F64, &x);
        for same_precision in [false, true] {
            let rule = lane_rule(grid, same_precision);
            let sums = |[y, t]: &[Tensor; 2]| {
                let s = summed(&rule, grid, [&y.view(), &t.view(), &exact.view()], None, n);
                (summed_values(&s), [s.count, s.overflow])
            };
            let ((narrow, counts), (wide, wide_counts)) = (sums(&narrow), sums(&wide));
            let what = format!("{y_dtype} against {t_dtype} on {grid}, same={same_precision}");
            same_bits(&narrow, &wide, &what);
            assert_eq!(counts, wide_counts, "{what}");
        }
    }
}
