//! The target of a captured run set up and aligned: an ONNX file mapped to PyTorch's layers by
//! the module scopes its exporter records, or PyTorch itself, layer for layer.

use super::{
    Alignment, CapturedComparison, DType, Error, GraphIndex, GraphSide, LayerCall, LayerMapping,
    ListedLayer, Location, Model, RUNTIME, RelaidSide, Renames, Result, RuntimeSpec, ScopeMapping,
    Shared, Side, Stopwatch, TargetSpec, TorchSpec, budget, check_inputs, pair_by_values,
    prepare_target, unread_inputs, unrecognised_from,
};
use crate::spec::onnx_side::OnnxSide;

/// A target set up: the layers aligned with its values, the side, and the dtype it holds each
/// compared value in (where it says).
pub(super) type Target = (Alignment, Box<dyn Side>, Vec<Option<DType>>);

/// The ONNX file run by `runtime` as the target: each layer mapped to an ONNX value (by the
/// module scopes the exporter records, else by value), in the graph that runs, and the dtype
/// that graph holds each mapped value in.
pub(super) fn onnx_target(
    c: &CapturedComparison,
    path: &std::path::Path,
    runtime: &RuntimeSpec,
    note: Option<&str>,
    clock: &mut Stopwatch,
) -> Result<Target> {
    let mut model = Model::load(path)?;
    let file = GraphIndex::new(model.graph());
    check_inputs(&file, &c.inputs)?;
    let unread = unread_inputs(&file);
    let runtime = runtime.build()?;
    clock.lap("runtime start-up", RUNTIME);
    let calls: Vec<LayerCall> = c.layers.iter().map(|l| l.call.clone()).collect();
    let scoped = ScopeMapping::new(model.graph(), &calls);
    let mut inconclusive = None;
    let by_values = match scoped.request() {
        Some(request) => {
            let request = request.clone();
            let found = pair_by_values(
                &mut model,
                runtime.as_ref(),
                &c.inputs,
                &calls,
                &request,
                budget(c.settings.max_memory),
            )?;
            clock.lap("pairing layers by values", RUNTIME);
            // a layer no model output needs (BERT's pooler where only the hidden states are
            // returned), or computed from constants only, has no value in an export: never
            // paired, it says nothing of where recognition stopped
            let (names, recognised): (Vec<&str>, Vec<bool>) = (request.layers.iter())
                .zip(&found)
                .filter(|&(&i, _)| calls[i].feeds_output && !calls[i].constant)
                .map(|(&i, f)| (calls[i].name.as_str(), f.is_ok()))
                .unzip();
            if request.unscoped_file {
                inconclusive = unrecognised_from(&names, &recognised);
            }
            found
        }
        None => Vec::new(),
    };
    let mut mappings = scoped.finish(model.graph(), &calls, by_values);
    // An optimizing runtime is measured on the graph it optimized (see crate::sides::graph::shipped):
    // layers are mapped on the file, then found in that graph or explained.
    let target = prepare_target(&model, None, runtime, &c.inputs, clock)?;
    if target.shipped.is_some() {
        clock.lap("optimizing the target graph", RUNTIME);
    }
    if let Some(optimized) = target.model {
        let after = GraphIndex::new(optimized.graph());
        for mapping in &mut mappings {
            if let LayerMapping::Mapped { value, note, .. } = mapping {
                if let Some(why) = survives(&after, &target.renames, value) {
                    *mapping = LayerMapping::Unmapped { reason: why };
                } else if let Some(how) = target.renames.restored.get(value.as_str()) {
                    *note = Some(how.clone());
                }
            }
        }
        model = optimized;
    }
    let graph_outputs = GraphIndex::new(model.graph()).graph_outputs().to_vec();
    let alignment = align(&c.layers, &mappings, &graph_outputs, inconclusive);
    // The file is not PyTorch's own computation: a layer beyond what its precision explains
    // is computed as the file writes it, to tell the file from the runtime (an optimized
    // graph is the runtime's own work, not the file's).
    let as_written = target.shipped.is_none();
    let mut target = GraphSide::new(note.map(String::from), model, target.runtime, &c.inputs)
        .shipping(target.renames, target.shipped, target.placement)
        .noting(unread);
    if as_written {
        target = target.computing_as_written();
    }
    let held = alignment
        .target
        .iter()
        .map(|v| target.holds(v.as_deref()?))
        .collect();
    if !c.channels_last {
        return Ok((alignment, Box::new(target), held));
    }
    let references = alignment
        .target
        .iter()
        .zip(&c.layers)
        .filter_map(|(v, l)| {
            Some((
                v.clone()?,
                (l.call.shape.clone(), l.call.fingerprint.clone()),
            ))
        })
        .collect();
    Ok((
        alignment,
        Box::new(RelaidSide::new(target, references)),
        held,
    ))
}

