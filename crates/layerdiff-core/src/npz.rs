//! Reading numpy `.npz` archives (and the `.npy` arrays inside), so inputs saved with
//! `numpy.savez` / `savez_compressed` can be given to both sides as they are.

use std::io::Read;
use std::path::Path;

use crate::{DType, Error, Result, Tensor};

/// The most bytes reserved ahead for one array, whatever its entry claims.
const CLAIMED: u64 = 64 << 20;

/// Every array of an `.npz` file, named by its key, in archive order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_npz(file, path)
}

/// Every array of an `.npz` archive read from `from` (`path` names it in errors).
pub fn parse_npz(
    from: impl std::io::Read + std::io::Seek,
    path: &Path,
) -> Result<Vec<(String, Tensor)>> {
    let bad = |message: String| Error::Npz {
        path: path.to_path_buf(),
        message,
    };
    let mut archive =
        zip::ZipArchive::new(from).map_err(|e| bad(format!("not a zip archive ({e})")))?;
    let mut tensors = Vec::with_capacity(archive.len());
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| bad(e.to_string()))?;
        let name = entry
            .name()
            .map_err(|e| bad(e.to_string()))?
            .trim_end_matches(".npy")
            .to_string();
        // the size the archive claims is reserved only up to a bound: a hostile entry claims
        // gigabytes it does not hold (memory grows with what is actually read)
        let mut bytes = Vec::with_capacity(entry.size().min(CLAIMED) as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| bad(format!("`{name}`: {e}")))?;
        let tensor = parse_npy(&name, &bytes).map_err(|m| bad(format!("`{name}`: {m}")))?;
        tensors.push((name, tensor));
    }
    Ok(tensors)
}

/// Parses one `.npy` array (format versions 1 to 3, little-endian, C order).
fn parse_npy(name: &str, bytes: &[u8]) -> std::result::Result<Tensor, String> {
    let rest = bytes
        .strip_prefix(b"\x93NUMPY")
        .ok_or("not a .npy array (no magic)")?;
    let (&major, rest) = rest.split_first().ok_or("truncated header")?;
    let rest = &rest[1..];
    let (header_len, rest) = match major {
        1 => (u16::from_le_bytes([rest[0], rest[1]]) as usize, &rest[2..]),
        2 | 3 => (
            u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize,
            &rest[4..],
        ),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = std::str::from_utf8(rest.get(..header_len).ok_or("truncated header")?)
        .map_err(|e| e.to_string())?;
    let data = &rest[header_len..];
    let field = |key: &str| -> std::result::Result<&str, String> {
        let start = header
            .find(&format!("'{key}':"))
            .ok_or(format!("header has no `{key}`"))?
            + key.len()
            + 3;
        Ok(header[start..].trim_start())
    };
    let descr = field("descr")?;
    let descr = descr
        .trim_start_matches('\'')
        .split('\'')
        .next()
        .unwrap_or("");
    let dtype = match descr {
        "<f8" => DType::F64,
        "<f4" => DType::F32,
        "<f2" => DType::F16,
        "<i8" => DType::I64,
        "<i4" => DType::I32,
        "<i2" => DType::I16,
        "|i1" => DType::I8,
        "<u8" => DType::U64,
        "<u4" => DType::U32,
        "<u2" => DType::U16,
        "|u1" => DType::U8,
        "|b1" => DType::Bool,
        other if other.starts_with('>') => {
            return Err(format!("big-endian dtype `{other}`; save it little-endian"));
        }
        other => return Err(format!("dtype `{other}` is not supported")),
    };
    if field("fortran_order")?.starts_with("True") {
        return Err("Fortran-ordered array; save it with numpy.ascontiguousarray".to_string());
    }
    let shape_text = field("shape")?;
    let shape_text = shape_text
        .trim_start_matches('(')
        .split(')')
        .next()
        .unwrap_or("");
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("bad shape `({shape_text})`"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let len = shape.iter().product::<usize>() * dtype.size();
    let data = data
        .get(..len)
        .ok_or(format!("{} data bytes, {len} expected", data.len()))?;
    Tensor::new(name, dtype, shape, data.to_vec()).map_err(|e| e.to_string())
}
