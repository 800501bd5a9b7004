//! ONNX Runtime's spelling: `ort` (CPU execution provider, optimizations off), `ort:cuda`,
//! `ort:opt=basic|extended|all` and combinations (`ort:cuda:opt=all`), some optimizers
//! disabled at a level (`ort:opt=all:without=NchwcTransformer`), a provider's own options in
//! ONNX Runtime's names (`ort:cuda:use_tf32=0`), custom-op libraries to register
//! (`ort:custom_ops=/path/libvendor_ops.so`), another ONNX Runtime library than the one
//! layerdiff loads (`ort:lib=/path/libonnxruntime.so.1.30.0`: an older release, a vendor's
//! build), an execution provider chosen through ONNX Runtime's device API, a plugin library's
//! (`ort:ep_lib=/path/libvendor_ep.so[:ep=NAME]`) or a built-in one (`ort:ep=NAME`). What such
//! a side builds, how its worker starts, and its repro.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use ort::session::builder::GraphOptimizationLevel;

use super::release::release_command;
use crate::spec::{py_str, release_note};
use crate::{
    Configured, OrtRuntime, PluginEp, PluginParts, Provider, ProviderOptions, Result, Runtime,
    RuntimeKind, RuntimeSpec,
};

inventory::submit!(RuntimeKind {
    name: "ort",
    listed: "`ort` (ONNX Runtime: `ort:cuda`, `ort:opt=all`…)",
    rank: 0,
    parse: |text| OrtSpec::parse(text).map(RuntimeSpec::from),
    // the CPU as the file is written and as ONNX Runtime optimizes it; each device's provider
    op_backends: || {
        let devices = crate::Provider::ALL
            .into_iter()
            .filter(|p| *p != crate::Provider::Cpu)
            .map(|p| format!("ort:{}", p.spelling()));
        ["ort".to_string(), "ort:opt=all".to_string()]
            .into_iter()
            .chain(devices)
            .collect()
    },
    wheel: Some(&super::ORT_WHEEL),
});

impl RuntimeSpec {
    /// ONNX Runtime on the CPU with graph optimizations off: every value exists as written.
    pub fn ort_cpu() -> Self {
        OrtSpec::default().into()
    }

    /// ONNX Runtime's settings, where it is ONNX Runtime.
    pub fn ort(&self) -> Option<&OrtSpec> {
        self.get()
    }
}

/// ONNX Runtime as a spelling sets it up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrtSpec {
    /// The execution provider.
    pub provider: Provider,
    /// The graph optimization level.
    pub level: OptLevel,
    /// The provider's options, in ONNX Runtime's names.
    pub options: ProviderOptions,
    /// The optimizers disabled at the level (their names, as the session's
    /// `optimization.disable_specified_optimizers` takes them).
    pub without: Vec<String>,
    /// The custom-op libraries its sessions register (a vendor's kernels: code layerdiff does
    /// not trust, so a side that loads one runs in a worker process, see [`crate::Isolation`]).
    pub custom_ops: Vec<PathBuf>,
    /// The ONNX Runtime library it runs on where it is not the one layerdiff loads (ONNX
    /// Runtime is loaded once per process, so such a side always runs in a worker process).
    pub release: Option<PathBuf>,
    /// An execution provider chosen through ONNX Runtime's device API instead of the provider,
    /// where one is (`ep=NAME`, a plugin library's `ep_lib=PATH`).
    pub plugin: Option<PluginEp>,
}

impl OrtSpec {
    /// ONNX Runtime on `provider` at `level`, nothing else set.
    pub fn on(provider: Provider, level: OptLevel) -> Self {
        Self {
            provider,
            level,
            ..Self::default()
        }
    }

