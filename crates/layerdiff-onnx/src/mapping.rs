//! Mapping PyTorch module calls onto ONNX values.
//!
//! A layer is one call of a leaf module. Its ONNX counterpart is a *boundary output* of the
//! module's scope: a value produced by one of the module's nodes and read outside it (or a graph
//! output). The module's calls take its boundary outputs in graph order, each call the next one
//! that can hold its output: of its kind (a float layer never pairs with an int64 constant or a
//! shape computation the exporter placed in the module's scope) and, where the file declares a
//! shape, of its element count.
//!
//! A Cast or Identity that only passes a value from outside the scope through is the module's
//! input, not an output, while the module has another boundary output.
//!
//! Layers with no node of their own are explained: identity modules at inference (Dropout in
//! eval) are compared against the value of the layer that fed them; a layer folded into its
//! neighbour at export (Conv + BatchNorm) leaves one value that holds the *later* layer's output,
//! so the later layer maps to it and the earlier one is listed as fused.

use std::collections::{HashMap, HashSet};

use layerdiff_core::{DType, Fingerprint};

use crate::scope::ScopeResolver;
use crate::{Dimension, GraphIndex, GraphProto, NodeExt, NodeInfo, is_float_elem_type};

mod functional;
mod nodeless;
mod rewritten;
mod unscoped;
use functional::map_functional;
use nodeless::{has_scope, resolve_nodeless, unmapped};
use rewritten::Rewritten;
use unscoped::inside_one_module;

/// One call of a leaf module, as captured on the PyTorch side.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerCall {
    /// Display name: the module path, with `#2`, `#3`… for repeated calls.
    pub name: String,
    /// Qualified module path, e.g. `layer1.0.relu`.
    pub module: String,
    /// 0 for the first call of this module, 1 for the second…
    pub call_index: usize,
    /// Whether the call returned its input's values unchanged (Dropout in eval mode, a module
    /// that hands its input back, `x * 1.0`).
    pub identity: bool,
    /// Whether no model input's values reach its output (computed from parameters, constants
    /// and shapes alone: what exporters fold into constants).
    pub constant: bool,
    /// Whether its output reaches some output of the model (work whose result nothing returns
    /// is dropped at export).
    pub feeds_output: bool,
    /// The earlier layer whose output this call read as its first input, if any.
    pub input_from: Option<usize>,
    /// The shape of its output.
    pub shape: Vec<usize>,
    /// The dtype of its output.
    pub dtype: DType,
    /// A sample of its output, to pair it by value where the file names no module scope.
    pub fingerprint: Option<Fingerprint>,
    /// For a functional call between modules (a residual `add`, an attention's `matmul`), the
    /// op; `module` is then the module whose `forward` made the call (`""`: the model's own).
    pub op: Option<String>,
}

impl LayerCall {
    /// Bytes of its output.
    pub fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * self.dtype.size()) as u64
    }

    /// Whether the ONNX value `value` can hold this call's output: the same kind of element
    /// (float or not) where its type is known, and the same element count where the file
    /// declares every dimension.
    pub fn fits(&self, index: &GraphIndex, value: &str) -> bool {
        let kind = index
            .elem_type(value)
            .is_none_or(|t| is_float_elem_type(t) == self.dtype.is_float());
        let count = index
            .value_type(value)
            .and_then(|t| t.dims.as_ref())
            .and_then(|dims| {
                dims.iter()
                    .map(|d| match d {
                        Dimension::Fixed(n) => usize::try_from(*n).ok(),
                        Dimension::Symbolic(_) => None,
                    })
                    .product::<Option<usize>>()
            })
            .is_none_or(|n| n == self.shape.iter().product::<usize>());
        kind && count
    }
}

/// Where a layer's value lives in the ONNX graph, or why it has none.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerMapping {
    /// The layer's output is the ONNX value `value`, produced by `node`.
    Mapped {
        /// The ONNX value name.
        value: String,
        /// Name of the node producing it.
        node: String,
        /// Op type of that node.
        op_type: String,
        /// Extra context, e.g. that the value also holds a fused neighbour's work.
        note: Option<String>,
    },
    /// No ONNX value holds this layer's output.
    Unmapped {
        /// Why, in words.
        reason: String,
    },
}

