//! Which PyTorch module a node was exported from.
//!
//! The dynamo exporter writes the module path into node metadata
//! (`pkg.torch.onnx.name_scopes`: `['', 'layer1', 'layer1.0', 'layer1.0.conv1', 'conv2d_1']`, the
//! innermost module second to last). The legacy TorchScript exporter encodes it in the node name,
//! one path component per *called* module: `/layer1/layer1.0/conv1/Conv`. A component is the
//! module's attribute name, or its qualified name from some ancestor on (`layer1.0` under
//! `layer1`, `blocks.0` at the root when the `ModuleList` holding it is never called itself,
//! `encoder.layers.0` under a wrapper), and a repeated call carries a `_N` suffix (`relu_1`).
//! So a legacy scope is resolved by walking it against the model's module tree rather than by
//! spelling out one expected form.

use std::collections::{HashMap, HashSet};

use crate::{NodeExt, NodeProto};

/// Where a node's module scope was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeSource {
    /// `pkg.torch.onnx.name_scopes` metadata (the default, dynamo-based exporter).
    Dynamo,
    /// The `/a/b/c/Op` node name of the TorchScript-based exporter (`dynamo=False`).
    Legacy,
    /// The `model_1/block_1/conv_1/Conv2D` node name tf2onnx keeps from TensorFlow's name
    /// scopes: the Keras model's name, then one component per layer (with the `_N` a traced
    /// function adds), then the layer's own scopes and the op.
    TensorFlow,
}

/// Resolves nodes to module paths, given the module paths that exist in the PyTorch model.
#[derive(Debug, Clone)]
pub struct ScopeResolver {
    /// The modules layers were captured from (the paths a node may resolve to).
    modules: HashSet<String>,
    /// Every module path of the model: those, and all their ancestors.
    known: HashSet<String>,
    /// Legacy scope strings already resolved (many nodes share one scope).
    resolved: std::cell::RefCell<HashMap<String, Option<String>>>,
}

impl ScopeResolver {
    /// Prepares resolution for a model with these (qualified) module paths.
    pub fn new<S: AsRef<str>>(module_paths: &[S]) -> Self {
        let modules: HashSet<String> = module_paths
            .iter()
            .map(|m| m.as_ref().to_string())
            .collect();
        let mut known = HashSet::new();
        for m in &modules {
            let mut end = m.len();
            loop {
                known.insert(m[..end].to_string());
                match m[..end].rfind('.') {
                    Some(dot) => end = dot,
                    None => break,
                }
            }
        }
        Self {
            modules,
            known,
            resolved: Default::default(),
        }
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
        let Some(path) = node.name().strip_prefix('/') else {
            let (scope, op) = node.name().rsplit_once('/')?;
            if layout_plumbing(node.op_type(), op) {
                return None;
            }
            let module = self.walk_tensorflow(scope)?;
            return Some((module, ScopeSource::TensorFlow));
        };
        Some((self.module_of_legacy(path)?, ScopeSource::Legacy))
    }

    /// The module a legacy node name (`/layer1/layer1.0/relu/Relu`) places its node in.
    pub fn module_of_name(&self, name: &str) -> Option<String> {
        self.module_of_legacy(name.strip_prefix('/')?)
    }

    fn module_of_legacy(&self, path: &str) -> Option<String> {
        let (scope, _op) = path.rsplit_once('/')?;
        let mut cache = self.resolved.borrow_mut();
        cache
            .entry(scope.to_string())
            .or_insert_with(|| self.walk_legacy(scope))
            .clone()
    }

    /// The layer a weight's TensorFlow name places it in (`model_1/conv_1/convolution/
    /// merged_input:0`): how a node tf2onnx's optimizer made and named without a scope
    /// (`Conv__10`, a Conv with the BatchNormalization after it folded in) is still found.
    pub fn module_of_weight(&self, name: &str) -> Option<String> {
        if name.starts_with('/') {
            return None;
        }
        let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
        let (scope, _) = name.rsplit_once('/')?;
        self.walk_tensorflow(scope)
    }

