//! What a sum added up one by one in a narrow dtype loses where its running sum stalls: once
//! the running sum is large beside its terms, a term under half its step is rounded away
//! whole. The random-walk model of the module docs holds while the terms are spread wider
//! than a step; terms that share a sign climb to the sum and then stall, and the sum falls
//! short of it. In bfloat16, 784 equal terms of 1 stop at 256 (256 + 1 rounds back to 256):
//! 67% short, every element the same way, where the random walk explains 2%. PyTorch's CPU
//! LayerNorm backward at one thread sums its bias gradient so, over every position.
//!
//! No closed form fits the regime between; the kernel is simulated instead: for `K` terms of
//! root mean square 1 whose mean is `f` (`f = |x| / (√K·rss)`, from 0 for terms of mixed signs
//! to 1 for equal ones), the running sum is rounded to the grid after each addition, over
//! [`DRAWS`] seeded draws at scales spread over an octave (where the sum falls among the
//! grid's steps). Per `f` on a grid of [`BUCKETS`] + 1 points, the error's root mean square and
//! its mean along the sum's sign (negative: short of it) make the table; an element reads it at
//! its `f`, scaled by its terms' root mean square `rss/√K`. Tables are kept per grid and `K`.
//!
//! The table's terms come in no order, and none is far larger than the rest. A ViT's class
//! token is: its LayerNorm gradient comes first and is most of the sum, so every later term
//! is added to a running sum as large as it, under half its step, and is lost (the class
//! token's sum 0.19, the other 196 positions' 0.05, 40% of which vanish: 2.5 times the
//! table's error on average, 11 times at the worst element). No `(K, rss, x)` tells that
//! apart; where the framework hands over the terms themselves (a LayerNorm's weight and bias
//! gradients, one term per position), [`one_by_one`] adds them up as such a kernel does, in
//! the order they are held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;

use crate::DType;
use crate::random::SplitMix64;

/// Points of the table along `f`, less one.
const BUCKETS: usize = 32;

/// Seeded draws per point.
const DRAWS: usize = 16;

/// The most terms simulated; beyond, the table at this many, its mean error scaled by
/// `K / MAX_TERMS` (a stalled sum's shortfall grows with its terms) and its spread about the
/// mean by the square root of that (a random walk's).
const MAX_TERMS: u64 = 1 << 16;

/// The tables made so far, by grid and number of terms.
type Tables = Mutex<HashMap<(&'static str, u64), Arc<Stalls>>>;

/// A sum's error when added up one by one in the grid, per `f` (see the module docs).
#[derive(Debug)]
pub(crate) struct Stalls {
    /// The error's root mean square, in the terms' root mean square.
    rms: [f64; BUCKETS + 1],
    /// Its mean along the sum's sign (0 or below: short of the sum).
    signed: [f64; BUCKETS + 1],
}

impl Stalls {
    /// The table of `terms` terms summed in `grid` (float16 or bfloat16; `None` for a grid
    /// where no reduction a model makes stalls: float32 and wider), made once per process.
    pub(crate) fn of(grid: DType, terms: u64) -> Option<Arc<Stalls>> {
        if !matches!(grid, DType::F16 | DType::BF16) || terms < 2 {
            return None;
        }
        static TABLES: OnceLock<Tables> = OnceLock::new();
        let tables = TABLES.get_or_init(Default::default);
        let key = (grid.name(), terms);
        if let Some(table) = tables.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Some(table.clone());
        }
        let table = Arc::new(simulate(grid, terms));
        let mut held = tables.lock().unwrap_or_else(|e| e.into_inner());
        Some(held.entry(key).or_insert(table).clone())
    }

    /// `(root mean square, mean along the sum's sign)` of the error of a sum `x` of `terms`
    /// terms whose root sum of squares is `rss`: the larger root mean square and the
    /// shorter mean of the two points of the table around its `f`.
    pub(crate) fn at(&self, terms: u64, rss: f64, x: f64) -> (f64, f64) {
        if rss.is_nan() || rss <= 0.0 || !x.is_finite() {
            return (0.0, 0.0);
        }
        let root = (terms.max(1) as f64).sqrt();
        let f = (x.abs() / (root * rss)).clamp(0.0, 1.0) * BUCKETS as f64;
        let (lo, hi) = (f.floor() as usize, (f.ceil() as usize).min(BUCKETS));
        let scale = rss / root;
        (
            scale * self.rms[lo].max(self.rms[hi]),
            scale * self.signed[lo].min(self.signed[hi]),
        )
    }
}

