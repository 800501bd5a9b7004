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
//! - an element's own error is explained by precision up to `base + HONEST_FACTOR · honest`;
//! - where the reference rounds coarser than `d` (a bfloat16 reference of a float16 target),
//!   its rounding is its own and larger than the target's kernel may add: `y` is replaced by
//!   `x` ([`Baseline::from_exact`]), as if the reference had computed the layer exactly.
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
//! `σ = u_d·√(K·(rss²/6 + x²/9))`, both kinds counted. Rounding is uniform only while the
//! terms are spread wider than a step of the running sum: terms that share a sign climb to
//! where a term is under half a step and is rounded away whole, and the sum stalls short of
//! `x` (in bfloat16, 784 equal terms of 1 stop at 256). Where it may, `σ` is the simulated
//! error of that kernel (`baseline/stalls.rs`) when larger; and where the framework handed
//! over the terms themselves ([`Reduction::each`]: a term far larger than the rest, a ViT's
//! class token, swamps what follows it, which no count and spread of the terms tells), at
//! least the error of those very terms added one by one in the order they are held. That
//! kernel may err by `√(2·ln n)·σ` at the largest of `n` elements and `√(2/π)·σ` on average,
//! and an honest one by [`HONEST_FACTOR`] times that, on top of what the float32-accumulating
//! ideal allows. Rounding goes either way: where most of the own error pushes the elements one
//! way along their values ([`NarrowIdeal::systematic`], a kernel that scales its result), it is
//! not an accumulation's rounding, whatever its size, unless it falls short of them as much as
//! stalled sums do ([`NarrowIdeal::short`]). A layer beyond the first ideal and within
//! this one accumulates in `d` ([`Baseline::narrow`]): a finding of its own, not a defect.
//! Beyond both, a defect.

use rayon::prelude::*;
use serde::Serialize;

use crate::dtype::pow2;
use crate::{DType, Error, Result, TensorView};

mod allowance;
mod index;
mod narrow;
mod rule;
mod stalls;

pub use allowance::{KernelAllowance, accumulation_unit, kernel_allowance, output_steps};
use narrow::{NEGLIGIBLE_TERMS, SYSTEMATIC};
pub use narrow::{NarrowIdeal, narrow_accumulation_sigma};
use rule::{BLOCK, NARROW_TAIL, Rule, Sums};

/// Why a layer has no baseline where its own value is the reference's bit for bit and it stays
/// within its tolerance: its multiple is 0 whatever the ideal, which is not computed.
pub const SAME_BITS: &str =
    "its own value is the reference's, bit for bit (no error of its own to judge)";

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
    #[serde(serialize_with = "crate::floats::float")]
    pub max_abs_diff: f64,
    /// Its mean difference from the reference.
    #[serde(serialize_with = "crate::floats::float")]
    pub mean_abs_diff: f64,
    /// The largest own error precision explains at an element (`base + 2·honest`).
    #[serde(serialize_with = "crate::floats::float")]
    pub allowed_max_abs_diff: f64,
    /// The mean own error precision explains.
    #[serde(serialize_with = "crate::floats::float")]
    pub allowed_mean_abs_diff: f64,
    /// The target's own error as a multiple of what precision explains: the larger of the
    /// ratios of maxima and of means. Above [`DEFECT_MARGIN`], a defect (unless within
    /// `narrow`'s ideal).
    #[serde(serialize_with = "crate::floats::float")]
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
    /// Where the reference rounds coarser than the grid (a bfloat16 reference of a float16
    /// target), the target's own error measured from the exact value instead (see
    /// [`assess_baseline`]): what the multiple judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_exact: Option<FromExact>,
    /// Where the layer's values are indices (ArgMax, ArgMin), how many of them differ (see
    /// `baseline/index.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub indices: Option<Indices>,
}

/// An index layer's elements against its ideal: the indices of its inputs as the target holds
/// them, picked exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Indices {
    /// How many indices the layer holds.
    pub elements: u64,
    /// How many of the target's differ from the reference's.
    pub differ: u64,
    /// How many of the ideal's differ from the reference's: near ties the rounding of the
    /// inputs broke.
    pub ideal_differ: u64,
    /// How many of the target's differ from both the reference's and the ideal's: its
    /// kernel's own.
    pub off_ideal: u64,
}

