//! `--bisect` for ONNX Runtime targets that optimize the graph: which of its graph optimizers
//! turns the difference on. Each candidate set is disabled through the session's
//! `optimization.disable_specified_optimizers` and the comparison is run again, accumulated
//! (each layer judged against its tolerance as the report's run judged it); the smallest set
//! whose disabling leaves no layer beyond its tolerance is named, and that run is the check.

pub mod modules;
pub mod torch;

use layerdiff_core::{Bisection, BisectionCheck, Report, smallest_set};
use layerdiff_runtime::{OptLevel, RuntimeSpec};

use crate::Result;
use crate::onnx::{OnnxOptions, compare};

/// ONNX Runtime's graph optimizers and rewrite rules (1.31) by the names a session disables
/// them by, those that change a graph's numbers or its values first (the layout transformers,
/// then the fusions, then eliminations and folding). A name a build lacks is ignored by ONNX
/// Runtime, so the list may hold more than one build runs; what it misses the search reports as
/// "not turned on by the optimizers". Required transformers (casts it inserts, copies between
/// devices) are not here: they cannot be disabled.
pub const ORT_OPTIMIZERS: &[&str] = &[
    "NchwcTransformer",
    "NhwcTransformer",
    "TransposeOptimizer",
    "ConvActivationFusion",
    "ConvAddActivationFusion",
    "ConvAddFusion",
    "ConvMulFusion",
    "ConvBNFusion",
    "PadFusion",
    "GemmActivationFusion",
    "GemmSumFusion",
    "GemmTransposeFusion",
    "MatMulAddFusion",
    "MatMulActivationFusion",
    "MatMulScaleFusion",
    "MatmulTransposeFusion",
    "MatmulBNFusion",
    "MatMulIntegerToFloatFusion",
    "DynamicQuantizeMatMulFusion",
    "MatMulNBitsFusion",
    "DQMatMulNBitsFusion",
    "GeluFusionL1",
    "GeluFusionL2",
    "FastGeluFusion",
    "QuickGeluFusion",
    "BiasGeluFusion",
    "BiasSoftmaxFusion",
    "BiasDropoutFusion",
    "LayerNormFusionL1",
    "LayerNormFusionL2",
    "SimplifiedLayerNormFusion",
    "SkipLayerNormFusion",
    "BiasSkipLayerNormFusion",
    "EmbedLayerNormFusion",
    "AttentionFusion",
    "GroupQueryAttentionFusion",
    "ReshapeFusion",
    "GatherSliceToSplitFusion",
    "GatherToSliceFusion",
    "DivMulFusion",
    "FuseReluClip",
    "NotWhereFusion",
    "ClipQuantFusion",
    "ReluQuantFusion",
    "QDQPropagationTransformer",
    "QDQS8ToU8Transformer",
    "QDQSelectorActionTransformer",
    "QDQFinalCleanupTransformer",
    "Avx2WeightS8ToU8Transformer",
    "FuseInitializersTransformer",
    "RemoveDuplicateCastTransformer",
    "CastChainElimination",
    "CastElimination",
    "CommonSubexpressionElimination",
    "ConstantSharing",
    "ConstantFolding",
    "ConstantFoldingDQ",
    "EliminateIdentity",
    "EliminateSlice",
    "EliminateDropout",
    "ExpandElimination",
    "UnsqueezeElimination",
    "NoopElimination",
    "PreShapeNodeElimination",
];

/// The ONNX Runtime optimizers that turn on the difference `report` found between
/// `options`' sides, or `None` when there is nothing to bisect: the target does not optimize
/// (not ONNX Runtime at `opt=basic|extended|all`), or no layer exceeds its tolerance.
/// `progress` is told each run.
pub fn ort_optimizers(
    options: &OnnxOptions,
    report: &Report,
    progress: &mut dyn FnMut(&str),
) -> Result<Option<Bisection>> {
    let target = options.target_spec();
    let Some(ort) = target.runtime().and_then(RuntimeSpec::ort) else {
        return Ok(None);
    };
    if ort.level == OptLevel::Disable || report.summary.layers_exceeding == 0 {
        return Ok(None);
    }
    // Optimizers the user already disabled stay disabled; the rest are the candidates.
    let candidates: Vec<String> = ORT_OPTIMIZERS
        .iter()
        .map(|n| n.to_string())
        .filter(|n| !ort.without.contains(n))
        .collect();
    let spec = |set: &[String]| {
        let mut spec = ort.clone();
        spec.without.extend(set.iter().cloned());
        RuntimeSpec::from(spec)
    };
    // Every run, its set and what it found: a set is run once, and the answer's check is the
    // run of the answer.
    let before = BisectionCheck {
        compared: report.summary.layers_compared,
        exceeding_before: report.summary.layers_exceeding,
        exceeding_after: report.summary.layers_exceeding,
    };
    let mut history: Vec<(Vec<String>, BisectionCheck)> = vec![(Vec::new(), before)];
    let mut clean = |set: &[String]| -> Result<bool> {
        if let Some((_, check)) = history.iter().find(|(ran, _)| ran == set) {
            return Ok(check.exceeding_after == 0);
        }
        let target = spec(set);
        progress(&format!(
            "bisecting: run {}, {} of {} optimizers disabled",
            history.len(),
            set.len(),
            candidates.len()
        ));
        let mut accumulated = options.clone();
        accumulated.target = Some(target.into());
        // the accumulated error alone (no local error, so no baseline either)
        accumulated.settings.local = false;
        let after = compare(&accumulated)?.report;
        let check = BisectionCheck {
            compared: after.summary.layers_compared,
            exceeding_before: report.summary.layers_exceeding,
            exceeding_after: after.summary.layers_exceeding,
        };
        history.push((set.to_vec(), check));
        Ok(after.summary.layers_exceeding == 0)
    };
    // Every candidate disabled first: if that is not clean, the optimizers are not the cause.
    let (responsible, found) = if clean(&candidates)? {
        (smallest_set(&candidates, &mut clean)?, true)
    } else {
        (Vec::new(), false)
    };
    let checked = if found { &responsible } else { &candidates };
    clean(checked)?;
    let runs = history.len() - 1;
    let check = history
        .into_iter()
        .find(|(set, _)| set == checked)
        .map(|(_, check)| check)
        .expect("the checked set ran");
    let spelling = found.then(|| spec(&responsible).spelling());
    Ok(Some(Bisection {
        over: format!("ONNX Runtime graph optimizers at opt={}", ort.level.name()),
        action: "disabled".to_string(),
        candidates: candidates.len(),
        found: found && check.exceeding_after == 0,
        responsible,
        runs,
        check,
        spelling,
    }))
}
