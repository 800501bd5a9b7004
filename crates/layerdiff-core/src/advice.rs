//! Keep-in-float32 advice: when a target computes in a lower precision (float16, bfloat16,
//! int8) and drifts, the layers that should stay in float32, each with why, and what keeping
//! them did when the comparison was re-run that way.

use crate::{AdviceCheck, KeepFloat32, KeptLayer, Layer, LayerStatus, Report, Stats};

/// At most this many layers are advised: the advice is meant to be acted on, and keeping most
/// of a model in float32 is not a lower-precision deployment any more.
pub const MOST_KEPT: usize = 8;

/// Lower-precision dtypes, lowest first in nothing but name.
fn lower(dtype: &str) -> bool {
    matches!(dtype, "float16" | "bfloat16" | "int8" | "uint8")
}

/// The precision a target computes in below the reference's, read off its layers (the most
/// common lower target dtype), or `int8` where the caller knows the target is quantized.
pub fn lower_precision_of(report: &Report) -> Option<String> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for l in &report.layers {
        if let Some(t) = l.target_dtype.as_deref().filter(|t| lower(t)) {
            match counts.iter_mut().find(|(d, _)| d == t) {
                Some((_, n)) => *n += 1,
                None => counts.push((t.to_string(), 1)),
            }
        }
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(dtype, _)| dtype)
}

/// Elements that overflowed to ±Inf on the target where the reference is finite (a NaN that
/// follows is counted by the caller).
fn overflowed(stats: Option<&Stats>) -> u64 {
    stats.map_or(0, |s| s.inf_target.saturating_sub(s.inf_reference))
}

fn ratio(stats: Option<&Stats>) -> f64 {
    stats.and_then(Stats::tolerance_multiple).unwrap_or(0.0)
}

/// The layers a target computing in `precision` should keep in float32, among those whose
/// difference is precision (a defect is fixed by what its cause says, not by a wider dtype):
/// those that overflow to Inf themselves, those whose own error (local, where measured) exceeds
/// the tolerance, and the precision drift's origin, where rounding that then grows downstream is
/// born (or whose rounding it amplifies); overflow first, then by own error against the
/// tolerance, at most [`MOST_KEPT`]. `None` when no precision drift was found, or none reaches
/// a layer's value (a layer's own re-run past its tolerance while every value stays within its
/// own is no drift to remove), or the output stays within its tolerance.
pub fn keep_float32(report: &Report, precision: &str) -> Option<KeepFloat32> {
    let drift = report.summary.precision.as_ref()?;
    if report.summary.layers_exceeding == 0 {
        return None;
    }
    // An output within its tolerance has no drift a float32 layer would remove: nothing is
    // advised or tried (a float16 CNN whose output is at 0.3× its tolerance was "tried in
    // float32, without help").
    let output_fine = drift.output_tolerance_multiple <= 1.0
        && drift.output_nonfinite == 0
        && drift.overflow == 0
        && drift.output_exact.as_ref().is_none_or(|e| e.differ == 0);
    if output_fine {
        return None;
    }
    // A reference that rounds as coarsely itself (a bfloat16 reference of a float16 target):
    // the drift is its rounding, which no target layer kept in float32 takes away.
    let wanted = crate::DType::from_name(precision).ok()?;
    let coarse_reference = report.layers.iter().any(|l| {
        l.target_dtype.as_deref() == Some(precision)
            && crate::DType::from_name(&l.dtype).is_ok_and(|r| !wanted.narrower_than(r))
    });
    if coarse_reference {
        return None;
    }
    // whose rounding the drift is: the origin's own, or the one it amplifies
    let origin = drift.source.as_deref().or(drift.origin.as_deref());
    let mut ranked: Vec<(u64, f64, &Layer, String)> = Vec::new();
    // A layer of indices (ArgMax) rounds nothing itself: its inputs' rounding is what kept
    // float32 upstream removes.
    let rounds = |l: &Layer| crate::DType::from_name(&l.dtype).is_ok_and(|d| d.is_float());
    for l in report.layers.iter().filter(|l| {
        l.status == LayerStatus::Compared
            && l.finding == Some(crate::Finding::Precision)
            && rounds(l)
    }) {
        // Its own error: the local one; without a local run (a run that measures none), the
        // accumulated one of a layer that did not merely inherit it. A layer with no nodes of
        // its own (it holds another layer's value) has none to keep.
        let own = match (&l.local, report.mode.as_str()) {
            (Some(local), _) => Some(local),
            (None, "local") => None,
            (None, _) if l.cause == Some(crate::Cause::Inherited) => None,
            (None, _) => l.accumulated.as_ref(),
        };
        let inf = overflowed(own) + own.map_or(0, |s| s.nan_mismatch);
        let own_ratio = ratio(own);
        let is_origin = origin == Some(l.name.as_str());
        let own_exceeds = l.local_exceeds || (l.local.is_none() && own.is_some() && l.exceeds_tol);
        if own.is_none() || (inf == 0 && !own_exceeds && !is_origin) {
            continue;
        }
        let mut why = Vec::new();
        if inf > 0 {
            why.push(format!(
                "overflows {precision}'s range: {inf} element(s) Inf or NaN where float32 is finite"
            ));
        }
        if own_exceeds && inf == 0 {
            why.push(format!(
                "its own error is {own_ratio:.1}× the tolerance (max abs diff {:.3e})",
                own.map_or(0.0, |s| s.max_abs_diff)
            ));
        }
        if is_origin {
            why.push(match (&drift.source, &drift.origin) {
                (Some(_), Some(past)) => {
                    format!("its rounding is what takes `{past}` past the tolerance downstream")
                }
                _ => "the drift is born here and grows downstream".to_string(),
            });
        }
        ranked.push((inf, own_ratio, l, why.join("; ")));
    }
    // Overflowing layers first, in execution order (the first is where it starts), then by
    // own error against the tolerance.
    ranked.sort_by(|a, b| {
        (b.0 > 0)
            .cmp(&(a.0 > 0))
            .then(if a.0 > 0 {
                a.2.index.cmp(&b.2.index)
            } else {
                b.1.total_cmp(&a.1)
            })
            .then(a.2.index.cmp(&b.2.index))
    });
    let layers = ranked
        .into_iter()
        .take(MOST_KEPT)
        .map(|(_, _, l, why)| KeptLayer {
            layer: l.name.clone(),
            nodes: l
                .location
                .as_ref()
                .map(|o| o.nodes.clone())
                .unwrap_or_default(),
            why,
        })
        .collect();
    Some(KeepFloat32 {
        precision: precision.to_string(),
        layers,
        check: None,
    })
}

