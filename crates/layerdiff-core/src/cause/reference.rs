//! A reference whose runtime does not compute as its file says (OpenVINO at its bfloat16
//! inference precision given as the reference): the values the target is measured against
//! carry the reference's own rounding. A layer within what its precision explains is then
//! rounding on the reference's grid, shared or the reference's alone, and is said so: never
//! the target's precision loss against a float32 reference that was not one.

use super::{Cause, DType, Evidence, Finding, Layer};
/// The cause of a layer within what its precision explains, where the reference lowers the
/// layer's math to a narrower grid (`target`: the grid the target computes it on, where it
/// lowers it too); `None` where the reference computes as its file says.
pub(super) fn rounding_shared(
    layer: &Layer,
    e: &Evidence,
    target: Option<DType>,
    explained: &str,
) -> Option<(Cause, String, Finding)> {
    let (grid, how) = e.reference_lowered.as_ref()?;
    Some(match target {
        Some(t) if t == *grid => (
            Cause::Rounding,
            format!("both sides compute this layer in {t} (the reference: {how}); {explained}"),
            Finding::Precision,
        ),
        Some(t) => (
            Cause::PrecisionLoss,
            format!(
                "the target computes this layer in {t}, the reference in {grid} ({how}); {explained}"
            ),
            Finding::Precision,
        ),
        None => (
            Cause::Rounding,
            format!(
                "the reference computes this layer in {grid} ({how}), the target in {}: the \
                 target is measured against values that carry the reference's rounding; \
                 {explained}",
                layer.dtype
            ),
            Finding::Precision,
        ),
    })
}
