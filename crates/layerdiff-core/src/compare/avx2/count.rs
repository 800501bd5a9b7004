//! Finding and counting in vectors, for the AVX2 kernel: where the largest difference is, how
//! many differences exceed each threshold, the histogram slots narrowed for counting.

use std::arch::x86_64::*;

use super::THRESHOLDS;

/// The first index of `d` that holds `x` (0 where none does), four at a time.
#[inline(always)]
pub(super) fn first_equal(d: &[f64], x: f64) -> usize {
    // SAFETY: the caller runs with AVX enabled; `d.len()` is a multiple of eight, so every load
    // stays inside `d`.
    unsafe {
        let x = _mm256_set1_pd(x);
        for v in (0..d.len()).step_by(4) {
            let equal = _mm256_cmp_pd::<_CMP_EQ_OQ>(_mm256_loadu_pd(d.as_ptr().add(v)), x);
            let mask = _mm256_movemask_pd(equal);
            if mask != 0 {
                return v + mask.trailing_zeros() as usize;
            }
        }
    }
    0
}

/// Eight histogram slots (each below 2^16, in a 64-bit lane) as eight u16, in another order:
/// the histogram counts them whatever their order.
#[inline(always)]
pub(super) fn narrow_slots(keys: [__m256i; 2]) -> __m128i {
    // SAFETY: the caller runs with AVX2 enabled.
    unsafe {
        // as 32-bit lanes each key and a zero: packed, each key a 32-bit lane of its own
        let words = _mm256_packus_epi32(keys[0], keys[1]);
        // packed again, four keys at the bottom of each 128-bit half
        let halves = _mm256_packus_epi32(words, words);
        _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b1000>(halves))
    }
}

/// The sum of four 64-bit counters.
#[inline(always)]
pub(super) fn lanes_sum(counts: __m256i) -> u64 {
    let mut c = [0u64; 4];
    // SAFETY: `c` holds four u64; the caller runs with AVX enabled.
    unsafe { _mm256_storeu_si256(c.as_mut_ptr().cast(), counts) };
    c.iter().sum()
}

/// Adds to `above[j]`, for the `M` thresholds after the first, how many of `d` exceed them: one
/// pass over `d`, one vector counter per threshold.
#[inline(always)]
pub(super) fn count_above<const M: usize>(d: &[f64], above: &mut [u64; THRESHOLDS.len()]) {
    // SAFETY (whole function): the caller runs with AVX2 enabled; `d.len()` is a multiple of
    // eight, so every load stays inside `d`.
    unsafe {
        let x: [__m256d; M] = std::array::from_fn(|j| _mm256_set1_pd(THRESHOLDS[j + 1].0));
        let mut counts = [_mm256_setzero_si256(); M];
        for v in (0..d.len()).step_by(4) {
            let dv = _mm256_loadu_pd(d.as_ptr().add(v));
            for j in 0..M {
                // A set lane is all ones, -1 as an integer: subtracting it counts one.
                let over = _mm256_castpd_si256(_mm256_cmp_pd::<_CMP_GT_OQ>(dv, x[j]));
                counts[j] = _mm256_sub_epi64(counts[j], over);
            }
        }
        for j in 0..M {
            above[j + 1] += lanes_sum(counts[j]);
        }
    }
}
