//! ONNX Runtime through the `ort` crate, with the shared library loaded at run time.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::Model;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, TensorElementType, TensorRef, ValueRef};

use crate::ort_provider::{ProviderOptions, TF32_OPS};
use crate::{Error, Optimized, Provider, ReducedMath, Result, Runtime};

mod library;
mod plugin;
mod profile;
pub(crate) mod release;
mod said;
mod spec;
mod values;
mod weights;
pub(crate) use library::ORT_WHEEL;
pub(crate) use library::named_release;
pub use library::{LIBRARY_ENV, chosen_ort_library, find_ort_library, use_ort_library};
use library::{ORT, load, version_from_path};
pub(crate) use plugin::PluginParts;
pub use plugin::{EpDevice, PluginEp};
use said::clean_message;
pub(crate) use said::refused;
pub use spec::{OptLevel, OrtSpec};
use values::{from_ort_value, to_ort_input};
use weights::{Split, WithWeights};

#[cfg(test)]
mod tests;

/// ONNX Runtime on one execution provider.
#[derive(Debug, Clone)]
pub struct OrtRuntime {
    /// Graph optimization level.
    pub opt_level: OptLevel,
    /// Execution provider.
    pub provider: Provider,
    /// The options the user gave the provider (`use_tf32` = `0`).
    options: ProviderOptions,
    /// The options that change its numbers, as ONNX Runtime resolved them.
    resolved: ProviderOptions,
    /// Intra-op threads (`None`: ONNX Runtime's default, one per core): `LAYERDIFF_THREADS`.
    pub intra_threads: Option<usize>,
    /// Graph optimizers not to run at [`Self::opt_level`] (ONNX Runtime's names).
    pub disabled_optimizers: Vec<String>,
    /// Custom-op libraries every session registers.
    pub custom_ops: Vec<PathBuf>,
    /// The level at which ONNX Runtime already optimized the graph this runtime runs (see
    /// [`Runtime::optimize`]); `None` for a file run as given.
    optimized_at: Option<OptLevel>,
    library: PathBuf,
    version: String,
    /// The execution provider chosen through the device API instead of `provider` (see
    /// [`OrtRuntime::with_plugin`]): its spec, its name, and its devices here.
    plugin: Option<(PluginEp, String, Vec<EpDevice>)>,
}

