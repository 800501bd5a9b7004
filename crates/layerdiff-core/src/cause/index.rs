//! The decision for a layer whose values are indices (ArgMax, ArgMin): held to the indices of
//! its inputs as the target holds them, picked exactly (see `crate::Baseline::indices`).

use super::{Cause, DType, Evidence, Finding};
use crate::Indices;

/// The verdict of a layer of indices: where the target picks what its inputs as it holds them
/// give, the indices that differ are near ties the rounding to `grid` broke (precision);
/// anywhere else, its kernel picks otherwise (a defect).
pub(super) fn indices(
    layer: &crate::Layer,
    b: &crate::Baseline,
    ix: &Indices,
    e: &Evidence,
) -> (Cause, String, Finding) {
    let share = |k: u64| crate::render::share_words(k, ix.elements);
    // the very indices the target file's own nodes pick, computed exactly: the file differs
    if b.beyond() && layer.computes_as_written().is_some() {
        let written = e.written_words();
        return (
            Cause::FileDiffers,
            format!(
                "in {} of {} elements ({}) the target picks another index than the reference's op would on its inputs as it holds them ({}), and the very one the target file's own nodes pick, computed exactly: the runtime computes what the file says, and the file computes differently from the reference here ({written}): an export that changed the op, or an edit",
                ix.off_ideal,
                ix.elements,
                share(ix.off_ideal),
                b.grid
            ),
            Finding::Defect,
        );
    }
    if b.beyond() {
        return (
            Cause::OpImplementation,
            format!(
                "in {} of {} elements ({}) the target picks another index than the same op computed exactly on its inputs as it holds them ({}): the target's {} picks differently (a tie broken the other way, another axis)",
                ix.off_ideal,
                ix.elements,
                share(ix.off_ideal),
                b.grid,
                e.ops_words()
            ),
            Finding::Defect,
        );
    }
    let narrow = DType::from_name(&b.grid).is_ok_and(|g| g.narrower_than(DType::F32));
    let cause = if narrow {
        Cause::PrecisionLoss
    } else {
        Cause::Rounding
    };
    (
        cause,
        format!(
            "the target picks the indices of its inputs as it holds them, in {g}: {} of {} ({}) differ from the reference's, each where rounding to {g} breaks a near tie, as the same op computed exactly on those inputs picks them",
            ix.differ,
            ix.elements,
            share(ix.differ),
            g = b.grid
        ),
        Finding::Precision,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    fn verdict(own: &[f64]) -> (Cause, String, Finding) {
        let int = |v: &[f64]| Tensor::from_f64(DType::I64, v);
        let reference = int(&[0.; 4000]);
        let mut exact = vec![0.; 4000];
        exact[7] = 2.;
        let mut t = vec![0.; 4000];
        t[..own.len()].copy_from_slice(own);
        let (t, exact) = (int(&t), int(&exact));
        let b = crate::assess_baseline(
            reference.view(),
            t.view(),
            exact.view(),
            DType::F16,
            0,
            false,
            None,
        )
        .unwrap();
        let e = Evidence {
            ops: vec!["ArgMax".to_string()],
            ..Evidence::default()
        };
        let layer = crate::Layer::new(0, "class", vec![4000], "int64");
        indices(&layer, &b, b.indices.as_ref().unwrap(), &e)
    }

    #[test]
    fn indices_the_rounding_explains_are_precision_and_others_a_defect() {
        let (cause, detail, finding) = verdict(&[0., 0., 0., 0., 0., 0., 0., 2.]);
        assert_eq!((cause, finding), (Cause::PrecisionLoss, Finding::Precision));
        assert!(
            detail.contains("in float16: 1 of 4000 (0.025%) differ from the reference's"),
            "{detail}"
        );
        let (cause, detail, finding) = verdict(&[1., 0., 0., 0., 0., 0., 0., 2.]);
        assert_eq!((cause, finding), (Cause::OpImplementation, Finding::Defect));
        assert!(
            detail.starts_with("in 1 of 4000 elements (0.025%) the target picks another index"),
            "{detail}"
        );
        assert!(
            detail.contains("the target's ArgMax picks differently"),
            "{detail}"
        );
    }
}
