//! The rule element by element: one block's sums, by lanes where every value of the block is
//! finite (in explicit AVX-512 or AVX2 where the CPU has it), else one element at a time.

use std::sync::Arc;

use super::stalls::Stalls;
use super::{HONEST_FACTOR, KernelAllowance, narrow_accumulation_sigma};
use crate::DType;

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;

/// Sums of one block of elements, combined in block order (deterministic whatever the threads).
#[derive(Default, Clone, Copy)]
pub(super) struct Sums {
    pub(super) count: u64,
    pub(super) overflow: u64,
    pub(super) reference_off: u64,
    /// The reference's largest distance from the exact value where it is off.
    pub(super) reference_off_max: f64,
    /// The target's largest distance from the exact value.
    pub(super) target_from_exact: f64,
    pub(super) base_max: f64,
    pub(super) base_sum: f64,
    pub(super) own_max: f64,
    pub(super) own_sum: f64,
    pub(super) allowed_max: f64,
    pub(super) allowed_sum: f64,
    /// The narrow-accumulation ideal's allowance at the largest element (without its tail
    /// factor) and summed.
    pub(super) narrow_max: f64,
    pub(super) narrow_sum: f64,
    /// `Σ (t − y)·sign(x)`: the own error that pushes each element along its value.
    pub(super) signed_sum: f64,
    /// The narrow ideal's `σ` summed, and what of it a stalled sum falls short by.
    pub(super) sigma_sum: f64,
    pub(super) shortfall_sum: f64,
    /// Elements where the narrow ideal is judged (terms not negligible), and those whose own
    /// error is beyond what that kernel may err by at that very element.
    pub(super) narrow_judged: u64,
    pub(super) narrow_beyond: u64,
}

impl Sums {
    pub(super) fn merge(mut self, other: Sums) -> Sums {
        self.count += other.count;
        self.overflow += other.overflow;
        self.reference_off += other.reference_off;
        self.reference_off_max = self.reference_off_max.max(other.reference_off_max);
        self.target_from_exact = self.target_from_exact.max(other.target_from_exact);
        self.base_max = self.base_max.max(other.base_max);
        self.base_sum += other.base_sum;
        self.own_max = self.own_max.max(other.own_max);
        self.own_sum += other.own_sum;
        self.allowed_max = self.allowed_max.max(other.allowed_max);
        self.allowed_sum += other.allowed_sum;
        self.narrow_max = self.narrow_max.max(other.narrow_max);
        self.narrow_sum += other.narrow_sum;
        self.signed_sum += other.signed_sum;
        self.sigma_sum += other.sigma_sum;
        self.shortfall_sum += other.shortfall_sum;
        self.narrow_judged += other.narrow_judged;
        self.narrow_beyond += other.narrow_beyond;
        self
    }
}

/// The least tail factor of the narrow-accumulation ideal's largest element, in its `σ`s (see
/// the module docs): √(2·ln n) for `n` elements, at least this.
pub(super) const NARROW_TAIL: f64 = 2.0;

/// The mean absolute value of a normal error, in its `σ`s: √(2/π).
pub(super) const NARROW_MEAN: f64 = 0.797_884_560_802_865_4;

/// One block's values: the reference, the target's own value, the exact value, the
/// reduction's `√Σ term²` and what its terms added one by one err by (see [`Rule::block`]).
pub(super) type Values<'a> = (&'a [f64], &'a [f64], &'a [f64], &'a [f64], &'a [f64]);

/// Elements per block of the baseline's pass.
pub(super) const BLOCK: usize = 4096;

/// What judges each element of a layer's baseline: worked out once per layer.
pub(super) struct Rule {
    pub(super) kernel: KernelAllowance,
    pub(super) same_precision: bool,
    pub(super) expected_values: bool,
    pub(super) honest: crate::Bound,
    /// Whether the reduction's terms were measured (the narrow-accumulation ideal).
    pub(super) narrow: bool,
    pub(super) unit: f64,
    pub(super) terms: u64,
    /// The narrow ideal's tail factor at the largest element, in its `σ`s.
    pub(super) tail: f64,
    /// Where the narrow ideal's sums may stall (a float16 or bfloat16 grid): their error.
    pub(super) stalls: Option<Arc<Stalls>>,
    /// A root sum of squares of the terms at or under this is terms that cancel exactly (see
    /// [`super::NEGLIGIBLE_TERMS`]): such an element is not judged against the narrow ideal.
    pub(super) negligible: f64,
}

