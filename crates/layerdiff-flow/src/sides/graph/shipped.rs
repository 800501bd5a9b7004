//! The graph that ships. A runtime that optimizes a model (ONNX Runtime above `opt=disable`)
//! fuses nodes and changes layouts; exposing every value of the file as an output would stop
//! those fusions and measure a graph that never ships. So the runtime optimizes the file first
//! and saves what it made; values an optimizer renamed into a blocked layout are given back
//! under their original names ([`restore_renamed`]); only values that exist in that graph are
//! compared, in that graph, run as saved; and the model outputs of the exposed run are checked
//! against an unmodified run of the file, so a report says whether exposing changed anything.
//!
//! A target *file* that an optimizer already wrote (`--vs model.opt.onnx`) gets the same
//! renamed values given back, without the check (there is no unmodified file to run).

use std::collections::{HashMap, HashSet};

use layerdiff_core::{
    LOW_COVERAGE_WARNING, ProviderNodes, SideInfo, Summary, TargetGraph, Tensor, compare_pair,
};
use layerdiff_onnx::{Model, restore_renamed};
use layerdiff_runtime::{Optimized, Runtime};

use crate::Result;
use crate::engine::side::Values;
use crate::timings::{RUNTIME, Stopwatch};

/// The target a run measures, and what it took to get there.
pub struct Target {
    /// The target model: the optimized graph, the `--vs` file, or `None` for the reference file.
    pub model: Option<Model>,
    /// Runs it.
    pub runtime: Box<dyn Runtime + Send + Sync>,
    /// Values an optimizer renamed or left in a blocked layout.
    pub renames: Renames,
    /// Set when the runtime optimized the model first.
    pub shipped: Option<Shipped>,
    /// Where the runtime really ran the file's nodes, when it can place them elsewhere than
    /// asked.
    pub placement: Option<Placement>,
}

/// Which execution provider ran how many nodes of the file as it ships, and the fallback a
/// reader must know of.
#[derive(Debug, Clone)]
pub struct Placement {
    nodes: Option<Vec<ProviderNodes>>,
    warning: Option<String>,
}

impl Placement {
    fn new(requested: &str, found: layerdiff_runtime::Result<Vec<(String, usize)>>) -> Self {
        let nodes = match found {
            Ok(nodes) => nodes,
            Err(e) => {
                return Self {
                    nodes: None,
                    warning: Some(format!("the node placement could not be read: {e}")),
                };
            }
        };
        let total: usize = nodes.iter().map(|(_, n)| n).sum();
        let elsewhere: Vec<String> = nodes
            .iter()
            .filter(|(p, _)| p != requested)
            .map(|(p, n)| format!("{n} on {p}"))
            .collect();
        let warning = (!elsewhere.is_empty()).then(|| {
            format!(
                "not every node ran on {requested}: of the {total} nodes, ONNX Runtime placed {} (no kernel on {requested}, or cheaper elsewhere); their numbers are that provider's",
                elsewhere.join(", ")
            )
        });
        Self {
            nodes: Some(
                nodes
                    .into_iter()
                    .map(|(provider, nodes)| ProviderNodes { provider, nodes })
                    .collect(),
            ),
            warning,
        }
    }

    /// Puts the placement on the target's side of a report, and its warning in the summary.
    pub fn report(self, side: &mut SideInfo, summary: &mut Summary) {
        side.placement = self.nodes;
        summary.warnings.extend(self.warning);
    }
}

/// What an optimizer did to value names, as pairing needs it.
#[derive(Debug, Default, Clone)]
pub struct Renames {
    /// How the target computes each value given back, by its original name.
    pub restored: HashMap<String, String>,
    /// Target values still in a blocked layout, and why each could not be given back.
    pub blocked: HashMap<String, String>,
}

