use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use prost::Message;

use crate::tensor_io::Stored;
use crate::tensor_proto::DataLocation;
use crate::{Error, GraphProto, ModelProto, NodeExt, Result};

/// An ONNX model and the folder its external data (if any) is read from. Cloning it is cheap
/// in memory: tensor bytes are reference-counted and shared.
#[derive(Debug, Clone)]
pub struct Model {
    /// The decoded protobuf.
    pub proto: ModelProto,
    /// The folder that external-data `location`s are relative to: the model file's folder.
    base_dir: Option<PathBuf>,
}

impl Model {
    /// Reads and decodes a model file, checking that it holds a graph with at least one node.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = read_shared(path, true).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let base_dir = path.parent().map(Path::to_path_buf);
        // Decoded from shared bytes, the weights stay slices of the file's buffer: no second
        // copy, and a clone of the model shares them.
        Self::decode(bytes, path, base_dir)
    }

    /// Decodes a model from memory; `origin` names it in error messages.
    pub fn from_bytes(bytes: &[u8], origin: &Path, base_dir: Option<PathBuf>) -> Result<Self> {
        Self::decode(bytes, origin, base_dir)
    }

    fn decode(
        bytes: impl prost::bytes::Buf,
        origin: &Path,
        base_dir: Option<PathBuf>,
    ) -> Result<Self> {
        let proto = ModelProto::decode(bytes).map_err(|source| Error::Decode {
            path: origin.to_path_buf(),
            source,
        })?;
        let not_a_model = |reason: &str| Error::NotAModel {
            path: origin.to_path_buf(),
            reason: reason.to_string(),
        };
        let graph = proto
            .graph
            .as_ref()
            .ok_or_else(|| not_a_model("it has no graph"))?;
        if graph.node.is_empty() {
            return Err(not_a_model("its graph has no nodes"));
        }
        if proto.opset_import.is_empty() {
            return Err(not_a_model(
                "it declares no opset (`opset_import` is empty)",
            ));
        }
        check_tensors(graph, origin, base_dir.as_deref())?;
        Ok(Self { proto, base_dir })
    }

    /// Wraps an edited or built `ModelProto` (already known to hold a graph), with the folder its
    /// external data is read from.
    pub fn from_proto(proto: ModelProto, base_dir: Option<PathBuf>) -> Self {
        Self { proto, base_dir }
    }

    /// The main graph.
    pub fn graph(&self) -> &GraphProto {
        self.proto.graph.as_ref().expect("checked at load")
    }

    /// Whether a node of one of `ops` (op types) is in the model, its subgraphs' included.
    pub fn has_op(&self, ops: &[&str]) -> bool {
        fn has(graph: &GraphProto, ops: &[&str]) -> bool {
            (graph.node.iter())
                .any(|n| ops.contains(&n.op_type()) || n.subgraphs().any(|g| has(g, ops)))
        }
        has(self.graph(), ops)
    }

    /// The main graph, mutably.
    pub fn graph_mut(&mut self) -> &mut GraphProto {
        self.proto.graph.as_mut().expect("checked at load")
    }

    /// The folder external-data locations are relative to (the model file's folder).
    pub fn base_dir(&self) -> Option<&Path> {
        self.base_dir.as_deref()
    }

    /// The model serialized to protobuf bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.proto.encode_to_vec()
    }

    /// Bytes of the model's weights (its initializers, by their shapes and element types): what a
    /// runtime loads beside the values it computes. Types layerdiff does not read count nothing.
    pub fn weight_bytes(&self) -> u64 {
        self.initializer_bytes()
            .values()
            .fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Bytes of each initializer, by name (see [`Model::weight_bytes`]).
    pub fn initializer_bytes(&self) -> std::collections::HashMap<&str, u64> {
        self.graph()
            .initializer
            .iter()
            .filter_map(|t| {
                let size = layerdiff_core::DType::from_onnx_code(t.data_type())
                    .ok()?
                    .size() as u64;
                let bytes = t
                    .dims
                    .iter()
                    .try_fold(size, |n, &d| n.checked_mul(u64::try_from(d).ok()?))?;
                Some((t.name(), bytes))
            })
            .collect()
    }

    /// The distinct external-data files the model's tensors point to, relative to its folder:
    /// its initializers', its nodes' constants and its subgraphs'.
    pub fn external_data_files(&self) -> BTreeSet<String> {
        fn walk(graph: &GraphProto, found: &mut BTreeSet<String>) {
            let tensors = own_tensors(graph).map(|(_, _, t)| t);
            for t in tensors.filter(|t| t.data_location() == DataLocation::External) {
                if let Some(location) = crate::node_ext::lookup(&t.external_data, "location") {
                    found.insert(location.to_string());
                }
            }
            for sub in graph.node.iter().flat_map(NodeExt::subgraphs) {
                walk(sub, found);
            }
        }
        let mut found = BTreeSet::new();
        walk(self.graph(), &mut found);
        found
    }

    /// The initializer called `name` as a tensor, reading external data from the model's
    /// folder; `None` when there is no such initializer, `Err` when it cannot be read.
    pub fn initializer(
        &self,
        name: &str,
    ) -> Option<std::result::Result<layerdiff_core::Tensor, String>> {
        Some(self.stored(name)?.map(Stored::into_tensor))
    }

    /// The initializer called `name` where the file holds it (its raw bytes borrowed, not
    /// copied), external data read from the model's folder; `None` when there is no such
    /// initializer, `Err` when it cannot be read.
    pub fn stored(&self, name: &str) -> Option<std::result::Result<Stored<'_>, String>> {
        let proto = self.graph().initializer.iter().find(|t| t.name() == name)?;
        if proto.data_location() != DataLocation::External {
            return Some(Stored::of(proto));
        }
        let entry = |key: &str| crate::node_ext::lookup(&proto.external_data, key);
        let read = || -> std::result::Result<Stored<'_>, String> {
            let location = entry("location").ok_or("external data without a location")?;
            let dir = self.base_dir().ok_or("the model's folder is unknown")?;
            let path = dir.join(location);
            // one tensor of a file that may hold all the weights: only its pages are read
            let bytes =
                read_shared(&path, false).map_err(|e| format!("{}: {e}", path.display()))?;
            let offset: usize = entry("offset").and_then(|v| v.parse().ok()).unwrap_or(0);
            let length: usize = entry("length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(bytes.len().saturating_sub(offset));
            if offset
                .checked_add(length)
                .is_none_or(|end| end > bytes.len())
            {
                return Err(format!("{} is shorter than its entry says", path.display()));
            }
            let mut inline = proto.clone();
            inline.data_location = Some(DataLocation::Default as i32);
            inline.external_data.clear();
            inline.raw_data = Some(bytes.slice(offset..offset + length));
            let tensor = Stored::of(&inline)?.into_tensor();
            Ok(Stored {
                dtype: tensor.dtype,
                shape: tensor.shape,
                bytes: std::borrow::Cow::Owned(tensor.bytes),
            })
        };
        Some(read())
    }
}

