//! Causes: why a layer differs, from a fixed vocabulary, each with a sentence of detail.
//!
//! The flows gather [`Evidence`] per layer (they know the graphs, weights and runtimes); this
//! module only decides, in a fixed order, for every layer that exceeds its tolerance (accumulated
//! or local) and for the drift origin:
//!
//! 1. `inherited`: its own (local) error is within tolerance; the difference came from upstream;
//! 2. `layout_permutation`: permuting the target onto the reference restores agreement;
//! 3. `nondeterminism`: a side run twice disagrees with itself here by more than the tolerance;
//! 4. `weight_mismatch`: a parameter or initializer the layer uses differs between the sides;
//! 5. `precision_loss`: the layer ran in lower precision on the target, values overflowing its
//!    range to Inf included (unless its own error, finite, averages more ULPs of that precision than rounding explains, [`PRECISION_ULPS`]: then
//!    `op_implementation`);
//! 6. `op_implementation` (an attribute): an attribute of the target's nodes differs;
//! 7. `rounding`: the float64 truth shows the target no further from it than twice the
//!    reference's own distance, or within its dtype's absolute tolerance of it: the target
//!    rounds, and computes nothing wrong;
//! 8. `precision_loss` (reduced math): the target's runtime does this float32 layer's products
//!    in lower precision (TF32 on a GPU), and the float64 truth, where there is one, shows the
//!    target further from it than rounding;
//! 9. `rounding` (no truth): an origin whose own error stays within its tolerance, with nothing
//!    else different, only rounds; a later layer amplifies it past the tolerance;
//! 10. `op_implementation` (a kernel): with the same inputs, weights and attributes, the target's
//!     nodes still compute something else (its local error exceeds);
//! 11. `unknown`: nothing fits; the detail says what was ruled out (an origin whose own
//!     computation agrees, its inputs differing from computation no compared layer covers).

use crate::{DType, Layer, LayoutFinding, Summary, TensorView};

/// A target at most this many times as far from the float64 truth as the reference is only
/// rounding, as the reference does (the same factor that makes the two "about equally far").
pub const ROUNDING_FACTOR: f64 = 2.0;

/// A layer the target computes in a narrower dtype whose own (local) error averages more than
/// this many ULPs of that dtype computes something its precision does not explain. Honest
/// float16 and bfloat16 kernels in real models (ResNet-18, BERT, ViT-B/16, ConvNeXt, a
/// transformer encoder; attention blocks rounding several times included) average at most about
/// 6; a Linear that drops its bias averages over 60.
pub const PRECISION_ULPS: f64 = 16.0;

/// The mean ULPs of `dtype` by which the layer's own error exceeds its precision's rounding,
/// when it does (and exceeds its tolerance).
fn beyond_precision(layer: &Layer, dtype: DType) -> Option<f64> {
    let rounding = layer.local.as_ref()?.rounding.as_ref()?;
    (layer.local_exceeds
        && rounding.grid == dtype.name()
        && rounding.mean_ulp_diff > PRECISION_ULPS)
        .then_some(rounding.mean_ulp_diff)
}

/// What a flow found out about one layer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// A permutation under which the sides agree.
    pub layout: Option<LayoutFinding>,
    /// A side that disagrees with itself when run twice, and by how much (max abs diff).
    pub self_disagreement: Option<(String, f64)>,
    /// Parameters or initializers used by the layer that differ, with their difference.
    pub weights: Vec<String>,
    /// How the target lowers precision here (`the target's values lie on the float16 grid`).
    pub precision: Option<String>,
    /// Attributes that differ between the sides' nodes (`` `epsilon` 1e-05 → 0.1 ``).
    pub attributes: Vec<String>,
    /// The target's op types in the re-run group, for the kernel sentence (`Conv`).
    pub ops: Vec<String>,
    /// How the target's runtime does this group's float32 math in lower precision (TF32 on a
    /// GPU), in words.
    pub reduced_math: Option<String>,
}

impl Evidence {
    /// The target's ops in the group, for a sentence (`Conv → Relu`; `nodes` when unknown).
    fn ops_words(&self) -> String {
        if self.ops.is_empty() {
            "nodes".to_string()
        } else {
            self.ops.join(" → ")
        }
    }

    /// What the two values of an exceeding layer show by themselves: a layout permutation, or
    /// target values on a lower-precision grid.
    pub fn from_values(layer: &Layer, reference: TensorView<'_>, target: TensorView<'_>) -> Self {
        let mut evidence = Self::default();
        if !(layer.exceeds_tol || layer.local_exceeds) {
            return evidence;
        }
        if layer.target_dtype.is_none() {
            evidence.layout = crate::detect_layout(reference, target, layer.tolerance.atol);
        }
        evidence.precision = precision_grid(reference, target).map(|grid| {
            format!(
                "the target's values lie on the {grid} grid: it computed or stored them in {grid}"
            )
        });
        evidence
    }
}

