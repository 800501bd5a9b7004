//! What the values of two sides show beyond their difference: whether a weight is the same,
//! whether a side disagrees with itself, and a reference value made fit to feed the target.

use layerdiff_core::{DType, Tensor, TensorView, compare};
use layerdiff_onnx::{Model, NodeExt, NodeProto, Stored, attribute_text};
use rayon::prelude::*;

use crate::engine::group::{COMPARED_TENSOR, Member, tensor_change};

mod clipped;
mod codes;
mod weight;

pub(crate) use codes::{dequantize, dequantized_codes, integer_product_weight};

pub use weight::{MATCHED_BY_SHAPE, WeightCheck, WeightCheckFn, check_weight};

/// How far a side disagrees with itself at `value`: its first output against two more runs
/// (max abs diff); `None` when it agrees or was not re-run.
pub fn disagreement(
    first: &Tensor,
    again: Option<&[Vec<(String, Tensor)>; 2]>,
    value: &str,
) -> Option<f64> {
    let runs = again?;
    fn find<'t>(run: &'t [(String, Tensor)], value: &str) -> Option<&'t Tensor> {
        run.iter().find(|(n, _)| n == value).map(|(_, t)| t)
    }
    let (a, b) = (find(&runs[0], value)?, find(&runs[1], value)?);
    // (NaN in one run and not in the other is as far apart as runs get)
    let d = |x: &Tensor, y: &Tensor| {
        compare(x.view(), y.view()).map_or(0.0, |s| s.counting_nan(s.max_abs_diff))
    };
    Some(d(first, a).max(d(a, b))).filter(|&d| d > 0.0)
}

/// A reference tensor made fit to feed the target in place of `name`: cast to the target's
/// dtype (a mask's sentinel held as that dtype's extreme, [`layerdiff_core::held_as`]),
/// reshaped to its shape (element counts must agree).
pub fn fit(
    name: &str,
    reference: &Tensor,
    dtype: DType,
    shape: &[usize],
) -> Result<Tensor, String> {
    let given = &reference.shape;
    layerdiff_core::held_as(reference.view(), dtype)
        .reshaped(shape)
        .ok_or_else(|| {
            format!("the reference's `{name}` has shape {given:?}, the target's {shape:?}")
        })
}

/// An ONNX node as a member of a group, in the terms every side shares.
pub fn node_member(node: &NodeProto) -> Member {
    Member {
        name: node.name.clone(),
        shown: node.display_name(),
        op: node.op_type().to_string(),
        attributes: node
            .attribute
            .iter()
            .map(|a| {
                let words = match &a.t {
                    // its size would tell a float16 file's rounding from its float32 original
                    Some(t) if !held(t) => format!("tensor {:?}", t.dims),
                    _ => attribute_text(a),
                };
                (a.name().to_string(), words)
            })
            .collect(),
        tensors: node
            .attribute
            .iter()
            .filter_map(|a| {
                let t = a.t.as_ref().filter(|t| held(t))?;
                Some((a.name().to_string(), Stored::of(t).ok()?.into_tensor()))
            })
            .collect(),
    }
}

/// Whether a tensor attribute is small enough for a [`Member`] to hold by value
/// ([`COMPARED_TENSOR`]); a larger one is told by its dims alone.
fn held(t: &layerdiff_onnx::TensorProto) -> bool {
    let elements = t
        .dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?));
    elements.is_some_and(|n| n <= COMPARED_TENSOR as u64)
}

/// `model`'s node of the same name and op as `member`.
pub fn model_counterpart(model: &Model, member: &Member) -> Option<Member> {
    let name = member.name.as_deref().unwrap_or_default();
    counterpart_node(model, name, &member.op).map(node_member)
}

/// `model`'s node named `name` with op `op`.
fn counterpart_node<'m>(model: &'m Model, name: &str, op: &str) -> Option<&'m NodeProto> {
    (model.graph().node.iter()).find(|n| n.name() == name && n.op_type() == op)
}

/// How the tensor attributes of `target` too large for a [`Member`] to hold differ from
/// `reference`'s, read from the files, one line each: at the same dims a node's words cannot
/// tell an edit of their values. Held to the rule of a weight, as a small one is.
fn large_tensor_changes(reference: &NodeProto, target: &NodeProto) -> Vec<String> {
    let shown = target.display_name();
    (target.attribute.iter())
        .filter_map(|a| {
            let ours = a.t.as_ref().filter(|t| !held(t))?;
            let theirs = (reference.attribute.iter())
                .find(|r| r.name() == a.name())
                .and_then(|r| r.t.as_ref())
                .filter(|t| t.dims == ours.dims)?;
            let before = Stored::of(theirs).ok()?.into_tensor();
            let after = Stored::of(ours).ok()?.into_tensor();
            let words = format!("tensor {:?}", ours.dims);
            let change = tensor_change(a.name(), &before, &after, (&words, &words))?;
            Some(format!("{change} on `{shown}`"))
        })
        .collect()
}

