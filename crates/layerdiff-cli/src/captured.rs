//! The flow for a reference captured outside Rust (PyTorch forward hooks): map each captured
//! layer call to an ONNX value, expose those values, run ONNX Runtime on the same input bytes,
//! compare every pair, analyse, and build the report.

use std::collections::HashMap;
use std::path::PathBuf;

use layerdiff_core::{
    Evidence, Float64Distance, InputInfo, Layer, LayerStatus, OnnxRef, Report, SCHEMA, SideInfo,
    Tensor, TensorView, Tolerance, analyse, compare_pair, explain,
};
use layerdiff_onnx::{
    GraphIndex, LayerCall, LayerMapping, LocalGroup, Model, expose_values, map_layers,
};
use layerdiff_runtime::RuntimeSpec;

use crate::local::{Rerun, WeightCheck, check_weight, disagreement, fit};
use crate::timings::{OWN, RUNTIME, Stopwatch};
use crate::{Error, Result, inputs::check_inputs};

/// One captured layer call and its reference value.
#[derive(Debug, Clone)]
pub struct CapturedLayer<'a> {
    /// Which module call it is, and how it relates to the calls before it.
    pub call: LayerCall,
    /// The module's class name (`Conv2d`).
    pub module_type: String,
    /// The captured output.
    pub value: TensorView<'a>,
    /// The same layer's output in a float64 run of the model, when one was made.
    pub float64: Option<TensorView<'a>>,
    /// The module's parameters and buffers by qualified name (`layer1.0.conv1.weight`), with
    /// the forms an exporter may fold them into under the same name (a Conv's weight scaled by
    /// the BatchNorm after it). A weight matching any form of its name is the same weight.
    pub parameters: Vec<(String, TensorView<'a>)>,
}

/// Everything the captured-reference flow needs.
#[derive(Debug, Clone)]
pub struct CapturedComparison<'a> {
    /// The command named in the report (`torch`).
    pub command: String,
    /// The model's display name.
    pub model: String,
    /// The ONNX file of the same model instance.
    pub onnx_path: PathBuf,
    /// The inputs both sides were given.
    pub inputs: Vec<(String, Tensor)>,
    /// Seed of generated inputs.
    pub seed: Option<u64>,
    /// Captured layers in execution order.
    pub layers: Vec<CapturedLayer<'a>>,
    /// How each layer's tolerance is chosen.
    pub tolerance: Tolerance,
    /// Whether to measure each layer's local error (re-running its ONNX nodes on PyTorch's
    /// values of their inputs).
    pub local: bool,
    /// Describes the reference side.
    pub reference: SideInfo,
    /// The runtime that runs the ONNX file.
    pub target: RuntimeSpec,
    /// ONNX Runtime library to load (`None`: search).
    pub ort_library: Option<PathBuf>,
}

