//! Layout permutation: does permuting the target onto the reference restore agreement?
//!
//! Two ways a layout goes wrong. *Permuted*: the target holds the reference transposed, with the
//! transposed shape (an NHWC output where NCHW was expected). *Reinterpreted*: the target's bytes
//! are the reference transposed, but read back with the reference's shape (NCHW data laid out as
//! NHWC and never transposed back), so shapes agree and values do not. Both are checked for 3-D
//! (`(B, C, T)` vs `(B, T, C)`) and 4-D tensors, over every axis permutation.

use crate::{TensorView, compare};

/// Largest tensor the detector will transpose (elements); larger ones are skipped.
pub const MAX_ELEMENTS: usize = 1 << 26;
/// Positions each permutation is first tried on: one that fails there is rejected without
/// transposing the whole tensor, so a layer that simply drifts costs a few thousand reads per
/// permutation, not a transpose and a comparison each.
pub const SAMPLES: usize = 1024;

/// A permutation that makes the sides agree.
#[derive(Debug, Clone, PartialEq)]
pub struct LayoutFinding {
    /// `p` such that the target is the reference transposed by `p` (`[0, 2, 3, 1]`: NCHW → NHWC).
    pub permutation: Vec<usize>,
    /// Whether the target kept the reference's shape (read back without transposing).
    pub reinterpreted: bool,
    /// The max abs diff once the permutation is undone.
    pub max_abs_diff: f64,
}

impl LayoutFinding {
    /// One sentence for reports.
    pub fn detail(&self) -> String {
        let how = if self.reinterpreted {
            "its data is the reference's transposed by {p} but read back with the reference's shape"
        } else {
            "it is the reference transposed by {p}"
        };
        format!(
            "the target's layout differs: {}; undoing it leaves a max abs diff of {:e}",
            how.replace("{p}", &format!("{:?}", self.permutation)),
            self.max_abs_diff
        )
    }
}

/// Finds a non-identity axis permutation under which the sides agree within `tolerance`.
pub fn detect_layout(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    tolerance: f64,
) -> Option<LayoutFinding> {
    let rank = reference.shape.len();
    let n = reference.numel();
    if !(3..=4).contains(&rank)
        || target.shape.len() != rank
        || target.numel() != n
        || n == 0
        || n > MAX_ELEMENTS
    {
        return None;
    }
    let mut reference_values: Option<Vec<f64>> = None;
    let mut best: Option<LayoutFinding> = None;
    for p in permutations(rank).into_iter().skip(1) {
        let permuted_shape: Vec<usize> = p.iter().map(|&a| reference.shape[a]).collect();
        let reinterpreted = target.shape == reference.shape;
        if permuted_shape != target.shape && !reinterpreted {
            continue;
        }
        if is_trivial(&p, reference.shape) {
            // only moves size-1 axes: the bytes are the same, and so is the comparison
            continue;
        }
        if !agrees_on_samples(reference, target, &permuted_shape, &p, tolerance) {
            continue;
        }
        let values =
            reference_values.get_or_insert_with(|| (0..n).map(|i| reference.get_f64(i)).collect());
        let transposed = transpose(values, reference.shape, &p);
        let bytes: Vec<u8> = transposed.iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = TensorView {
            dtype: crate::DType::F64,
            shape: target.shape,
            bytes: &bytes,
        };
        let Ok(stats) = compare(view, target) else {
            continue;
        };
        if stats.max_abs_diff <= tolerance
            && stats.nan_mismatch == 0
            && best
                .as_ref()
                .is_none_or(|b| stats.max_abs_diff < b.max_abs_diff)
        {
            best = Some(LayoutFinding {
                permutation: p,
                reinterpreted,
                max_abs_diff: stats.max_abs_diff,
            });
        }
    }
    best
}

/// Whether the target agrees within `tolerance` with the reference transposed by `p` (of shape
/// `permuted`) at [`SAMPLES`] evenly spaced positions (NaN agreeing only with NaN).
fn agrees_on_samples(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    permuted: &[usize],
    p: &[usize],
    tolerance: f64,
) -> bool {
    let n = target.numel();
    let count = n.min(SAMPLES);
    let mut index = vec![0usize; p.len()];
    (0..count).all(|s| {
        let j = s * n / count;
        // `j`'s position in the transposed tensor, then the reference element it came from.
        let mut rest = j;
        for k in (0..permuted.len()).rev() {
            index[p[k]] = rest % permuted[k];
            rest /= permuted[k];
        }
        let i = index
            .iter()
            .zip(reference.shape)
            .fold(0, |flat, (&at, &dim)| flat * dim + at);
        let (r, t) = (reference.get_f64(i), target.get_f64(j));
        if r.is_nan() || t.is_nan() {
            r.is_nan() && t.is_nan()
        } else {
            r == t || (t - r).abs() <= tolerance
        }
    })
}

/// Whether permutation `p` only reorders size-1 axes relative to each other.
fn is_trivial(p: &[usize], shape: &[usize]) -> bool {
    let moved: Vec<usize> = p.iter().copied().filter(|&a| shape[a] != 1).collect();
    moved.windows(2).all(|w| w[0] < w[1])
}