impl Rule {
    /// The sums of one block: the reference, the target's own value, the exact value, the
    /// reduction's `√Σ term²` and what its terms added one by one err by along the value (0
    /// where not measured), element by element; `round` to the grid.
    #[inline(always)]
    pub(super) fn block(
        &self,
        (reference, own, exact, spread, one_by_one): Values<'_>,
        round: impl Fn(f64) -> f64,
    ) -> Sums {
        let mut s = Sums::default();
        let measured = spread.iter().zip(one_by_one);
        for (((&y, &t), &x), (&r, &k)) in reference.iter().zip(own).zip(exact).zip(measured) {
            if y.is_nan() || !y.is_finite() {
                continue; // NaN and Inf in the reference say nothing of precision
            }
            if !x.is_finite() {
                // Its inputs as the target holds them overflow already (a LayerNorm of
                // ±Inf is NaN): the ideal says nothing here, and a target that is not
                // finite either makes what it makes.
                if !t.is_finite() {
                    s.overflow += 1;
                }
                continue;
            }
            let ideal = round(x);
            if ideal.is_infinite() {
                s.overflow += 1;
                if t == ideal {
                    continue; // the target overflows where the ideal does: its precision
                }
            }
            let own_d = if t.is_finite() {
                (t - y).abs()
            } else {
                f64::INFINITY
            };
            let base = if ideal.is_finite() {
                (ideal - y).abs()
            } else {
                0.0
            };
            let bound = self.kernel.at(x, x);
            // The typical error: the ideal's own rounding, and the same magnitude terms.
            let rounding = if ideal.is_finite() {
                (ideal - x).abs()
            } else {
                0.0
            };
            let mut typical = rounding + self.kernel.per_magnitude(x);
            let mut bound = bound;
            // Only where x is the reference's own computation (with a narrower grid its
            // inputs and weights were rounded first): where expected values are further
            // from it than their dtype's tolerance (a wrong value, or a long reduction that
            // cancels: decided for the layer below).
            if self.expected_values
                && self.same_precision
                && (x - y).abs() > self.honest.atol + self.honest.rtol * x.abs()
            {
                s.reference_off += 1;
                s.reference_off_max = s.reference_off_max.max((x - y).abs());
            }
            if self.same_precision && t.is_finite() {
                s.target_from_exact = s.target_from_exact.max((x - t).abs());
            }
            if self.same_precision {
                bound = bound.max((x - y).abs());
                typical = typical.max((x - y).abs());
            }
            s.count += 1;
            s.base_max = s.base_max.max(base);
            s.base_sum += base;
            s.own_max = s.own_max.max(own_d);
            s.own_sum += own_d;
            s.allowed_max = s.allowed_max.max(base + HONEST_FACTOR * bound);
            s.allowed_sum += base + HONEST_FACTOR * typical;
            if self.narrow {
                if t.is_finite() {
                    s.signed_sum += (t - y) * x.signum();
                }
                let mut sigma = narrow_accumulation_sigma(self.unit, self.terms, r, x);
                let mut short = 0.0f64;
                if let Some(stalls) = &self.stalls {
                    let (rms, signed) = stalls.at(self.terms, r, x);
                    sigma = sigma.max(rms);
                    short = -signed;
                }
                // the terms themselves, added one by one: what that kernel errs by here
                sigma = sigma.max(k.abs());
                short = short.max(-k);
                s.shortfall_sum += short;
                s.sigma_sum += sigma;
                let at_most = base + HONEST_FACTOR * bound + self.tail * sigma;
                s.narrow_max = s.narrow_max.max(at_most);
                // element by element, where its terms do not cancel exactly
                if r > self.negligible {
                    s.narrow_judged += 1;
                    s.narrow_beyond += u64::from(own_d > at_most);
                }
                s.narrow_sum += base + HONEST_FACTOR * (typical + NARROW_MEAN * sigma);
            }
        }
        s
    }
}