    /// Follows a legacy scope (`layer2/layer2.0/downsample/downsample.0`) down the module tree;
    /// `None` when a component names no module, or the scope ends at a module that is not a
    /// captured one (a block's own `Add`, say).
    ///
    /// Components past a captured leaf that name nothing below it are a rewrite's own
    /// (ONNX Runtime names a fused node after the one it replaced, `…/qkv/MatMul/
    /// MatMulAddFusion`): the node is still that leaf's. Past a captured block with captured
    /// modules below it, such a component is a submodule no layer was captured from
    /// (torchvision's `MultiheadAttention`): its nodes are not the block's own ops.
    fn walk_legacy(&self, scope: &str) -> Option<String> {
        let leaf = |m: &str| !self.known.iter().any(|p| below(p, m));
        let mut here = String::new();
        for component in scope.split('/') {
            let next = self
                .step(&here, component)
                .or_else(|| self.step(&here, repeated_call(component)?));
            match next {
                Some(next) => here = next,
                None if self.modules.contains(&here) && leaf(&here) => return Some(here),
                None => return None,
            }
        }
        self.modules.contains(&here).then_some(here)
    }

    /// Follows a TensorFlow name scope (`tiny_1/block_1/conv_1/convolution`) down the layer
    /// tree: the model's own name first (skipped when it names no layer), then layers while
    /// the components name them; the innermost captured layer, since what follows are the
    /// layer's own scopes.
    fn walk_tensorflow(&self, scope: &str) -> Option<String> {
        let mut components = scope.split('/').peekable();
        let named = |here: &str, c: &str| {
            self.step(here, c)
                .or_else(|| self.step(here, repeated_call(c)?))
        };
        if components.peek().is_some_and(|c| named("", c).is_none()) {
            components.next();
        }
        let (mut here, mut found) = (String::new(), None);
        for component in components {
            let Some(next) = named(&here, component) else {
                break;
            };
            if self.modules.contains(&next) {
                found = Some(next.clone());
            }
            here = next;
        }
        found
    }

    /// The module that `component` names below the module `here` (`""` is the root): the
    /// shallowest module under `here` whose path ends with the component, so that containers
    /// that are never called themselves (`ModuleList`, `ModuleDict`) may sit in between.
    /// `None` when no module fits, or two equally shallow ones do.
    fn step(&self, here: &str, component: &str) -> Option<String> {
        let under = |p: &str| here.is_empty() || below(p, here);
        let named =
            |p: &str| p == component || p.strip_suffix(component).is_some_and(|r| r.ends_with('.'));
        let mut fits: Vec<&String> = self.known.iter().filter(|p| under(p) && named(p)).collect();
        fits.sort_by_key(|p| p.matches('.').count());
        match fits.as_slice() {
            [] => None,
            [one] => Some((*one).clone()),
            [a, b, ..] if a.matches('.').count() < b.matches('.').count() => Some((*a).clone()),
            _ => None,
        }
    }
}

/// Whether the dotted `path` names something below `module` (`layer1.0.conv1` below `layer1`,
/// `fc.weight` below `fc`; `layer10` is not below `layer1`).
pub(crate) fn below(path: &str, module: &str) -> bool {
    path.strip_prefix(module)
        .is_some_and(|r| r.starts_with('.'))
}

/// `relu_1` → `relu`: the legacy exporter's suffix for a module's second, third… call.
/// A Transpose tf2onnx's layout optimizer moved and named after another op of some layer
/// (`bn_1/batchnorm/mul_1__6` transposing the model's input to NCHW): plumbing of the layout,
/// not that layer's computation.
fn layout_plumbing(op_type: &str, op: &str) -> bool {
    let Some((base, n)) = op.rsplit_once("__") else {
        return false;
    };
    op_type == "Transpose"
        && !n.is_empty()
        && n.chars().all(|c| c.is_ascii_digit())
        && !base.to_ascii_lowercase().contains("transpose")
}

fn repeated_call(component: &str) -> Option<&str> {
    let (base, n) = component.rsplit_once('_')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(base)
}

