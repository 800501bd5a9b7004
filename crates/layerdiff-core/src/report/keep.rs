//! Keep-in-float32 advice as a report holds it: the layers a lower-precision target should
//! keep in float32, each with why, and what keeping them did. `crate::advice` draws it up.

use serde::Serialize;

/// The layers a lower-precision target should keep in float32, and the check of that advice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeepFloat32 {
    /// The lower precision the target computes in (`float16`, `bfloat16`, `int8`).
    pub precision: String,
    /// The layers, most needed first.
    pub layers: Vec<KeptLayer>,
    /// The same comparison re-run with those layers kept in float32, when it was.
    pub check: Option<AdviceCheck>,
}

/// One layer to keep in float32.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeptLayer {
    /// The layer.
    pub layer: String,
    /// Its ONNX nodes, to keep out of a conversion (`node_block_list` of ONNX Runtime's float16
    /// converter, `nodes_to_exclude` of its quantizer); empty with a PyTorch target.
    pub nodes: Vec<String>,
    /// Why, in words.
    pub why: String,
}

/// What keeping the advised layers in float32 did, measured by re-running the comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdviceCheck {
    /// The layers kept (the advice, or the user's own list).
    pub kept: Vec<String>,
    /// Layers exceeding their tolerance before, of those compared.
    pub exceeding_before: usize,
    /// Layers exceeding their tolerance with the layers kept.
    pub exceeding_after: usize,
    /// The last compared layer (the model's output), where the error is read.
    pub output: String,
    /// Its largest difference before.
    #[serde(serialize_with = "crate::floats::float")]
    pub output_max_abs_diff_before: f64,
    /// Its largest difference with the layers kept.
    #[serde(serialize_with = "crate::floats::float")]
    pub output_max_abs_diff_after: f64,
    /// Its mean absolute difference before: the verdict's measure (a largest difference can be
    /// one rounding step of the output's own precision, the same with any layer kept).
    #[serde(serialize_with = "crate::floats::float")]
    pub output_mean_abs_diff_before: f64,
    /// Its mean absolute difference with the layers kept.
    #[serde(serialize_with = "crate::floats::float")]
    pub output_mean_abs_diff_after: f64,
    /// Its elements NaN or ±Inf on the target where the reference is finite, before.
    pub output_nonfinite_before: u64,
    /// The same with the layers kept.
    pub output_nonfinite_after: u64,
    /// Where drift is born with the layers kept, if anywhere.
    pub drift_origin_after: Option<String>,
    /// Whether keeping them removed or reduced the drift: where not, the layers were tried,
    /// and the reports say so rather than advise them.
    pub helps: bool,
    /// The check in one sentence.
    pub verdict: String,
}

impl KeepFloat32 {
    /// Whether the layers are advised: there are some, and the check (where made) did not
    /// refute them.
    pub fn advised(&self) -> bool {
        !self.layers.is_empty() && self.check.as_ref().is_none_or(|c| c.helps)
    }

    /// The sentence the reports introduce the layers with: advised, or tried without help.
    pub fn heading(&self) -> String {
        if self.advised() {
            format!(
                "The target computes in {}; these layers should stay in float32, most needed first",
                self.precision
            )
        } else {
            format!(
                "The target computes in {}; these layers were tried in float32, and that does not remove the drift (below): not advised",
                self.precision
            )
        }
    }
}

impl KeepFloat32 {
    /// The same advice by module, for layers that are gradients (`owner` gives each one's
    /// module; inputs have none): a gradient cannot be kept in float32, the backward of the
    /// module that computes it can. Modules in the order of their first advised gradient; none
    /// whose backward has a defect (`defects`: float32 would hide it, not fix it).
    pub fn by_module(
        &self,
        owner: &dyn Fn(&str) -> Option<String>,
        defects: &[crate::Defect],
    ) -> KeepFloat32 {
        let defective: Vec<String> = defects.iter().filter_map(|d| owner(&d.layer)).collect();
        let mut modules: Vec<(String, Vec<&KeptLayer>)> = Vec::new();
        for kept in &self.layers {
            let Some(module) = owner(&kept.layer).filter(|m| !m.is_empty()) else {
                continue;
            };
            if defective.contains(&module) {
                continue;
            }
            match modules.iter_mut().find(|(m, _)| *m == module) {
                Some((_, grads)) => grads.push(kept),
                None => modules.push((module, vec![kept])),
            }
        }
        let layers = modules
            .into_iter()
            .map(|(module, grads)| {
                let names: Vec<String> = grads.iter().map(|k| format!("`{}`", k.layer)).collect();
                KeptLayer {
                    layer: module,
                    nodes: Vec::new(),
                    why: format!(
                        "run its backward in float32, or scale the loss so its small gradients keep their precision: {} ({})",
                        names.join(", "),
                        grads[0].why
                    ),
                }
            })
            .collect();
        KeepFloat32 {
            precision: self.precision.clone(),
            layers,
            check: self.check.clone(),
        }
    }
}
