//! Pieces of a target's ONNX file run on its runtime, each fed the reference's values at its
//! inputs and held to the reference's value of what it computes.

use std::collections::HashSet;

use crate::spec::onnx_side::OnnxSide;
use layerdiff_core::{Bound, Judge, Measure, Tensor, compare_judged};
use layerdiff_onnx::{GraphIndex, Model, expose_values, extract_nodes};

use super::OnnxOptions;
use crate::{Error, Result};

/// A model's pieces run on the target's runtime, each fed the reference's values at its inputs
/// and held to the reference's value of what it computes: the question a layer's local error
/// asks, for any few nodes of the target's file. A piece only ever reads values the reference
/// has (an optimized target renames what it fuses), so it grows as a closed group.
pub(crate) struct Pieces {
    target_model: Model,
    index: GraphIndex,
    reference_model: Model,
    reference_index: GraphIndex,
    pub(crate) target_spec: layerdiff_runtime::RuntimeSpec,
    reference_runtime: Box<dyn layerdiff_runtime::Runtime + Send + Sync>,
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
    /// Its difference as a multiple of what the layer's finding is measured by (its tolerance,
    /// or its honest kernel's allowance: `layerdiff_core::Measure`).
    pub multiple: f64,
    pub max_abs_diff: f64,
}

impl Pieces {
    /// The pieces of `options`' target file, run on `inputs`.
    pub(crate) fn new(options: &OnnxOptions, inputs: &[(String, Tensor)]) -> Result<Self> {
        let runtime = |spec: &OnnxSide, side: &str| match spec {
            OnnxSide::Expected(_) => Err(Error::Usage(format!(
                "a piece of the model runs on both sides, and the {side} is a file of values \
                 (`{spec}`)"
            ))),
            OnnxSide::Runs(runtime) => Ok((runtime.clone(), runtime.build()?)),
        };
        let (_, reference_runtime) = runtime(&options.reference, "reference")?;
        let (target_spec, target_runtime) = runtime(&options.target_spec(), "target")?;
        let reference_model = Model::load(&options.model)?;
        let target_model = match &options.vs {
            Some(path) => Model::load(path)?,
            None => reference_model.clone(),
        };
        Ok(Self {
            index: GraphIndex::new(target_model.graph()),
            reference_index: GraphIndex::new(reference_model.graph()),
            target_model,
            reference_model,
            target_spec,
            reference_runtime,
            target_runtime,
            inputs: inputs.to_vec(),
            values: Vec::new(),
        })
    }

    /// The target's file's graph.
    pub(crate) fn index(&self) -> &GraphIndex {
        &self.index
    }

    /// The target's file.
    pub(crate) fn target_model(&self) -> &Model {
        &self.target_model
    }

    /// The reference's file.
    pub(crate) fn reference_model(&self) -> &Model {
        &self.reference_model
    }

    /// Whether the reference has `value` to feed a piece with (a graph input, or a value its
    /// nodes compute; the target's weights travel inside the piece).
    pub(crate) fn known(&self, value: &str) -> bool {
        !self.index.is_initializer(value)
            && (self.inputs.iter().any(|(n, _)| n == value)
                || self.reference_index.producer(value).is_some())
    }

    /// The pieces behind `value`, smallest first: the fewest nodes that compute it from values
    /// the reference has, then a ring of producers more at a time (each closed the same way),
    /// while at most `most` nodes are taken.
    pub(crate) fn rings(&self, value: &str, most: usize) -> Result<Vec<Vec<usize>>> {
        let known = |v: &str| self.known(v);
        let first = layerdiff_onnx::local_group(&self.index, value, &known).map_err(|why| {
            Error::Usage(format!(
                "`{value}` cannot be cut out of the target's model fed by the reference's values: {why}"
            ))
        })?;
        Ok(grown(&self.index, first.nodes, most, &known))
    }

    /// Runs the reference once for every value that `nodes` read or write and it has.
    pub(crate) fn compute_reference(&mut self, nodes: &[usize]) -> Result<()> {
        let mut wanted: Vec<String> = Vec::new();
        for &n in nodes {
            let node = &self.index.nodes()[n];
            for value in node.inputs.iter().chain(&node.outputs) {
                if !value.is_empty()
                    && self.reference_index.producer(value).is_some()
                    && !wanted.contains(value)
                {
                    wanted.push(value.clone());
                }
            }
        }
        let mut exposed = self.reference_model.clone();
        expose_values(&mut exposed, &wanted)?;
        self.values = self
            .reference_runtime
            .run(&exposed, &self.inputs, &wanted)?;
        Ok(())
    }

