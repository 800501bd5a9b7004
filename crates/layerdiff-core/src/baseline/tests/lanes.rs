//! The vector lane loops against the portable, element-wise path: the same bits.

use super::*;

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
            let values = (&y[..], &t[..], &x[..], &spread[..], &spread[..]);
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
                rule.finite_block(
                    grid,
                    (&y[..], &broken[..], &x[..], &spread[..], &spread[..])
                )
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
    use crate::kernel::Kernel;
    let kernels = Kernel::available();
    if kernels == [Kernel::Portable] {
        eprintln!("skipped: this CPU has no AVX2 and FMA");
    }
    for kernel in kernels.into_iter().filter(|&k| k != Kernel::Portable) {
        lane_loop_gives_the_portable_ones_bits(kernel);
    }
}

#[cfg(target_arch = "x86_64")]
fn lane_loop_gives_the_portable_ones_bits(kernel: crate::kernel::Kernel) {
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
                    if kernel == crate::kernel::Kernel::Avx512 {
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
        stalls: None,
        negligible: 0.0,
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
                let s = summed(
                    &rule,
                    grid,
                    [&y.view(), &t.view(), &exact.view()],
                    [None, None],
                    n,
                );
                (summed_values(&s), [s.count, s.overflow])
            };
            let ((narrow, counts), (wide, wide_counts)) = (sums(&narrow), sums(&wide));
            let what = format!("{y_dtype} against {t_dtype} on {grid}, same={same_precision}");
            same_bits(&narrow, &wide, &what);
            assert_eq!(counts, wide_counts, "{what}");
        }
    }
}

#[test]
fn a_long_float32_reduction_summed_in_another_order_is_precision_where_its_terms_are_known() {
    // tract's Conv against ONNX Runtime's in ResNet-50 (K = 4608): each sums in float32 in its
    // own order, and without the terms tract's read 1.4× to 1.6× what float32 explains, three
    // false defects on the default `layerdiff onnx` target. The reference sums by halves, the
    // target one term after another.
    let (n, terms) = (512, 4608);
    let mut random = crate::SplitMix64::new(11);
    let (mut x, mut y, mut t, mut rss) = (vec![], vec![], vec![], vec![]);
    fn halves(v: &[f64]) -> f64 {
        match v.len() {
            0 => 0.0,
            1 => v[0],
            len => DType::F32.round(halves(&v[..len / 2]) + halves(&v[len / 2..])),
        }
    }
    for _ in 0..n {
        let v: Vec<f64> = (0..terms)
            .map(|_| DType::F32.round(random.normal()))
            .collect();
        x.push(v.iter().sum::<f64>());
        y.push(halves(&v));
        t.push(v.iter().fold(0.0, |s, &w| DType::F32.round(s + w)));
        rss.push(v.iter().map(|w| w * w).sum::<f64>().sqrt());
    }
    let (reference, exact, spread) = (
        tensor(DType::F32, &y),
        tensor(DType::F64, &x),
        tensor(DType::F64, &rss),
    );
    let judge = |t: &[f64], reduction: bool| {
        let own = tensor(DType::F32, t);
        let terms = Reduction {
            terms: terms as u64,
            rss: spread.view(),
            each: None,
        };
        let (r, o, e) = (reference.view(), own.view(), exact.view());
        assess_baseline(r, o, e, DType::F32, 0, false, reduction.then_some(terms)).unwrap()
    };
    let blind = judge(&t, false);
    assert!(blind.beyond(), "{blind:?}");
    let b = judge(&t, true);
    assert!(!b.beyond() && b.narrow.is_none(), "{b:?}");
    // a kernel that scales its result by 1 + 1e-5: beyond, terms or not
    let scaled: Vec<f64> = t
        .iter()
        .map(|&v| DType::F32.round(v * (1.0 + 1e-5)))
        .collect();
    let b = judge(&scaled, true);
    assert!(b.beyond(), "{b:?}");
}
