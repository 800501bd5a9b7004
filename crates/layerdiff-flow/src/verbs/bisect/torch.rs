//! `--bisect` of a PyTorch target, planned here: which search applies (torch.compile's stages
//! on the headline's module, or the layers to keep in float32 of a float16 or bfloat16 target),
//! over which candidates, what a finding is recorded as, and what is said. The PyTorch adapter
//! runs what the plan names (the module compiled by each stage, PyTorch's own compiler
//! bisector, the model with a set of layers kept) and asks [`layerdiff_core::within`] whether
//! each run is clean.

use layerdiff_core::{Bisection, BisectionCheck, Report};

use crate::spec::torch::{Precision, TorchSpec};

/// torch.compile's stages, each adding to the one before: where a backend's difference is
/// first shown.
pub const STAGES: [&str; 4] = [
    "eager",
    "aot_eager",
    "aot_eager_decomp_partition",
    "inductor",
];

/// The search a PyTorch target's `--bisect` runs.
#[derive(Debug, Clone, PartialEq)]
pub enum TorchBisection {
    /// None: the note says why.
    Nothing(String),
    /// torch.compile's stages on the headline layer's module alone: `stages` tried in order
    /// (the target's backend last), or, for Inductor, PyTorch's own compiler bisector over its
    /// stages and subsystems (`inductor`).
    Stages {
        /// The headline layer.
        layer: String,
        /// The target's backend.
        backend: String,
        /// The stages tried in order where PyTorch's bisector does not apply.
        stages: Vec<String>,
        /// Whether PyTorch's compiler bisector walks the stages and Inductor's subsystems.
        inductor: bool,
    },
    /// The smallest set of layers to keep in float32 that brings the output within its
    /// tolerance: the report's layers with a module of their own, first of each module, those
    /// with a defect left out (`defects` of them).
    KeepFloat32 {
        /// The target's dtype in words (`float16`).
        precision: &'static str,
        /// The candidate layers, in the report's order.
        candidates: Vec<String>,
        /// Layers left out for their defect.
        defects: usize,
    },
}

impl TorchBisection {
    /// Plans the bisection of `report`, a comparison with `target`; `kept`: layers were kept
    /// in float32 already (`--keep-fp32`); `module_of`: each listed layer's module (`None`:
    /// a functional call).
    pub fn plan(
        report: &Report,
        target: &TorchSpec,
        kept: bool,
        module_of: &[(String, Option<String>)],
    ) -> Self {
        let nothing = |why: &str| Self::Nothing(format!("--bisect: nothing to bisect: {why}"));
        if let Some(backend) = &target.compile {
            // a module whose compiled form differs, where that is the headline, is bisected
            // alone as a layer's module is
            let fused = report
                .compiled_headline()
                .map(|(module, _)| module.to_string());
            return match fused
                .ok_or(())
                .or_else(|()| report.headline().map(|l| l.name.clone()))
            {
                Err(why) => nothing(&why),
                Ok(layer) => Self::Stages {
                    layer,
                    backend: backend.clone(),
                    stages: stages_up_to(backend),
                    inductor: backend == "inductor",
                },
            };
        }
        let precision = match target.precision {
            Precision::Fp16 | Precision::AmpFp16 => "float16",
            Precision::Bf16 | Precision::AmpBf16 => "bfloat16",
            Precision::Fp32 | Precision::Tf32 => {
                return nothing(&format!(
                    "`{}` is neither compiled nor in float16 or bfloat16",
                    target.spelling()
                ));
            }
        };
        if kept {
            return nothing(
                "the layers kept in float32 are given (`--keep-fp32`), and the search would replace them",
            );
        }
        if report.summary.layers_exceeding == 0 {
            return Self::Nothing(
                "--bisect: nothing to bisect, no layer exceeds its tolerance".to_string(),
            );
        }
        let defects: std::collections::HashSet<&str> = report
            .summary
            .defects
            .iter()
            .map(|d| d.layer.as_str())
            .collect();
        let mut seen = std::collections::HashSet::new();
        let candidates = report
            .layers
            .iter()
            .filter(|l| !l.name.contains(':') && !defects.contains(l.name.as_str()))
            .filter_map(|l| {
                let module = module_of
                    .iter()
                    .find(|(name, _)| *name == l.name)
                    .and_then(|(_, m)| m.as_deref())?;
                seen.insert(module).then(|| l.name.clone())
            })
            .collect();
        Self::KeepFloat32 {
            precision,
            candidates,
            defects: defects.len(),
        }
    }
}

