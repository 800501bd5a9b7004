//! A baseline from the reference ONNX graph in float64, re-run group by group: the group that
//! computes the layer's value from values both sides know, its weights rounded to the layer's
//! dtype, on the reference's values rounded as the target holds them (every node on the first
//! of layerdiff's own float64 kernels, ONNX Runtime and tract that computes it).

use std::collections::HashMap;
use std::path::Path;

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::{Model, to_float64_lazy};
use layerdiff_runtime::PerNode;

use super::GraphSide;
use crate::Result;
use crate::engine::baseline::{Baseline, Fed};
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
    pub fn new(reference: &Model, ort_library: Option<&Path>) -> Result<Self> {
        let runtime = PerNode::float64(ort_library)?;
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

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
