use std::collections::{HashMap, HashSet};

use layerdiff_core::Tensor;

use crate::{
    Error, GraphIndex, GraphProto, Model, ModelProto, Result, ValueInfoProto, tensor_value_info,
};

/// Makes each named value a graph output so a runtime returns it, keeping the declared type
/// where the file has one. Values that are already outputs are left alone; graph order and
/// existing outputs are unchanged, so the original outputs keep their positions.
pub fn expose_values<S: AsRef<str>>(model: &mut Model, values: &[S]) -> Result<()> {
    let index = GraphIndex::new(model.graph());
    let mut present: HashSet<String> = index.graph_outputs().iter().cloned().collect();
    let declared = declarations(model.graph());
    let mut added = Vec::new();
    for value in values {
        let value = value.as_ref();
        if !index.has_value(value) {
            return Err(Error::UnknownValue(value.to_string()));
        }
        if !present.insert(value.to_string()) {
            continue;
        }
        added.push(declared_or_untyped(&declared, value));
    }
    model.graph_mut().output.extend(added);
    Ok(())
}

/// A standalone model of some nodes of `model` (given by index, kept in graph order): their
/// initializers come along, every other value they read becomes a graph input, and `outputs`
/// (or, when empty, every value they produce) become graph outputs. Inputs take their types from
/// `feeds` (the tensors that will be given), else from the graph's declarations. Opsets, IR
/// version, local functions and the external-data folder are kept, so the extract runs as the
/// original did. This is what re-running one layer on given values is built on.
pub fn extract_nodes(
    model: &Model,
    nodes: &[usize],
    outputs: &[String],
    feeds: &[(String, Tensor)],
) -> Result<Model> {
    let graph = model.graph();
    let mut picked: Vec<usize> = nodes.to_vec();
    picked.sort_unstable();
    picked.dedup();
    if let Some(&bad) = picked.iter().find(|&&i| i >= graph.node.len()) {
        return Err(Error::UnknownValue(format!(
            "node #{bad} (the graph has {} nodes)",
            graph.node.len()
        )));
    }
    let produced: HashSet<&str> = picked
        .iter()
        .flat_map(|&i| graph.node[i].output.iter().map(String::as_str))
        .collect();
    let declared = declarations(graph);
    let mut inputs: Vec<ValueInfoProto> = Vec::new();
    let mut initializers = Vec::new();
    let mut seen = HashSet::new();
    for &i in &picked {
        for name in graph.node[i].input.iter().filter(|n| !n.is_empty()) {
            if produced.contains(name.as_str()) || !seen.insert(name.clone()) {
                continue;
            }
            if let Some(init) = graph.initializer.iter().find(|t| t.name() == name) {
                initializers.push(init.clone());
            } else {
                inputs.push(match feeds.iter().find(|(n, _)| n == name) {
                    Some((_, t)) => tensor_value_info(name, t.dtype.onnx_code(), &t.shape),
                    None => declared_or_untyped(&declared, name),
                });
            }
        }
    }
    let wanted: Vec<String> = if outputs.is_empty() {
        picked
            .iter()
            .flat_map(|&i| {
                graph.node[i]
                    .output
                    .iter()
                    .filter(|o| !o.is_empty())
                    .cloned()
            })
            .collect()
    } else {
        outputs.to_vec()
    };
    if let Some(missing) = wanted.iter().find(|o| !produced.contains(o.as_str())) {
        return Err(Error::UnknownValue(format!(
            "{missing} (not produced by the extracted nodes)"
        )));
    }
    // Everything but the graph, without copying the whole model's initializers.
    let p = &model.proto;
    let mut proto = ModelProto {
        ir_version: p.ir_version,
        opset_import: p.opset_import.clone(),
        producer_name: p.producer_name.clone(),
        producer_version: p.producer_version.clone(),
        domain: p.domain.clone(),
        model_version: p.model_version,
        doc_string: p.doc_string.clone(),
        graph: None,
        metadata_props: p.metadata_props.clone(),
        training_info: Vec::new(),
        functions: p.functions.clone(),
        configuration: p.configuration.clone(),
    };
    proto.graph = Some(GraphProto {
        name: Some(format!("{}_extract", graph.name())),
        node: picked.iter().map(|&i| graph.node[i].clone()).collect(),
        initializer: initializers,
        input: inputs,
        output: wanted
            .iter()
            .map(|o| declared_or_untyped(&declared, o))
            .collect(),
        value_info: graph
            .value_info
            .iter()
            .filter(|v| produced.contains(v.name()))
            .cloned()
            .collect(),
        ..Default::default()
    });
    Ok(Model::from_proto(
        proto,
        model.base_dir().map(std::path::Path::to_path_buf),
    ))
}

/// The model with every initializer it keeps in external data read into the file itself, so
/// it stands alone (a repro's piece, written into a folder of its own).
pub fn inline_external_data(model: &Model) -> Result<Model> {
    let mut inlined = model.clone();
    let external: Vec<String> = model
        .graph()
        .initializer
        .iter()
        .filter(|t| t.data_location() == crate::tensor_proto::DataLocation::External)
        .map(|t| t.name().to_string())
        .collect();
    for name in external {
        let stored = model
            .stored(&name)
            .expect("an initializer of the model")
            .map_err(|e| Error::UnknownValue(format!("{name} (its external data: {e})")))?;
        let proto = inlined
            .graph_mut()
            .initializer
            .iter_mut()
            .find(|t| t.name() == name)
            .expect("an initializer of the model");
        proto.raw_data = Some(prost::bytes::Bytes::from(stored.bytes.into_owned()));
        proto.external_data.clear();
        proto.data_location = Some(crate::tensor_proto::DataLocation::Default as i32);
        proto.float_data.clear();
    }
    Ok(inlined)
}

/// Every value the graph declares (inputs, value_info, outputs), by name; the first wins.
fn declarations(graph: &GraphProto) -> HashMap<&str, &ValueInfoProto> {
    let mut map = HashMap::new();
    for info in graph
        .input
        .iter()
        .chain(&graph.value_info)
        .chain(&graph.output)
    {
        map.entry(info.name()).or_insert(info);
    }
    map
}

/// The graph's declaration of `name`, or an untyped one (runtimes infer the type).
fn declared_or_untyped(declared: &HashMap<&str, &ValueInfoProto>, name: &str) -> ValueInfoProto {
    declared.get(name).map_or_else(
        || ValueInfoProto {
            name: Some(name.to_string()),
            ..Default::default()
        },
        |info| (*info).clone(),
    )
}
