//! Drift analysis: which layers exceed their tolerance, accumulated and locally, where drift is
//! born, and the extremes.

use std::collections::{BTreeSet, HashMap};

use crate::{Bound, DType, Layer, LayerStatus, Stats, Summary, Tolerance, WorstLayer, WorstLayers};

/// A local error at least this fraction of a layer's accumulated error means the layer added
/// that error itself; below it, the error came in through its inputs.
pub const BORN_HERE: f64 = 0.5;

/// Whether a pair of statistics exceeds a tolerance: a larger max abs diff (strictly), or NaN
/// on one side only.
/// Whether a comparison exceeds `bound`: an element beyond it (judged per element when the
/// comparison was measured against it, else by the largest difference against the absolute
/// term), or NaN on one side only.
fn beyond(stats: &Stats, bound: Bound) -> bool {
    let over = match &stats.rounding {
        Some(r) => r.beyond_tolerance > 0,
        None => stats.max_abs_diff > bound.atol,
    };
    over || stats.nan_mismatch > 0
}

/// Sets each layer's tolerance and exceedance flags, and summarises: counts, the first
/// exceeding layer, the drift origin, the worst layers.
///
/// A compared layer exceeds its tolerance when an element's difference is strictly greater than
/// its bound (`atol + rtol·|reference|`), when one side has NaN where the other has a number,
/// or when a float is compared
/// with a non-float (a bool mask against float zeros is a finding even where the values agree).
/// A shape mismatch always exceeds. The same rule on the local statistics gives `local_exceeds`,
/// except for a layer whose value is the reference's bit for bit: the target made no error of
/// its own there in this run, whatever the layer re-run alone shows.
///
/// The drift origin is the first layer whose *own* error exceeds: its local error where it was
/// measured, else its accumulated one. When the first exceeding layer comes earlier and only
/// inherited its error (an upstream difference below tolerance, amplified), the origin is traced
/// back through `local_inputs`, along the input carrying the most error, to the layer whose local
/// error makes up at least [`BORN_HERE`] of its accumulated error.
pub fn analyse(layers: &mut [Layer], tolerance: Tolerance) -> Summary {
    for layer in layers.iter_mut() {
        judge(layer, tolerance);
    }
    summarise(layers)
}

