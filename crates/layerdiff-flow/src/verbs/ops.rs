//! `layerdiff ops`: the op matrix. The cases and the backends that compute them live in the
//! Python package (PyTorch makes the inputs, the float64 truth and the single-op ONNX files);
//! each cell is judged by [`layerdiff_core::check_op`], and its ONNX runs go through
//! [`run_model`]. This module holds the matrix as a report and its renderings: JSON,
//! Markdown, HTML and the text printed.

use std::path::Path;

use layerdiff_core::render::html_escape;
use layerdiff_core::{DType, Machine, OpCheck, Tensor, render};
use layerdiff_onnx::Model;
use layerdiff_runtime::{Isolation, RuntimeSpec};
use serde::{Deserialize, Serialize};

use crate::output::{Destinations, Format, Rendered, publish};
use crate::{Error, Result};

mod words;
pub use words::{to_html, to_markdown, to_text};

/// Schema of the op matrix.
pub const OPS_SCHEMA: &str = "layerdiff.ops/1";

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

/// One op as the matrix runs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpCase {
    /// The case's name (`matmul`, `softmax_masked`).
    pub name: String,
    /// The PyTorch call (`torch.matmul`, `F.gelu(approximate='tanh')`).
    pub op: String,
    /// What it reads: kind, shape and values of each input.
    pub inputs: Vec<String>,
    /// Terms reduced into one output element.
    pub reduction: usize,
    /// Intermediate results the op's usual decomposition rounds to the dtype.
    pub stages: u32,
    /// What the error scales with (`terms`, `value`, `input`, `normalized`, `attention`).
    pub magnitude: String,
}

/// A backend as the matrix ran it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpsBackend {
    /// As spelled on the command line (`torch:compile`, `ort:opt=all`, `tract`).
    pub name: String,
    /// Version, device and options, in words.
    pub detail: String,
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
    pub fn checked(id: CellId, check: OpCheck) -> Self {
        let status = if check.passed {
            Status::Pass
        } else {
            Status::Fail
        };
        Self::of(id, status, Some(check), None)
    }

    /// A cell whose op gave a value of another shape than the op's: FAIL.
    pub fn misshapen(id: CellId, got: &[usize], op: &[usize]) -> Self {
        let message = format!("shape {got:?} where the op gives {op:?}");
        Self::of(id, Status::Fail, None, Some(message))
    }

    /// A cell whose op gave another dtype than the op's: the backend's own FAIL, or, from an
    /// `exported` model, an ERROR of the export (it wrote the file so).
    pub fn mistyped(id: CellId, got: &str, op: &str, exported: bool) -> Self {
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

/// What the Python side ran: everything in the report but the rule and the machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpsRun {
    /// The ONNX opset the single-op models were exported at.
    pub opset: i64,
    /// The `torch.onnx.export` path.
    pub exporter: String,
    /// Seed of every case's inputs.
    pub seed: u64,
    /// Library versions that change the numbers (`torch`, `onnxruntime`).
    pub versions: Vec<(String, String)>,
    /// The backends, in column order.
    pub backends: Vec<OpsBackend>,
    /// The dtypes.
    pub dtypes: Vec<String>,
    /// The cases, in row order.
    pub cases: Vec<OpCase>,
    /// Every cell, case by case, dtype by dtype, backend by backend.
    pub cells: Vec<OpCell>,
}

/// The op matrix.
#[derive(Debug, Clone, Serialize)]
pub struct OpsReport {
    /// [`OPS_SCHEMA`].
    pub schema: &'static str,
    /// The verdict rule, in one line (docs/ops.md says why).
    pub rule: &'static str,
    /// What ran.
    #[serde(flatten)]
    pub run: OpsRun,
    /// The machine.
    pub machine: Machine,
}

/// The rule every cell is judged by.
pub const RULE: &str = "|got - float64 truth on the same rounded inputs| <= n·step(dtype, |truth|) + \
     (stages·u_dtype + (ceil(log2 K) + n)·u_float32)·magnitude, element by element (values below \
     the dtype's normal range may flush to zero); n = 1 step in float16 and bfloat16, 4 in float32";

