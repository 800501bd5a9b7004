//! What an honest kernel may get wrong at an element: the allowance the baseline's rule
//! ([`super::assess_baseline`]) and the op matrix ([`crate::check_op`]) share.

use crate::DType;
use crate::dtype::pow2;

/// Steps of the output dtype every element may be off by, beyond the terms of its magnitude:
/// one in float16 and bfloat16 (a float32 result rounded once is within half a step), four in
/// float32 and float64 (vectorized exp, tanh and erf are accurate to a few steps, not to half one).
pub fn output_steps(dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => 1.0,
        _ => 4.0,
    }
}

/// The unit roundoff a reduction is allowed to accumulate with: float32's, or float64's for a
/// float64 result.
pub fn accumulation_unit(dtype: DType) -> f64 {
    if dtype == DType::F64 {
        pow2(-53)
    } else {
        pow2(-24)
    }
}

/// What one honest kernel computing in `dtype` may get wrong at an element whose exact value is
/// `exact`, when its error scales with `magnitude` (`Σ|terms|` of a reduction, else `|exact|`),
/// after reducing `reduction` terms and rounding `stages` intermediate results to `dtype`:
///
/// ```text
/// n·step_d(exact) + (stages·u_d + (max(⌈log2 K⌉, 1) + n)·u_acc)·M
///                                        [+ the smallest normal of d where |exact| is below it]
/// ```
///
/// `step_d`: one step (ULP) of `dtype` at `|exact|`, `n` [`output_steps`] of them; `u_d` the
/// dtype's unit roundoff; `u_acc` float32's ([`accumulation_unit`]): mainstream kernels
/// accumulate float16 and bfloat16 in float32. A pairwise or blocked float32 sum of `K` terms
/// is off by at most `⌈log2 K⌉·u_acc·Σ|terms|` (at least one rounding of the accumulator); a
/// sequential one stays well inside on data of mixed signs, while a sum accumulated in float16
/// does not (its error is 2^13 float32 steps a rounding): it fails. Below the normal range a
/// kernel may flush to zero. `0` for integer dtypes, which must be exact.
pub fn kernel_allowance(
    dtype: DType,
    exact: f64,
    magnitude: f64,
    reduction: usize,
    stages: u32,
) -> f64 {
    KernelAllowance::new(dtype, reduction, stages).at(exact, magnitude)
}

/// [`kernel_allowance`] for one layer: what does not change from element to element, worked
/// out once (a layer's baseline asks it of every element).
#[derive(Debug, Clone, Copy)]
pub struct KernelAllowance {
    /// The dtype's stored significand bits and its least normal exponent: its step at a
    /// magnitude, as [`DType::step`] works it out, without matching the dtype per element.
    pub(super) mantissa: i32,
    pub(super) min_exponent: i32,
    /// `n`, the output steps (0 for integers: they must be exact).
    pub(super) steps: f64,
    /// `stages·u_d + (max(⌈log2 K⌉, 1) + n)·u_acc`.
    pub(super) per_magnitude: f64,
    /// The smallest normal of the dtype, allowed where a kernel may flush to zero.
    pub(super) smallest_normal: f64,
}

impl KernelAllowance {
    /// For `reduction` terms and `stages` intermediate roundings in `dtype`.
    pub fn new(dtype: DType, reduction: usize, stages: u32) -> Self {
        let Some(bits) = dtype.mantissa_bits() else {
            return Self {
                mantissa: 0,
                min_exponent: 0,
                steps: 0.0,
                per_magnitude: 0.0,
                smallest_normal: 0.0,
            };
        };
        let n = output_steps(dtype);
        let order = f64::from(reduction.max(1).next_power_of_two().trailing_zeros()).max(1.0);
        let smallest_normal = dtype.step(0.0) * pow2(bits as i32 - 1);
        Self {
            mantissa: bits as i32 - 1,
            min_exponent: ((smallest_normal.to_bits() >> 52) & 0x7ff) as i32 - 1023,
            steps: n,
            per_magnitude: f64::from(stages) * pow2(-(bits as i32))
                + (order + n) * accumulation_unit(dtype),
            smallest_normal,
        }
    }

    /// At an element whose exact value is `exact`, the error scaling with `magnitude`.
    #[inline]
    pub fn at(&self, exact: f64, magnitude: f64) -> f64 {
        if self.steps == 0.0 {
            return 0.0;
        }
        let flush = if exact.abs() < self.smallest_normal {
            self.smallest_normal
        } else {
            0.0
        };
        self.steps * self.step(exact) + self.per_magnitude * magnitude.abs() + flush
    }

    /// [`Self::at`] for a finite `exact` of a float32 or narrower grid, whose part scaling
    /// with the magnitude is `scaled` ([`Self::per_magnitude`]): without a branch.
    #[inline(always)]
    pub(super) fn at_finite(&self, exact: f64, scaled: f64) -> f64 {
        let exponent =
            (((exact.to_bits() >> 52) & 0x7ff) as i64 - 1023).max(self.min_exponent.into());
        let step = f64::from_bits(((exponent - i64::from(self.mantissa) + 1023) as u64) << 52);
        let flush = if exact.abs() < self.smallest_normal {
            self.smallest_normal
        } else {
            0.0
        };
        self.steps * step + scaled + flush
    }

    /// [`DType::step`] of the dtype at `|exact|`.
    #[inline(always)]
    fn step(&self, exact: f64) -> f64 {
        let exponent = if exact.is_finite() {
            ((exact.to_bits() >> 52) & 0x7ff) as i32 - 1023
        } else {
            self.min_exponent
        };
        pow2(exponent.max(self.min_exponent) - self.mantissa)
    }

    /// The part that scales with the magnitude alone (`at(x, m) − at(x, 0)`).
    #[inline]
    pub fn per_magnitude(&self, magnitude: f64) -> f64 {
        self.per_magnitude * magnitude.abs()
    }
}