    /// Runs `piece` (node indices) on the target's runtime for `value`, judged by `bound`.
    pub(crate) fn run(&self, piece: &[usize], value: &str, measure: &Measure) -> Result<Tried> {
        let value_of = |name: &str| self.values.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        let feeds = feeds_of(&self.index, piece, &self.inputs, &value_of)?;
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
        let (multiple, max_abs_diff) = measure.judge(expected.view(), got.view())?;
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

/// The pieces grown from `first` a ring of producers at a time, each ring in graph order and
/// closed over what it reads that is not `known` (a renamed value is computed inside, not fed),
/// until `most` nodes are taken; `first` is the first piece whatever its size.
pub(crate) fn grown(
    index: &GraphIndex,
    first: Vec<usize>,
    most: usize,
    known: &dyn Fn(&str) -> bool,
) -> Vec<Vec<usize>> {
    let mut taken: HashSet<usize> = first.iter().copied().collect();
    let mut rings = vec![first];
    while taken.len() < most {
        let reads = |n: usize| index.nodes()[n].inputs.iter().filter(|i| !i.is_empty());
        let mut ring: Vec<usize> = Vec::new();
        let mut front: Vec<usize> = taken
            .iter()
            .flat_map(|&n| reads(n))
            .filter_map(|i| index.producer(i).map(|p| p.index))
            .filter(|p| !taken.contains(p))
            .collect();
        front.sort_unstable();
        front.dedup();
        for p in front {
            if taken.len() + ring.len() >= most {
                break;
            }
            // p and whatever it needs that the reference cannot feed
            let Ok(group) = layerdiff_onnx::local_group(index, &index.nodes()[p].outputs[0], known)
            else {
                continue;
            };
            let new: Vec<usize> = group
                .nodes
                .into_iter()
                .filter(|n| !taken.contains(n) && !ring.contains(n))
                .collect();
            if taken.len() + ring.len() + new.len() <= most {
                ring.extend(new);
            }
        }
        if ring.is_empty() {
            break;
        }
        ring.sort_unstable();
        taken.extend(&ring);
        rings.push(ring);
    }
    rings
}

/// What the piece reads, from the reference: graph inputs as given, the rest as computed.
pub(crate) fn feeds_of<'a>(
    index: &GraphIndex,
    piece: &[usize],
    inputs: &[(String, Tensor)],
    value_of: &dyn Fn(&str) -> Option<&'a Tensor>,
) -> Result<Vec<(String, Tensor)>> {
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
            let t = tensor.ok_or_else(|| {
                Error::Usage(format!(
                    "the reference has no value `{input}`, which the target's piece reads: the two files name their values differently"
                ))
            })?;
            feeds.push((input.clone(), as_declared(index, input, t.clone())));
        }
    }
    Ok(feeds)
}

/// `tensor`, fed as the value `name` of the file `index`, in the float type the file declares
/// for it, as a local re-run feeds it (a float16 file's piece fed the float32 reference's
/// values: ONNX Runtime refuses a float32 input to its float16 Gemm).
pub(crate) fn as_declared(index: &GraphIndex, name: &str, tensor: Tensor) -> Tensor {
    let declared = index
        .elem_type(name)
        .and_then(|code| layerdiff_core::DType::from_onnx_code(code).ok());
    match declared {
        Some(dtype) if dtype != tensor.dtype && dtype.is_float() && tensor.dtype.is_float() => {
            tensor.cast(dtype)
        }
        _ => tensor,
    }
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

    /// The pieces behind `value` in `index`, `known` the values a reference could feed.
    fn rings(
        index: &GraphIndex,
        value: &str,
        most: usize,
        known: &dyn Fn(&str) -> bool,
    ) -> Vec<Vec<usize>> {
        let first = layerdiff_onnx::local_group(index, value, known).unwrap();
        grown(index, first.nodes, most, known)
    }

    #[test]
    fn a_piece_grows_a_ring_of_producers_at_a_time_up_to_the_most_nodes() {
        let index = diamond();
        let all = |_: &str| true;
        assert_eq!(
            rings(&index, "e", 5, &all),
            vec![vec![4], vec![3], vec![1, 2], vec![0]]
        );
        assert_eq!(rings(&index, "e", 3, &all), vec![vec![4], vec![3], vec![1]]);
        assert_eq!(rings(&index, "e", 1, &all), vec![vec![4]]);
        assert_eq!(rings(&index, "a", 5, &all), vec![vec![0]]);
    }

    #[test]
    fn a_value_the_reference_lacks_is_computed_inside_the_piece_not_fed() {
        // An optimizer renamed `d` and `a`: the reference cannot feed them.
        let index = diamond();
        let known = |v: &str| v != "d" && v != "a";
        assert_eq!(
            rings(&index, "e", 5, &known),
            vec![vec![3, 4], vec![0, 1, 2]]
        );
        // the first piece stands whatever its size; a ring that would pass the most is left
        assert_eq!(rings(&index, "e", 1, &known), vec![vec![3, 4]]);
        assert_eq!(rings(&index, "e", 4, &known), vec![vec![3, 4], vec![0, 1]]);
    }
}
