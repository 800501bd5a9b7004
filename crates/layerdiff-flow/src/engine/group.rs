//! What a side re-runs and names in its own terms: a [`Group`] of its computation (what computes
//! one value from values both sides know) and its [`Member`]s (an ONNX node, a framework's op or
//! layer), whose attributes are compared with the reference's counterpart.

use layerdiff_core::{DType, Tensor};

use crate::engine::evidence::{WeightCheck, check_weight};

/// A group of a side's own computation: what computes one value from values both sides know.
/// The engine holds it and hands it back; only the side that found it reads `members`.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The side's own indices of what computes the value (an ONNX graph's node indices, a
    /// framework's layer index), in order.
    pub members: Vec<usize>,
    /// The values known on both sides that the group reads, in first-read order.
    pub inputs: Vec<String>,
}

/// One member of a group in its side's own terms: an ONNX node, a framework's op or layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Its name, where it has one (the report lists the named ones).
    pub name: Option<String>,
    /// How the report names it when it has no name (`Add→x` for an unnamed ONNX node).
    pub shown: String,
    /// Its op (`Conv`, `LayerNormalization`).
    pub op: String,
    /// Its attributes, each as `(name, value in words)`.
    pub attributes: Vec<(String, String)>,
    /// The values of its tensor attributes (an ONNX Constant's `value`) up to
    /// [`COMPARED_TENSOR`] elements, by name: compared by value, where their words give only
    /// a size.
    pub tensors: Vec<(String, Tensor)>,
}

/// The most elements of a tensor attribute a [`Member`] holds to compare by value.
pub const COMPARED_TENSOR: usize = 1 << 16;

