//! `layerdiff check`: the whole-output quick check. The model's final outputs on both sides,
//! each judged element by element as `|target − reference| ≤ atol + rtol·|reference|`
//! (`numpy.allclose`), with the largest absolute and relative error and the worst element: the
//! first thing to run after an export, and the per-layer comparison when it fails.

use layerdiff_core::{Bound, DType, Judge, Machine, Stats, Tensor, compare_judged, render};
use serde::Serialize;

use crate::Result;
use crate::output::{Destinations, Format, Rendered, publish};

/// Schema of the check.
pub const CHECK_SCHEMA: &str = "layerdiff.check/1";

/// One output of the model.
#[derive(Debug, Clone, Serialize)]
pub struct OutputCheck {
    /// Its name (the ONNX graph output's, or `output_N`).
    pub name: String,
    /// The reference's dtype and shape.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Every element within `atol + rtol·|reference|`.
    pub passed: bool,
    /// The comparison, with how many elements exceed the bound and by what factor the bound
    /// would have to grow (`rounding.beyond_tolerance`, `rounding.tolerance_needed`).
    pub stats: Stats,
}

/// The whole-output check.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// [`CHECK_SCHEMA`].
    pub schema: &'static str,
    /// The model, as named on the command line.
    pub model: String,
    /// What computed the reference outputs, in words.
    pub reference: String,
    /// What computed the target outputs, in words.
    pub target: String,
    /// The absolute term of the bound.
    #[serde(serialize_with = "render::float")]
    pub atol: f64,
    /// The relative term of the bound.
    #[serde(serialize_with = "render::float")]
    pub rtol: f64,
    /// Every output within its bound.
    pub passed: bool,
    /// Output by output.
    pub outputs: Vec<OutputCheck>,
    /// The machine.
    pub machine: Machine,
}

impl CheckReport {
    /// Judges each target output against the reference output of the same position.
    pub fn new(
        model: &str,
        sides: (&str, &str),
        bound: Bound,
        reference: &[(String, Tensor)],
        target: &[(String, Tensor)],
    ) -> Result<Self> {
        if reference.len() != target.len() {
            return Err(crate::Error::Usage(format!(
                "the reference gives {} outputs and the target {}",
                reference.len(),
                target.len()
            )));
        }
        let outputs = reference
            .iter()
            .zip(target)
            .map(|((name, r), (_, t))| {
                let grid = if r.dtype.is_float() {
                    r.dtype
                } else {
                    DType::F64
                };
                let stats = compare_judged(r.view(), t.view(), Some(Judge { grid, bound }))?;
                let passed = r.shape == t.shape
                    && stats.nan_mismatch == 0
                    && stats
                        .rounding
                        .as_ref()
                        .is_some_and(|x| x.beyond_tolerance == 0);
                Ok(OutputCheck {
                    name: name.clone(),
                    dtype: r.dtype.name().to_string(),
                    shape: r.shape.clone(),
                    passed,
                    stats,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            schema: CHECK_SCHEMA,
            model: model.to_string(),
            reference: sides.0.to_string(),
            target: sides.1.to_string(),
            atol: bound.atol,
            rtol: bound.rtol,
            passed: outputs.iter().all(|o| o.passed),
            outputs,
            machine: Machine::this(),
        })
    }

    /// 0 when every output is within the bound, 1 when one is not.
    pub fn exit_code(&self) -> u8 {
        u8::from(!self.passed)
    }
}

/// The check as printed.
pub fn to_text(report: &CheckReport) -> String {
    let mut out = format!(
        "{}: {} against {} on the final outputs, allclose(atol={:e}, rtol={:e}): {}\n",
        report.model,
        report.target,
        report.reference,
        report.atol,
        report.rtol,
        if report.passed { "pass" } else { "FAIL" }
    );
    for o in &report.outputs {
        let s = &o.stats;
        let beyond = s.rounding.as_ref().map_or(0, |r| r.beyond_tolerance);
        out.push_str(&format!(
            "  {} {}{:?}: {}, max abs diff {:.3e}, max rel diff {:.3e}, {beyond} of {} elements beyond the bound",
            o.name,
            o.dtype,
            o.shape,
            if o.passed { "pass" } else { "FAIL" },
            s.max_abs_diff,
            s.max_rel_diff,
            s.elements,
        ));
        if let Some(needed) = s.rounding.as_ref().map(|r| r.tolerance_needed)
            && !o.passed
        {
            out.push_str(&format!(" (it needs {needed:.3}x the bound)"));
        }
        out.push('\n');
        if let Some(w) = &s.worst {
            out.push_str(&format!(
                "    worst at {:?}: {:.7e} where the reference is {:.7e}\n",
                w.position, w.target, w.reference
            ));
        }
    }
    if !report.passed {
        out.push_str(&format!(
            "hint: `layerdiff torch {} --target {}` shows the layer where the difference is born, \
             and why\n",
            report.model, report.target
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