/// Sets `cause` and `detail` on every layer that exceeds its tolerance and on the drift origin.
/// `evidence` is indexed like `layers` (missing entries mean no evidence).
pub fn explain(layers: &mut [Layer], evidence: &[Evidence], summary: &Summary) {
    let none = Evidence::default();
    let origin = summary.drift_origin.as_deref();
    let max = |l: &Layer| l.accumulated.as_ref().map_or(0.0, |s| s.max_abs_diff);
    // The first exceeding layer's difference and tolerance, to say how it came to exceed.
    let first = summary.first_exceeding.as_deref().and_then(|name| {
        let l = layers.iter().find(|l| l.name == name)?;
        Some((max(l), l.tolerance))
    });
    for (i, layer) in layers.iter_mut().enumerate() {
        if !summary.needs_cause(layer) {
            continue;
        }
        let is_origin = origin == Some(layer.name.as_str());
        let e = evidence.get(i).unwrap_or(&none);
        let (cause, mut detail) = decide(layer, e, origin, is_origin);
        if is_origin && !layer.exceeds_tol && !layer.local_exceeds {
            let name = summary
                .first_exceeding
                .as_deref()
                .unwrap_or("a later layer");
            // Not amplified when the difference arrives about as large: the later layer is
            // held to a tighter tolerance (it computes in a wider dtype again).
            let how = match first {
                Some((d, tol)) if d <= 1.5 * max(layer) && tol != layer.tolerance => format!(
                    "is carried downstream to `{name}`, which computes in a wider dtype again and exceeds its tighter tolerance {tol} with it"
                ),
                _ => format!("is amplified downstream until `{name}` exceeds it"),
            };
            detail = format!(
                "{detail}; on its own this stays within the tolerance {} and {how}",
                layer.tolerance
            );
        }
        if !matches!(cause, "inherited" | "rounding")
            && let Some(f) = &layer.float64
        {
            detail = format!("{detail}; {}", f.verdict());
        }
        layer.permutation = match cause {
            "layout_permutation" => e.layout.as_ref().map(|l| l.permutation.clone()),
            _ => None,
        };
        layer.cause = Some(cause.to_string());
        layer.detail = Some(detail);
    }
}

