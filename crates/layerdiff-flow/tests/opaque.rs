//! `--opaque` with a CPU stand-in for a target that cannot show its layers: ONNX Runtime's CPU
//! provider, with one node's kernel off by a fraction (a fault planted in the runtime, not the
//! file). The search must find that node, in about log2 of the node count range runs, without
//! ever asking the target for a value that another node of the graph it runs reads (the
//! condition that breaks a compiled engine's fusions), and agree with the per-layer run. Needs
//! the onnxruntime wheel in the repository's .venv (as `make test` sets up); skipped without it.

use std::path::{Path, PathBuf};

mod onnx_runtime;
use onnx_runtime::{library, options};
use std::sync::{Arc, Mutex};

use layerdiff_core::{Report, Tensor, Tolerance};
use layerdiff_flow::onnx::{OnnxOptions, compare_with};
use layerdiff_flow::{Float64, Settings};
use layerdiff_onnx::{
    AttributeProto, GraphIndex, GraphProto, Model, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, tensor_value_info,
};
use layerdiff_runtime::{Runtime, RuntimeSpec};

const NODES: usize = 24;

/// `v0 = x`, then `NODES` nodes: `Mul` by a weight, `Tanh`, alternately; `v{NODES}` is the
/// output.
fn chain(folder: &Path) -> PathBuf {
    let mut nodes = Vec::new();
    let mut initializer = Vec::new();
    for i in 0..NODES {
        let (input, out) = (format!("v{i}"), format!("v{}", i + 1));
        if i % 2 == 0 {
            let w = format!("w{i}");
            initializer.push(TensorProto {
                name: Some(w.clone()),
                dims: vec![1, 64],
                data_type: Some(1),
                float_data: (0..64).map(|k| 0.8 + 0.01 * ((k + i) % 9) as f32).collect(),
                ..Default::default()
            });
            nodes.push(node("Mul", &[&input, &w], &out, i));
        } else {
            nodes.push(node("Tanh", &[&input], &out, i));
        }
    }
    nodes[0].input[0] = "x".into();
    let proto = ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(18),
        }],
        graph: Some(GraphProto {
            name: Some("chain".into()),
            node: nodes,
            initializer,
            input: vec![tensor_value_info("x", 1, &[8, 64])],
            output: vec![tensor_value_info(&format!("v{NODES}"), 1, &[8, 64])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = folder.join("chain.onnx");
    std::fs::write(&path, Model::from_proto(proto, None).to_bytes()).unwrap();
    path
}

fn node(op: &str, inputs: &[&str], out: &str, i: usize) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("n{i}")),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        ..Default::default()
    }
}

/// ONNX Runtime on the CPU, the node named `planted` (where a graph it is given holds it)
/// computing 1% too much; every graph it runs written down as (its node count, the values asked
/// for that a node of the same graph reads).
struct Planted {
    cpu: Box<dyn Runtime + Send + Sync>,
    planted: Option<&'static str>,
    seen: Seen,
}

impl Runtime for Planted {
    fn name(&self) -> &str {
        "planted"
    }
    fn detail(&self) -> String {
        "onnxruntime CPU with one node 1% off".into()
    }
    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> layerdiff_runtime::Result<Vec<(String, Tensor)>> {
        let index = GraphIndex::new(model.graph());
        let read_inside: Vec<String> = outputs
            .iter()
            .filter(|o| index.consumers(o).next().is_some())
            .cloned()
            .collect();
        let count = model.graph().node.len();
        self.seen.lock().unwrap().push((count, read_inside));
        let mut model = model.clone();
        let graph = model.graph_mut();
        if let Some(at) = graph
            .node
            .iter()
            .position(|n| Some(n.name()) == self.planted)
        {
            let out = graph.node[at].output[0].clone();
            let inner = format!("{out}_planted");
            graph.node[at].output[0] = inner.clone();
            graph.initializer.push(TensorProto {
                name: Some("planted_factor".into()),
                data_type: Some(1),
                float_data: vec![1.01],
                ..Default::default()
            });
            let scale = NodeProto {
                op_type: Some("Mul".into()),
                name: Some("planted_scale".into()),
                input: vec![inner, "planted_factor".into()],
                output: vec![out],
                attribute: Vec::<AttributeProto>::new(),
                ..Default::default()
            };
            graph.node.insert(at + 1, scale);
        }
        self.cpu.run(&model, inputs, outputs)
    }
}

type Seen = Arc<Mutex<Vec<(usize, Vec<String>)>>>;

fn report(planted: Option<&'static str>, opaque: bool) -> Option<(Report, Seen)> {
    library()?;
    let seen: Seen = Arc::default();
    let target = Planted {
        cpu: RuntimeSpec::ort_cpu().build().unwrap(),
        planted,
        seen: seen.clone(),
    };
    let folder = tempfile::tempdir().unwrap();
    let options = OnnxOptions {
        opaque,
        ..options(chain(folder.path()))
    };
    let report = compare_with(&options, Box::new(target)).unwrap().report;
    Some((report, seen))
}

