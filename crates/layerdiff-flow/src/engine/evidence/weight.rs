//! Whether a weight of the target is the reference's: the same, stored narrower (its
//! rounding, checked on vectors), quantized within its scale's half steps, or different.

use layerdiff_core::{DType, TensorView, compare};

/// A weight differs when its max abs diff exceeds this fraction of its largest magnitude:
/// above float32 rounding of a folded constant, far below any real edit.
const WEIGHT_RTOL: f64 = 1e-5;

/// How a weight check says that the target's weight was read against the one parameter of its
/// shape, its name being none of the layer's (an optimizer's fused weight, a folded form).
pub const MATCHED_BY_SHAPE: &str = "matched by shape";

/// Checks one of the target's weights against the reference's counterpart: (the node that reads
/// it, the input position, its name, its values (dequantized where quantized), half its scale
/// step per element where quantized).
pub type WeightCheckFn<'a> =
    dyn Fn(&str, usize, &str, TensorView<'_>, Option<TensorView<'_>>) -> Option<WeightCheck> + 'a;

/// How a target weight relates to the reference's: the same, different (with a sentence), or
/// stored in lower precision (with a sentence).
#[derive(Debug)]
pub enum WeightCheck {
    /// The same weight.
    Same,
    /// A different weight, in words.
    Differs(String),
    /// The same weight stored in lower precision, in words.
    LowerPrecision(String),
}

impl WeightCheck {
    /// Adds what the check found to a layer's evidence: a different weight and the node that
    /// reads it (`""` where the side has no nodes), or a lower precision (the first one found
    /// stands).
    pub fn record(self, evidence: &mut layerdiff_core::Evidence, reader: &str) {
        match self {
            Self::Differs(text) => {
                evidence.weights.push(text);
                if !reader.is_empty() && !evidence.weight_readers.iter().any(|r| r == reader) {
                    evidence.weight_readers.push(reader.to_string());
                }
            }
            Self::LowerPrecision(text) => {
                evidence.precision.get_or_insert(text);
            }
            Self::Same => {}
        }
    }
}

/// Compares one weight of the two sides. A target weight in a narrower dtype is lower precision;
/// with `rounding_checked` it is also compared with the reference (a pass over the weight, which
/// the per-layer parameters of a framework side afford, and a whole ONNX file's weights checked
/// for every drifting layer would not), so one that moved beyond its rounding differs. A
/// quantized weight comes dequantized, with `half_step` (half its scale step, per element): it
/// is the same weight quantized where every element lies within that of the reference's.
pub fn check_weight(
    name: &str,
    reference: TensorView<'_>,
    target: TensorView<'_>,
    rounding_checked: bool,
    half_step: Option<TensorView<'_>>,
) -> WeightCheck {
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    if squeeze(reference.shape) != squeeze(target.shape) {
        return WeightCheck::Differs(format!(
            "`{name}` has shape {:?} on the target, {:?} on the reference",
            target.shape, reference.shape
        ));
    }
    // a half step per element of the target's weight; one of another size says nothing
    if let Some(step) = half_step.filter(|s| s.numel() == target.numel()) {
        return check_quantized(name, reference, target, step);
    }
    // Both sides below float32, in two dtypes (bfloat16 against float16): each holds its own
    // rounding of the model's weight, so neither is the other's cast; they agree within the
    // coarser one's steps, inside the range both hold.
    let both_lower = target.dtype != reference.dtype
        && [target.dtype, reference.dtype]
            .iter()
            .all(|d| d.narrower_than(DType::F32));
    // The reference stored narrower (a bfloat16 reference of a float32 target): its rounding.
    let reference_narrower = reference.dtype.narrower_than(target.dtype);
    if target.dtype.narrower_than(reference.dtype) || reference_narrower || both_lower {
        let said = if both_lower {
            format!(
                "the target stores `{name}` in {}, the reference in {}: each its own rounding of the model's",
                target.dtype, reference.dtype
            )
        } else if reference_narrower {
            format!(
                "the reference stores `{name}` in {}, the target in {}: the reference's rounding of the model's",
                reference.dtype, target.dtype
            )
        } else {
            format!(
                "the target stores `{name}` in {}, the reference in {}",
                target.dtype, reference.dtype
            )
        };
        // The common case in one fast pass: the narrower side holds exactly the other's cast.
        let cast = if reference_narrower {
            reference.is_cast_of(target)
        } else {
            target.is_cast_of(reference)
        };
        if !both_lower && (!rounding_checked || cast) {
            return WeightCheck::LowerPrecision(said);
        }
        // The same weight stored narrower, unless an element moved by more than two steps of
        // that dtype at its magnitude (rounding moves it by half a step at most; a changed
        // element moves far more). Below the dtype's smallest normal number its steps stop
        // shrinking; beyond its largest finite one a converter saturates (a mask's float32
        // minimum stored as float16's, or as -Inf): that is its rounding too.
        let coarse = if reference.dtype.narrower_than(target.dtype) {
            reference.dtype
        } else {
            target.dtype
        };
        let step = coarse
            .mantissa_bits()
            .map_or(0.0, |bits| 2f64.powi(1 - bits as i32));
        let smallest_of = |d: DType| match d {
            DType::F16 => 2f64.powi(-14),
            _ => f64::from(f32::MIN_POSITIVE),
        };
        let smallest = smallest_of(target.dtype).max(smallest_of(reference.dtype));
        let largest = (target.dtype.max_finite().unwrap_or(f64::INFINITY))
            .min(reference.dtype.max_finite().unwrap_or(f64::INFINITY));
        let (mut moved, mut worst) = (0usize, 0.0f64);
        let n = reference.numel().min(target.numel());
        let within = |r: f64, t: f64| (t - r).abs() <= 2.0 * step * r.abs().max(smallest);
        pairwise(reference, target, n, |rs, ts| {
            if all_rounded(rs, ts, largest, step, smallest) {
                return;
            }
            for (&r, &t) in rs.iter().zip(ts) {
                let rounded = if r.is_nan() || t.is_nan() {
                    r.is_nan() && t.is_nan()
                } else if r.abs() > largest {
                    t.signum() == r.signum() && t.abs() >= largest * (1.0 - step)
                } else {
                    within(r, t)
                };
                if !rounded {
                    moved += 1;
                    worst = worst.max((t - r).abs());
                }
            }
        });
        if moved > 0 {
            return WeightCheck::Differs(format!(
                "`{name}` differs beyond its rounding to {coarse}: max abs diff {worst:.3e} ({moved} of {n} elements differ)",
            ));
        }
        return WeightCheck::LowerPrecision(said);
    }
    same_dtype(name, reference, target)
}

