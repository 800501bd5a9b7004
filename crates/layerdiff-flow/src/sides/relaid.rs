//! A target that holds some of its values in another layout than the reference: a converter's
//! channels-first copy (tf2onnx's NCHW) of a framework's channels-last values (Keras's NHWC).
//!
//! Wrapped around the target, it hands each such value to the comparison transposed back to
//! the reference's layout, and transposes the reference's values the other way to feed the
//! target's re-runs. So the engine compares like with like, and the layout a converter chose is
//! not taken for a fault; a value that is wrong in any layout still is. A value is relaid when
//! its shape is the reference's with the channel axis moved from last to second (`[1, 8, 32,
//! 32]` for `[1, 32, 32, 8]`). A value whose shape reads the same both ways (as many channels
//! as rows and columns) is relaid when its samples look more like the reference's (its
//! [`Fingerprint`]) moved than as laid out.

use std::collections::HashMap;

use layerdiff_core::{
    DType, Evidence, Fingerprint, SideInfo, Summary, TargetGraph, Tensor, TensorView,
};

use crate::Result;
use crate::engine::evidence::{WeightCheck, WeightCheckFn};
use crate::engine::plan::{Part, PlanSide};
use crate::engine::side::{Group, Member, QuantizedValue, Receive, Recompute, Side};
use crate::timings::Stopwatch;

/// The permutation that takes a channels-first value to channels-last (`[0, 2, 3, 1]` for a
/// rank-4 value), for the ranks a channel axis is moved at (3 to 5).
fn channels_last(rank: usize) -> Option<Vec<usize>> {
    (3..=5)
        .contains(&rank)
        .then(|| [0].into_iter().chain(2..rank).chain([1]).collect())
}

/// The inverse of a permutation.
fn inverse(p: &[usize]) -> Vec<usize> {
    let mut back = vec![0; p.len()];
    for (k, &a) in p.iter().enumerate() {
        back[a] = k;
    }
    back
}

/// How a target value of shape `target` is brought to the reference's `reference`: the
/// permutation, when it is the reference's channels-last value held channels-first, and whether
/// the shapes alone cannot tell (they read the same both ways).
pub fn relayout(target: &[usize], reference: &[usize]) -> Option<(Vec<usize>, bool)> {
    let p = channels_last(target.len())?;
    let moved: Vec<usize> = p.iter().map(|&a| target[a]).collect();
    (moved == reference).then_some((p, target == reference))
}

/// A target whose channels-first values are compared channels-last (see the module docs).
pub struct RelaidSide<S> {
    inner: S,
    /// The reference's shape of each target value that is compared, and a sample of its
    /// value where known.
    references: HashMap<String, (Vec<usize>, Option<Fingerprint>)>,
    /// The permutation each relaid value was brought back with (kept after it is dropped, to
    /// feed re-runs and say what was done).
    permutations: HashMap<String, Vec<usize>>,
    /// The relaid values held now, in the reference's layout.
    held: HashMap<String, Tensor>,
}

impl<S: Side> RelaidSide<S> {
    /// Wraps `inner`; `references` gives the reference's shape of each compared target value,
    /// and a sample of its value where known.
    pub fn new(inner: S, references: HashMap<String, (Vec<usize>, Option<Fingerprint>)>) -> Self {
        Self {
            inner,
            references,
            permutations: HashMap::new(),
            held: HashMap::new(),
        }
    }

    /// The permutation a value was brought to the reference's layout with, if it was.
    pub fn permutation(&self, value: &str) -> Option<&[usize]> {
        self.permutations.get(value).map(Vec::as_slice)
    }

    /// `value` in the target's own layout (a reference value fed to its re-runs).
    fn to_target(&self, value: &str, tensor: Tensor) -> Tensor {
        match self.permutations.get(value) {
            Some(p) => tensor.permuted(&inverse(p)).unwrap_or(tensor),
            None => tensor,
        }
    }

    /// Brings the values `names` just computed to the reference's layout, where they differ.
    fn relay(&mut self, names: &[String]) {
        for name in names {
            let (Some((shape, print)), Some(value)) =
                (self.references.get(name), self.inner.get(name))
            else {
                continue;
            };
            let Some((p, ambiguous)) = relayout(&value.shape, shape) else {
                continue;
            };
            let Some(relaid) = value.permuted(&p) else {
                continue;
            };
            if ambiguous {
                // the shapes cannot tell: the layout whose samples look more like the reference's
                let Some(print) = print else { continue };
                let likeness = |t: &Tensor| print.likeness(&Fingerprint::of(t.view()));
                if likeness(&relaid) <= likeness(value) {
                    continue;
                }
            }
            self.permutations.insert(name.clone(), p);
            self.held.insert(name.clone(), relaid);
        }
    }

    fn relaid(&self, mut values: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
        for (name, value) in &mut values {
            if let Some(p) = self.permutations.get(name.as_str())
                && let Some(relaid) = value.permuted(p)
            {
                *value = relaid;
            }
        }
        values
    }
}

