//! [`Rule::lane_sums`] in explicit AVX-512: one `__m512d` holds a block's eight lanes, so one
//! pass over the block keeps every accumulator in a register (AVX2 passes over lanes 0–3, then
//! 4–7). The same operations on the same lanes as the AVX2 kernel, so the same bits. The
//! reference's and the target's values are read straight from their bytes in any float dtype,
//! widened in registers as the comparator reads them: no pass decodes a block first.

use std::arch::x86_64::*;

use super::{HONEST_FACTOR, LANES, Rule, Sums};
use crate::DType;
use crate::compare::avx512::Load;
use crate::compare::reader::{BF16, F16, F32, F64};
use crate::dtype::INTEGER;

/// The sums of a finite block as [`Rule::lane_sums`] makes them, `None` where it says `None`.
///
/// # Safety
/// The CPU must have the AVX-512 kernel's features (`Kernel::Avx512`); the three slices must be
/// of one length, a multiple of [`LANES`].
pub(in crate::baseline) unsafe fn lane_sums(
    rule: &Rule,
    grid: DType,
    max_finite: f64,
    (reference, own, exact): (&[f64], &[f64], &[f64]),
) -> Option<Sums> {
    let len = reference.len();
    assert!(own.len() == len && exact.len() == len && len.is_multiple_of(LANES));
    let (y, t) = (bytemuck::cast_slice(reference), bytemuck::cast_slice(own));
    // SAFETY: the caller guarantees the features and the lengths.
    unsafe { by_grid::<F64, F64>(rule, grid, max_finite, y, t, exact) }
}

/// [`lane_sums`] with the reference's and the target's values as their bytes (`(dtype, bytes)`,
/// float64, float32, float16 or bfloat16): `None` for another dtype, else what [`lane_sums`]
/// makes of the same values widened.
///
/// # Safety
/// The CPU must have the AVX-512 kernel's features (`Kernel::Avx512`); `exact` a multiple of
/// [`LANES`] long, the byte slices as many elements of their dtype.
pub(in crate::baseline) unsafe fn lane_sums_of(
    rule: &Rule,
    grid: DType,
    max_finite: f64,
    reference: (DType, &[u8]),
    own: (DType, &[u8]),
    exact: &[f64],
) -> Option<Option<Sums>> {
    let len = exact.len();
    assert!(len.is_multiple_of(LANES));
    assert!(reference.1.len() == len * reference.0.size() && own.1.len() == len * own.0.size());
    let (y, t) = (reference.1, own.1);
    macro_rules! own {
        ($Y:ty) => {
            // SAFETY: the caller guarantees the features and the lengths.
            unsafe {
                match own.0 {
                    DType::F32 => by_grid::<$Y, F32>(rule, grid, max_finite, y, t, exact),
                    DType::F16 => by_grid::<$Y, F16>(rule, grid, max_finite, y, t, exact),
                    DType::BF16 => by_grid::<$Y, BF16>(rule, grid, max_finite, y, t, exact),
                    DType::F64 => by_grid::<$Y, F64>(rule, grid, max_finite, y, t, exact),
                    _ => return None,
                }
            }
        };
    }
    Some(match reference.0 {
        DType::F32 => own!(F32),
        DType::F16 => own!(F16),
        DType::BF16 => own!(BF16),
        DType::F64 => own!(F64),
        _ => return None,
    })
}

/// [`lanes`] for the grid and the rule's precision.
///
/// # Safety
/// As [`lane_sums_of`].
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,f16c,popcnt")]
unsafe fn by_grid<Y: Load, T: Load>(
    rule: &Rule,
    grid: DType,
    max_finite: f64,
    y: &[u8],
    t: &[u8],
    x: &[f64],
) -> Option<Sums> {
    // SAFETY: the caller guarantees the features and the lengths.
    unsafe {
        match (grid, rule.same_precision) {
            (DType::F32, false) => lanes::<Y, T, true, false>(rule, max_finite, y, t, x),
            (DType::F32, true) => lanes::<Y, T, true, true>(rule, max_finite, y, t, x),
            (_, false) => lanes::<Y, T, false, false>(rule, max_finite, y, t, x),
            (_, true) => lanes::<Y, T, false, true>(rule, max_finite, y, t, x),
        }
    }
}

