use std::collections::{HashMap, HashSet};

use crate::type_proto::Value as TypeValue;
use crate::{
    GraphProto, NodeProto, TypeProto, ValueInfoProto, tensor_shape_proto::dimension::Value as Dim,
};

/// The element type and (possibly symbolic) shape the graph declares for a value.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueType {
    /// ONNX `TensorProto.DataType` code (1 = float, 10 = float16, …); 0 when unknown.
    pub elem_type: i32,
    /// One entry per dimension: a fixed size, or the symbolic name (or `None` when unnamed).
    pub dims: Option<Vec<Dimension>>,
}

/// A dimension as declared in the graph.
#[derive(Debug, Clone, PartialEq)]
pub enum Dimension {
    /// A fixed size.
    Fixed(i64),
    /// A symbolic size, e.g. `batch`, or an anonymous one.
    Symbolic(Option<String>),
}

/// A node as the comparison flow sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    /// Position in the graph (graphs are topologically sorted).
    pub index: usize,
    /// The node's name (possibly empty in the file; see [`crate::NodeExt::display_name`]).
    pub name: String,
    /// The op type, e.g. `Conv`.
    pub op_type: String,
    /// The op's domain (empty for the default ONNX domain).
    pub domain: String,
    /// Input value names (empty string for an omitted optional input).
    pub inputs: Vec<String>,
    /// Output value names.
    pub outputs: Vec<String>,
}

/// Lookups over one graph: who produces and who consumes each value, and declared types.
#[derive(Debug, Clone)]
pub struct GraphIndex {
    nodes: Vec<NodeInfo>,
    producer: HashMap<String, usize>,
    consumers: HashMap<String, Vec<usize>>,
    initializers: HashSet<String>,
    graph_inputs: Vec<String>,
    graph_outputs: Vec<String>,
    types: HashMap<String, ValueType>,
    /// Element types, declared or inferred (see [`crate::elem_types`]).
    elem_types: HashMap<String, i32>,
}

impl GraphIndex {
    /// Indexes a graph.
    pub fn new(graph: &GraphProto) -> Self {
        let mut producer = HashMap::new();
        let mut consumers: HashMap<String, Vec<usize>> = HashMap::new();
        let nodes: Vec<NodeInfo> = graph
            .node
            .iter()
            .enumerate()
            .map(|(index, node)| {
                for output in node.output.iter().filter(|o| !o.is_empty()) {
                    producer.insert(output.clone(), index);
                }
                for input in node.input.iter().filter(|i| !i.is_empty()) {
                    let users = consumers.entry(input.clone()).or_default();
                    if users.last() != Some(&index) {
                        users.push(index);
                    }
                }
                node_info(index, node)
            })
            .collect();
        let initializers: HashSet<String> = graph
            .initializer
            .iter()
            .map(|t| t.name().to_string())
            .collect();
        let mut types = HashMap::new();
        for info in graph
            .input
            .iter()
            .chain(&graph.value_info)
            .chain(&graph.output)
        {
            if let Some(t) = value_type(info) {
                types.insert(info.name().to_string(), t);
            }
        }
        for init in &graph.initializer {
            let dims = init.dims.iter().map(|&d| Dimension::Fixed(d)).collect();
            types.insert(
                init.name().to_string(),
                ValueType {
                    elem_type: init.data_type(),
                    dims: Some(dims),
                },
            );
        }
        let graph_inputs = graph
            .input
            .iter()
            .map(|i| i.name().to_string())
            .filter(|n| !initializers.contains(n))
            .collect();
        let graph_outputs = graph.output.iter().map(|o| o.name().to_string()).collect();
        let mut elem_types: HashMap<String, i32> = types
            .iter()
            .filter(|(_, t)| t.elem_type != 0)
            .map(|(n, t)| (n.clone(), t.elem_type))
            .collect();
        crate::elem_types::infer_elem_types(&graph.node, &mut elem_types);
        Self {
            nodes,
            producer,
            consumers,
            initializers,
            graph_inputs,
            graph_outputs,
            types,
            elem_types,
        }
    }

    /// All nodes in graph (execution) order.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// The node that produces `value`, if any (graph inputs and initializers have none).
    pub fn producer(&self, value: &str) -> Option<&NodeInfo> {
        self.producer.get(value).map(|&i| &self.nodes[i])
    }

    /// The nodes that read `value`, in graph order.
    pub fn consumers(&self, value: &str) -> impl Iterator<Item = &NodeInfo> {
        self.consumers
            .get(value)
            .into_iter()
            .flatten()
            .map(|&i| &self.nodes[i])
    }

    /// Whether `value` is an initializer (a weight or constant stored in the file).
    pub fn is_initializer(&self, value: &str) -> bool {
        self.initializers.contains(value)
    }

    /// Graph inputs that are fed at run time (initializers excluded).
    pub fn graph_inputs(&self) -> &[String] {
        &self.graph_inputs
    }

    /// Graph outputs in declaration order.
    pub fn graph_outputs(&self) -> &[String] {
        &self.graph_outputs
    }

    /// The declared type of `value`, when the file declares one.
    pub fn value_type(&self, value: &str) -> Option<&ValueType> {
        self.types.get(value)
    }

    /// The element type of `value` (an ONNX `TensorProto.DataType` code), declared in the file
    /// or inferred from the ops that produce it; `None` when neither says.
    pub fn elem_type(&self, value: &str) -> Option<i32> {
        self.elem_types.get(value).copied()
    }

    /// Whether some node produces `value`, or it is a graph input or initializer.
    pub fn has_value(&self, value: &str) -> bool {
        self.producer.contains_key(value)
            || self.initializers.contains(value)
            || self.graph_inputs.iter().any(|i| i == value)
    }
}

fn node_info(index: usize, node: &NodeProto) -> NodeInfo {
    NodeInfo {
        index,
        name: crate::NodeExt::display_name(node),
        op_type: node.op_type().to_string(),
        domain: node.domain().to_string(),
        inputs: node.input.clone(),
        outputs: node.output.clone(),
    }
}

fn value_type(info: &ValueInfoProto) -> Option<ValueType> {
    let TypeProto {
        value: Some(TypeValue::TensorType(tensor)),
        ..
    } = info.r#type.as_ref()?
    else {
        return None;
    };
    let dims = tensor.shape.as_ref().map(|shape| {
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(Dim::DimValue(v)) => Dimension::Fixed(*v),
                Some(Dim::DimParam(p)) => Dimension::Symbolic(Some(p.clone())),
                None => Dimension::Symbolic(None),
            })
            .collect()
    });
    Some(ValueType {
        elem_type: tensor.elem_type(),
        dims,
    })
}

/// A `ValueInfoProto` for a tensor of ONNX element type `elem_type` and fixed `dims`.
pub fn tensor_value_info(name: &str, elem_type: i32, dims: &[usize]) -> ValueInfoProto {
    use crate::tensor_shape_proto::{Dimension as Dim, dimension::Value as DimValue};
    let dim = dims
        .iter()
        .map(|&d| Dim {
            value: Some(DimValue::DimValue(d as i64)),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(TypeProto {
            value: Some(TypeValue::TensorType(crate::type_proto::Tensor {
                elem_type: Some(elem_type),
                shape: Some(crate::TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}
