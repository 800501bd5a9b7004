//! The model's weights handed to ONNX Runtime where they already lie in memory, not serialized
//! into every session. A session built from `Model::to_bytes` cost a fresh copy of every weight
//! (protobuf encoding) and ONNX Runtime a second (parsing it back): ResNet-18's (45 MB) session
//! took 0.05–0.08 s that way and 0.013–0.015 s this way (ONNX Runtime 1.31 on 2 cores), and a
//! run makes several. Here each large initializer's bytes become an in-memory file of ONNX
//! Runtime's (`AddExternalInitializersFromFilesInMemory`, the session option made for models
//! with their weights in memory), which it reads in place; the graph it parses holds only their
//! names.

use std::ops::{Deref, DerefMut};

use layerdiff_onnx::{Model, StringStringEntryProto, TensorProto, tensor_proto::DataLocation};
use ort::AsPointer;
use ort::session::Session;
use ort::session::builder::SessionBuilder;
use prost::Message;
use prost::bytes::Bytes;

use super::said::clean_message;
use crate::Result;

/// Initializers this large or larger are handed over in place; smaller ones stay in the graph.
const IN_PLACE: usize = 1024;

/// A model as ONNX Runtime is handed it: the graph, and the weights it reads in place.
pub(super) struct Split {
    /// The model's protobuf, its large initializers pointing to the in-memory files.
    pub graph: Vec<u8>,
    /// Each in-memory file: its name as ONNX Runtime reads file names (NUL-terminated) and its
    /// bytes (shared with the model, not copied).
    files: Vec<(Vec<ort::sys::os_char>, Bytes)>,
}

/// What every in-memory file's name starts with (ONNX Runtime spells its own in-memory tag
/// with `*`, which no file of a model is called).
const PREFIX: &str = "*layerdiff-weight-";

fn file_name(i: usize) -> String {
    format!("{PREFIX}{i}*")
}

/// `name` as ONNX Runtime's C API takes a file name: NUL-terminated, UTF-16 on Windows.
fn os_name(name: &str) -> Vec<ort::sys::os_char> {
    #[cfg(windows)]
    let chars: Vec<ort::sys::os_char> = name.encode_utf16().collect();
    #[cfg(not(windows))]
    let chars: Vec<ort::sys::os_char> = name.bytes().map(|b| b as ort::sys::os_char).collect();
    chars.into_iter().chain([0]).collect()
}

impl Split {
    /// `model` split into its graph and its large weights (the main graph's initializers held
    /// as raw bytes in the model). A model with any tensor in a file beside it is handed over
    /// whole, as written: once given in-memory files, ONNX Runtime looks every external tensor
    /// up among them, and finds none of the model's own files there.
    pub fn of(model: &Model) -> Self {
        if !model.external_data_files().is_empty() {
            return Self {
                graph: model.to_bytes(),
                files: Vec::new(),
            };
        }
        let mut proto = model.proto.clone();
        let mut files = Vec::new();
        if let Some(graph) = proto.graph.as_mut() {
            for tensor in &mut graph.initializer {
                let Some(bytes) = tensor.raw_data.take_if(|b| b.len() >= IN_PLACE) else {
                    continue;
                };
                let name = file_name(files.len());
                point_to(tensor, &name, bytes.len());
                files.push((os_name(&name), bytes));
            }
        }
        Self {
            graph: proto.encode_to_vec(),
            files,
        }
    }

    /// `builder` with the weights handed over; they must outlive the session it commits (see
    /// [`WithWeights`]).
    pub fn hand_over(&self, mut builder: SessionBuilder) -> Result<SessionBuilder> {
        if self.files.is_empty() {
            return Ok(builder);
        }
        let names: Vec<*const ort::sys::os_char> =
            self.files.iter().map(|(n, _)| n.as_ptr()).collect();
        let buffers: Vec<*mut std::ffi::c_char> = (self.files.iter())
            .map(|(_, b)| b.as_ptr().cast::<std::ffi::c_char>().cast_mut())
            .collect();
        let lengths: Vec<usize> = self.files.iter().map(|(_, b)| b.len()).collect();
        // SAFETY: the arrays are as long as `files` and live across the call; ONNX Runtime only
        // reads the buffers, which `WithWeights` keeps alive as long as the session.
        let status = unsafe {
            (ort::api().AddExternalInitializersFromMemory)(
                builder.ptr_mut(),
                names.as_ptr(),
                buffers.as_ptr(),
                lengths.as_ptr(),
                self.files.len(),
            )
        };
        // SAFETY: a status ONNX Runtime just returned, read once.
        unsafe { ort::Error::result_from_status(status) }
            .map_err(|e| super::refused(clean_message(e.to_string())))?;
        Ok(builder)
    }

