//! The finite fast path in explicit AVX2, judged or not. Two `__m256d` hold the [`LANES`] f64
//! accumulators of a block (lanes 0–3, then 4–7), so vector lane `j` sums elements
//! `k ≡ j (mod LANES)` in the order the scalar path does: the same operations, the same bits
//! (a multiply-add is fused only where the product is exact: two narrow values). Elements are
//! read straight from the tensors' bytes and widened in registers (float16 by F16C, bfloat16 by
//! a shift). Each chunk is passed over up to four times, so that every pass keeps its
//! accumulators in AVX2's sixteen registers; the first prefetches the next chunks, so that the
//! reads from memory overlap the arithmetic. The compiler's own vectorization of the scalar
//! path changes with every edit to it; this one does not.

use std::arch::x86_64::*;

use super::reader::{BF16, F16, F32, F64, Reader};
use super::rounding::{
    BUCKETS, EXPONENT_BITS, HIGHEST, KEPT_BITS, KEY_OFFSET, LOWEST, Tally, count_slots,
};
use super::{BLOCK, Judging, LANES, Outcome, Partial, SUB, THRESHOLDS, element, tree};
use crate::DType;
use count::{count_above, first_equal, lanes_sum, narrow_slots};

mod count;

/// How far ahead of the first pass its reads are prefetched, in elements.
const AHEAD: usize = 2 * SUB;

/// Eight f64 lanes: lanes 0–3, then 4–7.
type Pair = [__m256d; 2];

/// How this kernel loads a dtype: eight elements at a time, widened into the f64 lanes of
/// two AVX2 vectors.
trait Load: Reader {
    /// Elements `k..k + 8` of `base`, widened.
    unsafe fn eight(base: *const u8, k: usize) -> Pair;
}

/// Eight float32 values widened.
#[inline(always)]
unsafe fn widen(singles: __m256) -> Pair {
    unsafe {
        [
            _mm256_cvtps_pd(_mm256_castps256_ps128(singles)),
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(singles)),
        ]
    }
}

impl Load for F32 {
    #[inline(always)]
    unsafe fn eight(base: *const u8, k: usize) -> Pair {
        unsafe { widen(_mm256_loadu_ps(base.add(4 * k).cast())) }
    }
}

impl Load for F16 {
    #[inline(always)]
    unsafe fn eight(base: *const u8, k: usize) -> Pair {
        unsafe { widen(_mm256_cvtph_ps(_mm_loadu_si128(base.add(2 * k).cast()))) }
    }
}

impl Load for BF16 {
    #[inline(always)]
    unsafe fn eight(base: *const u8, k: usize) -> Pair {
        unsafe {
            let words = _mm256_cvtepu16_epi32(_mm_loadu_si128(base.add(2 * k).cast()));
            widen(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(words)))
        }
    }
}

impl Load for F64 {
    #[inline(always)]
    unsafe fn eight(base: *const u8, k: usize) -> Pair {
        unsafe {
            let p = base.add(8 * k).cast::<f64>();
            [_mm256_loadu_pd(p), _mm256_loadu_pd(p.add(4))]
        }
    }
}

// The kernel counts the first threshold from the mask of moved values.
const _: () = assert!(THRESHOLDS[0].0 == 0.0);

/// Elements `start..start + len` of two tensors' bytes, judged when `judging` says so. `len`
/// must be a multiple of [`LANES`].
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C, and both byte slices must hold `start + len` elements of
/// their dtype.
#[target_feature(enable = "avx2,f16c,fma")]
pub(super) unsafe fn finite_block(
    r: (DType, &[u8]),
    t: (DType, &[u8]),
    start: usize,
    len: usize,
    judging: Judging<'_>,
) -> Outcome {
    if !len.is_multiple_of(LANES) {
        return Outcome::Unsupported;
    }
    // SAFETY: the caller guarantees the features and the lengths.
    unsafe {
        by_dtypes!(
            r.0,
            t.0,
            Outcome::Unsupported,
            block(r.1, t.1, start, len, judging)
        )
    }
}

