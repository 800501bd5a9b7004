//! [`Rule::lane_sums`] in explicit AVX2: the same operations on the same lanes, so the same
//! bits. The compiler's vectorization of the lane loop spilled its sixteen accumulators and
//! worked each exponent out twice; here lanes 0–3 of a block are passed over first, then lanes
//! 4–7 (each lane sums its elements in the same order either way), the grid's step is worked
//! out once for the rounding and the kernel's allowance, and a multiply-add is fused only where
//! the product is exact (a power of two times a value), so it rounds as the two operations do.

use std::arch::x86_64::*;

use super::{HONEST_FACTOR, LANES, Rule, Sums};
use crate::DType;
use crate::dtype::INTEGER;

/// The sums of a finite block as [`Rule::lane_sums`] makes them, `None` where it says `None`.
///
/// # Safety
/// The CPU must have AVX2 and FMA; the three slices must be of one length, a multiple of
/// [`LANES`].
#[target_feature(enable = "avx2,fma")]
pub(in crate::baseline) unsafe fn lane_sums(
    rule: &Rule,
    grid: DType,
    max_finite: f64,
    (reference, own, exact): (&[f64], &[f64], &[f64]),
) -> Option<Sums> {
    let len = reference.len();
    assert!(own.len() == len && exact.len() == len && len.is_multiple_of(LANES));
    let values = (reference, own, exact);
    // SAFETY: the caller guarantees the features and the lengths.
    unsafe {
        match (grid, rule.same_precision) {
            (DType::F32, false) => lanes::<true, false>(rule, max_finite, values),
            (DType::F32, true) => lanes::<true, true>(rule, max_finite, values),
            (_, false) => lanes::<false, false>(rule, max_finite, values),
            (_, true) => lanes::<false, true>(rule, max_finite, values),
        }
    }
}

/// The accumulators of four lanes, in the order of [`Sums`]' lane arrays.
#[derive(Clone, Copy)]
struct Four {
    from_exact: __m256d,
    base_max: __m256d,
    base_sum: __m256d,
    own_max: __m256d,
    own_sum: __m256d,
    allowed_max: __m256d,
    allowed_sum: __m256d,
    /// The largest |reference| or |own|, and the largest |exact|: what says the block finite.
    sides: __m256d,
    exact: __m256d,
}

