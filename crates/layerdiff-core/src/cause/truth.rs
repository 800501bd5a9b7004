//! The float64 truth's word on a layer: that the target only rounds ([`truth_rounding`]), or
//! that the truth follows the target, not the reference ([`truth_follows_target`]). The model's
//! float64 copy runs the model's own code, so where that code depends on the dtype (an
//! epsilon, a path for half precision) the copy, and the same-precision baseline computed in
//! float64 on it, take the narrower side's path. Only the truth's distances show it: a
//! reference in the wider dtype far further from float64 than the target, which its finer
//! rounding cannot make.

use super::{DType, Evidence, Layer};
use crate::ROUNDING_FACTOR;

/// The words [`truth_follows_target`] says it in, which the truth's usual word then leaves out.
pub(super) const TRUTH_FOLLOWS_TARGET: &str =
    "the model's float64 copy computes this layer as the target does";

/// Where the reference, in the wider dtype, is far further from the float64 truth than the
/// target in the narrower one (more than [`ROUNDING_FACTOR`] times, and beyond the layer's
/// absolute tolerance), which the finer rounding cannot make: the model's float64 copy
/// computes the layer as the target does (code that branches on the dtype: an epsilon, a
/// path for half precision), so the same-precision baseline, computed in float64 on the same
/// code, cannot stand for the reference. Its words, else `None`. Not where the reference
/// computes on a narrower grid itself (`Evidence::reference_lowered`), nor where the baseline
/// found the reference itself off.
pub(super) fn truth_follows_target(
    layer: &Layer,
    e: &Evidence,
    lower: Option<DType>,
) -> Option<String> {
    let t = lower?;
    let f = layer.float64.as_ref()?;
    let (r, d) = (f.reference, f.target);
    // (a reference the baseline found off from the exact computation on its own inputs is
    // said as that: `against_baseline`)
    if e.reference_lowered.is_some()
        || layer.baseline.as_ref().is_some_and(|b| b.reference_off > 0)
        || !(r.is_finite() && d.is_finite())
        || r <= ROUNDING_FACTOR * d
        || r <= layer.tolerance.atol
    {
        return None;
    }
    let own = layer.local.as_ref().or(layer.accumulated.as_ref());
    Some(format!(
        "the {} reference is {:.0} times as far from float64 as the {t} target (reference {r:.2e}, target {d:.2e}), which its finer rounding cannot make: {TRUTH_FOLLOWS_TARGET}, not as the reference (its code depends on the dtype: an epsilon, a path of its own for half precision), so neither the float64 truth nor the same-precision baseline, computed in float64 on that code, stands for the reference; the target differs from it by up to {:.3e} here",
        layer.dtype,
        r / d.max(f64::MIN_POSITIVE),
        own.map_or(0.0, |s| s.max_abs_diff)
    ))
}

/// The float64 truth's word that the target only rounds, where it says so: the target at most
/// [`ROUNDING_FACTOR`] times as far from it as the reference, or within its dtype's absolute
/// tolerance of it.
pub(super) fn truth_rounding(layer: &Layer) -> Option<String> {
    let f = layer.float64.as_ref()?;
    let within = crate::lower_precision(&layer.dtype, layer.target_dtype.as_deref())
        .map_or(0.0, |d| crate::default_for(d).atol);
    if f.target <= ROUNDING_FACTOR * f.reference && f.reference > 0.0 {
        return Some(f.verdict());
    }
    (f.target <= within).then(|| {
        format!(
            "the target is further from float64 than the reference (target {:.2e}, reference {:.2e}) but within its dtype's rounding of it ({within:e}): rounding, not a bug",
            f.target, f.reference
        )
    })
}
