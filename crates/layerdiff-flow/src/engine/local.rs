//! Each layer of a segment re-run locally: the target's group on the reference's values, its
//! output compared with the reference's and measured against its same-precision baseline.

use std::borrow::Cow;

use rayon::prelude::*;

use layerdiff_core::{DType, Layer, LayerStatus, Tensor, assess_baseline, compare_pair};

use super::pairs::{Pairs, judge};
use crate::Shared;
use crate::engine::side::{Group, Recompute};

/// One layer's local re-run: its index, the target's output, and (where a baseline is
/// measured) what it is judged against.
/// The output is the target's own value, borrowed, where the group was not re-run.
pub(crate) type LocalRun<'a> = (usize, Cow<'a, Tensor>, Option<Exact>);

/// A layer beyond its baseline: its index, the target's output of its local re-run, the grid
/// it was judged in and its group's rounding stages.
pub(crate) type Beyond<'a> = (usize, Cow<'a, Tensor>, DType, u32);

/// A layer's exact value on the rounded inputs, or why there is none, with the rounding stages
/// of its group, the dtype it is judged in, and its reduction's terms where the framework
/// measured them (`layerdiff_core::Reduction`: how many, and their root sum of squares).
pub(crate) struct Exact {
    pub value: std::result::Result<Tensor, String>,
    pub stages: u32,
    pub grid: Option<DType>,
    pub reduction: Option<crate::engine::baseline::Terms>,
}