/// Runs the flow and returns the report. Drift is a finding in the report, never an error.
pub fn compare_captured(c: &CapturedComparison<'_>, clock: &mut Stopwatch) -> Result<Report> {
    let mut model = Model::load(&c.onnx_path)?;
    let index = GraphIndex::new(model.graph());
    check_inputs(&index, &c.inputs)?;
    for (i, layer) in c.layers.iter().enumerate() {
        if layer.call.input_from.is_some_and(|p| p >= i) {
            return Err(Error::Layers(format!(
                "layer `{}` reads from a later layer",
                layer.call.name
            )));
        }
    }

    let calls: Vec<LayerCall> = c.layers.iter().map(|l| l.call.clone()).collect();
    let mappings = map_layers(model.graph(), &calls);
    let mut wanted: Vec<String> = Vec::new();
    for m in &mappings {
        if let LayerMapping::Mapped { value, .. } = m
            && !wanted.contains(value)
        {
            wanted.push(value.clone());
        }
    }
    expose_values(&mut model, &wanted)?;
    clock.lap("mapping layers and exposing values", OWN);
    let runtime = c.target.build(c.ort_library.as_deref(), &model)?;
    clock.lap("runtime start-up", RUNTIME);
    let values = runtime.run(&model, &c.inputs, &wanted)?;
    clock.lap("target run", RUNTIME);
    let by_name: HashMap<&str, &Tensor> = values.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let value_of = |name: &str| by_name.get(name).copied();

    let mut layers: Vec<Layer> = c
        .layers
        .iter()
        .zip(&mappings)
        .enumerate()
        .map(|(index, (captured, mapping))| {
            let mut layer = Layer::new(
                index,
                captured.call.name.clone(),
                captured.value.shape.to_vec(),
                captured.value.dtype.name(),
            );
            layer.module_type = Some(captured.module_type.clone());
            match mapping {
                LayerMapping::Unmapped { reason } => layer.reason = Some(reason.clone()),
                LayerMapping::Mapped {
                    value,
                    node,
                    op_type,
                    note,
                } => {
                    layer.onnx = Some(OnnxRef {
                        value: value.clone(),
                        node: node.clone(),
                        op_type: op_type.clone(),
                    });
                    layer.reason = note.clone();
                    let target = value_of(value).expect("every mapped value was requested");
                    let outcome = compare_pair(captured.value, target.view());
                    layer.status = outcome.status;
                    layer.accumulated = outcome.stats;
                    layer.target_shape = outcome.target_shape;
                    layer.target_dtype = outcome.target_dtype;
                    if let Some(truth) = captured.float64 {
                        let distance = |v: TensorView<'_>| {
                            compare_pair(truth, v).stats.map(|s| s.max_abs_diff)
                        };
                        if let (Some(reference), Some(target)) =
                            (distance(captured.value), distance(target.view()))
                        {
                            layer.float64 = Some(Float64Distance { reference, target });
                        }
                    }
                }
            }
            layer
        })
        .collect();

    clock.lap("comparison", OWN);

    // Local error: each layer's ONNX nodes re-run on PyTorch's values of their inputs.
    let rerun = Rerun::new(&model, runtime.as_ref());
    let mut groups: Vec<Option<LocalGroup>> = vec![None; layers.len()];
    let mut layer_of_value: HashMap<String, usize> = HashMap::new();
    for (i, layer) in layers.iter().enumerate() {
        if let Some(o) = &layer.onnx {
            layer_of_value.entry(o.value.clone()).or_insert(i);
        }
    }
    if c.local {
        let names: Vec<String> = layers.iter().map(|l| l.name.clone()).collect();
        let input = |n: &str| c.inputs.iter().find(|(name, _)| name == n).map(|(_, t)| t);
        for i in 0..layers.len() {
            let Some(value) = layers[i].onnx.as_ref().map(|o| o.value.clone()) else {
                continue;
            };
            if layers[i].status != LayerStatus::Compared {
                continue;
            }
            let first = layer_of_value[value.as_str()];
            if first != i {
                layers[i].local_reason = Some(format!(
                    "it holds the same ONNX value as `{}`, so it has no nodes of its own",
                    names[first]
                ));
                continue;
            }
            let known =
                |n: &str| n != value && (input(n).is_some() || layer_of_value.contains_key(n));
            let feed = |n: &str| -> std::result::Result<Tensor, String> {
                if let Some(t) = input(n) {
                    return Ok(t.clone());
                }
                let from = &c.layers[layer_of_value[n]];
                let target = value_of(n).ok_or_else(|| format!("`{n}` was not computed"))?;
                fit(
                    &from.call.name,
                    from.value.to_tensor(),
                    target.dtype,
                    &target.shape,
                )
            };
            match rerun.run(&value, &known, &feed) {
                Ok((group, out)) => {
                    let outcome = compare_pair(c.layers[i].value, out.view());
                    layers[i].local = outcome.stats;
                    layers[i].local_inputs = group
                        .inputs
                        .iter()
                        .map(|n| {
                            layer_of_value
                                .get(n.as_str())
                                .map_or(n.clone(), |&j| names[j].clone())
                        })
                        .collect();
                    groups[i] = Some(group);
                }
                Err(reason) => layers[i].local_reason = Some(reason),
            }
        }
    }
    clock.split_lap(
        "local error: extraction and comparison",
        "local error: inference",
        rerun.inference.get(),
    );
    let summary = analyse(&mut layers, c.tolerance);

    // Evidence for the layers that need a cause.
    let needs_cause = |l: &Layer| summary.needs_cause(l);
    let again = if layers.iter().any(needs_cause) {
        runtime.run_twice(&model, &c.inputs, &wanted).ok()
    } else {
        None
    };
    clock.lap("second runs (nondeterminism)", RUNTIME);
    let mut evidence = vec![Evidence::default(); layers.len()];
    for (i, (layer, captured)) in layers.iter().zip(&c.layers).enumerate() {
        let Some(value) = layer.onnx.as_ref().map(|o| o.value.as_str()) else {
            continue;
        };
        let Some(target) = value_of(value).filter(|_| needs_cause(layer)) else {
            continue;
        };
        let e = &mut evidence[i];
        *e = Evidence::from_values(layer, captured.value, target.view());
        if let Some(d) = disagreement(target, again.as_ref(), value) {
            e.self_disagreement = Some(("target".to_string(), d));
        }
        if let Some(group) = &groups[i] {
            let fed = |n: &str| {
                let captured = &c.layers[*layer_of_value.get(n)?];
                Some((captured.value.dtype, value_of(n)?.dtype))
            };
            let check = |_, _, name: &str, weight: &Tensor| {
                parameter_check(name, &captured.parameters, weight)
            };
            rerun.group_evidence(group, e, &fed, &check);
        }
    }
    explain(&mut layers, &evidence, &summary);
    clock.lap("analysis and causes", OWN);
    Ok(Report {
        schema: SCHEMA,
        command: c.command.clone(),
        model: c.model.clone(),
        reference: c.reference.clone(),
        target: SideInfo {
            runtime: runtime.name().to_string(),
            detail: runtime.detail(),
        },
        mode: if c.local { "local" } else { "accumulated" }.to_string(),
        tolerance: c.tolerance.info(),
        seed: c.seed,
        inputs: InputInfo::describe(&c.inputs),
        summary,
        layers,
        timings: Some(clock.phases()),
    })
}

