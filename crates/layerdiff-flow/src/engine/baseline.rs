//! Where each layer's same-precision baseline comes from (see `layerdiff_core::Baseline`): the
//! layer computed exactly, by the *reference's* own computation of it, on the reference's
//! values of its inputs rounded to the dtype the target holds them in. Never the side under
//! test: a target measured against itself proves nothing.
//!
//! Two sources:
//! - handed over with each layer by the framework that computed the reference (PyTorch runs the
//!   layer's module in float64 on the rounded inputs, with its weights rounded: a
//!   [`PushedSide`] of float64 values, held until compared);
//! - the reference ONNX graph in float64, re-run group by group: the group that computes the
//!   layer's value from values both sides know, its weights rounded to the layer's dtype, on
//!   the reference's values rounded as the target holds them (every node on the first of
//!   layerdiff's own float64 kernels, ONNX Runtime and tract that computes it).

use std::collections::HashMap;
use std::path::Path;

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::{Model, to_float64_lazy};
use layerdiff_runtime::PerNode;

use crate::engine::side::{Group, Recompute, Side};
use crate::{GraphSide, PushedSide, Result};

/// Where the layers' exact values on rounded inputs come from.
pub enum Baseline {
    /// Handed over with each layer (by the reference's value names).
    Handed(Box<HandedBaseline>),
    /// The reference graph in float64, re-run group by group.
    Graph(Box<GraphBaseline>),
}

/// The reference's value of a layer's input, and the dtype the target holds it in.
pub(crate) type Fed<'a> = std::result::Result<(&'a Tensor, DType), String>;

/// Exact values handed over layer by layer, each with the dtype the target computed it in
/// where its value's dtype does not show it (float16 gradients unscaled to float32).
pub struct HandedBaseline {
    side: PushedSide,
    grids: HashMap<String, DType>,
    /// Each layer's reduction as the framework measured it: its terms per element and their
    /// root sum of squares (`layerdiff_core::Reduction`), held until compared.
    reductions: HashMap<String, (u64, Tensor)>,
    /// Why the run computing the exact values stopped, when it did.
    lost: Option<String>,
}

impl HandedBaseline {
    /// Ready to take one float64 value per layer, `(name, estimated bytes)`, in order.
    pub fn new(layers: impl IntoIterator<Item = (String, u64)>) -> Self {
        let listed = layers.into_iter().map(|(n, b)| (n, DType::F64, b));
        Self {
            side: PushedSide::new(layerdiff_core::SideInfo::new("baseline", "float64"), listed),
            grids: HashMap::new(),
            reductions: HashMap::new(),
            lost: None,
        }
    }

    /// The run computing the exact values stopped (`why`): the layers after it have none.
    pub fn lose(&mut self, why: String) {
        self.lost.get_or_insert(why);
    }

    /// Layer `index` (named `name`)'s exact value, and the dtype the target computed it in
    /// where it differs from its value's.
    pub fn push(&mut self, index: usize, name: &str, exact: Option<Tensor>, grid: Option<DType>) {
        self.side.push(index, exact);
        if let Some(grid) = grid {
            self.grids.insert(name.to_string(), grid);
        }
    }

    /// Layer `name`'s reduction: `terms` per element, and their root sum of squares `rss`.
    pub fn push_reduction(&mut self, name: &str, terms: u64, rss: Tensor) {
        self.reductions.insert(name.to_string(), (terms, rss));
    }
}

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

    /// Finds the group of every layer's reference value, from the values `known` on both sides.
    pub(crate) fn find_groups(&mut self, values: &[&str], known: &dyn Fn(&str) -> bool) {
        for &value in values {
            let group = self.side.local_group(value, &|n| n != value && known(n));
            self.groups.insert(value.to_string(), group);
        }
    }
}

impl Baseline {
    /// Memory the source holds per reference value until it is compared (handed values).
    pub(crate) fn held_sizes(&self) -> HashMap<String, u64> {
        match self {
            Self::Handed(h) => h.side.plan_view().sizes,
            Self::Graph(_) => HashMap::new(),
        }
    }

    /// The handed-over values, to hand values to.
    pub fn handed(&mut self) -> Option<&mut HandedBaseline> {
        match self {
            Self::Handed(h) => Some(h),
            Self::Graph(_) => None,
        }
    }

    /// The dtype the target computed the layer of reference value `value` in, where the
    /// framework said so.
    pub(crate) fn grid_of(&self, value: &str) -> Option<DType> {
        match self {
            Self::Handed(h) => h.grids.get(value).copied(),
            Self::Graph(_) => None,
        }
    }

    /// The reduction's terms of the layer of reference value `value`, where the framework
    /// measured them.
    pub(crate) fn reduction_of(&self, value: &str) -> Option<(u64, Tensor)> {
        match self {
            Self::Handed(h) => h.reductions.get(value).cloned(),
            Self::Graph(_) => None,
        }
    }

    /// Time spent inside the runtimes computing exact values since the last call (none for
    /// handed values: their framework's time is counted where it computes them).
    pub(crate) fn take_time(&self) -> std::time::Duration {
        match self {
            Self::Handed(_) => std::time::Duration::ZERO,
            Self::Graph(b) => b.side.take_time(),
        }
    }

    /// Drops handed values no longer needed.
    pub(crate) fn free(&mut self, values: &[String]) {
        if let Self::Handed(h) = self {
            h.side.free(values);
            for v in values {
                h.reductions.remove(v);
            }
        }
    }

    /// The exact value (float64) of the layer whose reference value is `value`, computed on
    /// the reference's values of its inputs rounded to `grid` or to the dtype the target holds
    /// them in, whichever is narrower (`feed(n)`: the reference's value of `n` and the target's
    /// dtype of it), with its weights rounded to `grid`.
    pub(crate) fn exact<'a>(
        &self,
        value: &str,
        grid: DType,
        feed: &dyn Fn(&str) -> Fed<'a>,
    ) -> std::result::Result<Tensor, String> {
        match self {
            Self::Handed(h) => h.side.get(value).cloned().ok_or_else(|| match &h.lost {
                Some(why) => format!("the float64 run of the model stopped before it: {why}"),
                None => "no float64 value of it was handed over".to_string(),
            }),
            Self::Graph(b) => {
                let group = match b.groups.get(value) {
                    Some(Ok(group)) => group,
                    Some(Err(why)) => return Err(why.clone()),
                    None => return Err("its group was not found".to_string()),
                };
                b.group_exact(group, value, grid, feed)
                    .map_err(|e| format!("the float64 reference could not compute it: {e}"))
            }
        }
    }
}
