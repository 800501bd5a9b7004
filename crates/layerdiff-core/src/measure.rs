//! How a layer's finding shows when a piece of the model that computes it runs again (a repro,
//! a check of one): by the layer's tolerance, or, where the finding rests on what its precision
//! explains while its error stays within its tolerance (a weight edited among small values, a
//! kernel that approximates), by the honest kernel's allowance its baseline measured. The same
//! decision the report made, so a repro is claimed exactly where the report found something.

use crate::{Bound, Layer, Result, TensorView, WITHIN_TOLERANCE_MARGIN, compare};

/// What a re-run of a layer is held to (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Measure {
    /// The layer's tolerance: the difference shows where an element is beyond it.
    Tolerance(Bound),
    /// What an honest kernel in `grid` may err by on the same inputs, at the largest element
    /// and on average: the difference shows beyond `margin` times that.
    Allowance {
        /// The dtype the honest kernel computes in.
        grid: String,
        /// Its largest error at an element.
        max: f64,
        /// Its mean error.
        mean: f64,
        /// How many times that the difference must reach to show.
        margin: f64,
    },
}

impl Measure {
    /// What `layer`'s finding is measured by: its allowance where its own error is beyond what
    /// its precision explains and within its tolerance, else its tolerance.
    pub fn of(layer: &Layer) -> Self {
        match &layer.baseline {
            Some(b) if layer.own_beyond() && !layer.own_exceeds() && b.reference_off == 0 => {
                Self::Allowance {
                    grid: b.grid.clone(),
                    max: b.allowed_max_abs_diff,
                    mean: b.allowed_mean_abs_diff,
                    margin: WITHIN_TOLERANCE_MARGIN,
                }
            }
            _ => Self::Tolerance(layer.tolerance),
        }
    }

    /// How far `got` is from `expected` by this measure: its multiple (of the tolerance, or of
    /// the allowance: the larger of the maxima's and the means' ratios) and its largest
    /// difference, unbounded where one side is NaN and the other is not
    /// ([`crate::Stats::counting_nan`]: a repro whose output is NaN differs, not by 0).
    pub fn judge(&self, expected: TensorView<'_>, got: TensorView<'_>) -> Result<(f64, f64)> {
        match self {
            Self::Tolerance(bound) => {
                let grid = if got.dtype.narrower_than(expected.dtype) {
                    got.dtype
                } else {
                    expected.dtype
                };
                let judge = crate::Judge {
                    grid,
                    bound: *bound,
                };
                let stats = crate::compare_judged(expected, got, Some(judge))?;
                Ok((
                    stats.tolerance_multiple().unwrap_or(0.0),
                    stats.counting_nan(stats.max_abs_diff),
                ))
            }
            Self::Allowance { max, mean, .. } => {
                let stats = compare(expected, got)?;
                let ratio = crate::baseline::ratio;
                let multiple = if stats.nonfinite_target() > 0 || stats.nan_mismatch > 0 {
                    f64::INFINITY
                } else {
                    ratio(stats.max_abs_diff, *max).max(ratio(stats.mean_abs_diff, *mean))
                };
                Ok((multiple, stats.counting_nan(stats.max_abs_diff)))
            }
        }
    }

    /// Whether a difference of `multiple` (from [`Measure::judge`]) shows the finding.
    pub fn shows(&self, multiple: f64) -> bool {
        match self {
            Self::Tolerance(_) => multiple > 1.0,
            Self::Allowance { margin, .. } => multiple > *margin,
        }
    }

    /// What a multiple is of, in words (`the tolerance 1e-4 + 1e-5·|x|`, `what float32 explains
    /// (an honest kernel: up to 1.1e-7, mean 1.9e-8)`).
    pub fn words(&self) -> String {
        match self {
            Self::Tolerance(bound) => format!("the tolerance {bound}"),
            Self::Allowance {
                grid, max, mean, ..
            } => format!(
                "what {grid} explains (an honest {grid} kernel on the same inputs: up to {max:.3e}, mean {mean:.3e})"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Tensor};

    #[test]
    fn a_finding_within_its_tolerance_shows_by_its_allowance_and_one_beyond_by_its_tolerance() {
        let mut layer = Layer::new(0, "l", vec![4], "float32");
        layer.status = crate::LayerStatus::Compared;
        layer.tolerance = Bound {
            atol: 1e-4,
            rtol: 1e-5,
        };
        let expected = Tensor::from_f64(DType::F32, &[1.0, 0.5, -0.25, 0.125]);
        let got = Tensor::from_f64(DType::F32, &[1.0 + 2e-6, 0.5, -0.25, 0.125]);
        // no baseline: the tolerance, which 2e-6 is within
        let measure = Measure::of(&layer);
        let (multiple, d) = measure.judge(expected.view(), got.view()).unwrap();
        assert!(
            !measure.shows(multiple) && (d - 2e-6).abs() < 1e-7,
            "{multiple}"
        );
        // a baseline far beyond, the layer within its tolerance: its allowance, 2e-6 shows
        let mut b = crate::Baseline {
            grid: "float32".into(),
            stages: 0,
            max_abs_diff: 6e-8,
            mean_abs_diff: 1e-8,
            allowed_max_abs_diff: 2e-7,
            allowed_mean_abs_diff: 4e-8,
            multiple: 12.5,
            overflow: 0,
            reference_off: 0,
            narrow: None,
            from_exact: None,
            indices: None,
        };
        layer.local = crate::compare(expected.view(), got.view()).ok();
        layer.baseline = Some(b.clone());
        let measure = Measure::of(&layer);
        assert!(matches!(measure, Measure::Allowance { .. }), "{measure:?}");
        let (multiple, _) = measure.judge(expected.view(), got.view()).unwrap();
        assert!(
            measure.shows(multiple) && (multiple - 12.5).abs() < 0.5,
            "{multiple}"
        );
        assert!(measure.words().starts_with("what float32 explains"));
        // within what precision explains: its tolerance again
        b.multiple = 0.5;
        layer.baseline = Some(b);
        assert!(matches!(Measure::of(&layer), Measure::Tolerance(_)));
    }

    #[test]
    fn a_repro_whose_output_is_nan_where_the_expected_is_a_number_differs_without_bound() {
        let mut layer = Layer::new(0, "l", vec![3], "float32");
        layer.status = crate::LayerStatus::Compared;
        layer.tolerance = Bound {
            atol: 1e-4,
            rtol: 1e-5,
        };
        let expected = Tensor::from_f64(DType::F32, &[1.0, 0.5, -0.25]);
        let got = Tensor::from_f64(DType::F32, &[f64::NAN, f64::NAN, f64::NAN]);
        let measure = Measure::of(&layer);
        let (multiple, d) = measure.judge(expected.view(), got.view()).unwrap();
        // no position compares: the figure covers nothing, and is no proof of agreement
        assert!(measure.shows(multiple), "{multiple}");
        assert_eq!(d, f64::INFINITY);
        // NaN on both sides alike is no difference
        let (multiple, d) = measure.judge(got.view(), got.view()).unwrap();
        assert!(!measure.shows(multiple) && d == 0.0, "{multiple} {d}");
    }
}