/// The target's own error from the exact value on the same inputs (see
/// [`Baseline::from_exact`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FromExact {
    /// Its largest difference from the exact value.
    #[serde(serialize_with = "crate::floats::float")]
    pub max_abs_diff: f64,
    /// Its mean difference from it.
    #[serde(serialize_with = "crate::floats::float")]
    pub mean_abs_diff: f64,
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
            && self.narrow.as_ref().is_some_and(|n| {
                n.multiple <= DEFECT_MARGIN && n.leans_as_rounding() && !n.scattered()
            })
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
    /// Where the framework hands them over, the terms themselves: `terms` rows of the layer's
    /// elements, in the order it holds them (a LayerNorm's weight and bias gradients, one row
    /// per position), which the narrow ideal adds up one by one as such a kernel does.
    pub each: Option<TensorView<'a>>,
}

/// How many times further from the exact value than the target (anywhere in the layer) the
/// reference must be where it exceeds its dtype's tolerance, to be the side that is off.
pub const REFERENCE_OFF_FACTOR: f64 = 4.0;

/// The baseline of one layer: `reference` (`y`), the target's own value `own` (`t`, the layer
/// re-run on the reference's inputs), and `exact` (`x`, the layer in float64 on the
/// reference's inputs rounded to `grid`), judged by [the rule](self). `stages`: intermediate
/// results an honest kernel rounds to `grid`. `expected_values`: the reference is a file of
/// expected values, not a kernel, and is judged against `exact` itself (`reference_off`).
/// `reduction`: the layer's terms where measured, for the narrow-accumulation ideal; on a
/// float32 grid, where accumulating in the grid is what honest kernels do, its allowance is
/// the ideal's (a long reduction in float32, summed in another order: tract's Conv over 4608
/// terms in ResNet-50 against ONNX Runtime's).
/// A layer of indices (ArgMax) is held to its inputs' indices instead (`baseline/index.rs`).
pub fn assess_baseline(
    reference: TensorView<'_>,
    own: TensorView<'_>,
    exact: TensorView<'_>,
    grid: DType,
    stages: u32,
    expected_values: bool,
    reduction: Option<Reduction<'_>>,
) -> Result<Baseline> {
    if reference.dtype.is_float() {
        assess_float(
            reference,
            own,
            exact,
            grid,
            stages,
            expected_values,
            reduction,
        )
    } else {
        index::assess(reference, own, exact, grid)
    }
}

/// [`assess_baseline`] of a float layer.
fn assess_float(
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
    // value as the reference is. Not where the reference rounds coarser (a bfloat16 reference
    // of a float16 target): what it rounds away is its own error, which the ideal's distance
    // from it already counts, and the target's kernel is held to its own grid.
    let same_precision =
        !grid.narrower_than(reference.dtype) && !reference.dtype.narrower_than(grid);
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
        stalls: reduction.and_then(|r| stalls::Stalls::of(grid, r.terms)),
        negligible: rss.as_ref().map_or(0.0, |r| NEGLIGIBLE_TERMS * largest(r)),
    };
    // where the terms themselves were handed over, what adding them one by one errs by
    let one_by_one = reduction
        .filter(|_| grid.narrower_than(DType::F32))
        .and_then(|r| stalls::one_by_one(r.each.as_ref()?, r.terms, n, grid))
        .map(|errors| crate::Tensor::from_f64(DType::F64, &errors));
    let measured = [rss, one_by_one.as_ref().map(|t| t.view())];
    // A reference that rounds coarser than the grid (a bfloat16 reference of a float16
    // target) errs by more than the target's kernel may: its rounding would hide that kernel's
    // error (a float16 sum's rounding) or, counted as the target's, blame it. The target is
    // judged from the exact value on the same inputs instead, as if the reference had computed
    // it exactly.
    let coarser = reference.dtype.narrower_than(grid);
    let from = if coarser { exact } else { reference };
    let s = summed(&rule, grid, [&from, &own, &exact], measured, n);
    let mean = |sum: f64| {
        if s.count == 0 {
            0.0
        } else {
            sum / s.count as f64
        }
    };

    // In float32 (or float64) the kernel that adds the terms one by one in the grid is an
    // honest one (float32 accumulation is what every kernel does): its allowance is the
    // ideal's, not a second ideal to name.
    // Not where most of the own error pushes the elements one way (a kernel that scales its
    // result): that is no accumulation's rounding, whatever its size.
    let systematic = if s.own_sum > 0.0 {
        s.signed_sum / s.own_sum
    } else {
        0.0
    };
    let chance = SYSTEMATIC.max(3.0 / (s.count.max(1) as f64).sqrt());
    let folded =
        reduction.is_some() && !grid.narrower_than(DType::F32) && systematic.abs() <= chance;
    let (allowed_max, allowed_sum) = if folded {
        (s.narrow_max, s.narrow_sum)
    } else {
        (s.allowed_max, s.allowed_sum)
    };
    let (own_mean, allowed_mean) = (mean(s.own_sum), mean(allowed_sum));
    let narrow = reduction.filter(|_| !folded).map(|r| NarrowIdeal {
        terms: r.terms,
        judged: s.narrow_judged,
        elements_beyond: s.narrow_beyond,
        elements: s.count,
        systematic,
        short: if s.sigma_sum > 0.0 {
            (s.shortfall_sum / s.sigma_sum).clamp(0.0, 1.0)
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
        allowed_max_abs_diff: allowed_max,
        allowed_mean_abs_diff: allowed_mean,
        multiple: ratio(s.own_max, allowed_max).max(ratio(own_mean, allowed_mean)),
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
        from_exact: coarser.then(|| FromExact {
            max_abs_diff: s.own_max,
            mean_abs_diff: mean(s.own_sum),
        }),
        indices: None,
    })
}

