//! A side that computes an ONNX graph's values with a runtime (ONNX Runtime, tract): in
//! segments of nodes fed from its own earlier values, or whole with the values compared made
//! outputs in place. It can re-run a group of its nodes on given values (`rerun`).
//! When its runtime optimized the file first, it runs the graph that ships and accounts for it
//! ([`shipped`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use layerdiff_core::{SideInfo, Summary, TargetGraph, Tensor, TensorView};
use layerdiff_onnx::{GraphIndex, Model, expose_values, extract_nodes};
use layerdiff_runtime::Runtime;

use crate::engine::evidence::{WeightCheck, model_counterpart, model_weight_check};
use crate::engine::memory::value_sizes;
use crate::engine::plan::{Dataflow, Part, PlanSide};
use crate::engine::side::{Member, Recompute, Side, Values};
use crate::timings::{OWN, RUNTIME, Stopwatch};
use crate::{Error, Result};

pub mod baseline;
pub(crate) mod rerun;
pub mod shipped;

use shipped::{Placement, Renames, Shipped};

/// An ONNX graph's nodes are the steps the planner orders its segments by.
impl Dataflow for GraphIndex {
    fn steps(&self) -> usize {
        self.nodes().len()
    }
    fn reads(&self, step: usize) -> &[String] {
        &self.nodes()[step].inputs
    }
    fn writes(&self, step: usize) -> &[String] {
        &self.nodes()[step].outputs
    }
    fn producer(&self, value: &str) -> Option<usize> {
        GraphIndex::producer(self, value).map(|n| n.index)
    }
}

/// An ONNX model and the runtime that computes it.
pub struct GraphSide {
    /// The file's name, shown before the runtime's own words (`None`: the runtime's only).
    label: Option<String>,
    pub(crate) model: Model,
    pub(crate) index: GraphIndex,
    pub(crate) runtime: Box<dyn Runtime + Send + Sync>,
    sizes: HashMap<String, u64>,
    values: Values,
    /// The extract the last segment ran (`None`: the whole model).
    segment: Option<Model>,
    /// Time spent inside the runtime by re-runs of groups.
    inference: AtomicU64,
    shipped: Option<Shipped>,
    placement: Option<Placement>,
    pub(crate) renames: Renames,
    /// What the report should say about how this side was fed.
    notes: Vec<String>,
    /// The side's own file computed exactly, where the flow asks for it (see
    /// [`GraphSide::computing_as_written`]).
    pub(crate) as_written: Option<AsWritten>,
    /// The file the runtime optimized into the graph this side runs, and its index (made on
    /// first use).
    optimized_from: Option<(Model, std::sync::OnceLock<GraphIndex>)>,
    /// The most nodes a layer's group may hold ([`layerdiff_onnx::MAX_GROUP_NODES`], unless
    /// the flow compares only a graph's outputs: then the group is the graph).
    pub(crate) reach: usize,
}

/// A side's own graph in float64, made on first use: a layer whose own error is beyond what
/// its precision explains is computed by it as the file writes it, to tell the file from the
/// runtime (only such layers ask, so a clean run never makes it).
pub(crate) struct AsWritten {
    pub(crate) copy: std::sync::OnceLock<std::result::Result<Box<baseline::GraphBaseline>, String>>,
}

impl GraphSide {
    /// `model` run by `runtime` on `inputs`; `label` names the file in the report.
    pub fn new(
        label: Option<String>,
        model: Model,
        runtime: Box<dyn Runtime + Send + Sync>,
        inputs: &[(String, Tensor)],
    ) -> Self {
        let index = GraphIndex::new(model.graph());
        Self {
            label,
            sizes: value_sizes(&index, inputs),
            index,
            model,
            runtime,
            values: Values::new(inputs.to_vec()),
            segment: None,
            inference: AtomicU64::new(0),
            shipped: None,
            placement: None,
            renames: Renames::default(),
            notes: Vec::new(),
            as_written: None,
            optimized_from: None,
            reach: layerdiff_onnx::MAX_GROUP_NODES,
        }
    }

    /// The side with groups of up to `most` nodes re-run as one layer.
    pub(crate) fn reaching(mut self, most: usize) -> Self {
        self.reach = most;
        self
    }

    /// Computes a layer exactly as this side's file writes it when asked (ONNX Runtime, tract
    /// or layerdiff's own kernels on the float64 copy of its graph):
    /// for a target whose file is not the reference's own computation (an ONNX file against
    /// PyTorch, or against another file), where a runtime computing what the file says tells
    /// the file from the kernel.
    pub fn computing_as_written(mut self) -> Self {
        self.as_written = Some(AsWritten {
            copy: std::sync::OnceLock::new(),
        });
        self
    }