/// Layers that no node's scope names, and the values that may hold them: what
/// [`ScopeMapping::request`] leaves to its caller to pair by value.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueRequest {
    /// The layers (by index) whose module no node carries.
    pub layers: Vec<usize>,
    /// Values produced by nodes that record no module scope at all, with their producing
    /// node's index, in graph order.
    pub candidates: Vec<(String, usize)>,
    /// Whether no node of the file names a module of the model: every layer is to be paired
    /// by value.
    pub unscoped_file: bool,
    /// Functional calls that the export's nodes in their module do not pair by position.
    pub calls: Vec<CallGroup>,
    /// The layers (by index) their scope paired, with their values: a layer paired by value
    /// never takes a value computed from a later layer's.
    pub scoped: Vec<(usize, String)>,
}

impl ValueRequest {
    /// Every layer asked about, in the order of the answers: `layers`, then each group's.
    pub fn wanted(&self) -> Vec<usize> {
        let calls = self.calls.iter().flat_map(|g| g.layers.iter().copied());
        self.layers.iter().copied().chain(calls).collect()
    }
}

/// Functional calls of one op in one module, among them those the model's inputs reach, that
/// do not pair with the export's nodes of that op there by position (see
/// [`crate::functional`]), and the values of those nodes the graph inputs reach, in order: each
/// call takes the first value after the previous call's that holds its numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct CallGroup {
    /// The calls (layer indices), in order.
    pub layers: Vec<usize>,
    /// The candidate values, in graph order.
    pub values: Vec<String>,
}

/// A value found for a requested layer and how (`matched by values: …`), or why none was.
pub type ValueMatch = Result<(String, String), String>;

const NO_SCOPE: &str = "no ONNX node carries this module's scope";

/// Why a layer whose output no model output needs has no value in the export.
const UNUSED: &str = "its output reaches none of the model's outputs (the model computes it and returns something else), and exporters drop such work";

/// Why a layer that no model input reaches has no value in the export.
pub(crate) const FOLDED: &str = "computed from constants only: no model input's values reach this output (parameters, constants and shapes alone)";

/// Maps each layer call to an ONNX value of `graph` by module scope (see the module docs for
/// the rules), without pairing any by value.
pub fn map_layers(graph: &GraphProto, layers: &[LayerCall]) -> Vec<LayerMapping> {
    ScopeMapping::new(graph, layers).finish(graph, layers, Vec::new())
}

/// Each module's boundary outputs: the values its nodes (`node_module`) write that a node of
/// another module reads, or that the graph outputs, in graph order; a Cast or Identity of a
/// value from outside the module is its input seen through an alias, never its output while
/// it has another.
fn boundary_outputs(
    index: &GraphIndex,
    node_module: &[Option<String>],
    owners: &HashMap<String, Option<String>>,
) -> HashMap<String, Vec<(String, usize)>> {
    let mut boundary: HashMap<String, Vec<(String, usize)>> = HashMap::new();
    let graph_outputs: HashSet<&str> = index.graph_outputs().iter().map(String::as_str).collect();
    for (i, node) in index.nodes().iter().enumerate() {
        for out in node.outputs.iter().filter(|o| !o.is_empty()) {
            let owner = owners.get(out).unwrap_or(&node_module[i]);
            let Some(module) = owner.as_deref() else {
                continue;
            };
            let read_outside = index
                .consumers(out)
                .any(|c| node_module[c.index].as_deref() != Some(module));
            if read_outside || graph_outputs.contains(out.as_str()) {
                boundary
                    .entry(module.to_string())
                    .or_default()
                    .push(dequantized(index, node_module, out).unwrap_or((out.clone(), i)));
            }
        }
    }

    // A Cast or Identity of a value from outside the module is its input seen through an
    // alias (the legacy exporter records `x.to(torch.float32)` on a float32 `x` in the
    // module's scope and feeds later readers of `x` from it): never the module's output
    // while the module has another.
    for outputs in boundary.values_mut() {
        let passes_input = |(_, node): &(String, usize)| {
            let n = &index.nodes()[*node];
            matches!(n.op_type.as_str(), "Cast" | "Identity")
                && n.inputs.first().is_some_and(|input| {
                    index
                        .producer(input)
                        .is_none_or(|p| node_module[p.index] != node_module[*node])
                })
        };
        if outputs.iter().any(|o| !passes_input(o)) {
            outputs.retain(|o| !passes_input(o));
        }
    }
    boundary
}

