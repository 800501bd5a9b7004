//! Which PyTorch module a node was exported from.
//!
//! The dynamo exporter writes the module path into node metadata
//! (`pkg.torch.onnx.name_scopes`: `['', 'layer1', 'layer1.0', 'layer1.0.conv1', 'conv2d_1']`, the
//! innermost module second to last). The legacy TorchScript exporter encodes it in the node name
//! (`/layer1/layer1.0/conv1/Conv`, repeated calls suffixed `relu_1`), one path component per module:
//! the module's attribute name, prefixed by its parent's name when it is a numbered child.

use std::collections::HashMap;

use crate::{NodeExt, NodeProto};

/// Where a node's module scope was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeSource {
    /// `pkg.torch.onnx.name_scopes` metadata (the default, dynamo-based exporter).
    Dynamo,
    /// The `/a/b/c/Op` node name of the TorchScript-based exporter (`dynamo=False`).
    Legacy,
}

/// Resolves nodes to module paths, given the module paths that exist in the PyTorch model.
#[derive(Debug, Clone)]
pub struct ScopeResolver {
    /// legacy scope string (`layer1/layer1.0/conv1`) → module path (`layer1.0.conv1`)
    legacy: HashMap<String, String>,
    modules: std::collections::HashSet<String>,
}

impl ScopeResolver {
    /// Prepares resolution for a model with these (qualified) module paths.
    pub fn new<S: AsRef<str>>(module_paths: &[S]) -> Self {
        let modules: std::collections::HashSet<String> = module_paths
            .iter()
            .map(|m| m.as_ref().to_string())
            .collect();
        let legacy = modules
            .iter()
            .map(|m| (legacy_scope(m), m.clone()))
            .collect();
        Self { legacy, modules }
    }

    /// The module a node belongs to (innermost known module), and where that was read from.
    pub fn module_of(&self, node: &NodeProto) -> Option<(String, ScopeSource)> {
        if let Some(scopes) = node.metadata("pkg.torch.onnx.name_scopes") {
            let scopes = parse_python_str_list(scopes);
            // The last entry names the aten op; the module is the innermost known path before it.
            return scopes
                .iter()
                .rev()
                .skip(1)
                .find(|s| self.modules.contains(s.as_str()))
                .map(|s| (s.clone(), ScopeSource::Dynamo));
        }
        let name = node.name();
        let path = name.strip_prefix('/')?;
        let (scope, _op) = path.rsplit_once('/')?;
        if let Some(module) = self.legacy.get(scope) {
            return Some((module.clone(), ScopeSource::Legacy));
        }
        // A repeated call: the last component carries a `_N` suffix.
        let (head, last) = scope.rsplit_once('/').map_or(("", scope), |(h, l)| (h, l));
        let (base, n) = last.rsplit_once('_')?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let unsuffixed = if head.is_empty() {
            base.to_string()
        } else {
            format!("{head}/{base}")
        };
        self.legacy
            .get(&unsuffixed)
            .map(|m| (m.clone(), ScopeSource::Legacy))
    }
}

/// `layer2.0.downsample.0` → `layer2/layer2.0/downsample/downsample.0`.
fn legacy_scope(module_path: &str) -> String {
    let atoms: Vec<&str> = module_path.split('.').collect();
    let mut components = Vec::with_capacity(atoms.len());
    for (i, atom) in atoms.iter().enumerate() {
        let numbered = atom.bytes().all(|b| b.is_ascii_digit());
        if numbered && i > 0 {
            components.push(format!("{}.{atom}", atoms[i - 1]));
        } else {
            components.push((*atom).to_string());
        }
    }
    components.join("/")
}

/// Parses a Python `repr` of a list of strings: `['', 'layer1', "it's"]`.
fn parse_python_str_list(text: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut chars = text
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .chars()
        .peekable();
    while let Some(c) = chars.next() {
        if c != '\'' && c != '"' {
            continue;
        }
        let quote = c;
        let mut item = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(escaped) = chars.next() {
                        item.push(escaped);
                    }
                }
                c if c == quote => break,
                c => item.push(c),
            }
        }
        items.push(item);
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, scopes: Option<&str>) -> NodeProto {
        let mut n = NodeProto {
            name: Some(name.into()),
            op_type: Some("Relu".into()),
            ..Default::default()
        };
        if let Some(s) = scopes {
            n.metadata_props.push(crate::StringStringEntryProto {
                key: Some("pkg.torch.onnx.name_scopes".into()),
                value: Some(s.into()),
            });
        }
        n
    }

    #[test]
    fn legacy_components_prefix_numbered_children_with_their_parent() {
        assert_eq!(
            legacy_scope("layer2.0.downsample.0"),
            "layer2/layer2.0/downsample/downsample.0"
        );
        assert_eq!(legacy_scope("conv1"), "conv1");
    }

    #[test]
    fn legacy_names_resolve_including_repeated_calls() {
        let r = ScopeResolver::new(&["layer1.0.relu", "layer2.0.downsample.0", "relu"]);
        let m = |n: &str| r.module_of(&node(n, None)).map(|(m, _)| m);
        assert_eq!(
            m("/layer1/layer1.0/relu/Relu").as_deref(),
            Some("layer1.0.relu")
        );
        assert_eq!(
            m("/layer1/layer1.0/relu_1/Relu").as_deref(),
            Some("layer1.0.relu")
        );
        assert_eq!(
            m("/layer2/layer2.0/downsample/downsample.0/Conv").as_deref(),
            Some("layer2.0.downsample.0")
        );
        assert_eq!(m("/relu/Relu").as_deref(), Some("relu"));
        assert_eq!(
            m("/layer1/layer1.0/Add"),
            None,
            "a block's own op belongs to no leaf"
        );
    }

    #[test]
    fn dynamo_metadata_names_the_innermost_module() {
        let r = ScopeResolver::new(&["layer1.0.bn1"]);
        let n = node(
            "node_Conv_295",
            Some("['', 'layer1', 'layer1.0', 'layer1.0.bn1', '_native_batch_norm_1']"),
        );
        assert_eq!(
            r.module_of(&n),
            Some(("layer1.0.bn1".into(), ScopeSource::Dynamo))
        );
        let add = node("node_add", Some("['', 'layer1', 'layer1.0', 'add']"));
        assert_eq!(r.module_of(&add), None);
    }
}