/// Every layer against the same layer of a target that computes the same module calls.
pub(super) fn same_layers(listed: &[ListedLayer], unpaired: &[(usize, String)]) -> Alignment {
    let mut alignment = Alignment {
        layers: Vec::new(),
        reference: Vec::new(),
        target: Vec::new(),
        refutable: Vec::new(),
        inconclusive: None,
        nothing_compared_hint: "the model made no module calls with a floating-point output"
            .to_string(),
        shared: Shared::FirstLayerOwns,
    };
    let unpaired: std::collections::HashMap<usize, &String> =
        unpaired.iter().map(|(i, why)| (*i, why)).collect();
    for (index, l) in listed.iter().enumerate() {
        let mut layer = l.layer(index);
        let counterpart = match unpaired.get(&index) {
            Some(why) => {
                layer.status = layerdiff_core::LayerStatus::Unmapped;
                layer.reason = Some((*why).clone());
                None
            }
            None => Some(l.call.name.clone()),
        };
        alignment.layers.push(layer);
        alignment.reference.push(l.call.name.clone());
        alignment.target.push(counterpart);
        alignment.refutable.push(false);
    }
    alignment
}

/// Whether the options fit together: the PyTorch reference and the target (the settings
/// checked themselves when made, [`Settings::new`]).
pub fn check_options(reference: &TorchSpec, target: &TargetSpec) -> Result<()> {
    match target {
        TargetSpec::Onnx(OnnxSide::Expected(_)) => Err(Error::Usage(format!(
            "`{}` is a file of values: `layerdiff torch` needs a runtime to run the ONNX file (`ort`, `ort:opt=all`, `ort:cuda`, `tract`, `openvino`) or a PyTorch side (`torch:bf16`, `torch:cuda`)",
            target.spelling()
        ))),
        TargetSpec::Onnx(_) if !reference.is_plain() => Err(Error::Usage(format!(
            "the reference `{reference}` is for a PyTorch target: the ONNX file is compared with the model as given (`torch`: CPU, float32, eager); give `{reference}` as --target to compare it with the CPU"
        ))),
        _ => Ok(()),
    }
}

/// Each listed layer with the ONNX value it was mapped to, or why none.
fn align(
    listed: &[ListedLayer],
    mappings: &[LayerMapping],
    graph_outputs: &[String],
    inconclusive: Option<String>,
) -> Alignment {
    let mut alignment = Alignment {
        layers: Vec::new(),
        reference: Vec::new(),
        target: Vec::new(),
        refutable: Vec::new(),
        inconclusive,
        nothing_compared_hint: "is the ONNX file an export of this very model? Layers are paired by the module scopes the exporter records (both torch.onnx exporters do); a file without them, or from another model, pairs nothing".to_string(),
        shared: Shared::FirstLayerOwns,
    };
    for (index, (l, mapping)) in listed.iter().zip(mappings).enumerate() {
        let mut layer = l.layer(index);
        let value = match mapping {
            LayerMapping::Unmapped { reason } => {
                layer.reason = Some(reason.clone());
                None
            }
            LayerMapping::Mapped {
                value,
                node,
                op_type,
                note,
            } => {
                layer.location = Some(Location::onnx(value, node, op_type));
                layer.reason = note.clone();
                Some(value.clone())
            }
        };
        // A model output paired by its own scope may really differ in shape: a finding. Any
        // other pairing that cannot hold the layer's value is a mapping problem.
        let own_output =
            layer.reason.is_none() && value.as_ref().is_some_and(|v| graph_outputs.contains(v));
        alignment.refutable.push(!own_output);
        alignment.layers.push(layer);
        alignment.reference.push(l.call.name.clone());
        alignment.target.push(value);
    }
    alignment
}

/// Why a value of the file has no counterpart in the optimized graph `after`, or `None` when
/// it has one there (under its name, or given back from a blocked layout).
fn survives(after: &GraphIndex, renames: &Renames, value: &str) -> Option<String> {
    if let Some(why) = renames.blocked.get(value) {
        return Some(format!(
            "the optimized graph holds `{value}` in a blocked (NCHWc) layout, not given back: {why}"
        ));
    }
    if after.is_initializer(value) {
        return Some(format!(
            "folded into a constant by the optimizer: `{value}` is not computed in the graph that runs"
        ));
    }
    let computed =
        after.producer(value).is_some() || after.graph_inputs().iter().any(|i| i == value);
    (!computed).then(|| {
        format!("fused or removed by the optimizer: `{value}` is not in the graph that runs")
    })
}
