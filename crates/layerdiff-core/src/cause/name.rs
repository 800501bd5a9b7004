//! The vocabulary of causes: every name a report gives for why a layer differs, written as
//! today's strings (`weight_mismatch`, …) and compared as values, never as literals.

use serde::Serialize;

/// Why a layer differs (`docs/causes.md` says what each one means and when it is given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Its own error is within tolerance; the difference came from upstream.
    Inherited,
    /// Permuting the target onto the reference restores agreement (defect).
    LayoutPermutation,
    /// The target's value has another shape, with no permutation between them (defect).
    ShapeMismatch,
    /// A side run twice disagrees with itself beyond the tolerance (defect).
    Nondeterminism,
    /// A parameter or initializer the layer reads differs between the sides (defect).
    WeightMismatch,
    /// The target's narrower dtype or reduced math explains it (precision).
    PrecisionLoss,
    /// The target's grid clips much of what the layer computes (defect).
    QuantizationRange,
    /// The target's kernel computes differently from an honest one (defect).
    OpImplementation,
    /// A module compiled as one with its submodules computes differently from it eager, while
    /// each of its leaves compiled alone agrees: the compiler's work across modules (defect).
    CrossModuleFusion,
    /// The target's kernel computes beyond what an honest one explains, and its effect stays
    /// within every tolerance: an approximation, named, failing only on
    /// `--fail-on approximation`.
    Approximation,
    /// The target computes what its file says, and the file is not the model (defect).
    FileDiffers,
    /// The target's own code passes a framework call other arguments (defect).
    ArgumentMismatch,
    /// A kernel that adds up its terms in the narrow dtype (precision).
    NarrowAccumulation,
    /// The same dtype's rounding, as the reference does (precision).
    Rounding,
    /// Nothing measured tells precision and defect apart.
    Undecided,
    /// The local error could not be measured and nothing else fits.
    Unknown,
}

impl Cause {
    /// Every cause, in the order `docs/causes.md` lists them.
    pub const ALL: [Cause; 16] = [
        Self::Inherited,
        Self::LayoutPermutation,
        Self::ShapeMismatch,
        Self::Nondeterminism,
        Self::WeightMismatch,
        Self::FileDiffers,
        Self::ArgumentMismatch,
        Self::OpImplementation,
        Self::CrossModuleFusion,
        Self::Approximation,
        Self::NarrowAccumulation,
        Self::QuantizationRange,
        Self::PrecisionLoss,
        Self::Rounding,
        Self::Undecided,
        Self::Unknown,
    ];

    /// The word written into reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Inherited => "inherited",
            Self::LayoutPermutation => "layout_permutation",
            Self::ShapeMismatch => "shape_mismatch",
            Self::Nondeterminism => "nondeterminism",
            Self::WeightMismatch => "weight_mismatch",
            Self::PrecisionLoss => "precision_loss",
            Self::QuantizationRange => "quantization_range",
            Self::OpImplementation => "op_implementation",
            Self::CrossModuleFusion => "cross_module_fusion",
            Self::Approximation => "approximation",
            Self::FileDiffers => "file_differs",
            Self::ArgumentMismatch => "argument_mismatch",
            Self::NarrowAccumulation => "narrow_accumulation",
            Self::Rounding => "rounding",
            Self::Undecided => "undecided",
            Self::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::Cause;

    #[test]
    fn a_cause_serialises_as_the_word_reports_write() {
        for cause in Cause::ALL {
            let json = serde_json::to_string(&cause).unwrap();
            assert_eq!(json, format!("\"{}\"", cause.name()));
        }
    }

    #[test]
    fn docs_causes_lists_every_cause_in_order() {
        let doc = include_str!("../../../../docs/causes.md");
        let listed: Vec<&str> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .collect();
        let names: Vec<&str> = Cause::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(listed, names);
    }
}
