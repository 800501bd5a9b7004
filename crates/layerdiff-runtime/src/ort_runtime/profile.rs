//! Where ONNX Runtime ran each node, read from the profile of a run.

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
