//! A model run one node at a time, each node by the first of several runtimes that can compute
//! it. The float64 truth and baseline need this: ONNX Runtime has no float64 Conv, and tract no
//! float64 Gemm with a bias, so a CNN's float64 copy runs whole on neither, yet every one of its
//! nodes runs on one of them.

use std::collections::HashMap;

use layerdiff_core::Tensor;
use layerdiff_onnx::{Model, extract_nodes, to_float64};

use crate::{Error, ExactKernels, Result, Runtime, RuntimeSpec};

/// Runs each node alone on the first of its runtimes that computes it.
pub struct PerNode {
    runtimes: Vec<Box<dyn Runtime + Send + Sync>>,
    /// Whether each node's float weights are widened to float64 before it runs (a model from
    /// `to_float64_lazy`).
    widens: bool,
}

impl PerNode {
    /// `runtimes`, tried for each node (at least one): the first always first, which should
    /// refuse at once what it does not compute, then the one that last computed a node of the
    /// same op type, then the rest in order.
    pub fn new(runtimes: Vec<Box<dyn Runtime + Send + Sync>>) -> Self {
        assert!(!runtimes.is_empty(), "per-node running needs a runtime");
        Self {
            runtimes,
            widens: false,
        }
    }

    /// A float64 model's evaluation, node by node: layerdiff's own float64 kernels (which
    /// refuse what they do not compute at once), then ONNX Runtime's CPU provider, then tract
    /// (a 3-D Conv, which layerdiff's kernel refuses, does not send the 2-D ones to tract).
    /// Each node's weights are widened as it runs, so the model may hold them as stored
    /// (`layerdiff_onnx::to_float64_lazy`).
    pub fn float64() -> Result<Self> {
        let mut per_node = Self::new(vec![
            Box::new(ExactKernels),
            RuntimeSpec::ort_cpu().build()?,
            RuntimeSpec::tract().build()?,
        ]);
        per_node.widens = true;
        Ok(per_node)
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
        let wanted: std::collections::HashSet<&str> = outputs.iter().map(String::as_str).collect();
        let mut values: Vec<(String, Tensor)> = inputs.to_vec();
        // The first runtime is always asked first (it refuses at once what it does not compute:
        // a node it refused does not send the next one of its op type elsewhere); then the
        // runtime that last computed a node of the op type, then the rest in order.
        let mut preferred: HashMap<&str, usize> = HashMap::new();
        for (i, node) in graph.node.iter().enumerate() {
            let produced: Vec<String> = node
                .output
                .iter()
                .filter(|o| !o.is_empty())
                .cloned()
                .collect();
            let mut single = extract_nodes(model, &[i], &produced, &values).map_err(|e| {
                Error::Failed(format!("node by node: cannot extract node #{i}: {e}"))
            })?;
            if self.widens {
                single = to_float64(&single).map_err(|e| {
                    Error::Failed(format!(
                        "node by node: cannot widen node #{i}'s weights: {e}"
                    ))
                })?;
            }
            let last = preferred.get(node.op_type()).copied().unwrap_or(0);
            let order = std::iter::once(0)
                .chain((last != 0).then_some(last))
                .chain((1..self.runtimes.len()).filter(|&r| r != last));
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
                wanted.contains(name.as_str())
                    || last_read.get(name.as_str()).is_some_and(|&l| l > i)
            });
        }
        // handed back as computed, not copied (a graph's every value may be asked for); a
        // value asked for twice is copied the second time
        let mut held: HashMap<String, Tensor> = values.into_iter().collect();
        let mut out: Vec<(String, Tensor)> = Vec::with_capacity(outputs.len());
        for name in outputs {
            let tensor = match held.remove(name) {
                Some(t) => t,
                None => match out.iter().find(|(n, _)| n == name) {
                    Some((_, t)) => t.clone(),
                    None => {
                        return Err(Error::Failed(format!(
                            "node by node: no node produced `{name}`"
                        )));
                    }
                },
            };
            out.push((name.clone(), tensor));
        }
        Ok(out)
    }
}

/// A runtime handed a model whose weights are as stored (`layerdiff_onnx::to_float64_lazy`):
/// the model is widened to float64 whole when it runs, and the copy dropped after.
pub struct Widened(pub Box<dyn Runtime + Send + Sync>);

impl Runtime for Widened {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn detail(&self) -> String {
        self.0.detail()
    }

    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Vec<(String, Tensor)>> {
        let wide = to_float64(model).map_err(|e| {
            Error::Failed(format!(
                "node by node: cannot widen the weights to float64: {e}"
            ))
        })?;
        self.0.run(&wide, inputs, outputs)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use layerdiff_core::DType;
    use layerdiff_onnx::{GraphProto, ModelProto, NodeProto, tensor_value_info};

    use super::*;

    /// Hands its input back for the nodes whose name starts with `prefix` (all: empty), refuses
    /// the others, and writes down which runtime computed which node.
    struct Echo {
        prefix: &'static str,
        log: Arc<Mutex<Vec<(String, &'static str)>>>,
    }

    impl Runtime for Echo {
        fn name(&self) -> &str {
            self.prefix
        }

        fn detail(&self) -> String {
            String::new()
        }

        fn run(
            &self,
            model: &Model,
            inputs: &[(String, Tensor)],
            outputs: &[String],
        ) -> Result<Vec<(String, Tensor)>> {
            let node = &model.graph().node[0];
            if !node.name().starts_with(self.prefix) {
                return Err(Error::Failed(format!("refuses {}", node.name())));
            }
            let mut log = self.log.lock().unwrap();
            log.push((node.name().to_string(), self.prefix));
            let input = inputs.iter().find(|(n, _)| *n == node.input[0]).unwrap();
            Ok(vec![(outputs[0].clone(), input.1.clone())])
        }
    }

    #[test]
    fn the_first_runtime_is_asked_first_even_after_it_refused_that_op() {
        let node = |name: &str, input: &str, output: &str| NodeProto {
            op_type: Some("Identity".into()),
            name: Some(name.into()),
            input: vec![input.into()],
            output: vec![output.into()],
            ..Default::default()
        };
        let proto = ModelProto {
            ir_version: Some(9),
            graph: Some(GraphProto {
                node: vec![node("other", "x", "y"), node("own", "y", "z")],
                input: vec![tensor_value_info("x", 11, &[1])],
                output: vec![tensor_value_info("z", 11, &[1])],
                ..Default::default()
            }),
            ..Default::default()
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        let echo = |prefix| {
            let log = Arc::clone(&log);
            Box::new(Echo { prefix, log }) as Box<dyn Runtime + Send + Sync>
        };
        let per_node = PerNode::new(vec![echo("own"), echo("")]);
        let x = Tensor::new("x", DType::F64, vec![1], 1.5f64.to_le_bytes().to_vec()).unwrap();
        let model = Model::from_proto(proto, None);
        let out = per_node
            .run(&model, &[("x".into(), x)], &["z".into()])
            .unwrap();
        assert_eq!(out[0].0, "z");
        let log = log.lock().unwrap().clone();
        assert_eq!(
            log,
            vec![("other".to_string(), ""), ("own".to_string(), "own")]
        );
    }
}