/// The values an optimizer's fusion left under the name of a node it removed: ONNX Runtime
/// fuses a Conv with the Relu after it (or with a Mul by a constant) into one node that keeps
/// the Conv's name and writes the Relu's output, `/relu/Relu_output_0`. Such a value holds the
/// removed node's module's output (or no captured module's, a block's own `Mul`), not the
/// module of the node that writes it now, whose own output is gone: each with the module its
/// legacy name places it in. A value named after a node of its writer's own scope, or not in
/// the legacy form, is not listed; nor one only QuantizeLinear nodes read: ONNX Runtime's static quantizer
/// removes a ReLU whose work the quantized range does and keeps its output's name on the
/// Conv's value, which is the Conv's own.
fn fused_owners(index: &GraphIndex, resolver: &ScopeResolver) -> HashMap<String, Option<String>> {
    let mut owners = HashMap::new();
    for node in index.nodes() {
        for out in &node.outputs {
            let Some((writer, k)) = out.rsplit_once("_output_") else {
                continue;
            };
            let numbered = !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit());
            let quantized = index.consumers(out).next().is_some()
                && index.consumers(out).all(|c| c.op_type == "QuantizeLinear");
            // a rewrite within one scope (the dynamic quantizer's Mul that writes its
            // MatMul's output) moves no value between modules
            let scope = |name: &str| name.rsplit_once('/').map(|(s, _)| s.to_string());
            let across = scope(writer) != scope(&node.name);
            if numbered && writer.starts_with('/') && across && !quantized {
                owners.insert(out.clone(), resolver.module_of_name(writer));
            }
        }
    }
    owners
}

/// A dynamic quantizer names the DynamicQuantizeLinear it puts before a product after
/// the value it quantizes (`…/relu/Relu_output_0_QuantizeLinear`): that puts it in the
/// producer's scope, and its scale would read as the module's output. It belongs to the
/// product that reads its integers (none where several modules read them). One that
/// carries no scope is left to the rules for such nodes.
fn rehome_dynamic_quantizers(
    graph: &GraphProto,
    index: &GraphIndex,
    node_module: &mut [Option<String>],
) {
    for (i, node) in graph.node.iter().enumerate() {
        let Some(integers) = node.output.first() else {
            continue;
        };
        if node.op_type() != "DynamicQuantizeLinear" || node_module[i].is_none() {
            continue;
        }
        let mut modules = index
            .consumers(integers)
            .map(|c| node_module[c.index].clone());
        let first = modules.next().flatten();
        node_module[i] = first.filter(|m| modules.all(|o| o.as_ref() == Some(m)));
    }
}

