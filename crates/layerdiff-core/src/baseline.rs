//! The same-precision baseline: what an honest implementation of a layer in the target's dtype
//! gets wrong, so that a layer's own error is judged against it rather than against a fixed
//! tolerance. The rule that tells a defect from precision, in one place; the op matrix
//! ([`crate::check_op`]) judges each kernel with the same [`kernel_allowance`].
//!
//! For one layer re-run on the reference's inputs (its *own* error, [`crate::Layer::local`]):
//!
//! - `y`: the reference's value; `t`: the target's own value (the layer re-run on the
//!   reference's inputs); `x`: the layer computed exactly (float64) on the reference's inputs
//!   and weights rounded to the target's dtype `d` (the *grid*), by the reference's own
//!   computation of it (never the side under test);
//! - the **ideal** implementation in `d` is `round_d(x)`: it errs by `base = |round_d(x) − y|`,
//!   the rounding of the inputs carried through the layer plus one rounding of its result;
//! - an **honest kernel** in `d` may add its own error on top. At most `kernel_allowance(d, x)`
//!   (the rounding of its result, [`output_steps`] of them, the roundings of `stages`
//!   intermediate results in `d`, and the float32 work inside): that bounds the largest
//!   element. On average, what the ideal's own rounding `|round_d(x) − x|` is, plus the same
//!   stages and float32 work: that is what a typical element of an honest kernel is off by.
//!   Where the reference itself computes in `d` (a float32 target against float32), at least
//!   the reference's own error from the exact value `|x − y|`, since two honest kernels sum in
//!   different orders;
//! - an element's own error is explained by precision up to `base + HONEST_FACTOR · honest`.
//!
//! The layer's **multiple** is the larger of `max |t − y| / max allowed` (with the bound) and
//! `mean |t − y| / mean allowed` (with the typical error), maxima and means taken over the
//! elements. Above 1, the layer computes something its precision does not explain: a defect. FlashAttention's tests hold a kernel to
//! twice the error of a reference implementation in the same precision; [`HONEST_FACTOR`] is that
//! 2, applied to the kernel's own share (the inputs' rounding is the same for every
//! implementation, so it is counted once).
//!
//! Where the ideal implementation overflows `d`'s range (its rounded result is ±Inf), a target
//! that overflows there too is precision ([`Baseline::overflow`] counts them).
//!
//! A multiple up to [`DEFECT_MARGIN`] is still precision: the allowance is a bound drawn from a
//! model of honest kernels, and a layer a few percent past it (a LayerNorm gradient at 1.03×)
//! is nothing a user could act on. Never a defect on its own. A layer whose own error stays within
//! its tolerance is judged the same way, up to [`WITHIN_TOLERANCE_MARGIN`].
//!
//! **The narrow-accumulation ideal.** Where the layer is a reduction and the framework measured
//! its terms ([`Reduction`]: how many terms each element sums, `K`, and the root sum of squares
//! of its terms, `rss`, both exact), a second ideal is the kernel that adds those terms one by
//! one into a running sum held in `d` itself, as some CPU kernels do for float16 and bfloat16.
//! Each of the `K` additions rounds its running sum, by up to half a step, uniformly: one
//! element's own error has a standard deviation of `u_d·√(Σ_k S_k² / 3)` over its partial sums
//! `S_k`. Terms of mixed signs make the partial sums a random walk (`Σ_k S_k² ≈ K·rss²/2`);
//! terms that share a sign make them grow steadily to the sum `x` (`Σ_k S_k² ≈ K·x²/3`): so
//! `σ = u_d·√(K·(rss²/6 + x²/9))`, both kinds counted. That
//! kernel may err by `√(2·ln n)·σ` at the largest of `n` elements and `√(2/π)·σ` on average,
//! and an honest one by [`HONEST_FACTOR`] times that, on top of what the float32-accumulating
//! ideal allows. Rounding goes either way: where most of the own error pushes the elements one
//! way along their values ([`NarrowIdeal::systematic`], a kernel that scales its result), it is
//! not an accumulation's rounding, whatever its size. A layer beyond the first ideal and within
//! this one accumulates in `d` ([`Baseline::narrow`]): a finding of its own, not a defect.
//! Beyond both, a defect.

