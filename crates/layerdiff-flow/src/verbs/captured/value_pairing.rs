//! Pairing layers with ONNX values by their values, where the file's names say nothing.
//!
//! A file from an exporter that records no module scopes (or one rewritten by a tool that drops
//! them) still computes every layer's output somewhere. The target runs once more with the
//! candidate values exposed, a few at a time, and each keeps only its [`Fingerprint`]. Layers
//! are then paired in three passes, order kept throughout:
//!
//! 1. from the last layer back, each takes the last unused value before its successor's whose
//!    samples look like its own ([`SAME_VALUE`]), so a value that two consecutive layers both
//!    look like (a Conv and the identity BatchNorm folded into it) goes to the later layer, and
//!    no layer takes a value computed from a later layer's (the Conv, the BatchNorm's
//!    quantized copy);
//! 2. each paired layer moves to the first value after its predecessor's that holds the same
//!    numbers as the one it took, so a pooled value is not confused with the flatten after it
//!    (but a Linear is not moved to the MatMul before its bias);
//! 3. in a file with no scope at all, a layer still unpaired takes the most alike value between
//!    its neighbours' values if it is at least loosely alike ([`LOOSELY_ALIKE`]): what a
//!    drifting layer looks like.
//!
//! Every pairing says how it was made in the layer's note. A layer that none of this pairs is
//! left unpaired rather than guessed (a guess would report drift that is not there), and
//! [`unrecognised_from`] says where a file without scopes stopped being recognised.
//!
//! Functional calls that their module's nodes do not pair by position (a [`CallGroup`]) are
//! matched within their group only: each call, in order, takes the first of the group's values
//! after the previous call's whose samples look like its own, strictly.

use layerdiff_core::{Fingerprint, SAME_VALUE, Tensor};
use layerdiff_onnx::{
    CallGroup, GraphIndex, LayerCall, Model, ValueMatch, ValueRequest, expose_values,
};
use layerdiff_runtime::Runtime;

use crate::Result;

/// Likeness from which a layer not recognised strictly may still be paired with the most alike
/// value in its place in the order (see [`layerdiff_core::Fingerprint::likeness`]).
const LOOSELY_ALIKE: f64 = 0.5;

/// How much less alike than the value a layer took another value may be and still count as
/// holding the same numbers (a reshape of it).
const SAME_EXACTLY: f64 = 1e-6;

/// The most values exposed in one extra run when their sizes are not declared.
const VALUES_PER_RUN: usize = 256;

/// Answers a [`ValueRequest`]: one match (or none) per layer of [`ValueRequest::wanted`].
pub fn pair_by_values(
    model: &mut Model,
    runtime: &(dyn Runtime + Send + Sync),
    inputs: &[(String, Tensor)],
    layers: &[LayerCall],
    request: &ValueRequest,
    budget: Option<u64>,
) -> Result<Vec<ValueMatch>> {
    let wanted: Vec<&LayerCall> = request.layers.iter().map(|&i| &layers[i]).collect();
    let index = GraphIndex::new(model.graph());
    // Only values that could be some requested layer's output are worth a look.
    let candidates: Vec<&(String, usize)> = request
        .candidates
        .iter()
        .filter(|(v, _)| wanted.iter().any(|l| l.fits(&index, v)))
        .collect();
    let in_groups: Vec<&String> = request
        .calls
        .iter()
        .flat_map(|g| {
            g.values
                .iter()
                .filter(|v| g.layers.iter().any(|&i| layers[i].fits(&index, v)))
        })
        .collect();
    let names: Vec<String> = candidates
        .iter()
        .map(|(v, _)| v)
        .chain(in_groups)
        .cloned()
        .collect();
    let largest = request
        .wanted()
        .iter()
        .map(|&i| layers[i].bytes())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut prints = fingerprints(model, runtime, inputs, &names, budget, largest)?;
    let in_groups = prints.split_off(candidates.len());
    let seen: Vec<(usize, Fingerprint)> = prints.into_iter().enumerate().collect();
    let in_groups: std::collections::HashMap<&str, Fingerprint> = names[candidates.len()..]
        .iter()
        .map(String::as_str)
        .zip(in_groups)
        .collect();

    // From the last layer back, each takes the last unused look-alike before the value the
    // layer after it took: order is kept, and a value that two consecutive layers both look
    // like (a Conv whose BatchNorm the exporter folded into it, an identity BatchNorm) goes
    // to the later layer, whose output it is.
    // A layer never takes a value computed from a later layer's (paired here or by its scope):
    // the model computes that layer first (a Conv whose identity BatchNorm was folded into it
    // looks like the BatchNorm's quantized copy, which the quantizer computes from the
    // BatchNorm's value).
    let mut used = vec![false; candidates.len()];
    let mut later = Downstream::default();
    let mut scoped = request.scoped.iter().rev().peekable();
    let mut found: Vec<Option<(usize, String)>> = vec![None; wanted.len()];
    let mut before = candidates.len();
    for (w, layer) in wanted.iter().enumerate().rev() {
        while let Some((_, value)) = scoped.next_if(|(i, _)| *i > request.layers[w]) {
            later.add(&index, value);
        }
        let Some(print) = &layer.fingerprint else {
            continue;
        };
        let alike = |&(c, ref f): &(usize, Fingerprint)| {
            let likeness = print.likeness(f);
            (!used[c] && likeness >= SAME_VALUE && !later.holds(&candidates[c].0))
                .then_some((c, likeness))
        };
        let earlier = seen
            .iter()
            .rev()
            .filter(|(c, _)| *c < before)
            .find_map(alike);
        let anywhere = || {
            seen.iter()
                .filter_map(alike)
                .max_by(|a, b| a.1.total_cmp(&b.1))
        };
        if let Some((c, likeness)) = earlier.or_else(anywhere) {
            used[c] = true;
            later.add(&index, &candidates[c].0);
            before = c;
            found[w] = Some((c, strictly(likeness)));
        }
    }
    first_alike(&wanted, &seen, &mut found, &mut used);

    if request.unscoped_file {
        loosely(&wanted, &seen, &mut found, &mut used);
    }
    let mut answers: Vec<ValueMatch> = found
        .into_iter()
        .map(|f| match f {
            Some((c, how)) => Ok((candidates[c].0.clone(), how)),
            None => Err(
                "no ONNX node carries this module's scope, and no value of the file looks like this layer's output: it was folded into a neighbour or removed at export, or its value drifted too far to be recognised".to_string(),
            ),
        })
        .collect();
    for group in &request.calls {
        answers.extend(pair_calls(group, layers, &index, &in_groups));
    }
    Ok(answers)
}

