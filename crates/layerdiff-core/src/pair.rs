//! Comparing one aligned pair of values, including the cases where their shapes or dtypes differ.
//!
//! A mask's sentinel is no value a narrower dtype can hold: models mask attention scores with
//! `torch.finfo(torch.float32).min` (about -3.4e38), which float16 holds as its own extreme
//! (-65504, where ONNX Runtime's converter clamps constants, or -Inf) and bfloat16 as its
//! largest (-3.39e38). Both mean "masked", and the softmax after gives 0 on either side. Such
//! positions are compared as equal and counted (`sentinels`): read as differences, they were
//! "errors" of 3.4e38 that dominated every figure and blamed the target's Add. A value that
//! merely overflows the narrower dtype (a float32 activation of 7e4 against float16's Inf) is
//! no sentinel: it stays a difference, and an overflow. int64's extremes (a Slice's "to the
//! end") held as int32's by a target that computes int64 in int32 are sentinels the same way.

use crate::{DType, Judge, LayerStatus, Stats, Tensor, TensorView, compare_judged};

/// Magnitudes from which a reference value is a sentinel (a mask's), not a computed value: half
/// of float32's largest.
pub const SENTINEL: f64 = f32::MAX as f64 / 2.0;

/// Magnitudes from which an int64 reference value is a sentinel, not a computed value: int64's
/// extremes, a Slice's "to the end" (INT64_MAX) or "from the end" (INT64_MIN), which a target
/// computing int64 in int32 (OpenVINO's CPU plugin) holds as int32's. Read as a difference it
/// was 9.2e18 at every such Constant.
const INT_SENTINEL: f64 = 4611686018427387904.0; // 2^62

/// The outcome of comparing one aligned pair of values.
#[derive(Debug, Clone, PartialEq)]
pub struct PairOutcome {
    /// Compared, or a shape mismatch.
    pub status: LayerStatus,
    /// Statistics when compared.
    pub stats: Option<Stats>,
    /// The target's shape, when it differs from the reference's.
    pub target_shape: Option<Vec<usize>>,
    /// The target's dtype name, when it differs from the reference's.
    pub target_dtype: Option<String>,
}

/// Compares a pair. Shapes that agree once size-1 dimensions are dropped (`[1, 512, 1, 1]` vs
/// `[1, 512]`) are compared element by element; any other disagreement is a shape mismatch.
/// Different dtypes are compared on their values (both widened), and the difference is recorded.
/// With a judge, each element is also measured against its rounding and bound
/// ([`crate::compare_judged`]).
pub fn compare_pair(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    judge: Option<Judge>,
) -> PairOutcome {
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    let target_shape = (reference.shape != target.shape).then(|| target.shape.to_vec());
    let target_dtype = (reference.dtype != target.dtype).then(|| target.dtype.name().to_string());
    let same_shape = squeeze(reference.shape) == squeeze(target.shape);
    let mut compared = compare_judged(reference, target, judge);
    // A sentinel the target holds as its own extreme is the largest difference there is: only
    // then is the pair compared again, with those positions equal.
    let floor = sentinel_floor(reference.dtype);
    let at_sentinel = |s: &Stats| s.worst.as_ref().is_some_and(|w| w.reference.abs() >= floor);
    if same_shape
        && compared.as_ref().is_ok_and(at_sentinel)
        && let Some((held, count)) = sentinels_held(reference, target)
    {
        compared = compare_judged(held.view(), target, judge).map(|s| Stats {
            sentinels: count,
            ..s
        });
    }
    match compared {
        Ok(stats) if same_shape => PairOutcome {
            status: LayerStatus::Compared,
            stats: Some(stats),
            target_shape,
            target_dtype,
        },
        _ => PairOutcome {
            status: LayerStatus::ShapeMismatch,
            stats: None,
            target_shape,
            target_dtype,
        },
    }
}

