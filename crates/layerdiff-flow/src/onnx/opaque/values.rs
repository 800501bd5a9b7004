//! The reference's values the search feeds its ranges and judges them by. Held all at once from
//! one run of the reference where they fit the memory budget (`--max-memory`, else what the
//! machine leaves, see [`budget`]); where they would not, each range holds only its own, from a
//! run of the reference that hands on just those: one reference run per range, memory bounded
//! by the range's values rather than the graph's.

use std::collections::{HashMap, HashSet};

use layerdiff_core::Tensor;
use layerdiff_onnx::{GraphIndex, Model, expose_values};
use layerdiff_runtime::Runtime;

use crate::Result;
use crate::engine::memory::{budget, bytes_text, value_sizes};

/// The reference's values: which exist, and those held now.
pub(super) struct ReferenceValues<'a> {
    model: &'a Model,
    reference: &'a (dyn Runtime + Send + Sync),
    inputs: &'a [(String, Tensor)],
    /// Every value the reference's graph computes, in the order its nodes do.
    names: Vec<String>,
    known: HashSet<String>,
    held: HashMap<String, Tensor>,
    /// Where the values are held per range: their estimated bytes in all, and the budget they
    /// would pass.
    per_range: Option<(u64, u64)>,
}

impl<'a> ReferenceValues<'a> {
    /// The reference's values of `model` on `inputs`, held all at once where they fit the
    /// budget (`given`, else the default one).
    pub(super) fn new(
        model: &'a Model,
        reference: &'a (dyn Runtime + Send + Sync),
        inputs: &'a [(String, Tensor)],
        given: Option<u64>,
    ) -> Result<Self> {
        let mut seen: HashSet<&str> = HashSet::new();
        let names: Vec<String> = (model.graph().node.iter())
            .flat_map(|n| &n.output)
            .filter(|v| !v.is_empty() && seen.insert(v.as_str()))
            .cloned()
            .collect();
        let sizes = value_sizes(&GraphIndex::new(model.graph()), inputs);
        let total: u64 = names.iter().filter_map(|n| sizes.get(n)).sum();
        let mut values = Self {
            model,
            reference,
            inputs,
            known: names.iter().cloned().collect(),
            names,
            held: HashMap::new(),
            per_range: budget(given).filter(|&b| total > b).map(|b| (total, b)),
        };
        if values.per_range.is_none() {
            values.held = values.run(&values.names)?;
        }
        Ok(values)
    }

    /// Whether the reference computes `name`.
    pub(super) fn has(&self, name: &str) -> bool {
        self.known.contains(name)
    }

    /// The reference's `name`, where it is held now (see [`Self::hold`]).
    pub(super) fn get(&self, name: &str) -> Option<&Tensor> {
        self.held.get(name)
    }

    /// Holds the reference's values of `names` (the others are no values of its), and no
    /// others, where values are held per range; nothing to do where all are held.
    pub(super) fn hold(&mut self, names: impl IntoIterator<Item = String>) -> Result<()> {
        if self.per_range.is_none() {
            return Ok(());
        }
        let mut wanted: Vec<String> = names.into_iter().filter(|n| self.has(n)).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut have: Vec<&String> = self.held.keys().collect();
        have.sort_unstable();
        if have.iter().copied().eq(wanted.iter()) {
            return Ok(());
        }
        self.held.clear(); // before the run, so that the two are never held together
        self.held = self.run(&wanted)?;
        Ok(())
    }

    /// What a reader of the report should know of how the values were held (`None` where all
    /// were held at once).
    pub(super) fn warning(&self) -> Option<String> {
        self.per_range.map(|(total, budget)| {
            format!(
                "--opaque held the reference's values one range at a time (about {} in all, over \
                 the memory budget of {}): the reference ran once for each range tried; see \
                 --max-memory",
                bytes_text(total),
                bytes_text(budget)
            )
        })
    }

    fn run(&self, wanted: &[String]) -> Result<HashMap<String, Tensor>> {
        if wanted.is_empty() {
            return Ok(HashMap::new());
        }
        let mut exposed = self.model.clone();
        expose_values(&mut exposed, wanted)?;
        Ok(self
            .reference
            .run(&exposed, self.inputs, wanted)?
            .into_iter()
            .collect())
    }
}
