//! A model run one node at a time, each node by the first of several runtimes that can compute
//! it. The float64 truth and baseline need this: ONNX Runtime has no float64 Conv, and tract no
//! float64 Gemm with a bias, so a CNN's float64 copy runs whole on neither, yet every one of its
//! nodes runs on one of them.

use std::collections::HashMap;
use std::path::Path;

use layerdiff_core::Tensor;
use layerdiff_onnx::{Model, extract_nodes};

use crate::{Error, ExactKernels, Result, Runtime, RuntimeSpec};

/// Runs each node alone on the first of its runtimes that computes it.
pub struct PerNode {
    runtimes: Vec<Box<dyn Runtime + Send + Sync>>,
}

impl PerNode {
    /// `runtimes`, tried in order for each node (at least one).
    pub fn new(runtimes: Vec<Box<dyn Runtime + Send + Sync>>) -> Self {
        assert!(!runtimes.is_empty(), "per-node running needs a runtime");
        Self { runtimes }
    }

    /// A float64 model's evaluation, node by node: layerdiff's own float64 kernels (which
    /// refuse what they do not compute at once), then ONNX Runtime's CPU provider, then tract.
    pub fn float64(ort_library: Option<&Path>) -> Result<Self> {
        Ok(Self::new(vec![
            Box::new(ExactKernels),
            RuntimeSpec::ort_cpu().build(ort_library)?,
            RuntimeSpec::Tract.build(ort_library)?,
        ]))
    }
}

impl Runtime for PerNode {
    fn name(&self) -> &str {
        "per-node"
    }

    fn detail(&self) -> String {
        let names: Vec<&str> = self.runtimes.iter().map(|r| r.name()).collect();
        format!(
            "each node alone, on the first of {} that computes it",
            names.join(", ")
        )
    }

    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Vec<(String, Tensor)>> {
        let graph = model.graph();
        // The last node that reads each value, so values are dropped once read for the last time.
        let mut last_read: HashMap<&str, usize> = HashMap::new();
        for (i, node) in graph.node.iter().enumerate() {
            for input in &node.input {
                last_read.insert(input.as_str(), i);
            }
        }
        let mut values: Vec<(String, Tensor)> = inputs.to_vec();
        // The runtime that last computed a node of each op type goes first for the next one.
        let mut preferred: HashMap<&str, usize> = HashMap::new();
        for (i, node) in graph.node.iter().enumerate() {
            let produced: Vec<String> = node
                .output
                .iter()
                .filter(|o| !o.is_empty())
                .cloned()
                .collect();
            let single = extract_nodes(model, &[i], &produced, &values)
                .map_err(|e| Error::Run(format!("cannot extract node #{i}: {e}")))?;
            let first = preferred.get(node.op_type()).copied().unwrap_or(0);
            let order =
                std::iter::once(first).chain((0..self.runtimes.len()).filter(|&r| r != first));
            let mut failures = Vec::new();
            let mut out = None;
            for r in order {
                match self.runtimes[r].run(&single, &values, &produced) {
                    Ok(v) => {
                        preferred.insert(node.op_type(), r);
                        out = Some(v);
                        break;
                    }
                    Err(e) => failures.push(format!("{}: {e}", self.runtimes[r].name())),
                }
            }
            let Some(out) = out else {
                return Err(Error::NoKernel(format!(
                    "no runtime computes {} node `{}` ({})",
                    node.op_type(),
                    node.name(),
                    failures.join("; ")
                )));
            };
            values.extend(out);
            values.retain(|(name, _)| {
                outputs.contains(name) || last_read.get(name.as_str()).is_some_and(|&l| l > i)
            });
        }
        outputs
            .iter()
            .map(|name| {
                values
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(n, t)| (n.clone(), t.clone()))
                    .ok_or_else(|| Error::Run(format!("no node produced `{name}`")))
            })
            .collect()
    }
}
