//! A value's fingerprint: a few of its elements at fixed positions, enough to recognise the
//! same value on another side when names say nothing (a file from an exporter that records no
//! module scopes), and small enough to keep for every layer of a model.

use crate::TensorView;

/// Elements sampled per value.
pub const POINTS: usize = 64;

/// Likeness from which two fingerprints count as the same value (see [`Fingerprint::likeness`]):
/// a relative distance of at most 5%. A value that drifted further is paired by its position
/// between recognised neighbours instead.
pub const SAME_VALUE: f64 = 0.95;

/// How far apart, relative to their size, two runs of one computation on the same inputs may
/// put a sampled element (a kernel that sums in another order from run to run).
pub const RUN_AGAIN: f64 = 1e-4;

/// Elements of a value at [`POINTS`] evenly spaced flat positions (all of them when fewer).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fingerprint {
    /// The value's element count.
    pub count: usize,
    /// The sampled elements, widened to f64; non-finite ones as 0.
    pub samples: Vec<f64>,
}

impl Fingerprint {
    /// The fingerprint of a tensor.
    pub fn of(view: TensorView<'_>) -> Self {
        let count = view.numel();
        let samples = (0..count.min(POINTS))
            .map(|i| {
                let v = view.get_f64(i * count / count.min(POINTS));
                if v.is_finite() { v } else { 0.0 }
            })
            .collect();
        Self { count, samples }
    }

    /// Whether `again` is this value computed again on the same inputs: as many elements, each
    /// sample equal or within [`RUN_AGAIN`] of its size. A model with a random op (dropout in
    /// training mode, `torch.rand` in its forward) computes another value each run.
    pub fn same_run(&self, again: &Fingerprint) -> bool {
        self.count == again.count
            && self.samples.len() == again.samples.len()
            && (self.samples.iter().zip(&again.samples))
                .all(|(a, b)| a == b || (a - b).abs() <= RUN_AGAIN * (a.abs() + b.abs()))
    }

    /// How alike two values look, from 0 to 1: one less the distance between their samples
    /// relative to the larger of their norms (0 when their element counts differ). The same
    /// value computed two ways scores about 1; a value and what a ReLU, a residual add or a
    /// bias made of it score far lower.
    pub fn likeness(&self, other: &Fingerprint) -> f64 {
        if self.count != other.count || self.samples.len() != other.samples.len() {
            return 0.0;
        }
        let norm = |s: &[f64]| s.iter().map(|v| v * v).sum::<f64>().sqrt();
        let scale = norm(&self.samples).max(norm(&other.samples));
        if scale == 0.0 {
            return 1.0;
        }
        let distance = self
            .samples
            .iter()
            .zip(&other.samples)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f64>()
            .sqrt();
        (1.0 - distance / scale).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Tensor};

    fn tensor(values: &[f32]) -> Tensor {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new("t", DType::F32, vec![values.len()], bytes).unwrap()
    }

    #[test]
    fn a_value_run_again_is_the_same_and_a_random_one_is_not() {
        let base: Vec<f32> = (0..1000).map(|i| (i as f32).sin()).collect();
        let reordered: Vec<f32> = base.iter().map(|v| v * (1.0 + 1e-6)).collect();
        let dropped: Vec<f32> = (base.iter().enumerate())
            .map(|(i, v)| if i % 3 == 0 { 0.0 } else { v * 1.5 })
            .collect();
        let print = |v: &[f32]| Fingerprint::of(tensor(v).view());
        assert!(print(&base).same_run(&print(&reordered)));
        assert!(!print(&base).same_run(&print(&dropped)));
        assert!(!print(&base).same_run(&print(&base[..999])));
    }

    #[test]
    fn a_value_and_its_drifted_copy_look_alike_and_unrelated_values_do_not() {
        let base: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let drifted: Vec<f32> = base.iter().map(|v| v * 1.001 + 0.001).collect();
        let relu: Vec<f32> = base.iter().map(|v| v.max(0.0)).collect();
        let other: Vec<f32> = (0..1000)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 7.0)
            .collect();
        let f = |v: &[f32]| Fingerprint::of(tensor(v).view());
        assert_eq!(f(&base).samples.len(), POINTS);
        assert!(f(&base).likeness(&f(&drifted)) > 0.99);
        assert!(f(&base).likeness(&f(&other)) < SAME_VALUE);
        assert!(
            f(&base).likeness(&f(&relu)) < SAME_VALUE,
            "a ReLU changes the value"
        );
        assert_eq!(
            f(&base).likeness(&f(&base[..999])),
            0.0,
            "another element count"
        );
        let tripled: Vec<f32> = base.iter().map(|v| v * 3.0).collect();
        assert!(
            f(&base).likeness(&f(&tripled)) < SAME_VALUE,
            "another magnitude"
        );
    }
}
