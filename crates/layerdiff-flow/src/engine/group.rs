//! What a side re-runs and names in its own terms: a [`Group`] of its computation (what computes
//! one value from values both sides know) and its [`Member`]s (an ONNX node, a framework's op or
//! layer), whose attributes are compared with the reference's counterpart.

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
}

impl Member {
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
                let differs = meaning(reference, name, &r) != meaning(self, name, &t);
                differs.then(|| format!("`{name}` {r} → {t} on `{}`", self.shown))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(attributes: &[(&str, &str)]) -> Member {
        Member {
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
}
