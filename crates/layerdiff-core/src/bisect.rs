//! What turns a difference on: the smallest set of switches (ONNX Runtime optimizers to disable,
//! layers to keep in float32, compiler stages) that makes a run clean, found by halves, and the
//! report's record of it.

use serde::Serialize;

/// The smallest subset of `items` for which `clean` holds, given that it holds for all of them:
/// delta debugging by halves (Zeller's `dd`, the way git bisects commits but over a set). A
/// half that is enough alone is narrowed alone; when neither half is, each is narrowed with the
/// other kept in, so switches that are only enough together are all found. The result keeps
/// the items' order and is 1-minimal: dropping any one item breaks it. `clean` runs once per
/// candidate set (about 2·k·log₂n times for k switches among n); its error ends the search.
pub fn smallest_set<T: Clone, E>(
    items: &[T],
    clean: &mut dyn FnMut(&[T]) -> Result<bool, E>,
) -> Result<Vec<T>, E> {
    if clean(&[])? {
        return Ok(Vec::new());
    }
    let order: Vec<usize> = (0..items.len()).collect();
    let picked = narrow(&order, &[], &mut |set: &[usize]| {
        let chosen: Vec<T> = set.iter().map(|&i| items[i].clone()).collect();
        clean(&chosen)
    })?;
    Ok(picked.into_iter().map(|i| items[i].clone()).collect())
}

fn narrow<E>(
    candidates: &[usize],
    context: &[usize],
    clean: &mut dyn FnMut(&[usize]) -> Result<bool, E>,
) -> Result<Vec<usize>, E> {
    if candidates.len() <= 1 {
        return Ok(candidates.to_vec());
    }
    let (a, b) = candidates.split_at(candidates.len() / 2);
    let with = |part: &[usize], context: &[usize]| {
        let mut set: Vec<usize> = context.iter().chain(part).copied().collect();
        set.sort_unstable();
        set
    };
    if clean(&with(a, context))? {
        return narrow(a, context, clean);
    }
    if clean(&with(b, context))? {
        return narrow(b, context, clean);
    }
    let from_a = narrow(a, &with(b, context), clean)?;
    let from_b = narrow(b, &with(&from_a, context), clean)?;
    let mut both = from_a;
    both.extend(from_b);
    both.sort_unstable();
    Ok(both)
}

/// What a bisection found: which switches turn the difference on, and the run that checked it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bisection {
    /// What was bisected, in words (`ONNX Runtime graph optimizers at opt=all`).
    pub over: String,
    /// What each switch does to them, which says how the finding reads: `disabled` (the
    /// switches that turn it on), `kept in float32` (those that bring the output within
    /// tolerance), `first shown by` (the first stage that shows it).
    pub action: String,
    /// How many candidates there were.
    pub candidates: usize,
    /// The smallest set found; empty when none of them was responsible (see `found`).
    pub responsible: Vec<String>,
    /// Whether switching every candidate made the run clean: when not, they are not what turns
    /// the difference on, and `responsible` is empty.
    pub found: bool,
    /// How many runs the search took, the check included.
    pub runs: usize,
    /// The run that checks the answer: the target with `responsible` switched, judged as the
    /// report's run was.
    pub check: BisectionCheck,
    /// How to run the target with them switched (`ort:opt=all:without=NchwcTransformer`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spelling: Option<String>,
}

/// One checking run of a bisection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BisectionCheck {
    /// Layers compared in it.
    pub compared: usize,
    /// Layers beyond their tolerance in the report's run.
    pub exceeding_before: usize,
    /// Layers beyond their tolerance with the switches applied.
    pub exceeding_after: usize,
}

impl Bisection {
    /// The finding in one sentence.
    pub fn sentence(&self) -> String {
        let runs = runs(self.runs);
        let names: Vec<String> = self.responsible.iter().map(|n| format!("`{n}`")).collect();
        let names = names.join(", ");
        let check = &self.check;
        let after = format!(
            "{} of {} layers exceed their tolerance (before: {})",
            check.exceeding_after, check.compared, check.exceeding_before
        );
        match (self.action.as_str(), self.found) {
            ("kept in float32", true) => format!(
                "keeping {names} in float32 ({} of {} {}) brings the output within its tolerance, the smallest such set ({runs}); checked by the whole comparison with them kept: {after}",
                self.responsible.len(),
                self.candidates,
                self.over
            ),
            ("kept in float32", false) => format!(
                "no set of the {} {} brings the output within its tolerance: with all of them kept in float32 it still exceeds it, so the drift comes from elsewhere (the inputs' own rounding, functional calls) ({runs}); with all kept: {after}",
                self.candidates, self.over
            ),
            ("first shown by", true) => format!(
                "first shown by {names} among {} {} ({runs}); checked: the stage before it agrees with eager",
                self.candidates, self.over
            ),
            ("first shown by", false) => format!(
                "first shown by {names} among {} {} ({runs}); not checked: the stage before it does not agree with eager either",
                self.candidates, self.over
            ),
            (action, false) => format!(
                "not turned on by {}: with all {} {action}, {} of {} layers still exceed their tolerance ({runs})",
                self.over, self.candidates, check.exceeding_after, check.compared,
            ),
            (action, true) => {
                let how = self
                    .spelling
                    .as_ref()
                    .map(|s| format!(" (`{s}`)"))
                    .unwrap_or_default();
                let them = if self.responsible.len() == 1 {
                    "it"
                } else {
                    "them"
                };
                format!(
                    "turned on by {} of {} {}: {names}; with {them} {action}{how}, {after}, checked ({runs})",
                    self.responsible.len(),
                    self.candidates,
                    self.over,
                )
            }
        }
    }
}

