//! What asking for every value does to a target that compiles its graph: the file's graph run
//! as written (its outputs only) and with every value an output, the outputs of the two set
//! side by side. Where they differ, the layers a per-layer run compares are of a graph that
//! does not ship, and the report says by how much.

use layerdiff_core::{Tensor, Tolerance};
use layerdiff_onnx::{Model, expose_values};
use layerdiff_runtime::Runtime;

use super::pieces::judged;

/// The sentence the report carries where `runtime` computes `model`'s outputs otherwise once
/// every value is an output, judged by the run's `tolerance` (per dtype where it takes the
/// float64 truth, which is not made here); `None` where they agree bit for bit, or where
/// either run fails (the comparison itself says why).
pub(super) fn note(
    runtime: &dyn Runtime,
    model: &Model,
    inputs: &[(String, Tensor)],
    tolerance: Tolerance,
) -> Option<String> {
    let graph = model.graph();
    let outputs: Vec<String> = graph.output.iter().map(|o| o.name().to_string()).collect();
    let values: Vec<&str> = graph
        .node
        .iter()
        .flat_map(|n| n.output.iter().map(String::as_str))
        .filter(|v| !v.is_empty())
        .collect();
    let mut exposed = model.clone();
    expose_values(&mut exposed, &values).ok()?;
    let written = runtime.run(model, inputs, &outputs).ok()?;
    let every = runtime.run(&exposed, inputs, &outputs).ok()?;
    // the output that moves most, as a multiple of its tolerance
    let mut worst: Option<(f64, f64, &str)> = None;
    for ((name, a), (_, b)) in written.iter().zip(&every) {
        if a.bytes == b.bytes {
            continue;
        }
        let bound = tolerance.for_layer(a.dtype.name(), None, None);
        let (multiple, diff) = judged(bound, a, b).ok()?;
        if worst.is_none_or(|(m, ..)| multiple > m) {
            worst = Some((multiple, diff, name));
        }
    }
    let (multiple, diff, name) = worst?;
    let what = format!(
        "{} computes other outputs once every value is an output (what no output reads it fuses, \
         what every output reads it must keep): `{name}` moves by up to {diff:.3e}, {multiple:.2}× \
         its tolerance",
        runtime.name()
    );
    Some(if multiple > 1.0 {
        format!(
            "{what}; the layers compared here are of a graph that does not ship: `--opaque` runs \
             the file's graph unmodified"
        )
    } else {
        format!("{what}; the layers compared here are of that graph")
    })
}
