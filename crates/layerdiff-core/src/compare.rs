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

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod rounding;

use rounding::{HISTOGRAM, Lanes, Prepared, Tally};
pub use rounding::{Judge, PERCENTILE_RESOLUTION, Rounding};

use rayon::prelude::*;
use serde::Serialize;

use crate::{DType, Error, Result, TensorView};

/// Elements per block: the unit of parallel work and of deterministic summation.
pub const BLOCK: usize = 4096;
/// Interleaved accumulators per block.
pub const LANES: usize = 8;
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
    #[serde(serialize_with = "crate::render::float")]
    pub max_abs_diff: f64,
    /// Mean of `|target - reference|` over compared positions.
    #[serde(serialize_with = "crate::render::float")]
    pub mean_abs_diff: f64,
    /// Max relative difference (denominator `max(|reference|, |target|)`).
    #[serde(serialize_with = "crate::render::float")]
    pub max_rel_diff: f64,
    /// Root mean square of the difference.
    #[serde(serialize_with = "crate::render::float")]
    pub rms_diff: f64,
    /// Cosine similarity of the two sides as vectors.
    #[serde(serialize_with = "crate::render::float")]
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
    #[serde(serialize_with = "crate::render::float")]
    pub reference: f64,
    /// Target value.
    #[serde(serialize_with = "crate::render::float")]
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
    let (mut partials, histogram) = (0..blocks)
        .into_par_iter()
        .with_min_len(8)
        .with_max_len(FOLD_BLOCKS)
        .fold(
            || (Vec::new(), prepared.map(|_| vec![0u32; HISTOGRAM])),
            |(mut partials, mut histogram), b| {
                let judging = prepared.zip(histogram.as_deref_mut());
                partials.push((b, block_stats(reference, target, b, judging)));
                (partials, histogram)
            },
        )
        .map(|(partials, histogram)| {
            let widened = histogram.map(|h| h.into_iter().map(u64::from).collect::<Vec<_>>());
            (partials, widened)
        })
        .reduce(
            || (Vec::new(), None),
            |(mut a, ha), (b, hb)| {
                a.extend(b);
                let histogram = match (ha, hb) {
                    (Some(mut ha), Some(hb)) => {
                        ha.iter_mut().zip(hb).for_each(|(x, y)| *x += y);
                        Some(ha)
                    }
                    (h, None) | (None, h) => h,
                };
                (a, histogram)
            },
        );
    // Sums added in block order, whichever thread computed each block.
    partials.sort_unstable_by_key(|(b, _)| *b);

    let mut total = Partial::empty();
    for (_, p) in &partials {
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

/// What an explicit kernel made of a block (returned once per block: its size does not matter).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::large_enum_variant)]
enum Outcome {
    /// Every value finite: the block's statistics (and, judged, its differences counted in the
    /// histogram).
    Done(Partial),
    /// A NaN or an infinity somewhere: the exact path must take the block (the histogram is
    /// untouched).
    NotFinite,
    /// A dtype or a length the kernel does not take.
    Unsupported,
}

/// Element `k` of little-endian `bytes` of `dtype`, widened.
#[cfg(target_arch = "x86_64")]
fn element(dtype: DType, bytes: &[u8], k: usize) -> f64 {
    let size = dtype.size();
    let mut out = [0.0];
    dtype.decode_f64(&bytes[k * size..(k + 1) * size], &mut out);
    out[0]
}

/// One block's statistics, in the best instruction set the CPU has (the arithmetic is the same
/// in each: no fused multiply-add, no reassociation, so every path gives the same bits).
fn block_stats(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    block: usize,
    judging: Judging<'_>,
) -> Partial {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if judging.is_none()
            && has!("avx512f")
            && has!("avx512dq")
            && has!("avx512vl")
            && has!("f16c")
        {
            let start = block * BLOCK;
            let len = BLOCK.min(reference.numel() - start);
            // SAFETY: the CPU has the features, checked just above; views hold `numel` elements.
            let outcome = unsafe {
                avx512::finite_block(
                    (reference.dtype, reference.bytes),
                    (target.dtype, target.bytes),
                    start,
                    len,
                )
            };
            match outcome {
                Outcome::Done(p) => return p,
                Outcome::NotFinite => return exact_block(reference, target, block, None),
                Outcome::Unsupported => {}
            }
        }
        // Judged comparisons, and what the AVX-512 kernel does not take, on any AVX2 CPU.
        if has!("avx2") && has!("f16c") {
            let start = block * BLOCK;
            let len = BLOCK.min(reference.numel() - start);
            let mut judging = judging;
            let judge = judging.as_mut().map(|(j, h)| (*j, &mut **h));
            // SAFETY: the CPU has the features, checked just above; views hold `numel` elements.
            let outcome = unsafe {
                avx2::finite_block(
                    (reference.dtype, reference.bytes),
                    (target.dtype, target.bytes),
                    start,
                    len,
                    judge,
                )
            };
            return match outcome {
                Outcome::Done(p) => p,
                Outcome::NotFinite => exact_block(reference, target, block, judging),
                // SAFETY: the CPU has AVX2 and F16C, checked just above.
                Outcome::Unsupported => unsafe {
                    block_stats_avx2(reference, target, block, judging)
                },
            };
        }
    }
    block_stats_generic(reference, target, block, judging, decode)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn block_stats_avx2(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    block: usize,
    judging: Judging<'_>,
) -> Partial {
    block_stats_generic(reference, target, block, judging, |dtype, bytes, out| {
        if dtype == DType::F16 {
            widen_f16(bytes, out);
        } else {
            decode(dtype, bytes, out);
        }
    })
}

/// Float16 elements widened to f64 by F16C, eight at a time, in the caller's vector code (the
/// `half` crate's conversion is a call per eight elements).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn widen_f16(bytes: &[u8], out: &mut [f64]) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm256_castps256_ps128, _mm256_cvtph_ps, _mm256_cvtps_pd,
        _mm256_extractf128_ps, _mm256_storeu_pd,
    };
    let n = out.len().min(bytes.len() / 2);
    let full = n - n % 8;
    for k in (0..full).step_by(8) {
        // SAFETY: elements k..k + 8 lie within both slices (k + 8 <= full <= n); the loads and
        // stores are unaligned ones.
        unsafe {
            let halves = _mm_loadu_si128(bytes.as_ptr().add(2 * k).cast::<__m128i>());
            let singles = _mm256_cvtph_ps(halves);
            let low = _mm256_cvtps_pd(_mm256_castps256_ps128(singles));
            let high = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(singles));
            _mm256_storeu_pd(out.as_mut_ptr().add(k), low);
            _mm256_storeu_pd(out.as_mut_ptr().add(k + 4), high);
        }
    }
    for k in full..n {
        out[k] = half::f16::from_le_bytes([bytes[2 * k], bytes[2 * k + 1]]).to_f64();
    }
}

