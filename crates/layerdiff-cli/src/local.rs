//! Local error and the evidence behind causes, shared by both flows.
//!
//! A layer's *local* error isolates what the layer adds itself: its target nodes (the group that
//! computes its value from values known on both sides) are extracted into a standalone model and
//! run by the target runtime on the *reference's* values of the group's inputs; the output is
//! compared with the reference's value of the layer.

use layerdiff_core::{DType, Evidence, Layer, Tensor, TensorView, compare, compare_pair};
use layerdiff_onnx::{GraphIndex, LocalGroup, Model, NodeExt, attribute_changes, extract_nodes};
use layerdiff_runtime::Runtime;

/// A weight differs when its max abs diff exceeds this fraction of its largest magnitude:
/// above float32 rounding of a folded constant, far below any real edit.
pub const WEIGHT_RTOL: f64 = 1e-5;

/// Re-runs groups of the target model on given values.
pub(crate) struct Rerun<'a> {
    pub model: &'a Model,
    pub index: GraphIndex,
    pub runtime: &'a (dyn Runtime + Send + Sync),
    /// Time spent inside the runtime, over all re-runs.
    pub inference: std::cell::Cell<std::time::Duration>,
}

impl<'a> Rerun<'a> {
    pub fn new(model: &'a Model, runtime: &'a (dyn Runtime + Send + Sync)) -> Self {
        Self {
            model,
            index: GraphIndex::new(model.graph()),
            runtime,
            inference: Default::default(),
        }
    }

    /// A layer's local error: its group (`slot`) re-run on `feed`'s tensors and compared with
    /// the reference's value; the inputs are named by `name_of`. A group that cannot run leaves
    /// its reason on the layer and in `slot`, so later steps skip it.
    pub fn measure_local(
        &self,
        layer: &mut Layer,
        slot: &mut Option<Result<LocalGroup, String>>,
        value: &str,
        reference: TensorView<'_>,
        feed: &dyn Fn(&str) -> Result<Tensor, String>,
        name_of: &dyn Fn(&str) -> String,
    ) {
        let outcome = match slot {
            Some(Ok(group)) => self.run_group(group, value, feed),
            Some(Err(reason)) => Err(reason.clone()),
            None => return,
        };
        match outcome {
            Ok(out) => {
                layer.local = compare_pair(reference, out.view()).stats;
                let inputs = slot.iter().flatten().flat_map(|g| &g.inputs);
                layer.local_inputs = inputs.map(|n| name_of(n)).collect();
            }
            Err(reason) => {
                layer.local_reason = Some(reason.clone());
                *slot = Some(Err(reason));
            }
        }
    }

