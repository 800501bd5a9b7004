//! The decision for a layer the target quantizes: held to the ideal quantized computation on
//! the target's own inputs.

use super::{Cause, Evidence, Finding, Layer};
/// The verdict of a layer the target quantizes, its own error measured on the target's own
/// inputs against the ideal quantized computation (see `crate::assess_quantized`): a range
/// that clips much of what the model computes, a kernel its quantization does not explain, or
/// the quantization's own rounding.
pub(super) fn quantized(
    layer: &Layer,
    grid: &crate::Quantization,
    b: Option<&crate::Baseline>,
    e: &Evidence,
) -> (Cause, String, Finding) {
    let own = layer
        .local
        .as_ref()
        .map_or((0.0, 0.0), |s| (s.max_abs_diff, s.mean_abs_diff));
    let clipped = || grid.clips("this layer");
    let Some(b) = b else {
        // no ideal to hold the kernel to: the range and the steps still speak
        let why = layer
            .baseline_reason
            .as_deref()
            .unwrap_or("no ideal was computed");
        let numbers = format!(
            "its own error on the target's own inputs is up to {:.3e} (mean {:.3e}, {:.2} steps root mean square; rounding alone is 0.29)",
            own.0, own.1, grid.rms_steps
        );
        if grid.too_narrow() {
            return (
                Cause::QuantizationRange,
                format!("{} ({numbers})", clipped()),
                Finding::Defect,
            );
        }
        return (
            Cause::PrecisionLoss,
            format!(
                "the target quantizes this layer to {}; {numbers}; it is not held to an ideal quantized computation ({why}), so a kernel defect inside it cannot be ruled out",
                grid.describe()
            ),
            Finding::Precision,
        );
    };
    let numbers = format!(
        "on the target's own inputs the target errs by up to {:.3e} (mean {:.3e}, {:.2} steps root mean square; rounding alone is 0.29), an honest {g} kernel may by up to {:.3e} (mean {:.3e}), the ideal {g} computation does by {:.3e} (mean {:.3e})",
        own.0,
        own.1,
        grid.rms_steps,
        b.allowed_max_abs_diff,
        b.allowed_mean_abs_diff,
        b.max_abs_diff,
        b.mean_abs_diff,
        g = grid.dtype
    );
    if grid.too_narrow() {
        return (
            Cause::QuantizationRange,
            format!("{} ({numbers})", clipped()),
            Finding::Defect,
        );
    }
    if b.beyond() {
        return (
            Cause::OpImplementation,
            format!(
                "its own error is {:.1}× what quantization to {} explains ({numbers}): the target's {} computes differently",
                b.multiple,
                grid.describe(),
                e.ops_words()
            ),
            Finding::Defect,
        );
    }
    let how = e
        .precision
        .as_deref()
        .map_or(String::new(), |how| format!(" ({how})"));
    (
        Cause::PrecisionLoss,
        format!(
            "the target quantizes this layer to {}{how}; its own error is {:.2}× what the quantization explains ({numbers})",
            grid.describe(),
            b.multiple
        ),
        Finding::Precision,
    )
}
