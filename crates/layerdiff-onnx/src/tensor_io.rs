//! `TensorProto` → [`Tensor`]: initializers, and the `input_N.pb` / `output_N.pb` files of ONNX
//! test data sets.

use std::path::Path;

use layerdiff_core::{DType, Tensor, TensorView};
use prost::Message;

use crate::{Error, Result, TensorProto};

/// Reads one serialized `TensorProto` file (as in `test_data_set_0/input_0.pb`).
pub fn read_tensor_pb(path: &Path) -> Result<(String, Tensor)> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_tensor_pb(&bytes, path)
}

/// One serialized `TensorProto` from `bytes` (`path` names it in errors).
pub fn parse_tensor_pb(bytes: &[u8], path: &Path) -> Result<(String, Tensor)> {
    let proto = TensorProto::decode(bytes).map_err(|source| Error::Decode {
        path: path.to_path_buf(),
        source,
    })?;
    let tensor = tensor_from_proto(&proto).map_err(|message| Error::NotAModel {
        path: path.to_path_buf(),
        reason: message,
    })?;
    Ok((proto.name().to_string(), tensor))
}

/// The `prefix_0.pb`, `prefix_1.pb`, … tensors of an ONNX test data folder, in index order;
/// unnamed tensors take `names[i]` (the graph's i-th input or output).
pub fn read_test_data(dir: &Path, prefix: &str, names: &[String]) -> Result<Vec<(String, Tensor)>> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut numbered: Vec<(usize, std::path::PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let n = name
                .strip_prefix(prefix)?
                .strip_prefix('_')?
                .strip_suffix(".pb")?
                .parse()
                .ok()?;
            Some((n, entry.path()))
        })
        .collect();
    numbered.sort();
    numbered
        .into_iter()
        .map(|(i, path)| {
            let (name, tensor) = read_tensor_pb(&path)?;
            if !name.is_empty() {
                return Ok((name, tensor));
            }
            let name = names.get(i).cloned().ok_or_else(|| Error::NotAModel {
                path: path.clone(),
                reason: format!("the tensor is unnamed and the model has no {prefix} {i}"),
            })?;
            Ok((name, tensor))
        })
        .collect()
}

/// Converts a `TensorProto` held in the file (raw or typed fields) to a tensor.
pub fn tensor_from_proto(proto: &TensorProto) -> std::result::Result<Tensor, String> {
    Stored::of(proto).map(Stored::into_tensor)
}

/// A tensor's values where the file holds them: its raw bytes borrowed, typed fields decoded.
pub struct Stored<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Little-endian element bytes, C order.
    pub bytes: std::borrow::Cow<'a, [u8]>,
}

impl<'a> Stored<'a> {
    /// The values of a `TensorProto` held in the file (raw or typed fields).
    pub fn of(proto: &'a TensorProto) -> std::result::Result<Self, String> {
        let name = proto.name();
        let dtype = DType::from_onnx_code(proto.data_type()).map_err(|_| {
            format!(
                "tensor `{name}` has element type {}, which layerdiff cannot read",
                proto.data_type()
            )
        })?;
        if proto.data_location() == crate::tensor_proto::DataLocation::External {
            return Err(format!(
                "tensor `{name}` keeps its data in an external file"
            ));
        }
        let shape: Vec<usize> = proto.dims.iter().map(|&d| d.max(0) as usize).collect();
        // (a shape that multiplies past any size holds no bytes: the check below says so)
        let n: usize = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .unwrap_or(usize::MAX);
        let bytes = if let Some(raw) = proto.raw_data.as_ref().filter(|r| !r.is_empty() || n == 0) {
            std::borrow::Cow::Borrowed(&raw[..])
        } else {
            std::borrow::Cow::Owned(typed_bytes(proto, dtype))
        };
        // Checked as a tensor is: the bytes must hold the shape.
        TensorView::new(name, dtype, &shape, &bytes).map_err(|e| e.to_string())?;
        Ok(Self {
            dtype,
            shape,
            bytes,
        })
    }

    /// A view of the values.
    pub fn view(&self) -> TensorView<'_> {
        TensorView {
            dtype: self.dtype,
            shape: &self.shape,
            bytes: &self.bytes,
        }
    }

    /// An owned tensor (the bytes copied when borrowed).
    pub fn into_tensor(self) -> Tensor {
        Tensor {
            dtype: self.dtype,
            shape: self.shape,
            bytes: self.bytes.into_owned(),
        }
    }
}

/// The little-endian bytes of a tensor kept in its typed fields.
fn typed_bytes(proto: &TensorProto, dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => proto
            .float_data
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F64 => proto
            .double_data
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::I64 => proto
            .int64_data
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::U64 | DType::U32 => {
            let size = dtype.size();
            proto
                .uint64_data
                .iter()
                .flat_map(|v| v.to_le_bytes()[..size].to_vec())
                .collect()
        }
        // int32_data carries every type of 32 bits or fewer, float16/bfloat16 as their bits.
        _ => {
            let size = dtype.size();
            proto
                .int32_data
                .iter()
                .flat_map(|v| v.to_le_bytes()[..size].to_vec())
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_and_raw_fields_give_the_same_tensor() {
        let typed = TensorProto {
            dims: vec![2],
            data_type: Some(1),
            float_data: vec![1.5, -2.0],
            ..Default::default()
        };
        let raw = TensorProto {
            dims: vec![2],
            data_type: Some(1),
            raw_data: Some(
                [1.5f32, -2.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            ..Default::default()
        };
        assert_eq!(
            tensor_from_proto(&typed).unwrap(),
            tensor_from_proto(&raw).unwrap()
        );
        let halfs = TensorProto {
            dims: vec![1],
            data_type: Some(10),
            int32_data: vec![0x3C00],
            ..Default::default()
        };
        assert_eq!(tensor_from_proto(&halfs).unwrap().bytes, vec![0x00, 0x3C]);
    }
}
