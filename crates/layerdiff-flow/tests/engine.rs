//! The engine on its own, with an in-memory side: a chain of elementwise layers `v0 … vN`
//! (`v[i] = op[i](v[i-1])`, from the input `x`). It is also the smallest example of a new
//! side: one module implementing `Side` (and `Recompute`, to re-run a layer on given values).
//!
//! The golden report (`tests/golden/chain.*`: JSON, Markdown, HTML and the chart) is rewritten
//! by `make golden`.

use std::sync::atomic::{AtomicUsize, Ordering};

use layerdiff_core::{
    DType, Evidence, Layer, Machine, Report, SideInfo, Summary, Tensor, Tolerance, render,
};
use layerdiff_flow::timings::Stopwatch;
use layerdiff_flow::{
    Alignment, Baseline, Engine, Error, Group, HandedBaseline, Header, Member, Part, PlanSide,
    PushedSide, Recompute, Settings, Shared, Side, Values, WeightCheckFn,
};

/// Elements in every value.
const N: usize = 256;

/// One layer's op, applied elementwise; `call` counts the runs of the side (for an op that
/// does not agree with itself).
type Op = fn(f32, usize, usize) -> f32;

/// A side computing a chain of elementwise layers.
struct Chain {
    ops: Vec<Op>,
    values: Values,
    runs: AtomicUsize,
}

impl Chain {
    fn new(ops: Vec<Op>) -> Self {
        Self {
            ops,
            values: Values::new(vec![("x".to_string(), input())]),
            runs: AtomicUsize::new(0),
        }
    }

    fn layer(name: &str) -> usize {
        name.trim_start_matches('v')
            .parse()
            .expect("a value of the chain")
    }

    /// `v[layer]` from `v[layer-1]`.
    fn apply(&self, layer: usize, from: &Tensor) -> Tensor {
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
        PlanSide { graph: None, sizes }
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
        Ok(self.apply(group.members[0], &feed(&group.inputs[0])?))
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
        }]
    }

    fn group_evidence(
        &self,
        group: &Group,
        _reference: Option<DType>,
        evidence: &mut Evidence,
        _fed: &dyn Fn(&str) -> Option<(DType, DType)>,
        _check: &WeightCheckFn<'_>,
    ) {
        evidence.ops = vec![format!("op{}", group.members[0])];
    }
}

fn input() -> Tensor {
    let values: Vec<f32> = (0..N)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    tensor(&values)
}

fn tensor(values: &[f32]) -> Tensor {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::new("v", DType::F32, vec![values.len()], bytes).expect("sized")
}