/// A weight against the reference's in the same dtype: the same, or different beyond
/// [`WEIGHT_RTOL`] of its largest magnitude (or NaN on one side only), in words.
fn same_dtype(name: &str, reference: TensorView<'_>, target: TensorView<'_>) -> WeightCheck {
    let Ok(stats) = compare(reference, target) else {
        return WeightCheck::Same;
    };
    let differs = stats.nan_mismatch > 0
        // (the largest magnitude read only where a difference needs it)
        || (stats.max_abs_diff > 0.0 && stats.max_abs_diff > WEIGHT_RTOL * reference.max_abs());
    if differs && stats.nan_mismatch > 0 {
        // the figures cover the elements both hold as numbers: alone, they would read 0
        WeightCheck::Differs(format!(
            "`{name}` differs: NaN on one side where the other holds a number in {} of {} elements (elsewhere max abs diff {:.3e}, {} more differ)",
            stats.nan_mismatch, stats.elements, stats.max_abs_diff, stats.abs_diff_above[0]
        ))
    } else if differs {
        WeightCheck::Differs(format!(
            "`{name}` differs: max abs diff {:.3e} ({} of {} elements differ)",
            stats.max_abs_diff, stats.abs_diff_above[0], stats.elements
        ))
    } else {
        WeightCheck::Same
    }
}

/// A dequantized weight against the reference's: quantization moves each element by half a
/// scale step at most (a weight is not clipped: its scale covers its range); an edit moves some
/// by more.
fn check_quantized(
    name: &str,
    reference: TensorView<'_>,
    target: TensorView<'_>,
    half_step: TensorView<'_>,
) -> WeightCheck {
    let (mut beyond, mut worst) = (0usize, 0.0f64);
    let n = reference.numel();
    let mut steps = vec![0.0; n];
    half_step.decode_into(0, &mut steps);
    let mut i = 0;
    pairwise(reference, target, n, |rs, ts| {
        for (&r, &t) in rs.iter().zip(ts) {
            let d = (r - t).abs();
            worst = worst.max(d);
            // a hair over half a step for the float32 arithmetic of scale and dequantization
            if d > steps[i] * (1.0 + 1e-3) + 1e-6 * r.abs() || d.is_nan() {
                beyond += 1;
            }
            i += 1;
        }
    });
    if beyond > 0 {
        return WeightCheck::Differs(format!(
            "`{name}` differs beyond its quantization: {beyond} of {n} elements moved by more than half a scale step (max abs diff {worst:.3e})"
        ));
    }
    WeightCheck::LowerPrecision(format!(
        "the target stores `{name}` quantized: every element within half a scale step of the reference's (max abs diff {worst:.3e})"
    ))
}

