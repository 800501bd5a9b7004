//! A segment's pairs of values while both sides hold them: compared (and each with the float64
//! truth); their local re-runs are in [`super::local`].

use std::collections::HashMap;

use rayon::prelude::*;

use layerdiff_core::{
    DType, Float64Distance, Judge, Layer, LayerStatus, Quantization, Tensor, Tolerance,
    assess_baseline, assess_quantized, compare_pair, lower_precision, max_abs_diffs,
};

use crate::Shared;
use crate::engine::evidence::fit;
use crate::engine::side::Side;

/// What a segment's comparisons read: both sides' values (and the truth's), and how the
/// layers' values correspond.
pub(crate) struct Pairs<'a> {
    pub reference: &'a dyn Side,
    pub target: &'a dyn Side,
    pub truth: Option<&'a dyn Side>,
    pub reference_values: &'a [String],
    pub target_values: &'a [Option<String>],
    pub reference_of: &'a HashMap<String, (String, usize)>,
    /// The target value paired with each reference value.
    pub target_of: &'a HashMap<String, String>,
    pub inputs: &'a [(String, Tensor)],
    pub shared: Shared,
    pub tolerance: Tolerance,
}

impl Pairs<'_> {
    /// Both sides' values of layer `i`, while held.
    pub fn pair(&self, i: usize) -> Option<(&Tensor, &Tensor)> {
        let target = self.target_values[i].as_deref()?;
        Some((
            self.reference.get(&self.reference_values[i])?,
            self.target.get(target)?,
        ))
    }

    /// Compares the layers from `first` on (`layers[k]` is layer `first + k`, `refutable[k]`
    /// says whether its pairing can be refuted): each pair of values, and each with the float64
    /// truth. A pairing that can be refuted and is, is a mapping problem, not a finding. The
    /// pairs are compared all at once across the threads: one at a time, most would be too
    /// small to keep them busy.
    pub fn compare(&self, layers: &mut [Layer], first: usize, refutable: &[bool]) {
        let mut jobs = Vec::new();
        for (k, layer) in layers.iter_mut().enumerate() {
            let i = first + k;
            let Some((reference, target)) = self.pair(i) else {
                continue;
            };
            let value = self.target_values[i].as_deref().unwrap_or_default();
            let unfit = || unfit(reference, target, value).filter(|_| refutable[k]);
            if let Some(why) = super::recoded(reference.dtype, target.dtype, value).or_else(unfit) {
                layer.status = LayerStatus::Unmapped;
                layer.target_shape = Some(target.shape.clone());
                layer.target_dtype = Some(target.dtype.name().to_string());
                layer.reason = Some(why);
                continue;
            }
            if layer.dtype.is_empty() {
                // Aligned without a declared shape (an ONNX value): the reference's value tells.
                layer.shape = reference.shape.clone();
                layer.dtype = reference.dtype.name().to_string();
            }
            let truth = self.truth.and_then(|t| t.get(&self.reference_values[i]));
            // a value the target quantizes is judged on its grid
            layer.quantization = self.target.own_exact(value).and_then(|o| o.grid.clone());
            jobs.push((layer, reference, target, truth));
        }
        let tolerance = self.tolerance;
        jobs.into_par_iter()
            .for_each(|(layer, reference, target, truth)| {
                compare_values(layer, reference, target, truth, tolerance);
            });
    }

    /// The own error of layer `i` for a target that runs its model whole (see
    /// [`Side::own_exact`]): its value against the layer computed exactly on its own inputs,
    /// judged as its quantization where it quantizes the value, else as an honest kernel in its
    /// dtype. Returns whether the target had it.
    pub fn own_error(&self, layer: &mut Layer, i: usize) -> bool {
        let Some(value) = self.target_values[i].as_deref() else {
            return false;
        };
        let Some(own) = self.target.own_exact(value) else {
            return false;
        };
        let Some((reference, target)) = self.pair(i) else {
            return true;
        };
        if layer.status != LayerStatus::Compared {
            return true;
        }
        let exact = &own.exact;
        let judged = judge(layer, layer.target_dtype.as_deref(), exact, target);
        layer.local = compare_pair(exact.view(), target.view(), judged).stats;
        layer.local_reason = None;
        // without an ideal, a grid's clipping and steps are still measured on the exact value
        let ideal = own.ideal.as_ref().unwrap_or(exact);
        let assessed = match &own.grid {
            Some(grid) => {
                let mut grid: Quantization = grid.clone();
                let (t, x, w) = (target.view(), exact.view(), ideal.view());
                let b = assess_quantized(t, x, w, reference.view(), &mut grid);
                layer.quantization = Some(grid);
                Some(b)
            }
            None => own.ideal.as_ref().map(|i| {
                let (x, t) = (exact.view(), target.view());
                assess_baseline(x, t, i.view(), target.dtype, 0, false, None)
                    .map_err(|e| e.to_string())
            }),
        };
        let Some(assessed) = assessed.filter(|_| own.ideal.is_some()) else {
            let why = own.why.as_deref().unwrap_or("the target did not say why");
            layer.baseline_reason = Some(format!("no ideal of the target's computation: {why}"));
            return true;
        };
        match assessed.map(|b| match &own.slack {
            Some(slack) => widened(b, slack, layer.local.as_ref()),
            None => b,
        }) {
            Ok(b) => layer.baseline = Some(b),
            Err(why) => {
                layer.baseline_reason = Some(format!("its exact value does not fit: {why}"))
            }
        }
        true
    }

    /// What the baseline's exact computation of a layer is fed with in place of the reference
    /// value `n`: that value, and the dtype the target holds it in.
    pub fn baseline_feed(&self, n: &str) -> crate::engine::baseline::Fed<'_> {
        if let Some((_, t)) = self.inputs.iter().find(|(name, _)| name == n) {
            let fed = self.target.get(n).map(|fed| fed.dtype);
            let held = self.target.dtype(n).or(fed).unwrap_or(t.dtype);
            return Ok((t, held));
        }
        let reference = self
            .reference
            .get(n)
            .ok_or_else(|| format!("`{n}` is no longer held"))?;
        let held = self
            .target_of
            .get(n)
            .and_then(|t| self.target.dtype(t))
            .unwrap_or(reference.dtype);
        Ok((reference, held))
    }

    /// What the target is fed with in place of its value `n` in a local re-run: an input as
    /// its whole run was fed (cast to the dtype its file declares, where it is another), else
    /// the reference's value of it, made fit to the target's dtype and shape.
    pub(super) fn feed(&self, n: &str) -> std::result::Result<Tensor, String> {
        if let Some((_, t)) = self.inputs.iter().find(|(name, _)| name == n) {
            return Ok(self.target.get(n).unwrap_or(t).clone());
        }
        let (r, _) = self
            .reference_of
            .get(n)
            .ok_or_else(|| format!("`{n}` is not known"))?;
        let (Some(reference), Some(target)) = (self.reference.get(r), self.target.get(n)) else {
            return Err(format!("`{n}` is no longer held"));
        };
        fit(r, reference, target.dtype, &target.shape)
    }
}