/// [`analyse`] of layers already judged (a streaming run judges each layer as soon as it is
/// compared, while its values are held). Each exceeding layer whose own error is within its
/// tolerance is attributed to the upstream layer its difference mostly comes from
/// ([`Layer::error_from`]); those layers are the summary's `sources`, which get a cause too.
pub fn summarise(layers: &mut [Layer]) -> Summary {
    let first_exceeding = layers.iter().position(|l| l.exceeds_tol);
    let origin = drift_origin(layers, first_exceeding);
    let sources = attribute(layers, origin);
    let layers = &*layers;

    let compared: Vec<&Layer> = layers.iter().filter(|l| l.accumulated.is_some()).collect();
    // An integer layer's difference (a changed prediction, 9 classes apart) is no size of
    // error beside a float's: the largest differences are the float layers', where any is.
    let floats: Vec<&Layer> = (compared.iter().copied())
        .filter(|l| crate::DType::from_name(&l.dtype).is_ok_and(|d| d.is_float()))
        .collect();
    let ranked = if floats.is_empty() {
        &compared
    } else {
        &floats
    };
    let pick = |better: fn(f64, f64) -> bool, value: fn(&Layer) -> f64| {
        ranked.iter().fold(None::<WorstLayer>, |best, l| {
            let v = value(l);
            match best {
                Some(b) if !better(v, b.value) => Some(b),
                _ => Some(WorstLayer {
                    layer: l.name.clone(),
                    value: v,
                }),
            }
        })
    };
    // a NaN on one side only is as far as values get (its difference is left out of the
    // figure, and a layer all NaN read 0)
    let max_abs =
        |l: &Layer| (l.accumulated.as_ref()).map_or(0.0, |s| s.counting_nan(s.max_abs_diff));
    let mean_abs = |l: &Layer| l.accumulated.as_ref().map_or(0.0, |s| s.mean_abs_diff);
    let mut most_own_error: Vec<WorstLayer> = layers
        .iter()
        .filter(|l| !crate::DType::from_name(&l.dtype).is_ok_and(|d| !d.is_float()))
        .filter_map(|l| {
            let own = l.local.as_ref()?.mean_abs_diff;
            (own > 0.0).then(|| WorstLayer {
                layer: l.name.clone(),
                value: own,
            })
        })
        .collect();
    most_own_error.sort_by(|a, b| b.value.total_cmp(&a.value));
    most_own_error.truncate(OWN_ERROR_RANKED);
    let warnings = coverage_warning(layers, compared.len())
        .into_iter()
        .chain(sentinel_notes(layers))
        .collect();
    Summary {
        layers_total: layers.len(),
        // a value of another shape was compared too: it exceeds, and counts among the compared
        layers_compared: compared.len()
            + (layers.iter())
                .filter(|l| l.accumulated.is_none() && l.status == LayerStatus::ShapeMismatch)
                .count(),
        layers_exceeding: layers.iter().filter(|l| l.exceeds_tol).count(),
        layers_exceeding_locally: layers.iter().filter(|l| l.local_exceeds).count(),
        layers_unmapped: layers
            .iter()
            .filter(|l| l.status == LayerStatus::Unmapped)
            .count(),
        layers_not_run: 0,
        drift_origin: origin.map(|i| layers[i].name.clone()),
        first_exceeding: first_exceeding.map(|i| layers[i].name.clone()),
        worst: WorstLayers {
            max_abs_diff: pick(|a, b| a > b, max_abs),
            mean_abs_diff: pick(|a, b| a > b, mean_abs),
            min_max_abs_diff: pick(|a, b| a < b, max_abs),
        },
        most_own_error,
        warnings,
        inconclusive: None,
        incomplete: None,
        verdict: crate::Verdict::NoDrift,
        defects: Vec::new(),
        narrow_accumulation: Vec::new(),
        approximations: Vec::new(),
        precision: None,
        sources,
    }
}

/// Sets `error_from` on every exceeding layer whose difference mostly comes from upstream (its
/// own error below [`BORN_HERE`] of it, whether or not that own error exceeds its tolerance):
/// the upstream layer it is traced back to ([`trace_back`]). Returns the layers traced
/// to, with the drift origin.
fn attribute(layers: &mut [Layer], origin: Option<usize>) -> BTreeSet<String> {
    let by_name: HashMap<String, usize> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name.clone(), i))
        .collect();
    let mut sources: BTreeSet<String> =
        origin.map(|o| layers[o].name.clone()).into_iter().collect();
    for i in 0..layers.len() {
        let l = &layers[i];
        if !(l.exceeds_tol && l.local.is_some()) {
            continue;
        }
        // A layer whose own error is within its tolerance got its difference from upstream,
        // whatever share its own rounding is.
        let from = trace_back(layers, &by_name, i, !l.local_exceeds);
        if from != i {
            let name = layers[from].name.clone();
            sources.insert(name.clone());
            layers[i].error_from = Some(name);
        }
    }
    sources
}

/// The layer the accumulated error of layer `at` was added by: walking upstream through
/// `local_inputs` along the input carrying the most error, the first layer whose own (local)
/// error makes up at least [`BORN_HERE`] of its accumulated error (or whose own error was not
/// measured, or that has no upstream carrying error). With `upstream`, layer `at` itself is not
/// taken.
fn trace_back(
    layers: &[Layer],
    by_name: &HashMap<String, usize>,
    mut at: usize,
    upstream: bool,
) -> usize {
    let start = at;
    let error = |l: &Layer, s: &Option<Stats>| {
        s.as_ref().map_or(0.0, |s| s.max_abs_diff)
            * f64::from(u8::from(l.status == LayerStatus::Compared))
    };
    loop {
        let l = &layers[at];
        let (accumulated, local) = (error(l, &l.accumulated), error(l, &l.local));
        if l.local.is_none() || (local >= BORN_HERE * accumulated && !(upstream && at == start)) {
            return at;
        }
        let upstream = l
            .local_inputs
            .iter()
            .filter_map(|n| by_name.get(n.as_str()).copied())
            .filter(|&i| i < at)
            .max_by(|&a, &b| {
                let (ea, eb) = (
                    error(&layers[a], &layers[a].accumulated),
                    error(&layers[b], &layers[b].accumulated),
                );
                ea.total_cmp(&eb).then(b.cmp(&a))
            });
        match upstream {
            Some(i) if error(&layers[i], &layers[i].accumulated) > 0.0 => at = i,
            _ => return at,
        }
    }
}

