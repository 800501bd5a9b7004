//! A pair's differences measured against rounding and a layer's bound, element by element: the
//! distance in units in the last place (ULPs) of the dtype the layer is judged in (at the larger
//! magnitude of the two values), the median
//! and 99th percentile of the difference, how many elements pass `atol + rtol·|reference|`, and
//! the smallest multiple of that bound every element would have passed (Polygraphy's "minimum
//! required tolerance", as a factor).
//!
//! Measured in the comparator's own pass ([`super::compare_judged`]), on the values it has just
//! widened. Deterministic like the comparator: sums in the same interleaved lanes, combined by
//! the same tree, blocks added in order; the percentiles come from a histogram of the
//! differences' binary exponents and leading mantissa bits, so they are exact to within
//! [`PERCENTILE_RESOLUTION`] of their value.

use serde::Serialize;

use super::LANES;
use crate::{Bound, DType};

/// Mantissa bits the percentile histogram keeps.
pub(super) const KEPT_BITS: u32 = 5;
/// How close a reported percentile is to the true one, relative to its value.
pub const PERCENTILE_RESOLUTION: f64 = 1.0 / (1u64 << KEPT_BITS) as f64;
/// The binary exponents the histogram tells apart: differences below 2^MIN_EXPONENT share its
/// first bucket after zero, those from 2^MAX_EXPONENT on its last.
const MIN_EXPONENT: i64 = -80;
const MAX_EXPONENT: i64 = 40;
const PER_OCTAVE: usize = 1 << KEPT_BITS;
/// Zero, then each octave's sub-buckets.
pub(super) const BUCKETS: usize = 1 + (MAX_EXPONENT - MIN_EXPONENT + 1) as usize * PER_OCTAVE;
/// Extra slots that count zero differences, one per lane, so that a run of equal elements
/// does not wait on one counter; folded into bucket 0 at the end.
const ZERO_SLOTS: usize = LANES;
/// The length of a histogram.
pub(super) const HISTOGRAM: usize = BUCKETS + ZERO_SLOTS;
/// The smallest difference with a bucket of its own octave, and the largest.
pub(super) const LOWEST: f64 = f64::from_bits(((MIN_EXPONENT + 1023) as u64) << 52);
pub(super) const HIGHEST: f64 = f64::from_bits((((MAX_EXPONENT + 1024) as u64) << 52) - 1);
/// What a bucket's key (a difference's bits shifted to its exponent and kept mantissa bits)
/// loses to become its index.
pub(super) const KEY_OFFSET: u64 = (((MIN_EXPONENT + 1023) as u64) << KEPT_BITS) - 1;

/// The histogram bucket of a difference `d > 0` (all of a run's arithmetic: no branches, so the
/// compiler vectorizes it).
#[inline(always)]
fn bucket(d: f64) -> u64 {
    let clamped = if d > LOWEST { d } else { LOWEST };
    let clamped = if clamped < HIGHEST { clamped } else { HIGHEST };
    (clamped.to_bits() >> (52 - KEPT_BITS)) - KEY_OFFSET
}

/// The upper edge of a bucket (0 for the zero bucket).
fn upper_edge(bucket: usize) -> f64 {
    if bucket == 0 {
        return 0.0;
    }
    let k = bucket - 1;
    let exponent = MIN_EXPONENT + (k / PER_OCTAVE) as i64;
    let sub = (k % PER_OCTAVE) as f64;
    2f64.powi(exponent as i32) * (1.0 + (sub + 1.0) / PER_OCTAVE as f64)
}

/// How a pair's differences measure against rounding and the layer's bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rounding {
    /// The dtype whose ULPs measure the differences (the lower-precision side's).
    pub grid: String,
    /// Largest difference in ULPs of `grid` at the larger magnitude of the two values.
    #[serde(serialize_with = "crate::floats::float")]
    pub max_ulp_diff: f64,
    /// Mean difference in ULPs.
    #[serde(serialize_with = "crate::floats::float")]
    pub mean_ulp_diff: f64,
    /// Median of `|target - reference|` (to within [`PERCENTILE_RESOLUTION`] above it).
    #[serde(serialize_with = "crate::floats::float")]
    pub p50_abs_diff: f64,
    /// 99th percentile of `|target - reference|`.
    #[serde(serialize_with = "crate::floats::float")]
    pub p99_abs_diff: f64,
    /// The smallest multiple of the bound that every element passes: above 1, the layer
    /// exceeds its tolerance.
    #[serde(serialize_with = "crate::floats::float")]
    pub tolerance_needed: f64,
    /// Elements beyond the bound.
    pub beyond_tolerance: u64,
}

