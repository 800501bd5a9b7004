//! The comparison kernel's definitions, checked on small and edge-case tensors.

use super::block::{any_block, exact_block, finite_block};
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
fn an_output_all_nan_on_one_side_differs_by_no_finite_amount() {
    let shape = [2];
    let (r, t) = (f32s(&[1.0, 2.0]), f32s(&[f32::NAN, f32::NAN]));
    let view = |b| TensorView::new("x", DType::F32, &shape, b).unwrap();
    let s = compare(view(&r), view(&t)).unwrap();
    // no position is compared: the figures of the compared ones read 0 ...
    assert_eq!((s.max_abs_diff, s.mean_abs_diff), (0.0, 0.0));
    // ... which a headline of the output must not repeat
    assert_eq!(s.counting_nan(s.max_abs_diff), f64::INFINITY);
    let s = compare(view(&r), view(&r)).unwrap();
    assert_eq!(s.counting_nan(s.max_abs_diff), 0.0);
    // both NaN at the same place agree
    let s = compare(view(&t), view(&t)).unwrap();
    assert_eq!(s.counting_nan(s.max_abs_diff), 0.0);
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
    // a special value in a block's first stretch, or in a later one (after the fast kernel
    // counted the first in the histogram: it must not count it twice)
    let specials = [
        (BLOCK + 5, f64::NAN),
        (BLOCK + 5, f64::INFINITY),
        (BLOCK + SUB + 5, f64::NAN),
    ];
    for special in [None].into_iter().chain(specials.map(Some)) {
        let mut t = moved.clone();
        if let Some((at, x)) = special {
            t[at] = x;
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

/// Decoding gives the plain decoder's bits for every float dtype, whether its bytes are
/// aligned (a runtime's values) or not (a file's weights), at every length.
#[test]
fn decoding_is_the_plain_decoders_bits_aligned_or_not() {
    let mut rng = crate::SplitMix64::new(7);
    let words: Vec<u64> = (0..1024).map(|_| rng.next_u64()).collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        for offset in [0, 1, 2] {
            for n in [0, 1, 7, 8, 9, 100, 1000] {
                let bytes = &bytes[offset..offset + n * dtype.size()];
                let (mut got, mut want) = (vec![0.0f64; n], vec![0.0f64; n]);
                crate::dtype::decode(dtype, bytes, &mut got);
                dtype.decode_f64(bytes, &mut want);
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(
                    bits(&got) == bits(&want),
                    "{dtype}, offset {offset}, {n} elements"
                );
            }
        }
    }
}

/// F16C's widening gives `half`'s values for every float16 bit pattern, at every length
/// (whole groups of eight and the tail).
#[cfg(target_arch = "x86_64")]
#[test]
fn float16_widened_by_f16c_is_exact() {
    if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c"))
    {
        return;
    }
    let bytes: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    for n in [0, 1, 7, 8, 9, 17, 65536] {
        let (mut got, mut want) = (vec![0.0f64; n], vec![0.0f64; n]);
        // SAFETY: the CPU has AVX2 and F16C, checked above.
        unsafe { crate::dtype::widen_f16(&bytes[..2 * n], &mut got) };
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

/// The largest relative difference (and, judged, the largest tolerance an element needs) is
/// exact when it rises by the smallest steps from one stretch of a block to the next, so that every stretch holds a new largest by a hair (a
/// fast path that divides only where the largest may change must not skip one), and when the
/// largest sits in a block's first element or its last.
#[test]
fn the_largest_relative_difference_is_exact_when_it_rises_by_a_hair() {
    let n = 2 * BLOCK;
    // the target one step of its dtype further from 1 every eight elements
    let rising = |dtype: DType| -> Vec<f64> {
        (0..n as u64)
            .map(|k| match dtype {
                DType::F32 => f64::from(f32::from_bits(
                    (1.0f32 + 1.0 / 1024.0).to_bits() + k as u32 / 8,
                )),
                _ => f64::from_bits((1.0f64 + 1.0 / 1024.0).to_bits() + k / 8),
            })
            .collect()
    };
    let mut first = vec![1.0 + 1.0 / 1024.0; n];
    first[0] = 1.0 + 1.0 / 512.0;
    let mut last = first.clone();
    last.swap(0, n - 1);
    for dtype in [DType::F32, DType::F64] {
        for (name, target) in [
            ("rising", rising(dtype)),
            ("first", first.clone()),
            ("last", last.clone()),
        ] {
            exact_bits_in_every_block(&vec![1.0; n], &target, dtype, name);
        }
    }
}

/// Judged stretches with no difference at all (a kernel counts their zeros without working
/// each element out) give the exact path's bits and histogram: a block all equal, and blocks
/// where equal stretches and moved ones take turns.
#[test]
fn judged_stretches_without_a_difference_give_the_exact_path_s_bits() {
    let mut rng = crate::SplitMix64::new(3);
    let n = 3 * BLOCK;
    let reference: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let target: Vec<f64> = reference
        .iter()
        .enumerate()
        .map(|(k, &v)| match (k / BLOCK, (k / SUB) % 3) {
            (0, _) | (_, 0) => v,
            _ => v + rng.normal() * 1e-3,
        })
        .collect();
    for dtype in [DType::F32, DType::F16, DType::F64] {
        exact_bits_in_every_block(&reference, &target, dtype, "stretches");
    }
}

/// Every block of `reference` and `target` held in `dtype`, by the best kernel, judged and
/// not: the exact path's bits and histogram.
fn exact_bits_in_every_block(reference: &[f64], target: &[f64], dtype: DType, label: &str) {
    let (mut rb, mut tb) = (Vec::new(), Vec::new());
    dtype.encode_f64(reference, &mut rb);
    dtype.encode_f64(target, &mut tb);
    let shape = [reference.len()];
    let r = TensorView::new("r", dtype, &shape, &rb).unwrap();
    let t = TensorView::new("t", dtype, &shape, &tb).unwrap();
    let prepared = judge().prepare();
    for block in 0..shape[0].div_ceil(BLOCK) {
        let at = format!("{label}, {dtype}, block {block}");
        let (fast, exact) = (
            block_stats(r, t, block, None),
            exact_block(r, t, block, None),
        );
        assert_eq!(bits(&fast), bits(&exact), "{at}");
        let mut h = [vec![0u32; HISTOGRAM], vec![0u32; HISTOGRAM]];
        let [h_fast, h_exact] = &mut h;
        let fast = block_stats(r, t, block, Some((&prepared, &mut h_fast[..])));
        let exact = exact_block(r, t, block, Some((&prepared, &mut h_exact[..])));
        assert_eq!(bits(&fast), bits(&exact), "{at}, judged");
        // (a mismatch of two histograms would print both whole)
        assert!(h[0] == h[1], "{at}, judged: the histograms differ");
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
pub(super) fn bits(p: &Partial) -> ([u64; 10], [u64; 10], [u64; 7], Option<(u64, u64, u64, u64)>) {
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

#[test]
fn huge_values_of_opposite_signs_differ_relatively_by_two_not_infinitely() {
    // |a − b| overflows float64 where |a − b| / max(|a|, |b|) is 2: on every kernel (a long
    // tensor takes the vectorised path, a short one the scalar one)
    for n in [3usize, 4099] {
        let (r, t): (Vec<f64>, Vec<f64>) = (0..n)
            .map(|i| {
                if i == n / 2 {
                    (1.5e308, -1.5e308)
                } else {
                    (1.0, 1.0)
                }
            })
            .unzip();
        let bytes = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (rb, tb) = (bytes(&r), bytes(&t));
        let shape = [n];
        let s = compare(
            TensorView::new("r", DType::F64, &shape, &rb).unwrap(),
            TensorView::new("t", DType::F64, &shape, &tb).unwrap(),
        )
        .unwrap();
        assert_eq!(s.max_rel_diff, 2.0, "{n} elements");
    }
}

/// Every kernel finds the largest relative difference where the values are float64 subnormals:
/// `2u / 3u` (0.67, `u` the smallest subnormal) beats an earlier 0.6 though `0.6 · 3u` rounds up
/// to `2u` (a fast path that skips the division where `d ≤ bar · den` must not trust a product
/// that underflowed).
#[test]
fn the_largest_relative_difference_is_found_among_float64_subnormals() {
    use super::dispatch::block_stats_on;
    use crate::kernel::Kernel;
    let n = BLOCK;
    let u = f64::from_bits(1);
    let (mut reference, mut target) = (vec![1.0f64; n], vec![1.0f64; n]);
    target[0] = 0.4; // 0.6 relative, in the first chunk
    let at = 3 * SUB + 5; // a later chunk
    (reference[at], target[at]) = (3.0 * u, u);
    let (mut rb, mut tb) = (Vec::new(), Vec::new());
    DType::F64.encode_f64(&reference, &mut rb);
    DType::F64.encode_f64(&target, &mut tb);
    let shape = [n];
    let r = TensorView::new("r", DType::F64, &shape, &rb).unwrap();
    let t = TensorView::new("t", DType::F64, &shape, &tb).unwrap();
    let exact = exact_block(r, t, 0, None);
    assert_eq!(exact.max_rel, (2.0 * u) / (3.0 * u));
    for kernel in Kernel::available() {
        let got = block_stats_on(kernel, r, t, 0, None);
        assert_eq!(bits(&got), bits(&exact), "{kernel:?}");
    }
}
