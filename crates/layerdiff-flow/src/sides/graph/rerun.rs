//! A graph side re-running groups of its own nodes on given values: the *local* error of a
//! layer (its nodes run on the reference's values of their inputs, so only what the layer adds
//! itself is measured), and the evidence behind a cause (its ops, how it lowers precision, the
//! weights it reads).

use std::time::Duration;

use layerdiff_core::{DType, Evidence, Tensor};
use layerdiff_onnx::{NodeExt, extract_nodes, group_of_at_most, local_group};

use crate::engine::evidence::{WeightCheckFn, node_member};
use crate::engine::side::{Group, Member, QuantizedValue, Recompute};
use crate::sides::graph::GraphSide;

mod lowered;
mod quantized;

impl Recompute for GraphSide {
    fn local_group(&self, value: &str, known: &dyn Fn(&str) -> bool) -> Result<Group, String> {
        let found = group_of_at_most(&self.index, value, known, self.reach)?;
        Ok(Group {
            members: found.nodes,
            inputs: found.inputs,
        })
    }

    fn take_time(&self) -> Duration {
        GraphSide::take_time(self)
    }

    fn reruns_as_run(&self) -> bool {
        !self.runtime.compiles_graph()
            && crate::engine::side::Side::kernels_per_graph(self).is_none()
    }

    fn grids(&self, group: Option<&Group>, value: &str) -> Vec<QuantizedValue> {
        self.quantized_grids(group, value)
    }

    fn members(&self, group: &Group) -> Vec<Member> {
        group
            .members
            .iter()
            .map(|&i| node_member(&self.model.graph().node[i]))
            .collect()
    }

    fn run_group(
        &self,
        group: &Group,
        value: &str,
        feed: &dyn Fn(&str) -> Result<Tensor, String>,
    ) -> Result<Tensor, String> {
        self.run_group_with(group, value, feed, &|_| Ok(()))
    }

    fn as_written(
        &self,
        group: &Group,
        value: &str,
        grid: DType,
        feed: &dyn Fn(&str) -> Result<Tensor, String>,
    ) -> Option<Result<Tensor, String>> {
        let copy = self.written_copy()?;
        let fed = group
            .inputs
            .iter()
            .map(|n| Ok((n.as_str(), feed(n)?)))
            .collect::<Result<Vec<_>, String>>();
        Some(copy.and_then(|copy| {
            let fed = fed?;
            let held = |n: &str| {
                let (_, t) = fed
                    .iter()
                    .find(|(name, _)| *name == n)
                    .ok_or_else(|| format!("`{n}` is not an input of the layer"))?;
                Ok((t, t.dtype))
            };
            copy.group_exact(group, value, grid, &held).map_err(|e| {
                format!("the float64 copy of the target's file could not compute it: {e}")
            })
        }))
    }

    fn rounding_stages(&self, group: &Group, grid: DType) -> u32 {
        let computing = self.computed_dtypes(group).filter(|&d| d == grid).count();
        u32::try_from(computing.saturating_sub(1)).unwrap_or(u32::MAX)
    }

    fn computes_in(&self, group: &Group) -> Option<DType> {
        self.computed_dtypes(group)
            .filter(|d| d.is_float())
            .reduce(|a, b| if b.narrower_than(a) { b } else { a })
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
        evidence.ops = self.ops(group);
        evidence.written = self.written(group);
        if let Some(reduced) = self.runtime.reduced_math() {
            let mut hit: Vec<&str> = Vec::new();
            for op in evidence.ops.iter().map(String::as_str) {
                if reduced.ops.contains(&op) && !hit.contains(&op) {
                    hit.push(op);
                }
            }
            if !hit.is_empty() {
                evidence.reduced_math = Some(format!("{}: {}", hit.join(", "), reduced.how));
            }
        }
        if evidence.precision.is_none() {
            evidence.precision = self.lowered_precision(group, reference, fed);
        }
        // An optimizer reorders and renames the weights it fuses: where the runtime optimized
        // the file, the layer's weights are read on the file's own nodes.
        match self.file_group(group, value) {
            Some((file, members)) => file.weight_evidence(&members, evidence, check),
            None => self
                .stored()
                .weight_evidence(&group.members, evidence, check),
        }
    }
}

