//! The finite fast path in explicit AVX-512. One `__m512d` holds exactly the [`LANES`] f64
//! accumulators of a block, so vector lane `j` sums elements `k ≡ j (mod LANES)` in the order the
//! scalar path does: the same operations, the same bits (a multiply-add is fused only where the
//! product is exact: two narrow values). The quotients' cap at 2 is taken once per block, on
//! their maximum: the same result in fewer operations. Elements are
//! read straight from the tensors' bytes and widened in registers (float16 by F16C, bfloat16 by
//! a shift), never staged through a buffer. A chunk's differences are then counted against the
//! thresholds below its largest, in integer arithmetic (see `count_above`): every vector
//! operation counts here, and the loop is bound by them in cache; from memory, the reads are
//! prefetched [`AHEAD`] so that they overlap the operations.

use std::arch::x86_64::*;

use super::reader::{BF16, F16, F32, F64, Reader};
use super::rounding::{
    BUCKETS, EXPONENT_BITS, HIGHEST, KEPT_BITS, KEY_OFFSET, LOWEST, Prepared, Tally, count_slots,
};
use super::{BLOCK, Judging, LANES, Outcome, Partial, SUB, THRESHOLDS, element, tree};
use crate::DType;

/// How this kernel (and the baseline's lanes) loads a dtype: eight elements at a time, widened
/// into the f64 lanes of one AVX-512 vector.
pub(crate) trait Load: Reader {
    /// Elements `k..k + 8` of `base`, widened.
    unsafe fn eight(base: *const u8, k: usize) -> __m512d;
}

impl Load for F32 {
    #[inline(always)]
    unsafe fn eight(base: *const u8, k: usize) -> __m512d {
        unsafe { _mm512_cvtps_pd(_mm256_loadu_ps(base.add(4 * k).cast())) }
    }
}

impl Load for F16 {
    #[inline(always)]
    unsafe fn eight(base: *const u8, k: usize) -> __m512d {
        unsafe { _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128(base.add(2 * k).cast()))) }
    }
}

impl Load for BF16 {
    #[inline(always)]
    unsafe fn eight(base: *const u8, k: usize) -> __m512d {
        unsafe {
            let words = _mm256_cvtepu16_epi32(_mm_loadu_si128(base.add(2 * k).cast()));
            _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(words)))
        }
    }
}

impl Load for F64 {
    #[inline(always)]
    unsafe fn eight(base: *const u8, k: usize) -> __m512d {
        unsafe { _mm512_loadu_pd(base.add(8 * k).cast()) }
    }
}

/// How far ahead of the pass its reads are prefetched, in elements: two threads reading
/// float32 arrays from memory compared at 88–92% of the read bandwidth without it, 92–96% with
/// it (512 or 2048 ahead did no better than none; measured on a 2-core AMD EPYC VM).
const AHEAD: usize = 8 * SUB;

// The kernel counts the first threshold from the mask of moved values.
const _: () = assert!(THRESHOLDS[0].0 == 0.0);

/// Elements `start..start + len` of two tensors' bytes, judged when `judging` says so. `len`
/// must be a multiple of [`LANES`].
///
/// # Safety
/// The CPU must have AVX-512F/DQ, F16C and POPCNT, and both byte slices must hold `start + len`
/// elements of their dtype.
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,f16c,popcnt")]
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
fn lanes(v: __m512d) -> [f64; LANES] {
    let mut out = [0.0f64; LANES];
    // SAFETY: `out` holds eight f64.
    unsafe { _mm512_storeu_pd(out.as_mut_ptr(), v) };
    out
}

#[inline(always)]
fn largest(l: &[f64; LANES]) -> f64 {
    l.iter().fold(0.0f64, |m, &v| if v > m { v } else { m })
}

