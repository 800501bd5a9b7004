//! A side whose values are handed over as a framework computes them (PyTorch's forward hooks,
//! layer by layer, in order); it computes nothing itself. Its weights, where a cause needs them,
//! are handed over too. As a target it may also be handed each layer's local re-run (the
//! framework ran the layer's module on the reference's inputs) and how it computes: that is
//! its [`Recompute`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use layerdiff_core::{DType, Evidence, SideInfo, Summary, Tensor, TensorView};

use crate::Result;
use crate::engine::evidence::{
    MATCHED_BY_SHAPE, WeightCheck, WeightCheckFn, check_weight, transpose_2d,
};
use crate::engine::plan::{Part, PlanSide};
use crate::engine::side::{Group, Member, Own, Receive, Recompute, Side};

pub mod baseline;
use crate::timings::Stopwatch;

/// What a side whose values are handed over knows of how it computes each layer, for local
/// error and causes (a PyTorch target: its module types, and the math it does in lower
/// precision).
#[derive(Debug, Clone, Default)]
pub struct Computing {
    /// Each layer's module type (`Conv2d`, `matmul()`), by layer.
    pub module_types: Vec<String>,
    /// The module types whose float32 products the side computes in lower precision (TF32),
    /// and the sentence that says so.
    pub reduced_math: Option<(Vec<String>, String)>,
    /// The layers whose values each layer read, by layer: where its error is traced upstream.
    pub fed_by: Vec<Vec<usize>>,
    /// How the side computes every layer below the reference's precision, in words, where no
    /// layer's own dtype shows it (gradients, carrying their forward pass's precision).
    pub lower_precision: Option<String>,
}

