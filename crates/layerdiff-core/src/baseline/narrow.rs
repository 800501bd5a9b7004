//! The second ideal: a kernel that adds a reduction's terms up one by one in the narrow dtype
//! itself (see the parent's docs), and how a layer's own error is told to be its rounding.

use serde::Serialize;

/// The own error against a kernel that accumulates in the narrow dtype (see [`super`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NarrowIdeal {
    /// Terms each element sums.
    pub terms: u64,
    /// Elements judged.
    #[serde(skip)]
    pub elements: u64,
    /// Elements judged one by one ([`NarrowIdeal::elements_beyond`]): those whose terms do
    /// not cancel exactly.
    #[serde(skip)]
    pub judged: u64,
    /// The largest own error such a kernel explains at an element.
    #[serde(serialize_with = "crate::floats::float")]
    pub allowed_max_abs_diff: f64,
    /// The mean own error it explains.
    #[serde(serialize_with = "crate::floats::float")]
    pub allowed_mean_abs_diff: f64,
    /// The own error as a multiple of it.
    #[serde(serialize_with = "crate::floats::float")]
    pub multiple: f64,
    /// How much of the own error pushes every element the same way along its value
    /// (`Σ (t − y)·sign(x) / Σ |t − y|`, from −1 to 1): about 0 for rounding, which goes either
    /// way; 1 for a kernel that scales its result up. Beyond [`NarrowIdeal::chance`], the
    /// error is not an accumulation's rounding, whatever its size, unless it falls short of
    /// the values where such a kernel's sums stall ([`NarrowIdeal::short`]).
    #[serde(serialize_with = "crate::floats::float")]
    pub systematic: f64,
    /// How much of the error such a kernel makes falls short of the values (0 to 1): its sums
    /// stall where their terms share a sign (see `baseline/stalls.rs`); 0 where none do.
    #[serde(
        serialize_with = "crate::floats::float",
        skip_serializing_if = "no_shortfall"
    )]
    pub short: f64,
    /// Elements whose own error is beyond what such a kernel may err by at that very element
    /// (`base + 2·bound + tail·σ`, its largest-error allowance with that element's own `σ`).
    /// Such a kernel errs most where its sums are long and spread; an error of one size
    /// everywhere (noise, a wrong computation) is beyond it where they are short and narrow,
    /// however it compares on average. Beyond [`NarrowIdeal::scattered`], not its rounding.
    pub elements_beyond: u64,
}

fn no_shortfall(short: &f64) -> bool {
    *short == 0.0
}

/// How much of a layer's own error may push its elements one way (see
/// [`NarrowIdeal::systematic`]) for it to be the rounding of a narrow accumulation: 0.8, or
/// three times what `n` elements of unbiased rounding reach by chance (`3/√n`) where more. An
/// accumulation that swamps small terms leans one way too: PyTorch's float16 LayerNorm bias
/// gradient over 784 positions reaches 0.66 on 24 channels; a kernel that scales its result is
/// at 0.99.
pub(crate) const SYSTEMATIC: f64 = 0.8;

/// The share of a layer's elements whose own error may be beyond what a kernel that accumulates
/// in the narrow dtype errs by at that element, for the error to be that kernel's rounding (see
/// [`NarrowIdeal::scattered`]). At its largest-error allowance an honest such kernel is beyond
/// it at an element with odds of about 1 in 20 for a handful of elements (`|z| > 2`), and under
/// one element in all where there are more (`√(2·ln n)`). On the calibration corpus no honest
/// kernel is beyond it at any element (441 layers beyond the float32-accumulating ideal and
/// measured: ConvNeXt-T's, ViT-B/16's, BERT's, GPT-2's and T5's gradients, the planted narrow
/// kernels); noise of 5% of a ViT MLP weight gradient's mean magnitude is at 21% of them
/// (docs/metrics.md).
pub(crate) const ELEMENTS_BEYOND: f64 = 0.01;

/// Where the root sum of squares of an element's terms is at most this share of the layer's
/// largest, its terms cancel exactly (the gradient of attention's key bias is zero whatever the
/// output's, and float64 leaves 1e-16 of the terms' size): the measured terms are not the ones
/// the kernel adds up, and the narrow ideal does not judge that element alone.
pub(crate) const NEGLIGIBLE_TERMS: f64 = 1e-9;

impl NarrowIdeal {
    /// How systematic (see [`NarrowIdeal::systematic`]) the rounding of its elements may look
    /// by chance.
    pub fn chance(&self) -> f64 {
        SYSTEMATIC.max(3.0 / (self.elements.max(1) as f64).sqrt())
    }

    /// Whether the way its error leans is one such a kernel's rounding makes: within
    /// [`NarrowIdeal::chance`] either way, and short of the values by as much more as its sums
    /// stall ([`NarrowIdeal::short`]).
    pub fn leans_as_rounding(&self) -> bool {
        let chance = self.chance();
        -(chance + self.short).min(1.0) <= self.systematic && self.systematic <= chance
    }

    /// Whether its error is beyond that kernel's at too many elements to be its rounding
    /// ([`NarrowIdeal::elements_beyond`]): more than [`ELEMENTS_BEYOND`] of those judged, and
    /// more than two.
    pub fn scattered(&self) -> bool {
        let beyond = self.elements_beyond as f64;
        beyond > 2.0 && beyond > ELEMENTS_BEYOND * self.judged as f64
    }
}

/// The standard deviation of one element's error in a sum of `terms` terms, added one by one
/// into a running sum held in a dtype of unit roundoff `unit`, whose terms' root sum of squares
/// is `rss` and whose exact sum is `sum` (see [`super`]).
pub fn narrow_accumulation_sigma(unit: f64, terms: u64, rss: f64, sum: f64) -> f64 {
    unit * (terms.max(1) as f64 * (rss * rss / 6.0 + sum * sum / 9.0)).sqrt()
}
