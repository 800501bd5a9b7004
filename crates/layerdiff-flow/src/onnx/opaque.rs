//! `--opaque`: a target that cannot show its layers without changing its graph (a compiled
//! engine fuses what no output reads; marking every value an output breaks the fusion under
//! test). Its graph runs unmodified: whole first (the check), then on node ranges fed with the
//! reference's values, halved towards the range whose outputs deviate beyond what precision
//! explains until one node is left. That node is then compared alone as a per-layer run compares
//! a layer (its own error, the same-precision baseline, the causes), and its report is the run's.
//!
//! A range's outputs are the values it hands on (read after it, or the graph's own outputs):
//! the target never computes a value more than the range needs. Each is judged by the
//! same-precision rule (`layerdiff_core::assess_baseline`) against an ideal implementation of
//! the range at the target's precision: the reference's nodes in float64, one at a time, each
//! value computed in the dtype the target computes it in ([`Search::ideal_chain`]). The
//! reference's values are held whole, or one range's at a time where they would pass the memory
//! budget (`values.rs`).

use std::collections::{HashMap, HashSet};

use layerdiff_core::{DType, OpaqueSearch, RangeTried, Tensor, assess_baseline};
use layerdiff_onnx::{GraphIndex, Model, extract_nodes, group_of_at_most};
use layerdiff_runtime::{ReducedMath, Runtime};

mod alone;
mod counted;
mod values;

use counted::Counted;
use values::ReferenceValues;

use super::pieces::feeds_of;
use super::setup::{MadeInputs, built, loaded, made_inputs};
use super::{OnnxOptions, Outcome};
use crate::engine::side::Group;
use crate::inputs::{check_inputs, fit_inputs};
use crate::sides::graph::rerun::{moves_data, node_computes};
use crate::{Error, GraphBaseline, Result};

/// Compares as `layerdiff onnx --opaque` does: the search, then the node it narrowed to
/// compared alone (or, where the whole graph is within its precision, its outputs compared),
/// that report carrying the search. `target`: a runtime of one's own instead of the options'.
pub(crate) fn compare(
    options: &OnnxOptions,
    target: Option<Box<dyn Runtime + Send + Sync>>,
    progress: bool,
) -> Result<Outcome> {
    let loaded = loaded(options, &[])?;
    let reference_model = loaded.reference_model;
    let target_model = loaded
        .target_model
        .unwrap_or_else(|| reference_model.clone());
    let refuse = |side: &str| {
        Error::Usage(format!(
            "--opaque runs the target on the reference's values: the {side} must be a runtime, not a file of values"
        ))
    };
    let reference = built(&options.reference, options)?.ok_or_else(|| refuse("reference"))?;
    let target = match target {
        Some(own) => own,
        None => built(&options.target_spec(), options)?.ok_or_else(|| refuse("target"))?,
    };
    let target = Counted::new(target);
    let MadeInputs { inputs, .. } = made_inputs(options, &reference_model, &[])?;
    let index = GraphIndex::new(target_model.graph());
    check_inputs(&index, &fit_inputs(&index, &inputs).0)?;
    let mut search = Search {
        reference_index: GraphIndex::new(reference_model.graph()),
        reference_model: &reference_model,
        values: ReferenceValues::new(
            &reference_model,
            reference.as_ref(),
            &inputs,
            options.settings.max_memory,
        )?,
        baseline: GraphBaseline::new(&reference_model)?,
        reduced: target.reduced_math(),
        index,
        model: &target_model,
        target: &target,
        inputs: &inputs,
    };
    let say = |line: String| {
        if progress {
            eprintln!("{line}");
        }
    };
    let (ranges, node) = search.bisect(&say)?;
    let mut found = OpaqueSearch {
        nodes: search.index.nodes().len(),
        ranges,
        node: node.map(|n| search.name(n)),
        op: node.map(|n| search.index.nodes()[n].op_type.clone()),
        runs: 0,
    };
    let folder =
        tempfile::tempdir().map_err(|e| Error::Usage(format!("no temporary folder: {e}")))?;
    let mut outcome = match node {
        Some(n) => search.node_alone(options, n, folder.path(), &target)?,
        None => search.outputs_compared(options, &target)?,
    };
    if let Some(warning) = search.values.warning() {
        outcome.report.summary.warnings.push(warning);
    }
    drop(search);
    found.runs = target.runs();
    outcome.report.model = super::file_name(&options.model);
    outcome.report.opaque = Some(found);
    Ok(outcome)
}

