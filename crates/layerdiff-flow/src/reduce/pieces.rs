//! Pieces of a target's ONNX file run on its runtime, each fed the reference's values at its
//! inputs and held to the reference's value of what it computes.

use std::collections::HashSet;
use std::path::Path;

use layerdiff_core::{Bound, Judge, Tensor, compare_judged};
use layerdiff_onnx::{GraphIndex, Model, expose_values, extract_nodes};
use layerdiff_runtime::RuntimeSpec;

use crate::onnx_flow::OnnxOptions;
use crate::{Error, Result};

/// A model's pieces run on the target's runtime, each fed the reference's values at its inputs
/// and held to the reference's value of what it computes: the question a layer's local error
/// asks, for any few nodes of the target's file.
pub(crate) struct Pieces {
    target_model: Model,
    index: GraphIndex,
    pub(crate) target_spec: RuntimeSpec,
    target_runtime: Box<dyn layerdiff_runtime::Runtime + Send + Sync>,
    inputs: Vec<(String, Tensor)>,
    values: Vec<(String, Tensor)>,
}

/// One piece run.
pub(crate) struct Tried {
    pub model: Model,
    pub feeds: Vec<(String, Tensor)>,
    pub got: Tensor,
    pub expected: Tensor,
    /// Its difference as a multiple of the tolerance.
    pub multiple: f64,
    pub max_abs_diff: f64,
}

impl Pieces {
    /// The pieces of `options`' target file, with the reference's values of `wanted` (and of
    /// every value the nodes producing them read) computed once.
    pub(crate) fn new(
        options: &OnnxOptions,
        inputs: &[(String, Tensor)],
        nodes: &[usize],
        ort_library: Option<&Path>,
    ) -> Result<Self> {
        let runtime = |spec: &RuntimeSpec, side: &str| match spec {
            RuntimeSpec::Expected(_) => Err(Error::Usage(format!(
                "a piece of the model runs on both sides, and the {side} is a file of values \
                 (`{}`)",
                spec.spelling()
            ))),
            spec => Ok(spec.build(ort_library)?),
        };
        let target_spec = options.target.clone().unwrap_or(if options.vs.is_some() {
            RuntimeSpec::ort_cpu()
        } else {
            RuntimeSpec::Tract
        });
        let reference_runtime = runtime(&options.reference, "reference")?;
        let target_runtime = runtime(&target_spec, "target")?;
        let reference_model = Model::load(&options.model)?;
        let target_model = match &options.vs {
            Some(path) => Model::load(path)?,
            None => reference_model.clone(),
        };
        let index = GraphIndex::new(target_model.graph());
        let mut wanted: Vec<String> = Vec::new();
        for &n in nodes {
            let node = &index.nodes()[n];
            for value in node.inputs.iter().chain(&node.outputs) {
                if !value.is_empty() && !index.is_initializer(value) && !wanted.contains(value) {
                    wanted.push(value.clone());
                }
            }
        }
        let reference_index = GraphIndex::new(reference_model.graph());
        if let Some(v) = wanted.iter().find(|v| !reference_index.has_value(v)) {
            return Err(Error::Usage(format!(
                "the reference's model has no value `{v}`, which the target's piece reads: the \
                 two files name their values differently"
            )));
        }
        let mut exposed = reference_model.clone();
        expose_values(&mut exposed, &wanted)?;
        let values = reference_runtime.run(&exposed, inputs, &wanted)?;
        Ok(Self {
            target_model,
            index,
            target_spec,
            target_runtime,
            inputs: inputs.to_vec(),
            values,
        })
    }

    /// The target's file's graph.
    pub(crate) fn index(&self) -> &GraphIndex {
        &self.index
    }

    /// Runs `piece` (node indices) on the target's runtime for `value`, judged by `bound`.
    pub(crate) fn run(&self, piece: &[usize], value: &str, bound: Bound) -> Result<Tried> {
        let value_of = |name: &str| self.values.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        let feeds = feeds_of(&self.index, piece, &self.inputs, &value_of);
        let wanted = [value.to_string()];
        let model = extract_nodes(&self.target_model, piece, &wanted, &feeds)?;
        let got = self
            .target_runtime
            .run(&model, &feeds, &wanted)?
            .remove(0)
            .1;
        let expected = value_of(value)
            .ok_or_else(|| Error::Usage(format!("no reference value of `{value}`")))?
            .clone();
        let (multiple, max_abs_diff) = judged(bound, &expected, &got)?;
        Ok(Tried {
            model,
            feeds,
            got,
            expected,
            multiple,
            max_abs_diff,
        })
    }

