//! `layerdiff check`: the whole-output quick check. The model's final outputs on both sides,
//! each judged element by element as `|target − reference| ≤ atol + rtol·|reference|`
//! (`numpy.allclose`), with the largest absolute and relative error and the worst element: the
//! first thing to run after an export, and the per-layer comparison when it fails.
//!
//! The bound is absolute at small values, so a file that computes something else (a Gelu's
//! `approximate` attribute edited, a weight whose values are small) can pass it. Where the
//! model's outputs computed in float64 are given (the truth), each output is also judged
//! scale-free: the target's mean distance from the truth against the reference's, which both
//! round the same computation in float32. Beyond [`OUTPUT_ROUNDING_FACTOR`] times it, the
//! target computes something else: the check fails, whatever the bound says.

use layerdiff_core::{
    Bound, DType, Judge, Machine, Stats, Tensor, TensorView, compare, compare_judged, floats,
    render,
};
use serde::Serialize;

use crate::Result;
use crate::output::{Destinations, Format, Rendered, publish};

mod file;
pub use file::{AgainstExport, FileDiffers, against_export};

/// Schema of the check.
pub const CHECK_SCHEMA: &str = "layerdiff.check/1";

/// How many times the reference's distance from the float64 truth a target output may be and
/// still be rounding the same computation. Honest runtimes on the built-in models measure
/// 0.4× to 1.5× (ONNX Runtime at every level, tract, OpenVINO, mean distances; docs/torch.md);
/// a Gelu computed with the tanh approximation 30×, a squeeze-excitation weight 10% off whose
/// outputs stay within the bound 6×.
pub const OUTPUT_ROUNDING_FACTOR: f64 = 4.0;

/// An output's distance from the float64 truth, on each side.
#[derive(Debug, Clone, Serialize)]
pub struct TruthCheck {
    /// The reference's mean abs diff from the truth.
    #[serde(serialize_with = "floats::float")]
    pub reference_mean_abs_diff: f64,
    /// The target's mean abs diff from the truth.
    #[serde(serialize_with = "floats::float")]
    pub target_mean_abs_diff: f64,
    /// The target's distance as a multiple of the reference's (at least one rounding of the
    /// output's mean magnitude in the reference's dtype), scaled to the target's `grid` where
    /// it computes in a narrower float one (not where it quantizes).
    #[serde(serialize_with = "floats::float")]
    pub multiple: f64,
    /// Beyond [`OUTPUT_ROUNDING_FACTOR`]: the target computes something else. Never for a
    /// target that quantizes: the bound alone judges it.
    pub beyond: bool,
    /// The narrower dtype the target computes in, where it says so (OpenVINO's bfloat16
    /// inference precision, a float16 file): its rounding is what the target's distance is
    /// held to; or the integer type a quantized file quantizes to, whose distance the
    /// whole output cannot tell from a defect's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grid: Option<String>,
    /// Beyond rounding while every element is within the bound, where the file is the
    /// model's own computation (its export, or a file read against it that differs in
    /// nothing): the runtime's kernels approximate, within the bound, and the output passes
    /// (an approximation, as the per-layer run names it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub approximates: bool,
}

impl TruthCheck {
    /// The two sides' outputs against the truth's; `grid`: the narrower dtype the target
    /// computes in, where it does. Rounding the same computation on a grid with a unit `u`
    /// times float32's moves it about `u` times as far.
    fn new(
        truth: TensorView<'_>,
        reference: TensorView<'_>,
        target: TensorView<'_>,
        grid: Option<DType>,
    ) -> Result<Self> {
        let r = compare(truth, reference)?.mean_abs_diff;
        let t = compare(truth, target)?.mean_abs_diff;
        let magnitude = (0..truth.numel())
            .map(|i| truth.get_f64(i).abs())
            .sum::<f64>()
            / truth.numel().max(1) as f64;
        let unit = |d: DType| {
            d.mantissa_bits()
                .map_or(0.0, |b| 2f64.powi(-(b as i32) - 1))
        };
        // a quantized file's distance is its quantization's, which no float grid bounds
        let quantized = grid.filter(|g| !g.is_float());
        let grid = grid.filter(|g| g.narrower_than(reference.dtype));
        let scale = grid.map_or(1.0, |g| unit(g) / unit(reference.dtype));
        let floor = (r.max(unit(reference.dtype) * magnitude)).max(f64::MIN_POSITIVE) * scale;
        let multiple = t / floor;
        let beyond = multiple > OUTPUT_ROUNDING_FACTOR || (t.is_nan() && !r.is_nan());
        Ok(Self {
            reference_mean_abs_diff: r,
            target_mean_abs_diff: t,
            multiple,
            beyond: beyond && quantized.is_none(),
            grid: quantized.or(grid).map(|g| g.name().to_string()),
            approximates: false,
        })
    }
}

