//! The smallest piece of an ONNX model that still shows a report's headline defect, checked by
//! running it before it is claimed (`--repro DIR`, `layerdiff reduce REPORT.json`).
//!
//! The piece starts as the node that produces the headline layer's value and grows backwards,
//! a ring of producers at a time, only while the target's run of it stays within the tolerance
//! (a difference born inside a fusion needs the nodes the runtime fuses). Its inputs are the
//! reference's values there, and what it must produce is the reference's value of the layer:
//! the same question the layer's local error asked, now in a file a runtime's maintainers can
//! run with their runtime and numpy alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use layerdiff_core::{Layer, Measure, Report, Tensor, write_safetensors};
use layerdiff_onnx::{GraphIndex, Model, extract_nodes};
use layerdiff_runtime::RuntimeSpec;

use crate::onnx::OnnxOptions;
use crate::onnx::pieces::{Pieces, Tried};
use crate::{Error, Result};

mod module;
pub use module::{ModuleRepro, ModuleSide, Shown};
mod script;
pub use script::READER;

/// The last line a repro.py prints when the target's difference shows.
pub const REPRODUCED: &str = "reproduced";
/// The last line a repro.py prints when the target stays within the tolerance.
pub const NOT_REPRODUCED: &str = "not reproduced: within the tolerance";

/// A repro written, and what its check found.
#[derive(Debug, Clone)]
pub struct Repro {
    /// Its folder.
    pub folder: PathBuf,
    /// The value it computes (the headline layer's in the target's file).
    pub layer: String,
    /// The report's name of that layer, where the file calls its value otherwise (a module's
    /// name against the export's `conv2d_1`).
    pub named: Option<String>,
    /// Its nodes' names (their op where unnamed), in graph order.
    pub nodes: Vec<String>,
    /// Whether the target's run of the piece shows the finding (beyond the tolerance, or, for
    /// a finding within it, beyond what precision explains: `measure`): when not, the folder
    /// holds the largest piece tried, and says so.
    pub reproduced: bool,
    /// The target's largest difference from the reference's value, on the piece.
    pub max_abs_diff: f64,
    /// Its difference as a multiple of `measure`.
    pub multiple: f64,
    /// What the piece is held to: what the report judged the layer by.
    pub measure: Measure,
    /// Where the headline defect is a weight of the file that differs from the reference's,
    /// what the report said of it: the weight itself is the evidence, whether or not a run
    /// of the piece shows it (an element moved by less than any tolerance shows).
    pub weight: Option<String>,
}

impl Repro {
    /// The layer as the report names it, with the file's value where that differs.
    fn shown(&self) -> String {
        match &self.named {
            Some(name) => format!("`{name}` (the file's `{}`)", self.layer),
            None => format!("`{}`", self.layer),
        }
    }

    /// How far the target's value on the piece is from the reference's, in words.
    pub fn difference(&self) -> String {
        if self.max_abs_diff.is_finite() {
            format!("differs by {:.3e}", self.max_abs_diff)
        } else {
            "differs without bound (NaN or Inf on one side where the other holds a number)".into()
        }
    }

    /// Whether the folder holds the headline defect: its piece's run shows it, or the defect
    /// is a weight that the piece holds (the report read it from the file), which no run needs
    /// to show.
    pub fn found(&self) -> bool {
        self.reproduced || self.weight.is_some()
    }