/// The last compared layer's statistics.
fn output(report: &Report) -> Option<(&str, &Stats)> {
    report
        .layers
        .iter()
        .rev()
        .find_map(|l| Some((l.name.as_str(), l.accumulated.as_ref()?)))
}

/// The output's error in words: NaN/Inf where there is, else its largest difference.
fn output_words(s: Option<&Stats>) -> String {
    match s {
        None => "not compared".to_string(),
        Some(s) if s.nonfinite_target() > 0 => {
            format!(
                "NaN or Inf in {} of {} elements",
                s.nonfinite_target(),
                s.elements
            )
        }
        Some(s) if s.nan_mismatch > 0 => format!(
            // the elements compared may agree; the output does not
            "NaN on the reference in {} of {} elements, numbers on the target",
            s.nan_mismatch, s.elements
        ),
        Some(s) => format!(
            "mean abs diff {:.3e} (max {:.3e})",
            s.mean_abs_diff, s.max_abs_diff
        ),
    }
}

/// The layers a lower-precision run checks by running again with them kept in float32: the
/// user's (`given`), else those the plain run's advice names (none: nothing to check).
pub fn layers_to_check(plain: &Report, given: &[String]) -> Vec<String> {
    if !given.is_empty() {
        return given.to_vec();
    }
    let advised = plain.keep_float32.iter().flat_map(|k| &k.layers);
    advised.map(|k| k.layer.clone()).collect()
}

/// The run a checked lower-precision comparison reports, with the check of keeping `kept` in
/// float32 added: the run with them kept when the user named them (`given`: that is the run
/// asked for), else the plain run, whose advice the check answers.
pub fn advice_checked(
    plain: &Report,
    with_kept: &Report,
    kept: Vec<String>,
    given: bool,
    precision: &str,
) -> Report {
    let check = check_advice(plain, with_kept, kept);
    let mut report = if given { with_kept } else { plain }.clone();
    let keep = report.keep_float32.get_or_insert_with(|| KeepFloat32 {
        precision: precision.to_string(),
        layers: Vec::new(),
        check: None,
    });
    keep.check = Some(check);
    report
}