/// `F32`: the grid is float32 (rounded by conversion), else float16 or bfloat16 (rounded on the
/// kernel's step). `SAME`: the reference computes in the grid itself.
#[target_feature(enable = "avx2,fma")]
unsafe fn lanes<const F32: bool, const SAME: bool>(
    rule: &Rule,
    max_finite: f64,
    (reference, own, exact): (&[f64], &[f64], &[f64]),
) -> Option<Sums> {
    let kernel = &rule.kernel;
    let sign = _mm256_set1_pd(-0.0);
    let abs = |v: __m256d| _mm256_andnot_pd(sign, v);
    let smallest_normal = _mm256_set1_pd(kernel.smallest_normal);
    let exponent_bits = _mm256_set1_epi64x(0x7ff << 52);
    // a step's bits are the magnitude's exponent bits less the stored significand's; its
    // reciprocal's, this less the exponent bits
    let mantissa = _mm256_set1_epi64x(i64::from(kernel.mantissa) << 52);
    let reciprocal = _mm256_set1_epi64x((i64::from(kernel.mantissa) + 2046) << 52);
    let integer = _mm256_set1_pd(INTEGER);
    let per_magnitude = _mm256_set1_pd(kernel.per_magnitude);
    let steps = _mm256_set1_pd(kernel.steps);
    let honest = _mm256_set1_pd(HONEST_FACTOR);
    let zero = _mm256_setzero_pd();
    let mut halves = [Four {
        from_exact: zero,
        base_max: zero,
        base_sum: zero,
        own_max: zero,
        own_sum: zero,
        allowed_max: zero,
        allowed_sum: zero,
        sides: zero,
        exact: zero,
    }; 2];
    let (yp, tp, xp) = (reference.as_ptr(), own.as_ptr(), exact.as_ptr());
    for (h, acc) in halves.iter_mut().enumerate() {
        let mut a = *acc;
        for k in (4 * h..reference.len()).step_by(LANES) {
            // SAFETY: `k + 4 <= len` (len is a multiple of eight), within all three slices.
            let (y, t, x) = unsafe {
                (
                    _mm256_loadu_pd(yp.add(k)),
                    _mm256_loadu_pd(tp.add(k)),
                    _mm256_loadu_pd(xp.add(k)),
                )
            };
            let ax = abs(x);
            // the grid's step at |x| (its smallest below the normal range): the exponent of
            // max(|x|, smallest normal), less the stored significand bits
            let exponent = _mm256_and_si256(
                _mm256_castpd_si256(_mm256_max_pd(ax, smallest_normal)),
                exponent_bits,
            );
            let step = _mm256_castsi256_pd(_mm256_sub_epi64(exponent, mantissa));
            let ideal = if F32 {
                _mm256_cvtps_pd(_mm256_cvtpd_ps(x))
            } else {
                // finite_to_grid: x in steps (exact, a power of two), rounded to an integer,
                // back in units, the sign copied back
                let per_step = _mm256_castsi256_pd(_mm256_sub_epi64(reciprocal, exponent));
                let units = _mm256_sub_pd(_mm256_fmadd_pd(x, per_step, integer), integer);
                let rounded = _mm256_mul_pd(units, step);
                _mm256_or_pd(_mm256_andnot_pd(sign, rounded), _mm256_and_pd(sign, x))
            };
            let own_d = abs(_mm256_sub_pd(t, y));
            let base = abs(_mm256_sub_pd(ideal, y));
            let magnitude = _mm256_mul_pd(per_magnitude, ax);
            let flush = _mm256_and_pd(
                _mm256_cmp_pd::<_CMP_LT_OQ>(ax, smallest_normal),
                smallest_normal,
            );
            let mut bound = _mm256_add_pd(_mm256_fmadd_pd(steps, step, magnitude), flush);
            let mut typical = _mm256_add_pd(abs(_mm256_sub_pd(ideal, x)), magnitude);
            if SAME {
                let off = abs(_mm256_sub_pd(x, y));
                a.from_exact = _mm256_max_pd(a.from_exact, abs(_mm256_sub_pd(x, t)));
                bound = _mm256_max_pd(bound, off);
                typical = _mm256_max_pd(typical, off);
            }
            a.base_max = _mm256_max_pd(a.base_max, base);
            a.base_sum = _mm256_add_pd(a.base_sum, base);
            a.own_max = _mm256_max_pd(a.own_max, own_d);
            a.own_sum = _mm256_add_pd(a.own_sum, own_d);
            a.allowed_max = _mm256_max_pd(a.allowed_max, _mm256_fmadd_pd(honest, bound, base));
            a.allowed_sum = _mm256_add_pd(a.allowed_sum, _mm256_fmadd_pd(honest, typical, base));
            a.sides = _mm256_max_pd(a.sides, _mm256_max_pd(abs(y), abs(t)));
            a.exact = _mm256_max_pd(a.exact, ax);
        }
        *acc = a;
    }
    let lanes = |f: fn(&Four) -> __m256d| {
        let mut out = [0.0f64; LANES];
        // SAFETY: `out` holds eight f64.
        unsafe {
            _mm256_storeu_pd(out.as_mut_ptr(), f(&halves[0]));
            _mm256_storeu_pd(out.as_mut_ptr().add(4), f(&halves[1]));
        }
        out
    };
    // Finite as the lane loop asks: every reference and own value finite (a NaN, which a
    // maximum passes over, makes its difference's sum NaN), every exact value within the
    // grid (a NaN makes the ideal's difference's sum NaN).
    let (own_sum, base_sum) = (lanes(|a| a.own_sum), lanes(|a| a.base_sum));
    let fits = lanes(|a| a.sides).iter().all(|&v| v <= f64::MAX)
        && lanes(|a| a.exact).iter().all(|&v| v <= max_finite)
        && !own_sum.iter().chain(&base_sum).any(|v| v.is_nan());
    fits.then(|| {
        Sums::from_lanes(
            reference.len(),
            [
                lanes(|a| a.from_exact),
                lanes(|a| a.base_max),
                base_sum,
                lanes(|a| a.own_max),
                own_sum,
                lanes(|a| a.allowed_max),
                lanes(|a| a.allowed_sum),
            ],
        )
    })
}
