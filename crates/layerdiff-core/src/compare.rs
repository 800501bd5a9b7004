//! The comparison kernel: one pass over a pair of tensors yields every statistic of the report.
//!
//! Definitions (also in docs/metrics.md). Both sides are widened to f64. A position is *compared*
//! unless either side is NaN; positions where exactly one side is NaN are counted in
//! `nan_mismatch`, positions where both are NaN agree. For compared positions
//! `d = |target - reference|`, with `d = 0` when both are the same infinity.
//!
//! - `max_abs_diff`, `mean_abs_diff`, `rms_diff`: max, mean and root mean square of `d`.
//! - `max_rel_diff`: max of `d / max(|reference|, |target|)` over positions where both sides are
//!   finite and not both zero (0 when both are zero). Symmetric, and at most 2.
//! - `cosine`: `Σ r·t / (‖r‖ ‖t‖)` over positions where both sides are finite; 1 when both norms
//!   are zero, 0 when exactly one is.
//! - `abs_diff_above[x]`: number of compared positions with `d > x`, for x in [`THRESHOLDS`].
//! - `worst`: the compared position with the largest `d` (the lowest flat index on ties).
//!
//! Determinism: sums are accumulated per fixed block of [`BLOCK`] elements, in [`LANES`]
//! interleaved f64 lanes (element `k` of a block goes to lane `k % LANES`), lanes combined by a
//! fixed pairwise tree, blocks added in order. Work is split across threads by block, so the
//! result is bit-identical for any thread count.

