//! One cell of the op matrix, one op on one backend in one dtype, and its verdict: the Python
//! side says what the backend did (computed a value, broke, cannot run here), and this decides
//! PASS, FAIL, UNSUPPORTED or ERROR.

use layerdiff_core::{DType, OpCheck, TensorView};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A cell's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Every element within the bound its dtype and reduction predict.
    Pass,
    /// Some element outside it: the numbers and the bound are in the cell.
    Fail,
    /// The backend has no kernel for the op in this dtype, or cannot run here (the message says).
    Unsupported,
    /// The cell broke in a way that says nothing about the op (the message says how).
    Error,
}

impl Status {
    /// Every verdict, in report order.
    pub const ALL: [Self; 4] = [Self::Pass, Self::Fail, Self::Unsupported, Self::Error];

    /// The verdict spelled `name`; an error names the spellings.
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|s| s.name()).collect();
                Error::Usage(format!(
                    "unknown cell status `{name}` (expected {})",
                    names.join(", ")
                ))
            })
    }

    /// As reports spell it: `PASS`, `FAIL`, `UNSUPPORTED`, `ERROR`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Unsupported => "UNSUPPORTED",
            Self::Error => "ERROR",
        }
    }
}

/// One op on one backend in one dtype.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpCell {
    /// The case's name.
    pub case: String,
    /// The backend's name.
    pub backend: String,
    /// The dtype the inputs were rounded to and the op computed in.
    pub dtype: String,
    /// The verdict.
    pub status: Status,
    /// The numbers and the bound (PASS and FAIL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<OpCheck>,
    /// Why a cell is UNSUPPORTED or ERROR, or a FAIL that is not about values (a wrong shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The ONNX ops the exported single-op model holds (ONNX backends).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub onnx_ops: Vec<String>,
    /// The dtype the backend computed the op in where it is narrower than the cell's (OpenVINO
    /// computes float32 in its bfloat16 inference precision): the cell's inputs were rounded
    /// to it and the cell judged by its rule, as the model flow judges such a layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub computed_in: Option<String>,
}

/// What a backend says when it has no kernel for an op or dtype (PyTorch, ONNX Runtime, tract,
/// TensorFlow, the exporter), lower case: a cell that broke with these words is UNSUPPORTED,
/// not an ERROR.
pub const UNSUPPORTED_WORDS: [&str; 15] = [
    "not implemented for",
    "notimplementederror",
    "could not find an implementation",
    "not_implemented",
    "unsupported",
    "not supported",
    "no kernel",
    "unimplemented",
    "type parameter (t) of optype",
    "is not a valid type",
    "unknown datumtype",
    "type error: type 'tensor(",
    "no registered", // TensorFlow: no kernel of this op for this dtype
    "could not find device",
    "has no tensorflow spelling",
];

/// Which cell: the case, the backend, the dtype, and the ONNX ops its model holds.
#[derive(Debug, Clone)]
pub struct CellId {
    /// The case's name.
    pub case: String,
    /// The backend's name.
    pub backend: String,
    /// The dtype.
    pub dtype: String,
    /// The ONNX ops of its exported model (ONNX backends).
    pub onnx_ops: Vec<String>,
    /// The narrower dtype its backend computes the op in, where it does ([`narrowed`]).
    pub computed_in: Option<String>,
}

impl OpCell {
    fn of(id: CellId, status: Status, check: Option<OpCheck>, message: Option<String>) -> Self {
        Self {
            case: id.case,
            backend: id.backend,
            dtype: id.dtype,
            status,
            check,
            message,
            onnx_ops: id.onnx_ops,
            computed_in: id.computed_in,
        }
    }

    /// A cell whose op ran and was checked against float64: PASS or FAIL by the check.
    fn checked(id: CellId, check: OpCheck) -> Self {
        let status = if check.passed {
            Status::Pass
        } else {
            Status::Fail
        };
        Self::of(id, status, Some(check), None)
    }