    /// The float64 copy of the graph, made on first use, or why it cannot be (`None`: not
    /// asked for).
    pub(crate) fn written_copy(
        &self,
    ) -> Option<std::result::Result<&baseline::GraphBaseline, String>> {
        let asked = self.as_written.as_ref()?;
        let copy = asked.copy.get_or_init(|| {
            baseline::GraphBaseline::new(&self.model)
                .map(Box::new)
                .map_err(|e| crate::error_chain(&e))
        });
        Some(copy.as_ref().map(|b| &**b).map_err(Clone::clone))
    }

    /// What it took to get the graph that ships: values an optimizer renamed, the check of the
    /// optimized graph's outputs, where the runtime placed the nodes.
    pub fn shipping(
        mut self,
        renames: Renames,
        shipped: Option<Shipped>,
        placement: Option<Placement>,
    ) -> Self {
        self.renames = renames;
        self.optimized_from = shipped
            .as_ref()
            .map(|s| (s.file.clone(), std::sync::OnceLock::new()));
        self.shipped = shipped;
        self.placement = placement;
        self
    }

    /// The file the runtime optimized, and its index (`None`: the side runs the file as given).
    pub(crate) fn optimized_from(&self) -> Option<(&Model, &GraphIndex)> {
        let (model, index) = self.optimized_from.as_ref()?;
        Some((model, index.get_or_init(|| GraphIndex::new(model.graph()))))
    }

    /// Adds sentences for the report's warnings (how this side was fed).
    pub fn noting(mut self, notes: Vec<String>) -> Self {
        self.notes.extend(notes);
        self
    }

    /// Counts time spent inside the runtime by a re-run.
    pub(crate) fn add_time(&self, spent: Duration) {
        let nanos = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.inference.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Time spent inside the runtime by re-runs since the last call.
    pub(crate) fn take_time(&self) -> Duration {
        Duration::from_nanos(self.inference.swap(0, Ordering::Relaxed))
    }
}

impl Side for GraphSide {
    fn describe(&mut self, summary: &mut Summary) -> SideInfo {
        let detail = match &self.label {
            Some(label) => format!("{label} · {}", self.runtime.detail()),
            None => self.runtime.detail(),
        };
        let mut info = SideInfo::new(self.runtime.name(), detail);
        info.options = self.runtime.options().into_iter().collect();
        summary.warnings.append(&mut self.notes);
        if let Some(placement) = self.placement.take() {
            placement.report(&mut info, summary);
        }
        info
    }

    fn plan_view(&self) -> PlanSide<'_> {
        let bytes = self.model.initializer_bytes();
        let mut seen = HashSet::new();
        let step_weights = self
            .index
            .nodes()
            .iter()
            .map(|node| {
                node.inputs
                    .iter()
                    .filter(|i| seen.insert(i.as_str()))
                    .filter_map(|i| bytes.get(i.as_str()))
                    .sum()
            })
            .collect();
        PlanSide {
            graph: Some(&self.index),
            sizes: self.sizes.clone(),
            weights: self.model.weight_bytes(),
            step_weights,
        }
    }

    fn expose(&mut self, values: &[String]) -> Result<()> {
        expose_values(&mut self.model, values)?;
        self.index = GraphIndex::new(self.model.graph());
        Ok(())
    }

    fn produce(
        &mut self,
        part: &Part,
        whole: bool,
        clock: &mut Stopwatch,
        phase: &str,
    ) -> Result<()> {
        self.segment = None;
        if part.outputs.is_empty() {
            return Ok(());
        }
        if !whole {
            self.segment = Some(extract_nodes(
                &self.model,
                &part.nodes,
                &part.outputs,
                self.values.all(),
            )?);
        }
        clock.lap("extracting segments", OWN);
        let model = self.segment.as_ref().unwrap_or(&self.model);
        let out = self.runtime.run(model, self.values.all(), &part.outputs);
        if out.is_err() {
            clock.lap(phase, RUNTIME); // a runtime that fails spends its own time doing so
        }
        let out = out.map_err(|e| {
                let text = e.to_string().trim_end().to_string();
                if text.contains("Failed to allocate memory") {
                    Error::Memory(format!(
                        "{} ran out of memory: {text}; a smaller --max-memory runs the graph in smaller segments",
                        self.runtime.name()
                    ))
                } else {
                    e.into()
                }
            })?;
        for (name, tensor) in out {
            self.values.insert(name, tensor);
        }
        clock.lap(phase, RUNTIME);
        if let Some(shipped) = self.shipped.as_mut() {
            shipped.check_outputs(&self.values);
        }
        Ok(())
    }

