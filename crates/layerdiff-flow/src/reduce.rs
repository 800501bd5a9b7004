//! The smallest piece of an ONNX model that still shows a report's headline defect, checked by
//! running it before it is claimed (`--repro DIR`, `layerdiff reduce REPORT.json`).
//!
//! The piece starts as the node that produces the headline layer's value and grows backwards,
//! a ring of producers at a time, only while the target's run of it stays within the tolerance
//! (a difference born inside a fusion needs the nodes the runtime fuses). Its inputs are the
//! reference's values there, and what it must produce is the reference's value of the layer:
//! the same question the layer's local error asked, now in a file a runtime's maintainers can
//! run with their runtime and numpy alone.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use layerdiff_core::{
    Bound, Inside, Judge, Layer, Report, Tensor, compare_judged, write_safetensors,
};
use layerdiff_onnx::{GraphIndex, Model, expose_values, extract_nodes};
use layerdiff_runtime::RuntimeSpec;

use crate::onnx_flow::OnnxOptions;
use crate::{Error, Result};

mod script;
pub use script::READER;

/// The most nodes a repro grows to by default: beyond a handful, a repro is a model again.
pub const MOST_NODES: usize = 5;

/// A repro written, and what its check found.
#[derive(Debug, Clone)]
pub struct Repro {
    /// Its folder.
    pub folder: PathBuf,
    /// The layer it shows.
    pub layer: String,
    /// Its nodes' names (their op where unnamed), in graph order.
    pub nodes: Vec<String>,
    /// Whether the target's run of the piece exceeds the tolerance: when not, the folder holds
    /// the largest piece tried, and says so.
    pub reproduced: bool,
    /// The target's largest difference from the reference's value, on the piece.
    pub max_abs_diff: f64,
    /// That difference as a multiple of the tolerance.
    pub multiple: f64,
}

impl Repro {
    /// The repro in one line.
    pub fn sentence(&self) -> String {
        let nodes = self.nodes.len();
        let plural = if nodes == 1 { "node" } else { "nodes" };
        if self.reproduced {
            format!(
                "repro of `{}`: {nodes} {plural} ({}) in {}, checked: the target differs by {:.3e}, {:.1}× the tolerance (python repro.py)",
                self.layer,
                self.nodes.join(", "),
                self.folder.display(),
                self.max_abs_diff,
                self.multiple
            )
        } else {
            format!(
                "no repro of `{}` within {nodes} {plural}: on the piece the target stays within the tolerance ({:.1}×), so the difference needs more of the model; the largest piece tried is in {}",
                self.layer,
                self.multiple,
                self.folder.display()
            )
        }
    }
}

/// The layer a repro shows: the first defect's; else the first layer whose own error exceeds
/// its tolerance. `Err` says why there is none (a clean run; drift that only accumulates).
pub fn headline(report: &Report) -> std::result::Result<&Layer, String> {
    let by_name = |name: &str| report.layers.iter().find(|l| l.name == name);
    if let Some(layer) = report
        .summary
        .defects
        .first()
        .and_then(|d| by_name(&d.layer))
    {
        return Ok(layer);
    }
    if let Some(layer) = report.layers.iter().find(|l| l.local_exceeds) {
        return Ok(layer);
    }
    Err(if report.summary.layers_exceeding == 0 {
        "no layer exceeds its tolerance: there is nothing to reproduce".to_string()
    } else {
        "no layer's own error exceeds its tolerance: the drift only accumulates from rounding \
         within it, which no small piece shows (`--bisect` names what turns it on)"
            .to_string()
    })
}

/// A model's pieces run on the target's runtime, each fed the reference's values at its inputs
/// and held to the reference's value of what it computes: the question a layer's local error
/// asks, for any few nodes of the target's file.
pub(crate) struct Pieces {
    target_model: Model,
    index: GraphIndex,
    target_spec: RuntimeSpec,
    target_runtime: Box<dyn layerdiff_runtime::Runtime + Send + Sync>,
    inputs: Vec<(String, Tensor)>,
    values: Vec<(String, Tensor)>,
}

/// One piece run.
pub(crate) struct Tried {
    pub model: Model,
    pub feeds: Vec<(String, Tensor)>,
    pub got: Tensor,
    pub expected: Tensor,
    /// Its difference as a multiple of the tolerance.
    pub multiple: f64,
    pub max_abs_diff: f64,
}

