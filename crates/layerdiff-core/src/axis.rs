//! One model compared at several points of an axis (batch sizes, input shapes): each point's
//! verdict and whole-output error, and the layers that pass at one point and fail at another.
//! A pure function of the points' reports; the flows run them.

use serde::Serialize;

use crate::{InputInfo, LayerStatus, Machine, Report, Stats, ToleranceInfo};

/// Schema of an axis report.
pub const AXIS_SCHEMA: &str = "layerdiff.axis/1";

/// The comparisons of one model along an axis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AxisReport {
    /// [`AXIS_SCHEMA`].
    pub schema: &'static str,
    /// The model.
    pub model: String,
    /// What varies (`batch size`, `input shapes`).
    pub axis: String,
    /// The reference, in words.
    pub reference: String,
    /// The target, in words.
    pub target: String,
    /// The tolerance policy of every point.
    pub tolerance: ToleranceInfo,
    /// Point by point.
    pub points: Vec<AxisPoint>,
    /// The layers whose verdict changes along the axis, in execution order.
    pub changing: Vec<AxisLayer>,
    /// What the axis shows, in sentences.
    pub findings: Vec<String>,
    /// The machine.
    pub machine: Machine,
}

/// One point of the axis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AxisPoint {
    /// The point (`8`, `4x3x160x160`).
    pub point: String,
    /// The inputs given at it.
    pub inputs: Vec<InputInfo>,
    /// The point's verdict: `no_drift`, `precision`, `defect`, `undecided` or `inconclusive`.
    pub verdict: String,
    /// Whether the point fails (a defect, an undecided layer, an inconclusive run, or values
    /// that overflow the target's dtype; rounding alone passes).
    pub fails: bool,
    /// Whether a layer's kernel accumulates in the narrow dtype there (see
    /// [`crate::Summary::narrow_accumulation`]); left out when not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub accumulates_narrow: bool,
    /// Whether a layer's kernel approximates within every tolerance there (see
    /// [`crate::Summary::approximations`]); left out when not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub approximates: bool,
    /// Layers compared.
    pub layers_compared: usize,
    /// Layers exceeding their tolerance.
    pub layers_exceeding: usize,
    /// Where drift is born.
    pub drift_origin: Option<String>,
    /// The origin's cause.
    pub cause: Option<crate::Cause>,
    /// The last compared layer (the model's output).
    pub output: Option<String>,
    /// Its largest absolute difference.
    #[serde(serialize_with = "crate::floats::float_opt")]
    pub output_max_abs_diff: Option<f64>,
    /// Its largest relative difference.
    #[serde(serialize_with = "crate::floats::float_opt")]
    pub output_max_rel_diff: Option<f64>,
    /// When the output could not be compared element by element: why (its shapes differ).
    pub output_note: Option<String>,
}

/// A layer whose verdict changes along the axis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AxisLayer {
    /// The layer.
    pub layer: String,
    /// At each point: its largest error as a multiple of its tolerance (`None`: not compared).
    #[serde(serialize_with = "ratios")]
    pub tolerance_needed: Vec<Option<f64>>,
    /// At each point: whether it exceeds its tolerance.
    pub exceeds: Vec<bool>,
}

fn ratios<S: serde::Serializer>(values: &[Option<f64>], s: S) -> Result<S::Ok, S::Error> {
    /// One ratio, written as every report float is.
    struct Ratio(Option<f64>);
    impl Serialize for Ratio {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            crate::floats::float_opt(&self.0, s)
        }
    }
    s.collect_seq(values.iter().map(|v| Ratio(*v)))
}

/// The last layer the target has (the model's output), with its statistics where it could
/// be compared element by element.
fn output(report: &Report) -> Option<(&str, Option<&Stats>, Option<String>)> {
    let l = report
        .layers
        .iter()
        .rev()
        .find(|l| l.status != LayerStatus::Unmapped)?;
    let note = (l.status == LayerStatus::ShapeMismatch).then(|| {
        format!(
            "its shape differs: {:?} on the target, {:?} on the reference",
            l.target_shape.as_deref().unwrap_or_default(),
            l.shape
        )
    });
    Some((l.name.as_str(), l.accumulated.as_ref(), note))
}

