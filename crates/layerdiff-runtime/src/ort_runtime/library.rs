//! ONNX Runtime's shared library, loaded once per process, and its messages made readable.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;

/// The shared library, loaded once per process, and where it was found.
pub(super) struct LoadedOrt {
    pub(super) env: Environment,
    pub(super) path: PathBuf,
}

pub(super) static ORT: OnceLock<Mutex<Option<std::result::Result<LoadedOrt, String>>>> =
    OnceLock::new();

/// ONNX Runtime prefixes many messages with a source location and a C++ signature
/// (`/onnxruntime_src/…/model.cc:256 onnxruntime::Model::Model(…) Unsupported model IR version…`);
/// users need only the sentence after them.
pub(super) fn clean_message(message: String) -> String {
    let Some(rest) = message
        .strip_prefix("/onnxruntime_src/")
        .and_then(|m| m.split_once(' '))
        .map(|(_, r)| r)
    else {
        return message;
    };
    let signature_end = rest
        .find('(')
        .filter(|&open| rest[..open].contains("::"))
        .and_then(|open| {
            let mut depth = 0usize;
            rest[open..].char_indices().find_map(|(i, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(open + i + 1)
            })
        });
    match signature_end {
        Some(end) => rest[end..].trim_start().to_string(),
        None => rest.to_string(),
    }
}

/// Loads the shared library at `path` and makes its environment.
pub(super) fn load(path: &Path) -> std::result::Result<LoadedOrt, String> {
    let env = ort::init_from(path)
        .map_err(|e| e.to_string())?
        .with_name("layerdiff")
        .build()
        .map_err(|e| e.to_string())?;
    Ok(LoadedOrt {
        env,
        path: path.to_path_buf(),
    })
}

/// `libonnxruntime.so.1.31.1` → `1.31.1`.
pub(super) fn version_from_path(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.strip_prefix("libonnxruntime.so.")
        .unwrap_or("unknown version")
        .to_string()
}