/// `F32`: the grid is float32 (rounded by conversion), else float16 or bfloat16 (rounded on the
/// kernel's step). `SAME`: the reference computes in the grid itself. The reference's values
/// `reference` are of `Y`, the target's `own` of `T`.
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,f16c,popcnt")]
unsafe fn lanes<Y: Load, T: Load, const F32: bool, const SAME: bool>(
    rule: &Rule,
    max_finite: f64,
    reference: &[u8],
    own: &[u8],
    exact: &[f64],
) -> Option<Sums> {
    let kernel = &rule.kernel;
    let sign = _mm512_set1_pd(-0.0);
    let smallest_normal = _mm512_set1_pd(kernel.smallest_normal);
    let exponent_bits = _mm512_set1_epi64(0x7ff << 52);
    // a step's bits are the magnitude's exponent bits less the stored significand's; its
    // reciprocal's, this less the exponent bits
    let mantissa = _mm512_set1_epi64(i64::from(kernel.mantissa) << 52);
    let reciprocal = _mm512_set1_epi64((i64::from(kernel.mantissa) + 2046) << 52);
    let integer = _mm512_set1_pd(INTEGER);
    let per_magnitude = _mm512_set1_pd(kernel.per_magnitude);
    let steps = _mm512_set1_pd(kernel.steps);
    let honest = _mm512_set1_pd(HONEST_FACTOR);
    let zero = _mm512_setzero_pd();
    let (mut from_exact, mut base_max, mut base_sum, mut own_max, mut own_sum) =
        (zero, zero, zero, zero, zero);
    let (mut allowed_max, mut allowed_sum, mut sides, mut exact_max) = (zero, zero, zero, zero);
    let (yp, tp, xp) = (reference.as_ptr(), own.as_ptr(), exact.as_ptr());
    for k in (0..exact.len()).step_by(LANES) {
        // SAFETY: `k + 8 <= len` (a multiple of eight), within all three slices (the caller's
        // promise).
        let (y, t, x) = unsafe { (Y::eight(yp, k), T::eight(tp, k), _mm512_loadu_pd(xp.add(k))) };
        let ax = _mm512_abs_pd(x);
        // the grid's step at |x| (its smallest below the normal range): the exponent of
        // max(|x|, smallest normal), less the stored significand bits
        let exponent = _mm512_and_si512(
            _mm512_castpd_si512(_mm512_max_pd(ax, smallest_normal)),
            exponent_bits,
        );
        let step = _mm512_castsi512_pd(_mm512_sub_epi64(exponent, mantissa));
        let ideal = if F32 {
            _mm512_cvtps_pd(_mm512_cvtpd_ps(x))
        } else {
            // finite_to_grid: x in steps (exact, a power of two), rounded to an integer, back
            // in units, the sign copied back
            let per_step = _mm512_castsi512_pd(_mm512_sub_epi64(reciprocal, exponent));
            let units = _mm512_sub_pd(_mm512_fmadd_pd(x, per_step, integer), integer);
            let rounded = _mm512_mul_pd(units, step);
            _mm512_or_pd(_mm512_abs_pd(rounded), _mm512_and_pd(sign, x))
        };
        let own_d = _mm512_abs_pd(_mm512_sub_pd(t, y));
        let base = _mm512_abs_pd(_mm512_sub_pd(ideal, y));
        let magnitude = _mm512_mul_pd(per_magnitude, ax);
        let subnormal = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(ax, smallest_normal);
        let flush = _mm512_maskz_mov_pd(subnormal, smallest_normal);
        let mut bound = _mm512_add_pd(_mm512_fmadd_pd(steps, step, magnitude), flush);
        let mut typical = _mm512_add_pd(_mm512_abs_pd(_mm512_sub_pd(ideal, x)), magnitude);
        if SAME {
            let off = _mm512_abs_pd(_mm512_sub_pd(x, y));
            from_exact = _mm512_max_pd(from_exact, _mm512_abs_pd(_mm512_sub_pd(x, t)));
            bound = _mm512_max_pd(bound, off);
            typical = _mm512_max_pd(typical, off);
        }
        base_max = _mm512_max_pd(base_max, base);
        base_sum = _mm512_add_pd(base_sum, base);
        own_max = _mm512_max_pd(own_max, own_d);
        own_sum = _mm512_add_pd(own_sum, own_d);
        allowed_max = _mm512_max_pd(allowed_max, _mm512_fmadd_pd(honest, bound, base));
        allowed_sum = _mm512_add_pd(allowed_sum, _mm512_fmadd_pd(honest, typical, base));
        let side = _mm512_max_pd(_mm512_abs_pd(y), _mm512_abs_pd(t));
        sides = _mm512_max_pd(sides, side);
        exact_max = _mm512_max_pd(exact_max, ax);
    }
    let lanes = |v: __m512d| {
        let mut out = [0.0f64; LANES];
        // SAFETY: `out` holds eight f64.
        unsafe { _mm512_storeu_pd(out.as_mut_ptr(), v) };
        out
    };
    // Finite as the lane loop asks: every reference and own value finite (a NaN, which a
    // maximum passes over, makes its difference's sum NaN), every exact value within the
    // grid (a NaN makes the ideal's difference's sum NaN).
    let (own_sum, base_sum) = (lanes(own_sum), lanes(base_sum));
    let fits = lanes(sides).iter().all(|&v| v <= f64::MAX)
        && lanes(exact_max).iter().all(|&v| v <= max_finite)
        && !own_sum.iter().chain(&base_sum).any(|v| v.is_nan());
    fits.then(|| {
        Sums::from_lanes(
            exact.len(),
            [
                lanes(from_exact),
                lanes(base_max),
                base_sum,
                lanes(own_max),
                own_sum,
                lanes(allowed_max),
                lanes(allowed_sum),
            ],
        )
    })
}