/// A layer's two values compared, and each with the float64 truth (`truth`), judged by the
/// tolerance the policy gives the layer.
fn compare_values(
    layer: &mut Layer,
    reference: &Tensor,
    target: &Tensor,
    truth: Option<&Tensor>,
    tolerance: Tolerance,
) {
    // The truth first: it decides an auto tolerance, which the comparison judges with.
    if let Some(truth) = truth
        && let [Some(reference), Some(target)] =
            max_abs_diffs(truth.view(), [reference.view(), target.view()])
    {
        layer.float64 = Some(Float64Distance { reference, target });
    }
    let target_dtype = (reference.dtype != target.dtype).then(|| target.dtype.name());
    layer.tolerance = tolerance.for_layer_on(
        &layer.dtype,
        target_dtype,
        layer.float64.as_ref().map(|f| f.reference),
        layer.quantization.as_ref(),
    );
    let outcome = compare_pair(
        reference.view(),
        target.view(),
        judge(layer, target_dtype, reference, target),
    );
    layer.status = outcome.status;
    layer.accumulated = outcome.stats;
    layer.target_shape = outcome.target_shape;
    layer.target_dtype = outcome.target_dtype;
    // A target that overflows where the reference is finite is no closer to the truth for it:
    // the distances leave NaN out, and a layer all NaN read 0, "the target is closer".
    if let (Some(f), Some(s)) = (layer.float64.as_mut(), layer.accumulated.as_ref())
        && s.nonfinite_target() > 0
    {
        f.target = f64::INFINITY;
    }
}