impl OrtRuntime {
    /// Loads ONNX Runtime (once per process) from `library`, or from [`crate::find_ort_library`].
    pub fn new(library: Option<&Path>, opt_level: OptLevel) -> Result<Self> {
        let intra_threads = crate::thread_cap()?;
        let cell = ORT.get_or_init(|| Mutex::new(None));
        let mut guard = cell.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let path = match library {
                Some(p) => p.to_path_buf(),
                None => crate::find_ort_library()?,
            };
            *guard = Some(load(&path));
        }
        match guard.as_ref().expect("set above") {
            Ok(loaded) => Ok(Self {
                opt_level,
                provider: Provider::Cpu,
                options: Vec::new(),
                resolved: Vec::new(),
                intra_threads,
                disabled_optimizers: Vec::new(),
                custom_ops: Vec::new(),
                optimized_at: None,
                library: loaded.path.clone(),
                version: loaded.version.clone(),
                plugin: None,
            }),
            Err(message) => Err(Error::LibraryLoad {
                runtime: "ONNX Runtime",
                path: library.map(Path::to_path_buf).unwrap_or_default(),
                message: message.clone(),
            }),
        }
    }

    /// The same runtime on another execution provider, with `options` in ONNX Runtime's names
    /// (`use_tf32` = `0`). Fails, naming the reason, when this ONNX Runtime build does not have
    /// that provider, or it refuses an option.
    pub fn with_provider(
        mut self,
        provider: Provider,
        options: &[(String, String)],
    ) -> Result<Self> {
        if !provider.is_built_in() {
            let available: Vec<&str> = Provider::ALL
                .into_iter()
                .filter(|p| p.is_built_in())
                .map(Provider::ort_name)
                .collect();
            {
                return Err(Error::ProviderUnavailable {
                    provider: provider.spelling(),
                    reason: format!(
                        "the ONNX Runtime at `{}` was built without {} (it has: {}); a build with it \
                         is needed ({}), pointed to by `{}`",
                        self.library.display(),
                        provider.ort_name(),
                        available.join(", "),
                        provider.build_hint(),
                        crate::LIBRARY_ENV
                    ),
                });
            }
        }
        if !options.is_empty() && !provider.takes_options() {
            return Err(Error::ProviderUnavailable {
                provider: provider.spelling(),
                reason: format!("{} takes no options here", provider.ort_name()),
            });
        }
        self.resolved = provider
            .resolve(options)
            .map_err(|reason| Error::ProviderUnavailable {
                provider: provider.spelling(),
                reason: clean_message(reason),
            })?;
        self.provider = provider;
        self.options = options.to_vec();
        Ok(self)
    }

    /// The same runtime with these graph optimizers disabled (ONNX Runtime's names, such as
    /// `NchwcTransformer`): the switch a bisection of its optimizers flips.
    pub fn without(mut self, optimizers: &[String]) -> Self {
        self.disabled_optimizers = optimizers.to_vec();
        self
    }

    /// The same runtime registering these custom-op libraries in every session (a vendor's
    /// kernels for ops of its own domain). A library that is not a file is refused here, by name;
    /// one that ONNX Runtime cannot load is refused when a session is made.
    pub fn with_custom_ops(mut self, libraries: &[PathBuf]) -> Result<Self> {
        for library in libraries {
            if !library.is_file() {
                return Err(Error::CustomOps(format!(
                    "custom-op library `{}` is not a file",
                    library.display()
                )));
            }
        }
        self.custom_ops = libraries.to_vec();
        Ok(self)
    }

    /// The graph ONNX Runtime optimizes `model` into, saved and read back, and, where
    /// `outputs` are asked for, those computed on `inputs` by the session that optimized it.
    fn optimized(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: Option<&[String]>,
    ) -> Result<Option<(Optimized, Option<crate::Outputs>)>> {
        if !self.rewrites() {
            return Ok(None);
        }
        let failed = |e: &dyn std::fmt::Display| Error::SaveOptimized(e.to_string());
        let folder = tempfile::tempdir().map_err(|e| failed(&e))?;
        let path = folder.path().join("optimized.onnx");
        let mut session = self.session_with(model, Some(&path), None)?;
        let out = outputs
            .map(|outputs| run_session(&mut session, inputs, outputs))
            .transpose()?;
        drop(session);
        let saved = Model::load(&path).map_err(|e| failed(&e))?;
        let optimized = Optimized {
            model: saved,
            runtime: Box::new(self.as_saved()),
            folder,
        };
        Ok(Some((optimized, out)))
    }

    /// The runtime that runs the graph this one optimized (see [`Runtime::optimize`]) as saved,
    /// rewriting nothing more.
    pub fn as_saved(&self) -> Self {
        Self {
            opt_level: OptLevel::Disable,
            optimized_at: Some(self.opt_level),
            ..self.clone()
        }
    }

    /// The library file in use.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// This runtime described as running on another library (`release`: its file): what a side
    /// that runs it in a worker process says it is, its release as that worker told it
    /// (`version`), else as the file's name says. It runs nothing in this process (see
    /// [`crate::Isolated`]).
    pub(crate) fn labelled(self, release: &Path, version: Option<&str>) -> Self {
        Self {
            library: release.to_path_buf(),
            version: version.map_or_else(|| version_from_path(release), str::to_string),
            ..self
        }
    }

    /// The release of the library in use (`1.31.1`), as the library says (its file's name
    /// where it does not).
    pub fn version(&self) -> &str {
        &self.version
    }

    fn session(&self, model: &Model) -> Result<WithWeights> {
        self.session_with(model, None, None)
    }

    /// A session on `model`; with `optimized`, ONNX Runtime also saves the graph it optimized
    /// there (its external data beside it); with `profile`, it profiles to files of that prefix.
    /// Its weights are handed over where they lie in memory (see [`weights`]).
    fn session_with(
        &self,
        model: &Model,
        optimized: Option<&Path>,
        profile: Option<&Path>,
    ) -> Result<WithWeights> {
        let cell = ORT.get().expect("initialised in new");
        let guard = cell.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Ok(loaded)) = guard.as_ref() else {
            unreachable!("OrtRuntime exists only once loaded")
        };
        let session_error = |e: ort::Error<_>| refused(clean_message(e.to_string()));
        let mut builder = Session::builder(&loaded.env)
            .map_err(|e| refused(clean_message(e.to_string())))?
            .with_optimization_level(self.opt_level.to_ort())
            .map_err(session_error)?;
        if let Some((_, ep, _)) = &self.plugin {
            builder = plugin::on_devices(builder, &loaded.env, ep, &self.options)?;
        } else if let Some(dispatch) = self.provider.dispatch(&self.options) {
            builder = builder
                .with_execution_providers([dispatch.error_on_failure()])
                .map_err(|e| Error::ProviderUnavailable {
                    provider: self.provider.spelling(),
                    reason: clean_message(e.to_string()),
                })?;
        }
        if !self.disabled_optimizers.is_empty() && self.opt_level != OptLevel::Disable {
            builder = builder
                .with_config_entry(
                    "optimization.disable_specified_optimizers",
                    self.disabled_optimizers.join(";"),
                )
                .map_err(session_error)?;
        }
        if let Some(n) = self.intra_threads {
            builder = builder.with_intra_threads(n).map_err(session_error)?;
        }
        for library in &self.custom_ops {
            builder = builder.with_operator_library(library).map_err(|e| {
                Error::CustomOps(format!(
                    "ONNX Runtime cannot load the custom-op library `{}`: {}",
                    library.display(),
                    clean_message(e.to_string())
                ))
            })?;
        }
        if !model.external_data_files().is_empty() {
            // Loaded from memory, ONNX Runtime resolves external data against this folder (the
            // original model's), so nothing is copied and nothing is written beside the model.
            let folder = model.base_dir().unwrap_or(Path::new("."));
            builder = builder
                .with_config_entry(
                    "session.model_external_initializers_file_folder_path",
                    folder.to_string_lossy(),
                )
                .map_err(session_error)?;
        }
        if let Some(prefix) = profile {
            builder = builder.with_profiling(prefix).map_err(session_error)?;
        }
        if let Some(path) = optimized {
            builder = builder
                .with_optimized_model_path(path)
                .map_err(session_error)?;
            if !model.external_data_files().is_empty() {
                builder = builder
                    .with_config_entry(
                        "session.optimized_model_external_initializers_file_name",
                        "optimized.onnx.data",
                    )
                    .map_err(session_error)?;
            }
        }
        let split = Split::of(model);
        let session = split
            .hand_over(builder)?
            .commit_from_memory(&split.graph)
            .map_err(|e| refused(clean_message(e.to_string())))?;
        Ok(split.holding(session))
    }
}

