//! A side of a comparison: whatever produces a model's values. ONNX Runtime or tract running a
//! graph ([`crate::GraphSide`]), a file of expected values ([`crate::ExpectedSide`]), values
//! handed over as a framework computes them ([`crate::PushedSide`]: PyTorch's forward hooks).
//! The engine ([`crate::Engine`]) asks every side the same questions, so a new kind of side is
//! one new module implementing [`Side`].

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use layerdiff_core::{
    DType, Evidence, Quantization, SideInfo, Summary, TargetGraph, Tensor, TensorView,
};

use crate::Result;
use crate::engine::evidence::{WeightCheck, WeightCheckFn};
pub use crate::engine::group::{Group, Member};
use crate::engine::plan::{Part, PlanSide};
use crate::timings::Stopwatch;

/// One side of a comparison.
pub trait Side: Send + Sync {
    /// What the side is, for the report: its runtime, and in words what ran (version, device,
    /// options, file). A warning about where it really ran goes to `summary`.
    fn describe(&mut self, summary: &mut Summary) -> SideInfo;
    /// How the segment planner sees the side: the graph whose nodes it computes (none for a side
    /// whose values are handed over) and the estimated bytes of each value.
    fn plan_view(&self) -> PlanSide<'_>;
    /// Makes the values a run of the whole graph hands back available in one run (called once,
    /// before the first segment, when the run is one segment).
    fn expose(&mut self, _values: &[String]) -> Result<()> {
        Ok(())
    }
    /// Whether the side's values come from a computation (a runtime, PyTorch) rather than a
    /// file of expected values. An honest kernel may be further from the exact value than its
    /// dtype's tolerance (a long reduction that cancels), so only expected values are judged
    /// against the exact computation on their own (`reference_off`).
    fn is_computed(&self) -> bool {
        true
    }
    /// Whether the values of the first `layers` layers are in: a side that computes has them
    /// whenever asked; a side whose values are handed over, once they were.
    fn has_layers(&self, _layers: usize) -> bool {
        true
    }
    /// Makes `part`'s values available (a side that computes runs them: the whole graph when
    /// `whole`). Time spent in a runtime goes to the phase `phase`.
    fn produce(
        &mut self,
        part: &Part,
        whole: bool,
        clock: &mut Stopwatch,
        phase: &str,
    ) -> Result<()>;
    /// A value the side holds now.
    fn get(&self, value: &str) -> Option<&Tensor>;
    /// The dtype a value had, still known after the value was dropped.
    fn dtype(&self, value: &str) -> Option<DType>;
    /// Drops values no longer needed.
    fn free(&mut self, values: &[String]);
    /// The part just produced, computed twice more on the same values, to see whether the side
    /// agrees with itself, handing back only the values in `keep`; `None` where it cannot
    /// compute it again.
    fn again(&self, _part: &Part, _keep: &[String]) -> Option<[Vec<(String, Tensor)>; 2]> {
        None
    }
    /// How far the side disagreed with itself at `value` when it computed it twice on its own
    /// (a side that re-runs as it goes reports it here rather than through [`Side::again`]).
    fn disagreement(&self, _value: &str) -> Option<f64> {
        None
    }
    /// The device provider, when it picks its kernels for each graph it is given (a segment may
    /// then compute other bits than the whole run).
    fn kernels_per_graph(&self) -> Option<&'static str> {
        None
    }
    /// The runtime in words, when it rewrites the graph it is given before running it (so the
    /// graph measured with values exposed is not the one that ships).
    fn rewrites(&self) -> Option<String> {
        None
    }
    /// The float32 math its runtime does in lower precision (OpenVINO's bfloat16 inference
    /// precision), where it does: a reference's values then carry that rounding.
    fn reduced_math(&self) -> Option<layerdiff_runtime::ReducedMath> {
        None
    }
    /// Re-running parts of the side's own computation on given values, where it can.
    fn recompute(&self) -> Option<&dyn Recompute> {
        None
    }
    /// For a side that runs its model whole (it cannot re-run one layer on the reference's
    /// values, like the TFLite interpreter): the layer of `value` computed on the side's *own*
    /// values of its inputs (see [`Own`]). Its own error is measured against that.
    fn own_exact(&self, _value: &str) -> Option<&Own> {
        None
    }
    /// As the reference: this side's counterpart of another side's `member` (its node of the
    /// same name and op), whose attributes the other's are compared with
    /// (`epsilon 1e-5 → 0.1 on `ln``); `None` when it has none or cannot tell.
    fn counterpart(&self, _member: &Member) -> Option<Member> {
        None
    }
    /// As the reference: how the other side's weight `name` (read by its node `node` at input
    /// `position`, in the group of layer `layer`) relates to this side's; `None` when this side
    /// has no counterpart.
    fn weight_check(
        &self,
        _layer: usize,
        _node: &str,
        _position: usize,
        _name: &str,
        _weight: TensorView<'_>,
        _half_step: Option<TensorView<'_>>,
    ) -> Option<WeightCheck> {
        None
    }
    /// After the run: what the report says about the graph measured, when the side optimized it
    /// first (`compared`: the distinct values compared in it). Its warnings go to `summary`.
    fn graph_report(&mut self, _compared: &[&str], _summary: &mut Summary) -> Option<TargetGraph> {
        None
    }
    /// Where values are handed to a side that does not compute them itself (a framework's
    /// layers, pushed as they come).
    fn receiver(&mut self) -> Option<&mut dyn Receive> {
        None
    }
}

