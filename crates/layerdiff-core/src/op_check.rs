//! The verdict on one op computed by one backend in one dtype (`layerdiff ops`): measured
//! against a float64 computation of the same op on the same rounded inputs, with the error the
//! dtype and the op's reduction length predict.
//!
//! The rule, element by element, for an output `y` (the float64 truth) and a cell's value `ŷ`
//! ([`crate::kernel_allowance`], the same rule every layer's baseline uses):
//!
//! ```text
//! |ŷ − y| ≤ n·step_d(y) + (stages·u_d + (max(⌈log2 K⌉, 1) + n)·u_acc)·M  [+ the smallest normal of d
//!                                                                    where |y| is below it]
//! ```
//!
//! - `step_d(y)`: one step of the cell's dtype at `|y|` (its ULP), `n` [`OUTPUT_STEPS`] of them:
//!   rounding the result once to the dtype, and a few steps of slack in float32 for the
//!   approximations vectorized math libraries make;
//! - `u_d`: the dtype's unit roundoff (2^-11 for float16, 2^-8 for bfloat16, 2^-24 for float32),
//!   once for each intermediate result the op's usual decomposition rounds to the dtype
//!   (`stages`: 0 for one kernel such as a matmul or a softmax, 2 for attention exported as
//!   MatMul → Softmax → MatMul);
//! - `n·u_acc·M`: the float32 work inside an elementwise kernel, as many steps as the output
//!   is allowed;
//! - below the dtype's normal range a kernel may flush to zero (FTZ): such a value carries less
//!   than the dtype's precision anyway.
//! - `u_acc`: float32's unit roundoff. Every mainstream kernel accumulates float16 and bfloat16
//!   in float32; a pairwise or blocked float32 sum of `K` terms is off by at most
//!   `⌈log2 K⌉·u_acc·Σ|terms|` (a sequential one stays well inside on data of mixed signs), so a
//!   reduction done in float16 fails, while a float16 matmul rounding its float32 sum passes;
//! - `M`: the magnitude the error scales with, computed by the caller in float64: the op applied
//!   to the inputs' absolute values for ops linear in them (matmul, convolution, sums: `Σ|terms|`),
//!   `|y|` for ops with a relative error, larger where the op cancels (GELU's `1 + erf`).
//!
//! Where the truth rounds to an infinity in the dtype (float16's exp(12)), the cell must give that
//! infinity; where it is NaN, NaN. Integer and bool outputs (argmax) must be exact.

use serde::{Deserialize, Serialize};

use crate::dtype::pow2;
use crate::{DType, Error, Result, TensorView, accumulation_unit, kernel_allowance, output_steps};

/// How the bound of a cell was made: the terms of [the rule](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpBound {
    /// Steps of the dtype allowed on every element (`n`).
    pub output_steps: f64,
    /// Intermediate results rounded to the dtype (`stages`).
    pub stages: u32,
    /// The dtype's unit roundoff (`u_d`).
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub unit_roundoff: f64,
    /// Terms reduced into one output element (`K`).
    pub reduction: usize,
    /// The accumulation's unit roundoff (`u_acc`).
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub accumulation_unit: f64,
}

/// The element furthest outside (or least inside) its bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpWorst {
    /// Flat index, C order.
    pub index: usize,
    /// The float64 truth.
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub expected: f64,
    /// The cell's value.
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub got: f64,
    /// The bound at that element.
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub bound: f64,
}

/// The numbers of one cell and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpCheck {
    /// Every element within its bound.
    pub passed: bool,
    /// Elements compared.
    pub elements: usize,
    /// Elements outside their bound.
    pub outside: usize,
    /// Largest `|ŷ − y|` over finite pairs.
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub max_abs_diff: f64,
    /// Mean `|ŷ − y|` over finite pairs.
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub mean_abs_diff: f64,
    /// Largest difference in steps of the dtype at the truth.
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub max_ulps: f64,
    /// Mean difference in steps of the dtype at the truth.
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub mean_ulps: f64,
    /// The largest `|ŷ − y| / bound`: at most 1 passes; how far inside or outside.
    #[serde(
        serialize_with = "crate::floats::float",
        deserialize_with = "crate::floats::float_from"
    )]
    pub ratio: f64,
    /// The element that sets `ratio`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst: Option<OpWorst>,
    /// The rule's terms (absent for integer outputs, which must be exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound: Option<OpBound>,
}

