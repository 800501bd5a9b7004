//! `layerdiff torch`: a reference captured outside Rust (PyTorch's forward hooks), streamed,
//! against the model's ONNX export, or against PyTorch itself computing differently (another
//! device, precision or compiler), whose values are handed over beside the reference's.
//!
//! The caller first lists the layers (one forward pass that keeps nothing but names and
//! shapes), then starts a [`CapturedRun`]: each captured layer is mapped to an ONNX value (by
//! the module scopes the exporter records, else by value) and the run is planned in segments
//! that fit the memory budget. During a second forward pass each hook hands its layer's value
//! over with [`CapturedRun::add`] (a [`PushedSide`], with the float64 run's as the truth); the
//! [`Engine`] runs each segment of the ONNX graph as soon as its layers are in. So neither side
//! holds more than the budget: PyTorch frees its own activations as it goes, and ours are
//! freed segment by segment.

use std::path::PathBuf;

use layerdiff_core::{DType, Layer, Location, SideInfo, Tensor, TensorView};
use layerdiff_onnx::{GraphIndex, LayerCall, LayerMapping, Model, ScopeMapping};
use layerdiff_runtime::RuntimeSpec;

use crate::HandedBaseline;
use crate::engine::memory::Segmentation;
use crate::engine::memory::budget;
use crate::inputs::{check_inputs, unread_inputs};
use crate::sides::graph::shipped::{Renames, prepare_target};
use crate::spec::target::TargetSpec;
use crate::spec::torch::TorchSpec;
use crate::timings::{OWN, RUNTIME, Stopwatch};
use crate::{
    Alignment, Baseline, Computing, Engine, EngineParts, Error, GraphSide, Header, PushedSide,
    RelaidSide, Result, Settings, Shared, Side,
};
use value_pairing::{pair_by_values, unrecognised_from};

mod align;
mod parameters;
mod value_pairing;
pub use align::check_options;
use align::{onnx_target, same_layers};

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

impl ListedLayer {
    /// The report's layer for it, at `index`, before anything is compared.
    fn layer(&self, index: usize) -> Layer {
        let mut layer = Layer::new(
            index,
            self.call.name.clone(),
            self.call.shape.clone(),
            self.call.dtype.name(),
        );
        layer.module_type = Some(self.module_type.clone());
        layer
    }
}

/// Everything the captured-reference flow needs before the first value arrives.
#[derive(Debug, Clone)]
pub struct CapturedComparison {
    /// The command named in the report (`torch`).
    pub command: String,
    /// The model's display name.
    pub model: String,
    /// The inputs both sides were given.
    pub inputs: Vec<(String, Tensor)>,
    /// Seed of generated inputs.
    pub seed: Option<u64>,
    /// The layers in execution order.
    pub layers: Vec<ListedLayer>,
    /// Tolerance, local error (re-running each layer's ONNX nodes on PyTorch's values of their
    /// inputs), memory budget, and what comes with each layer's value: its value in a float64
    /// run (the truth, held until compared) and its same-precision baseline (the layer computed
    /// in float64 on the reference's inputs rounded to the target's dtype, held until its
    /// local error is measured).
    pub settings: Settings,
    /// Describes the reference side.
    pub reference: SideInfo,
    /// What the reference is compared with.
    pub target: CapturedTarget,
    /// Whether the reference holds its values channels-last (Keras, TensorFlow): an ONNX value
    /// the converter holds channels-first is compared transposed back ([`crate::RelaidSide`]).
    pub channels_last: bool,
}

/// What a captured reference is compared with.
#[derive(Debug, Clone)]
pub enum CapturedTarget {
    /// The ONNX file of the same model instance, run by a runtime.
    Onnx {
        /// The file.
        path: PathBuf,
        /// The runtime that runs it.
        runtime: RuntimeSpec,
        /// ONNX Runtime library to load (`None`: search).
        /// What was done to the file before the runtime ran it (`converted to float16 by …`),
        /// added to the target's description.
        note: Option<String>,
    },
    /// The framework again, computing differently: each layer's value, and its local re-run,
    /// handed over beside the reference's ([`CapturedRun::add`]).
    Pushed {
        /// What it is, for the report.
        info: SideInfo,
        /// How it computes each layer.
        computing: Computing,
        /// Layers it has no counterpart of (another framework's model paired layer by
        /// layer), with why: not compared.
        unpaired: Vec<(usize, String)>,
    },
}