/// What a layer's comparison judges each element against: the layer's bound, and the steps of
/// the lower-precision side's dtype (`target_dtype`: the target's, where it differs). Float
/// layers only; integers must agree exactly, which the largest difference tells.
pub(super) fn judge(
    layer: &Layer,
    target_dtype: Option<&str>,
    reference: &Tensor,
    target: &Tensor,
) -> Option<Judge> {
    let grid = lower_precision(&layer.dtype, target_dtype)
        .filter(|d| d.is_float())
        .filter(|_| reference.dtype.is_float() && target.dtype.is_float())?;
    Some(Judge {
        grid,
        bound: layer.tolerance,
    })
}

/// Why a reference value and the target's `value` are not compared as stored though paired:
/// both quantized codes, of other integer types. ONNX Runtime's optimizer stores int8
/// activations as uint8, 128 higher with the zero point: the same numbers in other integers,
/// which read as a drift of 128 (and fed to the target, as one of 128). The values they
/// dequantize to are compared.
pub(crate) fn recoded(reference: DType, target: DType, value: &str) -> Option<String> {
    let codes = quantized_codes;
    (codes(reference) && codes(target) && reference != target).then(|| {
        format!(
            "re-encoded: the target holds it as {} (`{value}`), the reference as {}: quantized codes on another zero point, compared where they are dequantized",
            target.name(),
            reference.name()
        )
    })
}

/// Whether values of `dtype` are quantized codes (ONNX's 8- and 16-bit integer types).
pub(crate) fn quantized_codes(dtype: DType) -> bool {
    matches!(dtype, DType::I8 | DType::U8 | DType::I16 | DType::U16)
}

/// Why the target value `value` cannot be this layer's output, when it cannot: a different
/// element count, or a non-float value for a float layer.
fn unfit(reference: &Tensor, target: &Tensor, value: &str) -> Option<String> {
    let count = |t: &Tensor| t.shape.iter().product::<usize>();
    let wrong =
        count(reference) != count(target) || reference.dtype.is_float() && !target.dtype.is_float();
    wrong.then(|| {
        format!(
            "mapping problem: paired with the ONNX value `{value}` ({} {:?}), which cannot hold this layer's output ({} {:?}); not compared",
            target.dtype.name(),
            target.shape,
            reference.dtype.name(),
            reference.shape
        )
    })
}

/// `b` with `slack` (per element, what the ideal cannot model) added to what precision
/// explains: its largest element to the largest allowed, its mean to the mean; the multiple
/// recomputed from the layer's own error.
fn widened(
    mut b: layerdiff_core::Baseline,
    slack: &Tensor,
    own: Option<&layerdiff_core::Stats>,
) -> layerdiff_core::Baseline {
    let view = slack.view();
    let n = view.numel().max(1);
    let mut values = vec![0.0; view.numel()];
    view.decode_into(0, &mut values);
    let largest = values.iter().copied().fold(0.0f64, f64::max);
    b.allowed_max_abs_diff += largest;
    b.allowed_mean_abs_diff += values.iter().sum::<f64>() / n as f64;
    if let Some(own) = own {
        let ratio = |d: f64, allowed: f64| if allowed > 0.0 { d / allowed } else { 0.0 };
        b.multiple = ratio(own.max_abs_diff, b.allowed_max_abs_diff)
            .max(ratio(own.mean_abs_diff, b.allowed_mean_abs_diff));
    }
    b
}
