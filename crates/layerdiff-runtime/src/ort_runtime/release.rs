//! ONNX Runtime on another release's library (`ort:lib=PATH`): how its worker starts. A release
//! whose C API is at least the one this build asks for is loaded by this program's own worker;
//! an older one answers that API with nothing, so its worker is the release's own Python
//! package running `release_worker.py`, in the virtualenv that holds the library (`python -m
//! layerdiff.releases onnxruntime==VERSION` makes one).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::Error;

/// The worker that runs a release through its Python package: the same requests and answers
/// as `layerdiff __worker` (see `wire.rs`).
const RELEASE_WORKER: &str = include_str!("release_worker.py");

/// How the worker of a side on `library` starts, when that library is a release older than
/// this build's C API: the release's Python and the worker script, with the side's session
/// `settings` (see `OrtSpec::worker_settings`). `None` for a side this program's own worker
/// runs. An error names what is missing.
pub(super) fn release_command(
    library: &Path,
    settings: Vec<OsString>,
    as_saved: bool,
) -> crate::Result<Option<Vec<OsString>>> {
    let refused = |message: String| Error::LibraryLoad {
        runtime: "ONNX Runtime",
        path: library.to_path_buf(),
        message,
    };
    if !library.is_file() {
        return Err(refused("no such file".to_string()));
    }
    let Some(release) = release_of(library) else {
        return Ok(None); // a library named without its release: its own worker will tell
    };
    if release >= (1, ort::MINOR_VERSION) {
        return Ok(None);
    }
    let Some(python) = python_of(library) else {
        return Err(refused(older_release(
            release,
            &format!("{}.{}", release.0, release.1),
        )));
    };
    let mut command: Vec<OsString> = vec![python.into(), "-c".into(), RELEASE_WORKER.into()];
    command.extend(settings);
    if as_saved {
        command.push("--as-saved".into());
    }
    if let Some(n) = crate::thread_cap()? {
        command.extend(["--threads".into(), n.to_string().into()]);
    }
    Ok(Some(command))
}

/// Why a release older than this build's C API (`release`, its major and minor; `named` as
/// the user will recognise it) does not run as given, and what runs it.
pub(crate) fn older_release((major, minor): (u32, u32), named: &str) -> String {
    format!(
        "ONNX Runtime {named} answers C API {minor} and older, and this layerdiff asks for {}: \
         such a release runs in its own Python package, from a virtualenv that holds it \
         (`python -m layerdiff.releases onnxruntime=={major}.{minor}.*` makes one and prints \
         the `ort:lib=` to give)",
        ort::MINOR_VERSION
    )
}

/// `libonnxruntime.so.1.30.0` → (1, 30).
pub(super) fn release_of(library: &Path) -> Option<(u32, u32)> {
    major_minor(crate::ort_runtime::named_release(library)?)
}

/// `1.30.0` → (1, 30).
pub(crate) fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.').map(str::parse::<u32>);
    Some((parts.next()?.ok()?, parts.next()?.ok()?))
}

/// The Python of the virtualenv whose `onnxruntime` package holds `library`
/// (`PREFIX/lib/pythonX.Y/site-packages/onnxruntime/capi/libonnxruntime.so.…`).
fn python_of(library: &Path) -> Option<PathBuf> {
    let capi = library.parent()?;
    let package = capi.parent()?;
    let site = package.parent()?;
    let named = |p: &Path, name: &str| p.file_name().and_then(|n| n.to_str()) == Some(name);
    if !(named(capi, "capi") && named(package, "onnxruntime") && named(site, "site-packages")) {
        return None;
    }
    let prefix = site.parent()?.parent()?.parent()?;
    ["python", "python3"]
        .iter()
        .map(|name| prefix.join("bin").join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Configured, OrtSpec};

    #[test]
    fn a_release_is_read_from_its_file_name() {
        let at = |s: &str| release_of(Path::new(s));
        assert_eq!(at("/x/libonnxruntime.so.1.30.0"), Some((1, 30)));
        assert_eq!(at("libonnxruntime.so.1.9.1"), Some((1, 9)));
        assert_eq!(at("/x/libonnxruntime.so"), None);
        assert_eq!(at("/x/onnxruntime.dll"), None);
    }

    #[test]
    fn an_older_release_outside_a_virtualenv_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join("libonnxruntime.so.1.20.1");
        std::fs::write(&library, b"").unwrap();
        let spec = OrtSpec::parse(&format!("ort:lib={}", library.display())).unwrap();
        let err = spec.release_worker(false).unwrap_err().to_string();
        assert!(
            err.contains("ONNX Runtime 1.20 answers C API 20 and older"),
            "{err}"
        );
        assert!(
            err.contains("python -m layerdiff.releases onnxruntime==1.20.*"),
            "{err}"
        );
        let missing = OrtSpec::parse("ort:lib=/nowhere/libonnxruntime.so.1.20.1").unwrap();
        let err = missing.release_worker(false).unwrap_err().to_string();
        assert!(
            err.ends_with("/nowhere/libonnxruntime.so.1.20.1`: no such file"),
            "{err}"
        );
    }

    #[test]
    fn an_older_release_in_a_virtualenv_runs_on_its_python() {
        let dir = tempfile::tempdir().unwrap();
        let capi = dir
            .path()
            .join("lib/python3.11/site-packages/onnxruntime/capi");
        std::fs::create_dir_all(&capi).unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::write(dir.path().join("bin/python"), b"").unwrap();
        let library = capi.join("libonnxruntime.so.1.30.0");
        std::fs::write(&library, b"").unwrap();
        let text = format!(
            "ort:opt=all:without=NchwcTransformer:lib={}",
            library.display()
        );
        let spec = OrtSpec::parse(&text).unwrap();
        let command = spec.release_worker(true).unwrap().unwrap();
        let words: Vec<String> = command
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            words[0],
            dir.path().join("bin/python").display().to_string()
        );
        assert_eq!(words[1], "-c");
        let rest = &words[3..];
        assert_eq!(
            rest,
            [
                "--provider",
                "CPUExecutionProvider",
                "--spelling",
                "cpu",
                "--opt",
                "all",
                "--without",
                "NchwcTransformer",
                "--as-saved"
            ]
        );
        // a release at this build's C API or newer runs on this program's worker
        let newer = capi.join(format!("libonnxruntime.so.1.{}.0", ort::MINOR_VERSION));
        std::fs::write(&newer, b"").unwrap();
        let spec = OrtSpec::parse(&format!("ort:lib={}", newer.display())).unwrap();
        assert!(spec.release_worker(false).unwrap().is_none());
    }
}