/// A side that takes values handed over layer by layer, as a framework computes them.
pub trait Receive {
    /// Layer `index`'s value (`None`: computed but not to be kept).
    fn push(&mut self, index: usize, value: Option<Tensor>);
    /// Layer `index` re-run by the framework on the reference's inputs (its local value, or why
    /// there is none), and how far two runs of it disagreed.
    fn push_local(
        &mut self,
        index: usize,
        local: std::result::Result<Tensor, String>,
        disagreement: Option<f64>,
    );
    /// The parameters of layer `index`, checked against the other side's weights when a cause
    /// is looked for.
    fn set_parameters(&mut self, index: usize, parameters: Vec<(String, Tensor)>);
    /// Layer `index`'s call passes other numbers or flags than the reference's (in words).
    fn push_arguments(&mut self, _index: usize, _arguments: Vec<String>) {}
    /// Layer `index` computed on the side's own values of its inputs (see [`Own`]).
    fn push_own(&mut self, index: usize, own: Own);
    /// Half a quantization step per element of the parameters of layer `index` the side stores
    /// quantized (dequantized in [`Receive::set_parameters`]), by parameter name.
    fn set_half_steps(&mut self, index: usize, half_steps: Vec<(String, Tensor)>);
}

/// A layer of a side that runs its model whole, computed on the side's own values of its
/// inputs: what its own error is measured against, and the ideal it is judged by.
#[derive(Debug, Clone)]
pub struct Own {
    /// The layer exactly (float64, rounded to the reference's dtype) with the reference's
    /// weights: the side's value less this is the layer's own error.
    pub exact: Tensor,
    /// The layer exactly with the weights the side stores (dequantized), before it rounds its
    /// value: what an honest kernel of the side computes; `None` where it cannot be told
    /// (`why`), and then the layer's error is not held to an ideal.
    pub ideal: Option<Tensor>,
    /// The grid the side quantizes the value to, where it does.
    pub grid: Option<Quantization>,
    /// Why there is no ideal.
    pub why: Option<String>,
    /// Per element, how far the ideal may move by what the side does to the layer's inputs as
    /// it runs and the ideal cannot model exactly (a kernel quantizing its float input to int8
    /// on the fly): added to what precision explains.
    pub slack: Option<Tensor>,
}

/// A value a side quantizes: its name, the side's node that quantizes it, and the grid.
#[derive(Debug, Clone)]
pub struct QuantizedValue {
    /// The value's name on the side.
    pub value: String,
    /// The node that quantizes it.
    pub node: String,
    /// The grid it quantizes it to.
    pub grid: layerdiff_core::Quantization,
}

/// Re-runs a group of a side's own computation on given values: what local error, and the
/// evidence behind a cause, are built on.
pub trait Recompute {
    /// The group that computes `value` from values `known` on both sides, or why there is none.
    fn local_group(&self, value: &str, known: &dyn Fn(&str) -> bool) -> Result<Group, String>;
    /// `value` computed by `group` from `feed`'s tensors.
    fn run_group(
        &self,
        group: &Group,
        value: &str,
        feed: &dyn Fn(&str) -> Result<Tensor, String>,
    ) -> Result<Tensor, String>;
    /// Time spent inside the runtime by re-runs since the last call.
    fn take_time(&self) -> Duration;
    /// Whether a group re-run alone computes with the kernels of the side's own run: then, fed
    /// the very values the side's run read, it gives the side's own value back, and the flow
    /// takes that value instead of re-running it. Not where the runtime compiles its graph
    /// whole or picks kernels for each graph it is given: alone, a group may compute otherwise.
    fn reruns_as_run(&self) -> bool {
        false
    }
    /// Intermediate results the group rounds to `grid` besides its output: what an honest
    /// kernel chain may add of rounding (see `layerdiff_core::kernel_allowance`).
    fn rounding_stages(&self, _group: &Group, _grid: DType) -> u32 {
        0
    }
    /// The narrowest float dtype the group's computing nodes produce (a float32 layer whose
    /// Conv runs in float16 between two Casts: float16); `None` when unknown.
    fn computes_in(&self, _group: &Group) -> Option<DType> {
        None
    }
    /// The values the group's computation read, where its error is traced upstream: its
    /// inputs, unless the side knows better (a side that re-ran the group itself).
    fn traced_inputs(&self, group: &Group) -> Vec<String> {
        group.inputs.clone()
    }
    /// The group's members in the side's own terms, in order.
    fn members(&self, group: &Group) -> Vec<Member>;
    /// The values the side quantizes (ONNX's QuantizeLinear) whose reference values its grid
    /// is counted against: `value` itself where the side holds it on a grid, and each graph
    /// input `group` (where known) quantizes.
    fn grids(&self, _group: Option<&Group>, _value: &str) -> Vec<QuantizedValue> {
        Vec::new()
    }
    /// `value` computed exactly (float64) by `group` as the side's own file writes it, on
    /// `feed`'s values rounded to `grid` or as held, its weights rounded to `grid` (`None`: the
    /// side has no such computation, or the flow did not ask for it).
    fn as_written(
        &self,
        _group: &Group,
        _value: &str,
        _grid: DType,
        _feed: &dyn Fn(&str) -> Result<Tensor, String>,
    ) -> Option<Result<Tensor, String>> {
        None
    }
    /// What the group computing `value` shows about a cause: its ops, how it lowers precision
    /// below `reference` (the dtype the reference computes the layer in; `fed` gives each
    /// input's dtype on the reference and on this side), and the weights it reads, each checked
    /// by `check(node name, input position, name, weight)` against the reference's.
    fn group_evidence(
        &self,
        group: &Group,
        value: &str,
        reference: Option<DType>,
        evidence: &mut Evidence,
        fed: &dyn Fn(&str) -> Option<(DType, DType)>,
        check: &WeightCheckFn<'_>,
    );
}

