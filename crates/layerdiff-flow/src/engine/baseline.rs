//! Where each layer's same-precision baseline comes from (see `layerdiff_core::Baseline`): the
//! layer computed exactly, by the *reference's* own computation of it, on the reference's
//! values of its inputs rounded to the dtype the target holds them in. Never the side under
//! test: a target measured against itself proves nothing.
//!
//! The engine asks a [`Baseline`] for each layer's exact value and knows no more of where it
//! comes from: handed over with each layer by the framework that computed the reference
//! (`crate::HandedBaseline`), or the reference ONNX graph in float64, re-run group by group
//! (`crate::GraphBaseline`).

use std::collections::HashMap;
use std::time::Duration;

use layerdiff_core::{DType, Reduction, Tensor};

/// A layer's reduction as measured, held (see [`Reduction`]): how many terms each element
/// sums, per element their root sum of squares, and where handed over the terms themselves.
#[derive(Debug, Clone)]
pub struct Terms {
    pub count: u64,
    pub rss: Tensor,
    pub each: Option<Tensor>,
}

impl Terms {
    pub fn view(&self) -> Reduction<'_> {
        Reduction {
            terms: self.count,
            rss: self.rss.view(),
            each: self.each.as_ref().map(Tensor::view),
        }
    }

    /// The bytes it holds.
    pub fn bytes(&self) -> usize {
        self.rss.bytes.len() + self.each.as_ref().map_or(0, |t| t.bytes.len())
    }
}

/// The reference's value of a layer's input, and the dtype the target holds it in.
pub(crate) type Fed<'a> = std::result::Result<(&'a Tensor, DType), String>;

/// Where the layers' exact values on rounded inputs come from.
pub trait Baseline: Send + Sync {
    /// The exact value (float64) of the layer whose reference value is `value`, computed on
    /// the reference's values of its inputs rounded to `grid` or to the dtype the target holds
    /// them in, whichever is narrower (`feed(n)`: the reference's value of `n` and the target's
    /// dtype of it), with its weights rounded to `grid`.
    fn exact<'a>(
        &self,
        value: &str,
        grid: DType,
        feed: &dyn Fn(&str) -> Fed<'a>,
    ) -> std::result::Result<Tensor, String>;

    /// Memory the source holds per reference value until it is compared (handed values).
    fn held_sizes(&self) -> HashMap<String, u64> {
        HashMap::new()
    }

    /// Finds what computes each of `values` from the values `known` on both sides, where the
    /// source computes them itself.
    fn find_groups(&mut self, _values: &[&str], _known: &dyn Fn(&str) -> bool) {}

    /// The dtype the target computed the layer of reference value `value` in, where the
    /// framework said so.
    fn grid_of(&self, _value: &str) -> Option<DType> {
        None
    }

    /// The reduction's terms of the layer of reference value `value`, where the framework
    /// measured them.
    fn reduction_of(&self, _value: &str) -> Option<Terms> {
        None
    }

    /// The reduction's terms of the layer of reference value `value` measured here, on the
    /// inputs [`Baseline::exact`] computes it on: asked only of a layer beyond what its
    /// precision explains without them (a long float32 reduction summed in another order).
    /// `None` where the source does not measure them.
    fn measure_reduction<'a>(
        &self,
        _value: &str,
        _grid: DType,
        _feed: &dyn Fn(&str) -> Fed<'a>,
    ) -> Option<Terms> {
        None
    }

    /// Time spent inside the runtimes computing exact values since the last call (none for
    /// handed values: their framework's time is counted where it computes them).
    fn take_time(&self) -> Duration {
        Duration::ZERO
    }

    /// Drops values no longer needed.
    fn free(&mut self, _values: &[String]) {}

    /// The source itself, for the verb that made it to hand it values.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}
