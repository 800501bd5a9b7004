//! The comparator's invariants as properties, on arbitrary pairs of tensors in every pair of
//! float dtypes, NaN, ±Inf, signed zeros and subnormals among them: every statistic against a
//! plain loop written from the definitions (docs/metrics.md); the order of its extremes and
//! counts; symmetry where the statistic is symmetric; every kernel this CPU has (AVX-512, AVX2,
//! portable) giving the exact path's bits; the same result on any number of threads.

use proptest::prelude::*;

use super::block::exact_block;
use super::dispatch::block_stats_on;
use super::*;
use crate::kernel::Kernel;
use crate::{Bound, DType};

const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

/// A value: ordinary ones (finite in every dtype, subnormals of each among them), or, for
/// `specials`, also anything a float can hold (NaN, ±Inf, past a narrow dtype's range).
fn value(specials: bool) -> BoxedStrategy<f64> {
    let ordinary = prop_oneof![
        8 => -100.0f64..100.0,
        1 => prop::sample::select(vec![0.0, -0.0, 6.0e-8, -3.0e-8, 1.0e-40, 1.0e-310, 65504.0]),
    ];
    if !specials {
        return ordinary.boxed();
    }
    prop_oneof![
        20 => ordinary,
        1 => any::<f64>(),
        1 => prop::sample::select(vec![f64::INFINITY, f64::NEG_INFINITY, f64::NAN]),
    ]
    .boxed()
}

/// A target value from its reference value: the same, a little off, or anything.
fn moved(r: f64, how: u8, by: f64) -> f64 {
    match how % 8 {
        0 | 1 => r,
        2..=5 => r + r * by * 1e-3 + by * 1e-6,
        6 => -r,
        _ => by * 1e3,
    }
}

/// A pair of tensors of one length (below `max_len`), each in its dtype; a third of them with
/// NaN, ±Inf or out-of-range values (which send a block to the exact path), the others finite
/// (which the fast kernels take).
fn pair(max_len: usize) -> impl Strategy<Value = (DType, Vec<u8>, DType, Vec<u8>)> {
    (
        prop::sample::select(FLOATS.to_vec()),
        prop::sample::select(FLOATS.to_vec()),
        prop::bool::weighted(0.33),
    )
        .prop_flat_map(move |(rd, td, specials)| {
            let element = (value(specials), any::<u8>(), -1.0f64..1.0);
            (
                Just(rd),
                Just(td),
                prop::collection::vec(element, 1..max_len),
            )
        })
        .prop_map(|(rd, td, elements)| {
            let r: Vec<f64> = elements.iter().map(|e| e.0).collect();
            let t: Vec<f64> = elements
                .iter()
                .map(|&(r, how, by)| moved(r, how, by))
                .collect();
            let (mut rb, mut tb) = (Vec::new(), Vec::new());
            rd.encode_f64(&r, &mut rb);
            td.encode_f64(&t, &mut tb);
            (rd, rb, td, tb)
        })
}

fn view<'a>(dtype: DType, bytes: &'a [u8], shape: &'a [usize]) -> TensorView<'a> {
    TensorView::new("x", dtype, shape, bytes).expect("sized")
}

/// The statistics a plain loop gets from the definitions, in one order (sums aside).
struct Plain {
    compared: u64,
    nan: (u64, u64),
    inf: (u64, u64),
    nan_mismatch: u64,
    max_abs: f64,
    max_rel: f64,
    above: [u64; THRESHOLDS.len()],
    worst: Option<u64>,
    sum_abs: f64,
}

