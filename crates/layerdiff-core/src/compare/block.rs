//! One block's statistics by the portable paths: the exact one (any dtype, NaN and
//! infinities) and the one for finite values, which the explicit kernels (AVX2, AVX-512) match
//! bit for bit. Which path takes a block is `dispatch`'s choice.

use super::rounding::{Lanes, Tally, count_slots};
use super::{BLOCK, Judging, LANES, Partial, SUB, THRESHOLDS, tree};
#[cfg(target_arch = "x86_64")]
use crate::DType;
use crate::TensorView;
use crate::dtype::decode;

/// What an explicit kernel made of a block (returned once per block: its size does not matter).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::large_enum_variant)]
pub(super) enum Outcome {
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
pub(super) fn element(dtype: DType, bytes: &[u8], k: usize) -> f64 {
    let size = dtype.size();
    let mut out = [0.0];
    dtype.decode_f64(&bytes[k * size..(k + 1) * size], &mut out);
    out[0]
}

/// A block through the exact path (NaN and infinities included).
pub(super) fn exact_block(
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

/// The common case: every value of both sides finite. Branch-free over lanes, so it vectorizes;
/// `None` when the block holds a NaN or an infinity (then [`any_block`] handles it). Gives the
/// same bits as [`any_block`] on finite data: the same lane order, the same operations.
/// `fill(from, to, r, t)` decodes elements `from..to` of the block into `r` and `t`.
#[inline(always)]
pub(super) fn finite_block(
    len: usize,
    start: usize,
    judging: Judging<'_>,
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
    let mut slots = [0u16; BLOCK];
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
                at_most_two(diff / a.abs().max(b.abs()))
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
        if let Some((judge, _)) = judging.as_ref() {
            judge.run(r, t, d, &mut judged, &mut slots[from..from + n]);
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
    if let Some((_, histogram)) = judging {
        count_slots(&slots[..len], histogram);
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

/// Any block, NaN and infinities included, one element at a time.
pub(super) fn any_block(r: &[f64], t: &[f64], start: usize, mut judging: Judging<'_>) -> Partial {
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
                let rel = at_most_two(d / rv.abs().max(tv.abs()));
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
    pub(super) fn finite(
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

    pub(super) fn empty() -> Self {
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
    pub(super) fn merge(&mut self, o: &Partial) {
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

/// A relative difference, which is at most 2 for finite values: `|a − b|` of two huge values of
/// opposite signs overflows to Inf where their quotient would not. NaN stays NaN.
#[inline(always)]
pub(super) fn at_most_two(rel: f64) -> f64 {
    if rel > 2.0 { 2.0 } else { rel }
}
