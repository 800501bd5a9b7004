//! The flow for a reference captured outside Rust (PyTorch forward hooks), streamed.
//!
//! The caller first lists the layers (one forward pass that keeps nothing but names and
//! shapes), then starts a [`CapturedRun`]: each captured layer is mapped to an ONNX value and
//! the ONNX run is planned in segments that fit the memory budget (see [`crate::segments`]).
//! During a second forward pass each hook hands its layer's value over with [`CapturedRun::add`];
//! as soon as a segment's layers are all in, the target runs that segment, and its values are
//! compared, re-run locally, judged and dropped after their last use. So neither side ever
//! holds more than the budget: PyTorch's own activations are freed by PyTorch as it goes, and
//! ours are freed segment by segment. With one segment the ONNX model runs whole, its compared
//! values exposed in place.

use std::collections::HashMap;
use std::path::PathBuf;

use layerdiff_core::{
    DType, Evidence, Float64Distance, InputInfo, Layer, LayerStatus, OnnxRef, Report, SCHEMA,
    SideInfo, Summary, Tensor, TensorView, Tolerance, analyse, compare_pair, explain, judge,
    nothing_compared,
};
use layerdiff_onnx::{
    GraphIndex, LayerCall, LayerMapping, LocalGroup, Model, ScopeMapping, expose_values,
    local_group,
};
use layerdiff_runtime::{Runtime, RuntimeSpec};

use crate::local::{Rerun, WeightCheck, check_weight, disagreement, fit};
use crate::segments::{
    Plan, PlanSide, PlannedLayer, Segmentation, Values, part_model, plan, segments_warning,
    value_sizes,
};
use crate::shipped::{Placement, Renames, Shipped, prepare_target};
use crate::timings::{OWN, RUNTIME, Stopwatch};
use crate::value_pairing::{pair_by_values, unrecognised_from};
use crate::{Error, Result, inputs::check_inputs};

/// The phase PyTorch's forward pass is timed under while layers stream in.
pub const CAPTURE_PHASE: &str = "capturing PyTorch layers";

/// One captured layer call, as listed before its value is captured.
#[derive(Debug, Clone)]
pub struct ListedLayer {
    /// Which module call it is, and how it relates to the calls before it.
    pub call: LayerCall,
    /// The module's class name (`Conv2d`).
    pub module_type: String,
}

/// Everything the captured-reference flow needs before the first value arrives.
#[derive(Debug, Clone)]
pub struct CapturedComparison {
    /// The command named in the report (`torch`).
    pub command: String,
    /// The model's display name.
    pub model: String,
    /// The ONNX file of the same model instance.
    pub onnx_path: PathBuf,
    /// The inputs both sides were given.
    pub inputs: Vec<(String, Tensor)>,
    /// Seed of generated inputs.
    pub seed: Option<u64>,
    /// The layers in execution order.
    pub layers: Vec<ListedLayer>,
    /// How each layer's tolerance is chosen.
    pub tolerance: Tolerance,
    /// Whether to measure each layer's local error (re-running its ONNX nodes on PyTorch's
    /// values of their inputs).
    pub local: bool,
    /// Whether each layer's value in a float64 run comes with it (held until compared).
    pub float64: bool,
    /// Describes the reference side.
    pub reference: SideInfo,
    /// The runtime that runs the ONNX file.
    pub target: RuntimeSpec,
    /// ONNX Runtime library to load (`None`: search).
    pub ort_library: Option<PathBuf>,
    /// The most bytes of values to hold at once (`None`: no limit).
    pub max_memory: Option<u64>,
}

/// A captured-reference comparison under way: layers go in as PyTorch produces them, segments
/// run as soon as their layers are in, and [`CapturedRun::finish`] builds the report.
pub struct CapturedRun {
    c: CapturedComparison,
    model: Model,
    runtime: Box<dyn Runtime + Send + Sync>,
    /// Each layer's ONNX value, where it has one.
    values: Vec<Option<String>>,
    /// The first layer holding each ONNX value.
    layer_of_value: HashMap<String, usize>,
    /// The ONNX model's outputs.
    graph_outputs: Vec<String>,
    /// Why mapping leaves the verdict open, for the summary.
    inconclusive: Option<String>,
    /// Values an optimizer renamed in the target graph.
    renames: Renames,
    /// Set when the target runtime optimized the graph first.
    shipped: Option<Shipped>,
    /// Where the target runtime really ran the nodes, when it can place them elsewhere.
    placement: Option<Placement>,
    /// Each layer's local group (for the first layer of each value, with `local`).
    groups: Vec<Option<std::result::Result<LocalGroup, String>>>,
    plan: Plan,
    /// Segments run so far.
    done: usize,
    /// Layers handed over so far.
    received: usize,
    layers: Vec<Layer>,
    evidence: Vec<Evidence>,
    /// PyTorch's values (and float64 values) still needed, by layer.
    held: Vec<Option<Tensor>>,
    truth: Vec<Option<Tensor>>,
    /// The target's values still needed.
    live: Values,
    t_dtypes: HashMap<String, DType>,
    summary: Option<Summary>,
    clock: Stopwatch,
}

