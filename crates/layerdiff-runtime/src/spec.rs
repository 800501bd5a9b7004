//! Runtimes are spelled the same way everywhere: `ort` (CPU execution provider, optimizations
//! off), `ort:cuda`, `ort:opt=basic|extended|all` and combinations (`ort:cuda:opt=all`), some
//! optimizers disabled at a level (`ort:opt=all:without=NchwcTransformer`), a
//! provider's own options in ONNX Runtime's names (`ort:cuda:use_tf32=0`), custom-op libraries
//! to register (`ort:custom_ops=/path/libvendor_ops.so`), another ONNX Runtime library than the
//! one layerdiff loads (`ort:lib=/path/libonnxruntime.so.1.30.0`: an older release, a vendor's
//! build), an execution provider chosen through ONNX Runtime's device API, a plugin library's
//! (`ort:ep_lib=/path/libvendor_ep.so[:ep=NAME]`) or a built-in one (`ort:ep=NAME`), `tract`,
//! `openvino[:precision=f32|f16|bf16][:lib=PATH]` (`lib=`: another release's
//! `libopenvino_c`), `expected:PATH`. A new runtime is one variant here.

use std::path::{Path, PathBuf};

use crate::{
    Error, Isolated, Isolation, OpenVinoRuntime, OptLevel, OrtRuntime, PluginEp, PluginParts,
    Provider, ProviderOptions, Result, Runtime, TractRuntime,
};

/// A runtime named on the command line or in the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeSpec {
    /// ONNX Runtime on an execution provider with its options (ONNX Runtime's names), with a
    /// graph optimization level and the optimizers disabled at it (their names, as the
    /// session's `optimization.disable_specified_optimizers` takes them), and the custom-op
    /// libraries its sessions register (a vendor's kernels: code layerdiff does not trust, so a
    /// side that loads one runs in a worker process, see [`crate::Isolation`]), and the ONNX
    /// Runtime library it runs on where it is not the one layerdiff loads (ONNX Runtime is
    /// loaded once per process, so such a side always runs in a worker process of its own).
    ///
    /// The last field: an execution provider chosen through ONNX Runtime's device API instead
    /// of the provider, where one is (`ep=NAME`, a plugin library's `ep_lib=PATH`).
    Ort(
        Provider,
        OptLevel,
        ProviderOptions,
        Vec<String>,
        Vec<PathBuf>,
        Option<PathBuf>,
        Option<PluginEp>,
    ),
    /// tract.
    Tract,
    /// OpenVINO's CPU plugin with an inference-precision hint (`None`: its default), and the
    /// OpenVINO C library it runs on where it is not the one layerdiff finds (another release:
    /// such a side always runs in a worker process of its own, as OpenVINO is loaded once per
    /// process).
    OpenVino(Option<String>, Option<PathBuf>),
    /// Values read from a file: `expected:PATH` (safetensors, or an ONNX test data folder).
    Expected(std::path::PathBuf),
}

impl std::fmt::Display for RuntimeSpec {
    /// As spelled (see [`RuntimeSpec::spelling`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.spelling())
    }
}

impl RuntimeSpec {
    /// ONNX Runtime on the CPU with graph optimizations off: every value exists as written.
    pub fn ort_cpu() -> Self {
        Self::Ort(
            Provider::Cpu,
            OptLevel::Disable,
            Vec::new(),
            Vec::new(),
            Vec::new(),
            None,
            None,
        )
    }