/// Values handed over layer by layer.
pub struct PushedSide {
    info: SideInfo,
    /// Each layer's value name and dtype, and the first layer of each value name.
    names: Vec<String>,
    dtypes: Vec<DType>,
    position: HashMap<String, usize>,
    sizes: HashMap<String, u64>,
    held: Vec<Option<Tensor>>,
    received: usize,
    /// Each layer's parameters, by layer, once handed over.
    parameters: HashMap<usize, Vec<(String, Tensor)>>,
    /// The layers without a counterpart that compute inside each layer, by layer: their
    /// parameters are its weights too.
    absorbed: HashMap<usize, Vec<usize>>,
    /// As a target that re-runs layers: how it computes, and each layer's local re-run (or
    /// why there is none) until the engine takes it.
    computing: Option<Computing>,
    local: Mutex<HashMap<usize, std::result::Result<Tensor, String>>>,
    /// By layer: how far two re-runs of it on the same inputs disagreed, where they did.
    disagreements: HashMap<usize, f64>,
    /// By layer, for a side that runs its model whole: the layer computed on the side's own
    /// inputs (see [`Side::own_exact`]).
    own: HashMap<usize, Own>,
    /// By layer and parameter name: half a quantization step per element of a parameter the
    /// side stores quantized.
    half_steps: HashMap<usize, HashMap<String, Tensor>>,
    /// By layer: the numbers and flags its call passes otherwise than the reference's.
    arguments: HashMap<usize, Vec<String>>,
    /// A fresh ONNX export of the same model, as the reference: the counterpart of a target
    /// file's node (by name and op) and of a constant no parameter of the side's is.
    export: Option<layerdiff_onnx::Model>,
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
            names,
            dtypes,
            position,
            sizes,
            received: 0,
            parameters: HashMap::new(),
            absorbed: HashMap::new(),
            computing: None,
            local: Mutex::new(HashMap::new()),
            disagreements: HashMap::new(),
            own: HashMap::new(),
            export: None,
            arguments: HashMap::new(),
            half_steps: HashMap::new(),
        }
    }

    /// The same side, as a target whose local re-runs are handed over with its values
    /// ([`PushedSide::push_local`]); its dtypes are those of the values handed over.
    pub fn computing(mut self, computing: Computing) -> Self {
        self.computing = Some(computing);
        self
    }

    /// Layer `index`'s local re-run: its module run on the reference's inputs, or why it could
    /// not be; and how far a second re-run disagreed with it (max abs diff), where it did.
    pub fn push_local(
        &mut self,
        index: usize,
        local: std::result::Result<Tensor, String>,
        disagreement: Option<f64>,
    ) {
        self.local
            .get_mut()
            .expect("not poisoned")
            .insert(index, local);
        if let Some(d) = disagreement.filter(|&d| d > 0.0) {
            self.disagreements.insert(index, d);
        }
    }

    /// Layer `index`'s value (`None`: not needed, only counted as handed over).
    pub fn push(&mut self, index: usize, value: Option<Tensor>) {
        if let Some(v) = &value {
            self.dtypes[index] = v.dtype;
        }
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

    /// Layers `absorbed` (without a counterpart) compute inside layer `index` on the target:
    /// their parameters are checked as its weights too.
    pub fn absorb(&mut self, index: usize, absorbed: Vec<usize>) {
        if !absorbed.is_empty() {
            self.absorbed.insert(index, absorbed);
        }
    }

    /// Sets a fresh ONNX export of the model beside this side: a target file's nodes and
    /// constants are compared with it where the side has no counterpart of its own (a file
    /// that differs from the model, named attribute by attribute).
    pub fn beside(&mut self, export: layerdiff_onnx::Model) {
        self.export = Some(export);
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
            weights: 0,
            step_weights: Vec::new(),
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

    fn disagreement(&self, value: &str) -> Option<f64> {
        self.disagreements.get(self.position.get(value)?).copied()
    }

    fn free(&mut self, values: &[String]) {
        for value in values {
            if let Some(&i) = self.position.get(value) {
                self.held[i] = None;
                self.own.remove(&i);
            }
        }
    }

    fn own_exact(&self, value: &str) -> Option<&Own> {
        self.own.get(self.position.get(value)?)
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
        let layers = std::iter::once(&layer).chain(self.absorbed.get(&layer).into_iter().flatten());
        let own: Vec<&(String, Tensor)> = layers
            .flat_map(|l| self.parameters.get(l).into_iter().flatten())
            .collect();
        parameter_check(name, &own, weight, half_step).or_else(|| {
            let export = self.export.as_ref()?;
            crate::engine::evidence::model_weight_check(
                export, node, position, name, weight, half_step,
            )
        })
    }

    fn counterpart(&self, member: &Member) -> Option<Member> {
        crate::engine::evidence::model_counterpart(self.export.as_ref()?, member)
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        self.computing.as_ref().map(|_| self as &dyn Recompute)
    }

    fn receiver(&mut self) -> Option<&mut dyn Receive> {
        Some(self)
    }
}

impl Receive for PushedSide {
    fn push(&mut self, index: usize, value: Option<Tensor>) {
        PushedSide::push(self, index, value);
    }

    fn push_local(
        &mut self,
        index: usize,
        local: std::result::Result<Tensor, String>,
        disagreement: Option<f64>,
    ) {
        PushedSide::push_local(self, index, local, disagreement);
    }

    fn set_parameters(&mut self, index: usize, parameters: Vec<(String, Tensor)>) {
        PushedSide::set_parameters(self, index, parameters);
    }

    fn push_arguments(&mut self, index: usize, arguments: Vec<String>) {
        self.arguments.insert(index, arguments);
    }

    fn push_own(&mut self, index: usize, own: Own) {
        self.own.insert(index, own);
    }

    fn set_half_steps(&mut self, index: usize, half_steps: Vec<(String, Tensor)>) {
        self.half_steps
            .insert(index, half_steps.into_iter().collect());
    }
}

/// A group of a side that computes by layers is one layer: `members` holds its index, and it
/// reads nothing the engine must keep (the framework re-ran it as the layer came).
impl Recompute for PushedSide {
    fn local_group(&self, value: &str, _: &dyn Fn(&str) -> bool) -> Result<Group, String> {
        let index = *self
            .position
            .get(value)
            .ok_or_else(|| format!("`{value}` is not one of the side's layers"))?;
        Ok(Group {
            members: vec![index],
            inputs: Vec::new(),
        })
    }

    fn run_group(
        &self,
        group: &Group,
        _: &str,
        _: &dyn Fn(&str) -> Result<Tensor, String>,
    ) -> Result<Tensor, String> {
        let index = group.members[0];
        let mut local = self.local.lock().expect("not poisoned");
        local
            .remove(&index)
            .unwrap_or_else(|| Err("no re-run of it was handed over".to_string()))
    }

    fn take_time(&self) -> Duration {
        Duration::ZERO // the framework's re-runs are timed as its own run
    }

    fn traced_inputs(&self, group: &Group) -> Vec<String> {
        let fed_by = self.computing.as_ref().map(|c| &c.fed_by);
        let layers = fed_by.and_then(|f| f.get(group.members[0]));
        layers
            .into_iter()
            .flatten()
            .filter_map(|&i| self.names.get(i).cloned())
            .collect()
    }

    fn members(&self, _: &Group) -> Vec<Member> {
        Vec::new() // a layer is its own location: it has no members to list
    }

    fn group_evidence(
        &self,
        group: &Group,
        _value: &str,
        _reference: Option<DType>,
        evidence: &mut Evidence,
        _fed: &dyn Fn(&str) -> Option<(DType, DType)>,
        check: &WeightCheckFn<'_>,
    ) {
        let index = group.members[0];
        let Some(computing) = &self.computing else {
            return;
        };
        if let Some(how) = &computing.lower_precision {
            evidence.precision.get_or_insert_with(|| how.clone());
        }
        if let Some(module_type) = computing.module_types.get(index) {
            evidence.ops = vec![module_type.clone()];
            if let Some((types, how)) = &computing.reduced_math
                && types.contains(module_type)
            {
                evidence.reduced_math = Some(format!("{module_type}: {how}"));
            }
        }
        if let Some(arguments) = self.arguments.get(&index) {
            evidence.arguments.clone_from(arguments);
        }
        let steps = self.half_steps.get(&index);
        for (name, parameter) in self.parameters.get(&index).into_iter().flatten() {
            let half_step = steps.and_then(|s| s.get(name)).map(Tensor::view);
            if let Some(found) = check("", 0, name, parameter.view(), half_step) {
                found.record(evidence, "");
            }
        }
    }
}

/// Checks an ONNX initializer against the layer's parameters: the forms of the same
/// name, else the one parameter of the same shape (or, for a matrix, the transposed shape).
/// `None` when no parameter corresponds.
fn parameter_check(
    name: &str,
    parameters: &[&(String, Tensor)],
    weight: TensorView<'_>,
    half_step: Option<TensorView<'_>>,
) -> Option<WeightCheck> {
    let named: Vec<&Tensor> = parameters
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, t)| t)
        .collect();
    let candidates: Vec<(String, Tensor)> = if named.is_empty() {
        // A square matrix may be stored either way (an exporter writes a Linear's weight
        // transposed for MatMul): both forms are candidates.
        let shaped: Vec<(String, Tensor)> = parameters
            .iter()
            .flat_map(|(n, t)| {
                let transposed = t.shape.len() == 2
                    && weight.shape.len() == 2
                    && t.shape[0] == weight.shape[1]
                    && t.shape[1] == weight.shape[0];
                let as_is = (t.shape == weight.shape).then(|| (n.clone(), t.clone()));
                let flipped = transposed.then(|| (n.clone(), transpose_2d(t.view())));
                as_is.into_iter().chain(flipped)
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
    // The closest form decides: the same weight, else the same in lower precision, else a
    // different one.
    let (mut lower, mut differs) = (None, None);
    for (n, parameter) in &candidates {
        let by_shape = if n == name {
            String::new()
        } else {
            format!(" (the reference's `{n}`, {MATCHED_BY_SHAPE})")
        };
        match check_weight(name, parameter.view(), weight, true, half_step) {
            WeightCheck::Same => return Some(WeightCheck::Same),
            WeightCheck::LowerPrecision(text) => {
                lower.get_or_insert(WeightCheck::LowerPrecision(text + &by_shape));
            }
            WeightCheck::Differs(text) => {
                differs.get_or_insert(WeightCheck::Differs(text + &by_shape));
            }
        }
    }
    lower.or(differs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerdiff_core::DType;

    fn matrix(values: &[f32], rows: usize, cols: usize) -> Tensor {
        Tensor {
            dtype: DType::F32,
            shape: vec![rows, cols],
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    #[test]
    fn a_square_weight_stored_transposed_is_the_same_weight() {
        let weight = matrix(&[1.0, 2.0, 3.0, 4.0], 2, 2);
        let stored = matrix(&[1.0, 3.0, 2.0, 4.0], 2, 2);
        let parameters = [("k.weight".to_string(), weight)];
        let found = parameter_check(
            "val_31",
            &parameters.iter().collect::<Vec<_>>(),
            stored.view(),
            None,
        );
        assert!(matches!(found, Some(WeightCheck::Same)), "{found:?}");
        let other = matrix(&[1.0, 3.0, 2.0, 5.0], 2, 2);
        let found = parameter_check(
            "val_31",
            &parameters.iter().collect::<Vec<_>>(),
            other.view(),
            None,
        );
        assert!(matches!(found, Some(WeightCheck::Differs(_))), "{found:?}");
        // stored transposed in float16: the same weight in lower precision, not another one
        let parameters = [(
            "k.weight".to_string(),
            matrix(&[1.0, 2.0, 3.0, 4.0001], 2, 2),
        )];
        // 1, 3, 2, 4 in float16
        let half: Vec<u8> = [0x3C00u16, 0x4200, 0x4000, 0x4400]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let stored = Tensor {
            dtype: DType::F16,
            shape: vec![2, 2],
            bytes: half,
        };
        let found = parameter_check(
            "val_31",
            &parameters.iter().collect::<Vec<_>>(),
            stored.view(),
            None,
        );
        assert!(
            matches!(found, Some(WeightCheck::LowerPrecision(_))),
            "{found:?}"
        );
    }
}