/// What a comparison judges each element against: the steps of a dtype (the layer's
/// lower-precision side) and the layer's bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judge {
    /// The dtype whose ULPs measure the differences.
    pub grid: DType,
    /// The largest difference the layer allows at each reference value.
    pub bound: Bound,
}

/// A [`Judge`] in the form the kernel uses.
#[derive(Clone, Copy)]
pub(super) struct Prepared {
    /// The smallest magnitude whose step is not the dtype's smallest (its smallest normal),
    /// raised where needed so that every step's reciprocal is a normal f64.
    pub floor: f64,
    /// The bits of one step's reciprocal are this minus the magnitude's exponent bits.
    pub inverse_base: u64,
    /// The bound's terms.
    pub atol: f64,
    pub rtol: f64,
}

pub(super) const EXPONENT_BITS: u64 = 0x7ff << 52;

impl Judge {
    pub(super) fn prepare(self) -> Prepared {
        // Explicit mantissa bits, smallest normal exponent.
        let (mantissa, min_exponent): (i64, i64) = match self.grid {
            DType::F64 => (52, -1022),
            DType::F16 => (10, -14),
            DType::BF16 => (7, -126),
            _ => (23, -126),
        };
        let floor = min_exponent.max(mantissa - 1022);
        Prepared {
            floor: f64::from_bits(((floor + 1023) as u64) << 52),
            // A step at biased exponent E is 2^(E - 1023 - mantissa); its reciprocal's biased
            // exponent is 2046 + mantissa - E.
            inverse_base: ((2046 + mantissa) as u64) << 52,
            atol: self.bound.atol,
            rtol: self.bound.rtol,
        }
    }
}

impl Prepared {
    /// The reciprocal of one step of the grid at `magnitude` (exact: a power of two), the
    /// smallest step's below the normal range and for an infinite magnitude.
    #[inline(always)]
    fn inverse_step(&self, magnitude: f64) -> f64 {
        let m = if magnitude > self.floor && magnitude < f64::INFINITY {
            magnitude
        } else {
            self.floor
        };
        f64::from_bits(self.inverse_base - (m.to_bits() & EXPONENT_BITS))
    }

    /// One compared element, `diff = |b - a|`, into lane `lane` of `lanes`; its histogram slot.
    #[inline(always)]
    pub(super) fn element(&self, a: f64, b: f64, diff: f64, lane: usize, lanes: &mut Lanes) -> u64 {
        let (aa, bb) = (a.abs(), b.abs());
        // Steps at the larger magnitude of the two: near zero a reference's own steps are
        // vanishingly small, and a value that moved away from 0 would count astronomically.
        let ulps = diff * self.inverse_step(if aa > bb { aa } else { bb });
        lanes.sum_ulp[lane] += ulps;
        lanes.max_ulp[lane] = if ulps > lanes.max_ulp[lane] {
            ulps
        } else {
            lanes.max_ulp[lane]
        };
        // An infinite reference allows a finite amount: a difference of ∞ is always beyond.
        let allowed = self.atol + self.rtol * if aa < f64::MAX { aa } else { f64::MAX };
        lanes.beyond[lane] += u64::from(diff > allowed);
        // 0/0 (no difference, no bound) is NaN, which the comparison below passes over.
        let needed = diff / allowed;
        lanes.needed[lane] = if needed > lanes.needed[lane] {
            needed
        } else {
            lanes.needed[lane]
        };
        if diff == 0.0 {
            (BUCKETS + lane) as u64
        } else {
            bucket(diff)
        }
    }

    /// A run of finite elements (`r`, `t`, their differences `d`) that starts at a multiple of
    /// [`LANES`] in its block: element `k` goes to lane `k % LANES`, and its difference's
    /// histogram slot to `slots_out[k]` (counted once the whole block is known finite: see
    /// [`count_slots`]).
    #[inline(always)]
    pub(super) fn run(
        &self,
        r: &[f64],
        t: &[f64],
        d: &[f64],
        lanes_out: &mut Lanes,
        slots_out: &mut [u16],
    ) {
        let mut slots = [0u64; super::SUB];
        // A local copy the compiler keeps in registers.
        let mut local = *lanes_out;
        let lanes = &mut local;
        let n = r.len().min(super::SUB);
        let full = n - n % LANES;
        for (((sc, rc), tc), dc) in slots[..full]
            .chunks_exact_mut(LANES)
            .zip(r.chunks_exact(LANES))
            .zip(t.chunks_exact(LANES))
            .zip(d.chunks_exact(LANES))
        {
            for j in 0..LANES {
                sc[j] = self.element(rc[j], tc[j], dc[j], j, lanes);
            }
        }
        for k in full..n {
            slots[k] = self.element(r[k], t[k], d[k], k - full, lanes);
        }
        for (out, &slot) in slots_out.iter_mut().zip(&slots[..n]) {
            *out = slot as u16;
        }
        *lanes_out = local;
    }
}