impl Pieces {
    /// The pieces of `options`' target file, with the reference's values of `wanted` (and of
    /// every value the nodes producing them read) computed once.
    pub(crate) fn new(
        options: &OnnxOptions,
        inputs: &[(String, Tensor)],
        nodes: &[usize],
        ort_library: Option<&Path>,
    ) -> Result<Self> {
        let runtime = |spec: &RuntimeSpec, side: &str| match spec {
            RuntimeSpec::Expected(_) => Err(Error::Usage(format!(
                "a piece of the model runs on both sides, and the {side} is a file of values \
                 (`{}`)",
                spec.spelling()
            ))),
            spec => Ok(spec.build(ort_library)?),
        };
        let target_spec = options.target.clone().unwrap_or(if options.vs.is_some() {
            RuntimeSpec::ort_cpu()
        } else {
            RuntimeSpec::Tract
        });
        let reference_runtime = runtime(&options.reference, "reference")?;
        let target_runtime = runtime(&target_spec, "target")?;
        let reference_model = Model::load(&options.model)?;
        let target_model = match &options.vs {
            Some(path) => Model::load(path)?,
            None => reference_model.clone(),
        };
        let index = GraphIndex::new(target_model.graph());
        let mut wanted: Vec<String> = Vec::new();
        for &n in nodes {
            let node = &index.nodes()[n];
            for value in node.inputs.iter().chain(&node.outputs) {
                if !value.is_empty() && !index.is_initializer(value) && !wanted.contains(value) {
                    wanted.push(value.clone());
                }
            }
        }
        let reference_index = GraphIndex::new(reference_model.graph());
        if let Some(v) = wanted.iter().find(|v| !reference_index.has_value(v)) {
            return Err(Error::Usage(format!(
                "the reference's model has no value `{v}`, which the target's piece reads: the \
                 two files name their values differently"
            )));
        }
        let mut exposed = reference_model.clone();
        expose_values(&mut exposed, &wanted)?;
        let values = reference_runtime.run(&exposed, inputs, &wanted)?;
        Ok(Self {
            target_model,
            index,
            target_spec,
            target_runtime,
            inputs: inputs.to_vec(),
            values,
        })
    }

    /// The target's file's graph.
    pub(crate) fn index(&self) -> &GraphIndex {
        &self.index
    }

    /// Runs `piece` (node indices) on the target's runtime for `value`, judged by `bound`.
    pub(crate) fn run(&self, piece: &[usize], value: &str, bound: Bound) -> Result<Tried> {
        let value_of = |name: &str| self.values.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        let feeds = feeds_of(&self.index, piece, &self.inputs, &value_of);
        let wanted = [value.to_string()];
        let model = extract_nodes(&self.target_model, piece, &wanted, &feeds)?;
        let got = self
            .target_runtime
            .run(&model, &feeds, &wanted)?
            .remove(0)
            .1;
        let expected = value_of(value)
            .ok_or_else(|| Error::Usage(format!("no reference value of `{value}`")))?
            .clone();
        let (multiple, max_abs_diff) = judged(bound, &expected, &got)?;
        Ok(Tried {
            model,
            feeds,
            got,
            expected,
            multiple,
            max_abs_diff,
        })
    }

    /// A node's name in words (its op where it has none).
    fn name(&self, n: usize) -> String {
        let node = &self.index.nodes()[n];
        if node.name.is_empty() {
            node.op_type.clone()
        } else {
            node.name.clone()
        }
    }
}

/// Writes the repro of `report`'s headline into `folder`, for `layerdiff onnx` run with
/// `options` on `inputs`; `command` is the command line that made the report, for its README.
/// Where the headline was narrowed inside a fusion, the repro starts at the node that carries
/// it.
pub fn onnx(
    options: &OnnxOptions,
    report: &Report,
    inputs: &[(String, Tensor)],
    folder: &Path,
    most_nodes: usize,
    command: &str,
    ort_library: Option<&Path>,
) -> Result<Repro> {
    let layer = headline(report).map_err(Error::Usage)?;
    let value = layer
        .inside
        .as_ref()
        .map_or_else(|| layer.name.clone(), |inside| inside.value.clone());
    let target_index = match &options.vs {
        Some(path) => GraphIndex::new(Model::load(path)?.graph()),
        None => GraphIndex::new(Model::load(&options.model)?.graph()),
    };
    if target_index.producer(&value).is_none() {
        return Err(Error::Usage(format!(
            "`{value}` is not computed by a node of the target's model: nothing to cut out"
        )));
    }
    let rings = rings(&target_index, &value, most_nodes);
    let all: Vec<usize> = rings.iter().flatten().copied().collect();
    let pieces = Pieces::new(options, inputs, &all, ort_library)?;
    let mut piece: Vec<usize> = Vec::new();
    let mut tried = None;
    for ring in &rings {
        piece.extend(ring);
        let run = pieces.run(&piece, &value, layer.tolerance)?;
        let shown = run.multiple > 1.0;
        tried = Some(run);
        if shown {
            break;
        }
    }
    let tried = tried.expect("one ring at least");
    let names: Vec<String> = {
        let mut nodes = piece.clone();
        nodes.sort_unstable();
        nodes.iter().map(|&n| pieces.name(n)).collect()
    };
    let written = Written {
        report,
        layer,
        value: &value,
        reference: options.reference.spelling(),
        target: &pieces.target_spec,
        command,
        folder,
    };
    written.write(tried, names)
}