use rayon::prelude::*;
use serde::Serialize;

use crate::dtype::pow2;
use crate::{DType, Error, Result, TensorView};

/// How many times what precision explains a layer's own error may reach and still be precision
/// (see the module docs).
pub const DEFECT_MARGIN: f64 = 1.25;

/// How many times what precision explains a layer's own error must exceed to be a defect where
/// that error stays within its tolerance (the layer's values small, or its difference exceeding
/// only with what it inherits): judged scale-free all the same (a defect among small
/// values stays under the absolute tolerance), with more margin, since nothing a user sees
/// differs there. On the calibration corpus (docs/metrics.md) honest kernels reach 1.3× on such
/// layers (bfloat16 gradients of depthwise convolutions, values around 1e-8); a changed weight
/// reaches thousands.
pub const WITHIN_TOLERANCE_MARGIN: f64 = 2.0;

/// How many times an honest kernel's own error a target's kernel may make before it is a
/// defect (FlashAttention's tests hold a kernel to 2× the error of a reference implementation in
/// the same precision).
pub const HONEST_FACTOR: f64 = 2.0;

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
    mantissa: i32,
    min_exponent: i32,
    /// `n`, the output steps (0 for integers: they must be exact).
    steps: f64,
    /// `stages·u_d + (max(⌈log2 K⌉, 1) + n)·u_acc`.
    per_magnitude: f64,
    /// The smallest normal of the dtype, allowed where a kernel may flush to zero.
    smallest_normal: f64,
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
    fn at_finite(&self, exact: f64, scaled: f64) -> f64 {
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

/// One layer's own error against the ideal implementation in its target's dtype (see the
/// module docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Baseline {
    /// The dtype the ideal implementation computes in (the target's, for this layer).
    pub grid: String,
    /// Intermediate results an honest kernel rounds to `grid` here (the target's computing
    /// nodes in the layer's group, less one).
    pub stages: u32,
    /// The ideal implementation's largest difference from the reference.
    #[serde(serialize_with = "crate::render::float")]
    pub max_abs_diff: f64,
    /// Its mean difference from the reference.
    #[serde(serialize_with = "crate::render::float")]
    pub mean_abs_diff: f64,
    /// The largest own error precision explains at an element (`base + 2·honest`).
    #[serde(serialize_with = "crate::render::float")]
    pub allowed_max_abs_diff: f64,
    /// The mean own error precision explains.
    #[serde(serialize_with = "crate::render::float")]
    pub allowed_mean_abs_diff: f64,
    /// The target's own error as a multiple of what precision explains: the larger of the
    /// ratios of maxima and of means. Above [`DEFECT_MARGIN`], a defect (unless within
    /// `narrow`'s ideal).
    #[serde(serialize_with = "crate::render::float")]
    pub multiple: f64,
    /// Elements where the ideal implementation overflows `grid`'s range while the reference is
    /// finite (the target overflowing there is precision).
    pub overflow: u64,
    /// Elements where a reference of expected values (not a kernel) is further from the exact
    /// value than its dtype's tolerance, counted where the grid is its own dtype and it is far
    /// further off than the target ([`REFERENCE_OFF_FACTOR`]): the reference is off there, and
    /// the target cannot be held to it.
    #[serde(skip_serializing_if = "is_zero")]
    pub reference_off: u64,
    /// The same own error against a kernel that accumulates the layer's reduction in `grid`
    /// itself (see the module docs), where the reduction's terms were measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub narrow: Option<NarrowIdeal>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Baseline {
    /// Whether the own error is beyond what the precision explains (by more than
    /// [`DEFECT_MARGIN`]).
    pub fn beyond(&self) -> bool {
        self.multiple > DEFECT_MARGIN
    }

    /// Whether the own error is beyond what a float32-accumulating kernel explains and within
    /// what one that accumulates in `grid` does: the kernel sums in the narrow dtype.
    pub fn accumulates_narrow(&self) -> bool {
        self.beyond()
            && self
                .narrow
                .as_ref()
                .is_some_and(|n| n.multiple <= DEFECT_MARGIN && n.systematic.abs() <= n.chance())
    }
}