/// A captured-reference comparison under way: layers go in as PyTorch produces them, segments
/// run as soon as their layers are in, and [`CapturedRun::finish`] builds the report.
pub struct CapturedRun {
    listed: Vec<ListedLayer>,
    /// Whether each layer is compared (so its value is kept when handed over).
    compared: Vec<bool>,
    /// The dtype the target holds each compared layer's value in, where it says.
    held: Vec<Option<DType>>,
    engine: Engine<PushedSide, Box<dyn Side>, PushedSide>,
    /// Each layer whose cause needs weights, with the layers computing inside it (after
    /// [`CapturedRun::conclude`]).
    evidence_groups: Vec<Vec<usize>>,
    /// The layers whose parameters are held for [`CapturedRun::layer_evidence`].
    held_for_evidence: std::collections::HashSet<usize>,
}

impl CapturedRun {
    /// Maps the layers to the target's values (ONNX values, or the same layers of a pushed
    /// target), plans the segments and starts the target.
    pub fn start(c: CapturedComparison, mut clock: Stopwatch) -> Result<Self> {
        if let CapturedTarget::Onnx { runtime, .. } = &c.target {
            let target = TargetSpec::Onnx(runtime.clone().into());
            check_options(&TorchSpec::default(), &target)?;
        }
        for (i, layer) in c.layers.iter().enumerate() {
            if layer.call.input_from.is_some_and(|p| p >= i) {
                return Err(Error::Layers(format!(
                    "layer `{}` reads from a later layer",
                    layer.call.name
                )));
            }
        }
        let (alignment, target, held): align::Target = match &c.target {
            CapturedTarget::Onnx {
                path,
                runtime,
                note,
            } => onnx_target(&c, path, runtime, note.as_deref(), &mut clock)?,
            CapturedTarget::Pushed {
                info,
                computing,
                unpaired,
            } => (
                same_layers(&c.layers, unpaired),
                Box::new(
                    PushedSide::new(
                        info.clone(),
                        c.layers
                            .iter()
                            .map(|l| (l.call.name.clone(), l.call.dtype, l.call.bytes())),
                    )
                    .computing(computing.clone()),
                ),
                vec![None; c.layers.len()],
            ),
        };
        let compared = alignment.target.iter().map(Option::is_some).collect();
        let reference = PushedSide::new(
            c.reference.clone(),
            c.layers
                .iter()
                .map(|l| (l.call.name.clone(), l.call.dtype, l.call.bytes())),
        );
        // PyTorch's float64 run, held beside each layer's value until compared.
        let truth = c.settings.truth().then(|| {
            let float64 = |l: &ListedLayer| l.call.shape.iter().product::<usize>() as u64 * 8;
            PushedSide::new(
                SideInfo::new(
                    c.reference.runtime.clone(),
                    format!("float64 copy of the model; {}", c.reference.detail),
                ),
                c.layers
                    .iter()
                    .map(|l| (l.call.name.clone(), DType::F64, float64(l))),
            )
        });
        // The baseline of each layer, computed by the framework and handed over.
        let baseline = c.settings.baseline().then(|| {
            Box::new(HandedBaseline::new(c.layers.iter().map(|l| {
                let bytes = l.call.shape.iter().product::<usize>() as u64 * 8;
                (l.call.name.clone(), bytes)
            }))) as Box<dyn Baseline>
        });
        let header = Header {
            command: c.command,
            model: c.model,
            seed: c.seed,
        };
        let engine = Engine::new(EngineParts {
            header,
            alignment,
            reference,
            target,
            truth,
            baseline,
            inputs: c.inputs,
            settings: c.settings,
            clock,
        })?;
        let mut run = Self {
            listed: c.layers,
            compared,
            held,
            engine,
            evidence_groups: Vec::new(),
            held_for_evidence: std::collections::HashSet::new(),
        };
        run.engine
            .clock
            .lap("mapping layers and planning the run", OWN);
        run.engine.run_target_ahead()?;
        Ok(run)
    }

    /// How the run is split.
    pub fn segmentation(&self) -> Segmentation {
        self.engine.segmentation()
    }