impl<'a> Pairs<'a> {
    /// Layer `i`'s local error, run: the target's group computing its value (`slot`) re-run
    /// on the reference's values of the group's inputs. Returns the output, which
    /// [`Pairs::compare_local`] compares with the reference's value. A group that cannot run
    /// leaves its reason on the layer and in `slot`, so later steps skip it.
    pub fn measure_local(
        &self,
        layer: &mut Layer,
        slot: &mut Option<std::result::Result<Group, String>>,
        recompute: &dyn Recompute,
        i: usize,
    ) -> Option<Cow<'a, Tensor>> {
        let value = self.target_values[i].as_deref()?;
        self.reference.get(&self.reference_values[i])?;
        if layer.status != LayerStatus::Compared {
            return None;
        }
        let first = self.reference_of[value].1;
        if self.shared == Shared::FirstLayerOwns && first != i {
            let earlier = self.reference.get(&self.reference_values[first]);
            let own = self.reference.get(&self.reference_values[i]);
            if let (Some(earlier), Some(own)) = (earlier, own)
                && earlier == own
            {
                // Both sides hand the earlier layer's value on unchanged (a Dropout at
                // inference, `x * 1.0`): on the reference's value, its own computation in the
                // target gives that value back, so its own error is none.
                layer.local_inputs = vec![self.reference_values[first].clone()];
                return Some(Cow::Owned(earlier.clone()));
            }
            layer.local_reason = Some(format!(
                "it holds the same ONNX value as `{}`, so it has no nodes of its own",
                self.reference_values[first]
            ));
            return None;
        }
        if let Some(Ok(group)) = slot.as_ref()
            && let Some(own) = self.own_value_again(recompute, group, value)
        {
            // On the very values its run read, the group computes the side's own value again:
            // that value is its own error, and the re-run is not made.
            layer.local_inputs = self.local_inputs(recompute, group);
            return Some(Cow::Borrowed(own));
        }
        let outcome = match slot {
            Some(Ok(group)) => recompute.run_group(group, value, &|n| self.feed(n)),
            Some(Err(reason)) => Err(reason.clone()),
            None => return None,
        };
        match outcome {
            Ok(out) => {
                if let Some(Ok(group)) = slot.as_ref() {
                    layer.local_inputs = self.local_inputs(recompute, group);
                }
                Some(Cow::Owned(out))
            }
            Err(reason) => {
                layer.local_reason = Some(reason.clone());
                *slot = Some(Err(reason));
                None
            }
        }
    }

    /// The target's own value of `value`, where its group, re-run on the reference's values,
    /// would compute it again: the side's kernels are the same alone, and every value the group
    /// reads is the one the target's run read.
    fn own_value_again(
        &self,
        recompute: &dyn Recompute,
        group: &Group,
        value: &str,
    ) -> Option<&'a Tensor> {
        let again = recompute.reruns_as_run() && group.inputs.iter().all(|n| self.read_as_run(n));
        again.then(|| self.target.get(value)).flatten()
    }

    /// The reference's names of the values `group`'s computation read.
    fn local_inputs(&self, recompute: &dyn Recompute, group: &Group) -> Vec<String> {
        let inputs = recompute.traced_inputs(group).into_iter();
        inputs
            .map(|n| self.reference_of.get(&n).map_or(n, |(r, _)| r.clone()))
            .collect()
    }

    /// Whether a local re-run would feed the target's value `n` as the target's run read it:
    /// a graph input (fed as the target holds it), or a value whose reference twin has the
    /// very same dtype, shape and bits.
    fn read_as_run(&self, n: &str) -> bool {
        let Some(target) = self.target.get(n) else {
            return false;
        };
        if self.inputs.iter().any(|(name, _)| name == n) {
            return true;
        }
        let reference = self
            .reference_of
            .get(n)
            .and_then(|(r, _)| self.reference.get(r));
        reference.is_some_and(|r| {
            r.dtype == target.dtype && r.shape == target.shape && r.bytes == target.bytes
        })
    }

    /// Compares the outputs of local re-runs (`runs`: layer index, output, and the layer's
    /// exact value on the rounded inputs with the rounding stages of its group, or why there is
    /// none; in layer order) with the reference's values, all at once across the threads, and
    /// measures each against its same-precision baseline. `layers` are all the run's layers.
    /// Returns the layers beyond their baseline, with their output, the grid they were judged
    /// in and their group's rounding stages: what [`Pairs::as_written`] measures again.
    pub fn compare_local(&self, layers: &mut [Layer], runs: Vec<LocalRun<'a>>) -> Vec<Beyond<'a>> {
        let mut runs = runs.into_iter().peekable();
        let mut jobs = Vec::new();
        let expected = !self.reference.is_computed();
        for (i, layer) in layers.iter_mut().enumerate() {
            let Some((_, out, exact)) = runs.next_if(|(at, _, _)| *at == i) else {
                continue;
            };
            // the target's own value, taken as its local re-run: compared with the reference's
            // already
            let compared = matches!(&out, Cow::Borrowed(t)
                if self.pair(i).is_some_and(|(_, own)| std::ptr::eq(own, *t)));
            if let Some(reference) = self.reference.get(&self.reference_values[i]) {
                jobs.push((i, layer, reference, out, exact, compared));
            }
        }
        jobs.into_par_iter()
            .filter_map(|(i, layer, reference, out, exact, compared)| {
                let judge = judge(layer, layer.target_dtype.as_deref(), reference, &out);
                // the very tensors the comparison judged, by the same bound: its statistics
                layer.local = match &layer.accumulated {
                    Some(stats) if compared => Some(stats.clone()),
                    _ => compare_pair(reference.view(), out.view(), judge).stats,
                };
                let Exact {
                    value,
                    stages,
                    grid,
                    reduction,
                } = exact?;
                let assessed = value.and_then(|exact| {
                    let grid = grid.ok_or_else(|| "the layer is not a float".to_string())?;
                    let (r, t, x) = (reference.view(), out.view(), exact.view());
                    let reduction = reduction.as_ref().map(|t| t.view());
                    assess_baseline(r, t, x, grid, stages, expected, reduction)
                        .map_err(|e| format!("its exact value does not fit: {e}"))
                });
                match assessed {
                    Ok(b) => {
                        let beyond = b.beyond() && b.reference_off == 0 && !b.accumulates_narrow();
                        layer.baseline = Some(b);
                        Some((i, out, grid?, stages)).filter(|_| beyond)
                    }
                    Err(why) => {
                        layer.baseline_reason = Some(why);
                        None
                    }
                }
            })
            .collect()
    }

    /// Measures again, with their reduction's terms, the float32 layers beyond their baseline
    /// (`beyond`, from [`Pairs::compare_local`]) whose terms the framework did not hand over
    /// and `baseline` measures (a graph's Conv, MatMul, Gemm): a long reduction summed in
    /// another order is beyond the ideal without them (tract's Conv over 4608 terms in
    /// ResNet-50) and within it with them. Returns the layers still beyond (all of them
    /// without a baseline).
    pub fn with_reductions(
        &self,
        layers: &mut [Layer],
        baseline: Option<&dyn crate::engine::baseline::Baseline>,
        beyond: Vec<Beyond<'a>>,
    ) -> Vec<Beyond<'a>> {
        let Some(baseline) = baseline else {
            return beyond;
        };
        let expected = !self.reference.is_computed();
        beyond
            .into_iter()
            .filter(|(i, out, grid, stages)| {
                let layer = &mut layers[*i];
                let value = &self.reference_values[*i];
                let unmeasured = layer.baseline.as_ref().is_some_and(|b| b.narrow.is_none());
                if *grid != DType::F32 || !unmeasured {
                    return true;
                }
                let feed = |n: &str| self.baseline_feed(n);
                let Some(terms) = baseline.measure_reduction(value, *grid, &feed) else {
                    return true;
                };
                let (Some(reference), Ok(exact)) = (
                    self.reference.get(value),
                    baseline.exact(value, *grid, &feed),
                ) else {
                    return true;
                };
                let (r, t, x) = (reference.view(), out.view(), exact.view());
                match assess_baseline(r, t, x, *grid, *stages, expected, Some(terms.view())) {
                    Ok(b) => {
                        let still = b.beyond() && b.reference_off == 0 && !b.accumulates_narrow();
                        layer.baseline = Some(b);
                        still
                    }
                    Err(_) => true,
                }
            })
            .collect()
    }

    /// Measures again the layers beyond their baseline (`beyond`, from
    /// [`Pairs::compare_local`]) against their target's nodes computed exactly as its file
    /// writes them (`recompute`'s [`Recompute::as_written`], on the same inputs): where the
    /// target is within that, the runtime computes what the file says.
    pub fn as_written(
        &self,
        layers: &mut [Layer],
        groups: &[Option<std::result::Result<Group, String>>],
        recompute: &dyn Recompute,
        beyond: Vec<Beyond<'a>>,
    ) {
        for (i, out, grid, stages) in beyond {
            let (Some(value), Some(Ok(group))) = (self.target_values[i].as_deref(), &groups[i])
            else {
                continue;
            };
            let Some(exact) = recompute.as_written(group, value, grid, &|n| self.feed(n)) else {
                return; // the side has no such computation
            };
            let layer = &mut layers[i];
            let assessed = exact.and_then(|exact| {
                // the file's own ideal stands in for an honest reference of the file
                let dtype = DType::from_name(&layer.dtype).unwrap_or(out.dtype);
                let written = exact.clone().cast(dtype);
                let (w, t, x) = (written.view(), out.view(), exact.view());
                assess_baseline(w, t, x, grid, stages, false, None)
                    .map_err(|e| format!("its value as written does not fit: {e}"))
            });
            match assessed {
                Ok(b) => layer.as_written = Some(b),
                Err(why) => layer.as_written_reason = Some(why),
            }
        }
    }
}
