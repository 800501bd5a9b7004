//! A pair's differences measured against rounding and a layer's bound, element by element: the
//! distance in units in the last place (ULPs) of the dtype the layer is judged in (at the larger
//! magnitude of the two values), the median
//! and 99th percentile of the difference, how many elements pass `atol + rtol·|reference|`, and
//! the smallest multiple of that bound every element would have passed (Polygraphy's "minimum
//! required tolerance", as a factor).
//!
//! A second pass over the values, run while they are held. Deterministic like the comparator:
//! sums per fixed block, blocks added in order; the percentiles come from a histogram of the
//! differences' binary exponents and leading mantissa bits, so they are exact to within
//! [`PERCENTILE_RESOLUTION`] of their value.

use rayon::prelude::*;
use serde::Serialize;

use super::{BLOCK, decode};
use crate::{Bound, DType, TensorView};

/// Mantissa bits the percentile histogram keeps.
const KEPT_BITS: u32 = 5;
/// How close a reported percentile is to the true one, relative to its value.
pub const PERCENTILE_RESOLUTION: f64 = 1.0 / (1u64 << KEPT_BITS) as f64;
/// The binary exponents the histogram tells apart: differences below 2^MIN_EXPONENT share its
/// first bucket after zero, those from 2^MAX_EXPONENT on its last.
const MIN_EXPONENT: i64 = -80;
const MAX_EXPONENT: i64 = 40;
const PER_OCTAVE: usize = 1 << KEPT_BITS;
/// Zero, then each octave's sub-buckets.
const BUCKETS: usize = 1 + (MAX_EXPONENT - MIN_EXPONENT + 1) as usize * PER_OCTAVE;

/// The histogram bucket of a difference `d ≥ 0`.
fn bucket(d: f64) -> usize {
    if d == 0.0 {
        return 0;
    }
    let bits = d.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as i64 - 1023;
    if exponent < MIN_EXPONENT {
        return 1;
    }
    if exponent > MAX_EXPONENT {
        return BUCKETS - 1;
    }
    let sub = ((bits >> (52 - KEPT_BITS)) as usize) & (PER_OCTAVE - 1);
    1 + (exponent - MIN_EXPONENT) as usize * PER_OCTAVE + sub
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
    #[serde(serialize_with = "crate::render::float")]
    pub max_ulp_diff: f64,
    /// Mean difference in ULPs.
    #[serde(serialize_with = "crate::render::float")]
    pub mean_ulp_diff: f64,
    /// Median of `|target - reference|` (to within [`PERCENTILE_RESOLUTION`] above it).
    #[serde(serialize_with = "crate::render::float")]
    pub p50_abs_diff: f64,
    /// 99th percentile of `|target - reference|`.
    #[serde(serialize_with = "crate::render::float")]
    pub p99_abs_diff: f64,
    /// The smallest multiple of the bound that every element passes: above 1, the layer
    /// exceeds its tolerance.
    #[serde(serialize_with = "crate::render::float")]
    pub tolerance_needed: f64,
    /// Elements beyond the bound.
    pub beyond_tolerance: u64,
}

/// One block's share.
struct Part {
    compared: u64,
    max_abs: f64,
    sum_ulp: f64,
    max_ulp: f64,
    needed: f64,
    beyond: u64,
}