/// Checks another side's weight against `model`'s counterpart: the initializer of the same
/// name (or of the name a quantizer derived it from, `w` for `w_quantized` or `w_Q4`), else the one at
/// the same input position of the node with the same name. A name the two files do not agree
/// on is no counterpart: where `model`'s node of the same name reads another initializer at
/// that position, an exporter numbered its constants otherwise (`val_69`, RMSNorm's epsilon
/// in a decoder exported with its lengths dynamic, a shape's 8 in one exported for one step),
/// and nothing is said. A matrix may be stored transposed (a Gemm's `transB` weight a
/// quantizer rewrote for MatMulInteger): the form that matches stands.
pub fn model_weight_check(
    model: &Model,
    node: &str,
    position: usize,
    name: &str,
    weight: TensorView<'_>,
    half_step: Option<TensorView<'_>>,
) -> Option<WeightCheck> {
    let stored = |n: &str| model.stored(n).and_then(Result::ok);
    // the names ONNX Runtime's quantizers derive from the weight's
    let original = ["_quantized", "_Q4", "_Q8"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix));
    let same = model.graph().node.iter().find(|n| n.name() == node);
    let read_there = same.and_then(|n| n.input.get(position));
    if let Some(other) = read_there
        && other != name
        && model.stored(other).is_some()
        && stored(name).is_some()
    {
        return None;
    }
    let theirs_name = match original {
        _ if stored(name).is_some() => name,
        Some(original) if stored(original).is_some() => original,
        _ => read_there?,
    };
    let theirs = model.stored(theirs_name)?.ok()?;
    if half_step.is_some() && !theirs.dtype.is_float() {
        // the target's graph reads the codes themselves (ONNX Runtime's QLinearConv): checked
        // as the numbers they stand for, with its own scale and zero point
        let (codes, _) = dequantized_codes(model, theirs_name)?;
        return Some(check_weight(name, codes.view(), weight, false, half_step));
    }
    let check = check_weight(name, theirs.view(), weight, false, half_step);
    let flipped = theirs.shape.len() == 2
        && weight.shape.len() == 2
        && theirs.shape[0] == weight.shape[1]
        && theirs.shape[1] == weight.shape[0];
    if !matches!(check, WeightCheck::Differs(_)) || !flipped {
        return Some(check);
    }
    let transposed = transpose_2d(theirs.view());
    match check_weight(name, transposed.view(), weight, false, half_step) {
        // Both forms differ: the nearer one is how it is stored (a few elements edited in a
        // transposed matrix differ from its untransposed form in nearly all, or by shape).
        WeightCheck::Differs(_) if nearer(theirs.view(), transposed.view(), weight) => Some(check),
        flipped => Some(flipped),
    }
}

/// Whether `weight` is nearer `a` than `b` (by mean abs diff, their element counts the same).
fn nearer(a: TensorView<'_>, b: TensorView<'_>, weight: TensorView<'_>) -> bool {
    let mean = |r| compare(r, weight).map_or(f64::INFINITY, |s| s.mean_abs_diff);
    mean(a) <= mean(b)
}

/// Most differences between two files read one by one; more are counted.
const LISTED: usize = 20;