impl<S: Side + ?Sized> Side for Box<S> {
    fn describe(&mut self, summary: &mut Summary) -> SideInfo {
        (**self).describe(summary)
    }
    fn plan_view(&self) -> PlanSide<'_> {
        (**self).plan_view()
    }
    fn expose(&mut self, values: &[String]) -> Result<()> {
        (**self).expose(values)
    }
    fn is_computed(&self) -> bool {
        (**self).is_computed()
    }
    fn has_layers(&self, layers: usize) -> bool {
        (**self).has_layers(layers)
    }
    fn produce(
        &mut self,
        part: &Part,
        whole: bool,
        clock: &mut Stopwatch,
        phase: &str,
    ) -> Result<()> {
        (**self).produce(part, whole, clock, phase)
    }
    fn get(&self, value: &str) -> Option<&Tensor> {
        (**self).get(value)
    }
    fn dtype(&self, value: &str) -> Option<DType> {
        (**self).dtype(value)
    }
    fn free(&mut self, values: &[String]) {
        (**self).free(values)
    }
    fn again(&self, part: &Part, keep: &[String]) -> Option<[Vec<(String, Tensor)>; 2]> {
        (**self).again(part, keep)
    }
    fn disagreement(&self, value: &str) -> Option<f64> {
        (**self).disagreement(value)
    }
    fn kernels_per_graph(&self) -> Option<&'static str> {
        (**self).kernels_per_graph()
    }
    fn rewrites(&self) -> Option<String> {
        (**self).rewrites()
    }
    fn reduced_math(&self) -> Option<layerdiff_runtime::ReducedMath> {
        (**self).reduced_math()
    }
    fn recompute(&self) -> Option<&dyn Recompute> {
        (**self).recompute()
    }
    fn own_exact(&self, value: &str) -> Option<&Own> {
        (**self).own_exact(value)
    }
    fn counterpart(&self, member: &Member) -> Option<Member> {
        (**self).counterpart(member)
    }
    fn weight_check(
        &self,
        layer: usize,
        node: &str,
        position: usize,
        name: &str,
        weight: TensorView<'_>,
        half_step: Option<TensorView<'_>>,
    ) -> Option<WeightCheck> {
        (**self).weight_check(layer, node, position, name, weight, half_step)
    }
    fn graph_report(&mut self, compared: &[&str], summary: &mut Summary) -> Option<TargetGraph> {
        (**self).graph_report(compared, summary)
    }
    fn receiver(&mut self) -> Option<&mut dyn Receive> {
        (**self).receiver()
    }
}

/// The values a side holds: its inputs, and what its segments produced and still need; and
/// the dtype of every value it produced, kept after the value is dropped.
#[derive(Default)]
pub struct Values {
    held: Vec<(String, Tensor)>,
    dtypes: HashMap<String, DType>,
}

impl Values {
    /// Starts with the inputs.
    pub fn new(inputs: Vec<(String, Tensor)>) -> Self {
        Self {
            held: inputs,
            dtypes: HashMap::new(),
        }
    }

    /// Everything held, inputs first.
    pub fn all(&self) -> &[(String, Tensor)] {
        &self.held
    }

    /// A value held now.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.held
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    /// The dtype a produced value had.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.dtypes.get(name).copied()
    }

    /// Keeps a produced value.
    pub fn insert(&mut self, name: String, tensor: Tensor) {
        self.dtypes.insert(name.clone(), tensor.dtype);
        self.held.push((name, tensor));
    }

    /// Drops values.
    pub fn free(&mut self, names: &[String]) {
        let names: HashSet<&str> = names.iter().map(String::as_str).collect();
        self.held.retain(|(n, _)| !names.contains(n.as_str()));
    }
}
