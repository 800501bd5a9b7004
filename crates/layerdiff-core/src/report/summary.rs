//! The summary of a report: the counts, the verdict, the defects and the precision drift, and
//! the worst layers.

use super::{Layer, Serialize};
fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// What the analysis found, at a glance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Layers in the report (every leaf-module call, compared or not).
    pub layers_total: usize,
    /// Layers with values on both sides that were compared (one of another shape among them:
    /// it exceeds, without statistics).
    pub layers_compared: usize,
    /// Layers whose accumulated difference exceeds their tolerance.
    pub layers_exceeding: usize,
    /// Layers whose own (local) difference exceeds their tolerance.
    pub layers_exceeding_locally: usize,
    /// Layers with no counterpart on the target side.
    pub layers_unmapped: usize,
    /// Layers the target could not compute: it lacks, or crashed on, a node they depend on
    /// (their `reason` says which; counted apart from `layers_unmapped`, left out when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub layers_not_run: usize,
    /// What the run found, in one word: `no_drift` (every compared layer within its
    /// tolerance), `precision` (layers exceed it, and what each adds of its own is what its
    /// precision explains), `defect` (a layer computes differently: see `defects`),
    /// `undecided` (a layer exceeds and nothing tells rounding from a defect there) or
    /// `inconclusive` (part of the model could not be paired).
    pub verdict: Verdict,
    /// Layers that compute something their precision does not explain, most severe first.
    pub defects: Vec<Defect>,
    /// Layers whose kernel adds its terms up in the narrow dtype itself: beyond what a kernel
    /// accumulating in float32 explains, within what one accumulating in the narrow dtype does
    /// (`narrow_accumulation`). Not defects; `--fail-on accumulation` fails on them. Left out
    /// when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub narrow_accumulation: Vec<NarrowKernel>,
    /// Layers whose kernel computes beyond what its precision explains while what it adds stays
    /// within every tolerance (`approximation`): named, most beyond first; not defects,
    /// `--fail-on approximation` fails on them. Left out when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approximations: Vec<Approximation>,
    /// The drift the target's precision explains, when layers exceed their tolerance by it.
    pub precision: Option<PrecisionDrift>,
    /// Where the drift is born: the first defect (or undecided layer) in execution order, else
    /// where the precision drift is born: the first layer whose own (local) error exceeds its
    /// tolerance, or the upstream layer an amplified error came from (see docs/concepts.md).
    pub drift_origin: Option<String>,
    /// The first layer, in execution order, whose accumulated error exceeds its tolerance.
    pub first_exceeding: Option<String>,
    /// The extremes across compared layers.
    pub worst: WorstLayers,
    /// The layers that add the most error of their own (local mean abs diff, where measured and
    /// above zero), most first, at most [`crate::OWN_ERROR_RANKED`]: where quantization or a
    /// lower precision costs the most.
    pub most_own_error: Vec<WorstLayer>,
    /// What a reader must know before trusting the verdict, e.g. that few layers were compared.
    pub warnings: Vec<String>,
    /// Why the run cannot say "no drift" although no compared layer exceeds (layers from some
    /// point on could not be paired, which is what drift beyond recognition looks like); `None`
    /// when the verdict stands. An inconclusive run exits 1, like drift.
    pub inconclusive: Option<String>,
    /// Why the report holds only some of the model's layers: a signal (Ctrl-C, SIGTERM)
    /// stopped the run, and the layers after the last one listed were not compared. Absent
    /// from a finished run's report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// Layers whose own error another exceeding layer's error is traced back to (not written:
    /// each inherited layer names its own in `error_from`).
    #[serde(skip)]
    pub sources: std::collections::BTreeSet<String>,
}

/// What a run found, in one word (see [`Summary::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every compared layer within its tolerance.
    #[default]
    NoDrift,
    /// Layers exceed their tolerance, by what their precision explains only.
    Precision,
    /// A layer computes something its precision does not explain.
    Defect,
    /// A layer exceeds its tolerance and nothing measured tells rounding from a defect.
    Undecided,
    /// Nothing exceeds, but part of the model could not be paired.
    Inconclusive,
}

/// When a finished comparison fails (exit code 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailOn {
    /// On a defect, an undecided layer, an inconclusive run, or values that overflow the
    /// target's dtype: what a precision the target was meant to run in does not explain or
    /// does not survive. Rounding alone passes, and so do kernels that accumulate in the narrow
    /// dtype or approximate within every tolerance (named all the same).
    #[default]
    Defect,
    /// On any layer beyond its tolerance, rounding included, and as on `Defect`.
    Drift,
    /// As on `Defect`, and on a kernel that accumulates in the narrow dtype
    /// ([`Summary::narrow_accumulation`]).
    Accumulation,
    /// As on `Accumulation`, and on a kernel that approximates within every tolerance
    /// ([`Summary::approximations`]): every kernel beyond what an honest one explains fails,
    /// the strict reading a runtime's validation asks for.
    Approximation,
}