/// What differs between the `reference` file and the `target` file, read from both: each
/// float weight of the same name beyond its rounding to the target's dtype, and each attribute
/// both files set on a node of the same name and op to other values, with the layer (value)
/// that reads it. Names a file rewrote (an optimizer's fused weights, a quantizer's) have no
/// counterpart and are not read, nor a name the two files read at other nodes or positions;
/// an attribute set in one file only is not told from its default. At most `LISTED`
/// differences, then one that counts the rest.
pub fn file_differences(reference: &Model, target: &Model) -> Vec<layerdiff_core::FileDifference> {
    use layerdiff_onnx::{GraphIndex, reads_the_same};
    let index = GraphIndex::new(target.graph());
    // the value a weight or node feeds: its (first) reader's first output
    let read_by = |name: &str| {
        index
            .consumers(name)
            .next()
            .and_then(|n| n.outputs.first().cloned())
            .unwrap_or_else(|| name.to_string())
    };
    // every weight of both files is read: the weights are checked across the threads
    let differing: Vec<(&str, String)> = target
        .graph()
        .initializer
        .par_iter()
        .filter_map(|init| {
            let name = init.name();
            let (Some(Ok(theirs)), Some(Ok(ours))) = (reference.stored(name), target.stored(name))
            else {
                return None;
            };
            if !(theirs.dtype.is_float() && ours.dtype.is_float()) {
                return None;
            }
            match check_weight(name, theirs.view(), ours.view(), true, None) {
                WeightCheck::Differs(text) => Some((name, text)),
                _ => None,
            }
        })
        .collect();
    let (reference_index, none) = (GraphIndex::new(reference.graph()), Default::default());
    // where a weight is read, by node name and input position: two exports numbered their
    // constants otherwise where the nodes that read a name differ (`val_69`, RMSNorm's epsilon
    // in a decoder exported with dynamic lengths, a shape's 8 in one exported for one step)
    let readers = |index: &GraphIndex, name: &str| {
        let mut at: Vec<(String, usize)> = (index.consumers(name))
            .flat_map(|n| {
                let positions = n.inputs.iter().enumerate().filter(|(_, i)| *i == name);
                positions
                    .map(|(p, _)| (n.name.clone(), p))
                    .collect::<Vec<_>>()
            })
            .collect();
        at.sort();
        at
    };
    let mut found: Vec<_> = differing
        .into_iter()
        .filter(|(name, _)| readers(&reference_index, name) == readers(&index, name))
        .map(|(name, text)| layerdiff_core::FileDifference {
            layer: read_by(name),
            cause: layerdiff_core::Cause::WeightMismatch,
            fix: layerdiff_core::weights_fix(
                &format!("the nodes that read the target file's `{name}`"),
                std::slice::from_ref(&text),
            ),
            detail: text,
        })
        .collect();
    // each reference node by name and op, the first of each (as `counterpart_node` finds it)
    let mut named: std::collections::HashMap<(&str, &str), &layerdiff_onnx::NodeInfo> =
        Default::default();
    for n in reference_index.nodes().iter().rev() {
        named.insert((&n.name, &n.op_type), n);
    }
    for (node, at) in target.graph().node.iter().zip(index.nodes()) {
        let Some(&theirs_at) = named.get(&(at.name.as_str(), at.op_type.as_str())) else {
            continue;
        };
        // a node an optimizer rewired reads other values: another computation under its old
        // name (ONNX Runtime's transpose optimizer moves a Transpose across a Split, which
        // splits another axis), not an edited attribute
        if !reads_the_same(&reference_index, &index, theirs_at, at, &none) {
            continue;
        }
        let their_node = &reference.graph().node[theirs_at.index];
        let (ours, theirs) = (node_member(node), node_member(their_node));
        // the attributes both files write: one only the target's node has (a vendor op's own)
        // is told where its layer drifts, not as a difference between the files
        let written = |m: &Member, other: &Member| Member {
            attributes: (m.attributes.iter())
                .filter(|(n, _)| other.attributes.iter().any(|(o, _)| o == n))
                .cloned()
                .collect(),
            ..m.clone()
        };
        let mut changed = written(&ours, &theirs).changes_from(&written(&theirs, &ours));
        changed.extend(large_tensor_changes(their_node, node));
        let shown = &ours.shown;
        if changed.is_empty() {
            continue;
        }
        found.push(layerdiff_core::FileDifference {
            layer: node.output.first().cloned().unwrap_or_else(|| shown.clone()),
            cause: layerdiff_core::Cause::FileDiffers,
            detail: layerdiff_core::attributes_differ(&changed),
            fix: format!(
                "give `{shown}` the reference's attribute values back (reference → target: {}); export the file again from the model, or undo the edit or pass that changed it",
                changed.join(", ")
            ),
        });
    }
    if found.len() > LISTED {
        let more = found.len() - LISTED;
        found.truncate(LISTED);
        if let Some(last) = found.last_mut() {
            last.detail.push_str(&format!(
                " ({more} more differences between the files are not listed)"
            ));
        }
    }
    found
}

