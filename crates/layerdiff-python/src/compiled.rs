//! Across modules, for a torch.compile target, across the boundary: the compiles the PyTorch
//! adapter makes, judged and recorded by the engine (`layerdiff_flow::verbs::bisect::modules`).

use layerdiff_flow::verbs::bisect::modules;
use pyo3::prelude::*;

use crate::Report;
use crate::exceptions::to_py_err;
use crate::options::Options;
use crate::tensors::FlatTensor;

/// The compiles of one search for the smallest module whose compiled form differs, each judged
/// as `layerdiff check` judges an output.
#[pyclass(module = "layerdiff._layerdiff")]
pub(crate) struct ModuleSearch(modules::ModuleSearch);

fn owned(tensors: &[FlatTensor<'_>]) -> PyResult<Vec<(String, layerdiff_core::Tensor)>> {
    tensors
        .iter()
        .map(|t| Ok((t.name().to_string(), t.to_tensor()?)))
        .collect()
}

#[pymethods]
impl ModuleSearch {
    /// A search of `backend`'s compiles, held to the tolerances `options` choose.
    #[new]
    fn new(options: &Options, backend: &str) -> Self {
        Self(modules::ModuleSearch::new(
            backend,
            options.settings.tolerance,
        ))
    }

    /// Judges one compile of `module` (`eager`: its submodules left eager in it): its outputs
    /// `compiled` against it eager (`reference`), and both against it in float64 (`truth`)
    /// where given; records it; returns whether it differs.
    #[pyo3(signature = (module, eager, reference, compiled, truth=None))]
    fn judge(
        &mut self,
        py: Python<'_>,
        module: &str,
        eager: Vec<String>,
        reference: Vec<FlatTensor<'_>>,
        compiled: Vec<FlatTensor<'_>>,
        truth: Option<Vec<FlatTensor<'_>>>,
    ) -> PyResult<bool> {
        let (reference, compiled) = (owned(&reference)?, owned(&compiled)?);
        let truth = truth.as_deref().map(owned).transpose()?;
        let search = &mut self.0;
        py.detach(|| search.judge(module, eager, &reference, &compiled, truth.as_deref()))
            .map_err(to_py_err)
    }

    /// The last compile judged, in words, or None.
    #[getter]
    fn last_words(&self) -> Option<String> {
        self.0.last_words()
    }

    /// How many compiles were judged.
    #[getter]
    fn compiles(&self) -> usize {
        self.0.compiles()
    }

    /// `report` with this search recorded: `module`, the smallest module whose compiled form
    /// differs (`needs`: the submodules it needs compiled in it; `checked`: compiled once more
    /// it differs again); `not_searched`: why the whole model's difference was not searched.
    /// Where a module was found, it is the report's defect.
    #[pyo3(signature = (report, module=None, needs=Vec::new(), checked=false, not_searched=None))]
    fn recorded(
        &self,
        report: &Report,
        module: Option<String>,
        needs: Vec<String>,
        checked: bool,
        not_searched: Option<String>,
    ) -> Report {
        let mut out = report.0.clone();
        out.compiled_whole(self.0.finish(module, needs, checked, not_searched));
        Report(out)
    }
}
