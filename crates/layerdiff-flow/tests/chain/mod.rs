//! The in-memory side the engine's tests run on: a chain of elementwise layers `v0 … vN`
//! (`v[i] = op[i](v[i-1])`, from the input `x`). It is also the smallest example of a new
//! side: one module implementing `Side` (and `Recompute`, to re-run a layer on given values).
#![allow(dead_code)] // each test binary uses its part of it

use std::sync::atomic::{AtomicUsize, Ordering};

use layerdiff_core::{
    DType, Evidence, Layer, Machine, Report, SideInfo, Summary, Tensor, Tolerance,
};
use layerdiff_flow::timings::Stopwatch;
use layerdiff_flow::{
    Alignment, Baseline, Engine, EngineParts, Float64, Group, HandedBaseline, Header, Member, Part,
    PlanSide, Recompute, Settings, Shared, Side, Values, WeightCheckFn,
};

/// Elements in every value.
pub const N: usize = 256;

/// The smallest budget the drifting chain keeps (with its baseline): one layer a segment.
pub const FINE: u64 = 12 * N as u64 * 4;

/// One layer's op, applied elementwise; `call` counts the runs of the side (for an op that
/// does not agree with itself).
pub type Op = fn(f32, usize, usize) -> f32;

/// A side computing a chain of elementwise layers.
pub struct Chain {
    pub ops: Vec<Op>,
    values: Values,
    runs: AtomicUsize,
    /// The math its runtime says it does in lower precision (`None`: as written).
    pub reduced: Option<layerdiff_runtime::ReducedMath>,
    /// Whether a layer re-run alone computes as in the side's run (`Recompute::reruns_as_run`).
    pub same_alone: bool,
    /// Local re-runs made (`Recompute::run_group` calls), shared with the test that asks.
    pub reruns: std::sync::Arc<AtomicUsize>,
}

impl Chain {
    pub fn new(ops: Vec<Op>) -> Self {
        Self {
            ops,
            values: Values::new(vec![("x".to_string(), input())]),
            runs: AtomicUsize::new(0),
            reduced: None,
            same_alone: false,
            reruns: Default::default(),
        }
    }

    fn layer(name: &str) -> usize {
        name.trim_start_matches('v')
            .parse()
            .expect("a value of the chain")
    }

    /// `v[layer]` from `v[layer-1]`.
    pub fn apply(&self, layer: usize, from: &Tensor) -> Tensor {
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let out: Vec<f32> = floats(from)
            .iter()
            .enumerate()
            .map(|(i, &v)| (self.ops[layer])(v, i, run))
            .collect();
        tensor(&out)
    }

    fn before(layer: usize) -> String {
        if layer == 0 {
            "x".to_string()
        } else {
            format!("v{}", layer - 1)
        }
    }
}

impl Side for Chain {
    fn describe(&mut self, _summary: &mut Summary) -> SideInfo {
        SideInfo::new("chain", "elementwise layers in memory")
    }

    fn plan_view(&self) -> PlanSide<'_> {
        let sizes = (0..self.ops.len())
            .map(|i| (format!("v{i}"), (N * 4) as u64))
            .collect();
        PlanSide {
            graph: None,
            sizes,
            weights: 0,
            step_weights: Vec::new(),
        }
    }

    fn produce(
        &mut self,
        part: &Part,
        _: bool,
        _: &mut Stopwatch,
        _: &str,
    ) -> layerdiff_flow::Result<()> {
        for name in &part.outputs {
            let value = self.compute(name);
            self.values.insert(name.clone(), value);
        }
        Ok(())
    }

    fn get(&self, value: &str) -> Option<&Tensor> {
        self.values.get(value)
    }

    fn dtype(&self, value: &str) -> Option<DType> {
        self.values.dtype(value)
    }

    fn free(&mut self, values: &[String]) {
        self.values.free(values);
    }

    fn again(&self, part: &Part, keep: &[String]) -> Option<[Vec<(String, Tensor)>; 2]> {
        let run = || {
            part.outputs
                .iter()
                .filter(|name| keep.contains(name))
                .map(|name| (name.clone(), self.compute(name)))
                .collect()
        };
        Some([run(), run()])
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        Some(self)
    }

    fn reduced_math(&self) -> Option<layerdiff_runtime::ReducedMath> {
        self.reduced.clone()
    }
}

impl Chain {
    /// The value `name` from the one before it, held or (for a segment whose input was already
    /// dropped: the chain's planner view has no graph, so segments hand no values over)
    /// computed again from the input.
    fn compute(&self, name: &str) -> Tensor {
        let layer = Self::layer(name);
        let from = self
            .values
            .get(&Self::before(layer))
            .cloned()
            .unwrap_or_else(|| {
                let mut value = input();
                for l in 0..layer {
                    value = self.apply(l, &value);
                }
                value
            });
        self.apply(layer, &from)
    }
}

impl Recompute for Chain {
    fn local_group(&self, value: &str, known: &dyn Fn(&str) -> bool) -> Result<Group, String> {
        let layer = Self::layer(value);
        let input = Self::before(layer);
        if !known(&input) {
            return Err(format!("`{input}` is not known on both sides"));
        }
        Ok(Group {
            members: vec![layer],
            inputs: vec![input],
        })
    }