/// The axis report of `reports`, one per point of `points` (same model, same sides).
pub fn along_axis(axis: &str, points: &[String], reports: &[Report]) -> AxisReport {
    let first = &reports[0];
    let mut out_points = Vec::new();
    for (point, r) in points.iter().zip(reports) {
        let out = output(r);
        let origin = r.summary.drift_origin.clone();
        let cause = origin
            .as_ref()
            .and_then(|o| r.layers.iter().find(|l| &l.name == o).and_then(|l| l.cause));
        out_points.push(AxisPoint {
            point: point.clone(),
            inputs: r.inputs.clone(),
            verdict: r.summary.verdict.name().to_string(),
            fails: r.summary.fails(crate::FailOn::Defect),
            accumulates_narrow: !r.summary.narrow_accumulation.is_empty(),
            approximates: !r.summary.approximations.is_empty(),
            layers_compared: r.summary.layers_compared,
            layers_exceeding: r.summary.layers_exceeding,
            drift_origin: origin,
            cause,
            output: out.as_ref().map(|(n, _, _)| n.to_string()),
            output_max_abs_diff: out.as_ref().and_then(|(_, s, _)| {
                let s = s.as_ref()?;
                Some(s.counting_nan(s.max_abs_diff))
            }),
            output_max_rel_diff: out.as_ref().and_then(|(_, s, _)| {
                let s = s.as_ref()?;
                Some(s.counting_nan(s.max_rel_diff))
            }),
            output_note: out.and_then(|(_, _, note)| note),
        });
    }
    // Layers by name in the first point's order; a layer a point lacks counts as not compared.
    let mut changing = Vec::new();
    for layer in &first.layers {
        let at: Vec<Option<&crate::Layer>> = reports
            .iter()
            .map(|r| r.layers.iter().find(|l| l.name == layer.name))
            .collect();
        let exceeds: Vec<bool> = at
            .iter()
            .map(|l| l.is_some_and(|l| l.exceeds_tol))
            .collect();
        let present = at
            .iter()
            .filter(|l| l.is_some_and(|l| l.status != LayerStatus::Unmapped));
        if present.count() < 2 || exceeds.iter().all(|e| *e == exceeds[0]) {
            continue;
        }
        changing.push(AxisLayer {
            layer: layer.name.clone(),
            tolerance_needed: at
                .iter()
                .map(|l| l.and_then(|l| l.accumulated.as_ref()?.tolerance_multiple()))
                .collect(),
            exceeds,
        });
    }
    let findings = findings(axis, &out_points, &changing);
    AxisReport {
        schema: AXIS_SCHEMA,
        model: first.model.clone(),
        axis: axis.to_string(),
        reference: format!("{} ({})", first.reference.runtime, first.reference.detail),
        target: format!("{} ({})", first.target.runtime, first.target.detail),
        tolerance: first.tolerance.clone(),
        points: out_points,
        changing,
        findings,
        machine: first.machine.clone(),
    }
}

