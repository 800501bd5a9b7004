//! Across modules, for a torch.compile target: the whole model compiled at once against the
//! same side eager, and where it differs, the smallest module whose compiled form differs. The
//! PyTorch adapter compiles what the search asks for (a module whole, or with some of its
//! submodules left eager, on the inputs it gets in the model's forward pass) and hands over its
//! outputs, it eager, and it in float64; each compile is judged here by `layerdiff check`'s one
//! rule ([`OutputCheck::judge`]: every element within the output's tolerance, and no further
//! from float64 than rounding explains), and recorded for the report
//! ([`layerdiff_core::CompiledWhole`]).

use layerdiff_core::{Bound, CompiledWhole, ModuleCompiled, Tensor, Tolerance, compare};

use crate::Result;
use crate::verbs::check::OutputCheck;

/// Named output tensors of one run of a module, in its order.
pub type Outputs = [(String, Tensor)];

/// The compiles of one search, judged and recorded in order.
#[derive(Debug, Clone)]
pub struct ModuleSearch {
    backend: String,
    tolerance: Tolerance,
    tried: Vec<ModuleCompiled>,
}

impl ModuleSearch {
    /// A search for `backend`'s compiles, each output held to its tolerance under `tolerance`
    /// (the run's policy: per dtype unless asked otherwise).
    pub fn new(backend: &str, tolerance: Tolerance) -> Self {
        Self {
            backend: backend.to_string(),
            tolerance,
            tried: Vec::new(),
        }
    }

    /// Judges one compile of `module` (`eager`: its submodules left eager in it): its outputs
    /// `compiled` against it eager (`reference`, same order), both against `truth` (it in
    /// float64) where given; records it and says whether it differs. A compile whose outputs do
    /// not pair with eager's (another count, another shape) differs.
    pub fn judge(
        &mut self,
        module: &str,
        eager: Vec<String>,
        reference: &Outputs,
        compiled: &Outputs,
        truth: Option<&Outputs>,
    ) -> Result<bool> {
        let truth = truth.filter(|t| t.len() == reference.len());
        let mut judged = ModuleCompiled {
            module: module.to_string(),
            eager,
            max_abs_diff: 0.0,
            tolerance: Bound::default(),
            tolerance_multiple: 0.0,
            float64_multiple: None,
            differs: reference.len() != compiled.len(),
        };
        for (i, ((name, r), (_, t))) in reference.iter().zip(compiled).enumerate() {
            if r.shape != t.shape || r.dtype != t.dtype {
                judged.differs = true;
                judged.max_abs_diff = f64::INFINITY;
                judged.tolerance_multiple = f64::INFINITY;
                continue;
            }
            let exact = truth.map(|all| &all[i].1);
            let distance = match exact {
                Some(x) if x.shape == r.shape && r.dtype.is_float() => {
                    Some(compare(x.view(), r.view())?.max_abs_diff)
                }
                _ => None,
            };
            let bound = self.tolerance.for_layer(r.dtype.name(), None, distance);
            let check = OutputCheck::judge(name, (r, t), exact, bound, None)?;
            judged.differs |= !check.passed;
            judged.max_abs_diff = judged.max_abs_diff.max(check.stats.max_abs_diff);
            let multiple = check.stats.tolerance_multiple().unwrap_or(0.0);
            if i == 0 || multiple > judged.tolerance_multiple {
                (judged.tolerance, judged.tolerance_multiple) = (bound, multiple);
            }
            if let Some(f) = &check.float64 {
                let m = judged
                    .float64_multiple
                    .map_or(f.multiple, |m| m.max(f.multiple));
                judged.float64_multiple = Some(m);
            }
        }
        let differs = judged.differs;
        self.tried.push(judged);
        Ok(differs)
    }

    /// The last compile judged, in words (`` `stages.1` with `stages.1.blocks` eager: max abs
    /// diff …``), for the progress line.
    pub fn last_words(&self) -> Option<String> {
        self.tried.last().map(|t| {
            let eager = if t.eager.is_empty() {
                String::new()
            } else {
                format!(" with {} submodule(s) eager", t.eager.len())
            };
            let verdict = if t.differs { "differs" } else { "agrees" };
            format!("`{}`{eager}: {}: {verdict}", t.module, t.words())
        })
    }