#[test]
fn a_kernel_off_at_one_node_is_found_by_halves_without_an_output_added() {
    let Some((report, seen)) = report(Some("n13"), true) else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    let search = report.opaque.as_ref().expect("an opaque search");
    assert_eq!(search.node.as_deref(), Some("n13"), "{search:?}");
    assert_eq!(search.op.as_deref(), Some("Tanh"));
    assert_eq!(search.nodes, NODES);
    // the whole graph, then one range per halving: ceil(log2 24) = 5
    assert_eq!(search.ranges.len(), 1 + 5, "{:?}", search.ranges);
    assert!(search.ranges[0].deviates && search.ranges[0].nodes == NODES);
    let seen = seen.lock().unwrap();
    assert_eq!(search.runs, seen.len(), "every target run is counted");
    for (nodes, read_inside) in seen.iter() {
        assert!(
            read_inside.is_empty(),
            "a graph of {nodes} node(s) was asked for {read_inside:?}, which its own nodes read"
        );
    }
    // the node alone, judged as the per-layer run judges it: the same headline
    assert_eq!(report.summary.drift_origin.as_deref(), Some("v14"));
    assert_eq!(report.summary.defects.len(), 1, "{:?}", report.summary);
    let (per_layer, _) = report_pair(Some("n13"));
    assert_eq!(per_layer.summary.drift_origin.as_deref(), Some("v14"));
    assert!(
        report
            .opaque
            .as_ref()
            .unwrap()
            .sentence()
            .contains("`n13` (Tanh)")
    );
}

fn report_pair(planted: Option<&'static str>) -> (Report, Seen) {
    report(planted, false).unwrap()
}

#[test]
fn a_clean_target_is_one_check_of_its_outputs() {
    let Some((report, seen)) = report(None, true) else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    let search = report.opaque.as_ref().expect("an opaque search");
    assert_eq!(search.ranges.len(), 1, "{:?}", search.ranges);
    assert!(!search.ranges[0].deviates);
    assert_eq!(search.node, None);
    assert!(report.summary.defects.is_empty(), "{:?}", report.summary);
    // only the graph's output is compared, and the target never computes more than it
    assert_eq!(report.layers.len(), 1);
    assert_eq!(report.layers[0].name, format!("v{NODES}"));
    for (nodes, read_inside) in seen.lock().unwrap().iter() {
        assert!(read_inside.is_empty(), "{nodes} node(s): {read_inside:?}");
    }
}

/// ONNX Runtime on the CPU, compiling its graph as OpenVINO does: a graph whose every value is
/// an output computes its last node 1% otherwise (what it would have fused, it keeps).
struct Compiling {
    cpu: Box<dyn Runtime + Send + Sync>,
}

impl Runtime for Compiling {
    fn name(&self) -> &str {
        "compiling"
    }
    fn detail(&self) -> String {
        "onnxruntime CPU, otherwise with every value an output".into()
    }
    fn compiles_graph(&self) -> bool {
        true
    }
    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> layerdiff_runtime::Result<Vec<(String, Tensor)>> {
        let mut values = self.cpu.run(model, inputs, outputs)?;
        if model.graph().output.len() > 1 {
            for (name, value) in &mut values {
                if *name == format!("v{NODES}") {
                    let view = value.view();
                    let moved: Vec<f64> =
                        (0..view.numel()).map(|i| view.get_f64(i) * 1.01).collect();
                    let shape = value.shape.clone();
                    *value = Tensor::from_f64(value.dtype, &moved)
                        .reshaped(&shape)
                        .unwrap();
                }
            }
        }
        Ok(values)
    }
}

#[test]
fn a_target_that_computes_otherwise_once_every_value_is_an_output_is_said_to() {
    let Some(_) = library() else {
        eprintln!("skipped: no onnxruntime wheel in .venv");
        return;
    };
    let folder = tempfile::tempdir().unwrap();
    let run_by = |opaque: bool, tolerance: Tolerance| {
        let target = Compiling {
            cpu: RuntimeSpec::ort_cpu().build().unwrap(),
        };
        let options = OnnxOptions {
            opaque,
            settings: Settings::new(tolerance, true, None, Float64::Truth).unwrap(),
            ..options(chain(folder.path()))
        };
        compare_with(&options, Box::new(target)).unwrap().report
    };
    let run = |opaque: bool| run_by(opaque, Tolerance::PerDtype);
    let per_layer = run(false);
    let warned: Vec<&String> = per_layer
        .summary
        .warnings
        .iter()
        .filter(|w| w.contains("computes other outputs once every value is an output"))
        .collect();
    assert_eq!(warned.len(), 1, "{:?}", per_layer.summary.warnings);
    assert!(
        warned[0].contains(&format!("`v{NODES}` moves by up to")),
        "{}",
        warned[0]
    );
    assert!(
        warned[0].contains("`--opaque` runs the file's graph unmodified"),
        "{}",
        warned[0]
    );
    // judged by the tolerance the run was given: a 1% move within it is said, not alarmed
    let loose = run_by(false, Tolerance::Fixed(1e3));
    let said: Vec<&String> = loose
        .summary
        .warnings
        .iter()
        .filter(|w| w.contains("computes other outputs"))
        .collect();
    assert_eq!(said.len(), 1, "{:?}", loose.summary.warnings);
    assert!(
        said[0].ends_with("the layers compared here are of that graph"),
        "{}",
        said[0]
    );
    // run unmodified, the graph is clean, and nothing is said of a graph it did not run
    let opaque = run(true);
    assert!(opaque.summary.defects.is_empty(), "{:?}", opaque.summary);
    assert!(
        !opaque
            .summary
            .warnings
            .iter()
            .any(|w| w.contains("computes other outputs")),
        "{:?}",
        opaque.summary.warnings
    );
}
