//! A side with fallbacks: the first of several sides that can compute the run does. The float64
//! truth of `layerdiff onnx` is one: ONNX Runtime lacks float64 kernels for some ops (Conv,
//! Erf), so its nodes run one by one where ONNX Runtime cannot run it whole.

use layerdiff_core::{DType, SideInfo, Summary, Tensor};

use crate::engine::plan::{Part, PlanSide};
use crate::engine::side::Side;
use crate::timings::Stopwatch;
use crate::{Error, GraphSide, Result};

/// Tries its sides in order until one produces the first part.
pub struct FallbackSide {
    sides: Vec<GraphSide>,
    current: usize,
    produced: bool,
    /// Why each side before the current one could not run.
    failures: Vec<String>,
}

impl FallbackSide {
    /// `sides`, tried in order (at least one).
    pub fn new(sides: Vec<GraphSide>) -> Self {
        assert!(!sides.is_empty(), "a fallback needs a side");
        Self {
            sides,
            current: 0,
            produced: false,
            failures: Vec::new(),
        }
    }

    fn side(&self) -> &GraphSide {
        &self.sides[self.current]
    }
}

impl Side for FallbackSide {
    fn describe(&mut self, summary: &mut Summary) -> SideInfo {
        self.sides[self.current].describe(summary)
    }

    fn plan_view(&self) -> PlanSide<'_> {
        self.side().plan_view()
    }

    fn expose(&mut self, values: &[String]) -> Result<()> {
        self.sides.iter_mut().try_for_each(|s| s.expose(values))
    }

    fn produce(
        &mut self,
        part: &Part,
        whole: bool,
        clock: &mut Stopwatch,
        phase: &str,
    ) -> Result<()> {
        let count = self.sides.len();
        loop {
            let side = &mut self.sides[self.current];
            match side.produce(part, whole, clock, phase) {
                Ok(()) => {
                    self.produced = true;
                    return Ok(());
                }
                Err(e) if !self.produced && self.current + 1 < count => {
                    let runtime = side.runtime.name().to_string();
                    self.failures
                        .push(format!("{runtime}: {}", crate::error_chain(&e)));
                    self.current += 1;
                }
                Err(e) => {
                    let mut why = self.failures.clone();
                    why.push(crate::error_chain(&e));
                    return Err(Error::Usage(why.join("; ")));
                }
            }
        }
    }

    fn get(&self, value: &str) -> Option<&Tensor> {
        self.side().get(value)
    }

    fn dtype(&self, value: &str) -> Option<DType> {
        self.side().dtype(value)
    }

    fn free(&mut self, values: &[String]) {
        self.sides[self.current].free(values);
    }
}