fn plain(r: &[f64], t: &[f64]) -> Plain {
    let mut p = Plain {
        compared: 0,
        nan: (0, 0),
        inf: (0, 0),
        nan_mismatch: 0,
        max_abs: 0.0,
        max_rel: 0.0,
        above: [0; THRESHOLDS.len()],
        worst: None,
        sum_abs: 0.0,
    };
    for (k, (&a, &b)) in r.iter().zip(t).enumerate() {
        p.nan.0 += u64::from(a.is_nan());
        p.nan.1 += u64::from(b.is_nan());
        p.inf.0 += u64::from(a.is_infinite());
        p.inf.1 += u64::from(b.is_infinite());
        if a.is_nan() || b.is_nan() {
            p.nan_mismatch += u64::from(a.is_nan() != b.is_nan());
            continue;
        }
        p.compared += 1;
        let d = if a == b { 0.0 } else { (b - a).abs() };
        if p.worst.is_none() || d > p.max_abs {
            p.max_abs = d;
            p.worst = Some(k as u64);
        }
        p.sum_abs += d;
        if a.is_finite() && b.is_finite() && (a != 0.0 || b != 0.0) {
            // at most 2 for finite values, which a difference of huge opposite ones overflows
            p.max_rel = p.max_rel.max((d / a.abs().max(b.abs())).min(2.0));
        }
        for (count, (threshold, _)) in p.above.iter_mut().zip(THRESHOLDS) {
            *count += u64::from(d > threshold);
        }
    }
    p
}

