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
/// A compared layer exceeds the tolerance when its `max_abs_diff` is strictly greater, when one
/// side has NaN where the other has a number, or when the sides' dtypes differ (a bool mask
/// against float zeros is a finding even where the values agree). A shape mismatch always
/// exceeds. The drift origin is the first exceeding layer in execution order.
pub fn analyse(layers: &mut [Layer], tolerance: Tolerance) -> Summary {
    for layer in layers.iter_mut() {
        layer.exceeds_tol = match (&layer.status, &layer.stats) {
            (LayerStatus::Compared, Some(s)) => {
                s.max_abs_diff > tolerance.abs || s.nan_mismatch > 0 || layer.target_dtype.is_some()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, TensorView, compare_pair};

    fn layer(name: &str, reference: TensorView<'_>, target: TensorView<'_>) -> Layer {
        let outcome = compare_pair(reference, target);
        let mut layer = Layer::new(0, name, reference.shape.to_vec(), reference.dtype.name());
        layer.status = outcome.status;
        layer.target_shape = outcome.target_shape;
        layer.target_dtype = outcome.target_dtype;
        layer.stats = outcome.stats;
        layer
    }

    #[test]
    fn origin_is_the_first_exceeding_layer_and_a_dtype_change_is_a_finding() {
        let zeros_f32 = [0u8; 16];
        let zeros_bool = [0u8; 4];
        let small = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>();
        let shifted = [1.0f32, 2.0, 3.0, 4.001]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>();
        let shape = [4];
        fn v<'a>(dtype: DType, shape: &'a [usize], bytes: &'a [u8]) -> TensorView<'a> {
            TensorView::new("t", dtype, shape, bytes).unwrap()
        }
        let mut layers = vec![
            layer(
                "same",
                v(DType::F32, &shape, &small),
                v(DType::F32, &shape, &small),
            ),
            layer(
                "mask",
                v(DType::F32, &shape, &zeros_f32),
                v(DType::Bool, &shape, &zeros_bool),
            ),
            layer(
                "drift",
                v(DType::F32, &shape, &small),
                v(DType::F32, &shape, &shifted),
            ),
        ];
        let summary = analyse(&mut layers, Tolerance { abs: 1e-4 });
        assert_eq!(layers[1].stats.as_ref().unwrap().max_abs_diff, 0.0);
        assert!(
            layers[1].exceeds_tol,
            "bool vs float32 is a finding although the values agree"
        );
        assert_eq!(summary.drift_origin.as_deref(), Some("mask"));
        assert_eq!(summary.layers_exceeding, 2);
        assert_eq!(summary.worst.max_abs_diff.unwrap().layer, "drift");
    }
}