/// Every tensor (initializers and nodes' constants, the subgraphs' too) holds what its shape
/// says, and its external data lies in the model's folder: its `location` relative, without
/// `..`, and (with the folder known) the file there, not a link out of it. A model file is often downloaded; it must not
/// make layerdiff, or a runtime it hands the model to, read or write anything else.
fn check_tensors(graph: &GraphProto, origin: &Path, base_dir: Option<&Path>) -> Result<()> {
    // a model named without a folder (`m.onnx`) is in the current one
    let folder = base_dir
        .map(|b| {
            if b.as_os_str().is_empty() {
                Path::new(".")
            } else {
                b
            }
        })
        .map(|b| b.canonicalize().unwrap_or_else(|_| b.to_path_buf()));
    for (kind, name, proto) in own_tensors(graph) {
        if proto.data_location() != DataLocation::External {
            // a tensor of a type layerdiff reads must hold its shape (others are left to the
            // runtimes, which read them)
            if layerdiff_core::DType::from_onnx_code(proto.data_type()).is_ok()
                && let Err(reason) = Stored::of(proto)
            {
                return Err(Error::NotAModel {
                    path: origin.to_path_buf(),
                    reason: format!("its {kind} {reason}"),
                });
            }
            continue;
        }
        let location = crate::node_ext::lookup(&proto.external_data, "location").unwrap_or("");
        let refused = |reason: String| Error::ExternalData {
            path: origin.to_path_buf(),
            kind,
            tensor: name.to_string(),
            location: location.to_string(),
            reason,
        };
        let relative = Path::new(location);
        if location.is_empty() {
            return Err(refused("which is empty: no file to read".to_string()));
        }
        if relative.is_absolute() || relative.has_root() {
            return Err(refused(
                "an absolute path: refused (external data must lie in the model's folder)"
                    .to_string(),
            ));
        }
        if relative.components().any(|c| {
            !matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        }) {
            return Err(refused(
                "which leads out of the model's folder: refused (external data must lie in it)"
                    .to_string(),
            ));
        }
        let Some(folder) = &folder else { continue };
        let file = folder.join(relative);
        match file.canonicalize() {
            Err(_) => {
                return Err(refused(format!(
                    "which is missing (looked for `{}`)",
                    file.display()
                )));
            }
            Ok(real) if !real.starts_with(folder) => {
                return Err(refused(format!(
                    "a link to `{}`, outside the model's folder: refused",
                    real.display()
                )));
            }
            Ok(_) => {}
        }
    }
    for sub in graph.node.iter().flat_map(NodeExt::subgraphs) {
        check_tensors(sub, origin, base_dir)?;
    }
    Ok(())
}