impl FailOn {
    /// Parses `--fail-on`: `defect`, `accumulation`, `approximation` or `drift`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "defect" | "defects" => Ok(Self::Defect),
            "drift" => Ok(Self::Drift),
            "accumulation" => Ok(Self::Accumulation),
            "approximation" | "approximations" => Ok(Self::Approximation),
            _ => Err(format!(
                "`--fail-on` takes `defect`, `accumulation`, `approximation` or `drift`, got `{text}`"
            )),
        }
    }
}

impl Summary {
    /// Whether the run fails under `fail_on` (see [`FailOn`]).
    pub fn fails(&self, fail_on: FailOn) -> bool {
        let kernels = match fail_on {
            FailOn::Accumulation => !self.narrow_accumulation.is_empty(),
            FailOn::Approximation => {
                !self.narrow_accumulation.is_empty() || !self.approximations.is_empty()
            }
            FailOn::Defect | FailOn::Drift => false,
        };
        match self.verdict {
            Verdict::NoDrift => kernels,
            Verdict::Defect | Verdict::Undecided | Verdict::Inconclusive => true,
            Verdict::Precision => {
                fail_on == FailOn::Drift
                    || kernels
                    || self.precision.as_ref().is_some_and(|p| p.overflow > 0)
            }
        }
    }

    /// Where the run fails only because `fail_on` asks for more than the default, why, in one
    /// sentence: a headline that reads "no drift" must not exit 1 unexplained.
    pub fn failed_by(&self, fail_on: FailOn) -> Option<String> {
        if !self.fails(fail_on) || self.fails(FailOn::Defect) {
            return None;
        }
        let (flag, found) = match fail_on {
            FailOn::Defect => return None,
            FailOn::Drift => ("drift", "precision drift beyond the tolerance".to_string()),
            FailOn::Accumulation => (
                "accumulation",
                counted(self.narrow_accumulation.len(), "narrow accumulation"),
            ),
            FailOn::Approximation => {
                let mut kinds = Vec::new();
                if !self.approximations.is_empty() {
                    kinds.push(counted(self.approximations.len(), "approximation"));
                }
                if !self.narrow_accumulation.is_empty() {
                    kinds.push(counted(
                        self.narrow_accumulation.len(),
                        "narrow accumulation",
                    ));
                }
                ("approximation", kinds.join(" and "))
            }
        };
        Some(format!(
            "exit 1: `--fail-on {flag}` fails on the {found} named above; without it this run passes"
        ))
    }
}

/// `n` of a finding, plural where it must be (`1 approximation`, `2 narrow accumulations`).
fn counted(n: usize, finding: &str) -> String {
    format!("{n} {finding}{}", if n == 1 { "" } else { "s" })
}

impl Verdict {
    /// The word written into reports (`no_drift`, `precision`…).
    pub fn name(self) -> &'static str {
        match self {
            Self::NoDrift => "no_drift",
            Self::Precision => "precision",
            Self::Defect => "defect",
            Self::Undecided => "undecided",
            Self::Inconclusive => "inconclusive",
        }
    }
}

/// A layer that computes something its precision does not explain, and what fixes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Defect {
    /// The layer.
    pub layer: String,
    /// Its cause, one whose finding is a defect (`weight_mismatch`, `op_implementation`,
    /// `file_differs`, …).
    pub cause: crate::Cause,
    /// Its own error as a multiple of what its precision explains (the layer's
    /// `baseline.multiple`), where that was measured.
    #[serde(serialize_with = "crate::floats::float_opt")]
    pub multiple: Option<f64>,
    /// Its own error as a multiple of its tolerance.
    #[serde(serialize_with = "crate::floats::float_opt")]
    pub tolerance_multiple: Option<f64>,
    /// The cause in words.
    pub detail: String,
    /// What to do about it.
    pub fix: String,
}

impl Defect {
    /// How severe it is, for ranking: its multiple of what precision explains, else of its
    /// tolerance.
    pub fn severity(&self) -> f64 {
        self.multiple.or(self.tolerance_multiple).unwrap_or(0.0)
    }
}

/// A layer whose kernel adds its terms up in the narrow dtype (see
/// `crate::Baseline::narrow`): honest for such a kernel, and named, since what it loses is
/// more than a float32-accumulating kernel would.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NarrowKernel {
    /// The layer.
    pub layer: String,
    /// The dtype it accumulates in.
    pub dtype: String,
    /// Terms each element sums.
    pub terms: u64,
    /// Its own error as a multiple of what a float32-accumulating kernel explains.
    #[serde(serialize_with = "crate::floats::float")]
    pub multiple: f64,
    /// The same, of what a kernel accumulating in `dtype` explains.
    #[serde(serialize_with = "crate::floats::float")]
    pub narrow_multiple: f64,
    /// What to do about it.
    pub fix: String,
}