fn simulate(grid: DType, terms: u64) -> Stalls {
    let simulated = terms.min(MAX_TERMS);
    let beyond = terms as f64 / simulated as f64;
    let points: Vec<(f64, f64)> = (0..=BUCKETS)
        .into_par_iter()
        .map(|b| {
            let f = b as f64 / BUCKETS as f64;
            let spread = (1.0 - f * f).max(0.0).sqrt();
            let mut rng = SplitMix64::new(0x5EED_0000 + b as u64);
            let (mut squares, mut signed) = (0.0, 0.0);
            for d in 0..DRAWS {
                // scales spread evenly over an octave: where the sum falls among the steps
                let scale = 2f64.powf((d as f64 + 0.5) / DRAWS as f64);
                let (mut running, mut exact) = (0.0f64, 0.0f64);
                for _ in 0..simulated {
                    let term = scale * (f + spread * rng.normal());
                    exact += term;
                    running = grid.round(running + term);
                }
                let error = (running - exact) / scale;
                squares += error * error;
                signed += error * exact.signum();
            }
            let mean = signed / DRAWS as f64;
            let variance = (squares / DRAWS as f64 - mean * mean).max(0.0);
            (
                ((beyond * mean).powi(2) + beyond * variance).sqrt(),
                beyond * mean.min(0.0),
            )
        })
        .collect();
    let mut table = Stalls {
        rms: [0.0; BUCKETS + 1],
        signed: [0.0; BUCKETS + 1],
    };
    for (b, (rms, signed)) in points.into_iter().enumerate() {
        table.rms[b] = rms;
        table.signed[b] = signed;
    }
    table
}

/// Chunkings [`one_by_one`] tries: a pool of this many threads splits the terms into as many
/// runs of consecutive terms, each summed on its own.
const CHUNKINGS: [usize; 4] = [1, 2, 4, 8];

