//! The flow for a reference captured outside Rust (PyTorch forward hooks): map each captured
//! layer call to an ONNX value, expose those values, run ONNX Runtime on the same input bytes,
//! compare every pair, analyse, and build the report.

use std::collections::HashMap;
use std::path::PathBuf;

use layerdiff_core::{
    InputInfo, Layer, OnnxRef, Report, SCHEMA, SideInfo, Tensor, TensorView, Tolerance, analyse,
    attribute_layout, compare_pair,
};
use layerdiff_onnx::{GraphIndex, LayerCall, LayerMapping, Model, expose_values, map_layers};
use layerdiff_runtime::RuntimeSpec;

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
    /// The tolerance.
    pub tolerance: Tolerance,
    /// Describes the reference side.
    pub reference: SideInfo,
    /// The runtime that runs the ONNX file.
    pub target: RuntimeSpec,
    /// ONNX Runtime library to load (`None`: search).
    pub ort_library: Option<PathBuf>,
}

/// Runs the flow and returns the report. Drift is a finding in the report, never an error.
pub fn compare_captured(c: &CapturedComparison<'_>) -> Result<Report> {
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
    let runtime = c.target.build(c.ort_library.as_deref(), &model)?;
    let values = runtime.run(&model, &c.inputs, &wanted)?;
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
                    layer.stats = outcome.stats;
                    layer.target_shape = outcome.target_shape;
                    layer.target_dtype = outcome.target_dtype;
                }
            }
            layer
        })
        .collect();
    let summary = analyse(&mut layers, c.tolerance);
    for (layer, captured) in layers.iter_mut().zip(&c.layers) {
        if let Some(target) = layer.onnx.as_ref().and_then(|o| value_of(&o.value)) {
            attribute_layout(layer, captured.value, target.view(), c.tolerance.abs);
        }
    }
    Ok(Report {
        schema: SCHEMA,
        command: c.command.clone(),
        model: c.model.clone(),
        reference: c.reference.clone(),
        target: SideInfo {
            runtime: runtime.name().to_string(),
            detail: runtime.detail(),
        },
        mode: "accumulated".to_string(),
        tolerance: c.tolerance.abs,
        seed: c.seed,
        inputs: InputInfo::describe(&c.inputs),
        summary,
        layers,
    })
}