/// The stages tried for `backend`: the stages before it, then it.
fn stages_up_to(backend: &str) -> Vec<String> {
    let before = STAGES
        .iter()
        .position(|s| *s == backend)
        .map_or(&[][..], |i| &STAGES[..i]);
    before
        .iter()
        .map(|s| s.to_string())
        .chain(std::iter::once(backend.to_string()))
        .collect()
}

/// The stage before `stage`, whose agreement with eager checks the finding (`eager` for one
/// outside the list).
pub fn stage_before(stage: &str) -> &'static str {
    match STAGES.iter().position(|s| *s == stage) {
        Some(i) if i > 0 => STAGES[i - 1],
        _ => "eager",
    }
}

/// The record of a torch.compile stage search on `path` alone: `responsible` (the stage, and
/// the Inductor subsystem where PyTorch's bisector named one) first shows the difference;
/// `clean`: the stage before it agrees with eager.
pub fn stages_found(
    path: &str,
    candidates: usize,
    responsible: Vec<String>,
    clean: bool,
    runs: usize,
) -> Bisection {
    Bisection {
        over: format!("stages of torch.compile and subsystems of Inductor, on `{path}` alone"),
        action: "first shown by".to_string(),
        candidates,
        responsible,
        found: clean,
        runs,
        check: BisectionCheck {
            compared: 1,
            exceeding_before: 1,
            exceeding_after: usize::from(!clean),
        },
        spelling: None,
    }
}

/// The record of a keep-in-float32 search: `found` the smallest set (`everything`: keeping
/// all candidates made the output clean), checked by `check`, the comparison run again.
pub fn kept_found(
    plan: (&str, usize, usize),
    found: Vec<String>,
    everything: bool,
    runs: usize,
    check: BisectionCheck,
) -> Bisection {
    let (precision, candidates, defects) = plan;
    let excluded = if defects > 0 {
        format!(", those with a defect left out ({defects})")
    } else {
        String::new()
    };
    Bisection {
        over: format!("layers of the {precision} target{excluded}"),
        action: "kept in float32".to_string(),
        candidates,
        responsible: found,
        found: everything,
        runs,
        check,
        spelling: None,
    }
}

/// What a keep-in-float32 search says beside its record: that most layers must stay (the
/// dtype's own rounding exceeds the tolerance), and how many sets could not run.
pub fn kept_notes(
    precision: &str,
    candidates: usize,
    found: usize,
    tried: usize,
    failed: &[String],
) -> Vec<String> {
    let mut notes = Vec::new();
    if 2 * found > candidates {
        notes.push(format!(
            "--bisect: {found} of {candidates} layers must stay in float32 for the output to meet its tolerance: {precision}'s own rounding in the rest exceeds it; `--tolerance` with the output error you can accept finds the layers that matter"
        ));
    }
    if let Some(first) = failed.first() {
        notes.push(format!(
            "--bisect: {} of the {tried} sets tried could not run (counted as not enough): {first}",
            failed.len()
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_is_tried_after_the_stages_before_it() {
        assert_eq!(
            stages_up_to("aot_eager_decomp_partition"),
            ["eager", "aot_eager", "aot_eager_decomp_partition"]
        );
        assert_eq!(stages_up_to("cudagraphs"), ["cudagraphs"]);
        assert_eq!(stage_before("aot_eager"), "eager");
        assert_eq!(stage_before("inductor"), "aot_eager_decomp_partition");
        assert_eq!(stage_before("cudagraphs"), "eager");
    }

    #[test]
    fn most_layers_kept_says_the_dtype_itself_exceeds() {
        let notes = kept_notes("bfloat16", 10, 6, 12, &["RuntimeError: x".to_string()]);
        assert!(notes[0].starts_with("--bisect: 6 of 10 layers must stay in float32"));
        assert!(notes[1].contains("1 of the 12 sets tried could not run"));
        assert!(kept_notes("bfloat16", 10, 5, 12, &[]).is_empty());
    }
}
