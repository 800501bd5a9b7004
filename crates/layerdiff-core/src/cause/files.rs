//! The differences between a comparison's two files, read from both (a weight of the same
//! name, an attribute of the same node), added to the defects where no layer's names them.

use super::Cause;
use crate::{Defect, Layer, Summary, Verdict};

/// A difference between the two files of a comparison, found by reading both (a weight of
/// the same name, an attribute of the same node): reported whether or not a layer shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct FileDifference {
    /// The layer (value) that reads it.
    pub layer: String,
    /// [`Cause::WeightMismatch`] or [`Cause::FileDiffers`].
    pub cause: Cause,
    /// What differs, in words.
    pub detail: String,
    /// What to do about it.
    pub fix: String,
}

/// How a defect or a file difference says that attributes differ: `changes`, one each
/// (``epsilon` 1e-5 → 0.1 on `ln``), in one sentence.
pub fn attributes_differ(changes: &[String]) -> String {
    format!("{ATTRIBUTES_DIFFER}{}", changes.join(", "))
}

const ATTRIBUTES_DIFFER: &str = "an attribute differs: ";

/// Adds the differences between the two files that no defect names yet to the summary's
/// defects (a weight that differs where the compared inputs do not show it: a ReLU that zeroes
/// it, a branch not taken): the files differ, so the run fails, whatever the values did. Where
/// a layer's defect blames the runtime's kernel and the files differ there, the file is the
/// cause (an optimizer that reordered the weight left no name to find it by in the run); where
/// it says only that the file computes differently (it names no attribute) and a weight or an
/// attribute differs there, that is named (a narrow file's weights, and a Constant too large
/// for a node's words, are checked by value only here).
pub fn unseen_differences(layers: &mut [Layer], summary: &mut Summary, found: Vec<FileDifference>) {
    // the layers whose kernel blame a file difference replaced: a second one there is added
    let mut replaced: Vec<String> = Vec::new();
    for d in found {
        // said already: a defect found it in the layer's own weights (an optimized target's
        // are read on its file's nodes, under another layer's name than the value that is gone)
        if summary.defects.iter().any(|x| x.detail.contains(&d.detail)) {
            continue;
        }
        if let Some(defect) = summary.defects.iter_mut().find(|x| x.layer == d.layer) {
            if replaced.contains(&d.layer) {
                defect.detail = format!("{}; {}", d.detail, defect.detail);
                if let Some(l) = layers.iter_mut().find(|l| l.name == d.layer) {
                    l.detail = Some(defect.detail.clone());
                }
            } else if defect.cause == Cause::OpImplementation
                || (defect.cause == Cause::FileDiffers
                    && (d.cause == Cause::WeightMismatch
                        || !defect.detail.starts_with(ATTRIBUTES_DIFFER)))
            {
                // a kernel blamed, or the file said only to compute differently: the weight or
                // attribute that differs is the cause
                replaced.push(d.layer.clone());
                defect.detail = if defect.cause == Cause::FileDiffers {
                    // what the layer's own error showed stands beside it
                    format!("{}; {}", d.detail, defect.detail)
                } else if let Some(m) = defect.multiple {
                    format!(
                        "{}; the layer's own error is {m:.1}× what its precision explains",
                        d.detail
                    )
                } else {
                    d.detail
                };
                defect.cause = d.cause;
                defect.fix = d.fix;
                if let Some(l) = layers.iter_mut().find(|l| l.name == d.layer) {
                    l.cause = Some(d.cause);
                    l.detail = Some(defect.detail.clone());
                }
            }
            continue;
        }
        let layer = layers.iter().find(|l| l.name == d.layer);
        let shown = match layer {
            Some(l) if l.exceeds_tol || l.local_exceeds => String::new(),
            Some(l) if l.status != crate::LayerStatus::Compared => format!(
                "; this layer's value is not compared ({})",
                l.reason.as_deref().unwrap_or("the target has none")
            ),
            Some(_) => "; on the compared inputs the layer stays within its tolerance (a change too small to exceed it, or one that what follows hides: a ReLU, a branch not taken), yet the target's file differs from the reference there".to_string(),
            None => "; no compared layer reads it".to_string(),
        };
        summary.defects.push(Defect {
            layer: d.layer,
            cause: d.cause,
            multiple: layer.and_then(|l| l.baseline.as_ref()).map(|b| b.multiple),
            tolerance_multiple: layer
                .and_then(|l| l.accumulated.as_ref())
                .and_then(crate::Stats::tolerance_multiple),
            detail: format!("{}{shown}", d.detail),
            fix: d.fix,
        });
        summary.verdict = Verdict::Defect;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cause::tests::layer;
    use crate::{Tolerance, analyse};

    fn difference(what: &str, cause: Cause) -> FileDifference {
        FileDifference {
            layer: "l0".into(),
            cause,
            detail: what.into(),
            fix: format!("fix {what}"),
        }
    }

    /// `l0` with one defect of `cause` in `detail`, then `found` added.
    fn defect_after(cause: Cause, detail: &str, found: Vec<FileDifference>) -> (Layer, Defect) {
        let mut layers = vec![layer(0, 5e-3, Some(5e-3), &["x"])];
        let mut summary = analyse(&mut layers, Tolerance::PerDtype);
        summary.defects.push(Defect {
            layer: "l0".into(),
            cause,
            multiple: Some(900.0),
            tolerance_multiple: Some(50.0),
            detail: detail.into(),
            fix: "report it to the runtime".into(),
        });
        unseen_differences(&mut layers, &mut summary, found);
        let [defect] = <[Defect; 1]>::try_from(summary.defects).unwrap();
        (layers.remove(0), defect)
    }

    #[test]
    fn files_that_differ_at_a_layer_blamed_on_its_kernel_are_the_cause_every_one_said() {
        let (layer, defect) = defect_after(
            Cause::OpImplementation,
            "the target's Conv computes differently",
            vec![
                difference("`w` differs", Cause::WeightMismatch),
                difference("an attribute differs: `pads`", Cause::FileDiffers),
            ],
        );
        assert_eq!(defect.cause, Cause::WeightMismatch);
        assert!(defect.detail.contains("`w` differs") && defect.detail.contains("`pads`"));
        assert!(
            !defect.detail.contains("computes differently"),
            "{}",
            defect.detail
        );
        assert_eq!(defect.fix, "fix `w` differs");
        assert_eq!(layer.cause, Some(Cause::WeightMismatch));
    }

    #[test]
    fn a_layer_that_computes_what_its_file_says_takes_the_attribute_the_files_show() {
        // A Constant too large for a node's words: the layer's own evidence named no attribute
        let computes =
            "its own error is 346.5× what float16 explains: the file computes differently";
        let changed =
            attributes_differ(&["`value` differs: max abs diff 3.000e0 on `table`".into()]);
        let (layer, defect) = defect_after(
            Cause::FileDiffers,
            computes,
            vec![difference(&changed, Cause::FileDiffers)],
        );
        assert_eq!(defect.detail, format!("{changed}; {computes}"));
        assert_eq!(
            (defect.cause, layer.cause),
            (Cause::FileDiffers, Some(Cause::FileDiffers))
        );
        assert_eq!(defect.fix, format!("fix {changed}"));
        // where it named the attributes already, its own words stand
        let named = format!(
            "{}; the target computes what its file says",
            attributes_differ(&["`axis` 1 → 2 on `n`".into()])
        );
        let (_, defect) = defect_after(
            Cause::FileDiffers,
            &named,
            vec![difference(&changed, Cause::FileDiffers)],
        );
        assert_eq!(
            (defect.detail, defect.fix),
            (named, "report it to the runtime".to_string())
        );
    }
}