/// One block's statistics, its elements widened by `widen(dtype, bytes, out)`.
#[inline(always)]
fn block_stats_generic(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    block: usize,
    mut judging: Judging<'_>,
    widen: impl Fn(DType, &[u8], &mut [f64]),
) -> Partial {
    let start = block * BLOCK;
    let len = BLOCK.min(reference.numel() - start);
    let (rs, ts) = (reference.dtype.size(), target.dtype.size());
    fn span<'a>(v: &TensorView<'a>, size: usize, from: usize, to: usize) -> &'a [u8] {
        &v.bytes[from * size..to * size]
    }
    let judge = judging.as_mut().map(|(j, h)| (*j, &mut **h));
    finite_block(len, start, judge, |from, to, r, t| {
        let (from, to) = (start + from, start + to);
        widen(reference.dtype, span(&reference, rs, from, to), r);
        widen(target.dtype, span(&target, ts, from, to), t);
    })
    .unwrap_or_else(|| exact_block(reference, target, block, judging))
}

/// A block through the exact path (NaN and infinities included).
fn exact_block(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    block: usize,
    judging: Judging<'_>,
) -> Partial {
    let start = block * BLOCK;
    let len = BLOCK.min(reference.numel() - start);
    let (mut r, mut t) = (vec![0.0f64; len], vec![0.0f64; len]);
    let size = (reference.dtype.size(), target.dtype.size());
    let bytes = (
        &reference.bytes[start * size.0..(start + len) * size.0],
        &target.bytes[start * size.1..(start + len) * size.1],
    );
    decode(reference.dtype, bytes.0, &mut r);
    decode(target.dtype, bytes.1, &mut t);
    any_block(&r, &t, start, judging)
}