/// A layer whose kernel approximates: beyond what an honest kernel in its precision explains,
/// while what it adds stays within every tolerance of the run (see
/// [`Summary::approximations`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Approximation {
    /// The layer.
    pub layer: String,
    /// The target's ops that compute it (`Erf`; a module's class where a side has no nodes).
    pub ops: String,
    /// The dtype an honest kernel is held to.
    pub dtype: String,
    /// Its own error as a multiple of what that dtype explains.
    #[serde(serialize_with = "crate::floats::float")]
    pub multiple: f64,
    /// Its own error as a multiple of its tolerance (below 1).
    #[serde(serialize_with = "crate::floats::float")]
    pub tolerance_multiple: f64,
    /// What to do about it.
    pub fix: String,
}

/// The drift a target's lower (or different) rounding explains: where it is born, how far it
/// grows, and how many layers it takes past their tolerance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrecisionDrift {
    /// The dtype the target rounds to (`float16`, `bfloat16`, `float32`).
    pub dtype: String,
    /// Where it shows: the first layer past its tolerance by rounding, its own (where its own
    /// error exceeds) or what it amplifies of the rounding before it (`source`).
    pub origin: Option<String>,
    /// Whose rounding the origin amplifies past its tolerance, where the origin's own error
    /// stays within it: the upstream layer its difference is traced back to. Left out when the
    /// origin's own rounding exceeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Layers whose own error exceeds their tolerance by rounding alone.
    pub layers: usize,
    /// Layers whose values overflow the target dtype's range (±Inf where the reference is
    /// finite): the model does not work in that precision there.
    pub overflow: usize,
    /// The last compared layer (the model's output), where the drift ends up.
    pub output: Option<String>,
    /// Its largest difference.
    #[serde(serialize_with = "crate::floats::float")]
    pub output_max_abs_diff: f64,
    /// Its largest difference as a multiple of its tolerance.
    #[serde(serialize_with = "crate::floats::float")]
    pub output_tolerance_multiple: f64,
    /// Its elements NaN or ±Inf on the target where the reference's are finite (the largest
    /// difference is then of the others).
    #[serde(skip_serializing_if = "is_zero")]
    pub output_nonfinite: u64,
    /// An output compared exactly (an integer or boolean dtype: a class index, a mask), which
    /// no tolerance or multiple describes: how many of its elements differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_exact: Option<ExactOutput>,
}

/// An output of an integer or boolean dtype, compared exactly.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExactOutput {
    /// Its dtype (`int64`, `bool`).
    pub dtype: String,
    /// Elements where the target's differs from the reference's.
    pub differ: u64,
    /// Its elements.
    pub elements: u64,
}

impl Summary {
    /// [`Summary::most_own_error`] in words (`` `c1` 1.2e-2, `c2` 3.4e-3 ``), or `None`.
    pub fn own_error_text(&self) -> Option<String> {
        let ranked: Vec<String> = self
            .most_own_error
            .iter()
            .map(|w| format!("`{}` {:.3e}", w.layer, w.value))
            .collect();
        (!ranked.is_empty()).then(|| ranked.join(", "))
    }

    /// Whether a layer gets a cause: it exceeds its tolerance, accumulated or locally, it stays
    /// within it while its own error is beyond what its precision explains, or it is where an
    /// exceeding layer's error is traced back to (the drift origin among them).
    pub fn needs_cause(&self, layer: &Layer) -> bool {
        layer.exceeds_tol || layer.local_exceeds || layer.own_beyond() || self.is_source(layer)
    }

    /// Whether an exceeding layer's error is traced back to `layer`.
    pub fn is_source(&self, layer: &Layer) -> bool {
        self.sources.contains(&layer.name)
            || self.drift_origin.as_deref() == Some(layer.name.as_str())
    }

    /// Whether the cause of `layer` reads the evidence of its group (ops, precision, weights):
    /// it needs a cause and did not merely inherit its error (its own error measured and within
    /// tolerance, and no error traced back to it: `inherited`, whatever the group shows).
    pub fn needs_evidence(&self, layer: &Layer) -> bool {
        self.needs_cause(layer)
            && (self.is_source(layer)
                || layer.local.is_none()
                || layer.local_exceeds
                || layer.own_beyond())
    }
}

/// The extremes across compared layers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorstLayers {
    /// Largest `max_abs_diff`.
    pub max_abs_diff: Option<WorstLayer>,
    /// Largest `mean_abs_diff`.
    pub mean_abs_diff: Option<WorstLayer>,
    /// Smallest `max_abs_diff`.
    pub min_max_abs_diff: Option<WorstLayer>,
}

/// A layer and one of its figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorstLayer {
    /// Layer name.
    pub layer: String,
    /// The figure.
    #[serde(serialize_with = "crate::floats::float")]
    pub value: f64,
}