impl CapturedRun {
    /// Maps the layers to ONNX values, plans the segments and starts the target runtime.
    pub fn start(c: CapturedComparison, mut clock: Stopwatch) -> Result<Self> {
        let mut model = Model::load(&c.onnx_path)?;
        let index = GraphIndex::new(model.graph());
        check_inputs(&index, &c.inputs)?;
        for (i, layer) in c.layers.iter().enumerate() {
            if layer.call.input_from.is_some_and(|p| p >= i) {
                return Err(Error::Layers(format!(
                    "layer `{}` reads from a later layer",
                    layer.call.name
                )));
            }
        }
        let runtime = c.target.build(c.ort_library.as_deref(), &model)?;
        clock.lap("runtime start-up", RUNTIME);
        let calls: Vec<LayerCall> = c.layers.iter().map(|l| l.call.clone()).collect();
        let scoped = ScopeMapping::new(model.graph(), &calls);
        let mut inconclusive = None;
        let by_values = match scoped.request() {
            Some(request) => {
                let request = request.clone();
                let found = pair_by_values(
                    &mut model,
                    runtime.as_ref(),
                    &c.inputs,
                    &calls,
                    &request,
                    c.max_memory,
                )?;
                clock.lap("pairing layers by values", RUNTIME);
                let names: Vec<&str> = request
                    .layers
                    .iter()
                    .map(|&i| calls[i].name.as_str())
                    .collect();
                let recognised: Vec<bool> = found.iter().map(Result::is_ok).collect();
                if request.unscoped_file {
                    inconclusive = unrecognised_from(&names, &recognised);
                }
                found
            }
            None => Vec::new(),
        };
        let mut mappings = scoped.finish(model.graph(), &calls, by_values);
        // An optimizing runtime is measured on the graph it optimized (see crate::shipped):
        // layers are mapped on the file, then found in that graph or explained.
        let target = prepare_target(&model, None, runtime, &c.inputs)?;
        if target.shipped.is_some() {
            clock.lap("optimizing the target graph", RUNTIME);
        }
        let (runtime, renames, shipped, placement) = (
            target.runtime,
            target.renames,
            target.shipped,
            target.placement,
        );
        if let Some(optimized) = target.model {
            let after = GraphIndex::new(optimized.graph());
            for mapping in &mut mappings {
                if let LayerMapping::Mapped { value, note, .. } = mapping {
                    if let Some(why) = survives(&after, &renames, value) {
                        *mapping = LayerMapping::Unmapped { reason: why };
                    } else if let Some(how) = renames.restored.get(value.as_str()) {
                        *note = Some(how.clone());
                    }
                }
            }
            model = optimized;
        }
        let index = GraphIndex::new(model.graph());
        let values: Vec<Option<String>> = mappings
            .iter()
            .map(|m| match m {
                LayerMapping::Mapped { value, .. } => Some(value.clone()),
                LayerMapping::Unmapped { .. } => None,
            })
            .collect();
        let mut layer_of_value: HashMap<String, usize> = HashMap::new();
        for (i, value) in values.iter().enumerate() {
            if let Some(v) = value {
                layer_of_value.entry(v.clone()).or_insert(i);
            }
        }
        let is_input = |n: &str| c.inputs.iter().any(|(name, _)| name == n);
        let groups: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(i, value)| {
                let value = value
                    .as_deref()
                    .filter(|v| c.local && layer_of_value[*v] == i)?;
                let known = |n: &str| n != value && (is_input(n) || layer_of_value.contains_key(n));
                Some(local_group(&index, value, &known))
            })
            .collect();
        let planned: Vec<PlannedLayer<'_>> = c
            .layers
            .iter()
            .zip(&values)
            .zip(&groups)
            .map(|((layer, value), group)| PlannedLayer {
                reference: &layer.call.name,
                target: value.as_deref(),
                local_inputs: match group {
                    Some(Ok(g)) => &g.inputs,
                    _ => &[],
                },
            })
            .collect();
        // PyTorch's value of a layer, and its float64 value until compared.
        let copies = if c.float64 { 3 } else { 1 };
        let reference = PlanSide {
            graph: None,
            sizes: c
                .layers
                .iter()
                .map(|l| (l.call.name.clone(), copies * l.call.bytes()))
                .collect(),
        };
        let target = PlanSide {
            graph: Some(&index),
            sizes: value_sizes(&index, &c.inputs),
        };
        let plan = plan(&reference, &target, &planned, c.max_memory);
        drop(planned);
        if plan.segments.len() == 1 {
            expose_values(&mut model, &plan.segments[0].target.outputs)?;
        }
        let layers: Vec<Layer> = c
            .layers
            .iter()
            .zip(&mappings)
            .enumerate()
            .map(|(index, (listed, mapping))| {
                let mut layer = Layer::new(
                    index,
                    listed.call.name.clone(),
                    listed.call.shape.clone(),
                    listed.call.dtype.name(),
                );
                layer.module_type = Some(listed.module_type.clone());
                match mapping {
                    LayerMapping::Unmapped { reason } => layer.reason = Some(reason.clone()),
                    LayerMapping::Mapped {
                        value,
                        node,
                        op_type,
                        note,
                    } => {
                        layer.onnx = Some(OnnxRef {
                            value: value.clone(),
                            node: node.clone(),
                            op_type: op_type.clone(),
                        });
                        layer.reason = note.clone();
                    }
                }
                layer
            })
            .collect();
        clock.lap("mapping layers and planning the run", OWN);
        let n = layers.len();
        Ok(Self {
            live: Values::new(c.inputs.clone()),
            c,
            model,
            runtime,
            values,
            layer_of_value,
            graph_outputs: index.graph_outputs().to_vec(),
            inconclusive,
            renames,
            shipped,
            placement,
            groups,
            plan,
            done: 0,
            received: 0,
            evidence: vec![Evidence::default(); n],
            layers,
            held: vec![None; n],
            truth: vec![None; n],
            t_dtypes: HashMap::new(),
            summary: None,
            clock,
        })
    }

    /// How the run is split.
    pub fn segmentation(&self) -> Segmentation {
        self.plan.segmentation()
    }

    /// Takes layer `index`'s value (and its value in the float64 run), copying what is needed
    /// later, then runs every segment whose layers are now all in. Layers come in order.
    pub fn add(
        &mut self,
        index: usize,
        value: TensorView<'_>,
        float64: Option<TensorView<'_>>,
    ) -> Result<()> {
        self.clock.lap(CAPTURE_PHASE, "pytorch");
        let listed = self.c.layers.get(index).ok_or_else(|| {
            Error::Layers(format!(
                "the model made more leaf-module calls this time than the {} listed: \
                 it does not run the same way twice",
                self.c.layers.len()
            ))
        })?;
        if index != self.received {
            return Err(Error::Layers(format!(
                "layer {index} (`{}`) handed over out of order: expected layer {}",
                listed.call.name, self.received
            )));
        }
        if value.shape != listed.call.shape.as_slice() || value.dtype != listed.call.dtype {
            return Err(Error::Layers(format!(
                "layer `{}` gave a {:?} {} output this time and {:?} {} when the layers were \
                 listed: the model does not run the same way twice",
                listed.call.name,
                value.shape,
                value.dtype.name(),
                listed.call.shape,
                listed.call.dtype.name()
            )));
        }
        if self.values[index].is_some() {
            self.held[index] = Some(value.to_tensor());
            self.truth[index] = float64.map(|t| t.to_tensor());
        }
        self.received += 1;
        self.clock.lap("handing layers to the core", OWN);
        while self
            .plan
            .segments
            .get(self.done)
            .is_some_and(|s| s.layers.end <= self.received)
        {
            self.run_segment()?;
        }
        Ok(())
    }

    /// Runs the next segment: the target's part, then every comparison in it.
    fn run_segment(&mut self) -> Result<()> {
        let segment = self.plan.segments[self.done].clone();
        let whole = self.plan.segments.len() == 1;
        let runtime = self.runtime.as_ref();
        let t_model = part_model(&self.model, &segment.target, whole, runtime, &self.live)?;
        self.clock.lap("extracting segments", OWN);
        self.live
            .run(runtime, &t_model, &segment.target, &mut self.t_dtypes)?;
        self.clock.lap("target run", RUNTIME);
        if let Some(shipped) = self.shipped.as_mut() {
            shipped.check_outputs(&self.live);
        }

        for i in segment.layers.clone() {
            let (Some(value), Some(reference)) = (&self.values[i], &self.held[i]) else {
                continue;
            };
            let target = self
                .live
                .get(value)
                .expect("every compared value is requested");
            let layer = &mut self.layers[i];
            // A model output paired by its own scope may really differ in shape: a finding.
            let output = layer.reason.is_none() && self.graph_outputs.contains(value);
            if let Some(why) = unfit(reference, target, value, output) {
                // The export of this very model cannot produce another shape or kind of value
                // at this layer: the pairing is wrong, and that is no finding about the target.
                layer.status = LayerStatus::Unmapped;
                layer.target_shape = Some(target.shape.clone());
                layer.target_dtype = Some(target.dtype.name().to_string());
                layer.reason = Some(why);
                continue;
            }
            let outcome = compare_pair(reference.view(), target.view());
            layer.status = outcome.status;
            layer.accumulated = outcome.stats;
            layer.target_shape = outcome.target_shape;
            layer.target_dtype = outcome.target_dtype;
            if let Some(truth) = &self.truth[i] {
                let distance =
                    |v: TensorView<'_>| compare_pair(truth.view(), v).stats.map(|s| s.max_abs_diff);
                if let (Some(reference), Some(target)) =
                    (distance(reference.view()), distance(target.view()))
                {
                    layer.float64 = Some(Float64Distance { reference, target });
                }
            }
        }
        self.clock.lap("comparison", OWN);

        // Local error: each layer's ONNX nodes re-run on PyTorch's values of their inputs.
        let rerun = Rerun::new(&self.model, runtime);
        let (c, held, live, layer_of_value) =
            (&self.c, &self.held, &self.live, &self.layer_of_value);
        let feed = |n: &str| -> std::result::Result<Tensor, String> {
            if let Some((_, t)) = c.inputs.iter().find(|(name, _)| name == n) {
                return Ok(t.clone());
            }
            let j = *layer_of_value
                .get(n)
                .ok_or_else(|| format!("`{n}` is not known"))?;
            let (Some(reference), Some(target)) = (&held[j], live.get(n)) else {
                return Err(format!("`{n}` is no longer held"));
            };
            fit(
                &c.layers[j].call.name,
                reference.clone(),
                target.dtype,
                &target.shape,
            )
        };
        for i in segment.layers.clone() {
            let (Some(value), Some(reference)) = (&self.values[i], &held[i]) else {
                continue;
            };
            let layer = &mut self.layers[i];
            if layer.status != LayerStatus::Compared {
                continue;
            }
            let first = layer_of_value[value.as_str()];
            if first != i {
                layer.local_reason = Some(format!(
                    "it holds the same ONNX value as `{}`, so it has no nodes of its own",
                    c.layers[first].call.name
                ));
                continue;
            }
            let name_of = |n: &str| {
                layer_of_value
                    .get(n)
                    .map_or(n.to_string(), |&j| c.layers[j].call.name.clone())
            };
            let slot = &mut self.groups[i];
            rerun.measure_local(layer, slot, value, reference.view(), &feed, &name_of);
        }
        self.clock.split_lap(
            "local error: extraction and comparison",
            "local error: inference",
            rerun.inference.take(),
        );

        // What the values of an exceeding layer show, while they are held.
        let mut exceeding = false;
        for i in segment.layers.clone() {
            let layer = &mut self.layers[i];
            judge(layer, c.tolerance);
            if !(layer.exceeds_tol || layer.local_exceeds) {
                continue;
            }
            exceeding = true;
            if let (Some(value), Some(reference)) = (&self.values[i], &held[i])
                && let Some(target) = live.get(value)
            {
                self.evidence[i] = Evidence::from_values(layer, reference.view(), target.view());
            }
        }
        self.clock.lap("analysis and causes", OWN);
        if exceeding {
            // Does the target disagree with itself? Two more runs of the segment, one session.
            let again = runtime
                .run_twice(&t_model, live.all(), &segment.target.outputs)
                .ok();
            for i in segment.layers.clone() {
                if let Some(value) = &self.values[i]
                    && let Some(first) = live.get(value)
                    && let Some(d) = disagreement(first, again.as_ref(), value)
                {
                    self.evidence[i].self_disagreement = Some(("target".to_string(), d));
                }
            }
            self.clock.lap("second runs (nondeterminism)", RUNTIME);
        }
        for name in &segment.reference.free {
            if let Some(i) = c.layers.iter().position(|l| &l.call.name == name) {
                self.held[i] = None;
            }
        }
        for i in segment.layers.clone() {
            self.truth[i] = None;
        }
        self.live.free(&segment.target.free);
        self.done += 1;
        Ok(())
    }

    /// After the forward pass: runs what is left, decides the drift origin, and returns the
    /// layers whose cause needs a look at PyTorch's parameters (ask [`CapturedRun::finish`]
    /// with theirs).
    pub fn conclude(&mut self) -> Result<Vec<usize>> {
        self.clock.lap(CAPTURE_PHASE, "pytorch");
        if self.received != self.layers.len() {
            return Err(Error::Layers(format!(
                "the model made {} leaf-module calls this time and {} when the layers were \
                 listed: it does not run the same way twice",
                self.received,
                self.layers.len()
            )));
        }
        while self.done < self.plan.segments.len() {
            self.run_segment()?;
        }
        let mut summary = analyse(&mut self.layers, self.c.tolerance);
        if summary.drift_origin.is_none() {
            summary.inconclusive = self.inconclusive.take();
        }
        if let Some(why) = nothing_compared(&self.layers, &summary) {
            return Err(Error::NothingCompared(format!(
                "{why}\nhint: is the ONNX file an export of this very model? Layers are paired by the module scopes the exporter records (both torch.onnx exporters do); a file without them, or from another model, pairs nothing"
            )));
        }
        let wanted = (0..self.layers.len())
            .filter(|&i| {
                summary.needs_cause(&self.layers[i]) && matches!(self.groups[i], Some(Ok(_)))
            })
            .collect();
        self.summary = Some(summary);
        Ok(wanted)
    }

    /// The report, with the weight evidence of `parameters` (by layer: PyTorch's parameters
    /// and buffers by qualified name, with the forms an exporter may fold them into, e.g. a
    /// Conv's weight scaled by the BatchNorm after it, under the same name).
    pub fn finish(
        mut self,
        parameters: &HashMap<usize, Vec<(String, TensorView<'_>)>>,
    ) -> Result<Report> {
        if self.summary.is_none() {
            self.conclude()?;
        }
        let mut summary = self.summary.take().expect("concluded");
        let target_graph = self.shipped.take().map(|shipped| {
            let surviving = self.values.iter().flatten().map(String::as_str);
            shipped.finish(surviving, &self.renames, &mut summary)
        });
        let providers = [self.runtime.kernels_per_graph()];
        summary
            .warnings
            .extend(segments_warning(self.plan.segments.len(), &providers));
        let mut target = SideInfo::new(self.runtime.name(), self.runtime.detail());
        if let Some(placement) = self.placement.take() {
            placement.report(&mut target, &mut summary);
        }
        let rerun = Rerun::new(&self.model, self.runtime.as_ref());
        for (i, layer) in self.layers.iter().enumerate() {
            let (true, Some(Ok(group))) = (summary.needs_cause(layer), &self.groups[i]) else {
                continue;
            };
            let fed = |n: &str| {
                let listed = &self.c.layers[*self.layer_of_value.get(n)?];
                Some((listed.call.dtype, *self.t_dtypes.get(n)?))
            };
            let own = parameters.get(&i).map_or(&[][..], Vec::as_slice);
            let check = |_, _, name: &str, weight: &Tensor| parameter_check(name, own, weight);
            rerun.group_evidence(group, &mut self.evidence[i], &fed, &check);
        }
        explain(&mut self.layers, &self.evidence, &summary);
        self.clock.lap("analysis and causes", OWN);
        let c = &self.c;
        Ok(Report {
            schema: SCHEMA,
            command: c.command.clone(),
            model: c.model.clone(),
            reference: c.reference.clone(),
            target,
            target_graph,
            mode: if c.local { "local" } else { "accumulated" }.to_string(),
            tolerance: c.tolerance.info(),
            seed: c.seed,
            inputs: InputInfo::describe(&c.inputs),
            summary,
            layers: self.layers,
            machine: layerdiff_core::Machine::this(),
            timings: Some(self.clock.phases()),
        })
    }
}

