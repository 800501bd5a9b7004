//! Drift analysis: which layers exceed the tolerance, where drift is born, and the extremes.

use crate::{Layer, LayerStatus, Summary, WorstLayer, WorstLayers};

/// A named tolerance on a layer's `max_abs_diff`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Absolute tolerance: a layer exceeds it when `max_abs_diff > abs` (strictly).
    pub abs: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Self { abs: 1e-4 }
    }
}

/// Marks each layer's `exceeds_tol` and summarises: counts, drift origin, worst layers.
///
/// A compared layer exceeds the tolerance when its `max_abs_diff` is strictly greater, or when
/// one side has NaN where the other has a number. A shape mismatch always exceeds. The drift
/// origin is the first exceeding layer in execution order.
pub fn analyse(layers: &mut [Layer], tolerance: Tolerance) -> Summary {
    for layer in layers.iter_mut() {
        layer.exceeds_tol = match (&layer.status, &layer.stats) {
            (LayerStatus::Compared, Some(s)) => {
                s.max_abs_diff > tolerance.abs || s.nan_mismatch > 0
            }
            (LayerStatus::ShapeMismatch, _) => true,
            _ => false,
        };
    }
    let compared: Vec<&Layer> = layers.iter().filter(|l| l.stats.is_some()).collect();
    let pick = |better: fn(f64, f64) -> bool, value: fn(&Layer) -> f64| {
        compared.iter().fold(None::<WorstLayer>, |best, l| {
            let v = value(l);
            match best {
                Some(b) if !better(v, b.value) => Some(b),
                _ => Some(WorstLayer {
                    layer: l.name.clone(),
                    value: v,
                }),
            }
        })
    };
    let max_abs = |l: &Layer| l.stats.as_ref().map_or(0.0, |s| s.max_abs_diff);
    let mean_abs = |l: &Layer| l.stats.as_ref().map_or(0.0, |s| s.mean_abs_diff);
    Summary {
        layers_total: layers.len(),
        layers_compared: compared.len(),
        layers_exceeding: layers.iter().filter(|l| l.exceeds_tol).count(),
        layers_unmapped: layers
            .iter()
            .filter(|l| l.status == LayerStatus::Unmapped)
            .count(),
        drift_origin: layers
            .iter()
            .find(|l| l.exceeds_tol)
            .map(|l| l.name.clone()),
        worst: WorstLayers {
            max_abs_diff: pick(|a, b| a > b, max_abs),
            mean_abs_diff: pick(|a, b| a > b, mean_abs),
            min_max_abs_diff: pick(|a, b| a < b, max_abs),
        },
    }
}