/// How many layers [`Summary::most_own_error`] ranks.
pub const OWN_ERROR_RANKED: usize = 5;

/// Below this share of compared layers a verdict says little about the model as a whole.
pub const LOW_COVERAGE: f64 = 0.5;

/// A warning when fewer than [`LOW_COVERAGE`] of the layers were compared, with the most
/// common reasons for the others.
/// How the warning about few compared layers begins.
pub const LOW_COVERAGE_WARNING: &str = "low coverage";

fn coverage_warning(layers: &[Layer], compared: usize) -> Option<String> {
    let total = layers.len();
    if total == 0 || compared == 0 || compared as f64 >= LOW_COVERAGE * total as f64 {
        return None;
    }
    Some(format!(
        "{LOW_COVERAGE_WARNING}: only {compared} of {total} layers were compared ({:.0}%), so the verdict covers part of the model; {}",
        100.0 * compared as f64 / total as f64,
        not_compared_reasons(layers)
    ))
}

/// Where the reference held a sentinel that the target held as its own extreme (see
/// [`crate::compare_pair`]): a mask's in a narrower float dtype, int64's in int32. Compared
/// as equal, which the reader should know.
fn sentinel_notes(layers: &[Layer]) -> Vec<String> {
    let (ints, floats): (Vec<&Layer>, Vec<&Layer>) = (layers.iter())
        .filter(|l| l.accumulated.as_ref().is_some_and(|s| s.sentinels > 0))
        .partition(|l| l.dtype == "int64");
    let mut notes = Vec::new();
    if let [first, ..] = floats[..] {
        notes.push(format!(
            "{} layer(s), first `{}`, hold a mask's sentinel (a dtype's extreme, as `torch.finfo(torch.float32).min`) that the target, in a dtype of another range, holds as its own extreme: those positions are compared as equal (each layer's `sentinels` count), as the softmax after treats them",
            floats.len(),
            first.name
        ));
    }
    if let [first, ..] = ints[..] {
        notes.push(format!(
            "{} layer(s), first `{}`, hold int64's extreme (a Slice's \"to the end\", INT64_MAX) that the target, computing int64 in int32, holds as int32's: those positions are compared as equal (each layer's `sentinels` count), as the op that reads it treats them; what it computes is compared after",
            ints.len(),
            first.name
        ));
    }
    notes
}