/// Whether every element of a run is in the narrow dtype's range (up to `largest`) and within
/// two of its steps (`step` at a magnitude, never below `smallest`'s) of the reference's: the
/// common case of a weight stored narrower, on AVX2's vectors where the CPU has them (a weight
/// that a narrow file folded in its own arithmetic differs from the reference's cast in most
/// elements, and every one of them is checked so: twice as fast as SSE2's).
fn all_rounded(rs: &[f64], ts: &[f64], largest: f64, step: f64, smallest: f64) -> bool {
    #[inline(always)]
    fn count(rs: &[f64], ts: &[f64], largest: f64, step: f64, smallest: f64) -> usize {
        rs.iter()
            .zip(ts)
            .map(|(&r, &t)| {
                let within = (t - r).abs() <= 2.0 * step * r.abs().max(smallest);
                usize::from(r.abs() <= largest && within)
            })
            .sum()
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn count_avx2(rs: &[f64], ts: &[f64], largest: f64, step: f64, smallest: f64) -> usize {
        count(rs, ts, largest, step, smallest)
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { count_avx2(rs, ts, largest, step, smallest) } == rs.len();
    }
    count(rs, ts, largest, step, smallest) == rs.len()
}

/// `each(r, t)` for the first `n` elements of two tensors, a run of each at a time, in order,
/// widened.
fn pairwise(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    n: usize,
    mut each: impl FnMut(&[f64], &[f64]),
) {
    const RUN: usize = 1024;
    let (mut r, mut t) = ([0.0f64; RUN], [0.0f64; RUN]);
    for from in (0..n).step_by(RUN) {
        let len = RUN.min(n - from);
        reference.decode_into(from, &mut r[..len]);
        target.decode_into(from, &mut t[..len]);
        each(&r[..len], &t[..len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerdiff_core::Tensor;

    fn tensor(values: &[f32]) -> Tensor {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new("w", DType::F32, vec![values.len()], bytes).unwrap()
    }

    #[test]
    fn a_weight_stored_narrower_is_lower_precision_unless_it_moved() {
        let reference = tensor(&[0.1, -0.2, 0.3, 1.7]);
        let same = reference.view().to_dtype(DType::BF16);
        assert!(matches!(
            check_weight("w", reference.view(), same.view(), true, None),
            WeightCheck::LowerPrecision(_)
        ));
        let moved = tensor(&[0.1, -0.2, 0.35, 1.7]).view().to_dtype(DType::BF16);
        match check_weight("w", reference.view(), moved.view(), true, None) {
            WeightCheck::Differs(text) => {
                assert!(text.contains("beyond its rounding to bfloat16"), "{text}")
            }
            _ => panic!("a weight moved by far more than a bfloat16 step is a different weight"),
        }
    }

    #[test]
    fn two_lower_precisions_of_one_weight_are_each_its_rounding_unless_it_moved() {
        // a bfloat16 reference against a float16 target: neither is the other's cast
        let mut rng = layerdiff_core::SplitMix64::new(7);
        let mut values: Vec<f32> = (0..10_000).map(|_| rng.normal() as f32 * 0.05).collect();
        values.push(f32::MIN); // a mask's minimum, saturated by float16
        let model = tensor(&values);
        let (bf16, f16) = (
            model.view().to_dtype(DType::BF16),
            model.view().to_dtype(DType::F16),
        );
        for (reference, target) in [(&bf16, &f16), (&f16, &bf16)] {
            match check_weight("w", reference.view(), target.view(), true, None) {
                WeightCheck::LowerPrecision(text) => {
                    assert!(text.contains("each its own rounding"), "{text}")
                }
                other => panic!("two roundings of one weight judged {other:?}"),
            }
        }
        let mut edited = values.clone();
        edited[4_321] += 0.25;
        let moved = tensor(&edited).view().to_dtype(DType::F16);
        match check_weight("w", bf16.view(), moved.view(), true, None) {
            WeightCheck::Differs(text) => assert!(text.contains("(1 of 10001"), "{text}"),
            other => panic!("an edited element between two roundings went unseen: {other:?}"),
        }
    }

    #[test]
    fn a_weight_nan_where_the_reference_holds_a_number_says_so_not_a_diff_of_zero() {
        let model: Vec<f32> = (0..48).map(|i| 0.01 * i as f32).collect();
        let mut edited = model.clone();
        edited[7] = f32::NAN;
        match check_weight(
            "w",
            tensor(&model).view(),
            tensor(&edited).view(),
            false,
            None,
        ) {
            WeightCheck::Differs(text) => assert_eq!(
                text,
                "`w` differs: NaN on one side where the other holds a number in 1 of 48 elements (elsewhere max abs diff 0.000e0, 0 more differ)"
            ),
            other => panic!("a NaN weight went unseen: {other:?}"),
        }
    }

    #[test]
    fn a_reference_stored_narrower_is_its_rounding_unless_it_moved() {
        let model: Vec<f32> = (0..64).map(|i| 0.013 * i as f32 - 0.4).collect();
        let wide = tensor(&model);
        let narrow = wide.clone().cast(DType::BF16);
        match check_weight("w", narrow.view(), wide.view(), true, None) {
            WeightCheck::LowerPrecision(text) => {
                assert!(text.contains("the reference's rounding"), "{text}")
            }
            other => panic!("a bfloat16 reference's rounding judged {other:?}"),
        }
        let mut edited = model.clone();
        edited[9] += 0.1;
        match check_weight("w", narrow.view(), tensor(&edited).view(), true, None) {
            WeightCheck::Differs(text) => assert!(text.contains("1 of 64"), "{text}"),
            other => panic!("an edited element beside a narrower reference went unseen: {other:?}"),
        }
    }

    #[test]
    fn one_element_moved_deep_inside_a_large_narrow_weight_is_found() {
        let mut rng = layerdiff_core::SplitMix64::new(5);
        let values: Vec<f32> = (0..100_000).map(|_| rng.normal() as f32 * 0.05).collect();
        let reference = tensor(&values);
        for dtype in [DType::F16, DType::BF16] {
            let same = reference.view().to_dtype(dtype);
            assert!(matches!(
                check_weight("w", reference.view(), same.view(), true, None),
                WeightCheck::LowerPrecision(_)
            ));
            // every element a step off its cast, as a file folded in its own arithmetic holds
            // them: rounding still
            let mut nudged = same.clone();
            nudged.bytes.iter_mut().step_by(2).for_each(|b| *b ^= 1);
            assert!(!nudged.view().is_cast_of(reference.view()));
            assert!(matches!(
                check_weight("w", reference.view(), nudged.view(), true, None),
                WeightCheck::LowerPrecision(_)
            ));
            let mut edited = values.clone();
            edited[77_777] += 0.5;
            let moved = tensor(&edited).view().to_dtype(dtype);
            match check_weight("w", reference.view(), moved.view(), true, None) {
                WeightCheck::Differs(text) => assert!(text.contains("(1 of 100000"), "{text}"),
                _ => panic!("{dtype}: one edited element of a large weight went unseen"),
            }
        }
    }

    #[test]
    fn a_value_beyond_the_narrow_range_saturated_by_a_converter_is_its_rounding() {
        // a causal mask's float32 minimum: float16 holds it as its own lowest, or as -Inf
        let reference = tensor(&[0.0, f32::MIN, 0.5, f32::MIN]);
        let saturated = tensor(&[0.0, -65504.0, 0.5, f32::NEG_INFINITY])
            .view()
            .to_dtype(DType::F16);
        assert!(matches!(
            check_weight("mask", reference.view(), saturated.view(), true, None),
            WeightCheck::LowerPrecision(_)
        ));
        let flipped = tensor(&[0.0, 65504.0, 0.5, f32::MIN])
            .view()
            .to_dtype(DType::F16);
        assert!(matches!(
            check_weight("mask", reference.view(), flipped.view(), true, None),
            WeightCheck::Differs(_)
        ));
    }

    #[test]
    fn a_quantized_weight_is_held_to_its_half_steps_and_a_step_tensor_of_another_size_is_ignored() {
        let reference = tensor(&[0.1, -0.2, 0.3, 1.7]);
        let quantized = tensor(&[0.12, -0.2, 0.28, 1.72]);
        let half = tensor(&[0.025; 4]);
        let judged = |step: &Tensor| {
            check_weight(
                "w",
                reference.view(),
                quantized.view(),
                true,
                Some(step.view()),
            )
        };
        assert!(matches!(judged(&half), WeightCheck::LowerPrecision(_)));
        let narrow = tensor(&[0.01; 4]);
        assert!(matches!(judged(&narrow), WeightCheck::Differs(_)));
        // a side that handed one step for the whole weight: no panic, judged without it
        let one = tensor(&[0.025]);
        let _ = check_weight(
            "w",
            reference.view(),
            quantized.view(),
            true,
            Some(one.view()),
        );
    }
}