impl Renames {
    fn of(original: &Model, target: &mut Model) -> Self {
        let done = restore_renamed(original, target);
        Self {
            restored: done
                .restored
                .into_iter()
                .map(|r| (r.origin, r.how))
                .collect(),
            blocked: done.blocked.into_iter().collect(),
        }
    }
}

/// An optimized target graph, and the outputs of the file as it ships.
pub struct Shipped {
    /// What the report says about the graph (surviving values are counted once paired).
    pub graph: TargetGraph,
    /// The model outputs of an unmodified run of the file at the runtime's level.
    pub unmodified: Vec<(String, Tensor)>,
    /// The outputs checked so far against the exposed run, and whether each was identical.
    checked: HashMap<String, bool>,
    /// The file the runtime optimized: the weights it reorders and renames as it fuses are
    /// read on the file's own nodes.
    pub(crate) file: Model,
    /// Holds the optimized file while the model reads from it.
    _folder: tempfile::TempDir,
}

/// The target of a run: when `runtime` optimizes, the graph it optimized from `file` (the
/// target file, or the reference's), run as saved; else `file` and `runtime` as given. Values
/// an optimizer renamed are given back against `reference`, whose names pairing looks for.
pub fn prepare_target(
    reference: &Model,
    file: Option<Model>,
    runtime: Box<dyn Runtime + Send + Sync>,
    inputs: &[(String, Tensor)],
    clock: &mut Stopwatch,
) -> Result<Target> {
    let original = file.as_ref().unwrap_or(reference);
    let placement = runtime
        .placement(original, inputs)
        .map(|(requested, found)| Placement::new(requested, found));
    if placement.is_some() {
        clock.lap("placing nodes (a profiled run)", RUNTIME);
    }
    let outputs: Vec<String> = (original.proto.graph.iter().flat_map(|g| &g.output))
        .map(|o| o.name().to_string())
        .collect();
    // the unmodified graph's outputs, from the session that optimized it where the runtime can
    let Some((
        Optimized {
            model: mut optimized,
            runtime: as_saved,
            folder,
        },
        unmodified,
    )) = runtime.optimize_and_run(original, inputs, &outputs)?
    else {
        let mut model = file;
        let renames = match model.as_mut() {
            Some(target) => Renames::of(reference, target),
            None => Renames::default(),
        };
        return Ok(Target {
            model,
            runtime,
            renames,
            shipped: None,
            placement,
        });
    };
    let nodes_optimized = optimized.graph().node.len();
    let renames = Renames::of(original, &mut optimized);
    let graph = TargetGraph {
        optimized_by: format!(
            "optimized by {}, before any value was exposed",
            runtime.detail()
        ),
        nodes_in_file: original.graph().node.len(),
        nodes_optimized,
        values_surviving: 0,
        values_restored: 0,
        outputs_identical: 0,
        outputs_checked: 0,
        outputs_max_abs_diff: 0.0,
    };
    Ok(Target {
        model: Some(optimized),
        runtime: as_saved,
        renames,
        shipped: Some(Shipped {
            graph,
            unmodified,
            checked: HashMap::new(),
            file: original.clone(),
            _folder: folder,
        }),
        placement,
    })
}

impl Shipped {
    /// Checks each model output that `held` has (the exposed run's values) and that was not
    /// checked yet against the unmodified run.
    pub(crate) fn check_outputs(&mut self, held: &Values) {
        for (name, unmodified) in &self.unmodified {
            if self.checked.contains_key(name) {
                continue;
            }
            let Some(exposed) = held.get(name) else {
                continue;
            };
            let identical = exposed.shape == unmodified.shape
                && exposed.dtype == unmodified.dtype
                && exposed.bytes == unmodified.bytes;
            if !identical {
                let stats = compare_pair(unmodified.view(), exposed.view(), None).stats;
                let diff = stats.map_or(f64::INFINITY, |s| s.max_abs_diff);
                let g = &mut self.graph;
                g.outputs_max_abs_diff = g.outputs_max_abs_diff.max(diff);
            }
            self.checked.insert(name.clone(), identical);
        }
    }