    /// Parses `ort[:PROVIDER][:opt=LEVEL][:without=NAME,…][:custom_ops=PATH,…][:lib=PATH][:ep_lib=PATH][:ep=NAME][:KEY=VALUE]…`,
    /// `tract`, `openvino[:precision=PRECISION][:lib=PATH]` or `expected:PATH`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let unknown = || {
            format!(
                "unknown runtime `{text}` (expected `ort[:PROVIDER][:opt=LEVEL][:without=NAME,…][:custom_ops=PATH,…][:lib=LIBRARY][:KEY=VALUE]…` with \
                 PROVIDER one of cpu, cuda, tensorrt, rocm, openvino, coreml, directml, LEVEL one of \
                 disable, basic, extended, all, NAME an ONNX Runtime optimizer to disable, PATH a custom-op library to register, \
                 LIBRARY another ONNX Runtime library to run on (libonnxruntime.so of another release or build), \
                 `ep_lib=` an execution provider's plugin library to register and `ep=` the execution provider whose devices to run on, \
                 and KEY=VALUE the provider's options in ONNX Runtime's names (`use_tf32=0`); or `tract`; or `openvino[:precision=f32|f16|bf16][:lib=LIBRARY]`; or \
                 `expected:PATH`)"
            )
        };
        if let Some(why) = unknown_name(text) {
            return Err(why);
        }
        if text == "tract" {
            return Ok(Self::Tract);
        }
        if text == "openvino" || text.starts_with("openvino:") {
            return openvino(text).ok_or_else(unknown)?;
        }
        if let Some(path) = text.strip_prefix("expected:").filter(|p| !p.is_empty()) {
            return Ok(Self::Expected(path.into()));
        }
        let mut parts = text.split(':');
        if parts.next() != Some("ort") {
            return Err(unknown());
        }
        let (mut provider, mut level, mut options) = (None, None, Vec::new());
        let mut without: Vec<String> = Vec::new();
        let mut custom_ops: Vec<PathBuf> = Vec::new();
        let mut release: Option<PathBuf> = None;
        let mut plugin = PluginParts::default();
        for part in parts {
            if plugin.take(part) {
            } else if let Some(path) = part.strip_prefix("lib=") {
                if release.replace(PathBuf::from(path)).is_some() || path.is_empty() {
                    return Err(unknown());
                }
            } else if let Some(paths) = part.strip_prefix("custom_ops=") {
                if !custom_ops.is_empty() || paths.split(',').any(str::is_empty) {
                    return Err(unknown());
                }
                custom_ops = paths.split(',').map(PathBuf::from).collect();
            } else if let Some(names) = part.strip_prefix("without=") {
                match optimizer_names(names) {
                    Some(names) if without.is_empty() => without = names,
                    _ => return Err(unknown()),
                }
            } else if let Some(l) = part.strip_prefix("opt=") {
                let parsed = [
                    OptLevel::Disable,
                    OptLevel::Basic,
                    OptLevel::Extended,
                    OptLevel::All,
                ]
                .into_iter()
                .find(|o| o.name() == l);
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
                options.push((key.to_string(), value.to_string()));
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
        let provider: Provider = provider.unwrap_or_default();
        if !options.is_empty() && !provider.takes_options() && plugin.is_empty() {
            let given: Vec<String> = options.iter().map(|(k, v)| format!("{k}={v}")).collect();
            return Err(format!(
                "`{text}`: options ({}) are for an execution provider that takes them, such as \
                 `ort:cuda:{}`; {} takes none",
                given.join(", "),
                given.join(":"),
                provider.ort_name()
            ));
        }
        let level = level.unwrap_or_default();
        if !without.is_empty() && level == OptLevel::Disable {
            return Err(format!(
                "`{text}`: `without=` disables ONNX Runtime graph optimizers, which run only at \
                 `opt=basic`, `opt=extended` or `opt=all` (e.g. `ort:opt=all:without={}`)",
                without.join(",")
            ));
        }
        let plugin = plugin.finish(text, provider)?;
        Ok(Self::Ort(
            provider, level, options, without, custom_ops, release, plugin,
        ))
    }

    /// The spelling that parses back to this spec (defaults left out: `ort`, `ort:cuda:opt=all`).
    pub fn spelling(&self) -> String {
        match self {
            Self::Ort(provider, level, options, without, custom_ops, release, plugin) => {
                let mut s = "ort".to_string();
                if *provider != Provider::Cpu {
                    s.push(':');
                    s.push_str(provider.spelling());
                }
                if *level != OptLevel::Disable {
                    s.push_str(":opt=");
                    s.push_str(level.name());
                }
                if !without.is_empty() {
                    s.push_str(":without=");
                    s.push_str(&without.join(","));
                }
                if !custom_ops.is_empty() {
                    let paths: Vec<String> =
                        custom_ops.iter().map(|p| p.display().to_string()).collect();
                    s.push_str(":custom_ops=");
                    s.push_str(&paths.join(","));
                }
                if let Some(release) = release {
                    s.push_str(":lib=");
                    s.push_str(&release.display().to_string());
                }
                if let Some(plugin) = plugin {
                    s.push_str(&plugin.spelling());
                }
                for (k, v) in options {
                    s.push_str(&format!(":{k}={v}"));
                }
                s
            }
            Self::Tract => "tract".to_string(),
            Self::OpenVino(precision, library) => {
                let mut s = "openvino".to_string();
                if let Some(p) = precision {
                    s.push_str(&format!(":precision={p}"));
                }
                if let Some(library) = library {
                    s.push_str(&format!(":lib={}", library.display()));
                }
                s
            }
            Self::Expected(path) => format!("expected:{}", path.display()),
        }
    }

    /// Builds the runtime (loading ONNX Runtime from `ort_library`, or found, when needed), in
    /// this process, or in a worker process for a side on another ONNX Runtime library.
    /// `expected:` values are a side that computes nothing, not a runtime: an error here.
    pub fn build(&self, ort_library: Option<&Path>) -> Result<Box<dyn Runtime + Send + Sync>> {
        self.build_isolated(ort_library, Isolation::Never)
    }

    /// [`Self::build`], in a worker process where `isolation` says so (see [`Isolated`]).
    pub fn build_isolated(
        &self,
        ort_library: Option<&Path>,
        isolation: Isolation,
    ) -> Result<Box<dyn Runtime + Send + Sync>> {
        if isolation.applies(self) {
            Ok(Box::new(Isolated::new(self, ort_library)?))
        } else {
            self.build_here(ort_library, false)
        }
    }

    /// What a side on this spec is, built in this process without loading another library: a
    /// side on one is described as running on it (its path, and what the worker that loads it
    /// told: `facts`, see [`Runtime::facts`]), and runs nothing here (see [`crate::Isolated`]).
    pub(crate) fn described_here(
        &self,
        ort_library: Option<&Path>,
        as_saved: bool,
        facts: Option<&serde_json::Value>,
    ) -> Result<Box<dyn Runtime + Send + Sync>> {
        match self {
            Self::Ort(.., Some(release), _) => {
                let version = facts.and_then(|f| f["version"].as_str());
                let runtime = self.ort_runtime(ort_library)?.labelled(release, version);
                Ok(Box::new(if as_saved {
                    runtime.as_saved()
                } else {
                    runtime
                }))
            }
            Self::OpenVino(precision, Some(_)) => Ok(Box::new(OpenVinoRuntime::described(
                precision.as_deref(),
                facts
                    .and_then(crate::openvino_runtime::Plugin::from_json)
                    .unwrap_or_else(crate::openvino_runtime::Plugin::unknown),
            ))),
            _ => self.build_here(ort_library, as_saved),
        }
    }

    /// ONNX Runtime as this spec sets it up, loaded from `library` (or found) where this
    /// process has not loaded it yet.
    fn ort_runtime(&self, library: Option<&Path>) -> Result<OrtRuntime> {
        let Self::Ort(provider, level, options, without, custom_ops, _, plugin) = self else {
            unreachable!("an ONNX Runtime spec")
        };
        let runtime = OrtRuntime::new(library, *level)?;
        let runtime = match plugin {
            Some(plugin) => runtime.with_plugin(plugin, options)?,
            None => runtime.with_provider(*provider, options)?,
        };
        runtime.without(without).with_custom_ops(custom_ops)
    }

    /// Builds the runtime in this process; with `as_saved`, the one that runs a graph its
    /// runtime already optimized, as saved (see [`Runtime::optimize`]). A side on another ONNX
    /// Runtime library loads it here: only a worker process of its own does that.
    pub(crate) fn build_here(
        &self,
        ort_library: Option<&Path>,
        as_saved: bool,
    ) -> Result<Box<dyn Runtime + Send + Sync>> {
        Ok(match self {
            Self::Ort(.., release, _) => {
                let runtime = self.ort_runtime(release.as_deref().or(ort_library))?;
                Box::new(if as_saved {
                    runtime.as_saved()
                } else {
                    runtime
                })
            }
            Self::Tract => Box::new(TractRuntime),
            Self::OpenVino(precision, library) => Box::new(OpenVinoRuntime::new(
                library.as_deref(),
                precision.as_deref(),
            )?),
            Self::Expected(path) => {
                return Err(Error::Expected(format!(
                    "`expected:{}` is a file of values, not a runtime: it computes nothing",
                    path.display()
                )));
            }
        })
    }
}