    /// Parses `ort[:PROVIDER][:opt=LEVEL][:without=NAME,…][:custom_ops=PATH,…][:lib=PATH][:ep_lib=PATH][:ep=NAME][:KEY=VALUE]…`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let unknown = || {
            format!(
                "unknown runtime `{text}` (expected `ort[:PROVIDER][:opt=LEVEL][:without=NAME,…][:custom_ops=PATH,…][:lib=LIBRARY][:KEY=VALUE]…` with \
                 PROVIDER one of cpu, cuda, tensorrt, rocm, openvino, coreml, directml, LEVEL one of \
                 disable, basic, extended, all, NAME an ONNX Runtime optimizer to disable, PATH a custom-op library to register, \
                 LIBRARY another ONNX Runtime library to run on (libonnxruntime.so of another release or build), \
                 `ep_lib=` an execution provider's plugin library to register and `ep=` the execution provider whose devices to run on, \
                 and KEY=VALUE the provider's options in ONNX Runtime's names (`use_tf32=0`))"
            )
        };
        let mut parts = text.split(':');
        if parts.next() != Some("ort") {
            return Err(unknown());
        }
        let (mut provider, mut level) = (None, None);
        let mut spec = Self::default();
        let mut plugin = PluginParts::default();
        for part in parts {
            if plugin.take(part) {
            } else if let Some(path) = part.strip_prefix("lib=") {
                if spec.release.replace(PathBuf::from(path)).is_some() || path.is_empty() {
                    return Err(unknown());
                }
            } else if let Some(paths) = part.strip_prefix("custom_ops=") {
                if !spec.custom_ops.is_empty() || paths.split(',').any(str::is_empty) {
                    return Err(unknown());
                }
                spec.custom_ops = paths.split(',').map(PathBuf::from).collect();
            } else if let Some(names) = part.strip_prefix("without=") {
                match optimizer_names(names) {
                    Some(names) if spec.without.is_empty() => spec.without = names,
                    _ => return Err(unknown()),
                }
            } else if let Some(l) = part.strip_prefix("opt=") {
                let parsed = OptLevel::ALL.into_iter().find(|o| o.name() == l);
                if level.is_some() {
                    return Err(format!("`{text}`: `opt=` is given twice"));
                }
                level = Some(parsed.ok_or_else(|| {
                    format!(
                        "`{text}`: unknown optimization level `{l}` (expected disable, basic, extended or all)"
                    )
                })?);
            } else if let Some((key, value)) = part.split_once('=') {
                if key.is_empty() || value.is_empty() {
                    return Err(unknown());
                }
                spec.options.push((key.to_string(), value.to_string()));
            } else {
                let parsed = Provider::ALL.into_iter().find(|p| p.spelling() == part);
                if provider.is_some() && parsed.is_some() {
                    return Err(format!(
                        "`{text}`: two execution providers (`ort:PROVIDER` takes one)"
                    ));
                }
                provider = Some(parsed.ok_or_else(|| {
                    let known: Vec<&str> = Provider::ALL.iter().map(|p| p.spelling()).collect();
                    format!(
                        "`{text}`: unknown execution provider `{part}` (expected one of {}; a provider's option is KEY=VALUE)",
                        known.join(", ")
                    )
                })?);
            }
        }
        spec.provider = provider.unwrap_or_default();
        if !spec.options.is_empty() && !spec.provider.takes_options() && plugin.is_empty() {
            let given: Vec<String> = (spec.options.iter())
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            return Err(format!(
                "`{text}`: options ({}) are for an execution provider that takes them, such as \
                 `ort:cuda:{}`; {} takes none",
                given.join(", "),
                given.join(":"),
                spec.provider.ort_name()
            ));
        }
        spec.level = level.unwrap_or_default();
        if !spec.without.is_empty() && spec.level == OptLevel::Disable {
            return Err(format!(
                "`{text}`: `without=` disables ONNX Runtime graph optimizers, which run only at \
                 `opt=basic`, `opt=extended` or `opt=all` (e.g. `ort:opt=all:without={}`)",
                spec.without.join(",")
            ));
        }
        spec.plugin = plugin.finish(text, spec.provider)?;
        Ok(spec)
    }

    /// The session's settings as an older release's worker (`release_worker.py`) takes them.
    fn worker_settings(&self) -> Vec<OsString> {
        let mut settings: Vec<OsString> = vec![
            "--provider".into(),
            self.provider.ort_name().into(),
            "--spelling".into(),
            self.provider.spelling().into(),
            "--opt".into(),
            self.level.name().into(),
        ];
        for (key, value) in &self.options {
            settings.extend(["--option".into(), format!("{key}={value}").into()]);
        }
        for name in &self.without {
            settings.extend(["--without".into(), name.into()]);
        }
        for path in &self.custom_ops {
            settings.extend(["--custom-ops".into(), path.into()]);
        }
        settings
    }

    /// ONNX Runtime as this spec sets it up, loaded from `library` (or as the process chose)
    /// where this process has not loaded it yet.
    fn runtime(&self, library: Option<&Path>) -> Result<OrtRuntime> {
        let runtime = OrtRuntime::new(library, self.level)?;
        let runtime = match &self.plugin {
            Some(plugin) => runtime.with_plugin(plugin, &self.options)?,
            None => runtime.with_provider(self.provider, &self.options)?,
        };
        runtime
            .without(&self.without)
            .with_custom_ops(&self.custom_ops)
    }
}

impl Configured for OrtSpec {
    fn spelling(&self) -> String {
        let mut s = "ort".to_string();
        if self.provider != Provider::Cpu {
            s.push(':');
            s.push_str(self.provider.spelling());
        }
        if self.level != OptLevel::Disable {
            s.push_str(":opt=");
            s.push_str(self.level.name());
        }
        if !self.without.is_empty() {
            s.push_str(":without=");
            s.push_str(&self.without.join(","));
        }
        if !self.custom_ops.is_empty() {
            let paths: Vec<String> = (self.custom_ops.iter())
                .map(|p| p.display().to_string())
                .collect();
            s.push_str(":custom_ops=");
            s.push_str(&paths.join(","));
        }
        if let Some(release) = &self.release {
            s.push_str(":lib=");
            s.push_str(&release.display().to_string());
        }
        if let Some(plugin) = &self.plugin {
            s.push_str(&plugin.spelling());
        }
        for (k, v) in &self.options {
            s.push_str(&format!(":{k}={v}"));
        }
        s
    }