/// Each layer recognised moves to the first value after the value of the layer before
/// it that is as alike as the one it took: a value reshaped outside any module (a flatten
/// after the pooling) holds the layer's very values, and the layer's own value comes first.
/// A value merely close to it (a Linear's MatMul before its bias) is not the layer's. Where
/// the file computes the layer before the one before it (an optimizer sorted an attention's
/// key projection before its query's), the first such value from the start of the graph.
fn first_alike(
    wanted: &[&LayerCall],
    seen: &[(usize, Fingerprint)],
    found: &mut [Option<(usize, String)>],
    used: &mut [bool],
) {
    let mut start = 0;
    for w in 0..wanted.len() {
        let (Some(print), Some((c, _))) = (&wanted[w].fingerprint, &found[w]) else {
            continue;
        };
        let current = *c;
        let taken = print.likeness(&seen[current].1);
        let from = if current < start { 0 } else { start };
        let first = seen
            .iter()
            .filter(|(k, _)| (from..current).contains(k) && !used[*k])
            .find(|(_, f)| print.likeness(f) >= taken - SAME_EXACTLY);
        if let Some((k, f)) = first {
            used[current] = false;
            used[*k] = true;
            found[w] = Some((*k, strictly(print.likeness(f))));
        }
        start = found[w].as_ref().map_or(start, |(c, _)| c + 1);
    }
}

/// Layers not recognised, in order: each takes the most alike value between the values of
/// the layers around it, if it is at least loosely alike. A drifting target changes values
/// beyond the strict bound, and from the drift on every layer does: those layers are still
/// compared, their notes saying how loosely they were paired. Only where no node names a
/// scope: in a file with scopes, a layer without one is a module the export folded away
/// (an embedding of constant positions), and the nearest value would be someone else's.
fn loosely(
    wanted: &[&LayerCall],
    seen: &[(usize, Fingerprint)],
    found: &mut [Option<(usize, String)>],
    used: &mut [bool],
) {
    for w in 0..wanted.len() {
        let Some(print) = wanted[w]
            .fingerprint
            .as_ref()
            .filter(|_| found[w].is_none())
        else {
            continue;
        };
        let start = found[..w]
            .iter()
            .rev()
            .find_map(|f| f.as_ref().map(|(c, _)| c + 1));
        let end = found[w + 1..]
            .iter()
            .find_map(|f| f.as_ref().map(|(c, _)| *c));
        let window = start.unwrap_or(0)..end.unwrap_or(used.len());
        let best = seen
            .iter()
            .filter(|(c, _)| window.contains(c) && !used[*c])
            .map(|(c, f)| (*c, print.likeness(f)))
            .filter(|&(_, likeness)| likeness >= LOOSELY_ALIKE)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((c, likeness)) = best {
            used[c] = true;
            found[w] = Some((
                c,
                format!(
                    "matched by values, loosely: no node names this module's scope, and this is the most alike value in order (likeness {likeness:.3}); its values differ from the layer's, which drift does"
                ),
            ));
        }
    }
}

/// The values computed from any of the values added (those included).
#[derive(Default)]
struct Downstream(std::collections::HashSet<String>);

impl Downstream {
    fn holds(&self, value: &str) -> bool {
        self.0.contains(value)
    }

    /// `value` and every value computed from it; what is already held is not walked again.
    fn add(&mut self, index: &GraphIndex, value: &str) {
        let mut stack = vec![value.to_string()];
        while let Some(v) = stack.pop() {
            if !self.0.insert(v.clone()) {
                continue;
            }
            for node in index.consumers(&v) {
                stack.extend(node.outputs.iter().filter(|o| !o.is_empty()).cloned());
            }
        }
    }
}

