//! The run's conclusion from its layers' findings: the verdict, the precision drift and
//! where it shows, and the drift origin.

use crate::{Finding, Layer, PrecisionDrift, Summary, Verdict};

/// The summary's verdict, precision drift and drift origin, from the layers' findings
/// (`quantized`: the layers whose precision is a quantization's, with its grid).
pub(super) fn conclude(
    layers: &[Layer],
    summary: &mut Summary,
    quantized: &std::collections::HashMap<String, String>,
) {
    let own = |l: &Layer| l.own_exceeds() || l.own_beyond();
    let failing = layers.iter().find(|l| {
        matches!(l.finding, Some(Finding::Defect | Finding::Undecided))
            && (own(l) || summary.is_source(l))
    });
    let precision: Vec<&Layer> = layers
        .iter()
        .filter(|l| l.finding == Some(Finding::Precision))
        .collect();
    // Where the precision drift shows: the first layer past its tolerance by rounding (its
    // own, or what it inherits and amplifies, `source` naming whose rounding that is); where
    // none is past it, the first whose own error is beyond what its precision explains or
    // that an exceeding layer's error is traced back to.
    let past = layers.iter().find(|l| {
        (l.exceeds_tol || l.local_exceeds)
            && matches!(l.finding, Some(Finding::Precision | Finding::Inherited))
    });
    let first_precision = precision.iter().find(|l| own(l) || summary.is_source(l));
    let (precision_origin, source) = match past {
        Some(l) if !precision.is_empty() => {
            // past it with what it inherits, most of which is upstream's (a layer whose own
            // rounding is most of what it hands on is where the drift is born, whatever it adds)
            let amplified = !(l.local_exceeds || (l.local.is_none() && l.exceeds_tol))
                && super::own_share(l) < crate::BORN_HERE;
            let source = l.error_from.clone().filter(|_| amplified);
            (Some(l.name.clone()), source)
        }
        _ => (first_precision.map(|l| l.name.clone()), None),
    };
    summary.precision = precision_origin.as_ref().map(|origin| {
        let mut grids: Vec<(String, usize)> = Vec::new();
        for l in &precision {
            // a layer the target quantizes rounds to its integer grid, whatever float ideal
            // its kernel was held to (TFLite's int8 read "float32 rounding" beside "the
            // target quantizes this layer to int8")
            let on_grid = l.quantization.as_ref().map(|q| q.dtype.clone());
            // the drift between the sides is the coarser side's rounding (a float16 target
            // judged on its own grid against a bfloat16 reference drifts by bfloat16's)
            // (a layer of indices rounds nothing itself: its grid is its inputs')
            let coarser = |b: &crate::Baseline| {
                let rounds = crate::DType::from_name(&l.dtype).is_ok_and(|d| d.is_float());
                (crate::lower_precision(&l.dtype, Some(&b.grid)).filter(|_| rounds))
                    .map_or(b.grid.clone(), |d| d.name().to_string())
            };
            let grid = on_grid
                .or_else(|| l.baseline.as_ref().map(coarser))
                .or_else(|| {
                    if let Some(grid) = quantized.get(&l.name) {
                        return Some(grid.clone());
                    }
                    crate::lower_precision(&l.dtype, l.target_dtype.as_deref())
                        .map(|d| d.name().to_string())
                });
            if let Some(g) = grid {
                match grids.iter_mut().find(|(d, _)| *d == g) {
                    Some((_, n)) => *n += 1,
                    None => grids.push((g, 1)),
                }
            }
        }
        let output = layers.iter().rev().find(|l| l.accumulated.is_some());
        let stats = output.and_then(|l| l.accumulated.as_ref());
        PrecisionDrift {
            dtype: grids
                .into_iter()
                .max_by_key(|(_, n)| *n)
                .map_or_else(|| "float32".to_string(), |(g, _)| g),
            origin: Some(origin.clone()),
            source: source.clone(),
            layers: precision.iter().filter(|l| own(l)).count(),
            overflow: precision.iter().filter(|l| overflows(l)).count(),
            output: output.map(|l| l.name.clone()),
            output_max_abs_diff: stats.map_or(0.0, |s| s.counting_nan(s.max_abs_diff)),
            // an output compared exactly (tolerance 0) that differs is past it without bound,
            // for a CI that reads the multiple (it read 0.0 while predictions changed)
            output_tolerance_multiple: match output.and_then(exact_output) {
                Some(exact) if exact.differ > 0 => f64::INFINITY,
                _ => stats
                    .and_then(crate::Stats::tolerance_multiple)
                    .unwrap_or(0.0),
            },
            output_nonfinite: stats.map_or(0, crate::Stats::nonfinite_target),
            output_exact: output.and_then(exact_output),
        }
    });
    if let Some(first) = failing {
        summary.drift_origin = Some(first.name.clone());
    } else if precision_origin.is_some() {
        summary.drift_origin = precision_origin;
    }
    let undecided = layers
        .iter()
        .any(|l| l.finding == Some(Finding::Undecided) && (own(l) || summary.is_source(l)));
    summary.verdict = if !summary.defects.is_empty() {
        Verdict::Defect
    } else if undecided {
        Verdict::Undecided
    } else if summary.precision.is_some() {
        Verdict::Precision
    } else if summary.inconclusive.is_some() {
        Verdict::Inconclusive
    } else {
        Verdict::NoDrift
    };
}

/// Whether the target's own values of a layer overflow to ±Inf where the reference's are
/// finite.
pub(crate) fn overflows(layer: &Layer) -> bool {
    let own = layer.local.as_ref().or(layer.accumulated.as_ref());
    own.is_some_and(|s| s.nonfinite_target() > 0)
}

/// The output `layer` as compared exactly, where its dtype is an integer or boolean one.
fn exact_output(layer: &Layer) -> Option<crate::ExactOutput> {
    let dtype = crate::DType::from_name(&layer.dtype).ok()?;
    let stats = layer.accumulated.as_ref()?;
    (!dtype.is_float()).then(|| crate::ExactOutput {
        dtype: layer.dtype.clone(),
        differ: stats.abs_diff_above[0],
        elements: stats.elements,
    })
}
