//! Finding `libonnxruntime.so`: the one inside the installed `onnxruntime` Python wheel, so the
//! runtime layerdiff measures is the runtime users deploy with.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Environment variable that names the ONNX Runtime library file explicitly.
pub const LIBRARY_ENV: &str = "LAYERDIFF_ORT_LIB";

/// Finds the ONNX Runtime shared library: `$LAYERDIFF_ORT_LIB`, then `$ORT_DYLIB_PATH`, then the
/// `onnxruntime` package of the active virtualenv, of a `.venv` in the current folder, of the
/// environment this executable lives in, and of `python3` on PATH.
pub fn find_ort_library() -> Result<PathBuf> {
    let mut searched = Vec::new();
    for var in [LIBRARY_ENV, "ORT_DYLIB_PATH"] {
        if let Some(path) = std::env::var_os(var) {
            let path = PathBuf::from(path);
            if path.is_file() {
                return Ok(path);
            }
            return Err(Error::LibraryNotFound {
                searched: format!("${var} = {} (no such file)", path.display()),
            });
        }
    }
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(venv.into());
    }
    if let Ok(cwd) = std::env::current_dir() {
        prefixes.push(cwd.join(".venv"));
    }
    if let Some(env) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(Path::to_path_buf))
    {
        prefixes.push(env);
    }
    for prefix in &prefixes {
        let lib = prefix.join("lib");
        searched.push(lib.display().to_string());
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        for entry in entries.flatten() {
            let capi = entry.path().join("site-packages/onnxruntime/capi");
            if let Some(found) = library_in(&capi) {
                return Ok(found);
            }
        }
    }
    if let Some(capi) = python_capi_dir() {
        searched.push(capi.display().to_string());
        if let Some(found) = library_in(&capi) {
            return Ok(found);
        }
    } else {
        searched.push("python3 (no onnxruntime package)".to_string());
    }
    Err(Error::LibraryNotFound {
        searched: searched.join(", "),
    })
}

/// The newest `libonnxruntime.so.X.Y.Z` (or `.dylib`/`.dll`) in a folder.
fn library_in(dir: &Path) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("libonnxruntime.so")
                || name == "libonnxruntime.dylib"
                || name == "onnxruntime.dll"
        })
        .collect();
    candidates.sort();
    candidates.pop()
}

fn python_capi_dir() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import importlib.util, os; s = importlib.util.find_spec('onnxruntime'); \
             print(os.path.join(os.path.dirname(s.origin), 'capi') if s else '')",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| PathBuf::from(text))
}
