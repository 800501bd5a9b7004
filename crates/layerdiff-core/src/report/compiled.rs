//! A compiler's work across modules (`--target torch:compile`). The layer-by-layer comparison
//! compiles each leaf module alone, so what a compiler does across modules (fusing a block's
//! own code with its submodules) never runs there. The whole model is therefore also compiled
//! at once and its output judged against the same side eager, as `layerdiff check` judges an
//! output; where it differs and no layer has a defect or an undecided error of its own (a leaf
//! that differs compiled alone already explains it), the module tree is searched for the
//! smallest module whose compiled form differs, and that module is the report's defect
//! ([`crate::Cause::CrossModuleFusion`]).

use serde::Serialize;

use crate::{Bound, Cause, Defect, Report, Verdict};

/// The whole model compiled at once, and the search for the smallest module whose compiled
/// form differs from it eager.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompiledWhole {
    /// The compiler's backend (`inductor`).
    pub backend: String,
    /// Every module compiled, in order: the whole model first, then each module the search
    /// compiled (with some of its submodules left eager, or whole), the check last.
    pub tried: Vec<ModuleCompiled>,
    /// The smallest module whose compiled form differs from it eager, where the whole model's
    /// does and the search ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// Its submodules that must be compiled with it for the difference to show, where it needs
    /// some and none of them differs compiled alone (empty: its own code and leaves suffice).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
    /// Whether the check, `module` compiled once more afresh on the same inputs, differs again.
    pub checked: bool,
    /// Why the whole model differs and no module was searched (a layer's defect explains it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_searched: Option<String>,
}

/// One module compiled and judged against it eager, on the inputs it gets in the model's
/// forward pass.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleCompiled {
    /// The module (the model itself by its class name).
    pub module: String,
    /// Its submodules left eager in this compile (`torch.compiler.disable`; empty: compiled
    /// whole).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub eager: Vec<String>,
    /// The largest difference of its outputs from it eager.
    #[serde(serialize_with = "crate::floats::float")]
    pub max_abs_diff: f64,
    /// The tolerance of the output that differs most (by its dtype, as the run's policy
    /// chooses a layer's): what a repro of it is judged by.
    pub tolerance: Bound,
    /// The difference as a multiple of that tolerance (above 1: beyond it).
    #[serde(serialize_with = "crate::floats::float")]
    pub tolerance_multiple: f64,
    /// How many times as far from the output computed in float64 it is as eager is, where that
    /// was computed (beyond `OUTPUT_ROUNDING_FACTOR`: it computes something else).
    #[serde(serialize_with = "crate::floats::float_opt")]
    pub float64_multiple: Option<f64>,
    /// Whether it differs, by `layerdiff check`'s rule: an element beyond the tolerance, or
    /// further from float64 than rounding explains.
    pub differs: bool,
}

impl ModuleCompiled {
    /// Its difference in words (`max abs diff 1.021e-2, 25.3× its output's tolerance, 806.4×
    /// as far from float64 as eager`).
    pub fn words(&self) -> String {
        let far = self
            .float64_multiple
            .map(|m| format!(", {m:.1}× as far from float64 as eager"))
            .unwrap_or_default();
        format!(
            "max abs diff {:.3e}, {:.1}× its output's tolerance{far}",
            self.max_abs_diff, self.tolerance_multiple
        )
    }
}

impl CompiledWhole {
    /// The whole model's compile (the first tried).
    pub fn whole(&self) -> Option<&ModuleCompiled> {
        self.tried.first()
    }

    /// The last compile of `module` compiled whole: what the finding's figures are.
    fn found(&self, module: &str) -> Option<&ModuleCompiled> {
        (self.tried.iter().rev()).find(|t| t.module == module && t.eager.is_empty())
    }

    /// Whether the whole model compiled at once differs from it eager.
    pub fn differs(&self) -> bool {
        self.whole().is_some_and(|w| w.differs)
    }

    /// What was found, in one sentence.
    pub fn sentence(&self) -> String {
        let Some(whole) = self.whole() else {
            return "the whole model was not compiled".to_string();
        };
        let said = format!(
            "the whole model compiled at once ({}) against it eager: {}",
            self.backend,
            whole.words()
        );
        if !whole.differs {
            return format!("{said}: it agrees, as rounding explains");
        }
        if let Some(why) = &self.not_searched {
            return format!("{said}: it differs; no module searched: {why}");
        }
        let Some(module) = &self.module else {
            return format!("{said}: it differs");
        };
        let compiles = self.tried.len();
        let check = if self.checked {
            "checked by compiling it once more: it differs again"
        } else {
            "NOT confirmed: compiled once more, it agrees"
        };
        format!(
            "{said}: it differs; the search over the module tree narrowed it to `{module}` ({compiles} compiles, the whole model's and the check included); {check}"
        )
    }