    /// The output of a group (computing `value`) run on `feed`'s tensors.
    pub fn run_group(
        &self,
        group: &LocalGroup,
        value: &str,
        feed: &dyn Fn(&str) -> Result<Tensor, String>,
    ) -> Result<Tensor, String> {
        let feeds = group
            .inputs
            .iter()
            .map(|n| Ok((n.clone(), feed(n)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let wanted = [value.to_string()];
        let extract = extract_nodes(self.model, &group.nodes, &wanted, &feeds)
            .map_err(|e| format!("cannot extract its nodes: {e}"))?;
        let started = std::time::Instant::now();
        let out = self.runtime.run(&extract, &feeds, &wanted);
        self.inference.set(self.inference.get() + started.elapsed());
        let out = out.map_err(|e| format!("the target could not run its nodes alone: {e}"))?;
        out.into_iter()
            .next()
            .map(|(_, t)| t)
            .ok_or_else(|| "the re-run returned nothing".to_string())
    }

    /// What a re-run group shows about a layer's cause: its ops, how it lowers precision (`fed`
    /// gives each input's dtype on both sides), and the weights it reads, each checked by
    /// `check(node, input position, name, the target's weight)` against the reference's.
    pub fn group_evidence(
        &self,
        group: &LocalGroup,
        evidence: &mut Evidence,
        fed: &dyn Fn(&str) -> Option<(DType, DType)>,
        check: &dyn Fn(usize, usize, &str, &Tensor) -> Option<WeightCheck>,
    ) {
        evidence.ops = self.ops(group);
        if evidence.precision.is_none() {
            evidence.precision = self.lowered_precision(group, fed);
        }
        for (node, position, name) in self.initializers(group) {
            let Some(Ok(weight)) = self.model.initializer(&name) else {
                continue;
            };
            match check(node, position, &name, &weight) {
                Some(WeightCheck::Differs(text)) => evidence.weights.push(text),
                Some(WeightCheck::LowerPrecision(text)) => {
                    evidence.precision.get_or_insert(text);
                }
                Some(WeightCheck::Same) | None => {}
            }
        }
    }

    /// The op types of a group, in graph order (`Conv → Relu`).
    fn ops(&self, group: &LocalGroup) -> Vec<String> {
        group
            .nodes
            .iter()
            .map(|&i| self.index.nodes()[i].op_type.clone())
            .collect()
    }

    /// How the group lowers precision: a Cast to float16/bfloat16, such an initializer, or an
    /// input the target holds in float16/bfloat16 (`fed` gives each input's dtype on both
    /// sides: the reference's, the target's).
    fn lowered_precision(
        &self,
        group: &LocalGroup,
        fed: &dyn Fn(&str) -> Option<(DType, DType)>,
    ) -> Option<String> {
        let graph = self.model.graph();
        for input in &group.inputs {
            if let Some((r, t)) = fed(input)
                && t.narrower_than(r)
            {
                return Some(format!(
                    "the target hands this layer `{input}` in {t} (the reference holds it in {r})"
                ));
            }
        }
        // Quantized values first (they usually lose the most), then quantized weights.
        let quantizing = |op: &str, node: &layerdiff_onnx::NodeProto| {
            node.op_type() == op
                && (op == "QuantizeLinear"
                    || node
                        .input
                        .first()
                        .is_some_and(|w| self.index.is_initializer(w)))
        };
        let quantized: Vec<String> = ["QuantizeLinear", "DequantizeLinear"]
            .into_iter()
            .flat_map(|op| {
                group
                    .nodes
                    .iter()
                    .map(|&i| &graph.node[i])
                    .filter(move |node| quantizing(op, node))
            })
            .map(|node| self.quantization(node))
            .collect();
        if !quantized.is_empty() {
            return Some(quantized.join("; "));
        }
        for &i in &group.nodes {
            let node = &graph.node[i];
            if node.op_type() == "Cast"
                && let Ok(to) = node.attr_i64("to")
                && let Ok(dtype) = DType::from_onnx_code(to as i32)
                && matches!(dtype, DType::F16 | DType::BF16)
            {
                return Some(format!(
                    "the target casts to {dtype} inside this layer (node `{}`)",
                    node.display_name()
                ));
            }
            for input in &node.input {
                if let Some(init) = graph.initializer.iter().find(|t| t.name() == input)
                    && let Ok(dtype) = DType::from_onnx_code(init.data_type())
                    && matches!(dtype, DType::F16 | DType::BF16)
                {
                    return Some(format!(
                        "the target stores `{input}` in {dtype} and computes this layer in it"
                    ));
                }
            }
        }
        None
    }

    /// How a QuantizeLinear node, or the DequantizeLinear of a stored weight, rounds, in words:
    /// to which integer type, with which scale (`to uint8 with scale 0.0235, zero point 128`;
    /// per-channel scales as their range).
    fn quantization(&self, node: &layerdiff_onnx::NodeProto) -> String {
        let read = |position: usize| {
            let name = node.input.get(position).filter(|n| !n.is_empty())?;
            self.model.initializer(name)?.ok()
        };
        // A QuantizeLinear rounds to its zero point's type; a DequantizeLinear of a stored
        // weight reads that weight's type.
        let stored = (node.op_type() == "DequantizeLinear")
            .then(|| read(0))
            .flatten();
        let to = stored
            .or_else(|| read(2))
            .map_or("uint8".to_string(), |t| t.dtype.name().to_string());
        let values = |t: Tensor| -> Vec<f64> {
            let view = t.view();
            (0..view.numel()).map(|i| view.get_f64(i)).collect()
        };
        let scale = read(1)
            .map(values)
            .map_or(String::new(), |scales| match scales.as_slice() {
                [one] => format!(" with scale {one:.4e}"),
                many => {
                    let lo = many.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = many.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    format!(
                        " with {} per-channel scales from {lo:.4e} to {hi:.4e}",
                        many.len()
                    )
                }
            });
        let zero = read(2)
            .map(values)
            .filter(|z| z.len() == 1)
            .map_or(String::new(), |z| format!(", zero point {}", z[0]));
        if node.op_type() == "DequantizeLinear" {
            return format!(
                "the target stores `{}` quantized to {to}{scale}{zero} and dequantizes it inside this layer (node `{}`): each weight is off by up to half a scale step",
                node.input[0],
                node.display_name()
            );
        }
        format!(
            "the target quantizes inside this layer (node `{}`): to {to}{scale}{zero}; each value moves by up to half a scale step",
            node.display_name()
        )
    }

    /// The initializers a group reads: (node index, input position, name).
    fn initializers(&self, group: &LocalGroup) -> Vec<(usize, usize, String)> {
        let mut out = Vec::new();
        for &i in &group.nodes {
            for (position, input) in self.index.nodes()[i].inputs.iter().enumerate() {
                if self.index.is_initializer(input) {
                    out.push((i, position, input.clone()));
                }
            }
        }
        out
    }

    /// Attribute changes between the reference's nodes and the group's nodes of the same name.
    pub fn attribute_changes(&self, reference: &Model, group: &LocalGroup) -> Vec<String> {
        let graph = self.model.graph();
        let mut changes = Vec::new();
        for &i in &group.nodes {
            let node = &graph.node[i];
            let Some(same) = reference
                .graph()
                .node
                .iter()
                .find(|n| n.name() == node.name() && n.op_type() == node.op_type())
            else {
                continue;
            };
            for change in attribute_changes(same, node) {
                changes.push(format!("{change} on `{}`", node.display_name()));
            }
        }
        changes
    }
}

/// How a target weight relates to the reference's: the same, different (with a sentence), or
/// stored in lower precision (with a sentence).
pub(crate) enum WeightCheck {
    Same,
    Differs(String),
    LowerPrecision(String),
}

/// Compares one weight of the two sides.
pub(crate) fn check_weight(
    name: &str,
    reference: TensorView<'_>,
    target: TensorView<'_>,
) -> WeightCheck {
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    if squeeze(reference.shape) != squeeze(target.shape) {
        return WeightCheck::Differs(format!(
            "`{name}` has shape {:?} on the target, {:?} on the reference",
            target.shape, reference.shape
        ));
    }
    if target.dtype.narrower_than(reference.dtype) {
        return WeightCheck::LowerPrecision(format!(
            "the target stores `{name}` in {}, the reference in {}",
            target.dtype, reference.dtype
        ));
    }
    let Ok(stats) = compare(reference, target) else {
        return WeightCheck::Same;
    };
    let scale = (0..reference.numel())
        .map(|i| reference.get_f64(i).abs())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    if stats.max_abs_diff > WEIGHT_RTOL * scale || stats.nan_mismatch > 0 {
        WeightCheck::Differs(format!(
            "`{name}` differs: max abs diff {:.3e} ({} of {} elements differ)",
            stats.max_abs_diff, stats.abs_diff_above[0], stats.elements
        ))
    } else {
        WeightCheck::Same
    }
}

/// How far a side disagrees with itself at `value`: its first output against two more runs
/// (max abs diff); `None` when it agrees or was not re-run.
pub(crate) fn disagreement(
    first: &Tensor,
    again: Option<&[Vec<(String, Tensor)>; 2]>,
    value: &str,
) -> Option<f64> {
    let runs = again?;
    fn find<'t>(run: &'t [(String, Tensor)], value: &str) -> Option<&'t Tensor> {
        run.iter().find(|(n, _)| n == value).map(|(_, t)| t)
    }
    let (a, b) = (find(&runs[0], value)?, find(&runs[1], value)?);
    let d = |x: &Tensor, y: &Tensor| compare(x.view(), y.view()).map_or(0.0, |s| s.max_abs_diff);
    Some(d(first, a).max(d(a, b))).filter(|&d| d > 0.0)
}

/// A reference tensor made fit to feed the target in place of `name`: cast to the target's
/// dtype, reshaped to its shape (element counts must agree).
pub(crate) fn fit(
    name: &str,
    reference: Tensor,
    dtype: DType,
    shape: &[usize],
) -> Result<Tensor, String> {
    let given = reference.shape.clone();
    reference.cast(dtype).reshaped(shape).ok_or_else(|| {
        format!("the reference's `{name}` has shape {given:?}, the target's {shape:?}")
    })
}
