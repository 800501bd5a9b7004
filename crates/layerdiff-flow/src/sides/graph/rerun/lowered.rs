//! How a group lowers precision, in words: the quantization it applies, or a cast, a weight or
//! an input in float16 or bfloat16 below the reference's dtype.

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::NodeExt;

use crate::engine::side::{Group, QuantizedValue};
use crate::sides::graph::GraphSide;

impl GraphSide {
    /// How the group lowers precision: quantization, or, below the dtype the reference computes
    /// the layer in (`reference`; unknown: float32), a Cast to float16/bfloat16, such an
    /// initializer, or an input the target holds in float16/bfloat16 (`fed` gives each input's
    /// dtype on both sides: the reference's, the target's).
    pub(super) fn lowered_precision(
        &self,
        group: &Group,
        reference: Option<DType>,
        fed: &dyn Fn(&str) -> Option<(DType, DType)>,
    ) -> Option<String> {
        let reference = reference.unwrap_or(DType::F32);
        let lower = |dtype: DType| {
            matches!(dtype, DType::F16 | DType::BF16) && dtype.narrower_than(reference)
        };
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
                    .members
                    .iter()
                    .map(|&i| &graph.node[i])
                    .filter(move |node| quantizing(op, node))
            })
            .map(|node| self.quantization(node))
            .collect();
        if !quantized.is_empty() {
            return Some(quantized.join("; "));
        }
        for &i in &group.members {
            let node = &graph.node[i];
            if node.op_type() == "Cast"
                && let Ok(to) = node.attr_i64("to")
                && let Ok(dtype) = DType::from_onnx_code(to as i32)
                && lower(dtype)
            {
                return Some(format!(
                    "the target casts to {dtype} inside this layer (node `{}`)",
                    node.display_name()
                ));
            }
            for input in &node.input {
                if let Some(init) = graph.initializer.iter().find(|t| t.name() == input)
                    && let Ok(dtype) = DType::from_onnx_code(init.data_type())
                    && lower(dtype)
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
}

impl GraphSide {
    /// The grids this graph quantizes values to (see `Recompute::grids`): `value`'s, where a
    /// DequantizeLinear makes it of what a QuantizeLinear rounded; and each input of `group`
    /// a QuantizeLinear of it reads (a graph input, or a value another layer computes).
    pub(in crate::sides::graph) fn quantized_grids(
        &self,
        group: Option<&Group>,
        value: &str,
    ) -> Vec<QuantizedValue> {
        let graph = self.model.graph();
        let node_of = |name: &str| {
            let info = self.index.producer(name)?;
            Some(&graph.node[info.index])
        };
        // each input of the group a QuantizeLinear of it reads
        let mut grids: Vec<QuantizedValue> = group.map_or_else(Vec::new, |group| {
            (group.members.iter())
                .map(|&i| &graph.node[i])
                .filter(|node| node.op_type() == "QuantizeLinear")
                .filter_map(|node| {
                    let input = node.input.first().filter(|x| group.inputs.contains(x))?;
                    Some(QuantizedValue {
                        value: input.clone(),
                        node: node.display_name(),
                        grid: self.grid_of(node)?,
                    })
                })
                .collect()
        });
        // the value itself, last: where it clips as much as an input, it is named
        if let Some(dequantize) = node_of(value).filter(|n| n.op_type() == "DequantizeLinear")
            && let Some(quantize) = dequantize
                .input
                .first()
                .and_then(|x| node_of(x))
                .filter(|n| n.op_type() == "QuantizeLinear")
            && let Some(grid) = self.grid_of(quantize)
        {
            grids.push(QuantizedValue {
                value: value.to_string(),
                node: quantize.display_name(),
                grid,
            });
        }
        grids
    }

    /// The grid a QuantizeLinear rounds to, where it has one scale and zero point the file
    /// stores (its zero point's type; uint8 without one).
    fn grid_of(&self, node: &layerdiff_onnx::NodeProto) -> Option<layerdiff_core::Quantization> {
        let read = |position: usize| {
            let name = node.input.get(position).filter(|n| !n.is_empty())?;
            self.model.initializer(name)?.ok()
        };
        let scale = read(1).filter(|s| s.view().numel() == 1)?;
        let zero = read(2);
        let dtype = zero.as_ref().map_or("uint8", |z| z.dtype.name());
        let zero_point = zero.map_or(0.0, |z| z.view().get_f64(0));
        layerdiff_core::Quantization::new(dtype, scale.view().get_f64(0), zero_point as i64).ok()
    }
}
