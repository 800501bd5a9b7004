//! `layerdiff ops`: the op matrix. The cases and the backends that compute them live in the
//! Python package (PyTorch makes the inputs, the float64 truth and the single-op ONNX files);
//! each cell is judged by [`layerdiff_core::check_op`], and its ONNX runs go through
//! [`run_model`]. This module holds the matrix as a report and its renderings: JSON,
//! Markdown, HTML and the text printed.

use std::path::Path;

use layerdiff_core::render::html_escape;
use layerdiff_core::{DType, Machine, Tensor};
use layerdiff_onnx::Model;
use layerdiff_runtime::{Isolation, RuntimeSpec};
use serde::{Deserialize, Serialize};

use crate::output::{Destinations, Format, Rendered, publish};
use crate::{Error, Result};

mod cell;
mod words;
pub use cell::{CellId, OpCell, Status, UNSUPPORTED_WORDS};
pub use words::{to_html, to_markdown, to_text};

/// Schema of the op matrix.
pub const OPS_SCHEMA: &str = "layerdiff.ops/1";

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
        crate::output::page_forms(self, format, to_markdown, to_html, to_text)
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

/// The narrower dtype `runtime` computes the ONNX model `model` (its bytes) in, and how, in
/// words: the runtime's own narrowing of a float32 file's ops (OpenVINO's bfloat16 inference
/// precision: who, and how to turn it off), else the file's own precision (the integers it
/// quantizes to, the float16 or bfloat16 it stores weights or casts to). What `layerdiff
/// check` holds the target's outputs to.
pub fn computes_in(model: &[u8], runtime: &str) -> Result<Option<(DType, String)>> {
    let model = Model::from_bytes(model, Path::new("model"), None)?;
    if let Some(reduced) = narrowing(runtime)?
        && let Some(grid) = reduced.grid.filter(|g| g.narrower_than(DType::F32))
        && model.has_op(reduced.ops)
    {
        return Ok(Some((grid, reduced.how)));
    }
    Ok(file_computes_in(&model))
}

/// The precision a file computes in below float32 by itself: the integer type it quantizes to
/// (its first QuantizeLinear's zero point's, else int8), or the narrowest float type of its
/// weights and casts; and how, in words.
fn file_computes_in(model: &Model) -> Option<(DType, String)> {
    use layerdiff_onnx::NodeExt;

    let graph = model.graph();
    let mut quantizing: Vec<&str> = Vec::new();
    for op in graph.node.iter().map(|n| n.op_type()) {
        if layerdiff_core::quantizing_op(op) && !quantizing.contains(&op) {
            quantizing.push(op);
        }
    }
    if !quantizing.is_empty() {
        let zero_point = (graph.node.iter())
            .filter(|n| n.op_type() == "QuantizeLinear")
            .find_map(|n| {
                graph
                    .initializer
                    .iter()
                    .find(|t| Some(t.name()) == n.input.get(2).map(String::as_str))
            })
            .and_then(|t| DType::from_onnx_code(t.data_type()).ok());
        let grid = zero_point.unwrap_or(DType::I8);
        return Some((
            grid,
            format!("the file quantizes ({})", quantizing.join(", ")),
        ));
    }
    let casts = (graph.node.iter())
        .filter(|n| n.op_type() == "Cast")
        .filter_map(|n| i32::try_from(n.attr_i64("to").ok()?).ok());
    let narrowest = (graph.initializer.iter().map(|t| t.data_type()))
        .chain(casts)
        .filter_map(|code| DType::from_onnx_code(code).ok())
        .filter(|d| d.narrower_than(DType::F32))
        .min_by_key(|d| d.mantissa_bits())?;
    Some((
        narrowest,
        format!("the file stores weights or casts values in {narrowest}"),
    ))
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

    /// A tensor of `values` in `dtype` with `shape`.
    fn tensor(dtype: DType, shape: &[usize], values: &[f64]) -> Tensor {
        Tensor::from_f64(dtype, values).reshaped(shape).unwrap()
    }

    #[test]
    fn a_cell_is_judged_by_its_shape_then_its_dtype_then_its_values() {
        let judged = |got: &Tensor, truth: &Tensor, exported: bool| {
            OpCell::judged(id(), &got.view(), &truth.view(), &[], (1, 0), exported).unwrap()
        };
        let truth = tensor(DType::F64, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let shape = judged(&tensor(DType::BF16, &[2, 3], &[1.0; 6]), &truth, false);
        assert_eq!(
            (shape.status, shape.message.as_deref()),
            (Status::Fail, Some("shape [2, 3] where the op gives [3, 2]"))
        );
        let wide = tensor(DType::F32, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let own = judged(&wide, &truth, false);
        assert_eq!(
            (own.status, own.message.as_deref()),
            (
                Status::Fail,
                Some("gives float32 where the op gives bfloat16")
            )
        );
        let complex = OpCell::unreadable(id(), "complex64", DType::F64, false).unwrap();
        assert_eq!(
            (complex.status, complex.message.as_deref()),
            (
                Status::Fail,
                Some("gives complex64 where the op gives bfloat16")
            )
        );
        let exported = judged(&wide, &truth, true);
        assert_eq!(
            (exported.status, exported.message.as_deref()),
            (
                Status::Error,
                Some("the exported model gives float32 where the op gives bfloat16")
            )
        );
        // an op whose value is an index has the truth's own dtype, whatever the cell's
        let indices = tensor(DType::I64, &[2], &[0.0, 1.0]);
        let argmax = judged(&tensor(DType::I32, &[2], &[0.0, 1.0]), &indices, false);
        assert_eq!(
            argmax.message.as_deref(),
            Some("gives int32 where the op gives int64")
        );
        assert_eq!(
            judged(&indices.clone(), &indices, false).status,
            Status::Pass
        );
        let right = tensor(DType::BF16, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(judged(&right, &truth, false).status, Status::Pass);
        let off = tensor(DType::BF16, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 7.0]);
        let failed = judged(&off, &truth, false);
        assert_eq!(failed.status, Status::Fail);
        assert!(
            failed.check.as_ref().is_some_and(|c| c.outside == 1),
            "{failed:?}"
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