impl Runtime for OrtRuntime {
    fn name(&self) -> &str {
        "onnxruntime"
    }

    fn detail(&self) -> String {
        let optimizations = match self.optimized_at {
            Some(level) => format!(
                "graph optimizations: {} (applied once; the saved optimized graph runs as saved)",
                level.name()
            ),
            None => format!("graph optimizations: {}", self.opt_level.name()),
        };
        let optimizations = if self.disabled_optimizers.is_empty() {
            optimizations
        } else {
            format!(
                "{optimizations} without {}",
                self.disabled_optimizers.join(", ")
            )
        };
        let optimizations = if self.custom_ops.is_empty() {
            optimizations
        } else {
            let names: Vec<String> = self
                .custom_ops
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            format!("{optimizations}, custom ops from {}", names.join(", "))
        };
        let options = if self.resolved.is_empty() {
            String::new()
        } else {
            let pairs: Vec<String> = self
                .resolved
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!(" ({})", pairs.join(", "))
        };
        let provider = match &self.plugin {
            Some((plugin, ep, devices)) => plugin::words(plugin, ep, devices),
            None => self.provider.ort_name().to_string(),
        };
        format!(
            "onnxruntime {}, {provider}{options}, {optimizations}{}",
            self.version,
            crate::threads::threads_words(self.intra_threads)
        )
    }

