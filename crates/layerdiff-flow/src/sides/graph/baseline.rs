//! A baseline from the reference ONNX graph in float64, re-run group by group: the group that
//! computes the layer's value from values both sides know, its weights rounded to the layer's
//! dtype, on the reference's values rounded as the target holds them (every node on the first
//! of layerdiff's own float64 kernels, ONNX Runtime and tract that computes it).

use std::collections::HashMap;

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::{Model, NodeExt, to_float64, to_float64_lazy};
use layerdiff_runtime::PerNode;

use super::GraphSide;
use crate::Result;
use crate::engine::baseline::{Baseline, Fed, Terms};
use crate::engine::side::{Group, Recompute};

/// The reference graph in float64, re-running the group that computes each layer.
pub struct GraphBaseline {
    /// The reference graph, each group widened to float64 as it is extracted.
    side: GraphSide,
    /// The float dtypes of the tensors the graph holds (weights and constants): a grid that
    /// holds every value of each rounds none of them.
    held: Vec<DType>,
    /// Each layer's group in the graph (by the reference's value name), once found.
    groups: HashMap<String, std::result::Result<Group, String>>,
}

impl GraphBaseline {
    /// The `reference` graph in float64, run node by node (see [`PerNode::float64`]).
    pub fn new(reference: &Model) -> Result<Self> {
        let runtime = PerNode::float64()?;
        let graph = reference.graph();
        let held = graph
            .initializer
            .iter()
            .chain((graph.node.iter().flat_map(|n| &n.attribute)).filter_map(|a| a.t.as_ref()));
        let mut dtypes: Vec<DType> = held
            .filter_map(|t| DType::from_onnx_code(t.data_type()).ok())
            .filter(|d| d.is_float())
            .collect();
        dtypes.sort_by_key(|d| d.name());
        dtypes.dedup();
        Ok(Self {
            // each group's float64 copy is made when it runs: only its own weights widen
            side: GraphSide::new(None, reference.clone(), Box::new(runtime), &[]),
            held: dtypes,
            groups: HashMap::new(),
        })
    }

    /// The baseline with groups of up to `most` nodes (see [`GraphSide::reaching`]).
    pub(crate) fn reaching(mut self, most: usize) -> Self {
        self.side = self.side.reaching(most);
        self
    }

    /// `value` computed exactly by `group` (node indices of the graph this copy was made from)
    /// on `feed`'s values rounded to `grid` or to the dtype they are held in, whichever is
    /// narrower, with the weights rounded to `grid`.
    pub(crate) fn group_exact<'a>(
        &self,
        group: &Group,
        value: &str,
        grid: DType,
        feed: &dyn Fn(&str) -> Fed<'a>,
    ) -> std::result::Result<Tensor, String> {
        let rounded = |n: &str| {
            let (tensor, held) = feed(n)?;
            let to = if held.narrower_than(grid) { held } else { grid };
            Ok(if tensor.dtype.is_float() {
                tensor.view().to_f64_on_grid(to)
            } else {
                tensor.clone()
            })
        };
        // every float16 and bfloat16 value is a float32 one, every float32 value a float64 one
        let rounds_none = self.held.iter().all(|&d| {
            d == grid || grid == DType::F64 || (grid == DType::F32 && d.narrower_than(grid))
        });
        self.side.run_group_with(group, value, &rounded, &|model| {
            // weights are widened (rounded to the grid first, where it does not hold them
            // exactly) node by node as they run
            *model = to_float64_lazy(model, (!rounds_none).then_some(grid))
                .map_err(|e| format!("cannot make its float64 copy: {e}"))?;
            Ok(())
        })
    }
}

/// The ops whose every output element sums products of its inputs: their terms are measured
/// by the same op on the squares of its inputs and weights.
const REDUCTIONS: [&str; 3] = ["Conv", "MatMul", "Gemm"];