    /// The float64 copy computing the truth stopped (`why`): the summary warns that the
    /// layers after it are judged without it.
    pub fn truth_lost(&mut self, why: String) {
        self.engine.truth_stopped(why);
    }

    /// The float64 copy computing the layers' same-precision baseline stopped (`why`): the
    /// layers after it have none and say why.
    pub fn baseline_lost(&mut self, why: String) {
        if let Some(baseline) = self
            .engine
            .baseline
            .as_mut()
            .and_then(|b| b.as_any_mut().downcast_mut::<HandedBaseline>())
        {
            baseline.lose(why);
        }
    }

    /// For each layer: whether it is compared, and the dtype the target holds its value in
    /// where the target says (an ONNX file's declared or inferred element type): what a
    /// framework computing the baseline rounds each compared layer's value to.
    pub fn compared_dtypes(&self) -> Vec<(bool, Option<DType>)> {
        self.compared
            .iter()
            .copied()
            .zip(self.held.iter().copied())
            .collect()
    }

    /// Takes layer `index`'s value (and its value in the float64 run; for a pushed target, its
    /// value and local re-run there), copying what is needed later, then runs every segment
    /// whose layers are now all in. Layers come in order.
    pub fn add(&mut self, index: usize, layer: Handed<'_>) -> Result<()> {
        self.engine.clock.lap(CAPTURE_PHASE, "pytorch");
        let listed = self.listed.get(index).ok_or_else(|| {
            Error::Layers(format!(
                "the model made more leaf-module calls this time than the {} listed: \
                 it does not run the same way twice",
                self.listed.len()
            ))
        })?;
        let received = self.engine.reference.received();
        if index != received {
            return Err(Error::Layers(format!(
                "layer {index} (`{}`) handed over out of order: expected layer {received}",
                listed.call.name
            )));
        }
        let value = layer.value;
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
        let keep = self.compared[index];
        let engine = &mut self.engine;
        engine
            .reference
            .push(index, keep.then(|| value.to_tensor()));
        if let Some(truth) = engine.truth.as_mut() {
            truth.push(index, layer.float64.filter(|_| keep).map(|t| t.to_tensor()));
        }
        if let Some(baseline) = engine
            .baseline
            .as_mut()
            .and_then(|b| b.as_any_mut().downcast_mut::<HandedBaseline>())
        {
            let exact = layer.baseline.filter(|_| keep).map(|t| t.to_tensor());
            baseline.push(index, &listed.call.name, exact, layer.baseline_grid);
            if let Some(reduction) = layer.reduction.filter(|_| keep) {
                let terms = crate::engine::baseline::Terms {
                    count: reduction.terms,
                    rss: reduction.rss.to_tensor(),
                    each: reduction.each.map(|t| t.to_tensor()),
                };
                baseline.push_reduction(&listed.call.name, terms);
            }
        }
        if let Some(target) = engine.target.receiver() {
            let Some(value) = layer.target else {
                if !keep {
                    target.push(index, None); // a layer the target has no counterpart of
                    engine.clock.lap("handing layers to the core", OWN);
                    return engine.advance();
                }
                return Err(Error::Layers(format!(
                    "layer `{}` came without the target's value",
                    listed.call.name
                )));
            };
            target.push(index, keep.then(|| value.to_tensor()));
            if let Some(local) = layer.local {
                target.push_local(index, local.map(|t| t.to_tensor()), layer.disagreement);
            }
            if !layer.arguments.is_empty() {
                target.push_arguments(index, layer.arguments);
            }
            if let Some(exact) = layer.own_exact.filter(|_| keep) {
                target.push_own(
                    index,
                    crate::Own {
                        exact: exact.to_tensor(),
                        ideal: layer.own_ideal.map(|t| t.to_tensor()),
                        grid: layer.quantization,
                        why: layer.own_why,
                        slack: layer.own_slack.map(|t| t.to_tensor()),
                    },
                );
            }
        }
        engine.clock.lap("handing layers to the core", OWN);
        engine.advance()
    }