    /// The repro in one line.
    pub fn sentence(&self) -> String {
        let nodes = self.nodes.len();
        let plural = if nodes == 1 { "node" } else { "nodes" };
        let of = self.measure.words();
        if let Some(weight) = self.weight.as_ref().filter(|_| !self.reproduced) {
            return format!(
                "repro of {}: {nodes} {plural} ({}) in {}, holding the file's weight that is the defect: {weight}; no run shows it: on the piece the target stays within {of} ({}), as the layer did in the run, so the weight is the evidence, read from the file",
                self.shown(),
                self.nodes.join(", "),
                self.folder.display(),
                layerdiff_core::render::times(self.multiple)
            );
        }
        if self.reproduced {
            let weight = (self.weight.as_ref())
                .map(|w| format!("; it holds the file's weight that is the defect: {w}"))
                .unwrap_or_default();
            format!(
                "repro of {}: {nodes} {plural} ({}) in {}, checked: the target {}, {} {of} (python repro.py){weight}",
                self.shown(),
                self.nodes.join(", "),
                self.folder.display(),
                self.difference(),
                layerdiff_core::render::times(self.multiple)
            )
        } else {
            format!(
                "no repro of {} within {nodes} {plural}: on the piece the target stays within {of} ({}), so the difference needs more of the model; the largest piece tried is in {}",
                self.shown(),
                layerdiff_core::render::times(self.multiple),
                self.folder.display()
            )
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
) -> Result<Repro> {
    let layer = report.headline().map_err(Error::Usage)?;
    let value = layer
        .inside
        .as_ref()
        .map_or_else(|| layer.name.clone(), |inside| inside.value.clone());
    let mut pieces = Pieces::new(options, inputs)?;
    if pieces.index().producer(&value).is_none() {
        return Err(Error::Usage(format!(
            "`{value}` is not computed by a node of the target's model: nothing to cut out"
        )));
    }
    let rings = pieces.rings(&value, most_nodes)?;
    let all: Vec<usize> = rings.iter().flatten().copied().collect();
    pieces.compute_reference(&all)?;
    let mut piece: Vec<usize> = Vec::new();
    let mut tried = None;
    let measure = Measure::of(layer);
    for ring in &rings {
        piece.extend(ring);
        let run = pieces.run(&piece, &value, &measure)?;
        let shown = measure.shows(run.multiple);
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
    // the piece is the target's: with `--vs`, that file's
    let source = options.vs.as_deref().and_then(Path::file_name);
    let written = Written {
        report,
        source: source.map_or_else(|| report.model.clone(), |f| f.to_string_lossy().into()),
        layer,
        value: &value,
        reference: options.reference.spelling(),
        target: &pieces.target_spec,
        command,
        folder,
        measure,
    };
    written.write(tried, names)
}

/// What the report said of `layer`'s defect where it is a weight of the file that differs
/// from the reference's.
fn weight_defect(report: &Report, layer: &str) -> Option<String> {
    (report.summary.defects.iter())
        .find(|d| d.layer == layer && d.cause == layerdiff_core::Cause::WeightMismatch)
        .map(|d| d.detail.clone())
}

/// What a repro's folder is written from.
struct Written<'a> {
    report: &'a Report,
    /// The model the piece is cut from, as the README names it.
    source: String,
    layer: &'a Layer,
    /// The value the piece computes.
    value: &'a str,
    reference: String,
    target: &'a RuntimeSpec,
    command: &'a str,
    folder: &'a Path,
    /// What the piece is held to.
    measure: Measure,
}

impl Written<'_> {
    /// Writes the folder of the piece `tried` (its nodes' names `names`) and says what it is.
    fn write(&self, tried: Tried, names: Vec<String>) -> Result<Repro> {
        let repro = Repro {
            folder: self.folder.to_path_buf(),
            layer: self.value.to_string(),
            // the report's name of the value, where the piece computes the layer's own value
            // (not a node a fusion was narrowed to) and the file calls it otherwise
            named: self
                .layer
                .location
                .as_ref()
                .filter(|l| l.value == self.value && self.layer.name != self.value)
                .map(|_| self.layer.name.clone()),
            nodes: names,
            reproduced: self.measure.shows(tried.multiple),
            max_abs_diff: tried.max_abs_diff,
            multiple: tried.multiple,
            measure: self.measure.clone(),
            weight: weight_defect(self.report, &self.layer.name),
        };
        let facts = script::Facts {
            report: self.report,
            source: &self.source,
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
/// against the export): the nodes of `model_path` between the framework's values at the layer's
/// inputs (`feeds`, by ONNX value name, cast to the types the file declares) and its value, as
/// its local re-run ran them (the layer's own ONNX nodes `nodes`, by name, where no such group
/// is found), held to the framework's value of the layer (`expected`), run on `target`.
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
    // As the local re-run ran it: every node of the file from the fed values to the layer's
    // value, those no layer maps to (an edit's) among them; where the layer's nodes are those
    // of the graph the runtime optimized (an NCHWc Conv), the file's that compute it.
    let fed = |name: &str| feeds.iter().any(|(n, _)| n == name);
    let picked: Vec<usize> = match layerdiff_onnx::local_group(&index, &value, &fed) {
        Ok(group) => group.nodes,
        Err(_) => nodes
            .iter()
            .map(|name| {
                (index.nodes().iter().find(|n| &n.name == name))
                    .map(|n| n.index)
                    .ok_or_else(|| {
                        Error::Usage(format!(
                            "`{}` has no node `{name}`: not the file the report compared",
                            model_path.display()
                        ))
                    })
            })
            .collect::<Result<_>>()?,
    };
    // As the local re-run fed them: each value in the type the file declares for it.
    let feeds: Vec<(String, Tensor)> = feeds
        .into_iter()
        .map(|(name, tensor)| {
            let tensor = crate::onnx::pieces::as_declared(&index, &name, tensor);
            (name, tensor)
        })
        .collect();
    let wanted = [value.clone()];
    let piece = extract_nodes(&model, &picked, &wanted, &feeds)?;
    let runtime = target.build()?;
    let got = runtime.run(&piece, &feeds, &wanted)?.remove(0).1;
    let measure = Measure::of(layer);
    let (multiple, max_abs_diff) = measure.judge(expected.view(), got.view())?;
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
        source: report.model.clone(),
        layer,
        value: &value,
        reference: report.reference.runtime.clone(),
        target,
        command,
        folder,
        measure,
    };
    written.write(tried, names)
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