impl<S: Side> Side for RelaidSide<S> {
    fn describe(&mut self, summary: &mut Summary) -> SideInfo {
        let mut info = self.inner.describe(summary);
        if !self.permutations.is_empty() {
            info.detail += &format!(
                "; {} of its values, held channels-first, compared transposed to the reference's channels-last layout",
                self.permutations.len()
            );
        }
        info
    }
    fn plan_view(&self) -> PlanSide<'_> {
        self.inner.plan_view()
    }
    fn expose(&mut self, values: &[String]) -> Result<()> {
        self.inner.expose(values)
    }
    fn is_computed(&self) -> bool {
        self.inner.is_computed()
    }
    fn has_layers(&self, layers: usize) -> bool {
        self.inner.has_layers(layers)
    }
    fn produce(
        &mut self,
        part: &Part,
        whole: bool,
        clock: &mut Stopwatch,
        phase: &str,
    ) -> Result<()> {
        self.inner.produce(part, whole, clock, phase)?;
        self.relay(&part.outputs);
        Ok(())
    }
    fn get(&self, value: &str) -> Option<&Tensor> {
        self.held.get(value).or_else(|| self.inner.get(value))
    }
    fn dtype(&self, value: &str) -> Option<DType> {
        self.inner.dtype(value)
    }
    fn free(&mut self, values: &[String]) {
        for v in values {
            self.held.remove(v);
        }
        self.inner.free(values);
    }
    fn again(&self, part: &Part, keep: &[String]) -> Option<[Vec<(String, Tensor)>; 2]> {
        let [a, b] = self.inner.again(part, keep)?;
        Some([self.relaid(a), self.relaid(b)])
    }
    fn disagreement(&self, value: &str) -> Option<f64> {
        self.inner.disagreement(value)
    }
    fn kernels_per_graph(&self) -> Option<&'static str> {
        self.inner.kernels_per_graph()
    }
    fn rewrites(&self) -> Option<String> {
        self.inner.rewrites()
    }
    fn reduced_math(&self) -> Option<layerdiff_runtime::ReducedMath> {
        self.inner.reduced_math()
    }
    fn recompute(&self) -> Option<&dyn Recompute> {
        self.inner.recompute().map(|_| self as &dyn Recompute)
    }
    fn counterpart(&self, member: &Member) -> Option<Member> {
        self.inner.counterpart(member)
    }
    fn weight_check(
        &self,
        layer: usize,
        node: &str,
        position: usize,
        name: &str,
        weight: TensorView<'_>,
        half_step: Option<TensorView<'_>>,
    ) -> Option<WeightCheck> {
        self.inner
            .weight_check(layer, node, position, name, weight, half_step)
    }
    fn graph_report(&mut self, compared: &[&str], summary: &mut Summary) -> Option<TargetGraph> {
        self.inner.graph_report(compared, summary)
    }
    fn receiver(&mut self) -> Option<&mut dyn Receive> {
        self.inner.receiver()
    }
}

/// Re-runs go to the wrapped side in its own layout: fed values are transposed to it, and the
/// output brought back.
impl<S: Side> Recompute for RelaidSide<S> {
    fn local_group(&self, value: &str, known: &dyn Fn(&str) -> bool) -> Result<Group, String> {
        self.inner()?.local_group(value, known)
    }
    fn run_group(
        &self,
        group: &Group,
        value: &str,
        feed: &dyn Fn(&str) -> Result<Tensor, String>,
    ) -> Result<Tensor, String> {
        let fed = |n: &str| feed(n).map(|t| self.to_target(n, t));
        let out = self.inner()?.run_group(group, value, &fed)?;
        Ok(match self.permutations.get(value) {
            Some(p) => out.permuted(p).unwrap_or(out),
            None => out,
        })
    }
    fn take_time(&self) -> std::time::Duration {
        self.inner().map(|r| r.take_time()).unwrap_or_default()
    }
    fn rounding_stages(&self, group: &Group, grid: DType) -> u32 {
        self.inner()
            .map(|r| r.rounding_stages(group, grid))
            .unwrap_or(0)
    }
    fn computes_in(&self, group: &Group) -> Option<DType> {
        self.inner().ok()?.computes_in(group)
    }
    fn traced_inputs(&self, group: &Group) -> Vec<String> {
        self.inner()
            .map(|r| r.traced_inputs(group))
            .unwrap_or_else(|_| group.inputs.clone())
    }
    fn members(&self, group: &Group) -> Vec<Member> {
        self.inner().map(|r| r.members(group)).unwrap_or_default()
    }
    fn grids(&self, group: Option<&Group>, value: &str) -> Vec<QuantizedValue> {
        self.inner()
            .map(|r| r.grids(group, value))
            .unwrap_or_default()
    }
    fn group_evidence(
        &self,
        group: &Group,
        value: &str,
        reference: Option<DType>,
        evidence: &mut Evidence,
        fed: &dyn Fn(&str) -> Option<(DType, DType)>,
        check: &WeightCheckFn<'_>,
    ) {
        if let Ok(r) = self.inner() {
            r.group_evidence(group, value, reference, evidence, fed, check);
        }
    }
}

impl<S: Side> RelaidSide<S> {
    fn inner(&self) -> std::result::Result<&dyn Recompute, String> {
        self.inner
            .recompute()
            .ok_or_else(|| "the target cannot re-run its own computation".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channels_first_value_is_brought_back_only_when_its_shape_says_so() {
        assert_eq!(
            relayout(&[1, 8, 32, 16], &[1, 32, 16, 8]),
            Some((vec![0, 2, 3, 1], false))
        );
        assert_eq!(
            relayout(&[2, 8, 5], &[2, 5, 8]),
            Some((vec![0, 2, 1], false))
        );
        // the same shape either way: the values decide
        assert_eq!(
            relayout(&[1, 8, 8, 8], &[1, 8, 8, 8]),
            Some((vec![0, 2, 3, 1], true))
        );
        // another shape, a matrix: left as laid out
        assert_eq!(relayout(&[1, 8, 32, 16], &[1, 16, 32, 8]), None);
        assert_eq!(relayout(&[4, 8], &[8, 4]), None);
        assert_eq!(inverse(&[0, 2, 3, 1]), vec![0, 3, 1, 2]);
    }
}
