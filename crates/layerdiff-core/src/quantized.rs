//! Layers a target computes on a quantized grid (TFLite's full-integer int8): the grid of one
//! value (scale, zero point, integer range), and the layer's own error judged as quantization.
//!
//! A target that runs its model whole (it cannot re-run one layer on the reference's values)
//! hands over, for each layer, two values computed exactly (float64) on the target's *own*
//! values of its inputs: `x` with the reference's weights, and `w` with the weights the target
//! stores (dequantized). The layer's own error is `|t − x|`, `t` the target's value. An honest
//! integer kernel accumulates exactly and rounds once to the output's grid, so `t` is the
//! **ideal** `q(w) = s·(clamp(round(w/s) + z) − z)` to within a step (fixed-point
//! requantization rounds a half step either way at worst):
//!
//! - `base = |q(w) − x|`: the weights' quantization, the grid's own rounding (at most half a
//!   step) and, where `w` lies outside the grid's range, its clipping;
//! - the own error `|t − x|` is explained by quantization up to `base + QUANTIZED_MAX_STEPS`
//!   steps at every element, and on average up to `mean(base) + QUANTIZED_MEAN_STEPS` steps;
//! - the **multiple** is the larger of the two ratios, as for [`crate::Baseline`]: above 1,
//!   the kernel computes something its quantization does not explain.
//!
//! TFLite's own quantization debugger ranks layers by the same measure (the error's root mean
//! square in steps, about 1/√12 ≈ 0.29 for rounding alone); here it is held to the ideal
//! quantized computation on the same inputs rather than to a fixed number.
//!
//! A grid whose range clips much of the reference's values of a layer ([`SATURATION_LIMIT`] of
//! them) is a calibration defect even though the kernel is honest: the range the converter
//! chose for this value is too narrow for what the model computes here. It is counted on the
//! reference's values, not the target's inputs: values pushed out of range by a defect
//! upstream are that defect's, not this range's.

use serde::Serialize;

use crate::{Baseline, TensorView};

/// Steps an honest integer kernel may be off from the ideal at any element, beyond the
/// ideal's own rounding and clipping.
pub const QUANTIZED_MAX_STEPS: f64 = 2.0;
/// Steps it may be off on average.
pub const QUANTIZED_MEAN_STEPS: f64 = 0.5;
/// The fraction of a layer's exact values outside its grid's range from which the range is
/// too narrow (a calibration defect), not occasional clipping of outliers.
pub const SATURATION_LIMIT: f64 = 0.01;
/// The values a range must clip, whatever their share, before it is too narrow: a percentile
/// or entropy calibration clips an outlier or two by design, which in a small value (a
/// classifier's 32 features) is already several percent of it.
pub const SATURATION_MIN: u64 = 4;

/// The grid of one quantized value: `real = scale · (q − zero_point)`, `q` an integer in
/// `qmin..=qmax`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Quantization {
    /// The integer type (`int8`, `uint8`, `int16`).
    pub dtype: String,
    /// One step.
    #[serde(serialize_with = "crate::floats::float")]
    pub scale: f64,
    /// The integer that stands for zero.
    pub zero_point: i64,
    /// The smallest integer.
    pub qmin: i64,
    /// The largest integer.
    pub qmax: i64,
    /// Elements whose reference value lies outside the range the grid can hold (clipped, for
    /// what the model computes), once measured.
    pub saturated: u64,
    /// Elements measured.
    pub elements: u64,
    /// The own error's root mean square in steps, once measured (TFLite's debugger's
    /// `rmse/scale`).
    #[serde(serialize_with = "crate::floats::float")]
    pub rms_steps: f64,
}

impl Quantization {
    /// The grid of an integer `dtype` with `scale` and `zero_point`.
    pub fn new(dtype: &str, scale: f64, zero_point: i64) -> Result<Self, String> {
        let (qmin, qmax) = match dtype {
            "int8" => (-128, 127),
            "uint8" => (0, 255),
            "int16" => (-32768, 32767),
            _ => return Err(format!("`{dtype}` is not a quantized integer type")),
        };
        if !(scale.is_finite() && scale > 0.0) {
            return Err(format!("a quantization scale must be > 0, got {scale}"));
        }
        Ok(Self {
            dtype: dtype.to_string(),
            scale,
            zero_point,
            qmin,
            qmax,
            saturated: 0,
            elements: 0,
            rms_steps: 0.0,
        })
    }