/// Why a value of the file has no counterpart in the optimized graph `after`, or `None` when
/// it has one there (under its name, or given back from a blocked layout).
fn survives(after: &GraphIndex, renames: &Renames, value: &str) -> Option<String> {
    if let Some(why) = renames.blocked.get(value) {
        return Some(format!(
            "the optimized graph holds `{value}` in a blocked (NCHWc) layout, not given back: {why}"
        ));
    }
    if after.is_initializer(value) {
        return Some(format!(
            "folded into a constant by the optimizer: `{value}` is not computed in the graph that runs"
        ));
    }
    let computed =
        after.producer(value).is_some() || after.graph_inputs().iter().any(|i| i == value);
    (!computed).then(|| {
        format!("fused or removed by the optimizer: `{value}` is not in the graph that runs")
    })
}

/// Why the ONNX value `value` cannot be this layer's output, when it cannot: a different
/// element count, or a non-float value for a float layer. A model output paired by scope is
/// exempt (`output`): there a different shape is what the user's file really computes.
fn unfit(reference: &Tensor, target: &Tensor, value: &str, output: bool) -> Option<String> {
    let count = |t: &Tensor| t.shape.iter().product::<usize>();
    let wrong =
        count(reference) != count(target) || reference.dtype.is_float() && !target.dtype.is_float();
    (wrong && !output).then(|| {
        format!(
            "mapping problem: paired with the ONNX value `{value}` ({} {:?}), which cannot hold this layer's output ({} {:?}); not compared",
            target.dtype.name(),
            target.shape,
            reference.dtype.name(),
            reference.shape
        )
    })
}

