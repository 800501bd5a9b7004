//! Loading OpenVINO's C library: once per process, and only a library that exports every
//! function a run calls.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::library::{Wheel, find_library};
use crate::{Error, Result};

/// Environment variable that names the OpenVINO C library file explicitly.
pub const OPENVINO_LIBRARY_ENV: &str = "LAYERDIFF_OPENVINO_LIB";

/// OpenVINO's C library in the `openvino` wheel.
pub(crate) const OPENVINO_WHEEL: Wheel = Wheel {
    runtime: "OpenVINO",
    env: &[OPENVINO_LIBRARY_ENV],
    folder: "openvino/libs",
    names: &["libopenvino_c.so", "libopenvino_c.dylib", "openvino_c.dll"],
    install: "pip install openvino",
    packages: &["openvino"],
    oldest: Some(("2025.1", "the C API's element types changed then")),
    needs_before: &[],
};

/// Loads the OpenVINO C library once per process (from `library`, else found). A process that
/// loaded one library refuses another: a second release runs in a worker process of its own.
pub(super) fn load(library: Option<&Path>) -> Result<()> {
    static LOADED: OnceLock<(PathBuf, std::result::Result<(), String>)> = OnceLock::new();
    let path = match library {
        Some(path) => path.to_path_buf(),
        None => find_library(&OPENVINO_WHEEL)?,
    };
    let (loaded, result) = LOADED.get_or_init(|| (path.clone(), open(&path)));
    let refused = |message: String| Error::LibraryLoad {
        runtime: "OpenVINO",
        path: path.clone(),
        message,
    };
    result.clone().map_err(refused)?;
    if !same_file(loaded, &path) {
        return Err(refused(format!(
            "this process has loaded OpenVINO from {} already: another release runs in a worker \
             process (`openvino:lib=PATH` is one)",
            loaded.display()
        )));
    }
    Ok(())
}

/// The C API functions a run calls. The binding looks each up only when it is first called,
/// and a library without it would end the process there: one that lacks any is refused.
const CALLED: [&str; 30] = [
    "ov_get_openvino_version",
    "ov_core_create",
    "ov_core_free",
    "ov_core_set_property",
    "ov_core_get_property",
    "ov_core_get_versions_by_device_name",
    "ov_core_versions_free",
    "ov_core_read_model",
    "ov_core_read_model_from_memory_buffer",
    "ov_core_compile_model",
    "ov_model_free",
    "ov_model_inputs_size",
    "ov_model_const_input_by_index",
    "ov_port_get_any_name",
    "ov_compiled_model_create_infer_request",
    "ov_compiled_model_free",
    "ov_infer_request_get_tensor",
    "ov_infer_request_set_tensor",
    "ov_infer_request_infer",
    "ov_infer_request_free",
    "ov_tensor_create",
    "ov_tensor_data",
    "ov_tensor_get_element_type",
    "ov_tensor_get_shape",
    "ov_tensor_get_size",
    "ov_tensor_get_byte_size",
    "ov_tensor_free",
    "ov_shape_create",
    "ov_shape_free",
    "ov_get_last_err_msg",
];

/// Loads the library at `path` for the binding, once it is known to export every function
/// a run calls; a release the binding refuses is named with the first one it runs.
fn open(path: &Path) -> std::result::Result<(), String> {
    if let Some(name) = missing_function(path) {
        return Err(format!(
            "it has no `{name}`: it is not OpenVINO's C library (`libopenvino_c`), or not a \
             release this layerdiff runs (2025.1 and later)"
        ));
    }
    openvino_sys::library::load_from(path).map_err(|message| match message.rsplit_once("): ") {
        Some((_, version)) if message.starts_with("OpenVINO version is too old") => format!(
            "OpenVINO {version} is older than 2025.1, the first release this layerdiff runs \
                 (its C API's element types changed then)"
        ),
        _ => message,
    })
}

/// The first of [`CALLED`] the library at `path` does not export; `None` also where it cannot
/// be opened (the binding then says why). A library that has them all stays loaded.
fn missing_function(path: &Path) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let path = CString::new(path.as_os_str().as_bytes()).ok()?;
        // SAFETY: loading a library and looking names up in it; the handle is closed only
        // where nothing of it is used.
        unsafe {
            let handle = libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if handle.is_null() {
                return None;
            }
            let missing = CALLED.into_iter().find(|name| {
                let name = CString::new(*name).expect("no NUL in a C name");
                libc::dlsym(handle, name.as_ptr()).is_null()
            });
            if missing.is_some() {
                libc::dlclose(handle);
            }
            missing
        }
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}