/// Lanes of [`Rule::finite_block`]: element `k` of a block goes to lane `k % LANES`.
const LANES: usize = 8;

impl Rule {
    /// [`Rule::block`] where every value of the block is finite and stays so on the grid, for
    /// a float32, float16 or bfloat16 grid and neither expected values nor measured terms:
    /// the same quantities without a branch, summed in [`LANES`] lanes (then combined by a
    /// fixed tree), so the loop runs on vectors. `None` for any other block.
    pub(super) fn finite_block(
        &self,
        grid: DType,
        (reference, own, exact, ..): Values<'_>,
    ) -> Option<Sums> {
        let max_finite = self.by_lanes(grid)?;
        #[cfg(target_arch = "x86_64")]
        {
            // the comparator's choice of kernel: its AVX2 (and AVX-512) needs AVX2 and FMA too
            let best = crate::kernel::Kernel::best();
            if best != crate::kernel::Kernel::Portable {
                if reference.len().is_multiple_of(LANES) {
                    let values = (reference, own, exact);
                    if best == crate::kernel::Kernel::Avx512 {
                        // SAFETY: the CPU has AVX-512F and DQ; the slices are of one length
                        // (a block's), a whole number of lane rows.
                        return unsafe { avx512::lane_sums(self, grid, max_finite, values) };
                    }
                    // SAFETY: the CPU has AVX2 and FMA; the slices are of one length (a
                    // block's), a whole number of lane rows.
                    return unsafe { avx2::lane_sums(self, grid, max_finite, values) };
                }
                // SAFETY: the CPU has AVX2.
                return unsafe { self.lanes_avx2(grid, max_finite, reference, own, exact) };
            }
        }
        self.lanes(grid, max_finite, reference, own, exact)
    }

    /// The grid's largest finite value where a block may be summed by lanes ([`Rule::finite_block`]:
    /// a float32, float16 or bfloat16 grid, neither expected values nor measured terms).
    fn by_lanes(&self, grid: DType) -> Option<f64> {
        if self.expected_values || self.narrow {
            return None;
        }
        let (bits, max_finite) = (grid.mantissa_bits()?, grid.max_finite()?);
        (bits < 53).then_some(max_finite)
    }