#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,f16c,popcnt")]
unsafe fn block<R: Load, T: Load>(
    r: &[u8],
    t: &[u8],
    start: usize,
    len: usize,
    judging: Judging<'_>,
) -> Outcome {
    debug_assert!(r.len() >= (start + len) * R::SIZE && t.len() >= (start + len) * T::SIZE);
    let (rp, tp) = (r.as_ptr(), t.as_ptr());
    let mut judged = judging.map(|(judge, histogram)| (Judged::new(judge), histogram));
    let mut d = [0.0f64; SUB];
    let zero = _mm512_setzero_pd();
    let infinity = _mm512_set1_pd(f64::INFINITY);
    let two = _mm512_set1_pd(2.0);
    let (mut sum_abs, mut sum_sq, mut dot, mut norm_r, mut norm_t, mut max_rel) =
        (zero, zero, zero, zero, zero, zero);
    let mut above = [0u64; THRESHOLDS.len()];
    // Lane counts of the thresholds after the first, added up once the block is done.
    let mut over = [_mm512_setzero_si512(); THRESHOLDS.len() - 1];
    let mut worst: Option<(f64, u64, f64, f64)> = None;
    let mut from = 0;
    while from < len {
        let n = SUB.min(len - from);
        let mut max_abs = zero;
        let mut finite: __mmask8 = 0xff;
        for v in (0..n).step_by(LANES) {
            let k = start + from + v;
            // SAFETY: `k + 8 <= start + len`, within both slices (the caller's promise). A
            // prefetch is a hint and never faults, wherever it points.
            let (a, b) = unsafe {
                _mm_prefetch::<_MM_HINT_T0>(rp.wrapping_add((k + AHEAD) * R::SIZE).cast());
                _mm_prefetch::<_MM_HINT_T0>(tp.wrapping_add((k + AHEAD) * T::SIZE).cast());
                (R::eight(rp, k), T::eight(tp, k))
            };
            let diff = _mm512_abs_pd(_mm512_sub_pd(b, a));
            // SAFETY: `v + 8 <= n <= SUB`.
            unsafe { _mm512_storeu_pd(d.as_mut_ptr().add(v), diff) };
            sum_abs = _mm512_add_pd(sum_abs, diff);
            sum_sq = _mm512_add_pd(sum_sq, _mm512_mul_pd(diff, diff));
            dot = product_sum(a, b, dot, R::NARROW && T::NARROW);
            norm_r = product_sum(a, a, norm_r, R::NARROW);
            norm_t = product_sum(b, b, norm_t, T::NARROW);
            max_abs = _mm512_max_pd(diff, max_abs);
            if !(R::NARROW && T::NARROW) {
                let (abs_a, abs_b) = (_mm512_abs_pd(a), _mm512_abs_pd(b));
                finite &= _mm512_cmp_pd_mask::<_CMP_LT_OQ>(abs_a, infinity)
                    & _mm512_cmp_pd_mask::<_CMP_LT_OQ>(abs_b, infinity);
            }
            let moved = _mm512_cmp_pd_mask::<_CMP_GT_OQ>(diff, zero);
            above[0] += u64::from(moved.count_ones()); // the first threshold is 0
            // max(|a|, |b|) in one operation: imm 0b1011 picks the larger magnitude, sign cleared
            let den = _mm512_range_pd::<0b1011>(a, b);
            let rel = _mm512_maskz_div_pd(moved, diff, den);
            max_rel = _mm512_max_pd(rel, max_rel);
        }
        if R::NARROW && T::NARROW {
            // A NaN or an infinity on either side makes its sum of squares NaN or infinite.
            finite = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(_mm512_add_pd(norm_r, norm_t), infinity);
        }
        if finite != 0xff {
            return Outcome::NotFinite;
        }
        let max = _mm512_reduce_max_pd(max_abs);
        let d = &d[..n];
        if let Some((judged, _)) = judged.as_mut() {
            // SAFETY: elements `start + from..start + from + n` are within both slices.
            unsafe { judged.chunk::<R, T>(rp, tp, start + from, d, max) };
        }
        // Thresholds ascend: only those below the chunk's largest difference count anything
        // (the first, 0, is counted above).
        let below = THRESHOLDS.iter().take_while(|(x, _)| *x < max).count();
        macro_rules! count {
            ($($m:literal)*) => {
                match below.saturating_sub(1) {
                    $($m => count_above::<$m>(d, &mut over),)*
                    _ => {}
                }
            };
        }
        count!(1 2 3 4 5 6 7 8 9);
        if worst.is_none_or(|(w, ..)| max > w) {
            let k = first_of(d, max);
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
    for (above, over) in above[1..].iter_mut().zip(over) {
        *above = _mm512_reduce_add_epi64(over) as u64;
    }
    let sums = [sum_abs, sum_sq, dot, norm_r, norm_t].map(lanes);
    Outcome::Done(Partial::finite(
        len,
        [&sums[0], &sums[1], &sums[2], &sums[3], &sums[4]],
        // at most 2 (a difference of huge opposite values overflows to infinity)
        &lanes(_mm512_min_pd(two, max_rel)),
        above,
        worst,
        judged.map_or_else(Tally::default, |(judged, histogram)| {
            judged.finish(histogram)
        }),
    ))
}

/// The largest `|t - r|` over elements `start..start + len` of two tensors' bytes (a NaN on
/// either side is not compared, equal infinities differ by nothing) and the largest `|r|`: the
/// AVX2 kernel's reading, eight elements to a vector. `None` for a dtype the kernel does not
/// read, or a `len` that is not a multiple of [`LANES`].
///
/// # Safety
/// The CPU must have AVX-512F/DQ and F16C, and both byte slices must hold `start + len` elements
/// of their dtype.
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,f16c,popcnt")]
pub(super) unsafe fn largest_difference(
    r: (DType, &[u8]),
    t: (DType, &[u8]),
    start: usize,
    len: usize,
) -> Option<(f64, f64)> {
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,f16c,popcnt")]
    unsafe fn run<R: Load, T: Load>(
        r: &[u8],
        t: &[u8],
        start: usize,
        len: usize,
    ) -> Option<(f64, f64)> {
        debug_assert!(r.len() >= (start + len) * R::SIZE && t.len() >= (start + len) * T::SIZE);
        let (mut most, mut widest) = (_mm512_setzero_pd(), _mm512_setzero_pd());
        for v in (0..len).step_by(LANES) {
            // SAFETY: `start + v + 8 <= start + len`, within both slices (the caller's promise).
            let (a, b) = unsafe {
                (
                    R::eight(r.as_ptr(), start + v),
                    T::eight(t.as_ptr(), start + v),
                )
            };
            // max_pd keeps its second operand where the first is NaN: a NaN side, and equal
            // infinities (whose difference is NaN), leave the largest as it was
            most = _mm512_max_pd(_mm512_abs_pd(_mm512_sub_pd(b, a)), most);
            widest = _mm512_max_pd(_mm512_abs_pd(a), widest);
        }
        Some((largest(&lanes(most)), largest(&lanes(widest))))
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
fn product_sum(a: __m512d, b: __m512d, sum: __m512d, exact: bool) -> __m512d {
    // SAFETY: the caller runs with AVX-512F enabled.
    unsafe {
        if exact {
            _mm512_fmadd_pd(a, b, sum)
        } else {
            _mm512_add_pd(sum, _mm512_mul_pd(a, b))
        }
    }
}

/// Adds to `over[j]`, lane by lane, how many of `d` exceed threshold `j + 1`, for the first `M`
/// thresholds after 0. A difference is finite and not negative, so its bits order as integers do:
/// `bits(x) − bits(d)` is negative, its top bit set, exactly where `d > x`. Integer arithmetic
/// only: no comparison's mask crosses to the scalar side (which costs more here than the
/// three operations).
#[inline(always)]
fn count_above<const M: usize>(d: &[f64], over: &mut [__m512i; THRESHOLDS.len() - 1]) {
    // SAFETY (whole function): the caller runs with AVX-512F enabled; `d.len()` is a multiple
    // of eight, so every load stays inside `d`.
    unsafe {
        let x: [__m512i; M] =
            std::array::from_fn(|j| _mm512_set1_epi64(THRESHOLDS[j + 1].0.to_bits() as i64));
        let mut counts: [__m512i; M] = std::array::from_fn(|j| over[j]);
        for v in (0..d.len()).step_by(LANES) {
            let bits = _mm512_castpd_si512(_mm512_loadu_pd(d.as_ptr().add(v)));
            for j in 0..M {
                let exceeds = _mm512_srli_epi64::<63>(_mm512_sub_epi64(x[j], bits));
                counts[j] = _mm512_add_epi64(counts[j], exceeds);
            }
        }
        over[..M].copy_from_slice(&counts);
    }
}

/// The first index of `value` in `d` (0 if it is not there), eight at a time.
#[inline(always)]
fn first_of(d: &[f64], value: f64) -> usize {
    // SAFETY: the caller runs with AVX-512F enabled; `d.len()` is a multiple of eight, so every
    // load stays inside `d`.
    unsafe {
        let wanted = _mm512_set1_pd(value);
        for v in (0..d.len()).step_by(LANES) {
            let at = _mm512_loadu_pd(d.as_ptr().add(v));
            let equal = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(at, wanted);
            if equal != 0 {
                return v + equal.trailing_zeros() as usize;
            }
        }
    }
    0
}

/// A judged block: the judge's constants, and the operations of `Prepared::element` lane for
/// lane, the histogram slots held until the whole block is seen finite.
struct Judged {
    floor: __m512d,
    inverse_base: __m512i,
    atol: __m512d,
    rtol: __m512d,
    sum_ulp: __m512d,
    max_ulp: __m512d,
    needed: __m512d,
    beyond: u64,
    slots: [u16; BLOCK],
    /// How many of `slots` are filled: a stretch with no difference fills none, its elements
    /// counted in each lane's zero slot (`unmoved`).
    filled: usize,
    unmoved: u32,
}

impl Judged {
    #[inline(always)]
    fn new(judge: &Prepared) -> Judged {
        // SAFETY (whole function): the caller runs with AVX-512F enabled.
        unsafe {
            Judged {
                floor: _mm512_set1_pd(judge.floor),
                inverse_base: _mm512_set1_epi64(judge.inverse_base as i64),
                atol: _mm512_set1_pd(judge.atol),
                rtol: _mm512_set1_pd(judge.rtol),
                sum_ulp: _mm512_setzero_pd(),
                max_ulp: _mm512_setzero_pd(),
                needed: _mm512_setzero_pd(),
                beyond: 0,
                slots: [0; BLOCK],
                filled: 0,
                unmoved: 0,
            }
        }
    }

    /// The chunk of elements `k0..k0 + d.len()` whose differences are `d` and largest `max`.
    ///
    /// # Safety
    /// Both pointers must hold `k0 + d.len()` elements of their dtype; AVX-512F and DQ enabled.
    #[inline(always)]
    unsafe fn chunk<R: Load, T: Load>(
        &mut self,
        rp: *const u8,
        tp: *const u8,
        k0: usize,
        d: &[f64],
        max: f64,
    ) {
        // A stretch with no difference adds nothing to the judged sums and maxima (each
        // element's share is zero), only its zeros to the histogram: counted, not worked out.
        if max == 0.0 {
            self.unmoved += (d.len() / LANES) as u32;
            return;
        }
        // SAFETY (the rest): the caller's promise; `filled + d.len() <= BLOCK` (the chunks of
        // one block).
        unsafe {
            let exponent_bits = _mm512_set1_epi64(EXPONENT_BITS as i64);
            let (lowest, highest) = (_mm512_set1_pd(LOWEST), _mm512_set1_pd(HIGHEST));
            let largest_f64 = _mm512_set1_pd(f64::MAX);
            let key_offset = _mm512_set1_epi64(KEY_OFFSET as i64);
            let zero_slots = _mm512_add_epi64(
                _mm512_set1_epi64(BUCKETS as i64),
                _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7),
            );
            // The sums and constants held in locals, in registers: read and written through
            // `self`, whose slots the loop stores to, they went through memory, each chunk of
            // eight waiting on the last one's store (1.06 → 1.13 G elements/s judged, here).
            let (mut sum_ulp, mut max_ulp, mut needed, mut beyond) =
                (self.sum_ulp, self.max_ulp, self.needed, self.beyond);
            let (floor, inverse_base, atol, rtol) =
                (self.floor, self.inverse_base, self.atol, self.rtol);
            let slots = self.slots.as_mut_ptr().add(self.filled);
            for v in (0..d.len()).step_by(LANES) {
                let (a, b) = (R::eight(rp, k0 + v), T::eight(tp, k0 + v));
                let diff = _mm512_loadu_pd(d.as_ptr().add(v));
                let abs_a = _mm512_abs_pd(a);
                let den = _mm512_max_pd(abs_a, _mm512_abs_pd(b));
                let magnitude = _mm512_max_pd(den, floor);
                let exponent = _mm512_and_si512(_mm512_castpd_si512(magnitude), exponent_bits);
                let inverse = _mm512_castsi512_pd(_mm512_sub_epi64(inverse_base, exponent));
                let ulps = _mm512_mul_pd(diff, inverse);
                sum_ulp = _mm512_add_pd(sum_ulp, ulps);
                max_ulp = _mm512_max_pd(ulps, max_ulp);
                let capped = _mm512_min_pd(abs_a, largest_f64);
                let allowed = _mm512_add_pd(atol, _mm512_mul_pd(rtol, capped));
                let over = _mm512_cmp_pd_mask::<_CMP_GT_OQ>(diff, allowed);
                beyond += u64::from(over.count_ones());
                needed = _mm512_max_pd(_mm512_div_pd(diff, allowed), needed);
                let clamped = _mm512_min_pd(_mm512_max_pd(diff, lowest), highest);
                let key = _mm512_sub_epi64(
                    _mm512_srli_epi64::<{ 52 - KEPT_BITS }>(_mm512_castpd_si512(clamped)),
                    key_offset,
                );
                // Where the difference is zero the key is the zero slot.
                let moved = _mm512_cmp_pd_mask::<_CMP_GT_OQ>(diff, _mm512_setzero_pd());
                let keys = _mm512_mask_blend_epi64(moved, zero_slots, key);
                _mm_storeu_si128(slots.add(v).cast(), _mm512_cvtepi64_epi16(keys));
            }
            (self.sum_ulp, self.max_ulp, self.needed, self.beyond) =
                (sum_ulp, max_ulp, needed, beyond);
        }
        self.filled += d.len();
    }

    /// The block's judged sums; its slots counted in `histogram`.
    #[inline(always)]
    fn finish(&self, histogram: &mut [u32]) -> Tally {
        count_slots(&self.slots[..self.filled], histogram);
        for zeros in &mut histogram[BUCKETS..BUCKETS + LANES] {
            *zeros += self.unmoved;
        }
        Tally {
            sum_ulp: tree(&lanes(self.sum_ulp)),
            max_ulp: largest(&lanes(self.max_ulp)),
            needed: largest(&lanes(self.needed)),
            beyond: self.beyond,
        }
    }
}