/// One output of the model.
#[derive(Debug, Clone, Serialize)]
pub struct OutputCheck {
    /// Its name (the ONNX graph output's, or `output_N`).
    pub name: String,
    /// The reference's dtype and shape.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Every element within `atol + rtol·|reference|`, and (where the truth was computed) the
    /// target no further from it than rounding explains.
    pub passed: bool,
    /// Both sides against the model's output computed in float64 (`None`: not computed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub float64: Option<TruthCheck>,
    /// The comparison, with how many elements exceed the bound and by what factor the bound
    /// would have to grow (`rounding.beyond_tolerance`, `rounding.tolerance_needed`).
    pub stats: Stats,
}

impl OutputCheck {
    /// The target's output `name` against the reference's, `sides` = (reference, target):
    /// every element within `bound`, and where the output computed in float64 is given
    /// (`truth`), the target no further from it than [`OUTPUT_ROUNDING_FACTOR`] times the
    /// reference (held to the rounding of `target_grid` where it computes in that narrower
    /// dtype). The one rule that tells an output that drifts from one that rounds.
    pub fn judge(
        name: &str,
        sides: (&Tensor, &Tensor),
        truth: Option<&Tensor>,
        bound: Bound,
        target_grid: Option<DType>,
    ) -> Result<Self> {
        let (r, t) = sides;
        let grid = if r.dtype.is_float() {
            r.dtype
        } else {
            DType::F64
        };
        let stats = compare_judged(r.view(), t.view(), Some(Judge { grid, bound }))?;
        let float64 = match truth {
            Some(exact) if r.dtype.is_float() && r.shape == t.shape && exact.shape == r.shape => {
                Some(TruthCheck::new(
                    exact.view(),
                    r.view(),
                    t.view(),
                    target_grid,
                )?)
            }
            _ => None,
        };
        let passed = r.shape == t.shape
            && stats.judged_within()
            && !float64.as_ref().is_some_and(|f| f.beyond);
        Ok(Self {
            name: name.to_string(),
            dtype: r.dtype.name().to_string(),
            shape: r.shape.clone(),
            passed,
            float64,
            stats,
        })
    }
}

/// The whole-output check.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// [`CHECK_SCHEMA`].
    pub schema: &'static str,
    /// The model, as named on the command line.
    pub model: String,
    /// The ONNX file checked, where one was given (`None`: the model's export).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub onnx: Option<String>,
    /// What computed the reference outputs, in words.
    pub reference: String,
    /// What computed the target outputs, in words.
    pub target: String,
    /// The absolute term of the bound.
    #[serde(serialize_with = "floats::float")]
    pub atol: f64,
    /// The relative term of the bound.
    #[serde(serialize_with = "floats::float")]
    pub rtol: f64,
    /// How the target computes in a narrower dtype than the file's, where it does (OpenVINO's
    /// inference precision, and how to turn it off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub narrowed: Option<String>,
    /// Every output within its bound, and nothing in the file that differs from the model's
    /// own export.
    pub passed: bool,
    /// What differs between the file given (`--onnx`) and the model's own export (weights,
    /// folded constants, attributes): each a defect of the file, whatever the outputs show.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub file_differs: Vec<FileDiffers>,
    /// Output by output.
    pub outputs: Vec<OutputCheck>,
    /// The machine.
    pub machine: Machine,
}