/// The search's state: the target's graph, the reference's values of every value, and the
/// float64 reference for each range's exact value.
struct Search<'a> {
    index: GraphIndex,
    reference_index: GraphIndex,
    reference_model: &'a Model,
    model: &'a Model,
    target: &'a Counted,
    reduced: Option<ReducedMath>,
    inputs: &'a [(String, Tensor)],
    /// The reference's values: which it computes, and those the range at hand needs.
    values: ReferenceValues<'a>,
    baseline: GraphBaseline,
}

impl Search<'_> {
    /// The whole graph, then halves of the range known to deviate, first half tried: the
    /// ranges run, and the node left (`None` when the whole graph is within its precision).
    fn bisect(&mut self, say: &dyn Fn(String)) -> Result<(Vec<RangeTried>, Option<usize>)> {
        let (mut lo, mut hi) = (0, self.index.nodes().len());
        let whole = self.range(lo, hi)?;
        say(format!(
            "opaque: the whole graph, run unmodified: {:.2}× what its precision explains (the verdict's multiple)",
            whole.multiple
        ));
        let deviates = whole.deviates;
        let mut ranges = vec![whole];
        if !deviates {
            return Ok((ranges, None));
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let first = self.range(lo, mid)?;
            say(format!(
                "opaque: nodes {lo}..{mid} of {}: {:.2}×",
                self.index.nodes().len(),
                first.multiple
            ));
            if first.deviates {
                hi = mid;
            } else {
                lo = mid;
            }
            ranges.push(first);
        }
        Ok((ranges, Some(lo)))
    }

    /// Nodes `lo..hi` run on the target fed with the reference's values, each value they hand
    /// on judged against what precision explains there.
    fn range(&mut self, lo: usize, hi: usize) -> Result<RangeTried> {
        let nodes: Vec<usize> = (lo..hi).collect();
        let produced: HashSet<&str> = nodes
            .iter()
            .flat_map(|&n| self.index.nodes()[n].outputs.iter().map(String::as_str))
            .filter(|v| !v.is_empty())
            .collect();
        let outputs = self.handed_on(lo, hi, &produced);
        let (first, last) = (self.name(lo), self.name(hi - 1));
        let tried = |multiple: f64, deviates: bool| RangeTried {
            first: first.clone(),
            last: last.clone(),
            nodes: hi - lo,
            outputs: outputs.len(),
            multiple,
            deviates,
        };
        let whole = lo == 0 && hi == self.index.nodes().len();
        if outputs.is_empty() && whole {
            // nothing compared is no finding: say so rather than pass the graph
            return Err(Error::Usage(
                "--opaque judges the target's graph by its outputs, and the reference computes \
                 none of them (the two files name their outputs differently)"
                    .to_string(),
            ));
        }
        if outputs.is_empty() {
            return Ok(tried(0.0, false));
        }
        let known = |v: &str| !produced.contains(v);
        let needed = self.needs(&nodes, &outputs, &known);
        self.values.hold(needed)?;
        // The whole graph runs as the file holds it; a range as its own graph.
        let got = if whole {
            let (inputs, _) = fit_inputs(&self.index, self.inputs);
            self.target.run(self.model, &inputs, &outputs)?
        } else {
            let (piece, feeds) = self.piece(&nodes, &outputs)?;
            let (feeds, _) = fit_inputs(&GraphIndex::new(piece.graph()), &feeds);
            self.target.run(&piece, &feeds, &outputs)?
        };
        let grid = self.grid(&nodes).unwrap_or(DType::F32);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        let ideal = self.ideal_chain(&names, &known)?;
        let mut worst = 0.0f64;
        let mut deviates = false;
        for ((name, own), exact) in got.iter().zip(&ideal) {
            let reference = self.value(name).ok_or_else(|| missing(name))?;
            let judged = assess_baseline(
                reference.view(),
                own.view(),
                exact.view(),
                self.computes(name).unwrap_or(grid),
                0,
                false,
                None,
            )?;
            worst = worst.max(judged.multiple);
            deviates |= judged.beyond();
        }
        Ok(tried(worst, deviates))
    }

    /// `values` as an ideal implementation at the target's precision computes them from the
    /// `known` values (the reference's): the reference's nodes behind them, one at a time, each
    /// exactly (float64) on its inputs rounded to the dtype the target holds them in, weights
    /// rounded to the dtype it computes in. Rounding every value along the way, as the target
    /// does, is what makes a long range's honest error measurable: an allowance by the count
    /// of its roundings would let a whole graph in bfloat16 hide anything.
    fn ideal_chain(&self, values: &[&str], known: &dyn Fn(&str) -> bool) -> Result<Vec<Tensor>> {
        let mut nodes: Vec<usize> = Vec::new();
        for value in values {
            let group = group_of_at_most(&self.reference_index, value, known, usize::MAX).map_err(
                |why| Error::Usage(format!("`{value}` cannot be computed alone: {why}")),
            )?;
            nodes.extend(group.nodes);
        }
        nodes.sort_unstable();
        nodes.dedup();
        // the last node that reads each value, so that it is dropped once read
        let mut last_read: HashMap<&str, usize> = HashMap::new();
        for (k, &n) in nodes.iter().enumerate() {
            for input in &self.reference_index.nodes()[n].inputs {
                last_read.insert(input.as_str(), k);
            }
        }
        let mut computed: HashMap<String, Tensor> = HashMap::new();
        for (k, &n) in nodes.iter().enumerate() {
            let node = &self.reference_index.nodes()[n];
            let inputs: Vec<String> = node
                .inputs
                .iter()
                .filter(|i| !i.is_empty() && !self.reference_index.is_initializer(i))
                .cloned()
                .collect();
            let fed = |name: &str| {
                let t = computed
                    .get(name)
                    .or_else(|| self.value(name))
                    .ok_or_else(|| format!("no value `{name}`"))?;
                Ok((t, self.holds(name).unwrap_or(t.dtype)))
            };
            let group = Group {
                members: vec![n],
                inputs,
            };
            let mut outputs = Vec::new();
            for out in node.outputs.iter().filter(|o| !o.is_empty()) {
                let read = last_read.contains_key(out.as_str()) || values.contains(&out.as_str());
                if !read {
                    continue;
                }
                let grid = self.computes(out).unwrap_or(DType::F32);
                let exact = self.baseline.group_exact(&group, out, grid, &fed).map_err(|why| {
                    Error::Usage(format!(
                        "the float64 reference could not compute `{out}` on the range's inputs: {why}"
                    ))
                })?;
                outputs.push((out.clone(), exact));
            }
            computed.extend(outputs);
            computed.retain(|name, _| {
                values.contains(&name.as_str())
                    || last_read.get(name.as_str()).is_some_and(|&r| r > k)
            });
        }
        values
            .iter()
            .map(|v| computed.remove(*v).ok_or_else(|| missing(v)))
            .collect()
    }

    /// `nodes` of the target's file as a graph of their own handing on `outputs`, and the
    /// reference's values it is fed (as the reference holds them). A value the reference lacks
    /// (a cast a conversion added, a value an optimizer renamed) is computed inside by the
    /// target's own nodes that produce it, not fed.
    fn piece(&self, nodes: &[usize], outputs: &[String]) -> Result<(Model, Vec<(String, Tensor)>)> {
        let taken = self.taken(nodes);
        let value_of = |name: &str| self.value(name);
        let feeds = feeds_of(&self.index, &taken, self.inputs, &value_of)?;
        let piece = extract_nodes(self.model, &taken, outputs, &feeds)?;
        Ok((piece, feeds))
    }

    /// `nodes` and the target's nodes before them that compute what the reference does not
    /// have (see [`Self::piece`]), in order.
    fn taken(&self, nodes: &[usize]) -> Vec<usize> {
        let mut taken: Vec<usize> = nodes.to_vec();
        let mut at = 0;
        while at < taken.len() {
            let node = &self.index.nodes()[taken[at]];
            for input in &node.inputs {
                let fed = input.is_empty() || self.index.is_initializer(input) || self.has(input);
                let producer = self.index.producer(input).map(|p| p.index);
                if let Some(p) = producer.filter(|p| !fed && !taken.contains(p)) {
                    taken.push(p);
                }
            }
            at += 1;
        }
        taken.sort_unstable();
        taken
    }

    /// The reference's values a range of `nodes` handing on `outputs` reads: what its piece is
    /// fed (what its nodes read and do not compute), what it is judged against, and what the
    /// ideal chain behind `outputs` starts from (the `known` values its reference nodes read).
    fn needs(
        &self,
        nodes: &[usize],
        outputs: &[String],
        known: &dyn Fn(&str) -> bool,
    ) -> Vec<String> {
        let mut needed: Vec<String> = outputs.to_vec();
        let taken = self.taken(nodes);
        let computed: HashSet<&str> = (taken.iter())
            .flat_map(|&n| self.index.nodes()[n].outputs.iter().map(String::as_str))
            .collect();
        for &n in &taken {
            let inputs = self.index.nodes()[n].inputs.iter();
            needed.extend(inputs.filter(|i| !computed.contains(i.as_str())).cloned());
        }
        for value in outputs {
            let Ok(group) = group_of_at_most(&self.reference_index, value, known, usize::MAX)
            else {
                continue; // ideal_chain says why
            };
            for n in group.nodes {
                let inputs = self.reference_index.nodes()[n].inputs.iter();
                needed.extend(inputs.filter(|i| known(i)).cloned());
            }
        }
        needed
    }

    /// The values nodes `lo..hi` hand on: read by a node after them, or graph outputs, in the
    /// order the nodes produce them (those the reference also has; the others it cannot judge).
    fn handed_on(&self, lo: usize, hi: usize, produced: &HashSet<&str>) -> Vec<String> {
        let outputs: HashSet<&str> = self
            .index
            .graph_outputs()
            .iter()
            .map(String::as_str)
            .collect();
        let mut handed: Vec<String> = Vec::new();
        for n in lo..hi {
            for value in &self.index.nodes()[n].outputs {
                let read_after = self.index.consumers(value).any(|c| c.index >= hi);
                if produced.contains(value.as_str())
                    && (read_after || outputs.contains(value.as_str()))
                    && self.has(value)
                    && !handed.contains(value)
                {
                    handed.push(value.clone());
                }
            }
        }
        handed
    }

    /// The narrowest float dtype the target computes `nodes` in (moving data computes none).
    fn grid(&self, nodes: &[usize]) -> Option<DType> {
        let graph = self.model.graph();
        nodes
            .iter()
            .map(|&n| &graph.node[n])
            .filter(|node| !moves_data(node.op_type()))
            .filter_map(|node| node_computes(&self.index, self.reduced.as_ref(), node))
            .filter(|d| d.is_float())
            .reduce(|a, b| if b.narrower_than(a) { b } else { a })
    }

    /// The narrowest dtype the target computes `value` in, from the values the reference has:
    /// a float32 value its file computes by a Conv in float16 between two Casts is float16's.
    fn computes(&self, value: &str) -> Option<DType> {
        let known = |v: &str| v != value && self.has(v);
        match layerdiff_onnx::local_group(&self.index, value, &known) {
            Ok(group) => self.grid(&group.nodes).or_else(|| self.holds(value)),
            Err(_) => self.holds(value),
        }
    }

    /// The dtype the target holds `value` in.
    fn holds(&self, value: &str) -> Option<DType> {
        match self.index.producer(value) {
            Some(info) => node_computes(
                &self.index,
                self.reduced.as_ref(),
                &self.model.graph().node[info.index],
            ),
            None => DType::from_onnx_code(self.index.elem_type(value)?).ok(),
        }
    }

    /// The reference's `name` (a value it computes, held now, or a graph input).
    fn value(&self, name: &str) -> Option<&Tensor> {
        (self.values.get(name))
            .or_else(|| self.inputs.iter().find(|(n, _)| n == name).map(|(_, t)| t))
    }

    /// Whether the reference has `name`: a value it computes, or a graph input.
    fn has(&self, name: &str) -> bool {
        self.values.has(name) || self.inputs.iter().any(|(n, _)| n == name)
    }

    /// Node `n` in words: its name, else its op and position.
    fn name(&self, n: usize) -> String {
        let node = &self.index.nodes()[n];
        if node.name.is_empty() {
            format!("{}#{n}", node.op_type)
        } else {
            node.name.clone()
        }
    }
}

fn missing(name: &str) -> Error {
    Error::Usage(format!("the reference has no value `{name}`"))
}