/// The fingerprint of each value of `names`, from extra runs of the target with them exposed
/// (as many at a time as `budget` allows for values of up to `largest` bytes).
fn fingerprints(
    model: &mut Model,
    runtime: &(dyn Runtime + Send + Sync),
    inputs: &[(String, Tensor)],
    names: &[String],
    budget: Option<u64>,
    largest: u64,
) -> Result<Vec<Fingerprint>> {
    let per_run = budget.map_or(VALUES_PER_RUN, |b| {
        usize::try_from(b / largest)
            .unwrap_or(usize::MAX)
            .clamp(1, VALUES_PER_RUN)
    });
    let mut prints = Vec::with_capacity(names.len());
    let outputs = model.graph().output.len();
    for chunk in names.chunks(per_run) {
        expose_values(model, chunk)?;
        let values = runtime.run(model, inputs, chunk);
        model.graph_mut().output.truncate(outputs);
        prints.extend(values?.iter().map(|(_, t)| Fingerprint::of(t.view())));
    }
    Ok(prints)
}

/// One group's calls, in order, each with the first of its values after the previous call's
/// that holds the call's numbers (see the module docs).
fn pair_calls(
    group: &CallGroup,
    layers: &[LayerCall],
    index: &GraphIndex,
    prints: &std::collections::HashMap<&str, Fingerprint>,
) -> Vec<ValueMatch> {
    let mut from = 0;
    group
        .layers
        .iter()
        .map(|&i| {
            let layer = &layers[i];
            let op = layer.op.as_deref().unwrap_or("op");
            let hit = layer.fingerprint.as_ref().and_then(|print| {
                group.values.iter().enumerate().skip(from).find_map(|(k, v)| {
                    let likeness = print.likeness(prints.get(v.as_str())?);
                    (layer.fits(index, v) && likeness >= SAME_VALUE).then_some((k, likeness))
                })
            });
            match hit {
                Some((k, likeness)) => {
                    from = k + 1;
                    Ok((
                        group.values[k].clone(),
                        format!(
                            "matched by values: PyTorch's {} `{op}` call(s) here and the export's {} `{op}` node(s) the model's inputs reach do not pair by position; this node's value holds this call's numbers (likeness {likeness:.4})",
                            group.layers.len(),
                            group.values.len()
                        ),
                    ))
                }
                None => Err(format!(
                    "none of the export's `{op}` nodes there that the model's inputs reach holds this call's numbers"
                )),
            }
        })
        .collect()
}

fn strictly(likeness: f64) -> String {
    format!(
        "matched by values: no node names this module's scope; this value's samples agree with the layer's (likeness {likeness:.4})"
    )
}

/// When pairing by values recognised some layers but none from some point on, what that means
/// for the verdict: from there on the target may drift beyond recognition (a compared run that
/// stops before it cannot say "no drift").
pub fn unrecognised_from(names: &[&str], recognised: &[bool]) -> Option<String> {
    let first_seen = recognised.iter().position(|&r| r)?;
    let lost = (first_seen..recognised.len()).find(|&i| !recognised[i..].iter().any(|&r| r))?;
    Some(format!(
        "from `{}` on no layer could be paired by values (the ONNX file names no module scope): the target may drift beyond recognition there, or compute something else",
        names[lost]
    ))
}

#[cfg(test)]
mod tests {
    use layerdiff_core::{DType, Fingerprint};
    use layerdiff_onnx::LayerCall;

    fn call(name: &str, samples: &[f64]) -> LayerCall {
        LayerCall {
            name: name.into(),
            module: name.into(),
            call_index: 0,
            identity: false,
            constant: false,
            feeds_output: true,
            input_from: None,
            shape: vec![1, samples.len()],
            dtype: DType::F32,
            fingerprint: Some(print(samples)),
            op: None,
        }
    }

    fn print(samples: &[f64]) -> Fingerprint {
        Fingerprint {
            count: samples.len(),
            samples: samples.to_vec(),
        }
    }

    #[test]
    fn a_layer_the_file_computes_before_the_one_before_it_takes_its_own_first_value() {
        // an optimized BERT: the key's projection (its Gemm's output, then that reshaped for
        // the heads) sorted before the query's; the key had taken the heads' reshape, of
        // another shape, and read as a shape_mismatch defect on a clean file
        let (q, k) = ([1.0, 2.0, 3.0], [4.0, -5.0, 6.0]);
        let seen = vec![(0, print(&k)), (1, print(&k)), (2, print(&q))];
        let (query, key) = (call("query", &q), call("key", &k));
        let wanted = [&query, &key];
        let mut found = vec![Some((2, String::new())), Some((1, String::new()))];
        let mut used = vec![false, true, true];
        super::first_alike(&wanted, &seen, &mut found, &mut used);
        assert_eq!(found[1].as_ref().map(|f| f.0), Some(0));
        assert_eq!(used, [true, false, true]);
    }
}
