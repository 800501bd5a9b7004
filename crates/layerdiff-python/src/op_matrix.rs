//! The op matrix as the Python side hands it over, typed: a cell's numbers (`OpCheck`), each
//! case (`OpCase`), each cell (`OpCell`) and the run (`OpsRun`). Cells are computed in worker
//! processes, so a check and a cell pickle.

use layerdiff_core::{DType, render};
use layerdiff_flow::verbs::ops::{self, OpsBackend};
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::exceptions::{self, to_py_err};
use crate::tensors::FlatTensor;

/// One cell's numbers and verdict (`layerdiff_core::OpCheck`).
#[pyclass(module = "layerdiff._layerdiff", frozen)]
#[derive(Clone)]
pub(crate) struct OpCheck(layerdiff_core::OpCheck);

#[pymethods]
impl OpCheck {
    /// Every element within its bound.
    #[getter]
    fn passed(&self) -> bool {
        self.0.passed
    }

    /// The largest `|got - truth| / bound`: at most 1 passes.
    #[getter]
    fn ratio(&self) -> f64 {
        self.0.ratio
    }

    /// Elements outside their bound, of `elements`.
    #[getter]
    fn outside(&self) -> usize {
        self.0.outside
    }

    #[getter]
    fn elements(&self) -> usize {
        self.0.elements
    }

    /// The check as JSON (the cell's `check` in the report).
    fn to_json(&self) -> String {
        render::to_json_value(&self.0)
    }

    /// The check from `to_json`'s text (how it pickles).
    #[classmethod]
    fn from_json(_cls: &Bound<'_, PyType>, text: &str) -> PyResult<Self> {
        let check = serde_json::from_str(text)
            .map_err(|e| exceptions::InputError::new_err(format!("not an op check: {e}")))?;
        Ok(Self(check))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        Ok((slf.get_type().getattr("from_json")?, (slf.get().to_json(),)))
    }

    fn __repr__(&self) -> String {
        format!(
            "OpCheck(passed={}, ratio={}, outside={} of {})",
            self.0.passed, self.0.ratio, self.0.outside, self.0.elements
        )
    }
}

/// Judges one cell: `got` against the float64 `truth` with per-element `magnitude` (or empty),
/// `reduction` terms and `stages` roundings; `computed_in`: the narrower dtype the backend
/// computed it in, whose rule judges it.
#[pyfunction]
#[pyo3(signature = (got, truth, magnitude, reduction, stages, computed_in=None))]
pub(crate) fn check_op(
    py: Python<'_>,
    got: FlatTensor<'_>,
    truth: PyReadonlyArray1<'_, f64>,
    magnitude: PyReadonlyArray1<'_, f64>,
    reduction: usize,
    stages: u32,
    computed_in: Option<&str>,
) -> PyResult<OpCheck> {
    let got = got.view()?;
    let dtype = match computed_in {
        Some(name) => DType::from_name(name).map_err(to_py_err)?,
        None => got.dtype,
    };
    let (truth, magnitude) = (truth.as_slice()?, magnitude.as_slice()?);
    py.detach(|| layerdiff_core::check_op_in(&got, truth, magnitude, reduction, stages, dtype))
        .map(OpCheck)
        .map_err(to_py_err)
}

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
    /// A cell whose op ran and was checked against float64: PASS or FAIL by the check.
    #[staticmethod]
    fn checked(cell: Id, check: PyRef<'_, OpCheck>) -> Self {
        Self(ops::OpCell::checked(id(cell), check.0.clone()))
    }

    /// A cell whose op gave a value of another shape than the op's (`got`, `op`).
    #[staticmethod]
    fn misshapen(cell: Id, got: Vec<usize>, op: Vec<usize>) -> Self {
        Self(ops::OpCell::misshapen(id(cell), &got, &op))
    }

    /// A cell whose op gave another dtype than the op's; `exported`: the single-op model did.
    #[staticmethod]
    fn mistyped(cell: Id, got: &str, op: &str, exported: bool) -> Self {
        Self(ops::OpCell::mistyped(id(cell), got, op, exported))
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