impl Member {
    /// The value of its tensor attribute `name`, where it holds one.
    fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// How this member's attributes differ from `reference`'s, one line each
    /// (``epsilon` 1e-5 → 0.1 on `ln``). An attribute one side leaves unset and the other
    /// writes at the op's default (ONNX's `auto_pad` "NOTSET") does not differ.
    pub fn changes_from(&self, reference: &Member) -> Vec<String> {
        let mut names: Vec<&str> = reference
            .attributes
            .iter()
            .chain(&self.attributes)
            .map(|(n, _)| n.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        let text = |member: &Member, name: &str| {
            member
                .attributes
                .iter()
                .find(|(n, _)| n == name)
                .map_or_else(|| "(unset)".to_string(), |(_, v)| v.clone())
        };
        // what a value means: the op's default stands for unset
        let meaning = |member: &Member, name: &str, text: &str| {
            if layerdiff_onnx::is_default_attribute(&member.op, name, text) {
                "(unset)".to_string()
            } else {
                text.to_string()
            }
        };
        names
            .into_iter()
            .filter_map(|name| {
                let (r, t) = (text(reference, name), text(self, name));
                if let (Some(before), Some(after)) = (reference.tensor(name), self.tensor(name)) {
                    let change = tensor_change(name, before, after, (&r, &t));
                    return change.map(|text| format!("{text} on `{}`", self.shown));
                }
                // a float Cast a narrow file makes to its own dtype: its precision, as its
                // weights stored narrower are
                if self.op == "Cast" && name == "to" && narrowed_float(&r, &t) {
                    return None;
                }
                let differs = meaning(reference, name, &r) != meaning(self, name, &t);
                differs.then(|| format!("`{name}` {r} → {t} on `{}`", self.shown))
            })
            .collect()
    }
}

/// Whether a Cast's `to`, written `before` and `after` (ONNX element types in words), goes from a
/// float dtype to a narrower float one (float32 → float16, bfloat16).
fn narrowed_float(before: &str, after: &str) -> bool {
    let dtype = |t: &str| {
        let code = t.trim().parse::<i32>().ok()?;
        DType::from_onnx_code(code).ok().filter(|d| d.is_float())
    };
    matches!((dtype(before), dtype(after)), (Some(b), Some(a)) if a.narrower_than(b))
}

/// How a tensor attribute's value differs, in words (`texts`: both in words), or `None`. A
/// float one is held to the rule of a weight ([`check_weight`]): stored narrower, it is its
/// rounding (a float16 export holds GELU's 0.5 in float16); changed within its dtype, it
/// differs though its size does not. Any other differs where its values do.
pub(crate) fn tensor_change(
    name: &str,
    before: &Tensor,
    after: &Tensor,
    texts: (&str, &str),
) -> Option<String> {
    if before.dtype.is_float() && after.dtype.is_float() {
        return match check_weight(name, before.view(), after.view(), true, None) {
            WeightCheck::Differs(text) => Some(text),
            _ => None,
        };
    }
    // a few values are shown (a Reshape's target shape), more by their size in words
    let shown = |t: &Tensor, text: &str| {
        let n = t.view().numel();
        if n > 8 {
            return text.to_string();
        }
        let values: Vec<String> = (0..n).map(|i| t.view().get_f64(i).to_string()).collect();
        format!("[{}]", values.join(", "))
    };
    let (r, t) = (shown(before, texts.0), shown(after, texts.1));
    (before != after).then(|| format!("`{name}` holds other values ({r} → {t})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(attributes: &[(&str, &str)]) -> Member {
        Member {
            tensors: Vec::new(),
            name: Some("ln".into()),
            shown: "ln".into(),
            op: "LayerNormalization".into(),
            attributes: attributes
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_changed_or_unset_attribute_is_named_with_both_values() {
        let reference = norm(&[("epsilon", "1e-5"), ("axis", "1")]);
        assert_eq!(
            norm(&[("epsilon", "0.1"), ("axis", "1")]).changes_from(&reference),
            vec!["`epsilon` 1e-5 → 0.1 on `ln`".to_string()]
        );
        assert_eq!(
            norm(&[("epsilon", "1e-5")]).changes_from(&reference),
            vec!["`axis` 1 → (unset) on `ln`".to_string()]
        );
        // written at the op's default (-1), or left unset: the same
        assert!(norm(&[("axis", "-1")]).changes_from(&norm(&[])).is_empty());
        assert!(reference.changes_from(&reference).is_empty());
    }

    #[test]
    fn an_attribute_written_at_the_op_s_default_is_no_change() {
        let conv = |attributes: &[(&str, &str)]| Member {
            op: "Conv".into(),
            ..norm(attributes)
        };
        let reference = conv(&[("pads", "[1, 1, 1, 1]")]);
        let written = conv(&[
            ("pads", "[1, 1, 1, 1]"),
            ("auto_pad", "\"NOTSET\""),
            ("group", "1"),
        ]);
        assert!(written.changes_from(&reference).is_empty());
        assert_eq!(
            conv(&[("pads", "[1, 1, 1, 1]"), ("auto_pad", "\"SAME_UPPER\"")])
                .changes_from(&reference),
            vec!["`auto_pad` (unset) → \"SAME_UPPER\" on `ln`".to_string()]
        );
    }

    #[test]
    fn a_tensor_attribute_is_compared_by_its_values() {
        let constant = |tensor: Tensor| Member {
            op: "Constant".into(),
            attributes: vec![("value".into(), "tensor [] (4 bytes)".into())],
            tensors: vec![("value".into(), tensor)],
            ..norm(&[])
        };
        let scale = |dtype, v: f64| constant(Tensor::from_f64(dtype, &[v]));
        let reference = scale(DType::F32, std::f64::consts::SQRT_2);
        // stored as its float16 rounding: the file's precision, no change
        assert!(
            scale(DType::F16, std::f64::consts::SQRT_2)
                .changes_from(&reference)
                .is_empty()
        );
        // moved, in a narrower dtype or in its own (same size, other value)
        for dtype in [DType::F16, DType::F32] {
            let changes = scale(dtype, 1.5).changes_from(&reference);
            assert!(
                changes.len() == 1 && changes[0].starts_with("`value` differs"),
                "{changes:?}"
            );
            assert!(changes[0].ends_with("on `ln`"), "{changes:?}");
        }
        let shape = |v: f64| constant(Tensor::from_f64(DType::I64, &[1.0, v]));
        assert!(shape(-1.0).changes_from(&shape(-1.0)).is_empty());
        assert_eq!(
            shape(4.0).changes_from(&shape(-1.0)),
            vec!["`value` holds other values ([1, -1] → [1, 4]) on `ln`"]
        );
    }

    #[test]
    fn a_cast_the_narrow_file_makes_to_its_own_dtype_is_no_change() {
        // ONNX Runtime's float16 converter writes a float32 Cast's `to` as float16: a timm ViT
        // against its float16 file read "20 defects: …/attn/Cast file_differs: `to` 1 → 10"
        let cast = |to: &str| Member {
            op: "Cast".into(),
            ..norm(&[("to", to)])
        };
        assert!(cast("10").changes_from(&cast("1")).is_empty(), "float16");
        assert!(cast("16").changes_from(&cast("1")).is_empty(), "bfloat16");
        // to an integer, or wider than the reference's: the computation changed
        assert_eq!(
            cast("7").changes_from(&cast("1")),
            vec!["`to` 1 → 7 on `ln`".to_string()]
        );
        assert_eq!(cast("1").changes_from(&cast("10")).len(), 1);
    }
}