/// A matrix transposed.
pub(crate) fn transpose_2d(t: TensorView<'_>) -> Tensor {
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

#[cfg(test)]
mod tests {
    use layerdiff_core::{DType, Tensor};
    use layerdiff_onnx::{GraphProto, ModelProto, NodeProto, TensorProto};

    use super::*;

    fn scalar(name: &str, v: f32) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            data_type: Some(1),
            float_data: vec![v],
            ..Default::default()
        }
    }

    fn reader(name: &str, reads: &str) -> NodeProto {
        NodeProto {
            name: Some(name.into()),
            op_type: Some("Add".into()),
            input: vec!["x".into(), reads.into()],
            output: vec![format!("{name}_out")],
            ..Default::default()
        }
    }

    #[test]
    fn a_run_nan_where_the_others_are_numbers_disagrees_without_bound() {
        let t = |v: &[f32]| {
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Tensor::new("y", DType::F32, vec![v.len()], bytes).unwrap()
        };
        let (first, nan) = (t(&[1.0, 2.0]), t(&[f32::NAN, f32::NAN]));
        let runs =
            |a: &Tensor, b: &Tensor| [vec![("y".into(), a.clone())], vec![("y".into(), b.clone())]];
        // the second run all NaN: no position is compared, which read as agreeing
        let d = disagreement(&first, Some(&runs(&first, &nan)), "y");
        assert_eq!(d, Some(f64::INFINITY));
        assert_eq!(disagreement(&first, Some(&runs(&first, &first)), "y"), None);
        // NaN in every run alike is the model's, not a disagreement
        assert_eq!(disagreement(&nan, Some(&runs(&nan, &nan)), "y"), None);
    }

    #[test]
    fn a_constant_two_exports_number_otherwise_is_no_counterpart() {
        // A decoder file exported with its lengths dynamic reads its RMSNorm epsilon as
        // `val_69` in `node_Add_3`; an export made for one step numbered its constants
        // otherwise: its `val_69` is a shape's 8, its `node_Add_3` reads `val_70`. It read
        // "weight_mismatch: `val_69` differs: max abs diff 8.0" on a clean int8 decoder.
        let export = Model::from_proto(
            ModelProto {
                graph: Some(GraphProto {
                    node: vec![reader("node_Add_3", "val_70")],
                    initializer: vec![scalar("val_69", 8.0), scalar("val_70", 1e-6)],
                    ..Default::default()
                }),
                ..Default::default()
            },
            None,
        );
        let eps = Tensor::new("eps", DType::F32, vec![], 1e-6f32.to_le_bytes().to_vec()).unwrap();
        let check = model_weight_check(&export, "node_Add_3", 1, "val_69", eps.view(), None);
        assert!(check.is_none(), "{check:?}");
        // where the files agree on the name, it is checked
        let check = model_weight_check(&export, "node_Add_3", 1, "val_70", eps.view(), None);
        assert!(matches!(check, Some(WeightCheck::Same)), "{check:?}");
    }

    #[test]
    fn codes_a_fused_integer_kernel_reads_are_checked_as_the_numbers_they_stand_for() {
        // ONNX Runtime at opt=all fuses a QDQ Conv into a QLinearConv that reads the int8 codes
        // themselves: the reference's weight, dequantized, was checked against those integers
        // and every element "moved by more than half a scale step".
        let int8 = |name: &str, codes: &[i8]| TensorProto {
            name: Some(name.into()),
            data_type: Some(3),
            dims: vec![codes.len() as i64],
            raw_data: Some(codes.iter().map(|&c| c as u8).collect()),
            ..Default::default()
        };
        let conv = |codes: &[i8]| {
            let fused = NodeProto {
                name: Some("conv_token_7".into()),
                op_type: Some("QLinearConv".into()),
                input: ["x", "x_scale", "x_zero", "w_quantized", "w_scale", "w_zero"]
                    .map(String::from)
                    .to_vec(),
                output: vec!["y".into()],
                ..Default::default()
            };
            let graph = GraphProto {
                node: vec![fused],
                initializer: vec![int8("w_quantized", codes), scalar("w_scale", 0.5), {
                    let mut zero = int8("w_zero", &[1]);
                    zero.dims.clear();
                    zero
                }],
                ..Default::default()
            };
            let proto = ModelProto {
                graph: Some(graph),
                ..Default::default()
            };
            Model::from_proto(proto, None)
        };
        // the reference's weight: codes [3, -5, 9] on the same grid, dequantized
        let values = [1.0f64, -3.0, 4.0];
        let bytes = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let weight = Tensor::new("w", DType::F64, vec![3], bytes(&values)).unwrap();
        let halves = Tensor::new("h", DType::F64, vec![3], bytes(&[0.25; 3])).unwrap();
        let check = |model: &Model| {
            let (w, h) = (weight.view(), Some(halves.view()));
            model_weight_check(model, "conv", 1, "w_quantized", w, h)
        };
        let same = check(&conv(&[3, -5, 9]));
        assert!(
            matches!(same, Some(WeightCheck::LowerPrecision(_))),
            "{same:?}"
        );
        let Some(WeightCheck::Differs(said)) = check(&conv(&[3, -5, 10])) else {
            panic!("an edited code is a differing weight");
        };
        assert!(said.contains("1 of 3 elements moved"), "{said}");
    }
}