#[inline(always)]
fn lanes(v: Pair) -> [f64; LANES] {
    let mut out = [0.0f64; LANES];
    // SAFETY: `out` holds eight f64.
    unsafe {
        _mm256_storeu_pd(out.as_mut_ptr(), v[0]);
        _mm256_storeu_pd(out.as_mut_ptr().add(4), v[1]);
    }
    out
}

#[inline(always)]
fn largest(l: &[f64; LANES]) -> f64 {
    l.iter().fold(0.0f64, |m, &v| if v > m { v } else { m })
}

/// Applies `f` to both halves.
#[inline(always)]
fn each(mut f: impl FnMut(usize) -> __m256d) -> Pair {
    [f(0), f(1)]
}

#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn block<R: Load, T: Load>(
    r: &[u8],
    t: &[u8],
    start: usize,
    len: usize,
    judging: Judging<'_>,
) -> Outcome {
    debug_assert!(r.len() >= (start + len) * R::SIZE && t.len() >= (start + len) * T::SIZE);
    let (rp, tp) = (r.as_ptr(), t.as_ptr());
    let mut d = [0.0f64; SUB];
    // the block's histogram slots, counted once the whole block is seen finite (count_slots)
    let mut block_slots = [0u16; BLOCK];
    // how many of them are filled: a stretch with no difference fills none, its elements
    // counted in each lane's zero slot (`unmoved`)
    let (mut filled, mut unmoved) = (0, 0u32);
    let zero = _mm256_setzero_pd();
    let infinity = _mm256_set1_pd(f64::INFINITY);
    let two = _mm256_set1_pd(2.0);
    let sign = _mm256_set1_pd(-0.0);
    let abs = |v: __m256d| _mm256_andnot_pd(sign, v);
    let z = [zero; 2];
    let (mut sum_abs, mut sum_sq, mut dot, mut norm_r, mut norm_t, mut max_rel) =
        (z, z, z, z, z, z);
    let mut above = [0u64; THRESHOLDS.len()];
    let mut worst: Option<(f64, u64, f64, f64)> = None;
    // The judge's constants and accumulators.
    let judge = judging.as_ref().map(|(j, _)| **j);
    let (floor, inverse_base, atol, rtol) = judge.map_or((zero, zero, zero, zero), |j| {
        (
            _mm256_set1_pd(j.floor),
            _mm256_castsi256_pd(_mm256_set1_epi64x(j.inverse_base as i64)),
            _mm256_set1_pd(j.atol),
            _mm256_set1_pd(j.rtol),
        )
    });
    let exponent_bits = _mm256_set1_epi64x(EXPONENT_BITS as i64);
    let (lowest, highest, largest_f64) = (
        _mm256_set1_pd(LOWEST),
        _mm256_set1_pd(HIGHEST),
        _mm256_set1_pd(f64::MAX),
    );
    let key_offset = _mm256_set1_epi64x(KEY_OFFSET as i64);
    let zero_slots = [
        _mm256_setr_epi64x(
            BUCKETS as i64,
            BUCKETS as i64 + 1,
            BUCKETS as i64 + 2,
            BUCKETS as i64 + 3,
        ),
        _mm256_setr_epi64x(
            BUCKETS as i64 + 4,
            BUCKETS as i64 + 5,
            BUCKETS as i64 + 6,
            BUCKETS as i64 + 7,
        ),
    ];
    let (mut sum_ulp, mut max_ulp, mut needed) = (z, z, z);
    let mut beyond = _mm256_setzero_si256();
    let mut moved_count = _mm256_setzero_si256();
    let mut from = 0;
    while from < len {
        let n = SUB.min(len - from);
        let mut max_abs = z;
        let mut finite = true;
        // Passes over the chunk (in L1 cache): each keeps its accumulators in registers,
        // where one pass doing all would spill them (AVX2 has sixteen).
        for v in (0..n).step_by(LANES) {
            let k = start + from + v;
            // SAFETY: `k + 8 <= start + len`, within both slices (the caller's promise). A
            // prefetch is a hint and never faults, wherever it points.
            let (a, b) = unsafe {
                _mm_prefetch::<_MM_HINT_T0>(rp.wrapping_add((k + AHEAD) * R::SIZE).cast());
                _mm_prefetch::<_MM_HINT_T0>(tp.wrapping_add((k + AHEAD) * T::SIZE).cast());
                (R::eight(rp, k), T::eight(tp, k))
            };
            let diff = each(|h| abs(_mm256_sub_pd(b[h], a[h])));
            // SAFETY: `v + 8 <= n <= SUB`.
            unsafe {
                _mm256_storeu_pd(d.as_mut_ptr().add(v), diff[0]);
                _mm256_storeu_pd(d.as_mut_ptr().add(v + 4), diff[1]);
            }
            sum_abs = each(|h| _mm256_add_pd(sum_abs[h], diff[h]));
            sum_sq = each(|h| _mm256_add_pd(sum_sq[h], _mm256_mul_pd(diff[h], diff[h])));
            max_abs = each(|h| _mm256_max_pd(diff[h], max_abs[h]));
            // the first threshold is 0; a set lane is all ones, -1 as an integer
            for half in diff {
                let moved = _mm256_cmp_pd::<_CMP_GT_OQ>(half, zero);
                moved_count = _mm256_sub_epi64(moved_count, _mm256_castpd_si256(moved));
            }
            if !(R::NARROW && T::NARROW) {
                for h in 0..2 {
                    let ok = _mm256_and_pd(
                        _mm256_cmp_pd::<_CMP_LT_OQ>(abs(a[h]), infinity),
                        _mm256_cmp_pd::<_CMP_LT_OQ>(abs(b[h]), infinity),
                    );
                    finite &= _mm256_movemask_pd(ok) == 0b1111;
                }
            }
        }
        // Elements `v..v + 8` of the chunk again, both sides widened, and their differences
        // as the first pass stored them.
        let again = |v: usize| {
            let k = start + from + v;
            // SAFETY: `k + 8 <= start + len` (the caller's promise) and `v + 8 <= n <= SUB`.
            unsafe {
                let p = d.as_ptr().add(v);
                let diff: Pair = [_mm256_loadu_pd(p), _mm256_loadu_pd(p.add(4))];
                (R::eight(rp, k), T::eight(tp, k), diff)
            }
        };
        // The relative difference divides, the costliest operation of the pass, and only an
        // element that beats the largest so far changes the result: this pass asks
        // whether any element of the chunk may (`d > bar · den`, with `bar` a hair under that
        // largest and at most 1, so that `bar · den` never overflows), and only a chunk where
        // one may is divided out. The result is the same maximum, bit for bit.
        let record = largest(&lanes(max_rel));
        let bar = _mm256_set1_pd((record * (1.0 - f64::EPSILON * 8.0)).min(1.0));
        let tiny = _mm256_set1_pd(f64::MIN_POSITIVE);
        let mut may = _mm256_setzero_pd();
        for v in (0..n).step_by(LANES) {
            let (a, b, diff) = again(v);
            // A product of two narrow values is exact in f64, so fusing it with the sum rounds
            // once, as multiplying and adding do.
            dot = each(|h| product_sum(a[h], b[h], dot[h], R::NARROW && T::NARROW));
            norm_r = each(|h| product_sum(a[h], a[h], norm_r[h], R::NARROW));
            norm_t = each(|h| product_sum(b[h], b[h], norm_t[h], T::NARROW));
            for h in 0..2 {
                let den = _mm256_max_pd(abs(a[h]), abs(b[h]));
                let bound = _mm256_mul_pd(bar, den);
                let mut beats = _mm256_cmp_pd::<_CMP_GT_OQ>(diff[h], bound);
                if !(R::NARROW && T::NARROW) {
                    // A bound that underflowed was rounded by more than the hair it is under
                    // the record (float64 subnormals): it bounds nothing, so such a moved
                    // element is divided out. Narrow values never come near.
                    let underflowed = _mm256_and_pd(
                        _mm256_cmp_pd::<_CMP_LT_OQ>(bound, tiny),
                        _mm256_cmp_pd::<_CMP_GT_OQ>(diff[h], zero),
                    );
                    beats = _mm256_or_pd(beats, underflowed);
                }
                may = _mm256_or_pd(may, beats);
            }
        }
        if _mm256_movemask_pd(may) != 0 {
            for v in (0..n).step_by(LANES) {
                let (a, b, diff) = again(v);
                // at most 2 (a difference of huge opposite values overflows); NaN stays NaN
                max_rel = each(|h| {
                    let moved = _mm256_cmp_pd::<_CMP_GT_OQ>(diff[h], zero);
                    let den = _mm256_max_pd(abs(a[h]), abs(b[h]));
                    let rel = _mm256_min_pd(two, _mm256_div_pd(diff[h], den));
                    _mm256_max_pd(_mm256_and_pd(rel, moved), max_rel[h])
                });
            }
        }
        let max = largest(&lanes(max_abs));
        // A stretch with no difference adds nothing to the judged sums and maxima (each
        // element's share is zero), only its zeros to the histogram: counted, not worked out.
        if judge.is_some() && max == 0.0 {
            unmoved += (n / LANES) as u32;
        }
        if judge.is_some() && max > 0.0 {
            for v in (0..n).step_by(LANES) {
                let (a, b, diff) = again(v);
                let mut keys = [_mm256_setzero_si256(); 2];
                // The operations of `Prepared::element`, lane for lane.
                for h in 0..2 {
                    let abs_a = abs(a[h]);
                    let den = _mm256_max_pd(abs_a, abs(b[h]));
                    let magnitude = _mm256_max_pd(den, floor);
                    let exponent = _mm256_and_si256(_mm256_castpd_si256(magnitude), exponent_bits);
                    let inverse = _mm256_castsi256_pd(_mm256_sub_epi64(
                        _mm256_castpd_si256(inverse_base),
                        exponent,
                    ));
                    let ulps = _mm256_mul_pd(diff[h], inverse);
                    sum_ulp[h] = _mm256_add_pd(sum_ulp[h], ulps);
                    max_ulp[h] = _mm256_max_pd(ulps, max_ulp[h]);
                    let allowed =
                        _mm256_add_pd(atol, _mm256_mul_pd(rtol, _mm256_min_pd(abs_a, largest_f64)));
                    let over = _mm256_cmp_pd::<_CMP_GT_OQ>(diff[h], allowed);
                    beyond = _mm256_sub_epi64(beyond, _mm256_castpd_si256(over));
                    needed[h] = _mm256_max_pd(_mm256_div_pd(diff[h], allowed), needed[h]);
                    let clamped = _mm256_min_pd(_mm256_max_pd(diff[h], lowest), highest);
                    let key = _mm256_sub_epi64(
                        _mm256_srli_epi64::<{ 52 - KEPT_BITS as i32 }>(_mm256_castpd_si256(
                            clamped,
                        )),
                        key_offset,
                    );
                    // Where the difference is zero the key is the zero slot.
                    let moved = _mm256_cmp_pd::<_CMP_GT_OQ>(diff[h], zero);
                    keys[h] = _mm256_blendv_epi8(zero_slots[h], key, _mm256_castpd_si256(moved));
                }
                // SAFETY: `filled + v + 8 <= filled + n <= BLOCK` (the chunks of one block).
                unsafe {
                    let slots = block_slots.as_mut_ptr().add(filled + v);
                    _mm_storeu_si128(slots.cast(), narrow_slots(keys));
                }
            }
        }
        if R::NARROW && T::NARROW {
            // A NaN or an infinity on either side makes its sum of squares NaN or infinite.
            for h in 0..2 {
                let sums = _mm256_add_pd(norm_r[h], norm_t[h]);
                finite &= _mm256_movemask_pd(_mm256_cmp_pd::<_CMP_LT_OQ>(sums, infinity)) == 0b1111;
            }
        }
        if !finite {
            return Outcome::NotFinite;
        }
        if judging.is_some() && max > 0.0 {
            filled += n;
        }
        let d = &d[..n];
        // Thresholds ascend: only those below the chunk's largest difference count anything
        // (the first, 0, is counted above).
        let below = THRESHOLDS.iter().take_while(|(x, _)| *x < max).count();
        macro_rules! count {
            ($($m:literal)*) => {
                match below.saturating_sub(1) {
                    $($m => count_above::<$m>(d, &mut above),)*
                    _ => {}
                }
            };
        }
        count!(1 2 3 4 5 6 7 8 9);
        if worst.is_none_or(|(w, ..)| max > w) {
            let k = first_equal(d, max);
            let at = start + from + k;
            // SAFETY: `at < start + len`.
            worst = Some((
                max,
                at as u64,
                element(R::DTYPE, r, at),
                element(T::DTYPE, t, at),
            ));
        }
        from += n;
    }
    if let Some((_, histogram)) = judging {
        count_slots(&block_slots[..filled], histogram);
        for zeros in &mut histogram[BUCKETS..BUCKETS + LANES] {
            *zeros += unmoved;
        }
    }
    above[0] = lanes_sum(moved_count);
    let sums = [sum_abs, sum_sq, dot, norm_r, norm_t].map(lanes);
    let judged = match judge {
        Some(_) => Tally {
            sum_ulp: tree(&lanes(sum_ulp)),
            max_ulp: largest(&lanes(max_ulp)),
            needed: largest(&lanes(needed)),
            beyond: lanes_sum(beyond),
        },
        None => Tally::default(),
    };
    Outcome::Done(Partial::finite(
        len,
        [&sums[0], &sums[1], &sums[2], &sums[3], &sums[4]],
        &lanes(max_rel),
        above,
        worst,
        judged,
    ))
}