    fn options(&self) -> ProviderOptions {
        self.resolved.clone()
    }

    fn facts(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "version": self.version }))
    }

    fn reduced_math(&self) -> Option<ReducedMath> {
        let tf32 = self.provider == Provider::Cuda
            && self
                .resolved
                .iter()
                .any(|(k, v)| k == "use_tf32" && v != "0");
        tf32.then(|| ReducedMath {
            ops: &TF32_OPS,
            grid: None,
            how: format!(
                "{} multiplies float32 in TF32 here (use_tf32=1: products of 10-bit mantissas); \
                 `ort:cuda:use_tf32=0` runs it in full float32",
                self.provider.ort_name()
            ),
        })
    }

    fn placement(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
    ) -> Option<crate::NodePlacement> {
        (self.provider != Provider::Cpu)
            .then(|| (self.provider.ort_name(), self.node_placement(model, inputs)))
    }

    /// Lets ONNX Runtime optimize `model` at this runtime's level and save the graph, which is
    /// read back and run with optimizations off (it is already optimized: running it again
    /// would let values exposed for comparison undo fusions).
    fn kernels_per_graph(&self) -> Option<&'static str> {
        (self.provider != Provider::Cpu).then(|| self.provider.ort_name())
    }

    fn casts_half_per_graph(&self) -> bool {
        self.provider == Provider::Cpu
    }

    fn rewrites(&self) -> bool {
        self.opt_level != OptLevel::Disable
    }

    fn optimize(&self, model: &Model) -> Result<Option<Optimized>> {
        Ok(self
            .optimized(model, &[], None)?
            .map(|(optimized, _)| optimized))
    }

    fn optimize_and_run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Option<(Optimized, crate::Outputs)>> {
        let Some((optimized, out)) = self.optimized(model, inputs, Some(outputs))? else {
            return Ok(None);
        };
        Ok(Some((optimized, out.unwrap_or_default())))
    }

    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Vec<(String, Tensor)>> {
        let mut session = self.session(model)?;
        run_session(&mut session, inputs, outputs)
    }

    /// Both runs in one session: a kernel with state (an unseeded random op) or racy
    /// reductions show up, which two fresh sessions could hide.
    fn run_twice(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        _outputs: &[String],
        keep: &[String],
    ) -> Result<[Vec<(String, Tensor)>; 2]> {
        // A session computes every output of the model whichever are copied out.
        let mut session = self.session(model)?;
        Ok([
            run_session(&mut session, inputs, keep)?,
            run_session(&mut session, inputs, keep)?,
        ])
    }
}

fn run_session(
    session: &mut Session,
    inputs: &[(String, Tensor)],
    outputs: &[String],
) -> Result<Vec<(String, Tensor)>> {
    let wanted: Vec<String> = session
        .inputs()
        .iter()
        .map(|i| i.name().to_string())
        .collect();
    let mut feed: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = Vec::with_capacity(wanted.len());
    for name in &wanted {
        let Some((_, tensor)) = inputs.iter().find(|(n, _)| n == name) else {
            let given: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
            return Err(Error::Inputs(format!(
                "the model needs input `{name}`, but only {given:?} were given"
            )));
        };
        feed.push((Cow::Owned(name.clone()), to_ort_input(name, tensor)?));
    }
    let mut results = session
        .run(feed)
        .map_err(|e| Error::Run(clean_message(e.to_string())))?;
    // Each value is copied out and its runtime buffer freed before the next: the outputs are
    // held once, plus one value in transit, never twice.
    outputs
        .iter()
        .map(|name| {
            let value = results.remove(name).ok_or_else(|| {
                Error::Run(format!("ONNX Runtime returned no value named `{name}`"))
            })?;
            Ok((name.clone(), from_ort_value(name, &value.view())?))
        })
        .collect()
}