/// The rule's sums over every element of the reference, the target's own value and the exact
/// one (`sides`), and where measured the reduction's spread (`rss`) and what its terms added
/// one by one err by (`measured`), `n` elements each: block by block in parallel, each
/// block's values read once.
fn summed(
    rule: &Rule,
    grid: DType,
    sides: [&TensorView<'_>; 3],
    measured: [Option<TensorView<'_>>; 2],
    n: usize,
) -> Sums {
    let [reference, own, exact] = sides;
    let [rss, one_by_one] = measured;
    let blocks: Vec<Sums> = (0..n.div_ceil(BLOCK))
        .into_par_iter()
        .map_init(
            // each task decodes into buffers of its own, made once
            || std::array::from_fn::<_, 5, _>(|_| vec![0.0; BLOCK]),
            |buffers, b| {
                let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
                let len = end - start;
                // the reference's and the target's values widened as they are read, where the
                // kernel can
                if let Ok(x) = bytemuck::try_cast_slice::<u8, f64>(span(exact, start, end))
                    && exact.dtype == DType::F64
                    && let Some(Some(sums)) = rule.finite_block_of(
                        grid,
                        (reference.dtype, span(reference, start, end)),
                        (own.dtype, span(own, start, end)),
                        x,
                    )
                {
                    return sums;
                }
                let views = [
                    Some(reference),
                    Some(own),
                    Some(exact),
                    rss.as_ref(),
                    one_by_one.as_ref(),
                ];
                // float64 values are read where they lie (aligned, as a runtime's are), others
                // decoded
                let mut read = buffers.iter_mut().zip(views).map(|(buffer, view)| {
                    let Some(view) = view else {
                        // never written: zeros since it was made
                        return &buffer[..len];
                    };
                    let bytes = span(view, start, end);
                    match bytemuck::try_cast_slice::<u8, f64>(bytes) {
                        Ok(values) if view.dtype == DType::F64 => values,
                        _ => {
                            crate::dtype::decode(view.dtype, bytes, &mut buffer[..len]);
                            &buffer[..len]
                        }
                    }
                });
                let [reference, own, exact, spread, one_by_one] =
                    std::array::from_fn(|_| read.next().unwrap());
                let values = (reference, own, exact, spread, one_by_one);
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
    blocks.into_iter().fold(Sums::default(), Sums::merge)
}

/// The largest absolute finite value of `v`.
fn largest(v: &TensorView<'_>) -> f64 {
    let mut values = vec![0.0; BLOCK.min(v.numel())];
    (0..v.numel()).step_by(BLOCK).fold(0.0, |most, from| {
        let out = &mut values[..BLOCK.min(v.numel() - from)];
        v.decode_into(from, out);
        out.iter()
            .map(|x| x.abs())
            .filter(|x| x.is_finite())
            .fold(most, f64::max)
    })
}

/// Elements `start..end` of `v`, as bytes.
fn span<'v>(v: &TensorView<'v>, start: usize, end: usize) -> &'v [u8] {
    &v.bytes[start * v.dtype.size()..end * v.dtype.size()]
}

/// `own` as a multiple of `allowed`: 0 where there is no error, infinite where none is allowed.
pub(crate) fn ratio(own: f64, allowed: f64) -> f64 {
    if own == 0.0 {
        0.0
    } else if allowed > 0.0 {
        own / allowed
    } else {
        f64::INFINITY
    }
}

#[cfg(test)]
mod tests;