/// Widens little-endian elements to f64, with loops the compiler vectorizes for the float types.
#[inline(always)]
pub(crate) fn decode(dtype: DType, bytes: &[u8], out: &mut [f64]) {
    #[cfg(target_endian = "little")]
    match dtype {
        DType::F32 => {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = f64::from(v);
                }
                return;
            }
        }
        DType::F16 => {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, half::f16>(bytes) {
                use half::slice::HalfFloatSliceExt;
                values.convert_to_f64_slice(out);
                return;
            }
        }
        DType::BF16 => {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, u16>(bytes) {
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = f64::from(f32::from_bits(u32::from(v) << 16));
                }
                return;
            }
        }
        _ => {}
    }
    dtype.decode_f64(bytes, out);
}

/// Elements decoded and reduced at a time inside a block: small enough that both sides and
/// their differences stay in L1 cache.
const SUB: usize = 256;

/// The common case: every value of both sides finite. Branch-free over lanes, so it vectorizes;
/// `None` when the block holds a NaN or an infinity (then [`any_block`] handles it). Gives the
/// same bits as [`any_block`] on finite data: the same lane order, the same operations.
/// `fill(from, to, r, t)` decodes elements `from..to` of the block into `r` and `t`.
#[inline(always)]
fn finite_block(
    len: usize,
    start: usize,
    mut judging: Judging<'_>,
    mut fill: impl FnMut(usize, usize, &mut [f64], &mut [f64]),
) -> Option<Partial> {
    let (mut r, mut t, mut d) = ([0.0f64; SUB], [0.0f64; SUB], [0.0f64; SUB]);
    let mut sum_abs = [0.0f64; LANES];
    let mut sum_sq = [0.0f64; LANES];
    let mut dot = [0.0f64; LANES];
    let mut norm_r = [0.0f64; LANES];
    let mut norm_t = [0.0f64; LANES];
    let mut max_rel = [0.0f64; LANES];
    let mut above = [0u64; THRESHOLDS.len()];
    let mut worst: Option<(f64, u64, f64, f64)> = None;
    let mut judged = Lanes::default();
    for from in (0..len).step_by(SUB) {
        let n = SUB.min(len - from);
        let (r, t, d) = (&mut r[..n], &mut t[..n], &mut d[..n]);
        fill(from, from + n, r, t);
        let mut max_abs = [0.0f64; LANES];
        let mut finite = [true; LANES];
        let mut lane = |j: usize, a: f64, b: f64, dc: &mut f64| {
            let diff = (b - a).abs();
            *dc = diff;
            sum_abs[j] += diff;
            sum_sq[j] += diff * diff;
            dot[j] += a * b;
            norm_r[j] += a * a;
            norm_t[j] += b * b;
            max_abs[j] = if diff > max_abs[j] { diff } else { max_abs[j] };
            let rel = if diff > 0.0 {
                diff / a.abs().max(b.abs())
            } else {
                0.0
            };
            max_rel[j] = if rel > max_rel[j] { rel } else { max_rel[j] };
            finite[j] &= a.abs() < f64::INFINITY && b.abs() < f64::INFINITY;
        };
        // `from` is a multiple of LANES, so element k of the block still goes to lane k % LANES.
        let full = n - n % LANES;
        for ((dc, rc), tc) in d[..full]
            .chunks_exact_mut(LANES)
            .zip(r.chunks_exact(LANES))
            .zip(t.chunks_exact(LANES))
        {
            for j in 0..LANES {
                lane(j, rc[j], tc[j], &mut dc[j]);
            }
        }
        for k in full..n {
            lane(k - full, r[k], t[k], &mut d[k]);
        }
        if finite.contains(&false) {
            return None;
        }
        if let Some((judge, histogram)) = judging.as_mut() {
            judge.run(r, t, d, &mut judged, histogram);
        }
        let max = max_abs
            .iter()
            .fold(0.0f64, |m, &v| if v > m { v } else { m });
        for (count, &(threshold, _)) in above.iter_mut().zip(&THRESHOLDS) {
            if threshold < max {
                *count += d.iter().map(|&v| u64::from(v > threshold)).sum::<u64>();
            }
        }
        if worst.is_none_or(|(w, ..)| max > w) {
            let k = d.iter().position(|&v| v == max).unwrap_or(0);
            worst = Some((max, (start + from + k) as u64, r[k], t[k]));
        }
    }
    Some(Partial::finite(
        len,
        [&sum_abs, &sum_sq, &dot, &norm_r, &norm_t],
        &max_rel,
        above,
        worst,
        judged.tally(),
    ))
}