/// Counts a block's histogram slots. A fast kernel holds them until it has seen the whole block
/// finite: counted per stretch, a NaN in a later stretch would send the block to the exact path
/// with its earlier stretches counted already, and counted again there.
pub(super) fn count_slots(slots: &[u16], histogram: &mut [u32]) {
    let histogram: &mut [u32; HISTOGRAM] = histogram
        .try_into()
        .expect("a histogram holds HISTOGRAM slots");
    for &slot in slots {
        // every slot a kernel makes is a bucket (below BUCKETS) or a zero slot (below
        // HISTOGRAM): the index is checked once per block, not once per element
        debug_assert!(usize::from(slot) < HISTOGRAM);
        // SAFETY: as above; a kernel's keys are clamped into the buckets' range.
        unsafe { *histogram.get_unchecked_mut(usize::from(slot)) += 1 };
    }
}

const _: () = assert!(HISTOGRAM <= u16::MAX as usize, "a slot fits in 16 bits");

/// A block's judged elements, lane by lane.
#[derive(Clone, Copy, Default)]
pub(super) struct Lanes {
    sum_ulp: [f64; LANES],
    max_ulp: [f64; LANES],
    needed: [f64; LANES],
    beyond: [u64; LANES],
}

/// A block's judged elements, lanes combined.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub(super) struct Tally {
    pub sum_ulp: f64,
    pub max_ulp: f64,
    pub needed: f64,
    pub beyond: u64,
}

impl Lanes {
    pub(super) fn tally(&self) -> Tally {
        let max = |l: &[f64; LANES]| l.iter().fold(0.0f64, |m, &v| if v > m { v } else { m });
        Tally {
            sum_ulp: super::tree(&self.sum_ulp),
            max_ulp: max(&self.max_ulp),
            needed: max(&self.needed),
            beyond: self.beyond.iter().sum(),
        }
    }
}

impl Tally {
    /// Folds a later block into this one (callers go in block order).
    pub(super) fn merge(&mut self, o: &Tally) {
        self.sum_ulp += o.sum_ulp;
        self.max_ulp = self.max_ulp.max(o.max_ulp);
        self.needed = self.needed.max(o.needed);
        self.beyond += o.beyond;
    }

    /// The rounding of `compared` elements judged on `grid`, whose largest difference is
    /// `max_abs`, with their differences counted in `histogram`.
    pub(super) fn rounding(
        &self,
        grid: DType,
        compared: u64,
        max_abs: f64,
        histogram: &[u64],
    ) -> Rounding {
        let zeros: u64 = histogram[BUCKETS..].iter().sum();
        // A bucket's upper edge, but never above the largest difference.
        let percentile = |q: f64| percentile(histogram, zeros, compared, q).min(max_abs);
        Rounding {
            grid: grid.name().to_string(),
            max_ulp_diff: self.max_ulp,
            mean_ulp_diff: if compared == 0 {
                0.0
            } else {
                self.sum_ulp / compared as f64
            },
            p50_abs_diff: percentile(0.5),
            p99_abs_diff: percentile(0.99),
            tolerance_needed: self.needed,
            beyond_tolerance: self.beyond,
        }
    }
}