/// Measures `target` against `reference` (the same element count) in ULPs of `grid` and against
/// `bound`.
pub fn rounding(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    grid: DType,
    bound: Bound,
) -> Rounding {
    let n = reference.numel().min(target.numel());
    let spacing = Spacing::of(grid);
    let blocks = n.div_ceil(BLOCK);
    let (mut parts, histograms): (Vec<(usize, Part)>, Vec<Vec<u32>>) = (0..blocks)
        .into_par_iter()
        .with_min_len(16)
        .fold(
            || (Vec::new(), vec![0u32; BUCKETS]),
            |(mut parts, mut histogram), b| {
                parts.push((
                    b,
                    block(reference, target, b, n, spacing, bound, &mut histogram),
                ));
                (parts, histogram)
            },
        )
        .map(|(parts, histogram)| (parts, vec![histogram]))
        .reduce(
            || (Vec::new(), Vec::new()),
            |(mut a, mut ha), (b, hb)| {
                a.extend(b);
                ha.extend(hb);
                (a, ha)
            },
        );
    // Sums added in block order, whichever thread computed each block.
    parts.sort_by_key(|(b, _)| *b);
    let (mut compared, mut sum_ulp, mut max_ulp, mut needed, mut beyond) = (0, 0.0, 0.0, 0.0, 0);
    let mut max_abs = 0.0;
    for (_, p) in &parts {
        compared += p.compared;
        max_abs = f64::max(max_abs, p.max_abs);
        sum_ulp += p.sum_ulp;
        max_ulp = f64::max(max_ulp, p.max_ulp);
        needed = f64::max(needed, p.needed);
        beyond += p.beyond;
    }
    let mut histogram = vec![0u64; BUCKETS];
    for h in &histograms {
        for (total, &count) in histogram.iter_mut().zip(h) {
            *total += u64::from(count);
        }
    }
    // A bucket's upper edge, but never above the largest difference.
    let percentile = |q: f64| percentile(&histogram, compared, q).min(max_abs);
    Rounding {
        grid: grid.name().to_string(),
        max_ulp_diff: max_ulp,
        mean_ulp_diff: if compared == 0 {
            0.0
        } else {
            sum_ulp / compared as f64
        },
        p50_abs_diff: percentile(0.5),
        p99_abs_diff: percentile(0.99),
        tolerance_needed: needed,
        beyond_tolerance: beyond,
    }
}

/// One block: its share of the sums, and its differences counted into `histogram`.
#[allow(clippy::too_many_arguments)]
fn block(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    b: usize,
    n: usize,
    spacing: Spacing,
    bound: Bound,
    histogram: &mut [u32],
) -> Part {
    let start = b * BLOCK;
    let len = BLOCK.min(n - start);
    // On the stack: a block is small, and this runs once per block of every pair.
    let (mut r, mut t) = ([0.0f64; BLOCK], [0.0f64; BLOCK]);
    let (r, t) = (&mut r[..len], &mut t[..len]);
    let (rs, ts) = (reference.dtype.size(), target.dtype.size());
    decode(
        reference.dtype,
        &reference.bytes[start * rs..(start + len) * rs],
        r,
    );
    decode(
        target.dtype,
        &target.bytes[start * ts..(start + len) * ts],
        t,
    );
    let mut part = Part {
        compared: 0,
        max_abs: 0.0,
        sum_ulp: 0.0,
        max_ulp: 0.0,
        needed: 0.0,
        beyond: 0,
    };
    for (&r, &t) in r.iter().zip(t.iter()) {
        if r.is_nan() || t.is_nan() {
            continue;
        }
        let d = if r == t { 0.0 } else { (t - r).abs() };
        part.compared += 1;
        part.max_abs = part.max_abs.max(d);
        // Steps at the larger magnitude of the two: near zero a reference's own steps are
        // vanishingly small, and a value that moved away from 0 would count astronomically.
        let ulps = d * spacing.inverse_at(r.abs().max(t.abs()));
        part.sum_ulp += ulps;
        part.max_ulp = part.max_ulp.max(ulps);
        let allowed = bound.at(r.abs());
        if d > allowed {
            part.beyond += 1;
        }
        let needed = if d == 0.0 { 0.0 } else { d / allowed };
        part.needed = part.needed.max(needed);
        histogram[bucket(d)] += 1;
    }
    part
}

/// The `q` quantile of the differences counted in `histogram` (`compared` in all): the upper
/// edge of the bucket that holds it.
fn percentile(histogram: &[u64], compared: u64, q: f64) -> f64 {
    if compared == 0 {
        return 0.0;
    }
    let rank = ((q * compared as f64).ceil() as u64).clamp(1, compared);
    let mut seen = 0;
    for (key, &count) in histogram.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return upper_edge(key);
        }
    }
    f64::INFINITY
}

/// The spacing of a floating-point dtype's values: one ULP at a magnitude.
#[derive(Clone, Copy)]
struct Spacing {
    /// Explicit mantissa bits.
    mantissa: i32,
    /// The smallest normal exponent.
    min_exponent: i32,
}

impl Spacing {
    fn of(dtype: DType) -> Self {
        let (mantissa, min_exponent) = match dtype {
            DType::F64 => (52, -1022),
            DType::F16 => (10, -14),
            DType::BF16 => (7, -126),
            _ => (23, -126),
        };
        Self {
            mantissa,
            min_exponent,
        }
    }

    /// One ULP of the dtype at `magnitude` (the subnormal spacing below the normal range).
    #[cfg(test)]
    fn at(self, magnitude: f64) -> f64 {
        f64::from_bits(((self.exponent_at(magnitude) + 1023) as u64) << 52)
    }