/// A layer's reduction as the framework measured it, exactly, on the baseline's inputs: how
/// many terms each element sums, and per element the root sum of squares of its terms.
#[derive(Debug, Clone, Copy)]
pub struct Reduction<'a> {
    /// Terms each element sums (the positions a weight's gradient adds up, a dot product's
    /// length).
    pub terms: u64,
    /// Per element, `√Σ term²`, in the layer's shape.
    pub rss: TensorView<'a>,
}

/// The own error against a kernel that accumulates in the narrow dtype (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NarrowIdeal {
    /// Terms each element sums.
    pub terms: u64,
    /// Elements judged.
    #[serde(skip)]
    pub elements: u64,
    /// The largest own error such a kernel explains at an element.
    #[serde(serialize_with = "crate::render::float")]
    pub allowed_max_abs_diff: f64,
    /// The mean own error it explains.
    #[serde(serialize_with = "crate::render::float")]
    pub allowed_mean_abs_diff: f64,
    /// The own error as a multiple of it.
    #[serde(serialize_with = "crate::render::float")]
    pub multiple: f64,
    /// How much of the own error pushes every element the same way along its value
    /// (`Σ (t − y)·sign(x) / Σ |t − y|`, from −1 to 1): about 0 for rounding, which goes either
    /// way; 1 for a kernel that scales its result up. Beyond [`NarrowIdeal::chance`], the
    /// error is not an accumulation's rounding, whatever its size.
    #[serde(serialize_with = "crate::render::float")]
    pub systematic: f64,
}

/// How much of a layer's own error may push its elements one way (see
/// [`NarrowIdeal::systematic`]) for it to be the rounding of a narrow accumulation: 0.8, or
/// three times what `n` elements of unbiased rounding reach by chance (`3/√n`) where more. An
/// accumulation that swamps small terms leans one way too: PyTorch's float16 LayerNorm bias
/// gradient over 784 positions reaches 0.66 on 24 channels; a kernel that scales its result is
/// at 0.99.
pub const SYSTEMATIC: f64 = 0.8;

impl NarrowIdeal {
    /// How systematic (see [`NarrowIdeal::systematic`]) the rounding of its elements may look
    /// by chance.
    pub fn chance(&self) -> f64 {
        SYSTEMATIC.max(3.0 / (self.elements.max(1) as f64).sqrt())
    }
}

/// The standard deviation of one element's error in a sum of `terms` terms, added one by one
/// into a running sum held in a dtype of unit roundoff `unit`, whose terms' root sum of squares
/// is `rss` and whose exact sum is `sum` (see the module docs).
pub fn narrow_accumulation_sigma(unit: f64, terms: u64, rss: f64, sum: f64) -> f64 {
    unit * (terms.max(1) as f64 * (rss * rss / 6.0 + sum * sum / 9.0)).sqrt()
}

/// How many times further from the exact value than the target (anywhere in the layer) the
/// reference must be where it exceeds its dtype's tolerance, to be the side that is off.
pub const REFERENCE_OFF_FACTOR: f64 = 4.0;

/// Sums of one block of elements, combined in block order (deterministic whatever the threads).
#[derive(Default, Clone, Copy)]
struct Sums {
    count: u64,
    overflow: u64,
    reference_off: u64,
    /// The reference's largest distance from the exact value where it is off.
    reference_off_max: f64,
    /// The target's largest distance from the exact value.
    target_from_exact: f64,
    base_max: f64,
    base_sum: f64,
    own_max: f64,
    own_sum: f64,
    allowed_max: f64,
    allowed_sum: f64,
    /// The narrow-accumulation ideal's allowance at the largest element (without its tail
    /// factor) and summed.
    narrow_max: f64,
    narrow_sum: f64,
    /// `Σ (t − y)·sign(x)`: the own error that pushes each element along its value.
    signed_sum: f64,
}