impl GraphSide {
    /// The dtype of each computing node's (first) output in the group, where known.
    fn computed_dtypes<'a>(&'a self, group: &'a Group) -> impl Iterator<Item = DType> + 'a {
        let graph = self.model.graph();
        group
            .members
            .iter()
            .map(|&i| &graph.node[i])
            .filter(|node| !moves_data(node.op_type()))
            .filter_map(|node| self.computes(node))
    }

    /// The dtype `node` computes its (first) output in: its declared element type, or the
    /// narrower grid the runtime computes that op in (OpenVINO's bfloat16 inference
    /// precision), where known.
    pub(crate) fn computes(&self, node: &layerdiff_onnx::NodeProto) -> Option<DType> {
        node_computes(&self.index, self.runtime.reduced_math().as_ref(), node)
    }

    /// The dtype the target holds `value` in: as [`GraphSide::computes`] says for the node
    /// that produces it, else its declared element type.
    pub fn holds(&self, value: &str) -> Option<DType> {
        match self.index.producer(value) {
            Some(info) if info.outputs.first().is_some_and(|o| o == value) => {
                self.computes(&self.model.graph().node[info.index])
            }
            _ => DType::from_onnx_code(self.index.elem_type(value)?).ok(),
        }
    }
}

/// The dtype `node` of the graph `index` computes its (first) output in on a runtime that
/// does `reduced` math: its declared element type, or the narrower grid the runtime computes
/// that op in (OpenVINO's bfloat16 inference precision), where known.
pub(crate) fn node_computes(
    index: &layerdiff_onnx::GraphIndex,
    reduced: Option<&layerdiff_runtime::ReducedMath>,
    node: &layerdiff_onnx::NodeProto,
) -> Option<DType> {
    let declared = DType::from_onnx_code(index.elem_type(node.output.first()?)?).ok()?;
    let reduced = reduced.and_then(|r| {
        let grid = r.grid?;
        r.ops.contains(&node.op_type()).then_some(grid)
    });
    match reduced {
        Some(grid) if declared.is_float() && grid.narrower_than(declared) => Some(grid),
        _ => Some(declared),
    }
}

/// Ops that move or select values without computing new ones: they round nothing.
pub(crate) fn moves_data(op: &str) -> bool {
    matches!(
        op,
        "Reshape"
            | "Transpose"
            | "Squeeze"
            | "Unsqueeze"
            | "Flatten"
            | "Identity"
            | "Concat"
            | "Slice"
            | "Gather"
            | "GatherElements"
            | "GatherND"
            | "Split"
            | "Expand"
            | "Shape"
            | "Size"
            | "Constant"
            | "ConstantOfShape"
            | "Tile"
            | "Pad"
            | "MaxPool"
            | "Relu"
            | "Where"
            | "Cast"
            | "Dropout"
            | "Range"
            | "DepthToSpace"
            | "SpaceToDepth"
    )
}