/// `$kernel::<R, T>($args)` for the reader types (`F32`, `F16`, `BF16`, `F64`, in scope where
/// it expands) of a pair of dtypes, `$other` for any other dtype: the one dispatch of the
/// vector kernels.
#[cfg(target_arch = "x86_64")]
macro_rules! by_dtypes {
    ($r:expr, $t:expr, $other:expr, $kernel:ident($($arg:expr),*)) => {
        match $r {
            DType::F32 => by_dtypes!(@target F32, $t, $other, $kernel($($arg),*)),
            DType::F16 => by_dtypes!(@target F16, $t, $other, $kernel($($arg),*)),
            DType::BF16 => by_dtypes!(@target BF16, $t, $other, $kernel($($arg),*)),
            DType::F64 => by_dtypes!(@target F64, $t, $other, $kernel($($arg),*)),
            _ => $other,
        }
    };
    (@target $R:ty, $t:expr, $other:expr, $kernel:ident($($arg:expr),*)) => {
        match $t {
            DType::F32 => $kernel::<$R, F32>($($arg),*),
            DType::F16 => $kernel::<$R, F16>($($arg),*),
            DType::BF16 => $kernel::<$R, BF16>($($arg),*),
            DType::F64 => $kernel::<$R, F64>($($arg),*),
            _ => $other,
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
mod block;
mod dispatch;
#[cfg(test)]
mod properties;
#[cfg(target_arch = "x86_64")]
pub(crate) mod reader;
mod rounding;
#[cfg(test)]
mod tests;

#[cfg(target_arch = "x86_64")]
use block::{Outcome, element};
use dispatch::block_stats;
pub(crate) use dispatch::largest_difference;
use rounding::{HISTOGRAM, Prepared, Tally};
pub use rounding::{Judge, PERCENTILE_RESOLUTION, Rounding};

use rayon::prelude::*;
use serde::Serialize;

use crate::{Error, Result, TensorView};

/// Elements per block: the unit of parallel work and of deterministic summation.
pub const BLOCK: usize = 4096;
/// Interleaved accumulators per block.
pub const LANES: usize = 8;
/// Elements decoded and reduced at a time inside a block: small enough that both sides and
/// their differences stay in L1 cache.
pub(super) const SUB: usize = 128;

/// Lanes combined by the fixed pairwise tree.
#[inline(always)]
pub(super) fn tree(l: &[f64; LANES]) -> f64 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// The thresholds of `abs_diff_above`, with the labels used in JSON.
pub const THRESHOLDS: [(f64, &str); 10] = [
    (0.0, "0"),
    (1e-6, "1e-6"),
    (1e-5, "1e-5"),
    (1e-4, "1e-4"),
    (1e-3, "1e-3"),
    (1e-2, "1e-2"),
    (1e-1, "1e-1"),
    (1.0, "1"),
    (10.0, "10"),
    (100.0, "100"),
];

/// The statistics of one tensor pair. Field order is the JSON key order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Number of elements of each side.
    pub elements: u64,
    /// Positions where neither side is NaN.
    pub compared: u64,
    /// Max of `|target - reference|`.
    #[serde(serialize_with = "crate::floats::float")]
    pub max_abs_diff: f64,
    /// Mean of `|target - reference|` over compared positions.
    #[serde(serialize_with = "crate::floats::float")]
    pub mean_abs_diff: f64,
    /// Max relative difference (denominator `max(|reference|, |target|)`).
    #[serde(serialize_with = "crate::floats::float")]
    pub max_rel_diff: f64,
    /// Root mean square of the difference.
    #[serde(serialize_with = "crate::floats::float")]
    pub rms_diff: f64,
    /// Cosine similarity of the two sides as vectors.
    #[serde(serialize_with = "crate::floats::float")]
    pub cosine: f64,
    /// Counts of compared positions whose abs diff exceeds each threshold.
    #[serde(serialize_with = "serialize_thresholds")]
    pub abs_diff_above: [u64; THRESHOLDS.len()],
    /// NaN count, reference side.
    pub nan_reference: u64,
    /// NaN count, target side.
    pub nan_target: u64,
    /// ±Inf count, reference side.
    pub inf_reference: u64,
    /// ±Inf count, target side.
    pub inf_target: u64,
    /// Positions where exactly one side is NaN.
    pub nan_mismatch: u64,
    /// Positions where the reference holds a mask's sentinel (float32's extreme) and a target
    /// in a narrower dtype its own extreme, of the same sign: compared as equal (see
    /// [`crate::compare_pair`]). Written only when there are some.
    #[serde(skip_serializing_if = "is_zero")]
    pub sentinels: u64,
    /// The position of the largest difference.
    pub worst: Option<Worst>,
    /// The differences against rounding and the layer's bound, element by element (set when
    /// the comparison is judged, see [`compare_judged`]).
    pub rounding: Option<Rounding>,
}

impl Stats {
    /// Whether a judged comparison found every element within the judge's bound, NaN where the
    /// reference has NaN (false for one not judged): what [`within`] asks.
    pub fn judged_within(&self) -> bool {
        self.nan_mismatch == 0
            && self
                .rounding
                .as_ref()
                .is_some_and(|r| r.beyond_tolerance == 0)
    }

    /// `figure`, one of its differences (`max_abs_diff`, `mean_abs_diff`, `max_rel_diff`), over
    /// every position: infinite where one side is NaN and the other is not, the positions the
    /// figure leaves out. What a headline of the output says: an output all NaN on the target
    /// differs by no finite amount, not by 0.
    pub fn counting_nan(&self, figure: f64) -> f64 {
        if self.nan_mismatch > 0 {
            f64::INFINITY
        } else {
            figure
        }
    }

    /// How many of its values are ±Inf or NaN on the target where the reference's are not (an
    /// overflow, or what a later op makes of one: a LayerNorm of ±Inf is NaN).
    pub fn nonfinite_target(&self) -> u64 {
        (self.inf_target + self.nan_target).saturating_sub(self.inf_reference + self.nan_reference)
    }

    /// The difference as a multiple of the layer's bound (above 1: exceeding): infinite where a
    /// side has NaN or ±Inf the other has not (what no multiple of a bound allows, though the
    /// finite elements may agree); `None` where the comparison was not judged against a bound.
    pub fn tolerance_multiple(&self) -> Option<f64> {
        let r = self.rounding.as_ref()?.tolerance_needed;
        if self.nan_mismatch > 0 || self.inf_target != self.inf_reference {
            return Some(f64::INFINITY);
        }
        (!r.is_nan()).then_some(r)
    }
}

/// The worst element of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Worst {
    /// Flat (C-order) index.
    pub index: u64,
    /// Multi-dimensional index.
    pub position: Vec<usize>,
    /// Reference value.
    #[serde(serialize_with = "crate::floats::float")]
    pub reference: f64,
    /// Target value.
    #[serde(serialize_with = "crate::floats::float")]
    pub target: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn serialize_thresholds<S: serde::Serializer>(
    counts: &[u64; THRESHOLDS.len()],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(counts.len()))?;
    for ((_, label), count) in THRESHOLDS.iter().zip(counts) {
        map.serialize_entry(label, count)?;
    }
    map.end()
}

/// Partial results of one block.
#[derive(Clone)]
struct Partial {
    compared: u64,
    sum_abs: f64,
    sum_sq: f64,
    dot: f64,
    norm_r: f64,
    norm_t: f64,
    max_abs: f64,
    max_rel: f64,
    above: [u64; THRESHOLDS.len()],
    nan_r: u64,
    nan_t: u64,
    inf_r: u64,
    inf_t: u64,
    nan_mismatch: u64,
    /// (d, flat index, reference, target) of the block's worst compared element.
    worst: Option<(f64, u64, f64, f64)>,
    /// The judged elements (zero when the comparison is not judged).
    judged: Tally,
}

/// What a block is judged with: the judge, and the histogram its differences are counted in.
type Judging<'a> = Option<(&'a Prepared, &'a mut [u32])>;

/// Blocks one histogram of u32 counts may take (fewer than 2^32 elements).
const FOLD_BLOCKS: usize = (u32::MAX as usize) / BLOCK;

/// Compares `target` against `reference` element by element (shapes must hold the same count;
/// dtypes may differ). See the module docs for every definition.
pub fn compare(reference: TensorView<'_>, target: TensorView<'_>) -> Result<Stats> {
    compare_judged(reference, target, None)
}

/// Whether every element of `got` is within `bound` of `reference` (`numpy.allclose` by the
/// rule every judgement here keeps: the same shape, an element beyond when its difference is
/// strictly greater than the bound at the reference's value, NaN where the reference has
/// NaN): the one check of "is this run clean" that every verb and search asks.
pub fn within(reference: TensorView<'_>, got: TensorView<'_>, bound: crate::Bound) -> bool {
    if reference.shape != got.shape {
        return false;
    }
    let grid = if reference.dtype.is_float() {
        reference.dtype
    } else {
        crate::DType::F64
    };
    compare_judged(reference, got, Some(Judge { grid, bound })).is_ok_and(|s| s.judged_within())
}

/// [`compare`], and with a judge each element measured in the same pass against the judge's
/// rounding grid and bound ([`Stats::rounding`]).
pub fn compare_judged(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    judge: Option<Judge>,
) -> Result<Stats> {
    let n = reference.numel();
    if n != target.numel() {
        return Err(Error::ShapeMismatch {
            reference: reference.shape.to_vec(),
            target: target.shape.to_vec(),
        });
    }
    let blocks = n.div_ceil(BLOCK);
    let prepared = judge.map(Judge::prepare);
    let prepared = prepared.as_ref();
    // Each block's partial written in its own slot (no vectors gathered and joined), one
    // histogram per piece of work.
    let mut partials = vec![Partial::empty(); blocks];
    let histogram = partials
        .par_iter_mut()
        .enumerate()
        .with_min_len(8)
        .with_max_len(FOLD_BLOCKS)
        .fold(
            || prepared.map(|_| vec![0u32; HISTOGRAM]),
            |mut histogram, (b, slot)| {
                let judging = prepared.zip(histogram.as_deref_mut());
                *slot = block_stats(reference, target, b, judging);
                histogram
            },
        )
        .map(|histogram| histogram.map(|h| h.into_iter().map(u64::from).collect::<Vec<_>>()))
        .reduce(
            || None,
            |a, b| match (a, b) {
                (Some(mut a), Some(b)) => {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                    Some(a)
                }
                (h, None) | (None, h) => h,
            },
        );

    // Sums added in block order, whichever thread computed each block.
    let mut total = Partial::empty();
    for p in &partials {
        total.merge(p);
    }
    let compared = total.compared;
    let mean = |s: f64| {
        if compared == 0 {
            0.0
        } else {
            s / compared as f64
        }
    };
    let worst = total.worst.map(|(_, index, r, t)| Worst {
        index,
        position: unravel(index as usize, reference.shape),
        reference: r,
        target: t,
    });
    Ok(Stats {
        elements: n as u64,
        compared,
        max_abs_diff: total.max_abs,
        mean_abs_diff: mean(total.sum_abs),
        max_rel_diff: total.max_rel,
        rms_diff: mean(total.sum_sq).sqrt(),
        cosine: cosine(total.dot, total.norm_r, total.norm_t),
        abs_diff_above: total.above,
        nan_reference: total.nan_r,
        nan_target: total.nan_t,
        inf_reference: total.inf_r,
        inf_target: total.inf_t,
        nan_mismatch: total.nan_mismatch,
        sentinels: 0,
        worst,
        rounding: judge.zip(histogram).map(|(judge, histogram)| {
            total
                .judged
                .rounding(judge.grid, compared, total.max_abs, &histogram)
        }),
    })
}

fn cosine(dot: f64, norm_r: f64, norm_t: f64) -> f64 {
    match (norm_r == 0.0, norm_t == 0.0) {
        (true, true) => 1.0,
        (true, false) | (false, true) => 0.0,
        _ => (dot / (norm_r.sqrt() * norm_t.sqrt())).clamp(-1.0, 1.0),
    }
}

fn unravel(mut index: usize, shape: &[usize]) -> Vec<usize> {
    let mut position = vec![0; shape.len()];
    for (p, &dim) in position.iter_mut().zip(shape).rev() {
        if dim > 0 {
            *p = index % dim;
            index /= dim;
        }
    }
    position
}