/// Why the layers that were not compared were not, most common reasons first
/// (`15 × no ONNX node carries this module's scope; 2 × …`).
pub fn not_compared_reasons(layers: &[Layer]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for layer in layers.iter().filter(|l| l.accumulated.is_none()) {
        let kind = reason_kind(layer.reason.as_deref().unwrap_or("no reason recorded"));
        match counts.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => counts.push((kind, 1)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    let shown: Vec<String> = counts
        .iter()
        .take(3)
        .map(|(kind, n)| format!("{n} × {kind}"))
        .collect();
    format!("not compared: {}", shown.join("; "))
}

/// A reason as a kind: the names it quotes left out (`fused into `…` at export
/// (FuseBatchNormIntoConv)`), so that reasons that differ only by the layer count as one; its
/// first clause, at most about 90 characters, cut at a word.
fn reason_kind(reason: &str) -> String {
    let unnamed: String = reason
        .split('`')
        .enumerate()
        .map(|(i, piece)| if i % 2 == 1 { "…" } else { piece })
        .collect::<Vec<_>>()
        .join("`");
    let clause = unnamed
        .split(": ")
        .next()
        .unwrap_or(&unnamed)
        .trim_end_matches(':');
    if clause.chars().count() <= 90 {
        return clause.to_string();
    }
    let cut: String = clause.chars().take(90).collect();
    format!(
        "{}…",
        cut.rsplit_once(' ').map_or(cut.as_str(), |(head, _)| head)
    )
}

/// Why a run that compared nothing cannot give a verdict, or `None` when it compared something.
/// Such a run is not a clean result: the flows turn this into an error (exit 2).
pub fn nothing_compared(layers: &[Layer], summary: &Summary) -> Option<String> {
    (summary.layers_compared == 0).then(|| {
        format!(
            "compared no layer: none of the {} layers could be paired with a value on the target side, so there is no verdict ({})",
            layers.len(),
            not_compared_reasons(layers)
        )
    })
}

/// Sets one layer's tolerance and its exceedance flags (`exceeds_tol`, `local_exceeds`), from
/// its own statistics: a streaming run judges each layer as soon as it is compared.
pub fn judge(layer: &mut Layer, tolerance: Tolerance) {
    layer.tolerance = tolerance.for_layer_on(
        &layer.dtype,
        layer.target_dtype.as_deref(),
        layer.float64.as_ref().map(|f| f.reference),
        layer.quantization.as_ref(),
    );
    let kind_differs = layer.target_dtype.as_deref().is_some_and(|t| {
        let float = |n: &str| DType::from_name(n).is_ok_and(DType::is_float);
        float(t) != float(&layer.dtype)
    });
    layer.exceeds_tol = match (&layer.status, &layer.accumulated) {
        (LayerStatus::Compared, Some(s)) => beyond(s, layer.tolerance) || kind_differs,
        (LayerStatus::ShapeMismatch, _) => true,
        _ => false,
    };
    // A value the target computed bit for bit as the reference did has no error of its own in
    // this run: what the layer re-run alone differs by is how the runtime computes a piece of a
    // graph (ONNX Runtime's CPU provider keeps a chain of float16 nodes in float32 in a whole
    // graph, and rounds a piece's inputs to float16), not an error the target made here.
    let as_reference = layer.status == LayerStatus::Compared
        && !kind_differs
        && layer
            .accumulated
            .as_ref()
            .is_some_and(|s| s.max_abs_diff == 0.0 && s.nan_mismatch == 0);
    layer.local_exceeds = !as_reference
        && layer
            .local
            .as_ref()
            .is_some_and(|s| beyond(s, layer.tolerance));
}

/// The drift origin, as [`analyse`] defines it.
fn drift_origin(layers: &[Layer], first_exceeding: Option<usize>) -> Option<usize> {
    let own_exceeds = |l: &Layer| {
        if l.local.is_some() {
            l.local_exceeds || l.status == LayerStatus::ShapeMismatch
        } else {
            l.exceeds_tol
        }
    };
    let first_own = layers.iter().position(own_exceeds);
    let Some(first) = first_exceeding else {
        return first_own;
    };
    if first_own.is_some_and(|o| o <= first) {
        return first_own;
    }
    // The first exceeding layer inherited its error: follow the error upstream.
    let by_name: HashMap<String, usize> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name.clone(), i))
        .collect();
    Some(trace_back(layers, &by_name, first, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, TensorView, compare_pair};

    fn layer(name: &str, reference: TensorView<'_>, target: TensorView<'_>) -> Layer {
        let outcome = compare_pair(reference, target, None);
        let mut layer = Layer::new(0, name, reference.shape.to_vec(), reference.dtype.name());
        layer.status = outcome.status;
        layer.target_shape = outcome.target_shape;
        layer.target_dtype = outcome.target_dtype;
        layer.accumulated = outcome.stats;
        layer
    }

    #[test]
    fn a_reason_not_to_compare_counts_by_its_kind_and_says_what_kind() {
        let reasons = [
            "fused into `bn1` at export (FuseBatchNormIntoConv): the Conv node `conv1` computes both",
            "fused into `layer1.0.bn1` at export (FuseBatchNormIntoConv): the Conv node `c` computes both",
            "call 1 of `layer1.0.relu`, but the graph holds 2 output(s) for that module, none of them a float32 value of 9 elements",
        ];
        let layers: Vec<Layer> = reasons
            .iter()
            .map(|r| {
                let mut l = Layer::new(0, "x", vec![1], "float32");
                l.reason = Some(r.to_string());
                l
            })
            .collect();
        assert_eq!(
            not_compared_reasons(&layers),
            "not compared: 2 × fused into `…` at export (FuseBatchNormIntoConv); 1 × call 1 of `…`, but the graph holds 2 output(s) for that module, none of them a float32…"
        );
    }

    #[test]
    fn a_layer_all_nan_on_one_side_is_the_largest_difference_not_none() {
        let t = |v: &[f64]| crate::Tensor::from_f64(DType::F32, v);
        let (fine, near, nan) = (t(&[1.0, 2.0]), t(&[1.0, 2.5]), t(&[f64::NAN, f64::NAN]));
        let mut layers = vec![
            layer("drifts", fine.view(), near.view()),
            layer("all NaN", fine.view(), nan.view()),
        ];
        let summary = analyse(&mut layers, Tolerance::Fixed(1e-4));
        let worst = summary.worst.max_abs_diff.unwrap();
        assert_eq!(
            (worst.layer.as_str(), worst.value),
            ("all NaN", f64::INFINITY)
        );
    }

    #[test]
    fn a_value_the_reference_s_bit_for_bit_has_no_local_error_of_its_own() {
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (values, apart) = (bytes(&[1.0, 2.0, 3.0, 4.0]), bytes(&[1.0, 2.0, 3.0, 4.5]));
        let shape = [4];
        let v = |b: &[u8]| crate::Tensor::new("t", DType::F32, shape.to_vec(), b.to_vec()).unwrap();
        let (same, off) = (v(&values), v(&apart));
        let mut layers = vec![
            layer("whole run agrees", same.view(), same.view()),
            layer("whole run differs", same.view(), off.view()),
        ];
        // both re-run alone off by 0.5
        for l in &mut layers {
            l.local = compare_pair(same.view(), off.view(), None).stats;
        }
        let summary = analyse(&mut layers, Tolerance::Fixed(1e-4));
        assert!(
            !layers[0].local_exceeds,
            "its value is the reference's bit for bit"
        );
        assert!(layers[1].local_exceeds);
        assert_eq!(summary.layers_exceeding_locally, 1);
        assert_eq!(summary.drift_origin.as_deref(), Some("whole run differs"));
    }

    #[test]
    fn origin_is_the_first_exceeding_layer_and_a_dtype_change_is_a_finding() {
        let zeros_f32 = [0u8; 16];
        let zeros_bool = [0u8; 4];
        let small = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>();
        let shifted = [1.0f32, 2.0, 3.0, 4.001]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>();
        let shape = [4];
        fn v<'a>(dtype: DType, shape: &'a [usize], bytes: &'a [u8]) -> TensorView<'a> {
            TensorView::new("t", dtype, shape, bytes).unwrap()
        }
        let mut layers = vec![
            layer(
                "same",
                v(DType::F32, &shape, &small),
                v(DType::F32, &shape, &small),
            ),
            layer(
                "mask",
                v(DType::F32, &shape, &zeros_f32),
                v(DType::Bool, &shape, &zeros_bool),
            ),
            layer(
                "drift",
                v(DType::F32, &shape, &small),
                v(DType::F32, &shape, &shifted),
            ),
        ];
        let summary = analyse(&mut layers, Tolerance::Fixed(1e-4));
        assert_eq!(layers[1].accumulated.as_ref().unwrap().max_abs_diff, 0.0);
        assert!(
            layers[1].exceeds_tol,
            "bool vs float32 is a finding although the values agree"
        );
        assert_eq!(summary.drift_origin.as_deref(), Some("mask"));
        assert_eq!(summary.layers_exceeding, 2);
        assert_eq!(summary.worst.max_abs_diff.unwrap().layer, "drift");
    }
}
