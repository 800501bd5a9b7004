//! Comparing one aligned pair of values, including the cases where their shapes or dtypes differ.

use crate::{Judge, LayerStatus, Stats, TensorView, compare_judged};

/// The outcome of comparing one aligned pair of values.
#[derive(Debug, Clone, PartialEq)]
pub struct PairOutcome {
    /// Compared, or a shape mismatch.
    pub status: LayerStatus,
    /// Statistics when compared.
    pub stats: Option<Stats>,
    /// The target's shape, when it differs from the reference's.
    pub target_shape: Option<Vec<usize>>,
    /// The target's dtype name, when it differs from the reference's.
    pub target_dtype: Option<String>,
}

/// Compares a pair. Shapes that agree once size-1 dimensions are dropped (`[1, 512, 1, 1]` vs
/// `[1, 512]`) are compared element by element; any other disagreement is a shape mismatch.
/// Different dtypes are compared on their values (both widened), and the difference is recorded.
/// With a judge, each element is also measured against its rounding and bound
/// ([`crate::compare_judged`]).
pub fn compare_pair(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    judge: Option<Judge>,
) -> PairOutcome {
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    let target_shape = (reference.shape != target.shape).then(|| target.shape.to_vec());
    let target_dtype = (reference.dtype != target.dtype).then(|| target.dtype.name().to_string());
    let same_shape = squeeze(reference.shape) == squeeze(target.shape);
    match compare_judged(reference, target, judge) {
        Ok(stats) if same_shape => PairOutcome {
            status: LayerStatus::Compared,
            stats: Some(stats),
            target_shape,
            target_dtype,
        },
        _ => PairOutcome {
            status: LayerStatus::ShapeMismatch,
            stats: None,
            target_shape,
            target_dtype,
        },
    }
}