/// What the search of a target that cannot show its layers found (`--opaque`): its graph run
/// unmodified, whole, then on node ranges fed with the reference's values, halved towards the
/// one that deviates beyond its precision until a single node is left, which is then judged
/// alone as a per-layer run judges a layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpaqueSearch {
    /// The nodes of the target's graph, in its order.
    pub nodes: usize,
    /// Each range the target ran, in order: the first is the whole graph (the check).
    pub ranges: Vec<RangeTried>,
    /// The node the ranges narrowed to (`None`: the whole graph is within its precision).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Its op.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// How many times the target ran: every range, and the node alone where one was found.
    pub runs: usize,
}

/// One range of an opaque search run on the target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RangeTried {
    /// Its first node (by name, else op and position).
    pub first: String,
    /// Its last node.
    pub last: String,
    /// How many nodes it holds.
    pub nodes: usize,
    /// The values it hands on (read after it, or the graph's outputs): its only outputs.
    pub outputs: usize,
    /// The largest of its outputs' errors as a multiple of what precision explains there.
    #[serde(serialize_with = "crate::floats::float")]
    pub multiple: f64,
    /// Whether that is beyond what precision explains.
    pub deviates: bool,
}

impl OpaqueSearch {
    /// The finding in one sentence.
    pub fn sentence(&self) -> String {
        let Some(check) = self.ranges.first() else {
            return format!("no range was run ({})", runs(self.runs));
        };
        // the runs beyond the ranges' are the node's (or the outputs') own comparison
        let compared = self.runs.saturating_sub(self.ranges.len());
        if !check.deviates {
            return format!(
                "the target's whole graph, run unmodified, is within what its precision explains \
                 at its {} output(s): {:.2}× at most, the verdict's multiple (the whole chain \
                 against an ideal one at its precision; an output's own multiple in its row is \
                 its last nodes' alone, on the reference's values), so no range was searched \
                 ({}, and {} to compare its outputs)",
                check.outputs,
                check.multiple,
                runs(1),
                runs(compared)
            );
        }
        let node = match (&self.node, &self.op) {
            (Some(node), Some(op)) => format!("`{node}` ({op})"),
            (Some(node), None) => format!("`{node}`"),
            _ => "no node".to_string(),
        };
        format!(
            "the target's whole graph, run unmodified, deviates at its outputs ({:.2}× what its \
             precision explains); {} node range(s) of its graph, each run unmodified on the \
             reference's values, narrowed its {} nodes to {node} ({} in all, the check included, \
             then {} to compare the node alone; no graph the target ran was asked for a value its \
             own nodes read)",
            check.multiple,
            self.ranges.len() - 1,
            self.nodes,
            runs(self.ranges.len()),
            runs(compared)
        )
    }
}

fn runs(n: usize) -> String {
    match n {
        1 => "1 run".to_string(),
        n => format!("{n} runs"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(n: usize, clean: impl Fn(&[usize]) -> bool) -> (Vec<usize>, usize) {
        let items: Vec<usize> = (0..n).collect();
        let mut runs = 0;
        let found = smallest_set(&items, &mut |set: &[usize]| {
            runs += 1;
            Ok::<_, ()>(clean(set))
        })
        .unwrap();
        (found, runs)
    }

    #[test]
    fn one_switch_among_many_is_found_by_halves() {
        let (found, runs) = search(80, |s| s.contains(&57));
        assert_eq!(found, vec![57]);
        assert!(runs <= 1 + 2 * 7, "{runs} runs");
    }

    #[test]
    fn switches_needed_together_are_all_found() {
        let (found, _) = search(40, |s| s.contains(&3) && s.contains(&31) && s.contains(&32));
        assert_eq!(found, vec![3, 31, 32]);
    }

    #[test]
    fn either_of_two_is_enough_and_one_is_named() {
        let (found, _) = search(16, |s| s.contains(&2) || s.contains(&12));
        assert_eq!(found.len(), 1);
        assert!(found == vec![2] || found == vec![12]);
    }

    #[test]
    fn nothing_is_needed_when_the_run_is_already_clean() {
        assert_eq!(search(10, |_| true), (vec![], 1));
    }

    #[test]
    fn the_answer_is_one_minimal_for_every_pair_of_needed_switches() {
        for a in 0..12 {
            for b in a..12 {
                let needed = |s: &[usize]| s.contains(&a) && s.contains(&b);
                let (found, _) = search(12, needed);
                let mut want = vec![a, b];
                want.dedup();
                assert_eq!(found, want, "needed {a} and {b}");
            }
        }
    }

    #[test]
    fn an_error_ends_the_search() {
        let items = [1, 2, 3];
        let mut calls = 0;
        let out = smallest_set(&items, &mut |_: &[i32]| {
            calls += 1;
            if calls == 2 {
                Err("runtime broke")
            } else {
                Ok(false)
            }
        });
        assert_eq!(out, Err("runtime broke"));
    }
}
