//! Tensors on disk travel as safetensors (it has bf16; npz does not).

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype as StDtype, SafeTensors};

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

/// Writes named tensors with string metadata as safetensors, deterministically: tensors sorted
/// by name, metadata keys sorted, so the same tensors give the same bytes in every process (the
/// safetensors crate's writer takes metadata as a `HashMap`, whose order changes per process).
/// Written through a temporary file renamed into place, so a failure never leaves half a file.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: BTreeMap<String, String>,
) -> Result<()> {
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let meta: serde_json::Map<String, serde_json::Value> = metadata
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect();
        header.insert("__metadata__".to_string(), serde_json::Value::Object(meta));
    }
    let mut offset = 0usize;
    for (name, t) in &sorted {
        let dtype = serde_json::to_value(to_st(t.dtype)).map_err(|e| Error::Safetensors {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": t.shape, "data_offsets": [offset, offset + t.bytes.len()]}),
        );
        offset += t.bytes.len();
    }
    // serde_json's Map is ordered by key (no preserve_order feature): deterministic text.
    let mut text = serde_json::to_string(&header)
        .expect("a JSON map always serialises")
        .into_bytes();
    text.resize(text.len().div_ceil(8) * 8, b' ');
    let mut bytes = Vec::with_capacity(8 + text.len() + offset);
    bytes.extend((text.len() as u64).to_le_bytes());
    bytes.extend(text);
    for (_, t) in &sorted {
        bytes.extend_from_slice(&t.bytes);
    }
    write_atomic(path, &bytes).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `contents` to `path` whole or not at all: into a hidden temporary file beside it
/// (`.name.XXXXXX.partial`, a name of its own per write), flushed to the disk, then renamed
/// over `path`. A failure removes the temporary file; a process killed mid-write (SIGKILL, a
/// power cut) leaves at most that hidden file, never a truncated `path`. The folder is made
/// when missing.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let folder = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => {
            if parent.exists() && !parent.is_dir() {
                return Err(std::io::Error::other(format!(
                    "`{}` is a file, not a folder",
                    parent.display()
                )));
            }
            std::fs::create_dir_all(parent)?;
            parent
        }
        None => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut file = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".partial")
        .tempfile_in(folder)?;
    file.write_all(contents)?;
    // a report is for others to read too: as a file made under the usual umask (a temporary
    // file is made readable by its owner only)
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Reads every tensor of a safetensors file, in the file's name order.
pub fn read_safetensors(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_safetensors(&bytes, path)
}

/// Every tensor of safetensors `bytes`, in name order (`path` names them in errors).
pub fn parse_safetensors(bytes: &[u8], path: &Path) -> Result<Vec<(String, Tensor)>> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| Error::Safetensors {
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

/// The string metadata of a safetensors file (its header's `__metadata__`), read without its
/// tensors.
pub fn read_safetensors_metadata(path: &Path) -> Result<BTreeMap<String, String>> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (_, metadata) = SafeTensors::read_metadata(&bytes).map_err(|e| Error::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(metadata
        .metadata()
        .clone()
        .map(|m| m.into_iter().collect())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_read_back_and_are_byte_stable() {
        let dir = tempfile::tempdir().unwrap();
        let t = |v: &[f32]| {
            Tensor::new(
                "t",
                DType::F32,
                vec![v.len()],
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        };
        let tensors = vec![
            ("b".to_string(), t(&[1.0, 2.0]).unwrap()),
            ("a".to_string(), t(&[3.0]).unwrap()),
        ];
        let meta = BTreeMap::from([
            ("seed".to_string(), "0".to_string()),
            ("producer".to_string(), "x".to_string()),
        ]);
        let (p1, p2) = (
            dir.path().join("1.safetensors"),
            dir.path().join("2.safetensors"),
        );
        write_safetensors(&p1, &tensors, meta.clone()).unwrap();
        write_safetensors(&p2, &tensors, meta).unwrap();
        let bytes = std::fs::read(&p1).unwrap();
        assert_eq!(bytes, std::fs::read(&p2).unwrap());
        let header = String::from_utf8_lossy(&bytes[8..120]);
        assert!(
            header.starts_with(r#"{"__metadata__":{"producer":"x","seed":"0"},"a":"#),
            "{header}"
        );
        let back = read_safetensors(&p1).unwrap();
        assert_eq!(
            back.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(back[1].1, tensors[0].1);
    }
}