    /// How many compiles were judged.
    pub fn compiles(&self) -> usize {
        self.tried.len()
    }

    /// The record: `module`, the smallest module whose compiled form differs (`with`: the
    /// submodules it needs compiled in it), `checked`: compiled once more it differs again;
    /// `not_searched`: why the whole model's difference was not searched.
    pub fn finish(
        &self,
        module: Option<String>,
        with: Vec<String>,
        checked: bool,
        not_searched: Option<String>,
    ) -> CompiledWhole {
        CompiledWhole {
            backend: self.backend.clone(),
            tried: self.tried.clone(),
            module,
            with,
            checked,
            not_searched,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerdiff_core::{Cause, DType};

    fn outputs(values: &[f64]) -> Vec<(String, Tensor)> {
        vec![("output".to_string(), Tensor::from_f64(DType::F32, values))]
    }

    #[test]
    fn a_compile_is_judged_as_check_judges_an_output() {
        let mut rng = layerdiff_core::SplitMix64::new(5);
        let exact: Vec<f64> = (0..512).map(|_| rng.normal()).collect();
        let truth = vec![("output".to_string(), Tensor::from_f64(DType::F64, &exact))];
        let eager = outputs(&exact);
        let mut search = ModuleSearch::new("inductor", Tolerance::PerDtype);
        // another order of the same sums: float32 rounding, within everything
        let reordered: Vec<f64> = exact.iter().map(|v| v * (1.0 + 6e-8)).collect();
        assert!(
            !search
                .judge("Model", vec![], &eager, &outputs(&reordered), Some(&truth))
                .unwrap()
        );
        // 1% off: beyond the tolerance and far from float64
        let off: Vec<f64> = exact.iter().map(|v| v * 1.01).collect();
        assert!(
            search
                .judge("Model", vec![], &eager, &outputs(&off), Some(&truth))
                .unwrap()
        );
        // 1e-5 off, small values: within the tolerance, still far beyond rounding
        let small: Vec<f64> = exact.iter().map(|v| v * 1e-3).collect();
        let truth_small = vec![("output".to_string(), Tensor::from_f64(DType::F64, &small))];
        let nudged: Vec<f64> = small.iter().map(|v| v * 1.001).collect();
        let within = search
            .judge(
                "block",
                vec!["block.inner".to_string()],
                &outputs(&small),
                &outputs(&nudged),
                Some(&truth_small),
            )
            .unwrap();
        assert!(within, "the float64 truth tells it computes something else");
        assert_eq!(search.compiles(), 3);
        let found = search.finish(Some("block".into()), vec![], true, None);
        assert!(found.tried[2].tolerance_multiple < 1.0);
        assert!(found.tried[2].float64_multiple.unwrap() > 4.0);
        // the first compile judged is the whole model's: it agreed, so nothing is a defect
        assert!(!found.differs() && found.defect().is_none());
    }

    #[test]
    fn where_the_whole_model_differs_the_module_found_is_the_defect() {
        let values: Vec<f64> = (0..64).map(|i| f64::from(i) / 7.0).collect();
        let off: Vec<f64> = values.iter().map(|v| v * 1.01).collect();
        let mut search = ModuleSearch::new("inductor", Tolerance::PerDtype);
        let (eager, compiled) = (outputs(&values), outputs(&off));
        assert!(
            search
                .judge("Model", vec![], &eager, &compiled, None)
                .unwrap()
        );
        assert!(
            search
                .judge("block", vec![], &eager, &compiled, None)
                .unwrap()
        );
        let found = search.finish(Some("block".into()), vec![], true, None);
        let defect = found.defect().expect("a defect");
        assert_eq!(
            (defect.layer.as_str(), defect.cause),
            ("block", Cause::CrossModuleFusion)
        );
        // a compile that gives another shape differs
        let short = outputs(&values[..32]);
        assert!(search.judge("block", vec![], &eager, &short, None).unwrap());
    }
}