impl OpsReport {
    /// The report of a run (cells put in row, dtype and column order).
    pub fn new(mut run: OpsRun) -> Self {
        let mut cells = std::mem::take(&mut run.cells);
        let position = |c: &OpCell| {
            (
                run.cases.iter().position(|k| k.name == c.case),
                run.dtypes.iter().position(|d| *d == c.dtype),
                run.backends.iter().position(|b| b.name == c.backend),
            )
        };
        cells.sort_by_key(|c| position(c));
        run.cells = cells;
        Self {
            schema: OPS_SCHEMA,
            rule: RULE,
            run,
            machine: Machine::this(),
        }
    }

    /// Cells with each status, in [`Status`] order.
    pub fn counts(&self) -> [usize; 4] {
        let mut counts = [0; 4];
        for c in &self.run.cells {
            counts[c.status as usize] += 1;
        }
        counts
    }

    /// 0 when every cell that ran passed; 1 when one fails or broke.
    pub fn exit_code(&self) -> u8 {
        let [_, fail, _, error] = self.counts();
        u8::from(fail + error > 0)
    }

    fn cell(&self, case: &str, dtype: &str, backend: &str) -> Option<&OpCell> {
        self.run
            .cells
            .iter()
            .find(|c| c.case == case && c.dtype == dtype && c.backend == backend)
    }

    /// The dtypes that have cells, in order.
    fn dtypes_run(&self) -> impl Iterator<Item = &String> {
        self.run
            .dtypes
            .iter()
            .filter(|d| self.run.cells.iter().any(|c| &c.dtype == *d))
    }
}

impl Rendered for OpsReport {
    fn render(&self, format: Format) -> Option<String> {
        match format {
            Format::Json => Some(render::to_json_value(self)),
            Format::Markdown => Some(to_markdown(self)),
            Format::Html => Some(to_html(self)),
            Format::Text => Some(to_text(self)),
            Format::Svg | Format::NodeData => None,
        }
    }
}

/// Writes and prints the matrix of a run; returns the exit code (0 every cell that ran
/// passed, 1 one failed or broke).
pub fn deliver(run: OpsRun, to: &Destinations) -> Result<u8> {
    let report = OpsReport::new(run);
    publish(&report, to)?;
    Ok(report.exit_code())
}

/// Runs an ONNX model (its bytes: a single-op model, or a whole one for `layerdiff check`) on
/// `runtime` (`ort`, `ort:opt=all`, `tract`…) and returns its outputs, in the graph's order.
pub fn run_model(
    model: &[u8],
    runtime: &str,
    inputs: &[(String, Tensor)],
) -> Result<Vec<(String, Tensor)>> {
    let spec = RuntimeSpec::parse(runtime).map_err(Error::Usage)?;
    // in a worker process where the runtime loads a custom-op library: a crash fails one case
    let runtime = spec.build_isolated(Isolation::Auto)?;
    let model = Model::from_bytes(model, Path::new("single-op model"), None)?;
    let outputs: Vec<String> = model
        .graph()
        .output
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    Ok(runtime.run(&model, inputs, &outputs)?)
}

/// What `runtime` is here, in words (version, provider and options), or why it cannot run here.
pub fn describe_runtime(runtime: &str) -> Result<String> {
    Ok(built(runtime)?.detail())
}

fn built(runtime: &str) -> Result<Box<dyn layerdiff_runtime::Runtime>> {
    let spec = RuntimeSpec::parse(runtime).map_err(Error::Usage)?;
    Ok(spec.build()?)
}

/// How an ONNX backend narrows float math, where it does (OpenVINO's inference precision):
/// the model flow's knowledge of the side ([`layerdiff_runtime::Runtime::reduced_math`]),
/// which the op matrix judges its cells by.
pub fn narrowing(runtime: &str) -> Result<Option<layerdiff_runtime::ReducedMath>> {
    Ok(built(runtime)?.reduced_math())
}

