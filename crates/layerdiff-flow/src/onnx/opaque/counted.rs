//! The opaque target's runtime, every run counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use layerdiff_core::Tensor;
use layerdiff_onnx::Model;
use layerdiff_runtime::{NodePlacement, Optimized, ReducedMath, Runtime};

/// The target's runtime, every run counted (what the search reports). Shared with the
/// per-layer comparison of the node alone, so its runs count too.
pub(super) struct Counted {
    runtime: Arc<dyn Runtime + Send + Sync>,
    runs: Arc<AtomicUsize>,
}

impl Counted {
    pub(super) fn new(runtime: Box<dyn Runtime + Send + Sync>) -> Self {
        Self {
            runtime: runtime.into(),
            runs: Default::default(),
        }
    }

    /// Another handle on the same runtime and counts.
    pub(super) fn share(&self) -> Self {
        Self {
            runtime: self.runtime.clone(),
            runs: self.runs.clone(),
        }
    }

    pub(super) fn runs(&self) -> usize {
        self.runs.load(Ordering::Relaxed)
    }
}

impl Runtime for Counted {
    fn name(&self) -> &str {
        self.runtime.name()
    }
    fn detail(&self) -> String {
        self.runtime.detail()
    }
    fn options(&self) -> Vec<(String, String)> {
        self.runtime.options()
    }
    fn reduced_math(&self) -> Option<ReducedMath> {
        self.runtime.reduced_math()
    }
    fn kernels_per_graph(&self) -> Option<&'static str> {
        self.runtime.kernels_per_graph()
    }
    fn casts_half_per_graph(&self) -> bool {
        self.runtime.casts_half_per_graph()
    }
    fn rewrites(&self) -> bool {
        self.runtime.rewrites()
    }
    fn compiles_graph(&self) -> bool {
        self.runtime.compiles_graph()
    }
    fn optimize(&self, model: &Model) -> layerdiff_runtime::Result<Option<Optimized>> {
        // the rewritten graph runs on a runtime of its own: its runs count too
        Ok(self.runtime.optimize(model)?.map(|mut optimized| {
            optimized.runtime = Box::new(Counted {
                runtime: optimized.runtime.into(),
                runs: self.runs.clone(),
            });
            optimized
        }))
    }
    fn placement(&self, model: &Model, inputs: &[(String, Tensor)]) -> Option<NodePlacement> {
        self.runtime.placement(model, inputs)
    }
    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> layerdiff_runtime::Result<Vec<(String, Tensor)>> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.runtime.run(model, inputs, outputs)
    }
}