/// `compare_pair(reference, target, None)`'s largest difference alone, for each of `targets`,
/// in one pass over runs of elements that works out nothing else (a layer's distances from the
/// float64 truth are only that): each run of `reference` is read from memory once, for every
/// target. The same values: NaN positions are not compared, equal
/// values differ by nothing; where a target's shape differs, or the reference reaches
/// [`SENTINEL`] (a pair may hold sentinels), [`compare_pair`] itself.
pub fn max_abs_diffs<const N: usize>(
    reference: TensorView<'_>,
    targets: [TensorView<'_>; N],
) -> [Option<f64>; N] {
    use rayon::prelude::*;
    /// Elements decoded at a time.
    const RUN: usize = 2048;
    let whole = |target| {
        compare_pair(reference, target, None)
            .stats
            .map(|s| s.max_abs_diff)
    };
    let fits = |t: &TensorView<'_>| {
        reference.dtype.is_float() && t.dtype.is_float() && reference.shape == t.shape
    };
    if !targets.iter().all(fits) {
        return targets.map(whole);
    }
    let n = reference.numel();
    let (.., most, largest) = (0..n.div_ceil(RUN))
        .into_par_iter()
        .fold(
            // each task decodes into buffers of its own, made once
            || (vec![0.0f64; RUN], vec![0.0f64; RUN], [0.0f64; N], 0.0f64),
            |(mut r, mut t, mut most, mut largest), k| {
                let (from, len) = (k * RUN, RUN.min(n - k * RUN));
                // eight at a time straight from the bytes, where a kernel reads both dtypes
                let fast = targets
                    .map(|target| crate::compare::largest_difference(reference, target, from, len));
                if fast.iter().all(Option::is_some) {
                    for (most, fast) in most.iter_mut().zip(fast.into_iter().flatten()) {
                        *most = most.max(fast.0);
                        largest = largest.max(fast.1);
                    }
                    return (r, t, most, largest);
                }
                reference.decode_into(from, &mut r[..len]);
                for &a in &r[..len] {
                    largest = if a.abs() > largest { a.abs() } else { largest };
                }
                for (target, most) in targets.iter().zip(&mut most) {
                    target.decode_into(from, &mut t[..len]);
                    for (&a, &b) in r[..len].iter().zip(&t[..len]) {
                        let d = if a == b { 0.0 } else { (b - a).abs() };
                        // a NaN on either side is not compared (its comparisons are false)
                        *most = if d > *most { d } else { *most };
                    }
                }
                (r, t, most, largest)
            },
        )
        .reduce(
            || (Vec::new(), Vec::new(), [0.0; N], 0.0),
            |x, y| {
                let most = std::array::from_fn(|k| x.2[k].max(y.2[k]));
                (x.0, x.1, most, x.3.max(y.3))
            },
        );
    if largest >= SENTINEL {
        return targets.map(whole);
    }
    most.map(Some)
}

/// The reference with each sentinel that the narrower target holds as its own extreme (same
/// sign, at least half its largest finite value, or infinite) replaced by the target's value,
/// and how many were; `None` when the target's range is the reference's or no position is such
/// a pair.
/// The float64 truth against a float32 side is such a pair too: the float64 copy of a model
/// masks with float64's extreme.
fn sentinels_held(reference: TensorView<'_>, target: TensorView<'_>) -> Option<(Tensor, u64)> {
    let limit = match reference.dtype {
        // an int64 extreme held as int32's, in whichever integer dtype it comes back
        DType::I64 if !target.dtype.is_float() => f64::from(i32::MAX),
        // a target whose range ends elsewhere than the reference's (float16 against float32,
        // or against bfloat16, whose range is float32's; float32 against bfloat16, whose
        // largest is a step short of float32's; float32 against float16): it holds the mask
        // at its own extreme
        // (or, fed the reference's own sentinel in a local re-run, near it: a float32 target
        // of a float16 reference computes -65504.17 from its -65504)
        _ if target.dtype.max_finite()? != reference.dtype.max_finite()? => {
            (target.dtype.max_finite()? / 2.0).min(sentinel_floor(reference.dtype))
        }
        _ => return None,
    };
    if reference.numel() != target.numel() {
        return None;
    }
    let floor = sentinel_floor(reference.dtype);
    let mut values = vec![0.0; reference.numel()];
    reference.dtype.decode_f64(reference.bytes, &mut values);
    let mut count = 0;
    for (i, r) in values.iter_mut().enumerate() {
        if r.abs() < floor || !r.is_finite() {
            continue;
        }
        let t = target.get_f64(i);
        if t != *r && t.signum() == r.signum() && t.abs() >= limit {
            *r = t;
            count += 1;
        }
    }
    if count == 0 {
        return None;
    }
    // a float one held in float64: the target's extreme is no value of the reference's dtype
    // (float32's is Inf in bfloat16, float16's -65504 is -65536)
    let dtype = if reference.dtype.is_float() {
        DType::F64
    } else {
        reference.dtype
    };
    let mut bytes = vec![0; values.len() * dtype.size()];
    dtype.encode_f64_into(&values, &mut bytes);
    let tensor = Tensor::new("reference", dtype, reference.shape.to_vec(), bytes).ok()?;
    Some((tensor, count))
}

