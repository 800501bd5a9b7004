//! A layer's evidence of a range too narrow: the grids its target quantizes values to,
//! counted against the reference's values of them while both are held.

use layerdiff_core::Clipped;

use crate::engine::Pairs;
use crate::engine::side::{Group, Recompute};

impl Pairs<'_> {
    /// The grid of layer `i`'s target that clips the largest share of the reference's values
    /// (see `Recompute::grids`), in words (`this layer`, `` the input `x` ``), each counted on
    /// the reference's value of what it quantizes: what the model computes there, so values a
    /// defect upstream pushed out of range are not counted against this range.
    pub fn clipped(
        &self,
        recompute: &dyn Recompute,
        group: Option<&Group>,
        i: usize,
    ) -> Option<Clipped> {
        let value = self.target_values[i].as_deref()?;
        let (reference, _) = self.pair(i)?;
        let share = |c: &Clipped| c.grid.saturated as f64 / c.grid.elements.max(1) as f64;
        recompute
            .grids(group, value)
            .into_iter()
            .filter_map(|q| {
                let (what, values) = if q.value == value {
                    ("this layer".to_string(), reference)
                } else if let Some((_, fed)) = self.inputs.iter().find(|(n, _)| *n == q.value) {
                    (format!("the input `{}`", q.value), fed)
                } else {
                    let (r, _) = self.reference_of.get(&q.value)?;
                    (format!("its input `{r}`"), self.reference.get(r)?)
                };
                let mut grid = q.grid;
                grid.count_outside(values.view());
                Some(Clipped {
                    what,
                    node: q.node,
                    grid,
                })
            })
            // the last of the largest: the layer's own value, where it clips as much
            .max_by(|a, b| share(a).total_cmp(&share(b)))
    }
}