    /// The session ONNX Runtime committed, holding the weights it reads.
    pub fn holding(self, session: Session) -> WithWeights {
        WithWeights {
            session,
            _weights: self.files.into_iter().map(|(_, b)| b).collect(),
        }
    }
}

/// `tensor`'s data in the in-memory file `name`, all `length` bytes of it.
fn point_to(tensor: &mut TensorProto, name: &str, length: usize) {
    let entry = |key: &str, value: String| StringStringEntryProto {
        key: Some(key.to_string()),
        value: Some(value),
    };
    tensor.data_location = Some(DataLocation::External as i32);
    tensor.external_data = vec![
        entry("location", name.to_string()),
        entry("offset", "0".to_string()),
        entry("length", length.to_string()),
    ];
}

/// A session and the weights it reads in place: dropped session first (fields drop in order).
pub(super) struct WithWeights {
    session: Session,
    _weights: Vec<Bytes>,
}

impl Deref for WithWeights {
    type Target = Session;

    fn deref(&self) -> &Session {
        &self.session
    }
}

impl DerefMut for WithWeights {
    fn deref_mut(&mut self) -> &mut Session {
        &mut self.session
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_weights_leave_the_graph_and_small_ones_stay() {
        let tensor = |name: &str, len: usize| TensorProto {
            name: Some(name.into()),
            data_type: Some(2),
            dims: vec![len as i64],
            raw_data: Some(Bytes::from(vec![7u8; len])),
            ..Default::default()
        };
        let proto = layerdiff_onnx::ModelProto {
            graph: Some(layerdiff_onnx::GraphProto {
                initializer: vec![tensor("big", IN_PLACE), tensor("small", IN_PLACE - 1)],
                ..Default::default()
            }),
            ..Default::default()
        };
        let model = Model::from_proto(proto, None);
        let split = Split::of(&model);
        let graph = layerdiff_onnx::ModelProto::decode(split.graph.as_slice()).unwrap();
        let [big, small] = graph.graph.unwrap().initializer.try_into().unwrap();
        assert_eq!(big.raw_data, None);
        assert_eq!(big.data_location, Some(DataLocation::External as i32));
        assert_eq!(
            (big.external_data.iter())
                .map(|e| (e.key(), e.value()))
                .collect::<Vec<_>>(),
            [
                ("location", "*layerdiff-weight-0*"),
                ("offset", "0"),
                ("length", "1024")
            ]
        );
        assert_eq!(small.raw_data.map(|b| b.len()), Some(IN_PLACE - 1));
        // the file is the model's own bytes, shared, not a copy
        let held = &model.graph().initializer[0].raw_data.as_ref().unwrap();
        assert_eq!(split.files[0].1.as_ptr(), held.as_ptr());

        // one tensor in a file beside the model, even a node's constant in a subgraph: the
        // model goes to ONNX Runtime as written
        let mut beside = model.proto.clone();
        let mut lying = tensor("lying", 8);
        lying.raw_data = None;
        point_to(&mut lying, "model.onnx.data", 8);
        let body = layerdiff_onnx::GraphProto {
            node: vec![layerdiff_onnx::NodeProto {
                op_type: Some("Constant".into()),
                attribute: vec![layerdiff_onnx::AttributeProto {
                    name: Some("value".into()),
                    t: Some(lying),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        beside
            .graph
            .as_mut()
            .unwrap()
            .node
            .push(layerdiff_onnx::NodeProto {
                op_type: Some("If".into()),
                attribute: vec![layerdiff_onnx::AttributeProto {
                    name: Some("then_branch".into()),
                    g: Some(body),
                    ..Default::default()
                }],
                ..Default::default()
            });
        let split = Split::of(&Model::from_proto(beside, None));
        assert!(split.files.is_empty());
        let graph = layerdiff_onnx::ModelProto::decode(split.graph.as_slice()).unwrap();
        let kept = &graph.graph.unwrap().initializer[0];
        assert_eq!(kept.raw_data.as_ref().map(|b| b.len()), Some(IN_PLACE));
    }
}
