//! Runtimes: ways of computing an ONNX model's values from given inputs: ONNX Runtime and
//! OpenVINO (loaded from their wheels) and tract (pure Rust). Adding one is a module with a
//! [`Runtime`], what its spelling parses to (a [`Configured`]) and one registration line
//! (`inventory::submit!(RuntimeKind { … })`, see [`spec`](RuntimeSpec)).
//!
//! Every runtime takes a [`Model`] (already edited to expose the values wanted), named input
//! tensors, and the names of the values to return; it hands back owned tensors in our own
//! [`Tensor`] type, so the comparator never sees a runtime's types.

mod error;
mod exact;
mod isolated;
mod library;
mod openvino_runtime;
mod ort_provider;
mod ort_runtime;
mod per_node;
mod releases;
mod spec;
mod threads;
mod tract_runtime;

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::Model;

pub use error::{Crash, CrashedNode, Error, Result};
pub use exact::ExactKernels;
pub use inventory;
pub use isolated::{Isolated, Isolation, WORKER_VERB, serve as serve_worker, set_worker_command};
pub use library::Wheel;
pub use openvino_runtime::{
    OPENVINO_LIBRARY_ENV, OPENVINO_PRECISIONS, OpenVinoRuntime, OpenVinoSpec,
};
pub use ort_provider::{Provider, ProviderOptions, TF32_OPS};
pub(crate) use ort_runtime::PluginParts;
pub use ort_runtime::{
    EpDevice, LIBRARY_ENV, OptLevel, OrtRuntime, OrtSpec, PluginEp, chosen_ort_library,
    find_ort_library, use_ort_library,
};
pub use per_node::{PerNode, Widened};
pub use releases::{RuntimeWheel, parse_release, release_needs, wheel_of, wheels};
pub use spec::{
    Configured, OtherSpelling, RuntimeKind, RuntimeSpec, kinds, nearest, op_backends, py_str,
};
pub use threads::{THREADS_ENV, cap_threads, thread_cap};
pub use tract_runtime::{TractRuntime, TractSpec};

/// Where a runtime placed a model's nodes: the provider asked for, and the nodes each
/// provider ran, most first (or why that could not be read).
pub type NodePlacement = (&'static str, Result<Vec<(String, usize)>>);

/// One way of computing an ONNX model's values.
pub trait Runtime {
    /// Short name used in reports (`onnxruntime`).
    fn name(&self) -> &str;
    /// Version, provider and options, in words.
    fn detail(&self) -> String;
    /// The options of its provider that change its numbers (`use_tf32` = `1`), as the runtime
    /// resolved them; empty where it has none.
    fn options(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Ops whose float32 math this runtime does in lower precision (TF32 on a GPU, OpenVINO's
    /// bfloat16 inference precision), and how: a layer whose difference that grid explains
    /// then reads as precision, not a defect. A runtime that narrows without saying so here
    /// is reported as computing otherwise.
    fn reduced_math(&self) -> Option<ReducedMath> {
        None
    }
    /// The device provider, when it may choose kernels per graph (a GPU provider picks
    /// convolution and matmul algorithms, TF32 and the like for the graph it is given), so a
    /// value computed in a segment of the graph need not have the bits of the whole run's.
    fn kernels_per_graph(&self) -> Option<&'static str> {
        None
    }
    /// Whether it computes float16 and bfloat16 nodes it has no kernel for in float32, through
    /// casts it places for each graph it is given (ONNX Runtime's CPU provider), so a segment of
    /// a float16 graph may round a value differently from the whole graph.
    fn casts_half_per_graph(&self) -> bool {
        false
    }
    /// Whether this runtime rewrites a model before running it (ONNX Runtime above
    /// `opt=disable`), so that exposing values for comparison changes what it runs.
    fn rewrites(&self) -> bool {
        false
    }
    /// Whether it compiles each graph it is given, fusing what no output reads (OpenVINO), so
    /// that a graph with every value an output computes otherwise than the file's own: the
    /// flow measures both where it asks for values ([`Runtime::rewrites`] hands back the
    /// rewritten graph instead, where a runtime can).
    fn compiles_graph(&self) -> bool {
        false
    }
    /// What a worker that runs this side tells the process that started it, for that process
    /// to describe the side without loading its library (OpenVINO's plugin in another
    /// release); `None` where that process describes the side itself.
    fn facts(&self) -> Option<serde_json::Value> {
        None
    }
    /// The graph this runtime really runs, when it rewrites a model before running it (ONNX
    /// Runtime above `opt=disable`): the rewritten model as the runtime saves it, and a runtime
    /// that runs it as saved. `None` when the model runs as written.
    fn optimize(&self, _model: &Model) -> Result<Option<Optimized>> {
        Ok(None)
    }
    /// [`Runtime::optimize`], and `model`'s `outputs` on `inputs` as the runtime computes the
    /// model it was handed (rewritten, no value exposed): from the session that optimized it
    /// where the runtime can (one session fewer), else by a run of their own.
    fn optimize_and_run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Option<(Optimized, Outputs)>> {
        let Some(optimized) = self.optimize(model)? else {
            return Ok(None);
        };
        Ok(Some((optimized, self.run(model, inputs, outputs)?)))
    }
    /// Which execution provider runs how many of `model`'s nodes, most first, and the one
    /// asked for, where a runtime can place nodes elsewhere than asked (ONNX Runtime on a
    /// provider other than the CPU); `None` where every node runs where asked.
    fn placement(&self, _model: &Model, _inputs: &[(String, Tensor)]) -> Option<NodePlacement> {
        None
    }
    /// Runs `model` on `inputs` and returns the requested values in the order asked.
    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Vec<(String, Tensor)>>;
    /// Runs `model` twice on the same inputs, to see whether it agrees with itself: computing
    /// `outputs`, as the first run did (a runtime may compute a value otherwise when fewer are
    /// asked for: it fuses what no output reads), and handing back only those in `keep`.
    fn run_twice(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
        keep: &[String],
    ) -> Result<[Vec<(String, Tensor)>; 2]> {
        let run = || -> Result<Vec<(String, Tensor)>> {
            let mut values = self.run(model, inputs, outputs)?;
            values.retain(|(name, _)| keep.contains(name));
            Ok(values)
        };
        Ok([run()?, run()?])
    }
}

/// Float32 math a runtime does in lower precision: for which ops, and how, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReducedMath {
    /// The op types it applies to (`MatMul`, `Conv`).
    pub ops: &'static [&'static str],
    /// The dtype those ops compute and hold their values in, where it is one (OpenVINO's
    /// bfloat16 or float16 inference precision: operands and results on that grid); `None`
    /// where only the products are narrower (TF32) and the values stay float32.
    pub grid: Option<DType>,
    /// A sentence: who, how, and how to turn it off.
    pub how: String,
}

/// Values a run hands back, each by name, in the order asked.
pub type Outputs = Vec<(String, Tensor)>;

/// A model as a runtime rewrote it (see [`Runtime::optimize`]).
pub struct Optimized {
    /// The rewritten graph, read back from the runtime's saved file.
    pub model: Model,
    /// Runs it as saved, rewriting nothing more.
    pub runtime: Box<dyn Runtime + Send + Sync>,
    /// The folder of the saved file: keep it while the model is in use (its external data is
    /// read from there).
    pub folder: tempfile::TempDir,
}