/// Parses a Python `repr` of a list of strings: `['', 'layer1', "it's"]`.
pub(crate) fn parse_python_str_list(text: &str) -> Vec<String> {
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
    fn tf2onnx_plumbing_and_unscoped_nodes_resolve_by_what_they_are() {
        let r = ScopeResolver::new(&["conv", "bn", "relu"]);
        // the input's layout Transpose tf2onnx named after a BatchNorm op is no layer's
        let mut transpose = node("functional_1/bn_1/batchnorm/mul_1__6", None);
        transpose.op_type = Some("Transpose".into());
        assert_eq!(r.module_of(&transpose), None);
        let mut own = node("functional_1/bn_1/transpose__3", None);
        own.op_type = Some("Transpose".into());
        assert_eq!(r.module_of(&own).map(|(m, _)| m).as_deref(), Some("bn"));
        // a Conv the optimizer made (`Conv__10`) is its weight's layer
        assert_eq!(
            r.module_of_weight("functional_1/conv_1/convolution/merged_input:0")
                .as_deref(),
            Some("conv")
        );
        assert_eq!(r.module_of_weight("/layer1/conv/weight"), None);
    }

    #[test]
    fn tensorflow_scopes_resolve_to_the_innermost_keras_layer() {
        let r = ScopeResolver::new(&["conv1", "bn1", "block.conv", "block.relu", "fc"]);
        let m = |n: &str| r.module_of(&node(n, None));
        assert_eq!(
            m("tiny_1/bn1_1/batchnorm/mul_1"),
            Some(("bn1".to_string(), ScopeSource::TensorFlow))
        );
        assert_eq!(
            m("tiny_1/block_1/conv_1/convolution").map(|(m, _)| m),
            Some("block.conv".to_string())
        );
        assert_eq!(m("tiny/fc/MatMul").map(|(m, _)| m), Some("fc".to_string()));
        // the block's own op, the converter's constants: no layer
        assert_eq!(m("tiny_1/block_1/add"), None);
        assert_eq!(m("const_fold_opt__13"), None);
    }

    #[test]
    fn legacy_scopes_resolve_through_lists_dicts_and_wrappers() {
        let r = ScopeResolver::new(&[
            "blocks.0.attn.qkv",
            "blocks.1.attn.qkv",
            "heads.cls.fc",
            "model.layers.0.self_attn.q_proj",
            "encoder.layer.1.output.dense",
            "conv1",
            "stage.conv1",
        ]);
        let m = |n: &str| r.module_of(&node(n, None)).map(|(m, _)| m);
        // A ModuleList that is never called leaves no scope of its own.
        assert_eq!(
            m("/blocks.0/attn/qkv/MatMul").as_deref(),
            Some("blocks.0.attn.qkv")
        );
        assert_eq!(
            m("/blocks.1/attn/qkv_2/MatMul").as_deref(),
            Some("blocks.1.attn.qkv")
        );
        // A ModuleDict: the key alone, its container skipped.
        assert_eq!(m("/cls/fc/Gemm").as_deref(), Some("heads.cls.fc"));
        assert_eq!(
            m("/model/layers.0/self_attn/q_proj/MatMul").as_deref(),
            Some("model.layers.0.self_attn.q_proj")
        );
        assert_eq!(
            m("/encoder/layer.1/output/dense/MatMul").as_deref(),
            Some("encoder.layer.1.output.dense")
        );
        // The shallowest module of that name wins; a block's own op belongs to no leaf.
        assert_eq!(m("/conv1/Conv").as_deref(), Some("conv1"));
        assert_eq!(m("/stage/conv1/Conv").as_deref(), Some("stage.conv1"));
        assert_eq!(m("/blocks.0/attn/Softmax"), None);
        assert_eq!(m("/nothing/here/Relu"), None);
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
        // a rewrite's suffix past a leaf (ONNX Runtime's fused Gemm) is still the leaf's node
        assert_eq!(
            m("/layer2/layer2.0/downsample/downsample.0/MatMul/MatMulAddFusion").as_deref(),
            Some("layer2.0.downsample.0")
        );
        assert_eq!(m("/layer1/layer1.0/Add/Fused"), None);
        // past a captured block that has captured modules below it, a component naming
        // nothing is an uncaptured submodule (torchvision's MultiheadAttention, whose out_proj
        // is never called): its nodes are not the block's own ops
        let r = ScopeResolver::new(&["encoder.layer_5", "encoder.layer_5.ln_1"]);
        let m = |n: &str| r.module_of(&node(n, None)).map(|(m, _)| m);
        assert_eq!(
            m("/encoder/layer_5/Add").as_deref(),
            Some("encoder.layer_5")
        );
        assert_eq!(m("/encoder/layer_5/self_attention/Add"), None);
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
