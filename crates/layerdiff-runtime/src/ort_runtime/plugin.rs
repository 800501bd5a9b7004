//! Execution providers chosen through ONNX Runtime's device API (1.22+): a plugin library
//! registered in the process's environment (`ep_lib=PATH`: a vendor's EP shipped apart from
//! ONNX Runtime, onnxruntime-ep-openvino and the like), and the devices of one execution
//! provider a session runs on (`ep=NAME`), built-in or a plugin's. What ONNX Runtime lists is
//! what a machine offers: an EP that lists no device here is refused, and the refusal names the
//! devices there are.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

use ort::environment::Environment;

use crate::{Error, OrtRuntime, Provider, Result};

impl OrtRuntime {
    /// The same runtime on the devices of an execution provider chosen through ONNX Runtime's
    /// device API (`plugin`: a plugin library to register, an EP's name), `options` handed to
    /// that EP in its own names. Fails, naming the devices there are, where it lists none here.
    pub fn with_plugin(mut self, plugin: &PluginEp, options: &[(String, String)]) -> Result<Self> {
        let cell = super::ORT.get().expect("initialised in new");
        let guard = cell.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Ok(loaded)) = guard.as_ref() else {
            unreachable!("OrtRuntime exists only once loaded")
        };
        let ep = resolve(&loaded.env, plugin)?;
        let mine: Vec<EpDevice> = devices(&loaded.env)
            .into_iter()
            .filter(|d| d.ep == ep)
            .collect();
        drop(guard);
        self.options = options.to_vec();
        self.resolved = options.to_vec();
        self.plugin = Some((plugin.clone(), ep, mine));
        Ok(self)
    }
}

/// `builder` running its sessions on `ep`'s devices, `options` handed to them (as `EP.key`).
pub(super) fn on_devices(
    builder: ort::session::builder::SessionBuilder,
    env: &Environment,
    ep: &str,
    options: &[(String, String)],
) -> Result<ort::session::builder::SessionBuilder> {
    let options: Vec<(String, String)> = options
        .iter()
        .map(|(k, v)| (format!("{ep}.{k}"), v.clone()))
        .collect();
    let devices = env.devices().filter(|d| d.ep().ok() == Some(ep));
    builder
        .with_devices(devices, Some(&options))
        .map_err(|e| Error::ProviderUnavailable {
            provider: Box::leak(ep.to_string().into_boxed_str()),
            reason: super::clean_message(e.to_string()),
        })
}

/// The execution provider a side runs on, in words: its name, where it came from, and the
/// devices it runs on.
pub(super) fn words(plugin: &PluginEp, ep: &str, devices: &[EpDevice]) -> String {
    let from = plugin
        .library
        .as_ref()
        .map(|l| format!("plugin from {}, ", l.display()))
        .unwrap_or_default();
    let on: Vec<&str> = devices.iter().map(|d| d.hardware.as_str()).collect();
    format!("{ep} ({from}through the device API, on {})", on.join(", "))
}

/// `ep=NAME` and `ep_lib=PATH` of an ONNX Runtime side: the plugin library to register, if
/// any, and the execution provider whose devices its sessions use (`None`: the one the library
/// adds, where it adds one).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PluginEp {
    /// The plugin library.
    pub library: Option<PathBuf>,
    /// The execution provider, by ONNX Runtime's name (`OpenVINOExecutionProvider`).
    pub ep: Option<String>,
}

impl PluginEp {
    /// How a spec spells it (`:ep_lib=PATH:ep=NAME`).
    pub fn spelling(&self) -> String {
        let mut s = String::new();
        if let Some(library) = &self.library {
            s.push_str(&format!(":ep_lib={}", library.display()));
        }
        if let Some(ep) = &self.ep {
            s.push_str(&format!(":ep={ep}"));
        }
        s
    }
}

/// The `ep_lib=` and `ep=` parts of an ONNX Runtime spec, as they are read.
#[derive(Default)]
pub(crate) struct PluginParts {
    library: Option<PathBuf>,
    ep: Option<String>,
    twice: bool,
}

impl PluginParts {
    /// Takes `part` where it is one of these.
    pub(crate) fn take(&mut self, part: &str) -> bool {
        if let Some(path) = part.strip_prefix("ep_lib=") {
            self.twice |= self.library.replace(PathBuf::from(path)).is_some() || path.is_empty();
        } else if let Some(name) = part.strip_prefix("ep=") {
            self.twice |= self.ep.replace(name.to_string()).is_some() || name.is_empty();
        } else {
            return false;
        }
        true
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.library.is_none() && self.ep.is_none()
    }