fn decide(
    layer: &Layer,
    e: &Evidence,
    origin: Option<&str>,
    is_origin: bool,
) -> (&'static str, String) {
    let max = |s: &Option<crate::Stats>| s.as_ref().map_or(0.0, |s| s.max_abs_diff);
    let tol = layer.tolerance;
    if layer.local.is_some() && !layer.local_exceeds && !is_origin {
        let from = origin.map_or(String::new(), |o| format!(", born at `{o}`"));
        return (
            "inherited",
            format!(
                "its own error (local max abs diff {:.3e}) is within the tolerance {tol}; the difference ({:.3e}) comes from upstream{from}",
                max(&layer.local),
                max(&layer.accumulated)
            ),
        );
    }
    if let Some(found) = &e.layout {
        return ("layout_permutation", found.detail());
    }
    if let Some((side, d)) = &e.self_disagreement
        && *d > tol.atol
    {
        return (
            "nondeterminism",
            format!("the {side} run twice disagrees with itself here by up to {d:.3e}"),
        );
    }
    if !e.weights.is_empty() {
        return ("weight_mismatch", e.weights.join("; "));
    }
    let lower = layer
        .target_dtype
        .as_deref()
        .and_then(|t| DType::from_name(t).ok())
        .filter(|t| DType::from_name(&layer.dtype).is_ok_and(|r| t.narrower_than(r)));
    if let Some(t) = lower {
        let own = layer.local.as_ref().or(layer.accumulated.as_ref());
        let overflowed = own.map_or(0, |s| s.inf_target.saturating_sub(s.inf_reference));
        if overflowed > 0 {
            return (
                "precision_loss",
                format!(
                    "the target computes this layer in {t}, the reference in {}, and {overflowed} of its values overflow {t}'s range to ±Inf where the reference's are finite: keep it in {}",
                    layer.dtype, layer.dtype
                ),
            );
        }
        if let Some(ulps) = beyond_precision(layer, t) {
            let ops = e.ops_words();
            return (
                "op_implementation",
                format!(
                    "the target computes this layer in {t}, yet its own error averages {ulps:.1} ULPs of {t} (local), more than its rounding explains (at most {PRECISION_ULPS}): the target's {ops} computes differently"
                ),
            );
        }
        return (
            "precision_loss",
            format!(
                "the target computes this layer in {t}, the reference in {}",
                layer.dtype
            ),
        );
    }
    if let Some(how) = &e.precision {
        return ("precision_loss", how.clone());
    }
    if !e.attributes.is_empty() {
        return (
            "op_implementation",
            format!("an attribute differs: {}", e.attributes.join(", ")),
        );
    }
    if let Some(f) = &layer.float64 {
        let within = crate::lower_precision(&layer.dtype, layer.target_dtype.as_deref())
            .map_or(0.0, |d| crate::default_for(d).atol);
        if f.target <= ROUNDING_FACTOR * f.reference && f.reference > 0.0 {
            return ("rounding", f.verdict());
        }
        if f.target <= within {
            return (
                "rounding",
                format!(
                    "the target is further from float64 than the reference (target {:.2e}, reference {:.2e}) but within its dtype's rounding of it ({within:e}): rounding, not a bug",
                    f.target, f.reference
                ),
            );
        }
    }
    if let Some(how) = &e.reduced_math
        && layer.dtype == "float32"
    {
        return ("precision_loss", how.clone());
    }
    if let Some(local) = &layer.local
        && layer.float64.is_none()
        && !layer.local_exceeds
        && !layer.exceeds_tol
    {
        return (
            "rounding",
            format!(
                "the target rounds here as its dtype allows, and nothing else differs (local max abs diff {:.3e})",
                local.max_abs_diff
            ),
        );
    }
    if let Some(local) = &layer.local
        && !layer.local_exceeds
        && is_origin
    {
        return (
            "unknown",
            format!(
                "its own computation agrees (local max abs diff {:.3e}, within the tolerance {tol}), yet its inputs already differ by more than any compared layer before it shows: the difference is born in computation no compared layer covers (code a module runs outside its submodules)",
                local.max_abs_diff
            ),
        );
    }
    if let Some(local) = &layer.local {
        let ops = e.ops_words();
        return (
            "op_implementation",
            format!(
                "same inputs, weights and attributes, yet the target's {ops} computes differently (local max abs diff {:.3e})",
                local.max_abs_diff
            ),
        );
    }
    let not_measured = layer.local_reason.as_deref().unwrap_or("it was not re-run");
    let upstream = match origin {
        Some(o) if o != layer.name => format!("; drift is already present upstream at `{o}`"),
        _ => String::new(),
    };
    (
        "unknown",
        format!(
            "ruled out: layout permutation, nondeterminism, differing weights, lower precision, differing attributes; its own error was not measured ({not_measured}){upstream}"
        ),
    )
}

/// Elements [`precision_grid`] looks at: a float32 value off a 10-bit grid lands on it by
/// chance about once in 8192, so this many on it is no chance.
pub const GRID_SAMPLE: usize = 4096;
/// The sample is taken in evenly spaced runs of this many neighbours (a few cache lines each,
/// where single elements far apart would each cost a trip to memory).
const GRID_RUN: usize = 64;

