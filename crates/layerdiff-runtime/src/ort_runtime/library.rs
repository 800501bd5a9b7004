//! ONNX Runtime's shared library: where it is (its wheel, or the library a door of the process
//! chose), loaded once per process.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;

use crate::Result;
use crate::library::{Wheel, find_library};

/// Environment variable that names the ONNX Runtime library file explicitly.
pub const LIBRARY_ENV: &str = "LAYERDIFF_ORT_LIB";

/// ONNX Runtime's library in the `onnxruntime` wheel.
pub(crate) const ORT_WHEEL: Wheel = Wheel {
    runtime: "ONNX Runtime",
    env: &[LIBRARY_ENV, "ORT_DYLIB_PATH"],
    folder: "onnxruntime/capi",
    names: &[
        "libonnxruntime.so",
        "libonnxruntime.dylib",
        "onnxruntime.dll",
    ],
    install: "pip install onnxruntime",
    packages: &["onnxruntime", "onnxruntime-gpu"],
    oldest: None,
    // releases before 1.19 were built against numpy 1
    needs_before: &[("1.19", "numpy<2")],
};

/// The ONNX Runtime library a door of this process chose (see [`use_ort_library`]).
static CHOSEN_ORT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Names the ONNX Runtime library this process loads, once, at its door: the Python package
/// names the wheel of its interpreter, a worker the library it was started for. `None` leaves
/// it to [`find_ort_library`]'s search. ONNX Runtime is loaded once per process, so the first
/// choice stands.
pub fn use_ort_library(library: Option<&Path>) {
    if let Some(library) = library {
        let _ = CHOSEN_ORT.set(library.to_path_buf());
    }
}

/// The library [`use_ort_library`] chose, if one did.
pub fn chosen_ort_library() -> Option<&'static Path> {
    CHOSEN_ORT.get().map(PathBuf::as_path)
}

/// Finds the ONNX Runtime shared library: the one the process's door chose, else as
/// [`find_library`] searches.
pub fn find_ort_library() -> Result<PathBuf> {
    match chosen_ort_library() {
        Some(library) => Ok(library.to_path_buf()),
        None => find_library(&ORT_WHEEL),
    }
}

/// The shared library, loaded once per process, where it was found, and its release.
pub(super) struct LoadedOrt {
    pub(super) env: Environment,
    pub(super) path: PathBuf,
    pub(super) version: String,
}

pub(super) static ORT: OnceLock<Mutex<Option<std::result::Result<LoadedOrt, String>>>> =
    OnceLock::new();

/// Loads the shared library at `path` and makes its environment.
pub(super) fn load(path: &Path) -> std::result::Result<LoadedOrt, String> {
    // one path for the binding and for the lookup of the release below
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let env = ort::init_from(&path)
        .map_err(|e| older_release(&e.to_string()).unwrap_or_else(|| e.to_string()))?
        .with_name("layerdiff")
        .build()
        .map_err(|e| e.to_string())?;
    let version = release_of_loaded(&path).unwrap_or_else(|| version_from_path(&path));
    Ok(LoadedOrt { env, path, version })
}

/// The binding's refusal of a release older than its C API (`… but got '1.30.0'`) in the
/// words a release named in its file gets, with what runs it; `None` for any other message.
fn older_release(message: &str) -> Option<String> {
    let (_, got) = message.split_once("but got '")?;
    let version = got.strip_suffix('\'')?;
    let release = super::release::major_minor(version)?;
    Some(super::release::older_release(release, version))
}

/// The release of the ONNX Runtime library loaded from `path`, as the library itself says
/// (`OrtGetApiBase()->GetVersionString()`): a vendor's build is often named only
/// `libonnxruntime.so`. `None` where the library is not loaded or does not say.
fn release_of_loaded(path: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::ffi::{CStr, CString, c_char};
        use std::os::unix::ffi::OsStrExt;
        /// The head of the C API's `OrtApiBase`: two function pointers.
        #[repr(C)]
        struct ApiBase {
            get_api: unsafe extern "C" fn(u32) -> *const std::ffi::c_void,
            get_version_string: unsafe extern "C" fn() -> *const c_char,
        }
        let path = CString::new(path.as_os_str().as_bytes()).ok()?;
        // SAFETY: `RTLD_NOLOAD` only finds the library the binding loaded (one more reference,
        // given back below); `OrtGetApiBase` is the C API's entry and returns a static table
        // whose version string is a static NUL-terminated string.
        unsafe {
            let handle = libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if handle.is_null() {
                return None;
            }
            let entry = libc::dlsym(handle, c"OrtGetApiBase".as_ptr());
            let version = (!entry.is_null()).then(|| {
                let entry: unsafe extern "C" fn() -> *const ApiBase = std::mem::transmute(entry);
                let base = entry();
                let text = (!base.is_null()).then(|| ((*base).get_version_string)())?;
                (!text.is_null()).then(|| CStr::from_ptr(text).to_string_lossy().into_owned())
            });
            libc::dlclose(handle);
            version.flatten().filter(|v| !v.is_empty())
        }
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// `libonnxruntime.so.1.31.1` → `1.31.1`: the release a library's file name says, for one this
/// process does not load (its worker's says what it is, see `crate::isolated`); `None` for a
/// name without one (a vendor's `libonnxruntime.so`). The one reading of a release from a name.
pub(crate) fn named_release(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("libonnxruntime.so.")
}

/// [`named_release`], or "unknown version".
pub(crate) fn version_from_path(path: &Path) -> String {
    named_release(path).unwrap_or("unknown version").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binding_s_refusal_of_an_older_release_says_what_runs_it() {
        let message = "ort 2.0.0-rc.15 is not compatible with the ONNX Runtime binary found at \
                       `/v/libonnxruntime.so`; expected version >= '1.31.x', but got '1.30.0'";
        let said = older_release(message).unwrap();
        assert!(
            said.starts_with("ONNX Runtime 1.30.0 answers C API 30 and older"),
            "{said}"
        );
        assert!(
            said.contains("`python -m layerdiff.releases onnxruntime==1.30.*`"),
            "{said}"
        );
        assert_eq!(
            older_release("failed to load from `/x`: no such file"),
            None
        );
    }
}