/// The `q` quantile of the differences counted in `histogram` (`compared` in all, `zeros` of
/// them in its zero slots): the upper edge of the bucket that holds it.
fn percentile(histogram: &[u64], zeros: u64, compared: u64, q: f64) -> f64 {
    if compared == 0 {
        return 0.0;
    }
    let rank = ((q * compared as f64).ceil() as u64).clamp(1, compared);
    let mut seen = zeros;
    for (key, &count) in histogram[..BUCKETS].iter().enumerate() {
        seen += count;
        if seen >= rank {
            return upper_edge(key);
        }
    }
    f64::INFINITY
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Tensor, compare_judged};

    fn f32s(values: &[f32]) -> Tensor {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new("x", DType::F32, vec![values.len()], bytes).unwrap()
    }

    fn rounding(r: &Tensor, t: &Tensor, grid: DType, bound: Bound) -> Rounding {
        compare_judged(r.view(), t.view(), Some(Judge { grid, bound }))
            .unwrap()
            .rounding
            .expect("judged")
    }

    /// One step of `grid` at `magnitude`.
    fn step(grid: DType, magnitude: f64) -> f64 {
        let judge = Judge {
            grid,
            bound: Bound::absolute(0.0),
        };
        1.0 / judge.prepare().inverse_step(magnitude)
    }

    #[test]
    fn ulps_are_counted_at_each_value_s_own_magnitude() {
        assert_eq!(step(DType::F16, 300.0), 0.25);
        assert_eq!(step(DType::F16, 1.0), 2f64.powi(-10));
        assert_eq!(step(DType::F16, 0.0), 2f64.powi(-24));
        assert_eq!(step(DType::F16, f64::INFINITY), 2f64.powi(-24));
        assert_eq!(step(DType::F32, 1.5), 2f64.powi(-23));
        assert_eq!(step(DType::F32, 1e-45), 2f64.powi(-149));
        assert_eq!(step(DType::BF16, 3.0), 2f64.powi(-6));
        assert_eq!(step(DType::F64, 1e300), 2f64.powi(996 - 52));
        assert_eq!(step(DType::F64, 0.0), 2f64.powi(-1022));
        for d in [1e-30, 3e-7, 0.25, 0.26, 7.0, 1e11, 1e30] {
            let b = bucket(d) as usize;
            let edge = upper_edge(b);
            assert!((1..BUCKETS).contains(&b), "{d}");
            if (2f64.powi(MIN_EXPONENT as i32)..2f64.powi(MAX_EXPONENT as i32 + 1)).contains(&d) {
                assert!(
                    edge >= d && edge <= d * (1.0 + PERCENTILE_RESOLUTION),
                    "{d}"
                );
            }
        }
        assert_eq!(bucket(1e-30), 1, "below the range: the first bucket");
        assert_eq!(bucket(1e30) as usize, BUCKETS - 1, "above it: the last");
        let r = f32s(&[300.0, 1.0, -2.0, 0.5]);
        let t = f32s(&[300.25, 1.0, -2.0, 0.5]);
        let bound = crate::default_for(DType::F16);
        let out = rounding(&r, &t, DType::F16, bound);
        assert_eq!(out.max_ulp_diff, 1.0);
        assert_eq!(out.mean_ulp_diff, 0.25);
        assert_eq!(out.beyond_tolerance, 0, "one step at 300 passes");
        assert!(out.tolerance_needed > 0.8 && out.tolerance_needed < 1.0);
        assert_eq!(out.p50_abs_diff, 0.0, "three of four agree");
        assert_eq!(out.p99_abs_diff, 0.25);
    }

    #[test]
    fn the_bound_is_judged_per_element_and_the_needed_factor_says_by_how_much() {
        let r = f32s(&[1e-2, 300.0]);
        let t = f32s(&[1e-2 + 1e-3, 300.0]);
        let bound = crate::default_for(DType::F16);
        let out = rounding(&r, &t, DType::F16, bound);
        assert_eq!(
            out.beyond_tolerance, 1,
            "1e-3 on a value near 1e-2 is a finding"
        );
        let expected = 1e-3 / bound.at(1e-2);
        assert!((out.tolerance_needed - expected).abs() < 1e-3 * expected);
    }

    #[test]
    fn non_finite_values_are_judged_as_the_comparator_counts_them() {
        let r = f32s(&[f32::NAN, f32::INFINITY, f32::INFINITY, 1.0]);
        let t = f32s(&[1.0, f32::INFINITY, 1.0, 1.0]);
        let out = rounding(&r, &t, DType::F32, Bound::absolute(1e-3));
        assert_eq!(
            out.beyond_tolerance, 1,
            "NaN is not compared; ∞ vs 1 is beyond"
        );
        assert_eq!(out.max_ulp_diff, f64::INFINITY);
        assert_eq!(out.p50_abs_diff, 0.0, "two of the three compared agree");
    }

    #[test]
    fn percentiles_are_within_their_resolution_and_do_not_depend_on_threads() {
        let n = 3 * super::super::BLOCK + 17;
        let r: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let t: Vec<f32> = (0..n).map(|i| i as f32 + (i % 100) as f32 * 1e-3).collect();
        let (r, t) = (f32s(&r), f32s(&t));
        let out = rounding(&r, &t, DType::F32, Bound::absolute(1.0));
        let close = |got: f64, want: f64| (got - want).abs() <= want * PERCENTILE_RESOLUTION * 1.01;
        assert!(close(out.p50_abs_diff, 0.049), "{}", out.p50_abs_diff);
        assert!(close(out.p99_abs_diff, 0.098), "{}", out.p99_abs_diff);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let again = one.install(|| rounding(&r, &t, DType::F32, Bound::absolute(1.0)));
        assert_eq!(out, again);
    }
}