impl Sums {
    fn merge(mut self, other: Sums) -> Sums {
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
        self
    }
}

/// The least tail factor of the narrow-accumulation ideal's largest element, in its `σ`s (see
/// the module docs): √(2·ln n) for `n` elements, at least this.
const NARROW_TAIL: f64 = 2.0;

/// The mean absolute value of a normal error, in its `σ`s: √(2/π).
const NARROW_MEAN: f64 = 0.797_884_560_802_865_4;

/// Elements per block of the baseline's pass.
const BLOCK: usize = 4096;

/// What judges each element of a layer's baseline: worked out once per layer.
struct Rule {
    kernel: KernelAllowance,
    same_precision: bool,
    expected_values: bool,
    honest: crate::Bound,
    /// Whether the reduction's terms were measured (the narrow-accumulation ideal).
    narrow: bool,
    unit: f64,
    terms: u64,
    /// The narrow ideal's tail factor at the largest element, in its `σ`s.
    tail: f64,
}

impl Rule {
    /// The sums of one block: the reference, the target's own value, the exact value and the
    /// reduction's `√Σ term²`, element by element; `round` to the grid.
    #[inline(always)]
    fn block(
        &self,
        (reference, own, exact, spread): (&[f64], &[f64], &[f64], &[f64]),
        round: impl Fn(f64) -> f64,
    ) -> Sums {
        let mut s = Sums::default();
        for (((&y, &t), &x), &r) in reference.iter().zip(own).zip(exact).zip(spread) {
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
                let sigma = narrow_accumulation_sigma(self.unit, self.terms, r, x);
                s.narrow_max = s
                    .narrow_max
                    .max(base + HONEST_FACTOR * bound + self.tail * sigma);
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
    fn finite_block(
        &self,
        grid: DType,
        (reference, own, exact, _): (&[f64], &[f64], &[f64], &[f64]),
    ) -> Option<Sums> {
        if self.expected_values || self.narrow {
            return None;
        }
        let (bits, max_finite) = (grid.mantissa_bits()?, grid.max_finite()?);
        if bits >= 53 {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            if *AVX2.get_or_init(|| {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }) {
                if reference.len().is_multiple_of(LANES) {
                    let values = (reference, own, exact);
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
    fn lanes(
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

/// The baseline of one layer: `reference` (`y`), the target's own value `own` (`t`, the layer
/// re-run on the reference's inputs), and `exact` (`x`, the layer in float64 on the
/// reference's inputs rounded to `grid`), judged by [the rule](self). `stages`: intermediate
/// results an honest kernel rounds to `grid`. `expected_values`: the reference is a file of
/// expected values, not a kernel, and is judged against `exact` itself (`reference_off`).
/// `reduction`: the layer's terms where measured, for the narrow-accumulation ideal.
pub fn assess_baseline(
    reference: TensorView<'_>,
    own: TensorView<'_>,
    exact: TensorView<'_>,
    grid: DType,
    stages: u32,
    expected_values: bool,
    reduction: Option<Reduction<'_>>,
) -> Result<Baseline> {
    let n = reference.numel();
    let rss = reduction.map(|r| r.rss);
    for other in [&own, &exact].into_iter().chain(rss.as_ref()) {
        if other.numel() != n {
            return Err(Error::ShapeMismatch {
                reference: reference.shape.to_vec(),
                target: other.shape.to_vec(),
            });
        }
    }
    // The reference computes in the grid itself: an honest kernel may be as far from the exact
    // value as the reference is.
    let same_precision = !grid.narrower_than(reference.dtype);
    // How far an honest reference may be from the exact value: its dtype's tolerance.
    let honest = crate::default_for(reference.dtype);
    let rule = Rule {
        kernel: KernelAllowance::new(grid, 1, stages),
        same_precision,
        expected_values,
        honest,
        narrow: rss.is_some(),
        unit: grid.mantissa_bits().map_or(0.0, |b| pow2(-(b as i32))),
        terms: reduction.map_or(0, |r| r.terms),
        tail: HONEST_FACTOR * NARROW_TAIL.max((2.0 * (n as f64).ln()).sqrt()),
    };
    let blocks: Vec<Sums> = (0..n.div_ceil(BLOCK))
        .into_par_iter()
        .map_init(
            // each task decodes into buffers of its own, made once
            || std::array::from_fn::<_, 4, _>(|_| vec![0.0; BLOCK]),
            |buffers, b| {
                let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
                let len = end - start;
                let views = [Some(&reference), Some(&own), Some(&exact), rss.as_ref()];
                // float64 values are read where they lie (aligned, as a runtime's are), others
                // decoded
                let mut read = buffers.iter_mut().zip(views).map(|(buffer, view)| {
                    let Some(view) = view else {
                        // never written: zeros since it was made
                        return &buffer[..len];
                    };
                    let size = view.dtype.size();
                    let bytes = &view.bytes[start * size..end * size];
                    match bytemuck::try_cast_slice::<u8, f64>(bytes) {
                        Ok(values) if view.dtype == DType::F64 => values,
                        _ => {
                            crate::compare::decode(view.dtype, bytes, &mut buffer[..len]);
                            &buffer[..len]
                        }
                    }
                });
                let [reference, own, exact, spread] = std::array::from_fn(|_| read.next().unwrap());
                let values = (reference, own, exact, spread);
                if let Some(sums) = rule.finite_block(grid, values) {
                    return sums;
                }
                // the grid's rounding chosen once per block, not matched per element
                match grid {
                    DType::F16 => rule.block(values, |x| DType::F16.round(x)),
                    DType::BF16 => rule.block(values, |x| DType::BF16.round(x)),
                    DType::F32 => rule.block(values, |x| DType::F32.round(x)),
                    _ => rule.block(values, |x| grid.round(x)),
                }
            },
        )
        .collect();
    let s = blocks.into_iter().fold(Sums::default(), Sums::merge);
    let mean = |sum: f64| {
        if s.count == 0 {
            0.0
        } else {
            sum / s.count as f64
        }
    };
    let ratio = |own: f64, allowed: f64| {
        if own == 0.0 {
            0.0
        } else if allowed > 0.0 {
            own / allowed
        } else {
            f64::INFINITY
        }
    };
    let (own_mean, allowed_mean) = (mean(s.own_sum), mean(s.allowed_sum));
    let narrow = reduction.map(|r| NarrowIdeal {
        terms: r.terms,
        elements: s.count,
        systematic: if s.own_sum > 0.0 {
            s.signed_sum / s.own_sum
        } else {
            0.0
        },
        allowed_max_abs_diff: s.narrow_max,
        allowed_mean_abs_diff: mean(s.narrow_sum),
        multiple: ratio(s.own_max, s.narrow_max).max(ratio(own_mean, mean(s.narrow_sum))),
    });
    Ok(Baseline {
        grid: grid.name().to_string(),
        stages,
        max_abs_diff: s.base_max,
        mean_abs_diff: mean(s.base_sum),
        allowed_max_abs_diff: s.allowed_max,
        allowed_mean_abs_diff: allowed_mean,
        multiple: ratio(s.own_max, s.allowed_max).max(ratio(own_mean, allowed_mean)),
        overflow: s.overflow,
        // The reference is off only where it is far further from the exact value than the
        // target is anywhere in the layer: a reduction that cancels leaves both honest sides
        // about as far (its error scales with the terms, not the small result).
        reference_off: if s.reference_off_max > REFERENCE_OFF_FACTOR * s.target_from_exact {
            s.reference_off
        } else {
            0
        },
        narrow,
    })
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod tests;