/// `reference` cast to `dtype`, to feed a side that holds its values so: a mask's sentinel
/// (from [`sentinel_floor`]) held as `dtype`'s own extreme where `dtype`'s range ends before
/// the reference's, as that side's own model computes its mask (`torch.finfo(dtype).min`), not
/// as the ±Inf a cast makes of it. A row of keys all masked so read gave a softmax of NaN that
/// the side's own run never makes.
pub fn held_as(reference: TensorView<'_>, dtype: DType) -> Tensor {
    let cast = reference.to_dtype(dtype);
    let (Some(held), Some(wide)) = (dtype.max_finite(), reference.dtype.max_finite()) else {
        return cast;
    };
    // a sentinel is an infinity the cast made: found on the cast's own bits (a half of what
    // the reference reads, one pass, for every value a local re-run is fed), the rest untouched
    let infinity = match dtype {
        DType::F16 => 0x7C00u16,
        DType::BF16 => 0x7F80,
        _ => return cast, // no narrower float range a model runs in
    };
    let cast_inf = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]) & 0x7FFF == infinity;
    if held >= wide || !cast.bytes.chunks_exact(2).any(cast_inf) {
        return cast;
    }
    let floor = sentinel_floor(reference.dtype);
    let mut values = vec![0.0; reference.numel()];
    reference.dtype.decode_f64(reference.bytes, &mut values);
    let mut out = vec![0.0; values.len()];
    dtype.decode_f64(&cast.bytes, &mut out);
    for (o, r) in out.iter_mut().zip(&values) {
        if r.is_finite() && r.abs() >= floor {
            *o = held.copysign(*r);
        }
    }
    let mut bytes = vec![0; cast.bytes.len()];
    dtype.encode_f64_into(&out, &mut bytes);
    Tensor { bytes, ..cast }
}