/// What a repro's folder is written from.
struct Written<'a> {
    report: &'a Report,
    layer: &'a Layer,
    /// The value the piece computes.
    value: &'a str,
    reference: String,
    target: &'a RuntimeSpec,
    command: &'a str,
    folder: &'a Path,
}

impl Written<'_> {
    /// Writes the folder of the piece `tried` (its nodes' names `names`) and says what it is.
    fn write(&self, tried: Tried, names: Vec<String>) -> Result<Repro> {
        let repro = Repro {
            folder: self.folder.to_path_buf(),
            layer: self.value.to_string(),
            nodes: names,
            reproduced: tried.multiple > 1.0,
            max_abs_diff: tried.max_abs_diff,
            multiple: tried.multiple,
        };
        let facts = script::Facts {
            report: self.report,
            layer: self.layer,
            reference: self.reference.clone(),
            target: self.target,
            reference_detail: &self.report.reference.detail,
            target_detail: &self.report.target.detail,
            command: self.command,
            repro: &repro,
            target_value: &tried.got,
            inputs: tried
                .model
                .graph()
                .input
                .iter()
                .map(|i| i.name().to_string())
                .collect(),
        };
        write_folder(
            self.folder,
            &tried.model,
            &tried.feeds,
            self.value,
            &tried.expected,
            &facts,
        )?;
        Ok(repro)
    }
}

/// The repro of a framework reference's headline against an ONNX target (`layerdiff torch`
/// against the export): the layer's ONNX nodes `nodes` (by name) of `model_path`, fed the
/// framework's values at their inputs (`feeds`, by ONNX value name, cast to the types the file
/// declares), held to the framework's value of the layer (`expected`), run on `target`.
#[allow(clippy::too_many_arguments)]
pub fn framework_piece(
    report: &Report,
    layer_name: &str,
    model_path: &Path,
    nodes: &[String],
    feeds: Vec<(String, Tensor)>,
    expected: Tensor,
    target: &RuntimeSpec,
    command: &str,
    folder: &Path,
    ort_library: Option<&Path>,
) -> Result<Repro> {
    let layer = report
        .layers
        .iter()
        .find(|l| l.name == layer_name)
        .ok_or_else(|| Error::Usage(format!("the report has no layer `{layer_name}`")))?;
    let value = layer
        .location
        .as_ref()
        .map(|l| l.value.clone())
        .ok_or_else(|| Error::Usage(format!("`{layer_name}` has no ONNX value")))?;
    let model = Model::load(model_path)?;
    let index = GraphIndex::new(model.graph());
    let picked: Vec<usize> = nodes
        .iter()
        .map(|name| {
            index
                .nodes()
                .iter()
                .find(|n| &n.name == name)
                .map(|n| n.index)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "`{}` has no node `{name}`: not the file the report compared",
                        model_path.display()
                    ))
                })
        })
        .collect::<Result<_>>()?;
    // As the local re-run fed them: each value in the type the file declares for it.
    let feeds: Vec<(String, Tensor)> = feeds
        .into_iter()
        .map(|(name, tensor)| {
            let declared = index
                .elem_type(&name)
                .and_then(|code| layerdiff_core::DType::from_onnx_code(code).ok());
            match declared {
                Some(dtype)
                    if dtype != tensor.dtype && dtype.is_float() && tensor.dtype.is_float() =>
                {
                    (name, tensor.cast(dtype))
                }
                _ => (name, tensor),
            }
        })
        .collect();
    let wanted = [value.clone()];
    let piece = extract_nodes(&model, &picked, &wanted, &feeds)?;
    let runtime = target.build(ort_library)?;
    let got = runtime.run(&piece, &feeds, &wanted)?.remove(0).1;
    let (multiple, max_abs_diff) = judged(layer.tolerance, &expected, &got)?;
    let tried = Tried {
        model: piece,
        feeds,
        got,
        expected,
        multiple,
        max_abs_diff,
    };
    let mut sorted = picked.clone();
    sorted.sort_unstable();
    let names = sorted
        .iter()
        .map(|&n| {
            let node = &index.nodes()[n];
            if node.name.is_empty() {
                node.op_type.clone()
            } else {
                node.name.clone()
            }
        })
        .collect();
    let written = Written {
        report,
        layer,
        value: &value,
        reference: report.reference.runtime.clone(),
        target,
        command,
        folder,
    };
    written.write(tried, names)
}

