//! Findings that read alike, said once. A float16 ResNet-18 has 28 layers whose precision_loss
//! paragraphs differ only in their figures and 20 notes that differ only in names; the reports
//! say each such finding once, for the first layer it applies to, and name the others (whose
//! figures stay in the layer table and the JSON). Defects are never folded: each is its own.

use crate::{Finding, Layer};

/// Items in order of first appearance, those whose key is the same gathered under the first;
/// an item without a key stands alone.
pub(crate) fn alike<T>(items: Vec<T>, key: impl Fn(&T) -> Option<String>) -> Vec<Vec<T>> {
    let mut groups: Vec<(Option<String>, Vec<T>)> = Vec::new();
    for item in items {
        let k = key(&item);
        match k
            .as_ref()
            .and_then(|k| groups.iter_mut().find(|(g, _)| g.as_ref() == Some(k)))
        {
            Some((_, members)) => members.push(item),
            None => groups.push((k, vec![item])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

/// The layers with a cause, gathered where their findings read alike (the same cause and
/// finding, the same words but for figures and names); defects each alone.
pub(crate) fn causes(layers: Vec<&Layer>) -> Vec<Vec<&Layer>> {
    alike(layers, |l| {
        (l.finding != Some(Finding::Defect)).then(|| {
            format!(
                "{:?}|{:?}|{:?}|{}",
                l.cause,
                l.finding,
                l.permutation,
                masked(l.detail.as_deref().unwrap_or_default())
            )
        })
    })
}

/// A text with its figures and its `quoted` names masked: what two findings share when they
/// differ only in those.
pub(crate) fn masked(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '`' {
            for q in chars.by_ref() {
                if q == '`' {
                    break;
                }
            }
            out.push_str("`·`");
        } else if c.is_ascii_digit() {
            while let Some(&d) = chars.peek() {
                if d.is_ascii_digit() || d == '.' || d == 'e' || d == '-' || d == '+' {
                    chars.next();
                } else {
                    break;
                }
            }
            out.push('#');
        } else {
            out.push(c);
        }
    }
    out
}

/// The others' names after the first's finding: "alike at 2 more layers (…): `a`, `b`".
pub(crate) fn others_words(names: &[String], quote: impl Fn(&str) -> String) -> String {
    let list: Vec<String> = names.iter().map(|n| quote(n)).collect();
    let count = match names.len() {
        1 => "1 more layer".to_string(),
        n => format!("{n} more layers"),
    };
    format!(
        "alike at {count} (each with its own figures and names): {}",
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_and_names_are_masked_and_words_kept() {
        assert_eq!(
            masked(
                "its own error is 0.50× what float16 explains (up to 1.189e-3), from `layer1.0.bn1`"
            ),
            masked("its own error is 0.43× what float16 explains (up to 7.2e-4), from `fc`")
        );
        assert_ne!(
            masked("its own error is 0.50× what float16 explains"),
            masked("its own error is 0.50× what bfloat16 explains")
        );
    }

    #[test]
    fn groups_keep_first_appearance_and_lone_items() {
        let items = vec![
            ("a", Some(1)),
            ("b", None),
            ("c", Some(1)),
            ("d", Some(2)),
            ("e", None),
        ];
        let groups = alike(items, |(_, k)| k.map(|k| k.to_string()));
        let names: Vec<Vec<&str>> = groups
            .iter()
            .map(|g| g.iter().map(|(n, _)| *n).collect())
            .collect();
        assert_eq!(names, vec![vec!["a", "c"], vec!["b"], vec!["d"], vec!["e"]]);
    }
}
