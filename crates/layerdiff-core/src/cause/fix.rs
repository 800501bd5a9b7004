//! What fixes each defect, by its cause: the sentence a report gives after the cause.

use super::{Cause, Evidence, Layer};
/// What fixes a weight that differs: `readers` (the target's node(s), or the nodes that read a
/// weight of its file) read weights that are not the model's, which `weights` say.
pub fn weights_fix(readers: &str, weights: &[String]) -> String {
    format!(
        "use the reference's weights: {readers} read weights that are not the model's ({}); export or convert the file again from the model, or find what edited it",
        weights.join("; ")
    )
}

/// What fixes a defect, by its cause.
pub(super) fn fix(cause: Cause, layer: &Layer, e: &Evidence) -> String {
    // the nodes that read a weight that differs are the ones to name for it, not every node of
    // the layer (its Relu reads no weight)
    let nodes = if cause == Cause::WeightMismatch && !e.weight_readers.is_empty() {
        e.weight_readers.clone()
    } else if let Some(c) = e
        .clipped
        .as_ref()
        .filter(|_| cause == Cause::QuantizationRange)
    {
        vec![c.node.clone()]
    } else {
        layer
            .location
            .as_ref()
            .map(|o| {
                if o.nodes.is_empty() {
                    vec![o.node.clone()]
                } else {
                    o.nodes.clone()
                }
            })
            .unwrap_or_default()
    };
    let where_ = if nodes.is_empty() {
        match &layer.module_type {
            Some(t) => format!("the target's `{}` ({t})", layer.name),
            None => format!("the target's `{}`", layer.name),
        }
    } else {
        let shown: Vec<String> = nodes.iter().take(6).map(|n| format!("`{n}`")).collect();
        let more = nodes.len().saturating_sub(shown.len());
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!("the target's node(s) {}{tail}", shown.join(", "))
    };
    // a data-parallel rank's gradient, against one process on the same rows
    let rank = super::rank_of(layer);
    match cause {
        Cause::WeightMismatch => weights_fix(&where_, &e.weights),
        Cause::LayoutPermutation => format!(
            "{where_} hold(s) the values in another axis order ({:?}): a layout conversion (NHWC/NCHW) is missing or applied twice before or inside it",
            layer.permutation.as_deref().unwrap_or_default()
        ),
        Cause::ShapeMismatch => format!(
            "{where_} compute(s) a {:?} value where the model computes {:?}: export with that dimension dynamic (`dynamic_axes`/`dynamic_shapes`), or feed the shape the file was exported for",
            layer.target_shape.as_deref().unwrap_or_default(),
            layer.shape
        ),
        Cause::QuantizationRange => format!(
            "{where_} clip(s) its values to a range too narrow for them: calibrate the quantization with a representative dataset that covers what the model computes here (inputs like those compared), or keep this layer in float (selective quantization)"
        ),
        Cause::NarrowAccumulation => format!(
            "{where_} add(s) up its terms in {grid}: run it in float32, or under autocast (whose kernels accumulate in float32), where its sum matters (a gradient an optimizer applies, a long dot product); or use a kernel that accumulates in float32",
            grid = layer.baseline.as_ref().map_or("the narrow dtype", |b| b.grid.as_str())
        ),
        Cause::Approximation => format!(
            "nothing for these tolerances: {where_} approximate(s) beyond an honest {} kernel, and what it adds stays within every tolerance of this run; a runtime's validation fails on it with `--fail-on approximation`, and `layerdiff reduce` cuts it down to a repro for the runtime's maintainers",
            layer
                .baseline
                .as_ref()
                .map_or("same-precision", |b| b.grid.as_str())
        ),
        Cause::Nondeterminism => format!(
            "{where_} give(s) other values on every run: make the kernels deterministic (e.g. `torch.use_deterministic_algorithms(True)`, cuDNN's deterministic mode), or compare at a tolerance above that spread"
        ),
        Cause::ArgumentMismatch => format!(
            "{where_} take(s) other arguments from the model's own code on the target ({}): make them the same for every dtype and device, or fix the code path that computes them there",
            e.arguments.join(", ")
        ),
        Cause::FileDiffers if !e.attributes.is_empty() => format!(
            "give {where_} the reference's attribute values back (reference → target: {}): the runtime computes the file as written, so the file is what differs; export it again from the model, or undo the edit or pass that changed it",
            e.attributes.join(", ")
        ),
        Cause::FileDiffers => format!(
            "{where_} compute(s) what the file says, and that is not the model's computation: export the file again from the model (`layerdiff torch MODEL` exports it fresh) and compare the two node by node (`layerdiff onnx FRESH --vs FILE` names the attribute or constant that differs), or undo the edit or pass that changed it; the runtime is not at fault"
        ),
        _ if !e.attributes.is_empty() => format!(
            "give {where_} the reference's attribute values back (reference → target: {})",
            e.attributes.join(", ")
        ),
        _ if rank.is_some() => {
            let (of, rank) = rank.unwrap_or_default();
            format!(
                "rank {rank}'s gradient of `{of}` before the all-reduce is not what one process computes on the same rows: code that runs on that rank only changes it (a gradient hook, a scale or a branch on the rank, another seed there); find what depends on the rank"
            )
        }
        _ if layer
            .detail
            .as_deref()
            .is_some_and(|d| d.contains(super::truth::TRUTH_FOLLOWS_TARGET)) =>
        {
            format!(
                "make the code of {where_} compute the same for every dtype (an epsilon, a constant or a path it takes only in half precision): it computes otherwise in {} than in {}, and a float64 copy on the same code cannot tell which path is right",
                layer.target_dtype.as_deref().unwrap_or("the target's dtype"),
                layer.dtype
            )
        }
        _ if layer.baseline.as_ref().is_some_and(|b| b.reference_off > 0) => {
            "the reference's own value is off from the exact computation on its inputs: check the reference (its runtime, or the expected values it reads) before the target".to_string()
        }
        _ => format!(
            "{where_} compute(s) differently from an honest {} kernel on the same inputs: reproduce it on that layer alone (its inputs are the reference's values), and report it to the runtime, or run this layer on another kernel or provider; keeping it in float32 hides a fault rather than fixing it",
            layer
                .baseline
                .as_ref()
                .map_or("same-precision", |b| b.grid.as_str())
        ),
    }
}