/// The largest `|t - r|` over elements `start..start + len` of two tensors' bytes (a NaN on
/// either side is not compared, equal infinities differ by nothing) and the largest `|r|`: the
/// reading of [`crate::max_abs_diffs`], eight elements at a time. `None` for a dtype the kernel
/// does not read. `len` must be a multiple of [`LANES`].
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C, and both byte slices must hold `start + len` elements of
/// their dtype.
#[target_feature(enable = "avx2,f16c,fma")]
pub(super) unsafe fn largest_difference(
    r: (DType, &[u8]),
    t: (DType, &[u8]),
    start: usize,
    len: usize,
) -> Option<(f64, f64)> {
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn run<R: Load, T: Load>(
        r: &[u8],
        t: &[u8],
        start: usize,
        len: usize,
    ) -> Option<(f64, f64)> {
        debug_assert!(r.len() >= (start + len) * R::SIZE && t.len() >= (start + len) * T::SIZE);
        let sign = _mm256_set1_pd(-0.0);
        let abs = |v: __m256d| _mm256_andnot_pd(sign, v);
        let (mut most, mut widest) = ([_mm256_setzero_pd(); 2], [_mm256_setzero_pd(); 2]);
        for v in (0..len).step_by(LANES) {
            // SAFETY: `start + v + 8 <= start + len`, within both slices (the caller's promise).
            let (a, b) = unsafe {
                (
                    R::eight(r.as_ptr(), start + v),
                    T::eight(t.as_ptr(), start + v),
                )
            };
            for h in 0..2 {
                // max_pd keeps its second operand where the first is NaN: a NaN side, and
                // equal infinities (whose difference is NaN), leave the largest as it was
                most[h] = _mm256_max_pd(abs(_mm256_sub_pd(b[h], a[h])), most[h]);
                widest[h] = _mm256_max_pd(abs(a[h]), widest[h]);
            }
        }
        let top = |v: Pair| largest(&lanes(v));
        Some((top(most), top(widest)))
    }
    if !len.is_multiple_of(LANES) {
        return None;
    }
    // SAFETY: the caller guarantees the features and the lengths.
    unsafe { by_dtypes!(r.0, t.0, None, run(r.1, t.1, start, len)) }
}

/// `sum + a·b`, fused where `exact` (the product of two narrow values is exact in f64, so one
/// rounding of the sum is all either way): the same bits, fewer operations.
#[inline(always)]
fn product_sum(a: __m256d, b: __m256d, sum: __m256d, exact: bool) -> __m256d {
    // SAFETY: the caller runs with AVX2 and FMA enabled.
    unsafe {
        if exact {
            _mm256_fmadd_pd(a, b, sum)
        } else {
            _mm256_add_pd(sum, _mm256_mul_pd(a, b))
        }
    }
}
