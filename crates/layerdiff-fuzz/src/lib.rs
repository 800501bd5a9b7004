//! The bodies of layerdiff's fuzz targets: each takes any bytes and must return, whatever they
//! hold, without a panic, an abort, a hang or an allocation the input's size does not justify
//! (errors are fine: they are what a hostile file should get). `fuzz/` runs them under
//! libFuzzer (`make fuzz`); `tests/corpus.rs` replays their corpus and every crasher found,
//! in seconds, in `make test`. docs/robustness.md says what ran for how long and found what.

use std::io::Cursor;
use std::path::Path;

use layerdiff_core::{Bound, DType, Judge, TensorView, compare_pair};
use layerdiff_onnx::{
    GraphIndex, Model, expose_values, extract_nodes, local_group, parse_tensor_pb, to_float64,
    to_float64_lazy,
};

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// The targets, by the name of their folder under `fuzz/corpus/`.
pub const TARGETS: [(&str, Target); 3] = [
    ("onnx_model", onnx_model),
    ("inputs", inputs),
    ("comparison", comparison),
];

/// An ONNX model file through what a run does to it: decoded, indexed, every value exposed,
/// cut in two segments, each value's local group found, widened to float64 and rounded to
/// float16, its initializers read, and written back.
pub fn onnx_model(data: &[u8]) {
    let Ok(model) = Model::from_bytes(data, Path::new("fuzz.onnx"), None) else {
        return;
    };
    let index = GraphIndex::new(model.graph());
    let values: Vec<String> = model
        .graph()
        .node
        .iter()
        .flat_map(|n| n.output.iter().filter(|o| !o.is_empty()).cloned())
        .collect();
    let mut exposed = model.clone();
    if expose_values(&mut exposed, &values).is_ok() {
        let _ = exposed.to_bytes();
    }
    let nodes = model.graph().node.len();
    let halves = [
        (0..nodes / 2).collect::<Vec<_>>(),
        (nodes / 2..nodes).collect(),
    ];
    for half in &halves {
        if let Ok(segment) = extract_nodes(&model, half, &[], &[]) {
            let _ = segment.to_bytes();
        }
    }
    for value in values.iter().take(64) {
        let _ = local_group(&index, value, &|_| true);
    }
    for initializer in model.graph().initializer.iter().take(64) {
        if let Some(Ok(stored)) = model.stored(initializer.name()) {
            let _ = stored.view().numel();
        }
    }
    if let Ok(wide) = to_float64(&model) {
        let _ = wide.to_bytes();
    }
    // weights rounded to a narrower grid as a node's run widens them
    if let Ok(lazy) = to_float64_lazy(&model, Some(DType::F16)) {
        let _ = to_float64(&lazy);
    }
}

/// A file of inputs: its first byte picks the reader (safetensors, npz, an ONNX test data
/// `.pb`), the rest is the file.
pub fn inputs(data: &[u8]) {
    let Some((&kind, file)) = data.split_first() else {
        return;
    };
    let path = Path::new("fuzz-inputs");
    match kind % 3 {
        0 => drop(layerdiff_core::parse_safetensors(file, path)),
        1 => drop(layerdiff_core::parse_npz(Cursor::new(file), path)),
        _ => drop(parse_tensor_pb(file, path)),
    }
}

/// Two tensors compared as a run compares a layer: the first bytes pick each side's dtype and
/// shape and the judge's grid and bound; the rest is split between the sides' elements.
pub fn comparison(data: &[u8]) {
    let [rd, td, rank, grid, bound, rest @ ..] = data else {
        return;
    };
    let dtype = |b: u8| DType::ALL[usize::from(b) % DType::ALL.len()];
    let (rd, td) = (dtype(*rd), dtype(*td));
    let half = rest.len() / 2;
    let (r, t) = rest.split_at(half);
    let (rn, tn) = (r.len() / rd.size(), t.len() / td.size());
    // the target's shape: the reference's, or another count (a shape mismatch), or split in two
    let (r_shape, t_shape) = match rank % 3 {
        0 => (vec![rn], vec![tn]),
        1 => (vec![rn], vec![rn.min(tn)]),
        _ => (vec![1, rn], vec![rn.min(tn), 1]),
    };
    let (r_bytes, t_bytes) = (
        &r[..shape_len(&r_shape) * rd.size()],
        &t[..shape_len(&t_shape) * td.size()],
    );
    let (Ok(reference), Ok(target)) = (
        TensorView::new("r", rd, &r_shape, r_bytes),
        TensorView::new("t", td, &t_shape, t_bytes),
    ) else {
        return;
    };
    let judge = (grid & 1 == 1).then(|| Judge {
        grid: dtype(grid >> 1),
        bound: Bound {
            atol: [0.0, 1e-6, 1e-3, 1.0][usize::from(bound & 3)],
            rtol: [0.0, 1e-5, 1e-2, 0.5][usize::from((bound >> 2) & 3)],
        },
    });
    let _ = compare_pair(reference, target, judge);
}

fn shape_len(shape: &[usize]) -> usize {
    shape.iter().product()
}
