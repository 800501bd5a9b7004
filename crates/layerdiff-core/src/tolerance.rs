//! Tolerances: which difference counts as drift, decided per layer.
//!
//! Three policies. `per_dtype` (the default) takes the tolerance of the lower-precision side's
//! dtype from [`default_for`]: a float16 layer is held to float16 rounding, not float32's.
//! `fixed` holds every layer to one number. `auto` derives each layer's tolerance from the
//! float64 truth: [`AUTO_FACTOR`] times the reference's own distance from float64 at that
//! layer, so the target may be a few times as far from the truth as the reference is.

use serde::Serialize;

use crate::DType;

/// `auto`: the multiple of the reference's own float64 error a target may differ by.
pub const AUTO_FACTOR: f64 = 4.0;
/// `auto`: the least tolerance, as a fraction of the dtype default (a layer computed exactly
/// by the reference, like a max-pool, would otherwise tolerate nothing).
pub const AUTO_FLOOR: f64 = 0.01;

/// The default absolute tolerance for values of a dtype: float64 1e-9, float32 1e-4,
/// float16 1e-2, bfloat16 5e-2; integers and bool must agree exactly.
pub fn default_for(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2,
        _ => 0.0,
    }
}

/// How each layer's tolerance is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Tolerance {
    /// The default of the lower-precision side's dtype ([`default_for`]).
    #[default]
    PerDtype,
    /// One absolute tolerance for every layer.
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
    #[serde(serialize_with = "crate::render::float_opt")]
    pub abs: Option<f64>,
    /// The multiple of `auto`.
    #[serde(serialize_with = "crate::render::float_opt")]
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

    /// The tolerance of one layer: its sides' dtype names, and the reference's max abs
    /// distance from float64 when known.
    pub fn for_layer(&self, dtype: &str, target_dtype: Option<&str>, float64: Option<f64>) -> f64 {
        let lower = lower_precision(dtype, target_dtype);
        let by_dtype = lower.map_or(0.0, default_for);
        match *self {
            Self::Fixed(v) => v,
            Self::PerDtype => by_dtype,
            Self::Auto => match float64 {
                Some(d) => (AUTO_FACTOR * d).max(AUTO_FLOOR * by_dtype),
                None => by_dtype,
            },
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
            _ => "per dtype (float32 1e-4, float16 1e-2, bfloat16 5e-2)".to_string(),
        }
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
        assert_eq!(t.for_layer("float32", None, None), 1e-4);
        assert_eq!(t.for_layer("float32", Some("float16"), None), 1e-2);
        assert_eq!(t.for_layer("bfloat16", Some("float32"), None), 5e-2);
        assert_eq!(t.for_layer("int64", None, None), 0.0);
        assert_eq!(
            Tolerance::Fixed(3e-3).for_layer("float16", None, None),
            3e-3
        );
        assert!((Tolerance::Auto.for_layer("float32", None, Some(1e-5)) - 4e-5).abs() < 1e-18);
        assert!((Tolerance::Auto.for_layer("float32", None, Some(0.0)) - 1e-6).abs() < 1e-18);
        assert_eq!(Tolerance::Auto.for_layer("float32", None, None), 1e-4);
        assert_eq!(Tolerance::parse("auto"), Ok(Tolerance::Auto));
        assert_eq!(Tolerance::parse("1e-3"), Ok(Tolerance::Fixed(1e-3)));
        assert!(Tolerance::parse("-1").unwrap_err().contains("≥ 0"));
    }
}