    /// The report's account of the graph: `surviving` are the distinct values of the original
    /// graph compared in it (those in `renames.restored` given back from a blocked layout). Its
    /// warnings go to `summary`, whose low-coverage warning goes: values fused away are the
    /// point of an optimized graph, their error reaches the next value that survives, and the
    /// graph's line counts them.
    pub fn finish<'v>(
        mut self,
        surviving: impl Iterator<Item = &'v str>,
        renames: &Renames,
        summary: &mut Summary,
    ) -> TargetGraph {
        let surviving: HashSet<&str> = surviving.collect();
        let g = &mut self.graph;
        g.values_surviving = surviving.len();
        g.values_restored = surviving
            .iter()
            .filter(|v| renames.restored.contains_key(**v))
            .count();
        g.outputs_checked = self.checked.len();
        g.outputs_identical = self.checked.values().filter(|&&same| same).count();
        let mut warnings = Vec::new();
        if g.outputs_identical < g.outputs_checked {
            warnings.push(format!(
                "exposing values changed the optimized graph's model outputs (largest difference {:.3e}): the per-layer numbers come from a graph that computes differently from the one that ships",
                g.outputs_max_abs_diff
            ));
        }
        let unchecked: Vec<&str> = self
            .unmodified
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !self.checked.contains_key(*n))
            .collect();
        if !unchecked.is_empty() {
            warnings.push(format!(
                "model outputs not checked against an unmodified run of the file: `{}`",
                unchecked.join("`, `")
            ));
        }
        summary
            .warnings
            .retain(|w| !w.starts_with(LOW_COVERAGE_WARNING));
        summary.warnings.extend(warnings);
        self.graph
    }
}

#[cfg(test)]
mod tests {
    use layerdiff_core::DType;

    use super::*;

    fn tensor(name: &str, values: &[f32]) -> (String, Tensor) {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::new(name, DType::F32, vec![values.len()], bytes).unwrap();
        (name.to_string(), t)
    }

    fn shipped(unmodified: Vec<(String, Tensor)>) -> Shipped {
        Shipped {
            graph: TargetGraph {
                optimized_by: "optimized by a test".into(),
                nodes_in_file: 4,
                nodes_optimized: 2,
                values_surviving: 0,
                values_restored: 0,
                outputs_identical: 0,
                outputs_checked: 0,
                outputs_max_abs_diff: 0.0,
            },
            unmodified,
            checked: HashMap::new(),
            file: Model::from_proto(Default::default(), None),
            _folder: tempfile::tempdir().unwrap(),
        }
    }

    fn two_warnings() -> Summary {
        let mut s = layerdiff_core::analyse(&mut [], layerdiff_core::Tolerance::PerDtype);
        s.warnings = vec![
            "low coverage: only 3 of 9 layers were compared".into(),
            "something else".into(),
        ];
        s
    }

    #[test]
    fn outputs_changed_by_exposing_are_a_warning_with_the_difference() {
        let mut s = shipped(vec![tensor("logits", &[1.0, 2.0]), tensor("aux", &[0.0])]);
        s.check_outputs(&Values::new(vec![tensor("logits", &[1.0, 2.5])]));
        // A later segment holding the same output again does not count it twice.
        s.check_outputs(&Values::new(vec![tensor("logits", &[1.0, 2.0])]));
        let mut summary = two_warnings();
        let restored = HashMap::from([("b".to_string(), String::new())]);
        let renames = Renames {
            restored,
            ..Default::default()
        };
        let graph = s.finish(["a", "b", "c", "a"].into_iter(), &renames, &mut summary);
        let warnings = &summary.warnings;
        assert_eq!((graph.outputs_checked, graph.outputs_identical), (1, 0));
        assert_eq!(graph.outputs_max_abs_diff, 0.5);
        assert_eq!((graph.values_surviving, graph.values_restored), (3, 1));
        assert_eq!(warnings[0], "something else");
        assert!(warnings[1].starts_with("exposing values changed the optimized graph's model outputs (largest difference 5.000e-1)"));
        assert_eq!(
            warnings[2],
            "model outputs not checked against an unmodified run of the file: `aux`"
        );
        assert!(graph.describe().contains("CHANGED the model outputs"));
    }

