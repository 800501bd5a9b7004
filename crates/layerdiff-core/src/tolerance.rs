//! Tolerances: which difference counts as drift, decided per layer and judged per element.
//!
//! A layer's tolerance is a [`Bound`]: an element passes when `|target - reference| <= atol +
//! rtol·|reference|` (as `torch.testing.assert_close` judges), so the rounding of a dtype is
//! measured at each value's own magnitude. Three policies. `per_dtype` (the default) takes the
//! bound of the lower-precision side's dtype from [`default_for`]: a float16 layer is held to
//! float16 rounding, not float32's. `fixed` holds every element to one absolute number. `auto`
//! derives each layer's bound from the float64 truth: [`AUTO_FACTOR`] times the reference's own
//! distance from float64 at that layer, so the target may be a few times as far from the truth
//! as the reference is.

use serde::Serialize;

use crate::DType;

/// `auto`: the multiple of the reference's own float64 error a target may differ by.
pub const AUTO_FACTOR: f64 = 4.0;
/// `auto`: the least tolerance, as a fraction of the dtype default (a layer computed exactly
/// by the reference, like a max-pool, would otherwise tolerate nothing).
pub const AUTO_FLOOR: f64 = 0.01;

/// A layer's tolerance: an element passes when `|target - reference| <= atol +
/// rtol·|reference|`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Bound {
    /// The absolute term.
    #[serde(serialize_with = "crate::floats::float")]
    pub atol: f64,
    /// The term relative to the reference value's magnitude.
    #[serde(serialize_with = "crate::floats::float")]
    pub rtol: f64,
}

impl Bound {
    /// An absolute bound only.
    pub const fn absolute(atol: f64) -> Self {
        Self { atol, rtol: 0.0 }
    }

    /// The largest difference allowed at a reference value of magnitude `magnitude`.
    pub fn at(&self, magnitude: f64) -> f64 {
        self.atol + self.rtol * magnitude
    }
}

/// `1e-4` for an absolute bound; `1e-4 + 1e-5·|x|` with a relative term.
impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.rtol == 0.0 {
            write!(f, "{:e}", self.atol)
        } else {
            write!(f, "{:e} + {:e}·|x|", self.atol, self.rtol)
        }
    }
}

/// The default bound for values of a dtype. The relative term is about one step of the dtype
/// at the value's own magnitude for float16 and bfloat16, and room for float32 kernels that sum
/// in another order; the absolute term is the rounding of a value near 1 (float16, bfloat16)
/// or a float32 kernel's error over a long reduction. So one float16 step at |x| ≈ 300 passes
/// while a 1e-3 error on a float16 value near 1e-2 does not. Integers and bool agree exactly.
pub fn default_for(dtype: DType) -> Bound {
    let (atol, rtol) = match dtype {
        DType::F64 => (1e-9, 1e-9),
        DType::F32 => (1e-4, 1e-5),
        DType::F16 => (5e-4, 1e-3),
        DType::BF16 => (4e-3, 8e-3),
        _ => (0.0, 0.0),
    };
    Bound { atol, rtol }
}

/// The default bounds in words, for reports and help.
pub const DEFAULTS_TEXT: &str =
    "float32 1e-4 + 1e-5·|x|, float16 5e-4 + 1e-3·|x|, bfloat16 4e-3 + 8e-3·|x|";

/// How each layer's tolerance is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Tolerance {
    /// The bound of the lower-precision side's dtype ([`default_for`]).
    #[default]
    PerDtype,
    /// One absolute tolerance for every element.
    Fixed(f64),
    /// Derived from the float64 truth ([`AUTO_FACTOR`]); per dtype where there is none.
    Auto,
}

/// The spelling [`Tolerance::parse`] reads back.
impl std::fmt::Display for Tolerance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PerDtype => f.write_str("dtype"),
            Self::Fixed(v) => write!(f, "{v:e}"),
            Self::Auto => f.write_str("auto"),
        }
    }
}

/// The policy as written into reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToleranceInfo {
    /// `per_dtype`, `fixed` or `auto`.
    pub policy: &'static str,
    /// The one tolerance of `fixed`.
    #[serde(serialize_with = "crate::floats::float_opt")]
    pub abs: Option<f64>,
    /// The multiple of `auto`.
    #[serde(serialize_with = "crate::floats::float_opt")]
    pub factor: Option<f64>,
}