/// Lanes combined by the fixed pairwise tree.
#[inline(always)]
fn tree(l: &[f64; LANES]) -> f64 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// Any block, NaN and infinities included, one element at a time.
fn any_block(r: &[f64], t: &[f64], start: usize, mut judging: Judging<'_>) -> Partial {
    let len = r.len();
    let mut p = Partial::empty();
    let mut judged = Lanes::default();
    let mut lanes = [[0.0f64; LANES]; 5]; // sum_abs, sum_sq, dot, norm_r, norm_t
    for k in 0..len {
        let (rv, tv) = (r[k], t[k]);
        let (r_nan, t_nan) = (rv.is_nan(), tv.is_nan());
        p.nan_r += u64::from(r_nan);
        p.nan_t += u64::from(t_nan);
        p.inf_r += u64::from(rv.is_infinite());
        p.inf_t += u64::from(tv.is_infinite());
        if r_nan || t_nan {
            p.nan_mismatch += u64::from(r_nan != t_nan);
            continue;
        }
        p.compared += 1;
        let d = if rv == tv { 0.0 } else { (tv - rv).abs() };
        let lane = k % LANES;
        if let Some((judge, histogram)) = judging.as_mut() {
            histogram[judge.element(rv, tv, d, lane, &mut judged) as usize] += 1;
        }
        lanes[0][lane] += d;
        lanes[1][lane] += d * d;
        if rv.is_finite() && tv.is_finite() {
            lanes[2][lane] += rv * tv;
            lanes[3][lane] += rv * rv;
            lanes[4][lane] += tv * tv;
            if d > 0.0 {
                let rel = d / rv.abs().max(tv.abs());
                if rel > p.max_rel {
                    p.max_rel = rel;
                }
            }
        }
        for (count, (threshold, _)) in p.above.iter_mut().zip(THRESHOLDS) {
            *count += u64::from(d > threshold);
        }
        if p.worst.is_none_or(|(w, ..)| d > w) {
            p.worst = Some((d, (start + k) as u64, rv, tv));
        }
    }
    p.sum_abs = tree(&lanes[0]);
    p.sum_sq = tree(&lanes[1]);
    p.dot = tree(&lanes[2]);
    p.norm_r = tree(&lanes[3]);
    p.norm_t = tree(&lanes[4]);
    p.max_abs = p.worst.map_or(0.0, |(d, ..)| d);
    p.judged = judged.tally();
    p
}

impl Partial {
    /// A block of `len` values, all finite, from its lane sums (`sum_abs`, `sum_sq`, `dot`,
    /// `norm_r`, `norm_t`), its lanes' largest relative differences, its threshold counts and
    /// its worst element.
    fn finite(
        len: usize,
        sums: [&[f64; LANES]; 5],
        max_rel: &[f64; LANES],
        above: [u64; THRESHOLDS.len()],
        worst: Option<(f64, u64, f64, f64)>,
        judged: Tally,
    ) -> Self {
        let [sum_abs, sum_sq, dot, norm_r, norm_t] = sums.map(tree);
        Self {
            compared: len as u64,
            sum_abs,
            sum_sq,
            dot,
            norm_r,
            norm_t,
            max_abs: worst.map_or(0.0, |(d, ..)| d),
            max_rel: max_rel
                .iter()
                .fold(0.0f64, |m, &v| if v > m { v } else { m }),
            above,
            nan_r: 0,
            nan_t: 0,
            inf_r: 0,
            inf_t: 0,
            nan_mismatch: 0,
            worst,
            judged,
        }
    }

