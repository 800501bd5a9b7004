//! Tensors on disk travel as safetensors (it has bf16; npz does not).

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView as StView};

use crate::{DType, Error, Result, Tensor};

fn to_st(d: DType) -> StDtype {
    match d {
        DType::F64 => StDtype::F64,
        DType::F32 => StDtype::F32,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I64 => StDtype::I64,
        DType::I32 => StDtype::I32,
        DType::I16 => StDtype::I16,
        DType::I8 => StDtype::I8,
        DType::U64 => StDtype::U64,
        DType::U32 => StDtype::U32,
        DType::U16 => StDtype::U16,
        DType::U8 => StDtype::U8,
        DType::Bool => StDtype::BOOL,
    }
}

fn from_st(d: StDtype) -> Result<DType> {
    DType::ALL
        .into_iter()
        .find(|x| to_st(*x) == d)
        .ok_or_else(|| Error::UnsupportedDType(format!("{d:?}")))
}

/// Writes named tensors (sorted by name) with string metadata, atomically: a temporary file
/// renamed into place, so a failed write never leaves half a file.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: BTreeMap<String, String>,
) -> Result<()> {
    let views: Vec<(String, StView<'_>)> = tensors
        .iter()
        .map(|(name, t)| {
            let view = StView::new(to_st(t.dtype), t.shape.clone(), &t.bytes).map_err(|e| {
                Error::Safetensors {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                }
            })?;
            Ok((name.clone(), view))
        })
        .collect::<Result<_>>()?;
    let metadata = if metadata.is_empty() {
        None
    } else {
        Some(metadata.into_iter().collect())
    };
    let bytes = safetensors::serialize(views, metadata).map_err(|e| Error::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let tmp = path.with_extension("safetensors.partial");
    std::fs::write(&tmp, bytes).map_err(|source| Error::Io {
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads every tensor of a safetensors file, in the file's name order.
pub fn read_safetensors(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut names: Vec<&str> = st.names();
    names.sort_unstable();
    names
        .into_iter()
        .map(|name| {
            let view = st.tensor(name).map_err(|e| Error::Safetensors {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
            let tensor = Tensor::new(
                name,
                from_st(view.dtype())?,
                view.shape().to_vec(),
                view.data().to_vec(),
            )?;
            Ok((name.to_string(), tensor))
        })
        .collect()
}