/// What keeping `kept` in float32 did: `before` the run at the lower precision, `after` the same
/// comparison with those layers kept.
pub fn check_advice(before: &Report, after: &Report, kept: Vec<String>) -> AdviceCheck {
    let (name, was) = output(before).map_or(("", None), |(n, s)| (n, Some(s)));
    let now = after
        .layers
        .iter()
        .find(|l| l.name == name)
        .and_then(|l| l.accumulated.as_ref());
    let (b, a) = (
        before.summary.layers_exceeding,
        after.summary.layers_exceeding,
    );
    let bad = |s: Option<&Stats>| s.map_or(0, Stats::nonfinite_target);
    // the verdict weighs the finite elements' mean beside the NaN or Inf counted apart; the
    // figures written count a NaN on one side as unbounded (`Stats::counting_nan`)
    // an index output (a classifier's prediction) is judged by how many of its elements
    // differ, not by how many classes apart they land
    let exact = (before.layers.iter())
        .any(|l| l.name == name && crate::DType::from_name(&l.dtype).is_ok_and(|d| !d.is_float()));
    let mean = |s: Option<&Stats>| {
        s.map_or(f64::NAN, |s| {
            if exact {
                s.abs_diff_above[0] as f64
            } else {
                s.mean_abs_diff
            }
        })
    };
    let written = |s: Option<&Stats>, figure: fn(&Stats) -> f64| {
        s.map_or(f64::NAN, |s| s.counting_nan(figure(s)))
    };
    let words = |s: Option<&Stats>| match s {
        Some(s) if exact => format!(
            "differs in {} of {} elements",
            s.abs_diff_above[0], s.elements
        ),
        _ => output_words(s),
    };
    let change = format!("`{name}` {} → {}", words(was), words(now));
    let n = kept.len();
    let removes = after.summary.drift_origin.is_none() && a == 0;
    let reduces =
        bad(now) < bad(was) || (bad(now) == 0 && mean(was) > 0.0 && mean(now) <= mean(was) * 0.5);
    // exceeding layers of the plain run that were NaN or Inf on the target: kept layers that
    // end an overflow make them numbers, which may still exceed
    let nonfinite = (before.layers.iter())
        .filter(|l| {
            l.exceeds_tol
                && l.accumulated
                    .as_ref()
                    .is_some_and(|s| s.nonfinite_target() > 0)
        })
        .count();
    let verdict = if removes {
        format!(
            "keeping {n} layer(s) in float32 removes the drift: no layer exceeds its tolerance (was {b}); {change}"
        )
    } else if bad(now) < bad(was) && a > b {
        let finite = if bad(now) == 0 {
            "makes the output finite"
        } else {
            "leaves fewer NaN or Inf in the output"
        };
        format!(
            "keeping {n} layer(s) in float32 {finite}: {change}; more layers exceed their tolerance, {a} (was {b}, {nonfinite} of them NaN or Inf on the target, now numbers that still differ)"
        )
    } else if reduces {
        format!(
            "keeping {n} layer(s) in float32 reduces the drift: {a} layers exceed (was {b}); {change}"
        )
    } else if bad(now) == bad(was) && mean(now) < mean(was) {
        format!(
            "keeping {n} layer(s) in float32 helps little: {a} layers exceed (was {b}); {change}: the drift is spread over the model, not born in a few layers"
        )
    } else {
        format!(
            "keeping {n} layer(s) in float32 does not help: {a} layers exceed (was {b}); {change}: the drift is spread over the model, not born in a few layers"
        )
    };
    AdviceCheck {
        kept,
        exceeding_before: b,
        exceeding_after: a,
        output: name.to_string(),
        output_max_abs_diff_before: written(was, |s| s.max_abs_diff),
        output_max_abs_diff_after: written(now, |s| s.max_abs_diff),
        output_mean_abs_diff_before: written(was, |s| s.mean_abs_diff),
        output_mean_abs_diff_after: written(now, |s| s.mean_abs_diff),
        output_nonfinite_before: bad(was),
        output_nonfinite_after: bad(now),
        drift_origin_after: after.summary.drift_origin.clone(),
        helps: removes || reduces,
        verdict,
    }
}

#[cfg(test)]
mod tests;