/// Judges `got` against the float64 `truth` of the same op on the same rounded inputs, with the
/// magnitudes `magnitude` (one per element, or empty for `|y|`), `reduction` terms per output
/// element and `stages` intermediate roundings: [the rule](self).
pub fn check_op(
    got: &TensorView<'_>,
    truth: &[f64],
    magnitude: &[f64],
    reduction: usize,
    stages: u32,
) -> Result<OpCheck> {
    check_op_in(got, truth, magnitude, reduction, stages, got.dtype)
}

/// [`check_op`] of a backend that computes the op in `dtype`, narrower than the dtype it
/// hands the values back in (OpenVINO's bfloat16 inference precision, float32 out): judged
/// by `dtype`'s rule, the truth computed on inputs on `dtype`'s grid.
pub fn check_op_in(
    got: &TensorView<'_>,
    truth: &[f64],
    magnitude: &[f64],
    reduction: usize,
    stages: u32,
    dtype: DType,
) -> Result<OpCheck> {
    let n = got.numel();
    for len in [
        truth.len(),
        if magnitude.is_empty() {
            n
        } else {
            magnitude.len()
        },
    ] {
        if len != n {
            return Err(Error::ShapeMismatch {
                reference: vec![len],
                target: got.shape.to_vec(),
            });
        }
    }
    let mut values = vec![0.0; n];
    crate::dtype::decode(got.dtype, got.bytes, &mut values);
    let terms = dtype.mantissa_bits().map(|bits| OpBound {
        output_steps: output_steps(dtype),
        stages,
        unit_roundoff: pow2(-(bits as i32)),
        reduction,
        accumulation_unit: accumulation_unit(dtype),
    });
    // A value computed in `dtype` and handed back in a narrower-ranged or coarser-stepped
    // dtype (bfloat16 held in float16) is rounded twice: the second rounding is the held
    // dtype's, half a step of it at the value, and its range is the held one's.
    let held = (got.dtype != dtype && got.dtype.is_float()).then_some(got.dtype);
    let (mut sum_abs, mut sum_ulps, mut finite) = (0.0, 0.0, 0usize);
    let (mut max_abs, mut max_ulps, mut outside) = (0.0f64, 0.0f64, 0usize);
    let mut worst: Option<(f64, OpWorst)> = None;
    for (i, (&y, &v)) in truth.iter().zip(&values).enumerate() {
        let (diff, bound) = match &terms {
            None => ((v - y).abs(), 0.0),
            Some(t) => {
                let expected = held.map_or(dtype.round(y), |h| h.round(dtype.round(y)));
                if y.is_nan() || expected.is_infinite() {
                    let same = (y.is_nan() && v.is_nan()) || v == expected;
                    (if same { 0.0 } else { f64::INFINITY }, 0.0)
                } else if !v.is_finite() {
                    (f64::INFINITY, 0.0)
                } else {
                    let m = magnitude.get(i).map_or(y.abs(), |m| m.abs());
                    let again = held.map_or(0.0, |h| 0.5 * h.step(y.abs()));
                    (
                        (v - y).abs(),
                        kernel_allowance(dtype, y, m, reduction, t.stages) + again,
                    )
                }
            }
        };
        if diff.is_finite() {
            finite += 1;
            sum_abs += diff;
            max_abs = max_abs.max(diff);
            let ulps = if terms.is_some() {
                diff / dtype.step(y.abs())
            } else {
                diff
            };
            sum_ulps += ulps;
            max_ulps = max_ulps.max(ulps);
        } else {
            max_abs = f64::INFINITY;
            max_ulps = f64::INFINITY;
        }
        let ratio = if diff == 0.0 {
            0.0
        } else if bound > 0.0 {
            diff / bound
        } else {
            f64::INFINITY
        };
        if ratio > 1.0 {
            outside += 1;
        }
        if worst.as_ref().is_none_or(|(r, _)| ratio > *r) {
            worst = Some((
                ratio,
                OpWorst {
                    index: i,
                    expected: y,
                    got: v,
                    bound,
                },
            ));
        }
    }
    let mean = |sum: f64| {
        if finite == 0 {
            0.0
        } else {
            sum / finite as f64
        }
    };
    let ratio = worst.as_ref().map_or(0.0, |(r, _)| *r);
    Ok(OpCheck {
        passed: outside == 0,
        elements: n,
        outside,
        max_abs_diff: max_abs,
        mean_abs_diff: mean(sum_abs),
        max_ulps,
        mean_ulps: mean(sum_ulps),
        ratio,
        worst: worst.filter(|(r, _)| *r > 0.0).map(|(_, w)| w),
        bound: terms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    fn tensor(dtype: DType, values: &[f64]) -> Tensor {
        Tensor::from_f64(dtype, values)
    }

    #[test]
    fn a_float16_result_rounded_once_passes_and_a_step_beyond_fails() {
        // 16.0 has float16 steps of 2^-6; 16.01 rounds to 16.0.
        let truth = [16.01];
        let rounded = tensor(DType::F16, &[16.0]);
        let check = check_op(&rounded.view(), &truth, &[], 1, 0).unwrap();
        assert!(check.passed, "{check:?}");
        assert!(check.max_ulps < 1.0);
        let two_steps = tensor(DType::F16, &[16.0 + 2.0 / 64.0]);
        let check = check_op(&two_steps.view(), &truth, &[], 1, 0).unwrap();
        assert!(!check.passed);
        assert!(check.ratio > 1.0 && check.max_ulps > 1.0, "{check:?}");
        assert_eq!(check.worst.as_ref().unwrap().index, 0);
    }

    #[test]
    fn a_bfloat16_computation_held_in_float16_is_judged_with_both_roundings() {
        // Computed in bfloat16, then held in float16 (OpenVINO's bf16 inference precision on
        // a float16 model): a tiny value lands on float16's coarse subnormal grid, and one past
        // float16's range is its infinity, as any float16 kernel's would be.
        let tiny = 1.2345e-7;
        let held = DType::F16.round(DType::BF16.round(tiny));
        let got = tensor(DType::F16, &[held]);
        let check = check_op_in(&got.view(), &[tiny], &[], 1, 0, DType::BF16).unwrap();
        assert!(check.passed, "{check:?}");
        let past = 70000.0;
        let inf = tensor(DType::F16, &[f64::INFINITY]);
        let check = check_op_in(&inf.view(), &[past], &[], 1, 0, DType::BF16).unwrap();
        assert!(check.passed, "{check:?}");
        // and a value off by a bfloat16 step at an ordinary magnitude still fails
        let off = tensor(DType::F16, &[DType::F16.round(1.0 + 4.0 / 128.0)]);
        assert!(
            !check_op_in(&off.view(), &[1.0], &[], 1, 0, DType::BF16)
                .unwrap()
                .passed
        );
    }

    #[test]
    fn a_long_reduction_is_allowed_float32_accumulation_error_in_proportion_to_its_terms() {
        // A sum of 2^20 terms of total magnitude 1e6: a pairwise float32 sum may be off by
        // 20 · 2^-24 · 1e6 ≈ 1.2; an error of 300 (a float16 accumulator) is not.
        let truth = [1000.0];
        let magnitude = [1e6];
        let close = tensor(DType::F32, &[1000.5]);
        assert!(
            check_op(&close.view(), &truth, &magnitude, 1 << 20, 0)
                .unwrap()
                .passed
        );
        let far = tensor(DType::F32, &[1300.0]);
        let check = check_op(&far.view(), &truth, &magnitude, 1 << 20, 0).unwrap();
        assert!(!check.passed);
        assert_eq!(check.bound.unwrap().reduction, 1 << 20);
    }

    #[test]
    fn stages_allow_a_rounding_of_the_dtype_per_intermediate() {
        let truth = [1.0];
        let got = tensor(DType::F16, &[1.0 + 4.0 / 1024.0]); // four steps of float16 at 1
        assert!(!check_op(&got.view(), &truth, &[1.0], 1, 0).unwrap().passed);
        assert!(check_op(&got.view(), &truth, &[1.0], 1, 8).unwrap().passed);
    }

    #[test]
    fn overflow_to_the_dtype_s_infinity_is_right_and_nan_must_match() {
        let truth = [162754.79, f64::NAN, 1.0];
        let got = tensor(DType::F16, &[f64::INFINITY, f64::NAN, 1.0]);
        assert!(check_op(&got.view(), &truth, &[], 1, 0).unwrap().passed);
        let got = tensor(DType::F16, &[65504.0, 0.0, 1.0]);
        let check = check_op(&got.view(), &truth, &[], 1, 0).unwrap();
        assert_eq!(check.outside, 2);
        let got = tensor(DType::F32, &[f64::INFINITY, f64::NAN, 1.0]);
        assert!(!check_op(&got.view(), &truth, &[], 1, 0).unwrap().passed);
    }

    #[test]
    fn values_below_the_normal_range_may_be_flushed_to_zero() {
        let truth = [8.3e-39, 3e-5];
        let got = tensor(DType::F32, &[0.0, 3e-5]);
        assert!(check_op(&got.view(), &truth, &[], 1, 0).unwrap().passed);
        let got = tensor(DType::F16, &[3e-5, 0.0]); // 3e-5 is below float16's normal range
        assert!(
            check_op(&got.view(), &[3e-5, 3e-5], &[], 1, 0)
                .unwrap()
                .passed
        );
        let got = tensor(DType::F32, &[0.0]);
        assert!(!check_op(&got.view(), &[7e-9], &[], 1, 0).unwrap().passed);
    }

    #[test]
    fn integer_outputs_must_be_exact() {
        let truth = [3.0, 7.0];
        let got = tensor(DType::I64, &[3.0, 7.0]);
        let check = check_op(&got.view(), &truth, &[], 1, 0).unwrap();
        assert!(check.passed && check.bound.is_none());
        let got = tensor(DType::I64, &[3.0, 6.0]);
        assert!(!check_op(&got.view(), &truth, &[], 1, 0).unwrap().passed);
    }

    #[test]
    fn empty_outputs_pass_and_mismatched_lengths_are_errors() {
        let got = tensor(DType::F32, &[]);
        let check = check_op(&got.view(), &[], &[], 1, 0).unwrap();
        assert!(check.passed && check.elements == 0 && check.worst.is_none());
        let got = tensor(DType::F32, &[1.0]);
        assert!(check_op(&got.view(), &[1.0, 2.0], &[], 1, 0).is_err());
    }

    #[test]
    fn the_op_matrix_and_the_per_layer_baseline_hold_a_kernel_to_the_same_allowance() {
        // One rule, one home: the op matrix's bound at an element is `kernel_allowance`, and a
        // layer's baseline allows its ideal's own error plus twice that same allowance.
        let x = 1.0 + 3.0 / 4096.0; // between two float16 steps
        let got = tensor(DType::F16, &[x]);
        let check = check_op(&got.view(), &[x], &[x], 1, 0).unwrap();
        let allowance = kernel_allowance(DType::F16, x, x, 1, 0);
        assert_eq!(check.worst.as_ref().unwrap().bound, allowance);

        let (reference, exact) = (tensor(DType::F32, &[x]), tensor(DType::F64, &[x]));
        let b = crate::assess_baseline(
            reference.view(),
            got.view(),
            exact.view(),
            DType::F16,
            0,
            false,
            None,
        )
        .unwrap();
        let base = (DType::F16.round(x) - x).abs();
        assert_eq!(
            b.allowed_max_abs_diff,
            base + crate::HONEST_FACTOR * allowance
        );
    }
}