impl GraphBaseline {
    /// The terms of the one reduction `group` computes `value` by (a Conv, MatMul or Gemm
    /// alone): how many each element sums, and per element `√Σ term²`, by the same node in
    /// float64 on the squares of what [`GraphBaseline::group_exact`] feeds it and of its weights
    /// rounded to `grid` (a Gemm's `alpha` and `beta` squared too). `None` for any other group.
    fn reduction<'a>(
        &self,
        group: &Group,
        value: &str,
        grid: DType,
        feed: &dyn Fn(&str) -> Fed<'a>,
    ) -> Option<Terms> {
        let [member] = group.members[..] else {
            return None;
        };
        let node = &self.side.model.graph().node[member];
        if !REDUCTIONS.contains(&node.op_type()) {
            return None;
        }
        let shape = |i: usize| -> Option<Vec<usize>> {
            let name = node.input.get(i)?;
            match feed(name) {
                Ok((tensor, _)) => Some(tensor.shape.clone()),
                Err(_) => {
                    let stored = self.side.model.stored(name)?.ok()?;
                    Some(stored.view().shape.to_vec())
                }
            }
        };
        let transposed = |name: &str| node.attr_i64(name).ok() == Some(1);
        let terms = match node.op_type() {
            "Conv" => shape(1)?.iter().skip(1).product::<usize>(),
            "MatMul" => *shape(0)?.last()?,
            _ => {
                let a = shape(0)?;
                *a.get(usize::from(!transposed("transA")))?
            }
        };
        let squared = |t: &Tensor| {
            let v = t.view();
            let values: Vec<f64> = (0..v.numel()).map(|i| v.get_f64(i).powi(2)).collect();
            let mut square = Tensor::from_f64(DType::F64, &values);
            square.shape = t.shape.clone();
            square
        };
        let rounded = |n: &str| {
            let (tensor, held) = feed(n)?;
            let to = if held.narrower_than(grid) { held } else { grid };
            Ok(squared(&tensor.view().to_f64_on_grid(to)))
        };
        let sums = self.side.run_group_with(group, value, &rounded, &|model| {
            let lazy = to_float64_lazy(model, Some(grid))
                .map_err(|e| format!("cannot make its float64 copy: {e}"))?;
            *model = to_float64(&lazy).map_err(|e| format!("cannot make its float64 copy: {e}"))?;
            squared_weights(model);
            Ok(())
        });
        let sums = sums.ok()?;
        let sums = sums.view();
        let rss: Vec<f64> = (0..sums.numel())
            .map(|i| sums.get_f64(i).max(0.0).sqrt())
            .collect();
        let mut rss = Tensor::from_f64(DType::F64, &rss);
        rss.shape = sums.shape.to_vec();
        Some(Terms {
            count: terms as u64,
            rss,
            each: None,
        })
    }
}

/// A float64 model's weights and scalar factors (a Gemm's `alpha`, `beta`) squared in place.
fn squared_weights(model: &mut Model) {
    let graph = model.graph_mut();
    for tensor in &mut graph.initializer {
        if tensor.data_type() != 11 {
            continue;
        }
        let raw = tensor.raw_data.clone().unwrap_or_default();
        let squares: Vec<u8> = raw
            .chunks_exact(8)
            .flat_map(|b| {
                f64::from_le_bytes(b.try_into().expect("8 bytes"))
                    .powi(2)
                    .to_le_bytes()
            })
            .collect();
        tensor.raw_data = Some(squares.into());
        tensor.double_data = tensor.double_data.iter().map(|v| v * v).collect();
    }
    for node in &mut graph.node {
        for attribute in &mut node.attribute {
            if matches!(attribute.name(), "alpha" | "beta")
                && let Some(f) = attribute.f.as_mut()
            {
                *f *= *f;
            }
        }
    }
}

impl Baseline for GraphBaseline {
    fn find_groups(&mut self, values: &[&str], known: &dyn Fn(&str) -> bool) {
        for &value in values {
            let group = self.side.local_group(value, &|n| n != value && known(n));
            self.groups.insert(value.to_string(), group);
        }
    }

    fn take_time(&self) -> std::time::Duration {
        self.side.take_time()
    }

    fn exact<'a>(
        &self,
        value: &str,
        grid: DType,
        feed: &dyn Fn(&str) -> Fed<'a>,
    ) -> std::result::Result<Tensor, String> {
        let group = match self.groups.get(value) {
            Some(Ok(group)) => group,
            Some(Err(why)) => return Err(why.clone()),
            None => return Err("its group was not found".to_string()),
        };
        self.group_exact(group, value, grid, feed)
            .map_err(|e| format!("the float64 reference could not compute it: {e}"))
    }

    fn measure_reduction<'a>(
        &self,
        value: &str,
        grid: DType,
        feed: &dyn Fn(&str) -> Fed<'a>,
    ) -> Option<Terms> {
        let group = self.groups.get(value)?.as_ref().ok()?;
        self.reduction(group, value, grid, feed)
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