impl CheckReport {
    /// Judges each target output against the reference output of the same position, and
    /// both against `truth` (the outputs computed in float64, same order) where given, the
    /// target held to the rounding of `computed_in` where it computes in that narrower dtype.
    pub fn new(
        model: &str,
        sides: (&str, &str),
        bound: Bound,
        reference: &[(String, Tensor)],
        target: &[(String, Tensor)],
        truth: Option<&[(String, Tensor)]>,
        computed_in: Option<(DType, String)>,
    ) -> Result<Self> {
        let (target_grid, narrowed) = computed_in.unzip();
        if reference.len() != target.len() {
            return Err(crate::Error::Usage(format!(
                "the reference gives {} outputs and the target {}",
                reference.len(),
                target.len()
            )));
        }
        let truth = truth.filter(|t| t.len() == reference.len());
        let outputs = reference
            .iter()
            .zip(target)
            .enumerate()
            .map(|(i, ((name, r), (_, t)))| {
                let exact = truth.map(|all| &all[i].1);
                OutputCheck::judge(name, (r, t), exact, bound, target_grid)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            schema: CHECK_SCHEMA,
            model: model.to_string(),
            onnx: None,
            reference: sides.0.to_string(),
            target: sides.1.to_string(),
            atol: bound.atol,
            rtol: bound.rtol,
            narrowed,
            passed: outputs.iter().all(|o| o.passed),
            file_differs: Vec::new(),
            outputs,
            machine: Machine::this(),
        })
    }

    /// The check of the ONNX file `path` given for the model, not its export.
    pub fn of_file(mut self, path: &str) -> Self {
        self.onnx = Some(path.to_string());
        self
    }

    /// The check with what differs between its file and the model's own export: any
    /// difference fails it.
    pub fn with_file_differences(mut self, differences: Vec<FileDiffers>) -> Self {
        self.passed &= differences.is_empty();
        self.file_differs = differences;
        self
    }

    /// The check of a file that is the model's own computation (its export, or a file that
    /// differs from it in nothing): an output beyond rounding only by its distance from
    /// float64, every element within the bound, is the runtime's kernels approximating
    /// within every tolerance, which passes (tract's Erf: 6× as far from float64 as PyTorch
    /// on an MLP whose GELU is written with `erf`, within the bound). Only the runtime
    /// differs there, so nothing else can have moved it.
    pub fn of_the_models_computation(mut self) -> Self {
        if !self.file_differs.is_empty() {
            return self; // the file is not the model's computation: its outputs say so too
        }
        for o in &mut self.outputs {
            let Some(f) = o.float64.as_mut() else {
                continue;
            };
            if !o.passed && f.beyond && o.stats.judged_within() {
                f.approximates = true;
                o.passed = true;
            }
        }
        self.passed = self.file_differs.is_empty() && self.outputs.iter().all(|o| o.passed);
        self
    }

    /// 0 when every output is within the bound and the file has no difference, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        u8::from(!self.passed)
    }
}