    fn get(&self, value: &str) -> Option<&Tensor> {
        self.values.get(value)
    }

    fn dtype(&self, value: &str) -> Option<layerdiff_core::DType> {
        self.values.dtype(value)
    }

    fn free(&mut self, values: &[String]) {
        self.values.free(values);
    }

    fn again(&self, part: &Part, keep: &[String]) -> Option<[Vec<(String, Tensor)>; 2]> {
        let model = self.segment.as_ref().unwrap_or(&self.model);
        self.runtime
            .run_twice(model, self.values.all(), &part.outputs, keep)
            .ok()
    }

    fn kernels_per_graph(&self) -> Option<&'static str> {
        const FLOAT16: i32 = 10;
        const BFLOAT16: i32 = 16;
        let half = || {
            self.index.nodes().iter().any(|n| {
                n.outputs
                    .iter()
                    .any(|o| matches!(self.index.elem_type(o), Some(FLOAT16 | BFLOAT16)))
            })
        };
        self.runtime.kernels_per_graph().or_else(|| {
            (self.runtime.casts_half_per_graph() && half()).then_some(
                "CPUExecutionProvider on float16 values (it computes nodes without a float16 kernel in float32, with casts it places for each graph)",
            )
        })
    }

    fn rewrites(&self) -> Option<String> {
        self.runtime.rewrites().then(|| self.runtime.detail())
    }

    /// The runtime's narrower math, where the model has an op it narrows (its subgraphs'
    /// included): a graph of Gather and Concat computes as its file says.
    fn reduced_math(&self) -> Option<layerdiff_runtime::ReducedMath> {
        let reduced = self.runtime.reduced_math()?;
        self.model.has_op(reduced.ops).then_some(reduced)
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        Some(self)
    }

    fn counterpart(&self, member: &Member) -> Option<Member> {
        model_counterpart(&self.model, member)
    }

    fn weight_check(
        &self,
        _layer: usize,
        node: &str,
        position: usize,
        name: &str,
        weight: TensorView<'_>,
        half_step: Option<TensorView<'_>>,
    ) -> Option<WeightCheck> {
        model_weight_check(&self.model, node, position, name, weight, half_step)
    }

    fn graph_report(&mut self, compared: &[&str], summary: &mut Summary) -> Option<TargetGraph> {
        let shipped = self.shipped.take()?;
        Some(shipped.finish(compared.iter().copied(), &self.renames, summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerdiff_onnx::{GraphProto, ModelProto, NodeProto};
    use layerdiff_runtime::ReducedMath;

    /// A runtime that says it computes MatMul in bfloat16 (OpenVINO at its bf16 precision).
    struct Narrowing;

    impl Runtime for Narrowing {
        fn name(&self) -> &str {
            "narrowing"
        }
        fn detail(&self) -> String {
            "computes float32 MatMuls in bfloat16".into()
        }
        fn reduced_math(&self) -> Option<ReducedMath> {
            Some(ReducedMath {
                ops: &["MatMul"],
                grid: Some(layerdiff_core::DType::BF16),
                how: "MatMul in bfloat16".into(),
            })
        }
        fn run(
            &self,
            _: &Model,
            _: &[(String, Tensor)],
            _: &[String],
        ) -> layerdiff_runtime::Result<Vec<(String, Tensor)>> {
            unreachable!("not run")
        }
    }

    fn side_of(op: &str) -> GraphSide {
        let node = NodeProto {
            op_type: Some(op.into()),
            input: vec!["x".into(), "y".into()],
            output: vec!["z".into()],
            ..Default::default()
        };
        let graph = GraphProto {
            node: vec![node],
            ..Default::default()
        };
        let proto = ModelProto {
            graph: Some(graph),
            ..Default::default()
        };
        GraphSide::new(
            None,
            Model::from_proto(proto, None),
            Box::new(Narrowing),
            &[],
        )
    }

    #[test]
    fn a_runtime_that_narrows_ops_the_model_lacks_computes_it_as_written() {
        // a reference whose runtime narrows MatMul read "the reference does not compute as
        // its file says" on a graph of Gather and Concat
        assert!(side_of("Concat").reduced_math().is_none());
        let narrowed = side_of("MatMul")
            .reduced_math()
            .expect("MatMul is narrowed");
        assert_eq!(narrowed.how, "MatMul in bfloat16");
    }
}
