//! The op matrix as the Python side hands it over, typed: each case (`OpCase`), each cell
//! (`OpCell`, judged by the core from what its backend computed) and the run (`OpsRun`).
//! Cells are computed in worker processes, so a cell pickles.

use layerdiff_core::{DType, render};
use layerdiff_flow::verbs::ops::{self, OpsBackend};
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::exceptions::{self, to_py_err};
use crate::tensors::FlatTensor;

/// How an ONNX backend narrows float math (OpenVINO's inference precision), as the model flow
/// knows the side: which dtype it computes a cell in.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
pub(crate) struct Narrowing(layerdiff_runtime::ReducedMath);

#[pymethods]
impl Narrowing {
    /// The dtype the backend computes a cell of `dtype` in whose model holds `onnx_ops`, where
    /// narrower than `dtype` (`None`: it computes in `dtype`).
    fn of(&self, onnx_ops: Vec<String>, dtype: &str) -> PyResult<Option<&'static str>> {
        let dtype = DType::from_name(dtype).map_err(to_py_err)?;
        Ok(ops::narrowed(&self.0, &onnx_ops, dtype).map(DType::name))
    }
}

/// How the ONNX backend `runtime` narrows float math here, or None where it computes as asked.
#[pyfunction]
#[pyo3(signature = (runtime))]
pub(crate) fn runtime_narrowing(py: Python<'_>, runtime: &str) -> PyResult<Option<Narrowing>> {
    py.detach(|| ops::narrowing(runtime))
        .map(|r| r.map(Narrowing))
        .map_err(to_py_err)
}

/// One op as the matrix runs it.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
pub(crate) struct OpCase(ops::OpCase);

#[pymethods]
impl OpCase {
    /// `name` (`matmul`), `op`: the PyTorch call, `inputs`: each input in words, `reduction`:
    /// terms reduced into one output element, `stages`: intermediate roundings, `magnitude`:
    /// what the error scales with.
    #[new]
    #[pyo3(signature = (*, name, op, inputs, reduction, stages, magnitude))]
    fn new(
        name: String,
        op: String,
        inputs: Vec<String>,
        reduction: usize,
        stages: u32,
        magnitude: String,
    ) -> Self {
        Self(ops::OpCase {
            name,
            op,
            inputs,
            reduction,
            stages,
            magnitude,
        })
    }
}

/// One op on one backend in one dtype: its verdict (`PASS`, `FAIL`, `UNSUPPORTED`, `ERROR`),
/// its numbers when it ran, why when it did not, and the ONNX ops of its model.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
pub(crate) struct OpCell(ops::OpCell);

/// Which cell, as Python names it: (case, backend, dtype, the ONNX ops of its model, the
/// narrower dtype its backend computes it in or None).
type Id = (String, String, String, Vec<String>, Option<String>);

fn id((case, backend, dtype, onnx_ops, computed_in): Id) -> ops::CellId {
    ops::CellId {
        case,
        backend,
        dtype,
        onnx_ops,
        computed_in,
    }
}

/// A cell's verdict is decided by the core from what the cell found (`layerdiff_flow::verbs::
/// ops::OpCell`'s makers): Python says what happened, never the verdict.
#[pymethods]
impl OpCell {
    /// A cell whose op computed `got`, judged against `truth` (the op in float64 on the same
    /// rounded inputs, in its own dtype and shape) with per-element `magnitude` (or empty),
    /// `reduction` terms and `stages` roundings; `exported`: the cell ran an exported model.
    /// Its shape, its dtype and its values are judged by the core, in that order.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn judged(
        py: Python<'_>,
        cell: Id,
        got: FlatTensor<'_>,
        truth: FlatTensor<'_>,
        magnitude: PyReadonlyArray1<'_, f64>,
        reduction: usize,
        stages: u32,
        exported: bool,
    ) -> PyResult<Self> {
        let (got, truth) = (got.view()?, truth.view()?);
        let magnitude = magnitude.as_slice()?;
        py.detach(|| {
            ops::OpCell::judged(
                id(cell),
                &got,
                &truth,
                magnitude,
                (reduction, stages),
                exported,
            )
        })
        .map(Self)
        .map_err(to_py_err)
    }

    /// A cell whose op gave a value of a dtype layerdiff cannot read (`got`, as PyTorch names
    /// it), against `truth` (the op in float64, in its own dtype); `exported`: the cell ran an
    /// exported model.
    #[staticmethod]
    fn unreadable(cell: Id, got: &str, truth: FlatTensor<'_>, exported: bool) -> PyResult<Self> {
        ops::OpCell::unreadable(id(cell), got, truth.dtype()?, exported)
            .map(Self)
            .map_err(to_py_err)
    }

    /// A cell that broke with `message`; `not_implemented`: the backend raised that it has no
    /// kernel.
    #[staticmethod]
    fn broke(cell: Id, message: &str, not_implemented: bool) -> Self {
        Self(ops::OpCell::broke(id(cell), message, not_implemented))
    }

    /// A cell whose backend cannot run here, and why.
    #[staticmethod]
    fn unavailable(cell: Id, why: &str) -> Self {
        Self(ops::OpCell::unavailable(id(cell), why))
    }

    #[getter]
    fn status(&self) -> &'static str {
        self.0.status.name()
    }

    #[getter]
    fn message(&self) -> Option<&str> {
        self.0.message.as_deref()
    }

    /// The cell from its JSON (how it pickles: cells are computed in worker processes).
    #[classmethod]
    fn from_json(_cls: &Bound<'_, PyType>, text: &str) -> PyResult<Self> {
        let cell = serde_json::from_str(text)
            .map_err(|e| exceptions::InputError::new_err(format!("not an op cell: {e}")))?;
        Ok(Self(cell))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let text = render::to_json_value(&slf.get().0);
        Ok((slf.get_type().getattr("from_json")?, (text,)))
    }

    fn __repr__(&self) -> String {
        let c = &self.0;
        format!(
            "OpCell({} on {} in {}: {})",
            c.case,
            c.backend,
            c.dtype,
            c.status.name()
        )
    }
}

/// What the Python side ran: everything in the op matrix's report but the rule and the
/// machine.
#[pyclass(module = "layerdiff._layerdiff", frozen)]
pub(crate) struct OpsRun(pub(crate) ops::OpsRun);

#[pymethods]
impl OpsRun {
    /// `backends`: (name, what it is in words) in column order; `versions`: (library,
    /// version) of what changes the numbers.
    #[new]
    #[pyo3(signature = (*, opset, exporter, seed, versions, backends, dtypes, cases, cells))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        opset: i64,
        exporter: String,
        seed: u64,
        versions: Vec<(String, String)>,
        backends: Vec<(String, String)>,
        dtypes: Vec<String>,
        cases: Vec<PyRef<'_, OpCase>>,
        cells: Vec<PyRef<'_, OpCell>>,
    ) -> Self {
        Self(ops::OpsRun {
            opset,
            exporter,
            seed,
            versions,
            backends: backends
                .into_iter()
                .map(|(name, detail)| OpsBackend { name, detail })
                .collect(),
            dtypes,
            cases: cases.iter().map(|c| c.0.clone()).collect(),
            cells: cells.iter().map(|c| c.0.clone()).collect(),
        })
    }
}