/// Where a dynamo call or value (`cat_7`, `linear_2`) sits in the trace: the number the trace
/// gave its name, `0` for the first, unnumbered one (the exporter numbers a name as the trace
/// makes it, which a tool that sorts the graph again does not change).
pub(crate) fn trace_order(call: &str) -> u64 {
    match call.rsplit_once('_') {
        Some((_, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            n.parse().unwrap_or(u64::MAX)
        }
        _ => 0,
    }
}

/// The value an unscoped DequantizeLinear makes of `value` where it alone reads it: a module's
/// output a quantizer stores on an integer grid (ONNX Runtime's dynamic quantizer keeps an
/// embedding table in int8, so its Gather writes int8) is the model's value once dequantized.
fn dequantized(
    index: &GraphIndex,
    node_module: &[Option<String>],
    value: &str,
) -> Option<(String, usize)> {
    let mut readers = index.consumers(value);
    let first = readers.next()?;
    let dequantizes = |c: &NodeInfo| {
        c.op_type == "DequantizeLinear"
            && node_module[c.index].is_none()
            && c.inputs.first().is_some_and(|i| i == value)
    };
    if !dequantizes(first) || !readers.all(dequantizes) {
        return None;
    }
    let out = first.outputs.first().filter(|o| !o.is_empty())?;
    Some((out.clone(), first.index))
}

/// The first step of mapping: layers paired by module scope, and what is left for pairing by
/// value ([`ScopeMapping::request`]); [`ScopeMapping::finish`] takes the answers and applies
/// the rules for layers without nodes of their own (identity, fused).
#[derive(Debug)]
pub struct ScopeMapping {
    index: GraphIndex,
    boundary: HashMap<String, Vec<(String, usize)>>,
    mappings: Vec<LayerMapping>,
    request: ValueRequest,
}

impl ScopeMapping {
    /// Pairs each layer with a boundary output of its module's scope.
    pub fn new(graph: &GraphProto, layers: &[LayerCall]) -> Self {
        let index = GraphIndex::new(graph);
        let modules: Vec<&str> = layers
            .iter()
            .filter(|l| l.op.is_none())
            .map(|l| l.module.as_str())
            .collect();
        let resolver = ScopeResolver::new(&modules);
        let mut node_module: Vec<Option<String>> = graph
            .node
            .iter()
            .map(|n| {
                resolver.module_of(n).map(|(m, _)| m).or_else(|| {
                    // a node named without a scope, by its first weight's layer (a Conv's
                    // kernel; its bias may be a constant tf2onnx shares between layers)
                    if n.name().contains('/') {
                        return None;
                    }
                    let weight = n.input.iter().skip(1).find(|i| index.is_initializer(i))?;
                    resolver.module_of_weight(weight)
                })
            })
            .collect();
        rehome_dynamic_quantizers(graph, &index, &mut node_module);
        inside_one_module(graph, &index, &modules, &mut node_module);

        let owners = fused_owners(&index, &resolver);
        let boundary = boundary_outputs(&index, &node_module, &owners);

        // Each module's calls take its boundary outputs in order, skipping those that cannot
        // hold the call's output.
        let mut taken: HashMap<&str, usize> = HashMap::new();
        let functional = map_functional(graph, &index, layers);
        let (mut functional, calls) = (functional.mappings, functional.by_values);
        let mappings: Vec<LayerMapping> = layers
            .iter()
            .enumerate()
            .map(|(i, layer)| {
                if let Some(mapping) = functional.remove(&i) {
                    return mapping;
                }
                let module = layer.module.as_str();
                let outputs = boundary.get(module).map_or(&[][..], Vec::as_slice);
                let from = taken.get(module).copied().unwrap_or(0);
                let found = outputs[from.min(outputs.len())..]
                    .iter()
                    .position(|(value, _)| layer.fits(&index, value))
                    .map(|p| from + p);
                let Some(at) = found else {
                    return unmapped("");
                };
                taken.insert(module, at + 1);
                let (value, node) = &outputs[at];
                let n = &index.nodes()[*node];
                LayerMapping::Mapped {
                    value: value.clone(),
                    node: n.name.clone(),
                    op_type: n.op_type.clone(),
                    note: None,
                }
            })
            .collect();

        // Layers that no scope names, to pair by value with nodes that carry no scope at all.
        let mut request = ValueRequest {
            layers: (0..layers.len())
                .filter(|&i| {
                    layers[i].op.is_none()
                        && !layers[i].identity
                        && layers[i].fingerprint.is_some()
                        && !boundary.contains_key(&layers[i].module)
                })
                .collect(),
            candidates: index
                .nodes()
                .iter()
                .filter(|n| node_module[n.index].is_none() && !has_scope(&graph.node[n.index]))
                .flat_map(|n| {
                    n.outputs
                        .iter()
                        .filter(|o| !o.is_empty() && !index.is_initializer(o))
                        .map(move |o| (o.clone(), n.index))
                })
                .collect(),
            unscoped_file: boundary.is_empty(),
            calls,
            scoped: mappings
                .iter()
                .enumerate()
                .filter_map(|(i, m)| match m {
                    LayerMapping::Mapped { value, .. } => Some((i, value.clone())),
                    LayerMapping::Unmapped { .. } => None,
                })
                .collect(),
        };
        if request.candidates.is_empty() {
            request.layers.clear();
        }
        Self {
            index,
            boundary,
            mappings,
            request,
        }
    }

    /// What is left to pair by value; empty when nothing is (no layer lacks a scope or no node
    /// lacks one, and every functional call was settled).
    pub fn request(&self) -> Option<&ValueRequest> {
        (!self.request.layers.is_empty() || !self.request.calls.is_empty()).then_some(&self.request)
    }

    /// The mapping of every layer, given one answer per layer of [`ValueRequest::wanted`]
    /// (none at all when nothing was paired by value).
    pub fn finish(
        self,
        graph: &GraphProto,
        layers: &[LayerCall],
        by_values: Vec<ValueMatch>,
    ) -> Vec<LayerMapping> {
        let Self {
            index,
            boundary,
            mut mappings,
            request,
        } = self;
        let scoped = request.layers.len();
        for (k, (i, found)) in request.wanted().into_iter().zip(by_values).enumerate() {
            if k >= scoped {
                // A functional call: its reason says why it was not paired by position.
                if let (Err(why), LayerMapping::Unmapped { reason }) = (&found, &mut mappings[i]) {
                    *reason = format!("{reason}; {why}");
                    continue;
                }
            }
            mappings[i] = match found {
                Ok((value, how)) => match index.producer(&value) {
                    Some(n) => LayerMapping::Mapped {
                        value,
                        node: n.name.clone(),
                        op_type: n.op_type.clone(),
                        note: Some(how),
                    },
                    None => unmapped(&format!("`{value}` is not a node's output")),
                },
                Err(why) => unmapped(&why),
            };
        }
        let mappings = resolve_nodeless(graph, &index, &boundary, layers, mappings);
        Rewritten::new(graph, &index, layers, &request).pair(mappings)
    }
}