/// `openvino[:precision=P][:lib=PATH]`, its parts in any order, each once: `None` where `text`
/// is not one; `Some(Err)` for a precision the plugin does not take.
fn openvino(text: &str) -> Option<Result<RuntimeSpec, String>> {
    let (mut precision, mut library) = (None, None);
    for part in text.split(':').skip(1) {
        if let Some(p) = part.strip_prefix("precision=") {
            if precision.replace(p.to_string()).is_some() {
                return None;
            }
            if !crate::OPENVINO_PRECISIONS.contains(&p) {
                return Some(Err(format!(
                    "`{text}`: unknown OpenVINO precision `{p}` (expected {})",
                    crate::OPENVINO_PRECISIONS.join(", ")
                )));
            }
        } else if let Some(path) = part.strip_prefix("lib=").filter(|p| !p.is_empty()) {
            if library.replace(PathBuf::from(path)).is_some() {
                return None;
            }
        } else {
            return None;
        }
    }
    Some(Ok(RuntimeSpec::OpenVino(precision, library)))
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

#[cfg(test)]
mod tests;

/// The runtimes' names, as a target or reference begins.
const NAMES: [&str; 4] = ["ort", "tract", "openvino", "expected"];

/// Where `text` begins with no runtime's name (`openvno`), why in a line: the nearest name
/// where one is a slip away, and the short list (the whole grammar is `--help`'s).
fn unknown_name(text: &str) -> Option<String> {
    let head = text.split(':').next().unwrap_or_default();
    if NAMES.contains(&head) {
        return None;
    }
    let near = if head.starts_with("onnxruntime") {
        Some("ort")
    } else {
        nearest(head, &NAMES)
    };
    let near = near.map_or(".".to_string(), |name| format!("; did you mean `{name}`?"));
    Some(format!(
        "unknown runtime `{head}`{near} Runtimes: `ort` (ONNX Runtime: `ort:cuda`, \
         `ort:opt=all`…), `tract`, `openvino` (`openvino:precision=bf16`…), `expected:PATH` \
         (values from a file); `--help` spells every option"
    ))
}

/// The name of `names` that `word` is a slip of (one edit, or a third of the name's
/// length), if any.
pub fn nearest<'a>(word: &str, names: &[&'a str]) -> Option<&'a str> {
    (names.iter().map(|name| (edits(word, name), *name)).min())
        .filter(|(d, name)| *d <= 1.max(name.len() / 3))
        .map(|(_, name)| name)
}

/// The edit distance between `a` and `b` (insertions, deletions, substitutions).
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod slips {
    #[test]
    fn a_misspelled_runtime_is_named_with_the_one_it_slips_from_and_nothing_else_is() {
        let said = super::RuntimeSpec::parse("openvno").unwrap_err();
        assert!(said.starts_with("unknown runtime `openvno`; did you mean `openvino`?"));
        assert!(said.len() < 300, "the short list, not the grammar: {said}");
        assert_eq!(super::nearest("trac", &super::NAMES), Some("tract"));
        assert_eq!(super::nearest("tvm", &["torch", "tf", "xla"]), None);
        let said = super::RuntimeSpec::parse("onnxruntime:cuda").unwrap_err();
        assert!(said.contains("did you mean `ort`?"), "{said}");
    }
}