/// The tensors a graph holds itself, each with what holds it and its name: its initializers
/// and its nodes' tensor attributes (a Constant's value: `constant`, named by the tensor, else
/// by the node's output), not its subgraphs'.
fn own_tensors(
    graph: &GraphProto,
) -> impl Iterator<Item = (&'static str, &str, &crate::TensorProto)> {
    let constants = graph.node.iter().flat_map(|node| {
        let output = node.output.first().map_or("", String::as_str);
        (node.attribute.iter())
            .flat_map(|a| a.t.as_ref().into_iter().chain(&a.tensors))
            .map(move |t| {
                let name = Some(t.name()).filter(|n| !n.is_empty()).unwrap_or(output);
                ("constant", name, t)
            })
    });
    let initializers = graph
        .initializer
        .iter()
        .map(|t| ("initializer", t.name(), t));
    initializers.chain(constants)
}

/// A file's bytes, shared: mapped from the page cache where the system can map it (a model's
/// weights are then never copied into memory of our own, which costs more than the rest of
/// loading), else read whole. With `whole`, every page is read in at once (the file is about
/// to be read through); without, only the pages used are (a part of it is wanted).
fn read_shared(path: &Path, whole: bool) -> std::io::Result<prost::bytes::Bytes> {
    let file = std::fs::File::open(path)?;
    let mut options = memmap2::MmapOptions::new();
    if whole {
        options.populate();
    }
    // SAFETY: a private, read-only map of a file we only read. Like every reader that maps
    // files (ONNX Runtime maps external data), a process that rewrites the model file while
    // layerdiff runs changes what it reads.
    match unsafe { options.map(&file) } {
        Ok(map) => Ok(prost::bytes::Bytes::from_owner(map)),
        Err(_) => std::fs::read(path).map(prost::bytes::Bytes::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto};

    /// A one-node model whose initializer `w` keeps its 16 bytes in `location`.
    fn with_external(location: &str) -> Vec<u8> {
        let weight = TensorProto {
            name: Some("w".to_string()),
            data_type: Some(1),
            dims: vec![4],
            data_location: Some(DataLocation::External as i32),
            external_data: vec![StringStringEntryProto {
                key: Some("location".to_string()),
                value: Some(location.to_string()),
            }],
            ..TensorProto::default()
        };
        let node = NodeProto {
            op_type: Some("Relu".to_string()),
            input: vec!["w".to_string()],
            output: vec!["y".to_string()],
            ..NodeProto::default()
        };
        ModelProto {
            ir_version: Some(10),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(GraphProto {
                node: vec![node],
                initializer: vec![weight],
                ..GraphProto::default()
            }),
            ..ModelProto::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn external_data_outside_the_model_s_folder_is_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let folder = root.path().join("model");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(root.path().join("secret"), [0u8; 16]).unwrap();
        std::fs::write(folder.join("w.bin"), [0u8; 16]).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(root.path().join("secret"), folder.join("link.bin")).unwrap();
        let load = |location: &str| {
            let path = folder.join("m.onnx");
            std::fs::write(&path, with_external(location)).unwrap();
            Model::load(&path).map(|_| ()).map_err(|e| e.to_string())
        };
        assert_eq!(load("w.bin"), Ok(()));
        assert_eq!(load("./w.bin"), Ok(()));
        let refused = |location: &str| load(location).unwrap_err();
        let secret = root.path().join("secret");
        let absolute = refused(secret.to_str().unwrap());
        assert!(absolute.contains("an absolute path: refused"), "{absolute}");
        assert!(absolute.contains("initializer `w`"), "{absolute}");
        assert!(refused("../secret").contains("leads out of the model's folder: refused"));
        assert!(refused("sub/../../secret").contains("leads out of the model's folder"));
        assert!(refused("gone.bin").contains("which is missing (looked for `"));
        assert!(refused("").contains("which is empty"));
        #[cfg(unix)]
        {
            let link = refused("link.bin");
            assert!(
                link.contains("a link to `")
                    && link.contains("outside the model's folder: refused"),
                "{link}"
            );
        }
        // held in memory, with no folder: only what the location says can be checked
        assert!(Model::from_bytes(&with_external("w.bin"), Path::new("m.onnx"), None).is_ok());
        assert!(Model::from_bytes(&with_external("../w"), Path::new("m.onnx"), None).is_err());
    }

    #[test]
    fn a_constant_s_external_data_is_found_and_checked_as_an_initializer_s() {
        // the initializer `w` becomes a nameless Constant's value inside an `If` branch
        let mut proto = ModelProto::decode(with_external("data.bin").as_slice()).unwrap();
        let graph = proto.graph.as_mut().unwrap();
        let mut value = graph.initializer.remove(0);
        value.name = None;
        let constant = NodeProto {
            op_type: Some("Constant".to_string()),
            output: vec!["c_out".to_string()],
            attribute: vec![crate::AttributeProto {
                name: Some("value".to_string()),
                t: Some(value),
                ..Default::default()
            }],
            ..NodeProto::default()
        };
        let branch = GraphProto {
            node: vec![constant],
            ..GraphProto::default()
        };
        graph.node.push(NodeProto {
            op_type: Some("If".to_string()),
            attribute: vec![crate::AttributeProto {
                name: Some("then_branch".to_string()),
                g: Some(branch),
                ..Default::default()
            }],
            ..NodeProto::default()
        });
        let model = Model::from_proto(proto.clone(), None);
        assert_eq!(
            model.external_data_files(),
            BTreeSet::from(["data.bin".to_string()])
        );
        let lying = |location: &str| {
            let mut bytes = proto.clone();
            let graph = bytes.graph.as_mut().unwrap();
            let branch = graph.node[1].attribute[0].g.as_mut().unwrap();
            let value = branch.node[0].attribute[0].t.as_mut().unwrap();
            value.external_data[0].value = Some(location.to_string());
            Model::from_bytes(&bytes.encode_to_vec(), Path::new("m.onnx"), None)
        };
        assert!(lying("data.bin").is_ok());
        let refused = lying("../secret").unwrap_err().to_string();
        assert!(
            refused.contains("constant `c_out` keeps its data in `../secret`, which leads out"),
            "{refused}"
        );
    }

    #[test]
    fn weight_bytes_count_every_initializer_by_shape_and_type_wherever_it_is_kept() {
        let mut model =
            Model::from_bytes(&with_external("w.bin"), Path::new("m.onnx"), None).unwrap();
        assert_eq!(model.weight_bytes(), 16, "float32[4], kept outside");
        let initializer = |data_type, dims: Vec<i64>| TensorProto {
            data_type: Some(data_type),
            dims,
            ..TensorProto::default()
        };
        let graph = model.graph_mut();
        graph.initializer.push(initializer(11, vec![3, 5])); // float64
        graph.initializer.push(initializer(8, vec![2])); // strings: not read, not counted
        graph.initializer.push(initializer(1, vec![i64::MAX, 4])); // a lie: counts nothing
        assert_eq!(model.weight_bytes(), 16 + 120);
    }
}
