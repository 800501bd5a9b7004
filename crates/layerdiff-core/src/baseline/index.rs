//! The same-precision baseline of a layer whose values are indices (ArgMax, ArgMin): no
//! rounding of its own, so an honest kernel picks exactly the indices of its inputs as the
//! target holds them. Where rounding those inputs to the grid breaks a near tie (two logits a
//! float16 step apart), the ideal implementation picks another index than the reference, and
//! the target may do the same; an index the ideal does not pick is the kernel's own (a tie
//! broken the other way, another axis).

use super::{Baseline, Indices};
use crate::{DType, Error, Result, TensorView};

/// The target's indices `own` against `exact` (the same op computed exactly on the inputs as
/// the target holds them, on `grid`) and the reference's. The multiple is 0 where the target
/// picks the reference's every index, 1 where each that differs is the ideal's, and infinite
/// where any is neither the reference's nor the ideal's.
pub(super) fn assess(
    reference: TensorView<'_>,
    own: TensorView<'_>,
    exact: TensorView<'_>,
    grid: DType,
) -> Result<Baseline> {
    let n = reference.numel();
    for other in [&own, &exact] {
        if other.numel() != n {
            return Err(Error::ShapeMismatch {
                reference: reference.shape.to_vec(),
                target: other.shape.to_vec(),
            });
        }
        if other.dtype.is_float() {
            return Err(Error::UnsupportedDType(format!(
                "{} indices against {} ones",
                other.dtype.name(),
                reference.dtype.name()
            )));
        }
    }
    let (mut own_off, mut ideal_off, mut beyond) = (0u64, 0u64, 0u64);
    let (mut max, mut sum) = (0.0f64, 0.0f64);
    for i in 0..n {
        let (y, t, x) = (reference.get_f64(i), own.get_f64(i), exact.get_f64(i));
        own_off += u64::from(t != y);
        ideal_off += u64::from(x != y);
        beyond += u64::from(t != x && t != y);
        max = max.max((x - y).abs());
        sum += (x - y).abs();
    }
    let mean = if n == 0 { 0.0 } else { sum / n as f64 };
    let multiple = match (beyond, own_off) {
        (0, 0) => 0.0,
        (0, _) => 1.0,
        _ => f64::INFINITY,
    };
    Ok(Baseline {
        grid: grid.name().to_string(),
        stages: 0,
        max_abs_diff: max,
        mean_abs_diff: mean,
        allowed_max_abs_diff: max,
        allowed_mean_abs_diff: mean,
        multiple,
        overflow: 0,
        reference_off: 0,
        narrow: None,
        from_exact: None,
        indices: Some(Indices {
            elements: n as u64,
            differ: own_off,
            ideal_differ: ideal_off,
            off_ideal: beyond,
        }),
    })
}
