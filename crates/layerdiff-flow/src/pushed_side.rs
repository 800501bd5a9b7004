//! A side whose values are handed over as a framework computes them (PyTorch's forward hooks,
//! layer by layer, in order); it computes nothing itself. Its weights, where a cause needs them,
//! are handed over too.

use std::collections::HashMap;

use layerdiff_core::{DType, SideInfo, Summary, Tensor, TensorView};

use crate::Result;
use crate::evidence::{WeightCheck, check_weight};
use crate::plan::{Part, PlanSide};
use crate::side::Side;
use crate::timings::Stopwatch;

/// Values handed over layer by layer.
pub struct PushedSide {
    info: SideInfo,
    /// Each layer's dtype, and the first layer of each value name.
    dtypes: Vec<DType>,
    position: HashMap<String, usize>,
    sizes: HashMap<String, u64>,
    held: Vec<Option<Tensor>>,
    received: usize,
    /// Each layer's parameters, by layer, once handed over.
    parameters: HashMap<usize, Vec<(String, Tensor)>>,
}

impl PushedSide {
    /// A side described by `info` that will hand over one value per layer: `(name, dtype,
    /// estimated bytes)`, in order.
    pub fn new(info: SideInfo, layers: impl IntoIterator<Item = (String, DType, u64)>) -> Self {
        let (mut names, mut dtypes, mut sizes) = (Vec::new(), Vec::new(), HashMap::new());
        for (name, dtype, bytes) in layers {
            sizes.insert(name.clone(), bytes);
            names.push(name);
            dtypes.push(dtype);
        }
        let position = names
            .iter()
            .enumerate()
            .rev()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        Self {
            info,
            held: vec![None; names.len()],
            dtypes,
            position,
            sizes,
            received: 0,
            parameters: HashMap::new(),
        }
    }

    /// Layer `index`'s value (`None`: not needed, only counted as handed over).
    pub fn push(&mut self, index: usize, value: Option<Tensor>) {
        self.held[index] = value;
        self.received = self.received.max(index + 1);
    }

    /// How many layers were handed over.
    pub fn received(&self) -> usize {
        self.received
    }

    /// The parameters of layer `index` (and the forms an exporter may fold them into, under
    /// the same name), checked against the other side's weights when a cause is looked for.
    pub fn set_parameters(&mut self, index: usize, parameters: Vec<(String, Tensor)>) {
        self.parameters.insert(index, parameters);
    }
}

impl Side for PushedSide {
    fn describe(&mut self, _summary: &mut Summary) -> SideInfo {
        self.info.clone()
    }

    fn plan_view(&self) -> PlanSide<'_> {
        PlanSide {
            graph: None,
            sizes: self.sizes.clone(),
        }
    }

    fn has_layers(&self, layers: usize) -> bool {
        self.received >= layers
    }

    fn produce(&mut self, _: &Part, _: bool, _: &mut Stopwatch, _: &str) -> Result<()> {
        Ok(())
    }

    fn get(&self, value: &str) -> Option<&Tensor> {
        self.held[*self.position.get(value)?].as_ref()
    }

    fn dtype(&self, value: &str) -> Option<DType> {
        Some(self.dtypes[*self.position.get(value)?])
    }

    fn free(&mut self, values: &[String]) {
        for value in values {
            if let Some(&i) = self.position.get(value) {
                self.held[i] = None;
            }
        }
    }

    fn weight_check(
        &self,
        layer: usize,
        _node: &str,
        _position: usize,
        name: &str,
        weight: TensorView<'_>,
    ) -> Option<WeightCheck> {
        let own = self.parameters.get(&layer).map_or(&[][..], Vec::as_slice);
        parameter_check(name, own, weight)
    }
}

/// Checks an ONNX initializer against the layer's parameters: the forms of the same
/// name, else the one parameter of the same shape (or, for a matrix, the transposed shape).
/// `None` when no parameter corresponds.
fn parameter_check(
    name: &str,
    parameters: &[(String, Tensor)],
    weight: TensorView<'_>,
) -> Option<WeightCheck> {
    let named: Vec<&Tensor> = parameters
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, t)| t)
        .collect();
    let candidates: Vec<(String, Tensor)> = if named.is_empty() {
        let shaped: Vec<(String, Tensor)> = parameters
            .iter()
            .filter_map(|(n, t)| {
                if t.shape == weight.shape {
                    Some((n.clone(), t.clone()))
                } else if t.shape.len() == 2
                    && weight.shape.len() == 2
                    && t.shape[0] == weight.shape[1]
                    && t.shape[1] == weight.shape[0]
                {
                    Some((n.clone(), transpose_2d(t.view())))
                } else {
                    None
                }
            })
            .collect();
        let mut names: Vec<&String> = shaped.iter().map(|(n, _)| n).collect();
        names.dedup();
        if names.len() != 1 {
            return None;
        }
        shaped
    } else {
        named
            .into_iter()
            .map(|t| (name.to_string(), t.clone()))
            .collect()
    };
    let mut outcome = None;
    for (n, parameter) in &candidates {
        let by_shape = if n == name {
            String::new()
        } else {
            format!(" (PyTorch `{n}`, matched by shape)")
        };
        match check_weight(name, parameter.view(), weight) {
            WeightCheck::Same => return Some(WeightCheck::Same),
            WeightCheck::Differs(text) => {
                outcome.get_or_insert(WeightCheck::Differs(text + &by_shape));
            }
            WeightCheck::LowerPrecision(text) => {
                outcome.get_or_insert(WeightCheck::LowerPrecision(text + &by_shape));
            }
        }
    }
    outcome
}

/// A matrix transposed.
fn transpose_2d(t: TensorView<'_>) -> Tensor {
    let (rows, cols, size) = (t.shape[0], t.shape[1], t.dtype.size());
    let mut bytes = vec![0u8; t.bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
            bytes[to..to + size].copy_from_slice(&t.bytes[from..from + size]);
        }
    }
    Tensor {
        dtype: t.dtype,
        shape: vec![cols, rows],
        bytes,
    }
}