    /// The grid's value nearest `x`: rounded to a step, clipped to the range.
    pub fn ideal(&self, x: f64) -> f64 {
        let q = ((x / self.scale).round() + self.zero_point as f64)
            .clamp(self.qmin as f64, self.qmax as f64);
        (q - self.zero_point as f64) * self.scale
    }

    /// The smallest and largest values the grid holds.
    pub fn range(&self) -> (f64, f64) {
        let real = |q: i64| (q - self.zero_point) as f64 * self.scale;
        (real(self.qmin), real(self.qmax))
    }

    /// Whether so many exact values lie outside the range that it is too narrow.
    pub fn too_narrow(&self) -> bool {
        self.saturated >= SATURATION_MIN
            && self.saturated as f64 > SATURATION_LIMIT * self.elements as f64
    }

    /// Counts the elements of `reference` (what the model computes here) that lie outside
    /// the grid's range by more than half a step: the values it clips. A range that starts
    /// at zero clips only above: it stands for a Relu the quantizer removed (ONNX Runtime's
    /// drops a Relu or Clip whose output it quantizes, its QuantizeLinear clamping at zero
    /// instead), so what lies below it is the Relu's to clip, not the range's.
    pub fn count_outside(&mut self, reference: TensorView<'_>) {
        let (lo, hi) = self.range();
        let half = self.scale / 2.0;
        let below = if lo == 0.0 {
            f64::NEG_INFINITY
        } else {
            lo - half
        };
        let n = reference.numel();
        self.saturated = (0..n)
            .map(|i| reference.get_f64(i))
            .filter(|v| v.is_finite() && (*v < below || *v > hi + half))
            .count() as u64;
        self.elements = n as u64;
    }

    /// What the grid clips of the reference's values of `what`, in words.
    pub fn clips(&self, what: &str) -> String {
        format!(
            "{} of the reference's {} values of {what} ({:.1}%) lie outside the range of its grid {}: the range calibrated for this value is too narrow for what the model computes here, and the target clips them",
            self.saturated,
            self.elements,
            100.0 * self.saturated as f64 / self.elements.max(1) as f64,
            self.describe()
        )
    }

    /// The grid in words: `int8 (scale 1.9e-2, zero point 0, range [-2.5, 2.5])`.
    pub fn describe(&self) -> String {
        let (lo, hi) = self.range();
        format!(
            "{} (scale {:.3e}, zero point {}, range [{lo:.4}, {hi:.4}])",
            self.dtype, self.scale, self.zero_point
        )
    }
}