    /// The defect it makes: the module the search narrowed to, where the whole model differs.
    pub fn defect(&self) -> Option<Defect> {
        let module = self.module.as_ref().filter(|_| self.differs())?;
        let found = self.found(module).or(self.whole())?;
        let with = if self.with.is_empty() {
            String::new()
        } else {
            let named: Vec<String> = self.with.iter().map(|m| format!("`{m}`")).collect();
            format!(
                " (only with {} compiled in it; none of them differs compiled alone)",
                named.join(", ")
            )
        };
        let confirmed = if self.checked {
            ""
        } else {
            "; a second compile of it agreed, so the difference may not reproduce"
        };
        let narrowed = match &self.not_searched {
            Some(why) => format!("not narrowed below the whole model: {why}"),
            None => format!(
                "narrowed from the whole model in {} compiles",
                self.tried.len()
            ),
        };
        let detail = format!(
            "compiled as one with its submodules ({backend}), `{module}` differs from itself eager on the inputs it gets in the model's forward pass: {words}{with}; each of its leaves compiled alone agrees: the compiler's fusion across `{module}`'s modules computes differently ({narrowed}){confirmed}",
            backend = self.backend,
            words = found.words(),
        );
        let fix = format!(
            "compile below `{module}` (each of its submodules on its own, or `{module}` under `torch.compiler.disable`) until the compiler is fixed; report it to PyTorch ({backend}) with a repro: `{module}` alone, compiled, against it eager on its inputs (`--repro DIR` writes it)",
            backend = self.backend
        );
        Some(Defect {
            layer: module.clone(),
            cause: Cause::CrossModuleFusion,
            multiple: found.float64_multiple,
            tolerance_multiple: Some(found.tolerance_multiple),
            detail,
            fix,
        })
    }
}

impl Report {
    /// Where the headline defect is a module whose compiled form differs (no layer of the
    /// report): that module, and the tolerance its compile was judged by, for a repro or a
    /// bisection of it.
    pub fn compiled_headline(&self) -> Option<(&str, Bound)> {
        let first = self.summary.defects.first()?;
        let whole = self.compiled_whole.as_ref()?;
        let module = whole.module.as_deref()?;
        if first.cause != Cause::CrossModuleFusion || first.layer != module {
            return None;
        }
        Some((module, whole.found(module).or(whole.whole())?.tolerance))
    }

    /// This report with the whole model's compile and its search recorded; where they found a
    /// module whose compiled form differs, that is a defect, and the verdict says so.
    pub fn compiled_whole(&mut self, found: CompiledWhole) {
        if let Some(defect) = found.defect() {
            let s = &mut self.summary;
            s.defects.push(defect);
            s.defects
                .sort_by(|a, b| b.severity().total_cmp(&a.severity()));
            s.verdict = Verdict::Defect;
            if s.drift_origin.is_none() {
                s.drift_origin = found.module.clone();
            }
        }
        self.compiled_whole = Some(found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiled(module: &str, eager: &[&str], differs: bool) -> ModuleCompiled {
        ModuleCompiled {
            module: module.to_string(),
            eager: eager.iter().map(|e| e.to_string()).collect(),
            max_abs_diff: if differs { 1.021e-2 } else { 2.4e-7 },
            tolerance: crate::default_for(crate::DType::F32),
            tolerance_multiple: if differs { 25.3 } else { 0.002 },
            float64_multiple: Some(if differs { 806.4 } else { 1.1 }),
            differs,
        }
    }

    #[test]
    fn a_module_whose_compiled_form_differs_is_the_defect_and_the_verdict() {
        let mut report = Report::of_layers("m", Vec::new());
        assert_eq!(report.summary.verdict, Verdict::NoDrift);
        report.compiled_whole(CompiledWhole {
            backend: "inductor".into(),
            tried: vec![
                compiled("Model", &[], true),
                compiled("Model", &["stages"], false),
                compiled("stages", &[], true),
                compiled("stages", &[], true),
            ],
            module: Some("stages".into()),
            with: Vec::new(),
            checked: true,
            not_searched: None,
        });
        let s = &report.summary;
        assert_eq!(s.verdict, Verdict::Defect);
        assert_eq!(s.drift_origin.as_deref(), Some("stages"));
        let d = &s.defects[0];
        assert_eq!(
            (d.layer.as_str(), d.cause),
            ("stages", Cause::CrossModuleFusion)
        );
        assert!(d.detail.starts_with(
            "compiled as one with its submodules (inductor), `stages` differs from itself eager"
        ));
        let (module, bound) = report.compiled_headline().expect("the headline");
        assert_eq!((module, bound.atol), ("stages", 1e-4));
        assert!(d.detail.contains("each of its leaves compiled alone agrees: the compiler's fusion across `stages`'s modules computes differently (narrowed from the whole model in 4 compiles)"), "{}", d.detail);
        assert!(d.fix.starts_with("compile below `stages`"), "{}", d.fix);
        let said = report.compiled_whole.as_ref().unwrap().sentence();
        assert!(said.ends_with("narrowed it to `stages` (4 compiles, the whole model's and the check included); checked by compiling it once more: it differs again"), "{said}");
    }

    #[test]
    fn a_search_that_failed_leaves_the_whole_model_as_the_defect() {
        let mut report = Report::of_layers("m", Vec::new());
        report.compiled_whole(CompiledWhole {
            backend: "inductor".into(),
            tried: vec![compiled("Model", &[], true)],
            module: Some("Model".into()),
            with: Vec::new(),
            checked: true,
            not_searched: Some("a compile of the search failed: RuntimeError: x".into()),
        });
        let d = &report.summary.defects[0];
        assert_eq!(d.layer, "Model");
        assert!(d.detail.ends_with("(not narrowed below the whole model: a compile of the search failed: RuntimeError: x)"), "{}", d.detail);
    }

    #[test]
    fn a_whole_model_that_agrees_changes_nothing() {
        let mut report = Report::of_layers("m", Vec::new());
        report.compiled_whole(CompiledWhole {
            backend: "inductor".into(),
            tried: vec![compiled("Model", &[], false)],
            module: None,
            with: Vec::new(),
            checked: false,
            not_searched: None,
        });
        assert_eq!(report.summary.verdict, Verdict::NoDrift);
        assert!(report.summary.defects.is_empty());
        let said = report.compiled_whole.as_ref().unwrap().sentence();
        assert!(
            said.ends_with(": it agrees, as rounding explains"),
            "{said}"
        );
    }
}