fn widened(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    let mut out = vec![0.0; bytes.len() / dtype.size()];
    crate::dtype::decode(dtype, bytes, &mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Every statistic is what its definition says; max ≥ rms ≥ mean ≥ 0, counts fall as the
    /// threshold rises, the relative difference is at most 2 and the cosine within [-1, 1].
    #[test]
    fn the_statistics_are_their_definitions((rd, rb, td, tb) in pair(2 * BLOCK + 40)) {
        let n = rb.len() / rd.size();
        let shape = [n];
        let s = compare(view(rd, &rb, &shape), view(td, &tb, &shape)).unwrap();
        let p = plain(&widened(rd, &rb), &widened(td, &tb));
        prop_assert_eq!(s.elements, n as u64);
        prop_assert_eq!(s.compared, p.compared);
        prop_assert_eq!((s.nan_reference, s.nan_target), p.nan);
        prop_assert_eq!((s.inf_reference, s.inf_target), p.inf);
        prop_assert_eq!(s.nan_mismatch, p.nan_mismatch);
        // a position is compared unless either side is NaN
        prop_assert_eq!(
            s.compared,
            n as u64 - (s.nan_reference + s.nan_target + s.nan_mismatch) / 2
        );
        prop_assert_eq!(s.max_abs_diff.to_bits(), p.max_abs.to_bits());
        prop_assert_eq!(s.max_rel_diff.to_bits(), p.max_rel.to_bits());
        prop_assert_eq!(s.abs_diff_above, p.above);
        prop_assert_eq!(s.worst.as_ref().map(|w| w.index), p.worst);
        let mean = if p.compared == 0 { 0.0 } else { p.sum_abs / p.compared as f64 };
        if mean.is_finite() {
            prop_assert!((s.mean_abs_diff - mean).abs() <= 1e-9 * mean.abs() + 1e-300);
        } else {
            prop_assert_eq!(s.mean_abs_diff, mean);
        }
        prop_assert!(s.mean_abs_diff >= 0.0);
        prop_assert!(s.max_abs_diff >= s.mean_abs_diff * (1.0 - 1e-12));
        if s.max_abs_diff < 1e150 {
            prop_assert!(s.rms_diff >= s.mean_abs_diff * (1.0 - 1e-12));
            prop_assert!(s.rms_diff <= s.max_abs_diff * (1.0 + 1e-12));
        }
        prop_assert!(s.abs_diff_above[0] <= s.compared);
        prop_assert!(s.abs_diff_above.windows(2).all(|w| w[0] >= w[1]));
        prop_assert!((0.0..=2.0).contains(&s.max_rel_diff));
        prop_assert!(s.cosine.is_nan() || (-1.0 - 1e-12..=1.0 + 1e-12).contains(&s.cosine),
            "cosine {}", s.cosine);
    }

    /// Swapping the sides swaps the per-side counts and the worst element's values, and
    /// changes nothing else, to the bit.
    #[test]
    fn swapping_the_sides_changes_only_what_is_per_side((rd, rb, td, tb) in pair(BLOCK + 40)) {
        let shape = [rb.len() / rd.size()];
        let a = compare(view(rd, &rb, &shape), view(td, &tb, &shape)).unwrap();
        let b = compare(view(td, &tb, &shape), view(rd, &rb, &shape)).unwrap();
        let symmetric = |s: &Stats| (
            s.compared, s.nan_mismatch, s.abs_diff_above,
            [s.max_abs_diff, s.mean_abs_diff, s.rms_diff, s.max_rel_diff, s.cosine]
                .map(f64::to_bits),
            s.worst.as_ref().map(|w| w.index),
        );
        prop_assert_eq!(symmetric(&a), symmetric(&b));
        prop_assert_eq!((a.nan_reference, a.inf_reference), (b.nan_target, b.inf_target));
        if let (Some(x), Some(y)) = (&a.worst, &b.worst) {
            prop_assert_eq!(x.reference.to_bits(), y.target.to_bits());
            prop_assert_eq!(x.target.to_bits(), y.reference.to_bits());
        }
    }

    /// A tensor against itself: nothing differs, whatever it holds.
    #[test]
    fn a_tensor_against_itself_differs_nowhere((rd, rb, _, _) in pair(BLOCK + 40)) {
        let shape = [rb.len() / rd.size()];
        let s = compare(view(rd, &rb, &shape), view(rd, &rb, &shape)).unwrap();
        prop_assert_eq!(s.max_abs_diff, 0.0);
        prop_assert_eq!(s.nan_mismatch, 0);
        prop_assert_eq!(s.abs_diff_above, [0; THRESHOLDS.len()]);
        prop_assert_eq!(s.compared, shape[0] as u64 - s.nan_reference);
    }

    /// Every kernel this CPU runs gives the exact path's bits, judged or not: on a CPU with
    /// AVX-512, its AVX2 and portable kernels are checked too.
    #[test]
    fn every_kernel_gives_the_exact_bits(
        (rd, rb, td, tb) in pair(2 * BLOCK + 40),
        grid in prop::sample::select(FLOATS.to_vec()),
        atol in prop::sample::select(vec![0.0, 1e-6, 1e-3]),
        rtol in prop::sample::select(vec![0.0, 1e-4, 1e-2]),
    ) {
        let shape = [rb.len() / rd.size()];
        let (r, t) = (view(rd, &rb, &shape), view(td, &tb, &shape));
        let judge = Judge { grid, bound: Bound { atol, rtol } };
        for block in 0..shape[0].div_ceil(BLOCK) {
            for judged in [None, Some(judge)] {
                let prepared = judged.map(Judge::prepare);
                let mut expected_histogram = vec![0u32; HISTOGRAM];
                let exact = exact_block(
                    r, t, block,
                    prepared.as_ref().map(|j| (j, &mut expected_histogram[..])),
                );
                for kernel in Kernel::available() {
                    let mut histogram = vec![0u32; HISTOGRAM];
                    let got = block_stats_on(
                        kernel, r, t, block,
                        prepared.as_ref().map(|j| (j, &mut histogram[..])),
                    );
                    let at = format!("{kernel:?}, {rd} vs {td}, block {block}, {judged:?}");
                    prop_assert_eq!(super::tests::bits(&got), super::tests::bits(&exact), "{}", at);
                    prop_assert_eq!(&histogram, &expected_histogram, "{}", at);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The same statistics, to the bit, on one thread or several (work is split by block).
    #[test]
    fn the_thread_count_changes_nothing((rd, rb, td, tb) in pair(9 * BLOCK)) {
        let shape = [rb.len() / rd.size()];
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let judge = Judge { grid: DType::F16, bound: Bound { atol: 1e-5, rtol: 1e-3 } };
                let s = compare_judged(view(rd, &rb, &shape), view(td, &tb, &shape), Some(judge));
                format!("{s:?}")
            })
        };
        let one = run(1);
        prop_assert_eq!(&one, &run(2));
        prop_assert_eq!(&one, &run(5));
    }
}