/// The check as printed.
pub fn to_text(report: &CheckReport) -> String {
    let truth = if report.outputs.iter().any(|o| o.float64.is_some()) {
        " and their distance from float64"
    } else {
        ""
    };
    let mut out = format!(
        "{}: {} against {} on the final outputs, allclose(atol={:e}, rtol={:e}){truth}: {}\n",
        report.model,
        report.target,
        report.reference,
        report.atol,
        report.rtol,
        if report.passed { "pass" } else { "FAIL" }
    );
    // an output beyond the bound by the narrower dtype's rounding says why, with the how, in
    // its own sentence; otherwise the narrowing is said once here
    let on_integers = |f: &TruthCheck| {
        (f.grid.as_deref())
            .and_then(|g| DType::from_name(g).ok())
            .is_some_and(|d| !d.is_float())
    };
    let narrowed_fails = |o: &OutputCheck| {
        let beyond = o.stats.rounding.as_ref().map_or(0, |r| r.beyond_tolerance);
        o.float64
            .as_ref()
            .is_some_and(|f| !f.beyond && f.grid.is_some() && !on_integers(f) && beyond > 0)
    };
    out.push_str(&file::to_text(&report.file_differs));
    if let Some(how) = &report.narrowed
        && !report.outputs.iter().any(narrowed_fails)
    {
        out.push_str(&format!("  the target: {how}\n"));
    }
    for o in &report.outputs {
        let s = &o.stats;
        let beyond = s.rounding.as_ref().map_or(0, |r| r.beyond_tolerance);
        out.push_str(&output_line(o));
        if o.float64.is_some() && s.nonfinite_target() > 0 {
            // its means cover the finite elements only: no rounding makes a NaN or an Inf
            out.push_str(&format!(
                "    float64 truth: the target is NaN or Inf in {} of {} elements where the reference holds a number: no rounding makes that\n",
                s.nonfinite_target(),
                s.elements,
            ));
        } else if let Some(f) = &o.float64 {
            let said = if on_integers(f) {
                format!(
                    "the file quantizes to {}: float32's rounding does not bound its distance, and the whole output cannot tell its quantization from a defect (a range too narrow, a weight off): `layerdiff torch {} --onnx {}` does, layer by layer",
                    f.grid.as_deref().unwrap_or_default(),
                    report.model,
                    report.onnx.as_deref().unwrap_or("FILE")
                )
            } else if f.approximates {
                "beyond the rounding of the same computation, within the bound: the runtime's kernels approximate here, an approximation and no defect (the file is the model's own computation; `layerdiff onnx FILE --target …` names the op)".to_string()
            } else if f.beyond {
                format!(
                    "beyond the {OUTPUT_ROUNDING_FACTOR}x that rounding the same computation explains: the target computes something else here{}",
                    if beyond == 0 {
                        ", though every element is within the bound"
                    } else {
                        ""
                    }
                )
            } else if narrowed_fails(o) {
                let g = f.grid.as_deref().unwrap_or_default();
                format!(
                    "it fails the bound only because the target computes in {g}, whose rounding this is{}",
                    report
                        .narrowed
                        .as_deref()
                        .map_or(String::new(), |how| format!(": {how}"))
                )
            } else {
                "rounding".to_string()
            };
            let (far, narrower) = match f.grid.as_ref().filter(|_| !on_integers(f)) {
                Some(g) => (
                    f.target_mean_abs_diff / f.reference_mean_abs_diff.max(f64::MIN_POSITIVE),
                    format!(
                        " (the target computes in {g}: held to {g}'s rounding, {:.2}x what it explains)",
                        f.multiple
                    ),
                ),
                None => (f.multiple, String::new()),
            };
            out.push_str(&format!(
                "    float64 truth: the target is {far:.2}x as far from it as the reference (mean abs diff {:.3e} against {:.3e}){narrower}: {said}\n",
                f.target_mean_abs_diff, f.reference_mean_abs_diff
            ));
        }
    }
    if !report.passed {
        out.push_str(&format!(
            "hint: `layerdiff torch {}{} --target {}` shows the layer where the difference is born, \
             and why\n",
            report.model,
            report
                .onnx
                .as_ref()
                .map_or(String::new(), |f| format!(" --onnx {f}")),
            report.target
        ));
    }
    out
}

/// An output's line in the check's text: its figures against the bound, NaN on one side
/// counted apart, and its worst element.
fn output_line(o: &OutputCheck) -> String {
    let s = &o.stats;
    let beyond = s.rounding.as_ref().map_or(0, |r| r.beyond_tolerance);
    let mut out = String::new();
    out.push_str(&format!(
        "  {} {}{:?}: {}, max abs diff {:.3e}, max rel diff {:.3e}, {beyond} of {} elements beyond the bound",
        o.name,
        o.dtype,
        o.shape,
        if o.passed { "pass" } else { "FAIL" },
        s.counting_nan(s.max_abs_diff),
        s.counting_nan(s.max_rel_diff),
        s.elements,
    ));
    if let Some(needed) = s.rounding.as_ref().map(|r| r.tolerance_needed)
        && beyond > 0
    {
        out.push_str(&format!(" (it needs {needed:.3}x the bound)"));
    }
    if s.nan_mismatch > 0 {
        // the figures above cover the elements both hold as numbers
        out.push_str(&format!(
            ", and {} of {} NaN on one side where the other holds a number",
            s.nan_mismatch, s.elements
        ));
    }
    out.push('\n');
    if let Some(w) = &s.worst {
        out.push_str(&format!(
            "    worst at {:?}: {:.7e} where the reference is {:.7e}\n",
            w.position, w.target, w.reference
        ));
    }
    out
}

impl Rendered for CheckReport {
    fn render(&self, format: Format) -> Option<String> {
        match format {
            Format::Json => Some(render::to_json_value(self)),
            Format::Text => Some(to_text(self)),
            Format::Markdown | Format::Html | Format::Svg | Format::NodeData => None,
        }
    }
}

/// Writes and prints the check; returns the exit code.
pub fn deliver(report: &CheckReport, to: &Destinations) -> Result<u8> {
    publish(report, to)?;
    Ok(report.exit_code())
}

#[cfg(test)]
mod tests;