    fn run_group(
        &self,
        group: &Group,
        _value: &str,
        feed: &dyn Fn(&str) -> Result<Tensor, String>,
    ) -> Result<Tensor, String> {
        self.reruns.fetch_add(1, Ordering::Relaxed);
        Ok(self.apply(group.members[0], &feed(&group.inputs[0])?))
    }

    fn reruns_as_run(&self) -> bool {
        self.same_alone
    }

    fn take_time(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    fn members(&self, group: &Group) -> Vec<Member> {
        let op = format!("op{}", group.members[0]);
        vec![Member {
            name: Some(op.clone()),
            shown: op.clone(),
            op,
            attributes: Vec::new(),
            tensors: Vec::new(),
        }]
    }

    fn group_evidence(
        &self,
        group: &Group,
        _value: &str,
        _reference: Option<DType>,
        evidence: &mut Evidence,
        _fed: &dyn Fn(&str) -> Option<(DType, DType)>,
        _check: &WeightCheckFn<'_>,
    ) {
        evidence.ops = vec![format!("op{}", group.members[0])];
    }
}

pub fn input() -> Tensor {
    let values: Vec<f32> = (0..N)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    tensor(&values)
}

pub fn tensor(values: &[f32]) -> Tensor {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::new("v", DType::F32, vec![values.len()], bytes).expect("sized")
}

pub fn floats(t: &Tensor) -> Vec<f32> {
    t.bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

pub fn honest() -> Vec<Op> {
    vec![
        |v, _, _| v * 1.5 + 0.25,
        |v, _, _| v / (1.0 + v.abs()),
        |v, _, _| v * v,
        |v, _, _| v - 0.5,
        |v, _, _| v.max(0.0),
        |v, _, _| v * 2.0,
    ]
}

/// The honest ops in float64: the exact values an ideal float32 implementation rounds.
pub fn exact(layer: usize, v: f64) -> f64 {
    match layer {
        0 => v * 1.5 + 0.25,
        1 => v / (1.0 + v.abs()),
        2 => v * v,
        3 => v - 0.5,
        4 => v.max(0.0),
        _ => v * 2.0,
    }
}

/// Each layer's same-precision baseline, as a framework would hand it over: the honest op in
/// float64 on the reference's (the honest chain's) value of its input.
pub fn baseline(layers: usize) -> Box<dyn Baseline> {
    let mut handed = HandedBaseline::new((0..layers).map(|i| (format!("v{i}"), (N * 8) as u64)));
    let honest_chain = Chain::new(honest());
    let mut value = input();
    for i in 0..layers {
        let wide: Vec<f64> = floats(&value)
            .iter()
            .map(|&v| exact(i, f64::from(v)))
            .collect();
        let name = format!("v{i}");
        handed.push(i, &name, Some(Tensor::from_f64(DType::F64, &wide)), None);
        value = honest_chain.apply(i, &value);
    }
    Box::new(handed)
}

/// Every layer paired by name; `unpaired` layers are not compared.
pub fn alignment(layers: usize, unpaired: &[usize]) -> Alignment {
    let names: Vec<String> = (0..layers).map(|i| format!("v{i}")).collect();
    Alignment {
        layers: names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut layer = Layer::new(i, n.clone(), vec![N], "float32");
                if unpaired.contains(&i) {
                    layer.reason = Some("not in the target".to_string());
                }
                layer
            })
            .collect(),
        target: names
            .iter()
            .enumerate()
            .map(|(i, n)| (!unpaired.contains(&i)).then(|| n.clone()))
            .collect(),
        reference: names,
        refutable: vec![false; layers],
        inconclusive: None,
        nothing_compared_hint: "pair something".to_string(),
        shared: Shared::FirstLayerOwns,
    }
}

pub fn settings(max_memory: u64) -> Settings {
    Settings::new(
        Tolerance::Fixed(1e-4),
        true,
        Some(max_memory),
        Float64::Skip,
    )
    .unwrap()
}

pub fn header() -> Header {
    Header {
        command: "chain".to_string(),
        model: "chain".to_string(),
        seed: Some(0),
    }
}

/// The report of `target` against the honest chain.
pub fn run(
    target: Vec<Op>,
    unpaired: &[usize],
    max_memory: u64,
) -> layerdiff_flow::Result<(Report, usize)> {
    run_chain(Chain::new(target), unpaired, max_memory)
}

/// [`run`] with the target side given.
pub fn run_chain(
    target: Chain,
    unpaired: &[usize],
    max_memory: u64,
) -> layerdiff_flow::Result<(Report, usize)> {
    let layers = target.ops.len();
    let mut engine: Engine<Chain, Chain> = Engine::new(EngineParts {
        header: header(),
        alignment: alignment(layers, unpaired),
        reference: Chain::new(honest()),
        target,
        truth: None,
        baseline: Some(baseline(layers)),
        inputs: vec![("x".to_string(), input())],
        settings: settings(max_memory),
        clock: Stopwatch::default(),
    })?;
    let segments = engine.segmentation().segments;
    engine.advance()?;
    let mut report = engine.finish()?;
    report.timings = None;
    report.machine = Machine {
        cpu: "test".to_string(),
        instruction_set: "test".to_string(),
        logical_cores: 1,
        os: "test".to_string(),
        gpus: Vec::new(),
        layerdiff: "test".to_string(),
    };
    Ok((report, segments))
}

/// Layer 2 computes `v²` 1% too large.
pub fn drifting() -> Vec<Op> {
    let mut ops = honest();
    ops[2] = |v, _, _| v * v * 1.01;
    ops
}