impl Tolerance {
    /// Parses `--tolerance`: a number ≥ 0, `auto`, or `dtype`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            "dtype" | "per_dtype" => Ok(Self::PerDtype),
            _ => match text.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(Self::Fixed(v)),
                _ => Err(format!(
                    "tolerance must be a number ≥ 0, `auto` or `dtype`, got `{text}`"
                )),
            },
        }
    }

    /// The bound of one layer: its sides' dtype names, and the reference's max abs distance
    /// from float64 when known.
    pub fn for_layer(
        &self,
        dtype: &str,
        target_dtype: Option<&str>,
        float64: Option<f64>,
    ) -> Bound {
        let lower = lower_precision(dtype, target_dtype);
        let by_dtype = lower.map_or(Bound::default(), default_for);
        match *self {
            Self::Fixed(v) => Bound::absolute(v),
            Self::PerDtype => by_dtype,
            Self::Auto => match float64 {
                Some(d) => Bound::absolute((AUTO_FACTOR * d).max(AUTO_FLOOR * by_dtype.atol)),
                None => by_dtype,
            },
        }
    }

    /// The bound of a layer as [`Tolerance::for_layer`], or, where the target quantizes its
    /// value to `grid`, one step of it at every element (the grid's own rounding is half one)
    /// unless a fixed tolerance was asked for.
    pub fn for_layer_on(
        &self,
        dtype: &str,
        target_dtype: Option<&str>,
        float64: Option<f64>,
        grid: Option<&crate::Quantization>,
    ) -> Bound {
        match (self, grid) {
            (Self::PerDtype | Self::Auto, Some(grid)) => Bound::absolute(grid.scale),
            _ => self.for_layer(dtype, target_dtype, float64),
        }
    }

    /// What reports say about the policy.
    pub fn info(&self) -> ToleranceInfo {
        match *self {
            Self::PerDtype => ToleranceInfo {
                policy: "per_dtype",
                abs: None,
                factor: None,
            },
            Self::Fixed(v) => ToleranceInfo {
                policy: "fixed",
                abs: Some(v),
                factor: None,
            },
            Self::Auto => ToleranceInfo {
                policy: "auto",
                abs: None,
                factor: Some(AUTO_FACTOR),
            },
        }
    }
}

impl ToleranceInfo {
    /// The policy in words, for summaries and reports.
    pub fn describe(&self) -> String {
        match (self.policy, self.abs, self.factor) {
            ("fixed", Some(abs), _) => format!("{abs:e} on every layer"),
            ("auto", _, Some(f)) => {
                format!("auto ({f}× the reference's own distance from float64, per layer)")
            }
            _ => format!("per dtype, per element ({DEFAULTS_TEXT})"),
        }
    }
}

/// The grid a target's kernel is held to, as far as its value shows: the target's own dtype
/// where both sides are floats, whichever is narrower (a float16 target against a bfloat16
/// reference computes in float16; what the reference rounds away beyond that is the
/// reference's error, which the ideal's distance from it counts); else the lower precision of
/// the two (an integer target quantizes).
pub fn computing_grid(dtype: &str, target_dtype: DType) -> Option<DType> {
    match DType::from_name(dtype) {
        Ok(r) if r.is_float() && target_dtype.is_float() => Some(target_dtype),
        _ => lower_precision(dtype, Some(target_dtype.name())),
    }
}

/// The lower-precision dtype of two sides (the reference's when the target's is unknown).
pub fn lower_precision(dtype: &str, target_dtype: Option<&str>) -> Option<DType> {
    let r = DType::from_name(dtype).ok()?;
    let Some(t) = target_dtype.and_then(|t| DType::from_name(t).ok()) else {
        return Some(r);
    };
    Some(if t.narrower_than(r) || (r.is_float() && !t.is_float()) {
        t
    } else {
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lower_precision_side_decides_and_auto_scales_the_float64_error() {
        let t = Tolerance::PerDtype;
        assert_eq!(t.for_layer("float32", None, None), default_for(DType::F32));
        assert_eq!(
            t.for_layer("float32", Some("float16"), None),
            default_for(DType::F16)
        );
        assert_eq!(
            t.for_layer("bfloat16", Some("float32"), None),
            default_for(DType::BF16)
        );
        assert_eq!(t.for_layer("int64", None, None), Bound::absolute(0.0));
        assert_eq!(
            Tolerance::Fixed(3e-3).for_layer("float16", None, None),
            Bound::absolute(3e-3)
        );
        let auto = |d| Tolerance::Auto.for_layer("float32", None, d);
        assert!((auto(Some(1e-5)).atol - 4e-5).abs() < 1e-18 && auto(Some(1e-5)).rtol == 0.0);
        assert!((auto(Some(0.0)).atol - 1e-6).abs() < 1e-18);
        assert_eq!(auto(None), default_for(DType::F32));
        assert_eq!(Tolerance::parse("auto"), Ok(Tolerance::Auto));
        assert_eq!(Tolerance::parse("1e-3"), Ok(Tolerance::Fixed(1e-3)));
        assert!(Tolerance::parse("-1").unwrap_err().contains("≥ 0"));
    }

    #[test]
    fn a_target_kernel_is_held_to_its_own_float_grid_and_an_integer_one_to_its_codes() {
        // the tolerance between the sides is the coarser side's; the target's kernel computes
        // in its own dtype, also where the reference rounds coarser
        assert_eq!(
            lower_precision("bfloat16", Some("float16")),
            Some(DType::BF16)
        );
        assert_eq!(computing_grid("bfloat16", DType::F16), Some(DType::F16));
        assert_eq!(computing_grid("bfloat16", DType::F32), Some(DType::F32));
        assert_eq!(computing_grid("float32", DType::BF16), Some(DType::BF16));
        assert_eq!(computing_grid("float32", DType::I8), Some(DType::I8));
        assert_eq!(computing_grid("int64", DType::I64), Some(DType::I64));
    }

    #[test]
    fn one_float16_step_at_300_passes_and_1e_3_near_1e_2_does_not() {
        let f16 = default_for(DType::F16);
        assert!(0.25 <= f16.at(300.0), "one float16 step at 300 is rounding");
        assert!(
            1e-3 > f16.at(1e-2),
            "a 1e-3 error on a value near 1e-2 is a finding"
        );
        assert_eq!(f16.to_string(), "5e-4 + 1e-3·|x|");
        assert_eq!(Bound::absolute(1e-4).to_string(), "1e-4");
    }
}