/// Checks an ONNX initializer against the layer's PyTorch parameters: the forms of the same
/// name, else the one parameter of the same shape (or, for a matrix, the transposed shape).
/// `None` when no parameter corresponds.
fn parameter_check(
    name: &str,
    parameters: &[(String, TensorView<'_>)],
    weight: &Tensor,
) -> Option<WeightCheck> {
    let named: Vec<&TensorView<'_>> = parameters
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, t)| t)
        .collect();
    let candidates: Vec<(String, Tensor)> = if named.is_empty() {
        let shaped: Vec<(String, Tensor)> = parameters
            .iter()
            .filter_map(|(n, t)| {
                if t.shape == weight.shape.as_slice() {
                    Some((n.clone(), t.to_tensor()))
                } else if t.shape.len() == 2
                    && weight.shape.len() == 2
                    && t.shape[0] == weight.shape[1]
                    && t.shape[1] == weight.shape[0]
                {
                    Some((n.clone(), transpose_2d(t)))
                } else {
                    None
                }
            })
            .collect();
        let mut names: Vec<&String> = shaped.iter().map(|(n, _)| n).collect();
        names.dedup();
        if names.len() != 1 {
            return None;
        }
        shaped
    } else {
        named
            .into_iter()
            .map(|t| (name.to_string(), t.to_tensor()))
            .collect()
    };
    let mut outcome = None;
    for (n, parameter) in &candidates {
        let by_shape = if n == name {
            String::new()
        } else {
            format!(" (PyTorch `{n}`, matched by shape)")
        };
        match check_weight(name, parameter.view(), weight.view()) {
            WeightCheck::Same => return Some(WeightCheck::Same),
            WeightCheck::Differs(text) => {
                outcome.get_or_insert(WeightCheck::Differs(text + &by_shape));
            }
            WeightCheck::LowerPrecision(text) => {
                outcome.get_or_insert(WeightCheck::LowerPrecision(text + &by_shape));
            }
        }
    }
    outcome
}

/// A matrix transposed.
fn transpose_2d(t: &TensorView<'_>) -> Tensor {
    let (rows, cols, size) = (t.shape[0], t.shape[1], t.dtype.size());
    let mut bytes = vec![0u8; t.bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
            bytes[to..to + size].copy_from_slice(&t.bytes[from..from + size]);
        }
    }
    Tensor {
        dtype: t.dtype,
        shape: vec![cols, rows],
        bytes,
    }
}