    /// A GPU provider's stand-in: it says it ran 3 nodes on CUDA and 1 on the CPU.
    struct FallingBack;

    impl Runtime for FallingBack {
        fn name(&self) -> &str {
            "onnxruntime"
        }
        fn detail(&self) -> String {
            "a stand-in for CUDAExecutionProvider".into()
        }
        fn placement(
            &self,
            _: &Model,
            _: &[(String, Tensor)],
        ) -> Option<(
            &'static str,
            layerdiff_runtime::Result<Vec<(String, usize)>>,
        )> {
            let nodes = vec![
                ("CUDAExecutionProvider".to_string(), 3),
                ("CPUExecutionProvider".to_string(), 1),
            ];
            Some(("CUDAExecutionProvider", Ok(nodes)))
        }
        fn run(
            &self,
            _: &Model,
            _: &[(String, Tensor)],
            _: &[String],
        ) -> layerdiff_runtime::Result<Vec<(String, Tensor)>> {
            unreachable!("placement is all the target's preparation asks")
        }
    }

    #[test]
    fn a_silent_fallback_reaches_the_report() {
        let model = Model::from_proto(layerdiff_onnx::ModelProto::default(), None);
        let target = prepare_target(
            &model,
            None,
            Box::new(FallingBack),
            &[],
            &mut Stopwatch::default(),
        )
        .unwrap();
        let (mut side, mut summary) = (SideInfo::new("onnxruntime", "…"), two_warnings());
        target.placement.unwrap().report(&mut side, &mut summary);
        assert_eq!(
            side.placement_text().unwrap(),
            "3 nodes on CUDAExecutionProvider, 1 on CPUExecutionProvider"
        );
        assert!(
            summary.warnings[2]
                .contains("of the 4 nodes, ONNX Runtime placed 1 on CPUExecutionProvider")
        );
    }

    #[test]
    fn nodes_placed_off_the_requested_provider_are_a_warning() {
        let found = vec![
            ("CUDAExecutionProvider".to_string(), 290),
            ("CPUExecutionProvider".to_string(), 12),
        ];
        let (mut side, mut summary) = (SideInfo::new("onnxruntime", "…"), two_warnings());
        Placement::new("CUDAExecutionProvider", Ok(found)).report(&mut side, &mut summary);
        let placement = side.placement.unwrap();
        assert_eq!((placement[0].nodes, placement[1].nodes), (290, 12));
        assert!(summary.warnings[2].starts_with(
            "not every node ran on CUDAExecutionProvider: of the 302 nodes, ONNX Runtime placed 12 on CPUExecutionProvider (no kernel on CUDAExecutionProvider"
        ));
        let all = vec![("CUDAExecutionProvider".to_string(), 302)];
        let (mut side, mut clean) = (SideInfo::new("onnxruntime", "…"), two_warnings());
        Placement::new("CUDAExecutionProvider", Ok(all)).report(&mut side, &mut clean);
        assert_eq!(clean.warnings.len(), 2);
    }

    #[test]
    fn identical_outputs_say_so_and_warn_of_nothing() {
        let mut s = shipped(vec![tensor("y", &[1.0, -0.0])]);
        s.check_outputs(&Values::new(vec![tensor("y", &[1.0, -0.0])]));
        let mut summary = two_warnings();
        let graph = s.finish(["a", "b"].into_iter(), &Renames::default(), &mut summary);
        assert_eq!(summary.warnings, ["something else"]);
        assert!(
            graph
                .describe()
                .contains("bit-identical to an unmodified run (1 of 1)")
        );
    }
}