    /// The plugin spec, or why it does not fit beside `provider`.
    pub(crate) fn finish(self, text: &str, provider: Provider) -> Result<Option<PluginEp>, String> {
        if self.twice {
            return Err(format!(
                "`{text}`: `ep_lib=` and `ep=` are given once each, with a value"
            ));
        }
        if self.is_empty() {
            return Ok(None);
        }
        if provider != Provider::Cpu {
            return Err(format!(
                "`{text}`: `ep=`/`ep_lib=` choose the execution provider through ONNX Runtime's \
                 device API, `{}` chooses it by name: give one of them",
                provider.spelling()
            ));
        }
        Ok(Some(PluginEp {
            library: self.library,
            ep: self.ep,
        }))
    }
}

/// One execution provider's device, as ONNX Runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpDevice {
    /// The execution provider (`CPUExecutionProvider`).
    pub ep: String,
    /// Its vendor.
    pub ep_vendor: String,
    /// The hardware: its type (`CPU`, `GPU`, `NPU`) and vendor.
    pub hardware: String,
}

impl EpDevice {
    /// In words: `CPUExecutionProvider (Microsoft) on CPU (AMD)`.
    pub fn words(&self) -> String {
        format!("{} ({}) on {}", self.ep, self.ep_vendor, self.hardware)
    }
}

/// Libraries already registered in this process's environment (ONNX Runtime refuses a second
/// registration of one name), and the execution providers each added: a second side on one
/// library finds its EP as the first did.
static REGISTERED: Mutex<Option<HashMap<PathBuf, Vec<String>>>> = Mutex::new(None);

/// Every execution provider device ONNX Runtime lists in `env`.
pub(super) fn devices(env: &Environment) -> Vec<EpDevice> {
    env.devices()
        .map(|d| {
            let hardware = d.hardware_device();
            EpDevice {
                ep: d.ep().unwrap_or("?").to_string(),
                ep_vendor: d.ep_vendor().unwrap_or("?").to_string(),
                hardware: format!(
                    "{:?} ({})",
                    hardware.ty(),
                    hardware.vendor().unwrap_or("unknown vendor")
                ),
            }
        })
        .collect()
}

/// Registers `plugin`'s library (once per process) and names the execution provider its
/// sessions use: the one given, or the one the library adds. Refused, with the devices there
/// are, where that provider lists no device on this machine.
pub(super) fn resolve(env: &Environment, plugin: &PluginEp) -> Result<String> {
    // named by the EP asked for, else by the library's file (leaked: an error ends the run)
    let label: &'static str = Box::leak(
        (plugin.ep.clone())
            .or_else(|| {
                let file = plugin.library.as_ref()?.file_name()?;
                Some(file.to_string_lossy().into_owned())
            })
            .unwrap_or_default()
            .into_boxed_str(),
    );
    let refused = |reason: String| Error::ProviderUnavailable {
        provider: label,
        reason,
    };
    let mut added: Vec<String> = Vec::new();
    if let Some(library) = &plugin.library {
        if !library.is_file() {
            return Err(refused(format!(
                "execution provider library `{}` is not a file",
                library.display()
            )));
        }
        let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
        let registered = registered.get_or_insert_with(HashMap::new);
        if !registered.contains_key(library) {
            let before: HashSet<String> = devices(env).into_iter().map(|d| d.ep).collect();
            env.register_ep_library(library.display().to_string(), library)
                .map_err(|e| {
                    refused(format!(
                        "ONNX Runtime cannot register the execution provider library `{}`: {}",
                        library.display(),
                        super::clean_message(e.to_string())
                    ))
                })?;
            let mut names: Vec<String> = (devices(env).into_iter())
                .map(|d| d.ep)
                .filter(|ep| !before.contains(ep))
                .collect();
            names.sort();
            names.dedup();
            registered.insert(library.clone(), names);
        }
        added.clone_from(&registered[library]);
    }
    let listed = devices(env);
    let there_are = || {
        let words: Vec<String> = listed.iter().map(EpDevice::words).collect();
        format!("the devices ONNX Runtime lists here: {}", words.join("; "))
    };
    let ep = match (&plugin.ep, &plugin.library, added.as_slice()) {
        (Some(ep), ..) => ep.clone(),
        (None, Some(_), [one]) => one.clone(),
        (None, Some(library), []) => {
            return Err(refused(format!(
                "the execution provider library `{}` registered, and none of its execution \
                 providers offers a device on this machine ({}); a plugin lists only the \
                 hardware it supports (a vendor's EP, its vendor's devices)",
                library.display(),
                there_are()
            )));
        }
        (None, Some(library), many) => {
            return Err(refused(format!(
                "the execution provider library `{}` adds {}: say which with `ep=NAME`",
                library.display(),
                many.join(", ")
            )));
        }
        (None, None, _) => unreachable!("a plugin spec has a library or an EP"),
    };
    if !listed.iter().any(|d| d.ep == ep) {
        return Err(refused(format!(
            "`{ep}` offers no device on this machine ({}){}",
            there_are(),
            match &plugin.library {
                Some(library) if added.is_empty() => format!(
                    "; the library `{}` registered, and lists none",
                    library.display()
                ),
                _ => String::new(),
            }
        )));
    }
    Ok(ep)
}
