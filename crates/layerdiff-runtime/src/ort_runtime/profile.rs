//! Where ONNX Runtime ran each node, read from the profile of a run.

use layerdiff_core::Tensor;
use layerdiff_onnx::Model;

use super::run_session;
use crate::{Error, Result};

/// Nodes per execution provider, most first, from an ONNX Runtime profile (a JSON array of
/// trace events; each node's kernel event is `<node>_kernel_time` with `args.provider`).
pub(super) fn node_providers(profile: &str) -> std::result::Result<Vec<(String, usize)>, String> {
    let events: Vec<serde_json::Value> =
        serde_json::from_str(profile).map_err(|e| format!("not a profile: {e}"))?;
    let mut seen = std::collections::HashSet::new();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for event in &events {
        let (Some("Node"), Some(name), Some(provider)) = (
            event["cat"].as_str(),
            event["name"].as_str(),
            event["args"]["provider"].as_str(),
        ) else {
            continue;
        };
        let Some(node) = name.strip_suffix("_kernel_time") else {
            continue;
        };
        if !seen.insert(node.to_string()) {
            continue;
        }
        match counts.iter_mut().find(|(p, _)| p == provider) {
            Some((_, n)) => *n += 1,
            None => counts.push((provider.to_string(), 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(counts)
}

impl super::OrtRuntime {
    /// Which execution provider ran how many of `model`'s nodes, most first: one run on
    /// `inputs` with ONNX Runtime's profiler, read from its kernel events. This is what shows a
    /// silent fallback (nodes a provider has no kernel for run on the CPU).
    pub fn node_placement(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
    ) -> Result<Vec<(String, usize)>> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            Error::Run(format!("profiling the node placement: {what}: {e}"))
        };
        let folder = tempfile::tempdir().map_err(|e| failed("a folder for the profile", &e))?;
        let mut session = self.session_with(model, None, Some(&folder.path().join("placement")))?;
        let outputs: Vec<String> = session
            .outputs()
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        run_session(&mut session, inputs, &outputs)?;
        let file = session
            .end_profiling()
            .map_err(|e| failed("ending the profile", &e))?;
        let text = std::fs::read_to_string(&file).map_err(|e| failed(&file, &e))?;
        node_providers(&text).map_err(|e| failed(&file, &e))
    }
}