/// The magnitude from which a value of `dtype` is a sentinel: [`SENTINEL`], or half the
/// largest value of a dtype that cannot hold it (a float16 reference masks at -65504).
fn sentinel_floor(dtype: DType) -> f64 {
    if dtype == DType::I64 {
        INT_SENTINEL
    } else {
        SENTINEL.min(dtype.max_finite().map_or(SENTINEL, |m| m / 2.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_difference_alone_is_the_comparisons() {
        let mut rng = crate::SplitMix64::new(11);
        let truth: Vec<f64> = (0..10_000).map(|_| rng.normal() * 100.0).collect();
        let mut side: Vec<f64> = truth
            .iter()
            .map(|v| v * (1.0 + 1e-3 * rng.normal()))
            .collect();
        let mut truth_odd = truth.clone();
        for (k, v) in [(3, f64::NAN), (40, f64::INFINITY), (41, f64::NEG_INFINITY)] {
            side[k] = v;
        }
        truth_odd[500] = f64::NAN;
        truth_odd[41] = f64::INFINITY;
        side[600] = truth_odd[600];
        // the largest difference, then a NaN later in its lane of eight (a reference that
        // reaches an infinity is compared whole)
        let mut before_nan: Vec<f64> = truth.iter().map(|v| v + 1e-3).collect();
        before_nan[16] = truth[16] + 1e3;
        before_nan[24] = f64::NAN;
        let sentinel: Vec<f64> = truth
            .iter()
            .map(|&v| if v > 150.0 { -3.4e38 } else { v })
            .collect();
        for (reference, target, dtype) in [
            (&truth, &side, DType::F32),
            (&truth_odd, &side, DType::F16),
            (&truth, &truth, DType::BF16),
            (&sentinel, &sentinel, DType::F16),
            (&sentinel, &side, DType::F32),
            (&truth, &before_nan, DType::F32),
            (&before_nan, &truth, DType::F64),
        ] {
            let r = tensor(DType::F64, reference);
            let t = tensor(dtype, target);
            let whole = compare_pair(r.view(), t.view(), None)
                .stats
                .map(|s| s.max_abs_diff);
            let [alone] = max_abs_diffs(r.view(), [t.view()]);
            assert_eq!(alone.map(f64::to_bits), whole.map(f64::to_bits), "{dtype}");
        }
        // another shape: as the comparison says
        let (r, t) = (
            tensor(DType::F32, &truth),
            tensor(DType::F32, &truth[..9_999]),
        );
        assert_eq!(
            max_abs_diffs(r.view(), [t.view(), r.view()]),
            [None, Some(0.0)]
        );
    }

    fn tensor(dtype: DType, values: &[f64]) -> Tensor {
        Tensor::from_f64(dtype, values)
    }

    #[test]
    fn a_masks_sentinel_held_as_the_narrower_dtypes_extreme_is_no_difference() {
        let min = f64::from(f32::MIN);
        let reference = tensor(DType::F32, &[1.0, min, min + 1e31, 2.0]);
        for held in [-65504.0, f64::NEG_INFINITY] {
            let target = tensor(DType::F16, &[1.0, held, -65472.0, 2.0]);
            let stats = compare_pair(reference.view(), target.view(), None)
                .stats
                .unwrap();
            assert_eq!((stats.sentinels, stats.max_abs_diff), (2, 0.0), "{held}");
            assert_eq!(stats.inf_reference, stats.inf_target, "no overflow: {held}");
        }
        let bf16 = tensor(DType::BF16, &[1.0, -3.3895e38, -3.3895e38, 2.0]);
        let stats = compare_pair(reference.view(), bf16.view(), None)
            .stats
            .unwrap();
        assert_eq!(stats.sentinels, 2);
        // A bfloat16 reference holds float32's range: a float16 target holds its own extreme
        // (-65504 is -65536 in bfloat16, one of its steps away)
        for held in [-65504.0, f64::NEG_INFINITY] {
            let target = tensor(DType::F16, &[1.0, held, held, 2.0]);
            let stats = compare_pair(bf16.view(), target.view(), None)
                .stats
                .unwrap();
            assert_eq!((stats.sentinels, stats.max_abs_diff), (2, 0.0), "{held}");
        }
        // A float32 target of a bfloat16 reference holds float32's extreme, a step beyond
        // bfloat16's largest; of a float16 reference, far beyond its -65504.
        let wide = tensor(DType::F32, &[1.0, min, min, 2.0]);
        let stats = compare_pair(bf16.view(), wide.view(), None).stats.unwrap();
        assert_eq!((stats.sentinels, stats.max_abs_diff), (2, 0.0));
        let half = tensor(DType::F16, &[1.0, -65504.0, -65504.0, 2.0]);
        let stats = compare_pair(half.view(), wide.view(), None).stats.unwrap();
        assert_eq!((stats.sentinels, stats.max_abs_diff), (2, 0.0));
        // fed float16's extreme in a local re-run, a float32 target computes near it
        let near = tensor(DType::F32, &[1.0, -65504.17, -65504.17, 2.0]);
        let stats = compare_pair(half.view(), near.view(), None).stats.unwrap();
        assert_eq!((stats.sentinels, stats.max_abs_diff), (2, 0.0));
        // The float64 truth masks with float64's extreme, a float32 side with its own.
        let truth = tensor(DType::F64, &[1.0, f64::MIN, f64::MIN, 2.0]);
        let stats = compare_pair(truth.view(), reference.view(), None)
            .stats
            .unwrap();
        assert_eq!((stats.sentinels, stats.max_abs_diff), (2, 0.0));
    }

    #[test]
    fn a_sentinel_fed_to_a_narrower_side_is_its_extreme_and_an_activation_overflows() {
        let min = f64::from(f32::MIN);
        let reference = tensor(DType::F32, &[min, 7e4, -1.5, f64::NEG_INFINITY]);
        let fed = held_as(reference.view(), DType::F16);
        let mut values = vec![0.0; 4];
        DType::F16.decode_f64(&fed.bytes, &mut values);
        assert_eq!(values, [-65504.0, f64::INFINITY, -1.5, f64::NEG_INFINITY]);
        let fed = held_as(reference.view(), DType::BF16);
        DType::BF16.decode_f64(&fed.bytes, &mut values);
        assert_eq!(values[0], -DType::BF16.max_finite().unwrap());
        // a dtype of float32's range or wider: the cast itself
        let same = held_as(reference.view(), DType::F64);
        assert_eq!(same, reference.view().to_dtype(DType::F64));
    }

    #[test]
    fn an_overflow_or_a_sentinel_the_target_lost_is_still_a_difference() {
        let min = f64::from(f32::MIN);
        // A float32 activation beyond float16's range is an overflow, not a sentinel.
        let reference = tensor(DType::F32, &[7e4, min, min]);
        let target = tensor(DType::F16, &[f64::INFINITY, 3.0, 65504.0]);
        let stats = compare_pair(reference.view(), target.view(), None)
            .stats
            .unwrap();
        assert_eq!(stats.sentinels, 0);
        assert_eq!(stats.inf_target, 1);
        assert!(stats.max_abs_diff.is_infinite());
        // The same dtype on both sides: a sentinel the target lost is the largest difference.
        let same = tensor(DType::F32, &[7e4, min, 0.0]);
        let stats = compare_pair(reference.view(), same.view(), None)
            .stats
            .unwrap();
        assert_eq!((stats.sentinels, stats.max_abs_diff), (0, -min));
    }

    #[test]
    fn int64s_extreme_held_as_int32s_is_no_difference_and_a_computed_value_is() {
        // OpenVINO computes int64 in int32: a ViT's Slice end INT64_MAX ("to the end") came
        // back as INT32_MAX, a difference of 9.2e18 that read "undecided" at 12 Constants
        let (max, min) = (i64::MAX as f64, i64::MIN as f64);
        let reference = tensor(DType::I64, &[0.0, max, min, 3.0]);
        let target = tensor(DType::I64, &[0.0, 2147483647.0, -2147483648.0, 3.0]);
        let stats = compare_pair(reference.view(), target.view(), None)
            .stats
            .unwrap();
        assert_eq!((stats.sentinels, stats.max_abs_diff), (2, 0.0));
        let as_int32 = tensor(DType::I32, &[0.0, 2147483647.0, -2147483648.0, 3.0]);
        let stats = compare_pair(reference.view(), as_int32.view(), None)
            .stats
            .unwrap();
        assert_eq!((stats.sentinels, stats.max_abs_diff), (2, 0.0));
        // a computed value beyond int32's range, or an extreme the target lost, differs
        let computed = tensor(DType::I64, &[0.0, 3e9, max, 3.0]);
        let saturated = tensor(DType::I64, &[0.0, 2147483647.0, 5.0, 3.0]);
        let stats = compare_pair(computed.view(), saturated.view(), None)
            .stats
            .unwrap();
        assert_eq!(stats.sentinels, 0);
        assert!(stats.max_abs_diff > 1e18);
    }
}