/// Where inside a fusion the headline's difference is born: when the target's runtime
/// rewrites the graph and the nodes between the headline's value and the values compared
/// before it are several (a fusion left none of their values), each is run alone on the
/// target's runtime, in graph order; the first beyond the tolerance carries it. `None` when
/// there is no such region, or no node alone shows it.
pub fn inside_fusion(
    options: &OnnxOptions,
    report: &Report,
    inputs: &[(String, Tensor)],
    ort_library: Option<&Path>,
) -> Result<Option<(String, Inside)>> {
    let Ok(layer) = headline(report) else {
        return Ok(None);
    };
    // The target's own nodes (not the layout conversions layerdiff adds to read values back).
    let fused: Vec<String> = layer
        .location
        .iter()
        .flat_map(|l| &l.nodes)
        .filter(|n| !n.starts_with("layerdiff/"))
        .cloned()
        .collect();
    if report.target_graph.is_none() || fused.is_empty() {
        return Ok(None);
    }
    let target_index = match &options.vs {
        Some(path) => GraphIndex::new(Model::load(path)?.graph()),
        None => GraphIndex::new(Model::load(&options.model)?.graph()),
    };
    let compared: HashSet<&str> = report
        .layers
        .iter()
        .filter(|l| l.status == layerdiff_core::LayerStatus::Compared && l.name != layer.name)
        .map(|l| l.name.as_str())
        .collect();
    let known =
        |v: &str| compared.contains(v) || target_index.graph_inputs().iter().any(|i| i == v);
    let Ok(group) = layerdiff_onnx::local_group(&target_index, &layer.name, &known) else {
        return Ok(None);
    };
    if group.nodes.len() < 2 || group.nodes.len() > MOST_NODES * 4 {
        return Ok(None);
    }
    let pieces = Pieces::new(options, inputs, &group.nodes, ort_library)?;
    let mut agree = Vec::new();
    for &n in &group.nodes {
        let node = &pieces.index().nodes()[n];
        let Some(value) = node.outputs.first().filter(|v| !v.is_empty()).cloned() else {
            continue;
        };
        let tried = pieces.run(&[n], &value, layer.tolerance)?;
        if tried.multiple > 1.0 {
            return Ok(Some((
                layer.name.clone(),
                Inside {
                    fused,
                    node: pieces.name(n),
                    op: node.op_type.clone(),
                    value,
                    max_abs_diff: tried.max_abs_diff,
                    tolerance_multiple: tried.multiple,
                    agree,
                },
            )));
        }
        agree.push(pieces.name(n));
    }
    Ok(None)
}

/// The nodes behind `value` ring by ring (its producer, then the producers of what those
/// read…), each ring in graph order, until `most` nodes are taken.
fn rings(index: &GraphIndex, value: &str, most: usize) -> Vec<Vec<usize>> {
    let mut rings: Vec<Vec<usize>> = Vec::new();
    let mut taken: HashSet<usize> = HashSet::new();
    let mut front = vec![index.producer(value).expect("checked").index];
    while !front.is_empty() && taken.len() < most.max(1) {
        let mut ring = Vec::new();
        for n in front {
            if taken.len() < most.max(1) && taken.insert(n) {
                ring.push(n);
            }
        }
        ring.sort_unstable();
        let mut next: Vec<usize> = Vec::new();
        for &n in &ring {
            for input in &index.nodes()[n].inputs {
                if let Some(p) = index.producer(input)
                    && !taken.contains(&p.index)
                    && !next.contains(&p.index)
                {
                    next.push(p.index);
                }
            }
        }
        if ring.is_empty() {
            break;
        }
        rings.push(ring);
        front = next;
    }
    rings
}