/// All permutations of `0..rank`, the identity first.
fn permutations(rank: usize) -> Vec<Vec<usize>> {
    fn go(prefix: &mut Vec<usize>, rank: usize, out: &mut Vec<Vec<usize>>) {
        if prefix.len() == rank {
            out.push(prefix.clone());
            return;
        }
        for a in 0..rank {
            if !prefix.contains(&a) {
                prefix.push(a);
                go(prefix, rank, out);
                prefix.pop();
            }
        }
    }
    let mut out = Vec::new();
    go(&mut Vec::new(), rank, &mut out);
    out
}

/// `values` (C order, `shape`) transposed by `p`: output axis `k` is input axis `p[k]`.
fn transpose(values: &[f64], shape: &[usize], p: &[usize]) -> Vec<f64> {
    let rank = shape.len();
    let mut strides = vec![1usize; rank];
    for k in (0..rank.saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    let out_shape: Vec<usize> = p.iter().map(|&a| shape[a]).collect();
    let out_strides: Vec<usize> = p.iter().map(|&a| strides[a]).collect();
    let mut out = Vec::with_capacity(values.len());
    let mut index = vec![0usize; rank];
    for _ in 0..values.len() {
        out.push(
            values[index
                .iter()
                .zip(&out_strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()],
        );
        for k in (0..rank).rev() {
            index[k] += 1;
            if index[k] < out_shape[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn f32_bytes(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect()
    }

    fn nchw() -> (Vec<usize>, Vec<f64>) {
        let shape = vec![2, 3, 4, 5];
        let values = (0..120)
            .map(|i| ((i * 37) % 101) as f64 * 0.25 - 3.0)
            .collect();
        (shape, values)
    }

    #[test]
    fn nhwc_output_is_found_with_its_permutation() {
        let (shape, values) = nchw();
        let nhwc = transpose(&values, &shape, &[0, 2, 3, 1]);
        let (r, t) = (f32_bytes(&values), f32_bytes(&nhwc));
        let nhwc_shape = [2, 4, 5, 3];
        let found = detect_layout(
            TensorView::new("r", DType::F32, &shape, &r).unwrap(),
            TensorView::new("t", DType::F32, &nhwc_shape, &t).unwrap(),
            1e-6,
        )
        .unwrap();
        assert_eq!(
            (found.permutation, found.reinterpreted, found.max_abs_diff),
            (vec![0, 2, 3, 1], false, 0.0)
        );
    }

    #[test]
    fn nhwc_data_read_back_as_nchw_is_a_reinterpretation() {
        let (shape, values) = nchw();
        let t = f32_bytes(&transpose(&values, &shape, &[0, 2, 3, 1]));
        let r = f32_bytes(&values);
        let found = detect_layout(
            TensorView::new("r", DType::F32, &shape, &r).unwrap(),
            TensorView::new("t", DType::F32, &shape, &t).unwrap(),
            1e-6,
        )
        .unwrap();
        assert_eq!(
            (found.permutation.clone(), found.reinterpreted),
            (vec![0, 2, 3, 1], true)
        );
        assert!(
            found
                .detail()
                .contains("read back with the reference's shape")
        );
    }

    /// A batch of one read back after swapping the batch with the channels (EfficientNet's
    /// quantized squeeze-excitation values, slightly off): the same bytes, so no layout, however
    /// loose the bound.
    #[test]
    fn moving_only_size_one_axes_is_no_layout() {
        let shape = [1, 6, 2, 2];
        let values: Vec<f64> = (0..24).map(|i| (i as f64).cos()).collect();
        let off: Vec<f64> = values.iter().map(|v| v + 1e-3).collect();
        let (r, t) = (f32_bytes(&values), f32_bytes(&off));
        for target_shape in [[1, 6, 2, 2], [6, 1, 2, 2]] {
            let found = detect_layout(
                TensorView::new("r", DType::F32, &shape, &r).unwrap(),
                TensorView::new("t", DType::F32, &target_shape, &t).unwrap(),
                1e-2,
            );
            assert_eq!(found, None, "{target_shape:?}");
        }
    }

    #[test]
    fn three_d_btc_vs_bct_and_no_false_finding_on_noise() {
        let shape = [2, 6, 7];
        let values: Vec<f64> = (0..84).map(|i| (i as f64).sin()).collect();
        let btc = transpose(&values, &shape, &[0, 2, 1]);
        let (r, t) = (f32_bytes(&values), f32_bytes(&btc));
        let found = detect_layout(
            TensorView::new("r", DType::F32, &shape, &r).unwrap(),
            TensorView::new("t", DType::F32, &[2, 7, 6], &t).unwrap(),
            1e-6,
        );
        assert_eq!(found.unwrap().permutation, vec![0, 2, 1]);
        let noise: Vec<f64> = (0..84).map(|i| ((i * 7919) % 83) as f64).collect();
        let n = f32_bytes(&noise);
        let none = detect_layout(
            TensorView::new("r", DType::F32, &shape, &r).unwrap(),
            TensorView::new("t", DType::F32, &shape, &n).unwrap(),
            1e-6,
        );
        assert_eq!(none, None);
    }
}