fn findings(axis: &str, points: &[AxisPoint], changing: &[AxisLayer]) -> Vec<String> {
    let mut out = Vec::new();
    let named = |pick: &dyn Fn(&AxisPoint) -> bool| -> Vec<String> {
        points
            .iter()
            .filter(|p| pick(p))
            .map(|p| p.point.clone())
            .collect()
    };
    let clean = named(&|p| p.verdict == "no_drift");
    let drifting = named(&|p| p.verdict != "no_drift");
    let rounding_only = points.iter().all(|p| !p.fails);
    if drifting.is_empty() {
        out.push(format!("no drift at any {axis} ({})", clean.join(", ")));
    } else if rounding_only && clean.is_empty() {
        out.push(format!(
            "rounding only at every {axis} ({}): no defect",
            drifting.join(", ")
        ));
    } else if rounding_only {
        out.push(format!(
            "no drift at {axis} {}, rounding only at {}: no defect",
            clean.join(", "),
            drifting.join(", ")
        ));
    } else if clean.is_empty() {
        out.push(format!("drift at every {axis} ({})", drifting.join(", ")));
    } else {
        out.push(format!(
            "passes at {axis} {} and drifts at {}: a check at {} alone would have missed it",
            clean.join(", "),
            drifting.join(", "),
            clean[0]
        ));
    }
    // The point a check would first stop at, and where its fault is born.
    if let Some(p) = points.iter().find(|p| p.fails) {
        let at = match (&p.drift_origin, &p.cause) {
            (Some(o), Some(c)) => format!(": born at `{o}` ({c})"),
            (Some(o), None) => format!(": born at `{o}`"),
            _ => String::new(),
        };
        out.push(format!("first fails at {axis} {}{at}", p.point));
    }
    let origins: Vec<&str> = points
        .iter()
        .filter_map(|p| p.drift_origin.as_deref())
        .collect();
    if origins.len() > 1 && origins.iter().any(|o| *o != origins[0]) {
        out.push(format!(
            "the drift is born at different layers along the {axis}: {}",
            points
                .iter()
                .filter_map(|p| Some(format!("`{}` at {}", p.drift_origin.as_ref()?, p.point)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for layer in changing.iter().take(5) {
        let at = |want: bool| -> Vec<&str> {
            layer
                .exceeds
                .iter()
                .zip(points)
                .filter(|(e, _)| **e == want)
                .map(|(_, p)| p.point.as_str())
                .collect()
        };
        out.push(format!(
            "`{}` passes at {} and exceeds at {}",
            layer.layer,
            at(false).join(", "),
            at(true).join(", ")
        ));
    }
    if changing.len() > 5 {
        out.push(format!(
            "{} more layers change verdict along the {axis}",
            changing.len() - 5
        ));
    }
    out
}

/// The axis report as Markdown: the points' table, the findings, the layers that change.
pub fn axis_markdown(report: &AxisReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# layerdiff: `{}` along the {}\n\nReference: {} · target: {}\n\nTolerance: {}\n\nMachine: {}\n",
        report.model,
        report.axis,
        report.reference,
        report.target,
        report.tolerance.describe(),
        report.machine.describe()
    );
    for finding in &report.findings {
        let _ = writeln!(out, "- {finding}");
    }
    let _ = writeln!(
        out,
        "\n| {} | inputs | verdict | compared | exceeding | drift origin (cause) | output max abs diff | output max rel diff |\n|---|---|---|---:|---:|---|---:|---:|",
        report.axis
    );
    let sci = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3e}"));
    for p in &report.points {
        let inputs: Vec<String> = p
            .inputs
            .iter()
            .map(|i| format!("`{}` {:?}", i.name, i.shape))
            .collect();
        let origin = match (&p.drift_origin, &p.cause) {
            (Some(o), Some(c)) => format!("`{o}` ({c})"),
            (Some(o), None) => format!("`{o}`"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {origin} | {} | {} |",
            p.point,
            inputs.join(", "),
            p.verdict.replace('_', " "),
            p.layers_compared,
            p.layers_exceeding,
            p.output_note
                .clone()
                .unwrap_or_else(|| sci(p.output_max_abs_diff)),
            sci(p.output_max_rel_diff)
        );
    }
    if !report.changing.is_empty() {
        let heads: Vec<String> = report.points.iter().map(|p| p.point.clone()).collect();
        let _ = writeln!(
            out,
            "\n## Layers whose verdict changes\n\nEach cell: the layer's largest error as a multiple of its tolerance (**bold**: exceeding).\n\n| layer | {} |\n|---|{}",
            heads.join(" | "),
            "---:|".repeat(heads.len())
        );
        for l in &report.changing {
            let cells: Vec<String> = l
                .tolerance_needed
                .iter()
                .zip(&l.exceeds)
                .map(|(r, e)| match (r, e) {
                    (Some(r), true) => format!("**{r:.2}**"),
                    (Some(r), false) => format!("{r:.2}"),
                    (None, true) => "**not comparable**".to_string(),
                    (None, false) => "—".to_string(),
                })
                .collect();
            let _ = writeln!(out, "| `{}` | {} |", l.layer, cells.join(" | "));
        }
    }
    out
}

/// The short summary printed: a line per point and the findings.
pub fn axis_text(report: &AxisReport) -> String {
    let mut out = format!("{} along the {}:\n", report.model, report.axis);
    for p in &report.points {
        let origin = p
            .drift_origin
            .as_ref()
            .map_or(String::new(), |o| match &p.cause {
                Some(c) => format!(", born at `{o}` ({c})"),
                None => format!(", born at `{o}`"),
            });
        let output = match (&p.output_note, p.output_max_abs_diff) {
            (Some(note), _) => format!("; output `{}`: {note}", p.output.as_deref().unwrap_or("")),
            (None, Some(d)) => format!("; output max abs diff {d:.3e}"),
            (None, None) => String::new(),
        };
        out.push_str(&format!(
            "  {} {}: {}, {} of {} layers exceeding{origin}{output}\n",
            report.axis,
            p.point,
            p.verdict.replace('_', " "),
            p.layers_exceeding,
            p.layers_compared
        ));
    }
    for f in &report.findings {
        out.push_str(&format!("  {f}\n"));
    }
    out
}

impl AxisReport {
    /// 1 when a point fails under `fail_on` (see [`crate::FailOn`]), else 0.
    pub fn exit_code(&self, fail_on: crate::FailOn) -> u8 {
        u8::from(self.points.iter().any(|p| match fail_on {
            crate::FailOn::Defect => p.fails,
            crate::FailOn::Accumulation => p.fails || p.accumulates_narrow,
            crate::FailOn::Approximation => p.fails || p.accumulates_narrow || p.approximates,
            crate::FailOn::Drift => p.verdict != "no_drift",
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at: &str, verdict: &str) -> AxisPoint {
        AxisPoint {
            point: at.into(),
            inputs: Vec::new(),
            verdict: verdict.into(),
            fails: !matches!(verdict, "no_drift" | "precision"),
            accumulates_narrow: false,
            approximates: false,
            layers_compared: 10,
            layers_exceeding: usize::from(verdict != "no_drift"),
            drift_origin: (verdict != "no_drift").then(|| "l3".into()),
            cause: None,
            output: None,
            output_max_abs_diff: None,
            output_max_rel_diff: None,
            output_note: None,
        }
    }

    #[test]
    fn rounding_along_an_axis_is_said_to_be_rounding_not_drift() {
        // Qwen2 in bfloat16 over 3 decode steps, ResNet-50 at batch sizes 1, 8, 32: rounding
        // at every point (exit 0) read "drift at every decode step (prefill, 1, 2, 3)"
        let all = [point("1", "precision"), point("8", "precision")];
        assert_eq!(
            findings("batch size", &all, &[])[0],
            "rounding only at every batch size (1, 8): no defect"
        );
        let some = [point("1", "no_drift"), point("8", "precision")];
        assert_eq!(
            findings("batch size", &some, &[])[0],
            "no drift at batch size 1, rounding only at 8: no defect"
        );
        let failing = [point("1", "defect"), point("8", "precision")];
        assert_eq!(
            findings("batch size", &failing, &[])[0],
            "drift at every batch size (1, 8)"
        );
        let missed = [point("1", "defect"), point("8", "no_drift")];
        assert_eq!(
            findings("batch size", &missed, &[])[0],
            "passes at batch size 8 and drifts at 1: a check at 8 alone would have missed it"
        );
    }
}