    fn empty() -> Self {
        Self {
            compared: 0,
            sum_abs: 0.0,
            sum_sq: 0.0,
            dot: 0.0,
            norm_r: 0.0,
            norm_t: 0.0,
            max_abs: 0.0,
            max_rel: 0.0,
            above: [0; THRESHOLDS.len()],
            nan_r: 0,
            nan_t: 0,
            inf_r: 0,
            inf_t: 0,
            nan_mismatch: 0,
            worst: None,
            judged: Tally::default(),
        }
    }

    /// Folds a later block into this one (order matters for the sums, so callers go in block order).
    fn merge(&mut self, o: &Partial) {
        self.compared += o.compared;
        self.sum_abs += o.sum_abs;
        self.sum_sq += o.sum_sq;
        self.dot += o.dot;
        self.norm_r += o.norm_r;
        self.norm_t += o.norm_t;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.max_rel = self.max_rel.max(o.max_rel);
        for (a, b) in self.above.iter_mut().zip(&o.above) {
            *a += b;
        }
        self.nan_r += o.nan_r;
        self.nan_t += o.nan_t;
        self.inf_r += o.inf_r;
        self.inf_t += o.inf_t;
        self.nan_mismatch += o.nan_mismatch;
        self.judged.merge(&o.judged);
        if let Some(w) = o.worst
            && self.worst.is_none_or(|(d, ..)| w.0 > d)
        {
            self.worst = Some(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn nan_or_inf_on_one_side_is_off_any_multiple_of_the_tolerance() {
        let shape = [3];
        let (r, t) = (f32s(&[1.0, 2.0, 3.0]), f32s(&[1.0, f32::NAN, 3.0]));
        let view = |b| TensorView::new("x", DType::F32, &shape, b).unwrap();
        let s = compare_judged(view(&r), view(&t), Some(judge())).unwrap();
        // the finite elements agree, so the bound's multiple alone reads zero
        assert_eq!(s.rounding.as_ref().unwrap().tolerance_needed, 0.0);
        assert_eq!(s.tolerance_multiple(), Some(f64::INFINITY));
        let inf = f32s(&[1.0, f32::INFINITY, 3.0]);
        let s = compare_judged(view(&r), view(&inf), Some(judge())).unwrap();
        assert_eq!(s.tolerance_multiple(), Some(f64::INFINITY));
        let s = compare_judged(view(&r), view(&r), Some(judge())).unwrap();
        assert_eq!(s.tolerance_multiple(), Some(0.0));
        assert_eq!(
            compare(view(&r), view(&r)).unwrap().tolerance_multiple(),
            None
        );
    }

    #[test]
    fn identical_tensors_have_zero_difference_and_unit_cosine() {
        let a = f32s(&[1.0, -2.0, 3.5]);
        let shape = [3];
        let v = TensorView::new("a", DType::F32, &shape, &a).unwrap();
        let s = compare(v, v).unwrap();
        assert_eq!((s.max_abs_diff, s.mean_abs_diff, s.cosine), (0.0, 0.0, 1.0));
        assert_eq!(s.abs_diff_above, [0; 10]);
    }

    #[test]
    fn the_finite_fast_path_gives_the_exact_path_s_bits() {
        let mut rng = crate::SplitMix64::new(7);
        for len in [1, 7, 8, 9, 255, 256, 257, 1000, BLOCK] {
            let r: Vec<f64> = (0..len).map(|_| rng.normal()).collect();
            let t: Vec<f64> = r.iter().map(|v| v + rng.normal() * 1e-5).collect();
            for judge in [None, Some(judge())] {
                let prepared = judge.map(Judge::prepare);
                let mut histograms = [vec![0u32; HISTOGRAM], vec![0u32; HISTOGRAM]];
                let [h_fast, h_exact] = &mut histograms;
                let fast = finite_block(
                    len,
                    0,
                    prepared.as_ref().map(|j| (j, &mut h_fast[..])),
                    |from, to, rb: &mut [f64], tb: &mut [f64]| {
                        rb.copy_from_slice(&r[from..to]);
                        tb.copy_from_slice(&t[from..to]);
                    },
                )
                .expect("finite data takes the fast path");
                let exact = any_block(&r, &t, 0, prepared.as_ref().map(|j| (j, &mut h_exact[..])));
                assert_eq!(bits(&fast), bits(&exact), "{len} elements");
                assert_eq!(histograms[0], histograms[1], "{len} elements");
            }
        }
        let with_nan = [1.0, f64::NAN, 2.0];
        assert!(
            finite_block(3, 0, None, |_, _, rb: &mut [f64], tb: &mut [f64]| {
                rb.copy_from_slice(&with_nan);
                tb.copy_from_slice(&with_nan);
            })
            .is_none()
        );
    }

    /// Every dispatched path (explicit AVX-512, auto-vectorised, generic) gives the exact path's
    /// bits, for every pair of float dtypes, with NaN and infinities in some blocks.
    #[test]
    fn every_path_gives_the_exact_path_s_bits_for_every_float_pair() {
        let mut rng = crate::SplitMix64::new(11);
        let n = 3 * BLOCK + 264; // three full blocks and a tail that is a multiple of 8
        let values: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
        let moved: Vec<f64> = values.iter().map(|v| v + rng.normal() * 1e-3).collect();
        let dtypes = [DType::F32, DType::F16, DType::BF16, DType::F64];
        for special in [None, Some(f64::NAN), Some(f64::INFINITY)] {
            let mut t = moved.clone();
            if let Some(x) = special {
                t[BLOCK + 5] = x;
            }
            for &rd in &dtypes {
                for &td in &dtypes {
                    let (mut rb, mut tb) = (Vec::new(), Vec::new());
                    rd.encode_f64(&values, &mut rb);
                    td.encode_f64(&t, &mut tb);
                    let shape = [n];
                    let r = TensorView::new("r", rd, &shape, &rb).unwrap();
                    let t = TensorView::new("t", td, &shape, &tb).unwrap();
                    for block in 0..n.div_ceil(BLOCK) {
                        for judge in [None, Some(judge())] {
                            let prepared = judge.map(Judge::prepare);
                            let mut h = [vec![0u32; HISTOGRAM], vec![0u32; HISTOGRAM]];
                            let [h_fast, h_exact] = &mut h;
                            let fast = block_stats(
                                r,
                                t,
                                block,
                                prepared.as_ref().map(|j| (j, &mut h_fast[..])),
                            );
                            let exact = exact_block(
                                r,
                                t,
                                block,
                                prepared.as_ref().map(|j| (j, &mut h_exact[..])),
                            );
                            let at = format!("{rd} vs {td}, block {block}, {judge:?}");
                            assert_eq!(bits(&fast), bits(&exact), "{at}");
                            assert_eq!(h[0], h[1], "{at}");
                        }
                    }
                }
            }
        }
    }

    /// F16C's widening gives `half`'s values for every float16 bit pattern, at every length
    /// (whole groups of eight and the tail).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn float16_widened_by_f16c_is_exact() {
        if !(std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c"))
        {
            return;
        }
        let bytes: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
        for n in [0, 1, 7, 8, 9, 17, 65536] {
            let (mut got, mut want) = (vec![0.0f64; n], vec![0.0f64; n]);
            // SAFETY: the CPU has AVX2 and F16C, checked above.
            unsafe { widen_f16(&bytes[..2 * n], &mut got) };
            DType::F16.decode_f64(&bytes[..2 * n], &mut want);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{n} elements");
        }
    }

    /// The largest relative difference is the exact one even when the quotients crowd within
    /// the error of an approximate reciprocal (a fast path must divide, not estimate).
    #[test]
    fn the_largest_relative_difference_is_exact_when_quotients_crowd() {
        let mut rng = crate::SplitMix64::new(5);
        let n = 2 * BLOCK;
        let reference: Vec<f64> = (0..n)
            .map(|_| 1.0 + (rng.normal().abs() * 1e-4).min(1e-3))
            .collect();
        let target: Vec<f64> = reference.iter().map(|v| v + 1.0 / 256.0).collect();
        let (mut rb, mut tb) = (Vec::new(), Vec::new());
        DType::F32.encode_f64(&reference, &mut rb);
        DType::F32.encode_f64(&target, &mut tb);
        let shape = [n];
        let r = TensorView::new("r", DType::F32, &shape, &rb).unwrap();
        let t = TensorView::new("t", DType::F32, &shape, &tb).unwrap();
        for block in 0..2 {
            assert_eq!(
                bits(&block_stats(r, t, block, None)),
                bits(&exact_block(r, t, block, None))
            );
        }
    }

    /// A judge whose bound some elements of the tests' data pass and some do not.
    fn judge() -> Judge {
        Judge {
            grid: DType::F16,
            bound: crate::Bound {
                atol: 1e-4,
                rtol: 1e-4,
            },
        }
    }

    #[allow(clippy::type_complexity)]
    fn bits(p: &Partial) -> ([u64; 10], [u64; 10], [u64; 7], Option<(u64, u64, u64, u64)>) {
        let j = &p.judged;
        (
            [
                p.sum_abs, p.sum_sq, p.dot, p.norm_r, p.norm_t, p.max_abs, p.max_rel, j.sum_ulp,
                j.max_ulp, j.needed,
            ]
            .map(f64::to_bits),
            p.above,
            [
                p.compared,
                p.nan_r,
                p.nan_t,
                p.inf_r,
                p.inf_t,
                p.nan_mismatch,
                j.beyond,
            ],
            p.worst
                .map(|(d, i, a, b)| (d.to_bits(), i, a.to_bits(), b.to_bits())),
        )
    }

    #[test]
    fn nan_and_inf_rules() {
        let r = f32s(&[f32::NAN, f32::NAN, f32::INFINITY, 1.0, 0.0]);
        let t = f32s(&[f32::NAN, 1.0, f32::INFINITY, 1.5, 0.0]);
        let shape = [5];
        let s = compare(
            TensorView::new("r", DType::F32, &shape, &r).unwrap(),
            TensorView::new("t", DType::F32, &shape, &t).unwrap(),
        )
        .unwrap();
        assert_eq!(
            (s.compared, s.nan_mismatch, s.nan_reference, s.nan_target),
            (3, 1, 2, 1)
        );
        assert_eq!(s.max_abs_diff, 0.5);
        assert_eq!(s.worst.unwrap().index, 3);
        assert_eq!(s.max_rel_diff, 0.5 / 1.5);
    }

    #[test]
    fn worst_position_is_unravelled_in_c_order() {
        let mut v = vec![0.0f32; 24];
        let r = f32s(&v);
        v[17] = 1.0;
        let t = f32s(&v);
        let shape = [2, 3, 4];
        let s = compare(
            TensorView::new("r", DType::F32, &shape, &r).unwrap(),
            TensorView::new("t", DType::F32, &shape, &t).unwrap(),
        )
        .unwrap();
        assert_eq!(s.worst.unwrap().position, vec![1, 1, 1]);
        assert_eq!(s.abs_diff_above[7], 0, "1.0 is not strictly above 1");
        assert_eq!(s.abs_diff_above[6], 1);
    }

    #[test]
    fn result_does_not_depend_on_thread_count() {
        let n = BLOCK * 37 + 11;
        let r: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 0.001).collect();
        let t: Vec<f32> = r
            .iter()
            .enumerate()
            .map(|(i, x)| x + (i % 13) as f32 * 1e-7)
            .collect();
        let (r, t) = (f32s(&r), f32s(&t));
        let shape = [n];
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                compare(
                    TensorView::new("r", DType::F32, &shape, &r).unwrap(),
                    TensorView::new("t", DType::F32, &shape, &t).unwrap(),
                )
                .unwrap()
            })
        };
        let one = run(1);
        for threads in [2, 3, 8] {
            let other = run(threads);
            assert_eq!(one.mean_abs_diff.to_bits(), other.mean_abs_diff.to_bits());
            assert_eq!(one.cosine.to_bits(), other.cosine.to_bits());
            assert_eq!(one, other);
        }
    }
}