    /// What the cell's op computed (`got`), judged against the op itself computed in float64
    /// on the same rounded inputs (`truth`, in its own dtype and shape): another shape is a
    /// FAIL; another dtype than the op's (the truth's own where it is not float, else the
    /// cell's) is the backend's FAIL, or the export's ERROR where the cell ran an `exported`
    /// model; else PASS or FAIL by [`layerdiff_core::check_op_in`] in the dtype the backend
    /// computes in, `magnitude` (empty, or one per element) and `reduction`/`stages` as the
    /// case says.
    pub fn judged(
        id: CellId,
        got: &TensorView<'_>,
        truth: &TensorView<'_>,
        magnitude: &[f64],
        (reduction, stages): (usize, u32),
        exported: bool,
    ) -> Result<Self> {
        if got.shape != truth.shape {
            return Ok(Self::misshapen(id, got.shape, truth.shape));
        }
        let op_dtype = Self::op_dtype(&id, truth.dtype)?;
        if got.dtype != op_dtype {
            return Ok(Self::mistyped(
                id,
                got.dtype.name(),
                op_dtype.name(),
                exported,
            ));
        }
        let computed_in = match &id.computed_in {
            Some(name) => DType::from_name(name)?,
            None => got.dtype,
        };
        let mut wide = vec![0.0; truth.numel()];
        truth.decode_into(0, &mut wide);
        let check =
            layerdiff_core::check_op_in(got, &wide, magnitude, reduction, stages, computed_in)?;
        Ok(Self::checked(id, check))
    }

    /// A cell whose op gave a value of a dtype layerdiff cannot read (`got`: `complex64`),
    /// judged as [`Self::judged`] judges another dtype than the op's: the backend's FAIL, or
    /// the export's ERROR.
    pub fn unreadable(id: CellId, got: &str, truth: DType, exported: bool) -> Result<Self> {
        let op_dtype = Self::op_dtype(&id, truth)?;
        Ok(Self::mistyped(id, got, op_dtype.name(), exported))
    }

    /// The dtype the op gives: the truth's own where it is not float (an index, a condition),
    /// else the cell's.
    fn op_dtype(id: &CellId, truth: DType) -> Result<DType> {
        if truth.is_float() {
            Ok(DType::from_name(&id.dtype)?)
        } else {
            Ok(truth)
        }
    }

    /// A cell whose op gave a value of another shape than the op's: FAIL.
    fn misshapen(id: CellId, got: &[usize], op: &[usize]) -> Self {
        let message = format!("shape {got:?} where the op gives {op:?}");
        Self::of(id, Status::Fail, None, Some(message))
    }

    /// A cell whose op gave another dtype than the op's: the backend's own FAIL, or, from an
    /// `exported` model, an ERROR of the export (it wrote the file so).
    fn mistyped(id: CellId, got: &str, op: &str, exported: bool) -> Self {
        let (status, made_by) = if exported {
            (Status::Error, "the exported model gives")
        } else {
            (Status::Fail, "gives")
        };
        Self::of(
            id,
            status,
            None,
            Some(format!("{made_by} {got} where the op gives {op}")),
        )
    }

    /// A cell that broke with `message` (the first line kept): UNSUPPORTED where the backend
    /// says it has no kernel (`not_implemented`: it raised so), else ERROR.
    pub fn broke(id: CellId, message: &str, not_implemented: bool) -> Self {
        let lowered = message.to_lowercase();
        let unsupported = not_implemented || UNSUPPORTED_WORDS.iter().any(|w| lowered.contains(w));
        let first: String = message
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(2000)
            .collect();
        let status = if unsupported {
            Status::Unsupported
        } else {
            Status::Error
        };
        Self::of(id, status, None, Some(first))
    }

    /// A cell whose backend cannot run here, and why: UNSUPPORTED.
    pub fn unavailable(id: CellId, why: &str) -> Self {
        let message = format!("unavailable here: {why}");
        Self::of(id, Status::Unsupported, None, Some(message))
    }
}
