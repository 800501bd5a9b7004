//! A model's float64 copy: the numerical truth both sides are measured against.
//!
//! Every floating-point tensor the graph holds or declares (initializers, constants, graph
//! inputs and outputs, declared values) becomes float64, and every cast to a float type casts to
//! float64 instead. Node names, order and value names stay, so the copy computes the same values
//! under the same names and runs in the same segments. Integer and bool tensors are untouched.

use layerdiff_core::{DType, TensorView};
use prost::bytes::Bytes;

use crate::{AttributeProto, Model, StringStringEntryProto, TensorProto, ValueInfoProto};

const FLOAT16: i32 = 10;
const BFLOAT16: i32 = 16;
const FLOAT: i32 = 1;
const DOUBLE: i32 = 11;

/// Whether an ONNX element type is a float that the copy widens.
fn widened(elem_type: i32) -> bool {
    matches!(elem_type, FLOAT | FLOAT16 | BFLOAT16)
}

/// The float64 copy of `model` (see the module docs), or why it cannot be made (an external or
/// unreadable initializer). A model from [`to_float64_lazy`] with a grid has its weights rounded
/// to that grid first (and the copy forgets the grid).
pub fn to_float64(model: &Model) -> Result<Model, String> {
    let mut copy = widen(model, weights_grid(model), true)?;
    copy.proto
        .metadata_props
        .retain(|e| e.key() != WEIGHTS_GRID);
    Ok(copy)
}

/// [`to_float64`] with the initializers left as stored: the graph declares and casts to float64,
/// and a runtime widens each node's weights when it runs ([`to_float64`] of the node, as
/// `layerdiff_runtime::PerNode::float64` does). Widening a model's weights up front costs a
/// copy twice their size, touched page by page (ResNet-50: 200 MB, about 40 ms here); a run node
/// by node holds one node's at a time.
///
/// With a `grid` narrower than float64, every float tensor the model holds (initializers,
/// constants) is rounded to it before it is widened, as each node runs: the ideal
/// implementation of a layer in a narrower dtype computes with its weights in that dtype (see
/// `layerdiff_core::Baseline`). The model carries the grid (its metadata entry
/// `layerdiff.weights_grid`) to the node copies [`crate::extract_nodes`] makes of it.
pub fn to_float64_lazy(model: &Model, grid: Option<DType>) -> Result<Model, String> {
    let mut copy = widen(model, None, false)?;
    copy.proto
        .metadata_props
        .retain(|e| e.key() != WEIGHTS_GRID);
    if let Some(grid) = grid.filter(|g| g.is_float() && *g != DType::F64) {
        copy.proto.metadata_props.push(StringStringEntryProto {
            key: Some(WEIGHTS_GRID.to_string()),
            value: Some(grid.name().to_string()),
        });
    }
    Ok(copy)
}

/// The metadata entry of a lazy float64 copy that names the grid its weights round to.
const WEIGHTS_GRID: &str = "layerdiff.weights_grid";

/// The grid a lazy float64 copy's weights round to, where it names one.
fn weights_grid(model: &Model) -> Option<DType> {
    let name = crate::node_ext::lookup(&model.proto.metadata_props, WEIGHTS_GRID)?;
    DType::from_name(name).ok()
}

fn widen(model: &Model, grid: Option<DType>, weights: bool) -> Result<Model, String> {
    let mut copy = model.clone();
    let graph = copy.graph_mut();
    for tensor in graph.initializer.iter_mut().filter(|_| weights) {
        let rounded = grid.is_some() && tensor.data_type() == DOUBLE;
        if widened(tensor.data_type()) || rounded {
            let read = model
                .stored(tensor.name())
                .ok_or_else(|| format!("initializer `{}` vanished", tensor.name()))??;
            *tensor = double_proto(tensor.name(), read.view(), grid);
        }
    }
    for value in graph
        .input
        .iter_mut()
        .chain(&mut graph.output)
        .chain(&mut graph.value_info)
    {
        widen_declaration(value);
    }
    for node in &mut graph.node {
        for attribute in &mut node.attribute {
            widen_attribute(attribute, grid)?;
        }

        if matches!(
            node.op_type(),
            "Cast" | "RandomNormal" | "RandomUniform" | "EyeLike"
        ) {
            let key = if node.op_type() == "Cast" {
                "to"
            } else {
                "dtype"
            };
            if let Some(a) = node.attribute.iter_mut().find(|a| a.name() == key)
                && a.i.is_some_and(|t| widened(t as i32))
            {
                a.i = Some(i64::from(DOUBLE));
            }
        }
    }
    Ok(copy)
}

/// A float tensor attribute (a Constant's `value`, ConstantOfShape's) in float64, rounded to
/// `grid` first where one is given.
fn widen_attribute(attribute: &mut AttributeProto, grid: Option<DType>) -> Result<(), String> {
    if let Some(t) = attribute.t.as_mut()
        && (widened(t.data_type()) || (grid.is_some() && t.data_type() == DOUBLE))
    {
        let tensor = crate::tensor_from_proto(t)?;
        *t = double_proto(t.name(), tensor.view(), grid);
    }
    Ok(())
}

fn widen_declaration(value: &mut ValueInfoProto) {
    let Some(crate::type_proto::Value::TensorType(t)) =
        value.r#type.as_mut().and_then(|t| t.value.as_mut())
    else {
        return;
    };
    if t.elem_type.is_some_and(widened) {
        t.elem_type = Some(DOUBLE);
    }
}

/// A tensor as a float64 initializer named `name`, rounded to `grid` first where one is given.
fn double_proto(name: &str, tensor: TensorView<'_>, grid: Option<DType>) -> TensorProto {
    let shape: Vec<i64> = tensor.shape.iter().map(|&d| d as i64).collect();
    let wide = tensor.to_f64_on_grid(grid.unwrap_or(DType::F64));
    TensorProto {
        name: Some(name.to_string()),
        dims: shape,
        data_type: Some(DOUBLE),
        raw_data: Some(Bytes::from(wide.bytes)),
        ..Default::default()
    }
}
