//! Finding a runtime's shared library inside its installed Python wheel (`onnxruntime`,
//! `openvino`), so the runtime layerdiff measures is the runtime users deploy with.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A runtime library shipped in a Python wheel.
pub struct Wheel {
    /// The runtime, in words (`ONNX Runtime`).
    pub runtime: &'static str,
    /// The variables that name the file explicitly, first first.
    pub env: &'static [&'static str],
    /// The wheel's package and the folder in it that holds the library (`onnxruntime/capi`).
    pub folder: &'static str,
    /// How the library file's name starts (`libonnxruntime.so`), and its other spellings.
    pub names: &'static [&'static str],
    /// How to install it (`pip install onnxruntime`).
    pub install: &'static str,
    /// The packages on the package index that ship it (`onnxruntime`, `onnxruntime-gpu`): what
    /// `python -m layerdiff.releases PACKAGE==VERSION` fetches, the first when no package is
    /// named.
    pub packages: &'static [&'static str],
    /// The oldest release layerdiff runs, and why no older one (`2025.1`, `its C API's element
    /// types changed then`).
    pub oldest: Option<(&'static str, &'static str)>,
    /// What a release before a version needs installed beside it (`1.19`, `numpy<2`: built
    /// against numpy 1).
    pub needs_before: &'static [(&'static str, &'static str)],
}

/// Finds a wheel's library: the variables that name it, then the wheel in the active
/// virtualenv, in a `.venv` of the current folder, in the environment this executable lives
/// in, and of `python3` on PATH.
pub fn find_library(wheel: &Wheel) -> Result<PathBuf> {
    let not_found = |searched: String| Error::LibraryNotFound {
        runtime: wheel.runtime,
        install: wheel.install,
        env: wheel.env[0],
        searched,
    };
    for var in wheel.env {
        if let Some(path) = std::env::var_os(var) {
            let path = PathBuf::from(path);
            if path.is_file() {
                return Ok(path);
            }
            return Err(not_found(format!(
                "${var} = {} (no such file)",
                path.display()
            )));
        }
    }
    let mut searched = Vec::new();
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
            let folder = entry.path().join("site-packages").join(wheel.folder);
            if let Some(found) = library_in(&folder, wheel.names) {
                return Ok(found);
            }
        }
    }
    let package = wheel.folder.split('/').next().unwrap_or(wheel.folder);
    if let Some(folder) = python_package_dir(package) {
        let folder = folder.join(wheel.folder.split_once('/').map_or("", |(_, sub)| sub));
        searched.push(folder.display().to_string());
        if let Some(found) = library_in(&folder, wheel.names) {
            return Ok(found);
        }
    } else {
        searched.push(format!("python3 (no {package} package)"));
    }
    Err(not_found(searched.join(", ")))
}

/// The newest library file in a folder whose name starts with one of `names`
/// (`libonnxruntime.so.1.31.1`).
fn library_in(dir: &Path, names: &[&str]) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            names.iter().any(|n| name.starts_with(n))
        })
        .collect();
    candidates.sort();
    candidates.pop()
}

/// The folder of an installed Python package, as `python3` on PATH imports it.
fn python_package_dir(package: &str) -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            &format!(
                "import importlib.util, os; s = importlib.util.find_spec('{package}'); \
                 print(os.path.dirname(s.origin) if s and s.origin else '')"
            ),
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| PathBuf::from(text))
}
