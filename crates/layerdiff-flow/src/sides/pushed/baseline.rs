//! A baseline handed over with each layer by the framework that computed the reference
//! (PyTorch runs the layer's module in float64 on the rounded inputs, with its weights rounded):
//! a [`PushedSide`] of float64 values, held until compared.

use std::collections::HashMap;

use layerdiff_core::{DType, Tensor};

use super::PushedSide;
use crate::engine::baseline::{Baseline, Fed, Terms};
use crate::engine::side::Side;

/// Exact values handed over layer by layer, each with the dtype the target computed it in
/// where its value's dtype does not show it (float16 gradients unscaled to float32).
pub struct HandedBaseline {
    side: PushedSide,
    grids: HashMap<String, DType>,
    /// Each layer's reduction as the framework measured it: its terms per element and their
    /// root sum of squares (`layerdiff_core::Reduction`), held until compared.
    reductions: HashMap<String, Terms>,
    /// Why the run computing the exact values stopped, when it did.
    lost: Option<String>,
}

impl HandedBaseline {
    /// Ready to take one float64 value per layer, `(name, estimated bytes)`, in order.
    pub fn new(layers: impl IntoIterator<Item = (String, u64)>) -> Self {
        let listed = layers.into_iter().map(|(n, b)| (n, DType::F64, b));
        Self {
            side: PushedSide::new(layerdiff_core::SideInfo::new("baseline", "float64"), listed),
            grids: HashMap::new(),
            reductions: HashMap::new(),
            lost: None,
        }
    }

    /// The run computing the exact values stopped (`why`): the layers after it have none.
    pub fn lose(&mut self, why: String) {
        self.lost.get_or_insert(why);
    }

    /// Layer `index` (named `name`)'s exact value, and the dtype the target computed it in
    /// where it differs from its value's.
    pub fn push(&mut self, index: usize, name: &str, exact: Option<Tensor>, grid: Option<DType>) {
        self.side.push(index, exact);
        if let Some(grid) = grid {
            self.grids.insert(name.to_string(), grid);
        }
    }

    /// Layer `name`'s reduction's terms.
    pub fn push_reduction(&mut self, name: &str, terms: Terms) {
        self.reductions.insert(name.to_string(), terms);
    }
}

impl Baseline for HandedBaseline {
    fn held_sizes(&self) -> HashMap<String, u64> {
        self.side.plan_view().sizes
    }

    fn grid_of(&self, value: &str) -> Option<DType> {
        self.grids.get(value).copied()
    }

    fn reduction_of(&self, value: &str) -> Option<Terms> {
        self.reductions.get(value).cloned()
    }

    fn free(&mut self, values: &[String]) {
        self.side.free(values);
        for v in values {
            self.reductions.remove(v);
        }
    }

    fn exact<'a>(
        &self,
        value: &str,
        _grid: DType,
        _feed: &dyn Fn(&str) -> Fed<'a>,
    ) -> std::result::Result<Tensor, String> {
        self.side
            .get(value)
            .cloned()
            .ok_or_else(|| match &self.lost {
                Some(why) => format!("the float64 run of the model stopped before it: {why}"),
                None => "no float64 value of it was handed over".to_string(),
            })
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
