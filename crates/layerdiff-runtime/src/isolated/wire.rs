//! What a side and its worker process say to each other over a pipe: a frame is a JSON header
//! and the byte blobs it announces (a model, tensors), each preceded by its length.

use std::io::{self, Read, Write};

use layerdiff_core::{DType, Tensor};
use serde_json::{Value, json};

use crate::Error;

/// Writes the rest of a frame whose header announced these tensors: each one's bytes, each
/// dropped once written, so the writer never holds them and the reader's copy at once.
pub(super) fn send_tensors(to: &mut impl Write, tensors: Vec<Tensor>) -> io::Result<()> {
    for tensor in tensors {
        to.write_all(&(tensor.bytes.len() as u64).to_le_bytes())?;
        to.write_all(&tensor.bytes)?;
    }
    to.flush()
}

/// Writes one frame: `header`, then each blob.
pub(super) fn send(to: &mut impl Write, header: &Value, blobs: &[&[u8]]) -> io::Result<()> {
    let header = serde_json::to_vec(header).expect("a JSON value serialises");
    to.write_all(&(header.len() as u64).to_le_bytes())?;
    to.write_all(&header)?;
    for blob in blobs {
        to.write_all(&(blob.len() as u64).to_le_bytes())?;
        to.write_all(blob)?;
    }
    to.flush()
}