    /// After the forward pass: runs what is left, decides the drift origin, and returns the
    /// layers whose cause needs a look at PyTorch's parameters (ask [`CapturedRun::finish`]
    /// with theirs).
    pub fn conclude(&mut self) -> Result<Vec<usize>> {
        self.engine.clock.lap(CAPTURE_PHASE, "pytorch");
        let received = self.engine.reference.received();
        // a signal stopped the forward pass: the engine stops before the layers not received
        if received != self.listed.len() && crate::interrupt::requested().is_none() {
            return Err(Error::Layers(format!(
                "the model made {received} leaf-module calls this time and {} when the layers \
                 were listed: it does not run the same way twice",
                self.listed.len()
            )));
        }
        let wanted = self.engine.conclude()?;
        // A layer with no counterpart computes inside the next compared layer it feeds (a
        // fusion, an optimizer's work): its parameters are that layer's weights too.
        let mut needed = wanted.clone();
        self.evidence_groups.clear();
        for &i in &wanted {
            let mut absorbed = Vec::new();
            let mut from = self.listed[i].call.input_from;
            while let Some(j) = from.filter(|&j| !self.compared[j]) {
                absorbed.push(j);
                from = self.listed[j].call.input_from;
            }
            needed.extend(&absorbed);
            self.evidence_groups
                .push(std::iter::once(i).chain(absorbed.iter().copied()).collect());
            self.engine.reference.absorb(i, absorbed);
        }
        needed.sort_unstable();
        needed.dedup();
        Ok(needed)
    }

    /// Reads the weights of every compared layer against the model's parameters, not only a
    /// drifting layer's (before [`CapturedRun::conclude`]): a file the user gives may hold an
    /// edit no layer's value shows (see [`Engine::read_every_weight`]).
    pub fn read_every_weight(&mut self) {
        self.engine.read_every_weight();
    }

    /// Whether a layer's target computes what its file says where that is not the model's
    /// computation (`file_differs`, after [`CapturedRun::conclude`]): then a fresh export of the
    /// model set [`CapturedRun::beside`] the file names what differs.
    pub fn file_differs(&self) -> bool {
        self.engine.computes_as_written()
    }

    /// Sets a fresh ONNX export of the model (`path`) beside the target's file: each node of
    /// a layer the file computes differently is compared with the export's node of the same
    /// name, its attributes and constants (before [`CapturedRun::finish`]).
    pub fn beside(&mut self, path: &std::path::Path) -> Result<()> {
        let export = Model::load(path)?;
        self.engine.reference.beside(export);
        Ok(())
    }
}

/// One layer's values as a framework hands them over.
pub struct Handed<'a> {
    /// The reference's value.
    pub value: TensorView<'a>,
    /// Its value in the float64 run.
    pub float64: Option<TensorView<'a>>,
    /// The target's value, when the target is handed over too.
    pub target: Option<TensorView<'a>>,
    /// The target's module run on the reference's inputs, or why it could not be.
    pub local: Option<std::result::Result<TensorView<'a>, String>>,
    /// How far a second such run disagreed with the first (max abs diff), when made.
    pub disagreement: Option<f64>,
    /// The layer computed in float64 by the reference's own module on its inputs rounded to
    /// the target's dtype (its same-precision baseline), when measured.
    pub baseline: Option<TensorView<'a>>,
    /// The dtype the target computed the layer in, where its value's dtype does not say
    /// (float16 gradients unscaled to float32, a Linear's weight gradient under autocast).
    pub baseline_grid: Option<DType>,
    /// The baseline's reduction, measured exactly on the same inputs (for the ideal kernel
    /// that accumulates in the narrow dtype).
    pub reduction: Option<layerdiff_core::Reduction<'a>>,
    /// For a target that runs its model whole: the layer computed exactly on the target's own
    /// inputs with the reference's weights (see [`crate::Own`]).
    pub own_exact: Option<TensorView<'a>>,
    /// The same with the weights the target stores, before rounding.
    pub own_ideal: Option<TensorView<'a>>,
    /// Why there is no `own_ideal`.
    pub own_why: Option<String>,
    /// How far the ideal may move per element by what it cannot model (see [`crate::Own`]).
    pub own_slack: Option<TensorView<'a>>,
    /// The grid the target quantizes the layer's value to, where it does.
    pub quantization: Option<layerdiff_core::Quantization>,
    /// A functional call's numbers and flags the target's own code passes otherwise than the
    /// reference's, in words (`` `eps` 1e-05 → 0.5 ``): its local re-run took the target's.
    pub arguments: Vec<String>,
}
