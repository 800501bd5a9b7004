//! The Python exception hierarchy, created in one place.
//!
//! `LayerdiffError` is the base. `UsageError`, `ModelError` and `InputError` mean the user gave
//! something layerdiff cannot use (the CLI exits 2 with the message, no traceback);
//! `MappingError` means no layer could be paired, so there is no verdict (exit 2 too);
//! `RuntimeError_` (exported as `RuntimeFailure`) means a runtime could not be loaded or failed.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    layerdiff,
    LayerdiffError,
    PyException,
    "Base of every layerdiff error."
);
create_exception!(layerdiff, UsageError, LayerdiffError, "Bad arguments.");
create_exception!(
    layerdiff,
    ModelError,
    LayerdiffError,
    "A model file that cannot be read or used."
);
create_exception!(
    layerdiff,
    InputError,
    LayerdiffError,
    "Inputs that do not fit the model."
);
create_exception!(
    layerdiff,
    RuntimeFailure,
    LayerdiffError,
    "A runtime that cannot be loaded or fails."
);
create_exception!(
    layerdiff,
    MappingError,
    LayerdiffError,
    "A comparison that could pair no layer, so it has no verdict."
);
create_exception!(
    layerdiff,
    OutputError,
    LayerdiffError,
    "A report that cannot be written."
);

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("LayerdiffError", py.get_type::<LayerdiffError>())?;
    m.add("UsageError", py.get_type::<UsageError>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("RuntimeFailure", py.get_type::<RuntimeFailure>())?;
    m.add("MappingError", py.get_type::<MappingError>())?;
    m.add("OutputError", py.get_type::<OutputError>())?;
    Ok(())
}

/// Maps a flow error onto the hierarchy, keeping the whole cause chain in the message.
pub(crate) fn to_py_err(err: impl Into<layerdiff_flow::Error>) -> PyErr {
    use layerdiff_flow::Error as E;
    let err = err.into();
    let message = layerdiff_flow::error_chain(&err);
    match err {
        E::Onnx(_) => ModelError::new_err(message),
        E::Usage(_) => UsageError::new_err(message),
        E::Inputs(_) | E::Layers(_) | E::Core(_) => InputError::new_err(message),
        E::Runtime(layerdiff_runtime::Error::Inputs(_)) => InputError::new_err(message),
        E::Runtime(
            layerdiff_runtime::Error::Session(_) | layerdiff_runtime::Error::LacksNode { .. },
        ) => ModelError::new_err(message),
        E::Runtime(layerdiff_runtime::Error::Threads(_)) => UsageError::new_err(message),
        E::NothingCompared(_) => MappingError::new_err(message),
        E::Runtime(_) | E::Memory(_) => RuntimeFailure::new_err(message),
        E::Expected(_) => InputError::new_err(message),
        E::Write { .. } => OutputError::new_err(message),
        // the command's handler stopped the run (see layerdiff_flow::interrupt)
        E::Interrupted(_) => pyo3::exceptions::PyKeyboardInterrupt::new_err(message),
    }
}