impl GraphSide {
    /// `value` computed by `group` from `feed`'s tensors, the extracted model first changed by
    /// `prepare` (a baseline rounds its weights).
    pub(crate) fn run_group_with(
        &self,
        group: &Group,
        value: &str,
        feed: &dyn Fn(&str) -> Result<Tensor, String>,
        prepare: &dyn Fn(&mut layerdiff_onnx::Model) -> Result<(), String>,
    ) -> Result<Tensor, String> {
        let feeds = group
            .inputs
            .iter()
            .map(|n| Ok((n.clone(), feed(n)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let wanted = [value.to_string()];
        let mut extract = extract_nodes(&self.model, &group.members, &wanted, &feeds)
            .map_err(|e| format!("cannot extract its nodes: {e}"))?;
        prepare(&mut extract)?;
        let started = std::time::Instant::now();
        let out = self.runtime.run(&extract, &feeds, &wanted);
        self.add_time(started.elapsed());
        let out = out.map_err(|e| format!("the target could not run its nodes alone: {e}"))?;
        out.into_iter()
            .next()
            .map(|(_, t)| t)
            .ok_or_else(|| "the re-run returned nothing".to_string())
    }

    /// The op types of a group, in graph order (`Conv → Relu`).
    fn ops(&self, group: &Group) -> Vec<String> {
        group
            .members
            .iter()
            .map(|&i| self.index.nodes()[i].op_type.clone())
            .collect()
    }

    /// What the file writes for a group, node by node: its name, op and attributes, and the
    /// constants it reads (`` `node_gemm` Gemm (alpha 1.01, transB 1; reads `fc.weight`) ``);
    /// at most six nodes, then how many more.
    fn written(&self, group: &Group) -> Vec<String> {
        const SHOWN: usize = 6;
        let graph = self.model.graph();
        let mut out: Vec<String> = group
            .members
            .iter()
            .take(SHOWN)
            .map(|&i| {
                let member = node_member(&graph.node[i]);
                let attributes: Vec<String> = member
                    .attributes
                    .iter()
                    .filter(|_| member.op != "Constant")
                    .map(|(n, v)| format!("{n} {v}"))
                    .collect();
                let mut parts: Vec<String> = Some(attributes.join(", "))
                    .filter(|a| !a.is_empty())
                    .into_iter()
                    .collect();
                let read: Vec<String> = self.index.nodes()[i]
                    .inputs
                    .iter()
                    .filter(|n| self.index.is_initializer(n))
                    .map(|n| format!("`{n}`"))
                    .collect();
                let mut text = format!("`{}` {}", member.shown, member.op);
                if !read.is_empty() {
                    parts.push(format!("reads {}", read.join(", ")));
                }
                if !parts.is_empty() {
                    text.push_str(&format!(" ({})", parts.join("; ")));
                }
                text
            })
            .collect();
        if group.members.len() > SHOWN {
            out.push(format!("{} more", group.members.len() - SHOWN));
        }
        out
    }
}

/// A graph's nodes and stored weights, read for the weights a layer uses: the graph a side
/// runs, or the file its runtime optimized it from.
pub(crate) struct Stored<'a> {
    pub(crate) model: &'a layerdiff_onnx::Model,
    pub(crate) index: &'a layerdiff_onnx::GraphIndex,
}

impl GraphSide {
    /// The graph this side runs.
    fn stored(&self) -> Stored<'_> {
        Stored {
            model: &self.model,
            index: &self.index,
        }
    }

    /// The file's own nodes that compute `value` from the values `group` reads, where the
    /// runtime optimized the file (`None` otherwise, or where the file does not compute
    /// `value` from them).
    fn file_group(&self, group: &Group, value: &str) -> Option<(Stored<'_>, Vec<usize>)> {
        let (model, index) = self.optimized_from()?;
        let known = |n: &str| {
            n != value
                && (group.inputs.iter().any(|i| i == n)
                    || index.graph_inputs().iter().any(|i| i == n))
        };
        let found = local_group(index, value, &known).ok()?;
        Some((Stored { model, index }, found.nodes))
    }
}

impl Stored<'_> {
    /// Checks every float weight the nodes `members` read with `check`, quantized ones
    /// dequantized against half their scale step, and records what differs in `evidence`.
    fn weight_evidence(
        &self,
        members: &[usize],
        evidence: &mut Evidence,
        check: &WeightCheckFn<'_>,
    ) {
        for (node, position, name) in self.initializers(members) {
            // A quantized weight (integers a DequantizeLinear scales back) is not the model's
            // weight in another form: its rounding is the quantization the evidence names.
            let Some(Ok(weight)) = self.model.stored(&name) else {
                continue;
            };
            let reader = &self.index.nodes()[node];
            // nor is a quantizer's scale: no weight of the model (a scale per channel has a
            // bias's shape), it is checked with the weight it dequantizes, and a file's
            // other scales with the file (`file_differs`)
            if !weight.dtype.is_float() || quantizer_parameter(&reader.op_type, position) {
                continue;
            }
            let node = &reader.name;
            if let Some(found) = check(node, position, &name, weight.view(), None) {
                found.record(evidence, node);
            }
        }
        // A quantized weight is checked dequantized, against half its scale step: the same
        // weight quantized, or one that moved beyond its quantization.
        let graph = self.model.graph();
        for &i in members {
            let node = &graph.node[i];
            // the weight a quantized product reads itself (at input `at`): stored in blocks of a
            // few bits, each block with its own scale, as integers scaled after the product, or
            // as integers with their scale beside them
            let (at, own) = match node.op_type() {
                "MatMulNBits" => {
                    let bits = node.attr_i64("bits").unwrap_or(4);
                    evidence
                        .quantized_to
                        .get_or_insert_with(|| format!("int{bits}"));
                    (1, Some(self.block_weight(node)))
                }
                "MatMulInteger" | "ConvInteger" => (1, Some(self.integer_weight(node))),
                // ONNX Runtime's QOperator format: the codes, their scale and zero point beside
                "QLinearConv" | "QLinearMatMul" => (
                    3,
                    (node.input.get(3))
                        .map(|w| crate::engine::evidence::dequantized_codes(self.model, w)),
                ),
                _ => (1, None),
            };
            if let Some(own) = own {
                if let Some((weight, half_step)) = own
                    && let Some(found) = check(
                        node.name(),
                        at,
                        &node.input[at],
                        weight.view(),
                        Some(half_step.view()),
                    )
                {
                    found.record(evidence, node.name());
                }
                continue;
            }
            if node.op_type() != "DequantizeLinear" {
                continue;
            }
            let Some((weight, half_step)) = self.dequantized(node) else {
                continue;
            };
            let Some(output) = node.output.first() else {
                continue;
            };
            let mut read = false;
            for &j in members {
                let reader = &self.index.nodes()[j];
                for (position, input) in reader.inputs.iter().enumerate() {
                    if input != output {
                        continue;
                    }
                    read = true;
                    if let Some(found) = check(
                        &reader.name,
                        position,
                        &node.input[0],
                        weight.view(),
                        Some(half_step.view()),
                    ) {
                        found.record(evidence, &reader.name);
                    }
                }
            }
            // a weight's dequantized value compared as a layer of its own: its codes, at it
            if !read
                && let Some(found) = check(
                    node.name(),
                    0,
                    &node.input[0],
                    weight.view(),
                    Some(half_step.view()),
                )
            {
                found.record(evidence, node.name());
            }
        }
    }

    /// The initializers the nodes `members` read: (node index, input position, name).
    fn initializers(&self, members: &[usize]) -> Vec<(usize, usize, String)> {
        let mut out = Vec::new();
        for &i in members {
            for (position, input) in self.index.nodes()[i].inputs.iter().enumerate() {
                if self.index.is_initializer(input) {
                    out.push((i, position, input.clone()));
                }
            }
        }
        out
    }
}

/// Whether input `position` of an `op` node is a quantizer's scale or zero point.
fn quantizer_parameter(op: &str, position: usize) -> bool {
    match op {
        "QuantizeLinear" | "DequantizeLinear" => position > 0,
        // (x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero[, bias])
        "QLinearConv" | "QLinearMatMul" => matches!(position, 1 | 2 | 4 | 5 | 6 | 7),
        "MatMulInteger" | "ConvInteger" => position > 1,
        _ => false,
    }
}
