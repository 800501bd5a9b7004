//! The weights a captured run's causes need, handed over by the framework after the pass:
//! all at once with the report (`finish`), or a group of layers at a time (`layer_evidence`),
//! so that a model read from its files as it goes is never held whole.

use std::collections::HashMap;

use layerdiff_core::{Report, TensorView};

use super::CapturedRun;
use crate::Result;

impl CapturedRun {
    /// The layers whose causes need weights (after [`CapturedRun::conclude`]), each with the
    /// layers that compute inside it: what [`CapturedRun::layer_evidence`] is given at a time.
    pub fn evidence_groups(&self) -> &[Vec<usize>] {
        &self.evidence_groups
    }

    /// Parameters (by layer, as [`CapturedRun::finish`] takes them) held for the evidence of
    /// the groups they belong to; with `gather`, those groups' causes are gathered now from
    /// everything held, which is dropped after: a framework that reads a model's weights as
    /// it goes hands them over a group at a time (the reference's, then the target's), never
    /// the whole model.
    pub fn layer_evidence(
        &mut self,
        parameters: &HashMap<usize, Vec<(String, TensorView<'_>)>>,
        target_parameters: &HashMap<usize, Vec<(String, TensorView<'_>)>>,
        target_half_steps: &HashMap<usize, Vec<(String, TensorView<'_>)>>,
        gather: bool,
    ) {
        self.held_for_evidence.extend(
            (parameters.keys())
                .chain(target_parameters.keys())
                .chain(target_half_steps.keys()),
        );
        self.set_parameters(parameters, target_parameters, target_half_steps);
        if !gather {
            return;
        }
        let held = std::mem::take(&mut self.held_for_evidence);
        let wanted: Vec<usize> = (self.evidence_groups.iter())
            .filter(|g| held.contains(&g[0]))
            .map(|g| g[0])
            .collect();
        for i in wanted {
            self.engine.evidence_of(i);
        }
        let cleared: HashMap<usize, Vec<(String, TensorView<'_>)>> =
            held.into_iter().map(|i| (i, Vec::new())).collect();
        self.set_parameters(&cleared, &cleared, &cleared);
    }

    fn set_parameters(
        &mut self,
        parameters: &HashMap<usize, Vec<(String, TensorView<'_>)>>,
        target_parameters: &HashMap<usize, Vec<(String, TensorView<'_>)>>,
        target_half_steps: &HashMap<usize, Vec<(String, TensorView<'_>)>>,
    ) {
        let owned = |list: &Vec<(String, TensorView<'_>)>| {
            list.iter()
                .map(|(n, t)| (n.clone(), t.to_tensor()))
                .collect::<Vec<_>>()
        };
        for (&i, list) in parameters {
            self.engine.reference.set_parameters(i, owned(list));
        }
        if let Some(target) = self.engine.target.receiver() {
            for (&i, list) in target_parameters {
                target.set_parameters(i, owned(list));
            }
            for (&i, list) in target_half_steps {
                target.set_half_steps(i, owned(list));
            }
        }
    }

    /// The report, with the weight evidence of the parameters handed over (by layer: PyTorch's
    /// parameters and buffers by qualified name, with the forms an exporter may fold them
    /// into, e.g. a Conv's weight scaled by the BatchNorm after it, under the same name; a
    /// target that stores some quantized hands them dequantized, with half a step per element)
    /// for the layers not gathered yet ([`CapturedRun::layer_evidence`]).
    pub fn finish(self) -> Result<Report> {
        self.engine.finish()
    }
}