fn floats(t: &Tensor) -> Vec<f32> {
    t.bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

fn honest() -> Vec<Op> {
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
fn exact(layer: usize, v: f64) -> f64 {
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
fn baseline(layers: usize) -> Baseline {
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
    Baseline::Handed(Box::new(handed))
}

/// Every layer paired by name; `unpaired` layers are not compared.
fn alignment(layers: usize, unpaired: &[usize]) -> Alignment {
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

fn settings(max_memory: u64) -> Settings {
    Settings {
        tolerance: Tolerance::Fixed(1e-4),
        local: true,
        max_memory: Some(max_memory),
    }
}

fn header() -> Header {
    Header {
        command: "chain".to_string(),
        model: "chain".to_string(),
        seed: Some(0),
    }
}

/// The report of `target` against the honest chain.
fn run(
    target: Vec<Op>,
    unpaired: &[usize],
    max_memory: u64,
) -> layerdiff_flow::Result<(Report, usize)> {
    let layers = target.len();
    let mut engine: Engine<Chain, Chain> = Engine::new(
        header(),
        alignment(layers, unpaired),
        Chain::new(honest()),
        Chain::new(target),
        None,
        Some(baseline(layers)),
        vec![("x".to_string(), input())],
        settings(max_memory),
        Stopwatch::default(),
    )?;
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
fn drifting() -> Vec<Op> {
    let mut ops = honest();
    ops[2] = |v, _, _| v * v * 1.01;
    ops
}

const WHOLE: u64 = 1 << 30;

#[test]
fn the_origin_is_the_layer_that_adds_error_and_the_layers_after_it_inherit() {
    let (report, _) = run(drifting(), &[], WHOLE).unwrap();
    let s = &report.summary;
    assert_eq!(s.drift_origin.as_deref(), Some("v2"));
    assert_eq!(s.first_exceeding.as_deref(), Some("v2"));
    assert_eq!(s.verdict, layerdiff_core::Verdict::Defect);
    assert_eq!(s.defects.len(), 1);
    assert_eq!(
        (s.defects[0].layer.as_str(), s.defects[0].cause.as_str()),
        ("v2", "op_implementation")
    );
    let multiple = layer_multiple(&report, "v2");
    assert!(
        multiple > 100.0,
        "1% of v² is far beyond float32 rounding: {multiple}"
    );
    assert!(
        layer_multiple(&report, "v1") <= 1.0,
        "the honest layers are precision"
    );
    let layer = |n: &str| report.layers.iter().find(|l| l.name == n).unwrap();
    assert!(!layer("v1").exceeds_tol && !layer("v1").local_exceeds);
    assert!(layer("v2").local_exceeds, "its own error");
    for later in ["v3", "v4", "v5"] {
        let l = layer(later);
        if l.exceeds_tol {
            assert_eq!(
                l.cause.as_deref(),
                Some("inherited"),
                "{later}: {:?}",
                l.detail
            );
            assert!(!l.local_exceeds, "{later} adds nothing of its own");
        }
    }
    assert!(layer("v5").exceeds_tol, "the error reaches the end");
}

/// A layer's own error as a multiple of what float32 explains.
fn layer_multiple(report: &Report, name: &str) -> f64 {
    let layer = report.layers.iter().find(|l| l.name == name).unwrap();
    layer.baseline.as_ref().expect("measured").multiple
}

#[test]
fn segments_change_nothing_in_the_report() {
    let (whole, one) = run(drifting(), &[], WHOLE).unwrap();
    let (split, many) = run(drifting(), &[], 3 * N as u64 * 4).unwrap();
    assert_eq!(one, 1);
    assert!(many > 2, "the budget splits the run ({many} segments)");
    assert_eq!(render::to_json(&whole), render::to_json(&split));
}

#[test]
fn a_side_that_disagrees_with_itself_is_nondeterminism() {
    let mut ops = honest();
    // Layer 1 depends on the run: its result changes each time it is computed.
    ops[1] = |v, i, run| v / (1.0 + v.abs()) + if i == 3 { 1e-2 * run as f32 } else { 0.0 };
    let (report, _) = run(ops, &[], WHOLE).unwrap();
    let origin = report.summary.drift_origin.clone().unwrap();
    let layer = report.layers.iter().find(|l| l.name == origin).unwrap();
    assert_eq!(origin, "v1");
    assert_eq!(
        layer.cause.as_deref(),
        Some("nondeterminism"),
        "{:?}",
        layer.detail
    );
}

#[test]
fn a_layer_without_a_counterpart_is_reported_with_its_reason_and_the_rest_compared() {
    let (report, _) = run(drifting(), &[0], WHOLE).unwrap();
    let v0 = &report.layers[0];
    assert_eq!(v0.reason.as_deref(), Some("not in the target"));
    assert!(v0.accumulated.is_none());
    assert_eq!(report.summary.layers_compared, 5);
    assert_eq!(report.summary.drift_origin.as_deref(), Some("v2"));
    assert!(
        report.layers[1].local_reason.is_some(),
        "v1's input has no counterpart, so v1 cannot be re-run alone"
    );
}

#[test]
fn nothing_compared_is_an_error_that_says_how_layers_are_paired() {
    let Err(Error::NothingCompared(message)) = run(honest(), &[0, 1, 2, 3, 4, 5], WHOLE) else {
        panic!("a run that compares nothing has no verdict");
    };
    assert!(message.ends_with("hint: pair something"), "{message}");
}

/// A reference handed over layer by layer: segments run only once their layers are in.
#[test]
fn a_pushed_reference_runs_each_segment_once_its_layers_are_in() {
    let layers = 6;
    let listed = (0..layers).map(|i| (format!("v{i}"), DType::F32, (N * 4) as u64));
    let reference = PushedSide::new(SideInfo::new("pushed", "test"), listed);
    let mut engine: Engine<PushedSide, Chain> = Engine::new(
        header(),
        alignment(layers, &[]),
        reference,
        Chain::new(drifting()),
        None,
        None,
        vec![("x".to_string(), input())],
        settings(3 * N as u64 * 4),
        Stopwatch::default(),
    )
    .unwrap();
    assert!(engine.segmentation().segments > 2);
    let honest_chain = Chain::new(honest());
    let mut value = input();
    for i in 0..layers {
        engine.advance().unwrap();
        value = honest_chain.apply(i, &value);
        engine.reference.push(i, Some(value.clone()));
    }
    engine.advance().unwrap();
    engine.conclude().unwrap();
    let report = engine.finish().unwrap();
    assert_eq!(report.summary.drift_origin.as_deref(), Some("v2"));
    assert_eq!(report.reference.runtime, "pushed");
}

#[test]
fn the_golden_report_of_the_drifting_chain() {
    let (report, _) = run(drifting(), &[], WHOLE).unwrap();
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    for (file, text) in [
        ("chain.json", render::to_json(&report)),
        ("chain.md", render::to_markdown(&report)),
        ("chain.html", render::to_html(&report)),
        ("chain.svg", render::to_svg(&report, false)),
    ] {
        let path = golden.join(file);
        if std::env::var_os("LAYERDIFF_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let expected = std::fs::read_to_string(&path).expect("make golden writes it");
        assert_eq!(
            text, expected,
            "{file} changed: if on purpose, run `make golden`"
        );
    }
}