    /// [`Rule::finite_block`] read straight from the reference's and the target's bytes
    /// (`(dtype, bytes)`, `exact` in float64) by the AVX-512 kernel, where the CPU has it: no
    /// pass decodes them first. `None` where it does not apply (then the values are decoded
    /// for [`Rule::finite_block`]); `Some(None)` for a block that is not finite.
    pub(super) fn finite_block_of(
        &self,
        grid: DType,
        reference: (DType, &[u8]),
        own: (DType, &[u8]),
        exact: &[f64],
    ) -> Option<Option<Sums>> {
        let max_finite = self.by_lanes(grid)?;
        #[cfg(target_arch = "x86_64")]
        if exact.len().is_multiple_of(LANES)
            && crate::kernel::Kernel::best() == crate::kernel::Kernel::Avx512
        {
            // SAFETY: the CPU has the AVX-512 kernel's features; `exact` is a whole number of
            // lane rows, the byte slices as many elements of their dtypes (the caller's).
            return unsafe { avx512::lane_sums_of(self, grid, max_finite, reference, own, exact) };
        }
        let _ = (max_finite, reference, own, exact);
        None
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn lanes_avx2(
        &self,
        grid: DType,
        max_finite: f64,
        reference: &[f64],
        own: &[f64],
        exact: &[f64],
    ) -> Option<Sums> {
        self.lanes(grid, max_finite, reference, own, exact)
    }

    /// The lane loop of [`Rule::finite_block`], the grid's rounding chosen once.
    #[inline(always)]
    pub(super) fn lanes(
        &self,
        grid: DType,
        max_finite: f64,
        reference: &[f64],
        own: &[f64],
        exact: &[f64],
    ) -> Option<Sums> {
        let values = (reference, own, exact);
        match grid {
            DType::F32 => self.lane_sums(values, max_finite, |x| f64::from(x as f32)),
            DType::F16 => self.lane_sums(values, max_finite, |x| {
                crate::dtype::finite_to_grid(x, 10, -14, 65504.0)
            }),
            _ => self.lane_sums(values, max_finite, |x| {
                crate::dtype::finite_to_grid(x, 7, -126, crate::dtype::BF16_MAX)
            }),
        }
    }

    /// The sums, or `None` where a value is not finite or the exact value beyond the grid's
    /// largest (computed all the same, without a branch, then thrown away).
    #[inline(always)]
    fn lane_sums(
        &self,
        (reference, own, exact): (&[f64], &[f64], &[f64]),
        max_finite: f64,
        round: impl Fn(f64) -> f64,
    ) -> Option<Sums> {
        let z = [0.0f64; LANES];
        let mut fits = [true; LANES];
        let (mut base_max, mut base_sum, mut own_max, mut own_sum) = (z, z, z, z);
        let (mut allowed_max, mut allowed_sum, mut from_exact) = (z, z, z);
        let kernel = &self.kernel;
        let same = self.same_precision;
        let mut lane = |j: usize, y: f64, t: f64, x: f64| {
            fits[j] &= y.abs() <= f64::MAX && t.abs() <= f64::MAX && x.abs() <= max_finite;
            let ideal = round(x);
            let (own_d, base) = ((t - y).abs(), (ideal - y).abs());
            let magnitude = kernel.per_magnitude(x);
            let mut bound = kernel.at_finite(x, magnitude);
            let mut typical = (ideal - x).abs() + magnitude;
            if same {
                let off = (x - y).abs();
                from_exact[j] = max(from_exact[j], (x - t).abs());
                bound = max(bound, off);
                typical = max(typical, off);
            }
            base_max[j] = max(base_max[j], base);
            base_sum[j] += base;
            own_max[j] = max(own_max[j], own_d);
            own_sum[j] += own_d;
            allowed_max[j] = max(allowed_max[j], base + HONEST_FACTOR * bound);
            allowed_sum[j] += base + HONEST_FACTOR * typical;
        };
        let full = reference.len() - reference.len() % LANES;
        for ((y, t), x) in reference[..full]
            .chunks_exact(LANES)
            .zip(own.chunks_exact(LANES))
            .zip(exact.chunks_exact(LANES))
        {
            for j in 0..LANES {
                lane(j, y[j], t[j], x[j]);
            }
        }
        for k in full..reference.len() {
            lane(k - full, reference[k], own[k], exact[k]);
        }
        if fits.contains(&false) {
            return None;
        }
        Some(Sums::from_lanes(
            reference.len(),
            [
                from_exact,
                base_max,
                base_sum,
                own_max,
                own_sum,
                allowed_max,
                allowed_sum,
            ],
        ))
    }
}

impl Sums {
    /// The sums of a block of `count` elements from its lanes: the target's largest distance
    /// from the exact value, the base's largest and sum, the own error's, the allowance's (the
    /// maxima folded, the sums combined by a fixed tree).
    fn from_lanes(count: usize, lanes: [[f64; LANES]; 7]) -> Sums {
        let tree =
            |l: [f64; LANES]| ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
        let most = |l: [f64; LANES]| l.into_iter().fold(0.0, max);
        let [
            from_exact,
            base_max,
            base_sum,
            own_max,
            own_sum,
            allowed_max,
            allowed_sum,
        ] = lanes;
        Sums {
            count: count as u64,
            target_from_exact: most(from_exact),
            base_max: most(base_max),
            base_sum: tree(base_sum),
            own_max: most(own_max),
            own_sum: tree(own_sum),
            allowed_max: most(allowed_max),
            allowed_sum: tree(allowed_sum),
            ..Sums::default()
        }
    }
}

/// The larger of two values that are not NaN, as a vector max computes it.
#[inline(always)]
fn max(a: f64, b: f64) -> f64 {
    if a > b { a } else { b }
}