    /// The reciprocal of [`Spacing::at`], exact (a power of two): dividing by a step is
    /// multiplying by this.
    #[inline]
    fn inverse_at(self, magnitude: f64) -> f64 {
        f64::from_bits(((1023 - self.exponent_at(magnitude)) as u64) << 52)
    }

    /// The binary exponent of one ULP at `magnitude`.
    #[inline]
    fn exponent_at(self, magnitude: f64) -> i32 {
        let exponent = if magnitude > 0.0 && magnitude.is_finite() {
            ((magnitude.to_bits() >> 52) & 0x7ff) as i32 - 1023
        } else {
            self.min_exponent
        };
        // Every dtype's smallest step (float64's 2^-1074 aside) is a normal f64, and so is its
        // reciprocal.
        (exponent.max(self.min_exponent) - self.mantissa).max(-1022)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    fn f32s(values: &[f32]) -> Tensor {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new("x", DType::F32, vec![values.len()], bytes).unwrap()
    }

    #[test]
    fn ulps_are_counted_at_each_value_s_own_magnitude() {
        assert_eq!(Spacing::of(DType::F16).at(300.0), 0.25);
        assert_eq!(Spacing::of(DType::F16).at(1.0), 2f64.powi(-10));
        assert_eq!(Spacing::of(DType::F16).at(0.0), 2f64.powi(-24));
        assert_eq!(Spacing::of(DType::F32).at(1.5), 2f64.powi(-23));
        assert_eq!(Spacing::of(DType::BF16).at(3.0), 2f64.powi(-6));
        for (dtype, m) in [
            (DType::F16, 300.0),
            (DType::F32, 1e-30),
            (DType::F64, 1e300),
        ] {
            let s = Spacing::of(dtype);
            assert_eq!(s.at(m) * s.inverse_at(m), 1.0, "{dtype} at {m}");
        }
        for d in [3e-7, 0.25, 0.26, 7.0, 1e11] {
            let (edge, b) = (upper_edge(bucket(d)), bucket(d));
            assert!(edge >= d && (b == BUCKETS - 1 || edge <= d * (1.0 + PERCENTILE_RESOLUTION)));
        }
        let r = f32s(&[300.0, 1.0, -2.0, 0.5]);
        let t = f32s(&[300.25, 1.0, -2.0, 0.5]);
        let bound = crate::default_for(DType::F16);
        let out = rounding(r.view(), t.view(), DType::F16, bound);
        assert_eq!(out.max_ulp_diff, 1.0);
        assert_eq!(out.mean_ulp_diff, 0.25);
        assert_eq!(out.beyond_tolerance, 0, "one step at 300 passes");
        assert!(out.tolerance_needed > 0.8 && out.tolerance_needed < 1.0);
    }

    #[test]
    fn the_bound_is_judged_per_element_and_the_needed_factor_says_by_how_much() {
        let r = f32s(&[1e-2, 300.0]);
        let t = f32s(&[1e-2 + 1e-3, 300.0]);
        let bound = crate::default_for(DType::F16);
        let out = rounding(r.view(), t.view(), DType::F16, bound);
        assert_eq!(
            out.beyond_tolerance, 1,
            "1e-3 on a value near 1e-2 is a finding"
        );
        let expected = 1e-3 / bound.at(1e-2);
        assert!((out.tolerance_needed - expected).abs() < 1e-3 * expected);
    }

    #[test]
    fn percentiles_are_within_their_resolution_and_do_not_depend_on_threads() {
        let n = 3 * BLOCK + 17;
        let r: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let t: Vec<f32> = (0..n).map(|i| i as f32 + (i % 100) as f32 * 1e-3).collect();
        let (r, t) = (f32s(&r), f32s(&t));
        let out = rounding(r.view(), t.view(), DType::F32, Bound::absolute(1.0));
        let close = |got: f64, want: f64| (got - want).abs() <= want * PERCENTILE_RESOLUTION * 1.01;
        assert!(close(out.p50_abs_diff, 0.049), "{}", out.p50_abs_diff);
        assert!(close(out.p99_abs_diff, 0.098), "{}", out.p99_abs_diff);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let again = one.install(|| rounding(r.view(), t.view(), DType::F32, Bound::absolute(1.0)));
        assert_eq!(out, again);
    }
}