    fn build_here(&self, as_saved: bool) -> Result<Box<dyn Runtime + Send + Sync>> {
        let runtime = self.runtime(self.release.as_deref())?;
        Ok(Box::new(if as_saved {
            runtime.as_saved()
        } else {
            runtime
        }))
    }

    fn described_here(
        &self,
        as_saved: bool,
        facts: Option<&serde_json::Value>,
    ) -> Result<Box<dyn Runtime + Send + Sync>> {
        let Some(release) = &self.release else {
            return self.build_here(as_saved);
        };
        let version = facts.and_then(|f| f["version"].as_str());
        let runtime = self.runtime(None)?.labelled(release, version);
        Ok(Box::new(if as_saved {
            runtime.as_saved()
        } else {
            runtime
        }))
    }

    fn release(&self) -> Option<&Path> {
        self.release.as_deref()
    }

    fn loads_vendor_code(&self) -> bool {
        !self.custom_ops.is_empty() || (self.plugin.as_ref()).is_some_and(|p| p.library.is_some())
    }

    fn asks_worker(&self) -> bool {
        // a library whose file name does not say its release (a vendor's `libonnxruntime.so`)
        (self.release.as_deref()).is_some_and(|l| super::release::release_of(l).is_none())
    }

    fn told(&self, facts: &serde_json::Value) -> bool {
        facts["version"].is_string()
    }

    fn release_worker(&self, as_saved: bool) -> Result<Option<Vec<OsString>>> {
        match &self.release {
            Some(library) => release_command(library, self.worker_settings(), as_saved),
            None => Ok(None),
        }
    }

    fn repro(&self, _inputs: &[String]) -> (&'static str, String) {
        let level = match self.level {
            OptLevel::Disable => "ORT_DISABLE_ALL",
            OptLevel::Basic => "ORT_ENABLE_BASIC",
            OptLevel::Extended => "ORT_ENABLE_EXTENDED",
            OptLevel::All => "ORT_ENABLE_ALL",
        };
        let mut session_options = String::new();
        if !self.without.is_empty() {
            session_options += &format!(
                "    options.add_session_config_entry(\n        \"optimization.disable_specified_optimizers\", {}\n    )\n",
                py_str(&self.without.join(";"))
            );
        }
        for library in &self.custom_ops {
            session_options += &format!(
                "    options.register_custom_ops_library({})\n",
                py_str(&library.display().to_string())
            );
        }
        let provider_options: Vec<String> = (self.options.iter())
            .map(|(k, v)| format!("{}: {}", py_str(k), py_str(v)))
            .collect();
        let provider = if provider_options.is_empty() {
            py_str(self.provider.ort_name())
        } else {
            format!(
                "({}, {{{}}})",
                py_str(self.provider.ort_name()),
                provider_options.join(", ")
            )
        };
        (
            "onnxruntime",
            format!(
                "{}    import onnxruntime as ort\n\n    options = ort.SessionOptions()\n    options.graph_optimization_level = ort.GraphOptimizationLevel.{level}\n{session_options}    session = ort.InferenceSession(\n        str(HERE / \"model.onnx\"), options, providers=[{provider}]\n    )\n    names = [o.name for o in session.get_outputs()]\n    return dict(zip(names, session.run(names, inputs)))\n",
                release_note(self.release.as_deref())
            ),
        )
    }
}

/// `without=`'s names of ONNX Runtime graph optimizers, where each is one.
fn optimizer_names(names: &str) -> Option<Vec<String>> {
    let names: Vec<&str> = names.split(',').map(str::trim).collect();
    let name = |n: &&str| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    names
        .iter()
        .all(name)
        .then(|| names.into_iter().map(String::from).collect())
}

/// ONNX Runtime's graph optimization level. layerdiff defaults to [`OptLevel::Disable`] so every
/// node's value exists as written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OptLevel {
    /// No graph rewrites: every value exists as written.
    #[default]
    Disable,
    /// Constant folding and redundant-node removal.
    Basic,
    /// Basic plus complex node fusions.
    Extended,
    /// Everything, layout changes included.
    All,
}

impl OptLevel {
    /// Every level, from none to all.
    pub const ALL: [Self; 4] = [Self::Disable, Self::Basic, Self::Extended, Self::All];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            OptLevel::Disable => "disable",
            OptLevel::Basic => "basic",
            OptLevel::Extended => "extended",
            OptLevel::All => "all",
        }
    }

    pub(super) fn to_ort(self) -> GraphOptimizationLevel {
        match self {
            OptLevel::Disable => GraphOptimizationLevel::Disable,
            OptLevel::Basic => GraphOptimizationLevel::Level1,
            OptLevel::Extended => GraphOptimizationLevel::Level2,
            OptLevel::All => GraphOptimizationLevel::All,
        }
    }
}