/// The own error of a quantized layer: the target's value `target` (`t`, dequantized) against
/// `exact` (`x`, the layer in float64 on the target's own inputs with the reference's
/// weights), judged by the rule in the module docs with `ideal` (`w`, the same with the
/// weights the target stores, before rounding): `base = |q(w) − x|`; the grid's clipping is
/// counted on `reference` (the reference's value of the layer). Fills in `grid`'s measured
/// fields and returns the judgment as a [`Baseline`] whose grid is the integer type.
pub fn assess_quantized(
    target: TensorView<'_>,
    exact: TensorView<'_>,
    ideal: TensorView<'_>,
    reference: TensorView<'_>,
    grid: &mut Quantization,
) -> Result<Baseline, String> {
    let n = target.numel();
    let others = [
        ("exact", &exact),
        ("ideal", &ideal),
        ("reference's", &reference),
    ];
    for (what, other) in others {
        if other.numel() != n {
            return Err(format!(
                "the {what} value has {} elements, the target's {n}",
                other.numel()
            ));
        }
    }
    let (mut t, mut x, mut w) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    crate::dtype::decode(target.dtype, target.bytes, &mut t);
    crate::dtype::decode(exact.dtype, exact.bytes, &mut x);
    crate::dtype::decode(ideal.dtype, ideal.bytes, &mut w);
    let step = grid.scale;
    let (mut base_max, mut base_sum, mut own_max, mut own_sum, mut own_sq) =
        (0.0f64, 0.0, 0.0f64, 0.0, 0.0);
    grid.count_outside(reference);
    let saturated = grid.saturated;
    for ((&t, &x), &w) in t.iter().zip(&x).zip(&w) {
        if !(t.is_finite() && x.is_finite() && w.is_finite()) {
            continue;
        }
        let base = (grid.ideal(w) - x).abs();
        let own = (t - x).abs();
        base_max = base_max.max(base);
        base_sum += base;
        own_max = own_max.max(own);
        own_sum += own;
        own_sq += own * own;
    }
    let count = n.max(1) as f64;
    let allowed_max = base_max + QUANTIZED_MAX_STEPS * step;
    let allowed_mean = base_sum / count + QUANTIZED_MEAN_STEPS * step;
    grid.rms_steps = (own_sq / count).sqrt() / step;
    Ok(Baseline {
        grid: grid.dtype.clone(),
        stages: 0,
        max_abs_diff: base_max,
        mean_abs_diff: base_sum / count,
        allowed_max_abs_diff: allowed_max,
        allowed_mean_abs_diff: allowed_mean,
        multiple: (own_max / allowed_max).max(own_sum / count / allowed_mean),
        overflow: saturated,
        reference_off: 0,
        narrow: None,
        from_exact: None,
        indices: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Tensor};

    fn tensor(values: &[f64]) -> Tensor {
        Tensor::from_f64(DType::F32, values)
    }

    fn judged(x: &[f64], t: &[f64], grid: &mut Quantization) -> Baseline {
        let x = tensor(x);
        assess_quantized(tensor(t).view(), x.view(), x.view(), x.view(), grid).unwrap()
    }

    #[test]
    fn a_kernel_that_rounds_to_its_grid_is_quantization_and_one_off_by_steps_is_not() {
        let mut grid = Quantization::new("int8", 0.1, 0).unwrap();
        let x: Vec<f64> = (0..200).map(|i| (i as f64 - 100.0) * 0.037).collect();
        let honest: Vec<f64> = x.iter().map(|&v| grid.ideal(v)).collect();
        let b = judged(&x, &honest, &mut grid);
        assert!(!b.beyond(), "{b:?}");
        assert!(
            grid.rms_steps > 0.2 && grid.rms_steps < 0.35,
            "{}",
            grid.rms_steps
        );
        assert_eq!(grid.saturated, 0);
        // every element three steps off: a kernel computing something else
        let off: Vec<f64> = honest.iter().map(|v| v + 0.3).collect();
        assert!(judged(&x, &off, &mut grid).beyond());
        // a 5% scale error (a wrong weight scale) on values up to 3.7 is many steps
        let scaled: Vec<f64> = x.iter().map(|&v| grid.ideal(v * 1.05)).collect();
        assert!(judged(&x, &scaled, &mut grid).beyond());
    }

    #[test]
    fn clipping_is_explained_by_the_grid_and_counted_and_a_narrow_range_is_told() {
        // range [-12.8, 12.7]: a few outliers clip, the kernel is honest
        let mut grid = Quantization::new("int8", 0.1, 0).unwrap();
        let mut x: Vec<f64> = (0..1000).map(|i| ((i % 50) as f64 - 25.0) * 0.1).collect();
        x[3] = 40.0;
        let t: Vec<f64> = x.iter().map(|&v| grid.ideal(v)).collect();
        let b = judged(&x, &t, &mut grid);
        assert!(!b.beyond(), "{b:?}");
        assert_eq!(grid.saturated, 1);
        assert!(!grid.too_narrow());
        // a scale ten times too small clips most values: the kernel is honest, the range not
        let mut narrow = Quantization::new("int8", 0.01, 0).unwrap();
        let t: Vec<f64> = x.iter().map(|&v| narrow.ideal(v)).collect();
        assert!(!judged(&x, &t, &mut narrow).beyond());
        assert!(narrow.too_narrow(), "{narrow:?}");
    }

    #[test]
    fn a_range_that_starts_at_zero_clips_only_above_as_the_relu_it_stands_for() {
        // int8 with zero point -128: [0, 2.55]; the values below zero are a removed Relu's
        let values: Vec<f64> = (0..100).map(|i| (i as f64 - 50.0) * 0.1).collect();
        let x = tensor(&values);
        let mut relu = Quantization::new("int8", 0.01, -128).unwrap();
        relu.count_outside(x.view());
        assert_eq!((relu.saturated, relu.elements), (24, 100)); // 2.6 to 4.9
        // a range around zero clips both ends
        let mut signed = Quantization::new("int8", 0.01, 0).unwrap();
        signed.count_outside(x.view());
        assert_eq!(signed.saturated, 38 + 37); // below -1.28 and above 1.27
    }

    #[test]
    fn a_grid_that_cannot_be_is_refused() {
        assert!(Quantization::new("float8", 0.1, 0).is_err());
        assert!(Quantization::new("int8", 0.0, 0).is_err());
        let g = Quantization::new("uint8", 0.5, 128).unwrap();
        assert_eq!(g.range(), (-64.0, 63.5));
        assert_eq!(g.ideal(1000.0), 63.5);
    }
}