/// The error of `n` sums, each of the `terms` rows of `each` (`terms × n`, in the order the
/// framework holds them) added one by one into a running sum rounded to `grid`, per element:
/// in one run, and in 2, 4 and 8 runs of consecutive terms whose sums are then added exactly
/// and rounded once, as a pool of threads does: the error of largest size, signed along the
/// sum (below 0: short of it). `None` where `each` is not `terms × n`.
pub(crate) fn one_by_one(
    each: &crate::TensorView<'_>,
    terms: u64,
    n: usize,
    grid: DType,
) -> Option<Vec<f64>> {
    let k = usize::try_from(terms).ok()?;
    if k == 0 || each.numel() != k.checked_mul(n)? {
        return None;
    }
    let width = each.dtype.size();
    let chunkings: Vec<usize> = CHUNKINGS.into_iter().filter(|&c| c <= k).collect();
    // elements in parallel slices; each slice reads its columns row by row
    let slice = 256;
    let errors: Vec<Vec<f64>> = (0..n.div_ceil(slice))
        .into_par_iter()
        .map(|s| {
            let (start, end) = (s * slice, ((s + 1) * slice).min(n));
            let len = end - start;
            let mut row = vec![0.0; len];
            let mut exact = vec![0.0; len];
            // per chunking: the running sum of the current run, and the runs' sums so far
            let mut running = vec![vec![0.0; len]; chunkings.len()];
            let mut done = vec![vec![0.0; len]; chunkings.len()];
            for r in 0..k {
                let bytes = &each.bytes[(r * n + start) * width..(r * n + end) * width];
                crate::dtype::decode(each.dtype, bytes, &mut row);
                for (c, &runs) in chunkings.iter().enumerate() {
                    if r > 0 && r % k.div_ceil(runs) == 0 {
                        for (d, run) in done[c].iter_mut().zip(running[c].iter_mut()) {
                            *d += std::mem::take(run);
                        }
                    }
                    for (run, &t) in running[c].iter_mut().zip(&row) {
                        *run = grid.round(*run + t);
                    }
                }
                for (e, &t) in exact.iter_mut().zip(&row) {
                    *e += t;
                }
            }
            (0..len)
                .map(|e| {
                    let mut worst = 0.0f64;
                    for c in 0..chunkings.len() {
                        let error = grid.round(done[c][e] + running[c][e]) - exact[e];
                        if error.abs() > worst.abs() {
                            worst = error;
                        }
                    }
                    worst * exact[e].signum()
                })
                .collect()
        })
        .collect();
    Some(errors.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_terms_in_bfloat16_stall_short_of_their_sum_and_mixed_ones_do_not() {
        let table = Stalls::of(DType::BF16, 784).unwrap();
        // 784 terms of about 1 (f = 1): the running sum stops near 256-512, far short
        let (stalled, signed) = table.at(784, 28.0, 784.0);
        assert!(stalled > 200.0 && signed < -200.0, "{stalled} {signed}");
        // mixed signs (f = 0): a random walk, as the module docs' σ (1.25 here), either way
        let (rms, signed) = table.at(784, 28.0, 0.0);
        let sigma = crate::narrow_accumulation_sigma(2f64.powi(-8), 784, 28.0, 0.0);
        assert!(
            rms < 1.5 * sigma && signed > -0.5 * rms,
            "{rms} {signed} {sigma}"
        );
        // float16's steps are 8 times finer: its sum stalls far later
        let (rms, _) = Stalls::of(DType::F16, 784).unwrap().at(784, 28.0, 784.0);
        assert!(rms < stalled / 4.0, "{rms}");
        assert!(Stalls::of(DType::F32, 784).is_none());
    }

    #[test]
    fn terms_added_one_by_one_err_by_their_worst_chunking() {
        // 784 ones, then 784 minus ones: one run stalls at 256 (528 short), eight runs of 98
        // do not; the minus ones stall the same way, short of their negative sum
        let n = 2;
        let each: Vec<f64> = (0..784).flat_map(|_| [1.0, -1.0]).collect();
        let each = crate::Tensor::from_f64(DType::F64, &each);
        let errors = one_by_one(&each.view(), 784, n, DType::BF16).unwrap();
        assert_eq!(errors, vec![-528.0, -528.0]);
        // in float32 nothing stalls
        assert_eq!(
            one_by_one(&each.view(), 784, n, DType::F32).unwrap(),
            [0.0, 0.0]
        );
        // terms that are not `terms × n` are no terms of it
        assert!(one_by_one(&each.view(), 785, n, DType::BF16).is_none());
    }

    #[test]
    fn beyond_the_terms_simulated_a_random_walk_grows_as_its_square_root() {
        let (simulated, beyond) = (
            simulate(DType::BF16, MAX_TERMS),
            simulate(DType::BF16, 4 * MAX_TERMS),
        );
        // mixed signs: about twice the error for four times the terms (2.5: the mean of 16
        // draws is not quite 0, and it is scaled as a shortfall), not four times
        let ratio = beyond.rms[0] / simulated.rms[0];
        assert!((1.9..3.0).contains(&ratio), "{ratio}");
        // equal terms: the shortfall grows with the terms
        assert!(beyond.signed[BUCKETS] <= 3.9 * simulated.signed[BUCKETS]);
    }

    #[test]
    fn a_table_is_the_same_every_time() {
        let a = simulate(DType::BF16, 300);
        let b = simulate(DType::BF16, 300);
        assert_eq!(a.rms, b.rms);
        assert_eq!(a.signed, b.signed);
    }
}