/// Reads the header of one frame; `None` at the end of the stream (the other side is gone).
pub(super) fn header(from: &mut (impl Read + ?Sized)) -> io::Result<Option<Value>> {
    let mut length = [0u8; 8];
    match from.read_exact(&mut length) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let bytes = blob_of(from, u64::from_le_bytes(length))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Reads the next blob of a frame.
pub(super) fn blob(from: &mut (impl Read + ?Sized)) -> io::Result<Vec<u8>> {
    let mut length = [0u8; 8];
    from.read_exact(&mut length)?;
    blob_of(from, u64::from_le_bytes(length))
}

fn blob_of(from: &mut (impl Read + ?Sized), length: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    // Reserved at once, so a large value is not copied as the vector grows; a length no
    // allocation can hold (garbage on a broken pipe) is read as it comes and fails at its end.
    let _ = usize::try_from(length).map(|n| bytes.try_reserve_exact(n));
    from.take(length).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != length {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(bytes)
}

/// The headers of named tensors (their bytes go as blobs, in this order).
pub(super) fn tensors(values: &[(String, Tensor)]) -> Value {
    values
        .iter()
        .map(|(name, t)| json!({"name": name, "dtype": t.dtype.name(), "shape": t.shape}))
        .collect()
}

/// Named tensors read back: their headers, then one blob each.
pub(super) fn read_tensors(
    headers: &Value,
    from: &mut (impl Read + ?Sized),
) -> io::Result<Vec<(String, Tensor)>> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let list = headers
        .as_array()
        .ok_or_else(|| invalid("tensors: not a list".into()))?;
    let mut values = Vec::with_capacity(list.len());
    for h in list {
        let name = h["name"].as_str().unwrap_or_default().to_string();
        let dtype = DType::from_name(h["dtype"].as_str().unwrap_or_default())
            .map_err(|e| invalid(e.to_string()))?;
        let shape: Vec<usize> = serde_json::from_value(h["shape"].clone())
            .map_err(|e| invalid(format!("tensor `{name}`: {e}")))?;
        let bytes = blob(from)?;
        let tensor = Tensor::new(&name, dtype, shape, bytes).map_err(|e| invalid(e.to_string()))?;
        values.push((name, tensor));
    }
    Ok(values)
}

/// A runtime's error as it crosses the pipe: its kind and its words.
pub(super) fn error(e: &Error) -> Value {
    let (kind, message) = match e {
        Error::Session(m) => ("session", m.clone()),
        Error::SaveOptimized(m) => ("save_optimized", m.clone()),
        Error::Run(m) => ("run", m.clone()),
        Error::Inputs(m) => ("inputs", m.clone()),
        Error::Failed(m) => ("failed", m.clone()),
        Error::NoKernel(m) => ("no_kernel", m.clone()),
        Error::CustomOps(m) => ("custom_ops", m.clone()),
        Error::LacksNode { node, why, message } => {
            return json!({"error": {"kind": "lacks_node", "node": node, "why": why,
                                    "message": message}});
        }
        // the provider by its spelling, so that it reads back as the same error: a provider
        // this machine cannot use is `unavailable` in a providers table, not an error
        Error::ProviderUnavailable { provider, reason } => {
            return json!({"error": {"kind": "provider_unavailable", "provider": provider,
                                    "message": reason}});
        }
        other => ("other", other.to_string()),
    };
    json!({"error": {"kind": kind, "message": message}})
}

/// The error a worker reported, as the runtime in this process would have raised it.
pub(super) fn to_error(header: &Value) -> Error {
    let field = |name: &str| {
        header["error"][name]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let message = field("message");
    match header["error"]["kind"].as_str().unwrap_or_default() {
        "session" => crate::ort_runtime::refused(message),
        "save_optimized" => Error::SaveOptimized(message),
        "run" => Error::Run(message),
        "inputs" => Error::Inputs(message),
        "failed" => Error::Failed(message),
        "lacks_node" => Error::LacksNode {
            node: field("node"),
            why: field("why"),
            message,
        },
        "no_kernel" => Error::NoKernel(message),
        "custom_ops" => Error::CustomOps(message),
        "provider_unavailable" => {
            let spelling = header["error"]["provider"].as_str().unwrap_or_default();
            match crate::Provider::ALL
                .into_iter()
                .find(|p| p.spelling() == spelling)
            {
                Some(provider) => Error::ProviderUnavailable {
                    provider: provider.spelling(),
                    reason: message,
                },
                None => Error::Worker(message),
            }
        }
        _ => Error::Worker(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_comes_back_as_sent() {
        let values = vec![
            ("x".to_string(), Tensor::from_f64(DType::F16, &[1.0, -2.5])),
            (
                "n".to_string(),
                Tensor::new("n", DType::I64, vec![0, 3], Vec::new()).unwrap(),
            ),
        ];
        let mut pipe = Vec::new();
        send(&mut pipe, &json!({"values": tensors(&values)}), &[]).unwrap();
        send_tensors(&mut pipe, values.iter().map(|(_, t)| t.clone()).collect()).unwrap();
        let mut from = pipe.as_slice();
        let h = header(&mut from).unwrap().unwrap();
        assert_eq!(read_tensors(&h["values"], &mut from).unwrap(), values);
        assert!(header(&mut from).unwrap().is_none(), "the stream ends");
    }

    #[test]
    fn a_cut_frame_is_an_error_not_a_hang_or_an_allocation() {
        let mut pipe = Vec::new();
        send(&mut pipe, &json!({"a": 1}), &[&[7u8; 100]]).unwrap();
        let mut from = &pipe[..pipe.len() - 10];
        header(&mut from).unwrap().unwrap();
        assert!(blob(&mut from).is_err());
        let lying = [u64::MAX.to_le_bytes().as_slice(), b"{}"].concat();
        assert!(header(&mut lying.as_slice()).is_err());
    }

    #[test]
    fn errors_keep_their_kind() {
        for e in [
            Error::Session("s".into()),
            Error::Run("r".into()),
            Error::Failed("OpenVINO cannot compile the model: o".into()),
            Error::LacksNode {
                node: "det".into(),
                why: "Unimplemented(Det)".into(),
                message: "tract cannot load the model: Translating node #2 \"det\"".into(),
            },
            Error::ProviderUnavailable {
                provider: "cuda",
                reason: "libcudart.so.13 is missing".into(),
            },
        ] {
            let back = to_error(&error(&e));
            assert_eq!(format!("{back:?}"), format!("{e:?}"));
        }
    }
}