/// The narrower dtype `runtime` computes the float32 ONNX model `model` (its bytes) in, where
/// it narrows one of its ops (OpenVINO's bfloat16 inference precision), and how, in words (who,
/// and how to turn it off): what `layerdiff check` holds the target's outputs to.
pub fn computes_in(model: &[u8], runtime: &str) -> Result<Option<(DType, String)>> {
    let Some(reduced) = narrowing(runtime)? else {
        return Ok(None);
    };
    let model = Model::from_bytes(model, Path::new("model"), None)?;
    let grid = reduced.grid.filter(|g| g.narrower_than(DType::F32));
    Ok(grid
        .filter(|_| model.has_op(reduced.ops))
        .map(|g| (g, reduced.how)))
}

/// The dtype a backend that narrows as `reduced` says computes a cell of `dtype` in, whose
/// model holds `onnx_ops`: its grid where one of the ops is narrowed and the grid is narrower
/// than `dtype`; `None` where it computes in `dtype`.
pub fn narrowed(
    reduced: &layerdiff_runtime::ReducedMath,
    onnx_ops: &[String],
    dtype: DType,
) -> Option<DType> {
    let grid = reduced.grid?;
    let touched = onnx_ops.iter().any(|op| reduced.ops.contains(&op.as_str()));
    (touched && grid.narrower_than(dtype)).then_some(grid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> CellId {
        CellId {
            case: "matmul".into(),
            backend: "ort".into(),
            dtype: "bfloat16".into(),
            onnx_ops: vec!["MatMul".into()],
            computed_in: None,
        }
    }

    #[test]
    fn a_backend_without_a_kernel_is_unsupported_and_any_other_break_an_error() {
        let said = "NotImplementedError: \"addmm_impl_cpu_\" not implemented for 'Half'\nmore";
        let cell = OpCell::broke(id(), said, false);
        assert_eq!(cell.status, Status::Unsupported);
        assert_eq!(cell.message.as_deref(), Some(said.lines().next().unwrap()));
        assert_eq!(
            OpCell::broke(id(), "anything", true).status,
            Status::Unsupported
        );
        let crashed = OpCell::broke(
            id(),
            "RuntimeError: CUDA error: illegal memory access",
            false,
        );
        assert_eq!(crashed.status, Status::Error);
        assert_eq!(
            OpCell::unavailable(id(), "no CUDA").status,
            Status::Unsupported
        );
    }

    #[test]
    fn a_wrong_dtype_is_the_backends_failure_or_the_exports_error() {
        let own = OpCell::mistyped(id(), "float32", "bfloat16", false);
        assert_eq!(own.status, Status::Fail);
        assert_eq!(
            own.message.as_deref(),
            Some("gives float32 where the op gives bfloat16")
        );
        let exported = OpCell::mistyped(id(), "float32", "bfloat16", true);
        assert_eq!(exported.status, Status::Error);
        let shape = OpCell::misshapen(id(), &[2, 3], &[3, 2]);
        assert_eq!(
            (shape.status, shape.message.as_deref()),
            (Status::Fail, Some("shape [2, 3] where the op gives [3, 2]"))
        );
    }

    #[test]
    fn a_backend_narrows_a_cell_only_where_its_grid_is_narrower_and_its_op_is_narrowed() {
        let reduced = layerdiff_runtime::ReducedMath {
            ops: &["MatMul", "Conv"],
            grid: Some(DType::BF16),
            how: String::new(),
        };
        let ops = |o: &[&str]| o.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            narrowed(&reduced, &ops(&["MatMul"]), DType::F32),
            Some(DType::BF16)
        );
        assert_eq!(
            narrowed(&reduced, &ops(&["MatMul"]), DType::F16),
            Some(DType::BF16)
        );
        assert_eq!(narrowed(&reduced, &ops(&["MatMul"]), DType::BF16), None);
        assert_eq!(narrowed(&reduced, &ops(&["Gather"]), DType::F32), None);
        let tf32 = layerdiff_runtime::ReducedMath {
            grid: None,
            ..reduced
        };
        assert_eq!(narrowed(&tf32, &ops(&["MatMul"]), DType::F32), None);
    }
}