/// What the piece reads, from the reference: graph inputs as given, the rest as computed.
fn feeds_of<'a>(
    index: &GraphIndex,
    piece: &[usize],
    inputs: &[(String, Tensor)],
    value_of: &dyn Fn(&str) -> Option<&'a Tensor>,
) -> Vec<(String, Tensor)> {
    let produced: HashSet<&str> = piece
        .iter()
        .flat_map(|&n| index.nodes()[n].outputs.iter().map(String::as_str))
        .collect();
    let mut feeds: Vec<(String, Tensor)> = Vec::new();
    for &n in piece {
        for input in &index.nodes()[n].inputs {
            if input.is_empty()
                || index.is_initializer(input)
                || produced.contains(input.as_str())
                || feeds.iter().any(|(f, _)| f == input)
            {
                continue;
            }
            let tensor = inputs
                .iter()
                .find(|(name, _)| name == input)
                .map(|(_, t)| t)
                .or_else(|| value_of(input));
            if let Some(t) = tensor {
                feeds.push((input.clone(), t.clone()));
            }
        }
    }
    feeds
}

/// The target's value against the reference's, judged by the layer's tolerance: (its
/// difference as a multiple of the tolerance, the largest difference).
fn judged(bound: Bound, expected: &Tensor, got: &Tensor) -> Result<(f64, f64)> {
    let grid = if got.dtype.narrower_than(expected.dtype) {
        got.dtype
    } else {
        expected.dtype
    };
    let stats = compare_judged(expected.view(), got.view(), Some(Judge { grid, bound }))?;
    Ok((
        stats.tolerance_multiple().unwrap_or(0.0),
        stats.max_abs_diff,
    ))
}

/// Writes the repro's files into a folder of its own beside `folder`, then moves it into place
/// (replacing an earlier repro there): a failure leaves no half folder behind.
fn write_folder(
    folder: &Path,
    model: &Model,
    feeds: &[(String, Tensor)],
    value: &str,
    expected: &Tensor,
    facts: &script::Facts,
) -> Result<()> {
    let io = |path: PathBuf| {
        move |source: std::io::Error| Error::Write {
            path: path.clone(),
            source,
        }
    };
    let model = layerdiff_onnx::inline_external_data(model)?;
    let parent = folder
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent.to_path_buf()))?;
    let staging = tempfile::Builder::new()
        .prefix(".repro-")
        .tempdir_in(parent)
        .map_err(io(parent.to_path_buf()))?;
    let at = staging.path();
    let metadata = BTreeMap::from([("producer".to_string(), "layerdiff".to_string())]);
    write_safetensors(&at.join("inputs.safetensors"), feeds, metadata.clone())?;
    write_safetensors(
        &at.join("expected.safetensors"),
        &[(value.to_string(), expected.clone())],
        metadata,
    )?;
    for (name, contents) in [
        ("model.onnx", model.to_bytes()),
        ("repro.py", script::repro_py(facts).into_bytes()),
        ("README.md", script::readme(facts).into_bytes()),
    ] {
        let path = at.join(name);
        std::fs::write(&path, &contents).map_err(io(path.clone()))?;
    }
    if folder.exists() {
        std::fs::remove_dir_all(folder).map_err(io(folder.to_path_buf()))?;
    }
    std::fs::rename(staging.keep(), folder).map_err(io(folder.to_path_buf()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerdiff_onnx::{GraphProto, NodeProto};

    /// `x → a → b`, `x → c`, `d = b + c`, `e = Relu(d)`.
    fn diamond() -> GraphIndex {
        let node = |name: &str, op: &str, inputs: &[&str]| NodeProto {
            op_type: Some(op.into()),
            name: Some(name.into()),
            input: inputs.iter().map(|i| i.to_string()).collect(),
            output: vec![name.into()],
            ..Default::default()
        };
        GraphIndex::new(&GraphProto {
            node: vec![
                node("a", "Relu", &["x"]),
                node("b", "Relu", &["a"]),
                node("c", "Relu", &["x"]),
                node("d", "Add", &["b", "c"]),
                node("e", "Relu", &["d"]),
            ],
            ..Default::default()
        })
    }

    #[test]
    fn a_piece_grows_a_ring_of_producers_at_a_time_up_to_the_most_nodes() {
        let index = diamond();
        assert_eq!(
            rings(&index, "e", 5),
            vec![vec![4], vec![3], vec![1, 2], vec![0]]
        );
        assert_eq!(rings(&index, "e", 3), vec![vec![4], vec![3], vec![1]]);
        assert_eq!(rings(&index, "e", 1), vec![vec![4]]);
        assert_eq!(rings(&index, "a", 5), vec![vec![0]]);
    }
}