/// Checks an ONNX initializer against the layer's PyTorch parameters: the forms of the same
/// name, else the one parameter of the same shape (or, for a matrix, the transposed shape).
/// `None` when no parameter corresponds.
fn parameter_check(
    name: &str,
    parameters: &[(String, TensorView<'_>)],
    weight: &Tensor,
) -> Option<WeightCheck> {
    let named: Vec<&TensorView<'_>> = parameters
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, t)| t)
        .collect();
    let candidates: Vec<(String, Tensor)> = if named.is_empty() {
        let shaped: Vec<(String, Tensor)> = parameters
            .iter()
            .filter_map(|(n, t)| {
                if t.shape == weight.shape.as_slice() {
                    Some((n.clone(), t.to_tensor()))
                } else if t.shape.len() == 2
                    && weight.shape.len() == 2
                    && t.shape[0] == weight.shape[1]
                    && t.shape[1] == weight.shape[0]
                {
                    Some((n.clone(), transpose_2d(t)))
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
            .map(|t| (name.to_string(), t.to_tensor()))
            .collect()
    };
    let mut outcome = None;
    for (n, parameter) in &candidates {
        let by_shape = if n == name {
            String::new()
        } else {
            format!(" (PyTorch `{n}`, matched by shape)")
        };
        match check_weight(name, parameter.view(), weight.view()) {
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
fn transpose_2d(t: &TensorView<'_>) -> Tensor {
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