    /// A node's name in words (its op where it has none).
    pub(crate) fn name(&self, n: usize) -> String {
        let node = &self.index.nodes()[n];
        if node.name.is_empty() {
            node.op_type.clone()
        } else {
            node.name.clone()
        }
    }
}

/// The nodes behind `value` ring by ring (its producer, then the producers of what those
/// read…), each ring in graph order, until `most` nodes are taken.
pub(crate) fn rings(index: &GraphIndex, value: &str, most: usize) -> Vec<Vec<usize>> {
    let mut rings: Vec<Vec<usize>> = Vec::new();
    let mut taken: HashSet<usize> = HashSet::new();
    let mut front = vec![index.producer(value).expect("checked").index];
    while !front.is_empty() && taken.len() < most.max(1) {
        let mut ring = Vec::new();
        for n in front {
            if taken.len() < most.max(1) && taken.insert(n) {
                ring.push(n);
            }
        }
        ring.sort_unstable();
        let mut next: Vec<usize> = Vec::new();
        for &n in &ring {
            for input in &index.nodes()[n].inputs {
                if let Some(p) = index.producer(input)
                    && !taken.contains(&p.index)
                    && !next.contains(&p.index)
                {
                    next.push(p.index);
                }
            }
        }
        if ring.is_empty() {
            break;
        }
        rings.push(ring);
        front = next;
    }
    rings
}

/// What the piece reads, from the reference: graph inputs as given, the rest as computed.
fn feeds_of<'a>(
    index: &GraphIndex,
    piece: &[usize],
    inputs: &[(String, Tensor)],
    value_of: &dyn Fn(&str) -> Option<&'a Tensor>,
) -> Vec<(String, Tensor)> {
    let produced: HashSet<&str> = piece
        .iter()
        .flat_map(|&n| index.nodes()[n].outputs.iter().map(String::as_str))
        .collect();
    let mut feeds: Vec<(String, Tensor)> = Vec::new();
    for &n in piece {
        for input in &index.nodes()[n].inputs {
            if input.is_empty()
                || index.is_initializer(input)
                || produced.contains(input.as_str())
                || feeds.iter().any(|(f, _)| f == input)
            {
                continue;
            }
            let tensor = inputs
                .iter()
                .find(|(name, _)| name == input)
                .map(|(_, t)| t)
                .or_else(|| value_of(input));
            if let Some(t) = tensor {
                feeds.push((input.clone(), t.clone()));
            }
        }
    }
    feeds
}

/// The target's value against the reference's, judged by the layer's tolerance: (its
/// difference as a multiple of the tolerance, the largest difference).
pub(crate) fn judged(bound: Bound, expected: &Tensor, got: &Tensor) -> Result<(f64, f64)> {
    let grid = if got.dtype.narrower_than(expected.dtype) {
        got.dtype
    } else {
        expected.dtype
    };
    let stats = compare_judged(expected.view(), got.view(), Some(Judge { grid, bound }))?;
    Ok((
        stats.tolerance_multiple().unwrap_or(0.0),
        stats.max_abs_diff,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerdiff_onnx::{GraphProto, NodeProto};

    /// `x → a → b`, `x → c`, `d = b + c`, `e = Relu(d)`.
    fn diamond() -> GraphIndex {
        let node = |name: &str, op: &str, inputs: &[&str]| NodeProto {
            op_type: Some(op.into()),
            name: Some(name.into()),
            input: inputs.iter().map(|i| i.to_string()).collect(),
            output: vec![name.into()],
            ..Default::default()
        };
        GraphIndex::new(&GraphProto {
            node: vec![
                node("a", "Relu", &["x"]),
                node("b", "Relu", &["a"]),
                node("c", "Relu", &["x"]),
                node("d", "Add", &["b", "c"]),
                node("e", "Relu", &["d"]),
            ],
            ..Default::default()
        })
    }

    #[test]
    fn a_piece_grows_a_ring_of_producers_at_a_time_up_to_the_most_nodes() {
        let index = diamond();
        assert_eq!(
            rings(&index, "e", 5),
            vec![vec![4], vec![3], vec![1, 2], vec![0]]
        );
        assert_eq!(rings(&index, "e", 3), vec![vec![4], vec![3], vec![1]]);
        assert_eq!(rings(&index, "e", 1), vec![vec![4]]);
        assert_eq!(rings(&index, "a", 5), vec![vec![0]]);
    }
}