/// Whether the target's values lie on a lower-precision grid the reference's do not: every
/// finite target value of an even sample ([`GRID_SAMPLE`]) survives a round trip through
/// float16 (or bfloat16), while fewer than half of the reference's do. Names the grid.
pub fn precision_grid(reference: TensorView<'_>, target: TensorView<'_>) -> Option<&'static str> {
    let bits = target.dtype.mantissa_bits()?;
    // The coarser grid first: bfloat16 values within float16's range are float16 values too.
    type Grid = (&'static str, u32, fn(f64) -> f64);
    let grids: [Grid; 2] = [
        ("bfloat16", 8, |v| half::bf16::from_f64(v).to_f64()),
        ("float16", 11, |v| half::f16::from_f64(v).to_f64()),
    ];
    let n = target.numel().min(reference.numel());
    if n == 0 {
        return None;
    }
    // Where each run starts: spread over the whole tensor, or the whole of a small one.
    let runs = GRID_SAMPLE / GRID_RUN;
    let starts: Vec<usize> = if n <= GRID_SAMPLE {
        (0..n).step_by(GRID_RUN).collect()
    } else {
        (0..runs).map(|k| k * (n - GRID_RUN) / (runs - 1)).collect()
    };
    let sample = |view: &TensorView<'_>| {
        let size = view.dtype.size();
        let mut values = Vec::with_capacity(GRID_SAMPLE);
        let mut run = [0.0f64; GRID_RUN];
        for &start in &starts {
            let len = GRID_RUN.min(n - start);
            let bytes = &view.bytes[start * size..(start + len) * size];
            crate::compare::decode(view.dtype, bytes, &mut run[..len]);
            values.extend_from_slice(&run[..len]);
        }
        values
    };
    let (t_values, r_values) = (sample(&target), sample(&reference));
    grids.into_iter().find_map(|(name, grid_bits, round)| {
        if grid_bits >= bits {
            return None;
        }
        let on = |values: &[f64]| {
            values
                .iter()
                .filter(|v| v.is_finite() && **v != 0.0)
                .map(|&v| round(v) == v)
                .fold((0usize, 0usize), |(on, all), hit| {
                    (on + usize::from(hit), all + 1)
                })
        };
        let (t_on, t_all) = on(&t_values);
        let (r_on, r_all) = on(&r_values);
        (t_all > 0 && t_on == t_all && 2 * r_on < r_all).then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LayerStatus, Stats, Tolerance, analyse, compare};

    /// Statistics whose max abs diff is `d`.
    fn stats(d: f64) -> Stats {
        let (r, t) = (0f32.to_le_bytes(), (d as f32).to_le_bytes());
        let shape = [1];
        compare(
            TensorView::new("r", DType::F32, &shape, &r).unwrap(),
            TensorView::new("t", DType::F32, &shape, &t).unwrap(),
        )
        .unwrap()
    }

    fn layer(index: usize, accumulated: f64, local: Option<f64>, inputs: &[&str]) -> Layer {
        let mut l = Layer::new(index, format!("l{index}"), vec![1], "float32");
        l.status = LayerStatus::Compared;
        l.accumulated = Some(stats(accumulated));
        l.local = local.map(stats);
        l.local_inputs = inputs.iter().map(|s| s.to_string()).collect();
        l
    }

    #[test]
    fn a_kernel_no_further_from_float64_than_the_reference_is_rounding() {
        let judged = |reference: f64, target: f64| {
            let mut layers = vec![layer(0, 5e-4, Some(5e-4), &["x"])];
            layers[0].float64 = Some(crate::Float64Distance { reference, target });
            let summary = analyse(&mut layers, Tolerance::PerDtype);
            explain(&mut layers, &[Evidence::default()], &summary);
            (
                layers[0].cause.clone().unwrap(),
                layers[0].detail.clone().unwrap(),
            )
        };
        let (cause, detail) = judged(1.8e-4, 5.7e-5);
        assert_eq!(
            cause, "rounding",
            "the target is the closer of the two: {detail}"
        );
        assert!(detail.contains("the target is closer to the truth"));
        assert_eq!(judged(2.5e-4, 3e-4).0, "rounding", "about equally far");
        let (cause, detail) = judged(5e-6, 6e-5);
        assert_eq!(
            cause, "rounding",
            "further, but within float32 rounding of the truth"
        );
        assert!(detail.contains("within its dtype's rounding"), "{detail}");
        let (cause, detail) = judged(1e-4, 6e-4);
        assert_eq!(cause, "op_implementation");
        assert!(detail.ends_with("the target is off"), "{detail}");
    }

    #[test]
    fn tf32_products_are_precision_loss_unless_the_truth_calls_them_rounding() {
        let tf32 = Evidence {
            reduced_math: Some("MatMul: the provider multiplies float32 in TF32".into()),
            ..Evidence::default()
        };
        let judged = |truth: Option<(f64, f64)>, dtype: &str| {
            let mut layers = vec![layer(0, 5e-3, Some(5e-3), &["x"])];
            layers[0].dtype = dtype.to_string();
            layers[0].float64 =
                truth.map(|(reference, target)| crate::Float64Distance { reference, target });
            let summary = analyse(&mut layers, Tolerance::PerDtype);
            explain(&mut layers, std::slice::from_ref(&tf32), &summary);
            (
                layers[0].cause.clone().unwrap(),
                layers[0].detail.clone().unwrap(),
            )
        };
        let (cause, detail) = judged(None, "float32");
        assert_eq!(cause, "precision_loss");
        assert!(
            detail.starts_with("MatMul: the provider multiplies"),
            "{detail}"
        );
        let (cause, detail) = judged(Some((2e-5, 5e-3)), "float32");
        assert_eq!(cause, "precision_loss", "the truth says the target is off");
        assert!(detail.ends_with("the target is off"), "{detail}");
        assert_eq!(judged(Some((4e-3, 5e-3)), "float32").0, "rounding");
        assert_eq!(
            judged(None, "float16").0,
            "op_implementation",
            "TF32 is float32 math"
        );
    }

    #[test]
    fn an_origin_within_its_tolerance_with_nothing_else_different_only_rounds() {
        // l0 rounds (1e-5 of its own, within 1e-4); l1 amplifies it past the tolerance.
        let mut layers = vec![
            layer(0, 1e-5, Some(1e-5), &["x"]),
            layer(1, 5e-4, Some(0.0), &["l0"]),
        ];
        let summary = analyse(&mut layers, Tolerance::PerDtype);
        assert_eq!(summary.drift_origin.as_deref(), Some("l0"));
        explain(
            &mut layers,
            &[Evidence::default(), Evidence::default()],
            &summary,
        );
        assert_eq!(layers[0].cause.as_deref(), Some("rounding"));
        let detail = layers[0].detail.as_deref().unwrap();
        assert!(
            detail.starts_with("the target rounds here as its dtype allows"),
            "{detail}"
        );
        assert!(
            detail.ends_with("amplified downstream until `l1` exceeds it"),
            "{detail}"
        );
        assert_eq!(layers[1].cause.as_deref(), Some("inherited"));
    }

    #[test]
    fn an_amplified_difference_is_born_upstream_and_inherited_downstream() {
        // l1 adds 6e-5 itself (below 1e-4); l2 passes it on; l3 amplifies it past 1e-4.
        let mut layers = vec![
            layer(0, 1e-7, Some(1e-7), &["x"]),
            layer(1, 6e-5, Some(6e-5), &["l0"]),
            layer(2, 6e-5, Some(0.0), &["l1"]),
            layer(3, 5e-4, Some(2e-6), &["l2", "l0"]),
        ];
        let summary = analyse(&mut layers, Tolerance::PerDtype);
        assert_eq!(summary.first_exceeding.as_deref(), Some("l3"));
        assert_eq!(summary.drift_origin.as_deref(), Some("l1"));
        let mut evidence = vec![Evidence::default(); 4];
        evidence[1].weights.push("`w` differs".into());
        explain(&mut layers, &evidence, &summary);
        assert_eq!(layers[3].cause.as_deref(), Some("inherited"));
        assert_eq!(layers[1].cause.as_deref(), Some("weight_mismatch"));
        assert!(
            layers[1]
                .detail
                .as_ref()
                .unwrap()
                .contains("amplified downstream until `l3`")
        );
        assert_eq!(layers[2].cause, None, "within tolerance and not the origin");
    }

    #[test]
    fn causes_follow_the_fixed_order_and_unknown_says_what_was_ruled_out() {
        let mut layers = vec![
            layer(0, 1e-3, None, &[]),
            layer(1, 1e-3, Some(1e-3), &["l0"]),
        ];
        layers[0].local_reason = Some("its nodes use a custom op".into());
        let summary = analyse(&mut layers, Tolerance::PerDtype);
        let mut evidence = vec![Evidence::default(); 2];
        evidence[1].precision = Some("float16 grid".into());
        evidence[1].self_disagreement = Some(("target".into(), 5e-3));
        explain(&mut layers, &evidence, &summary);
        assert_eq!(layers[0].cause.as_deref(), Some("unknown"));
        let detail = layers[0].detail.as_deref().unwrap();
        assert!(detail.contains("ruled out: layout permutation, nondeterminism"));
        assert!(detail.contains("its nodes use a custom op"));
        assert_eq!(
            layers[1].cause.as_deref(),
            Some("nondeterminism"),
            "before precision"
        );
    }

    #[test]
    fn values_rounded_to_float16_are_on_its_grid() {
        let r: Vec<f32> = (0..64).map(|i| 0.1 + i as f32 * 0.01337).collect();
        let t: Vec<f32> = r.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        let b: Vec<f32> = r
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (rb, tb, bb) = (bytes(&r), bytes(&t), bytes(&b));
        let shape = [64];
        let view = |b: &'static [u8]| TensorView::new("x", DType::F32, &shape, b).unwrap();
        let (rb, tb, bb): (&'static [u8], &'static [u8], &'static [u8]) = (
            Box::leak(rb.into_boxed_slice()),
            Box::leak(tb.into_boxed_slice()),
            Box::leak(bb.into_boxed_slice()),
        );
        assert_eq!(precision_grid(view(rb), view(tb)), Some("float16"));
        assert_eq!(precision_grid(view(rb), view(bb)), Some("bfloat16"));
        assert_eq!(precision_grid(view(rb), view(rb)), None);
    }
}
