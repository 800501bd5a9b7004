//! Where the time goes: a stopwatch that attributes each stretch of a run to a phase, and the
//! breakdown `--timings` prints.

use std::time::{Duration, Instant};

use layerdiff_core::Timing;

/// Who spends the time of a phase.
pub const OWN: &str = "layerdiff";
/// A runtime's inference.
pub const RUNTIME: &str = "runtime";

/// Attributes the time since the previous lap to each phase named.
#[derive(Debug, Clone)]
pub struct Stopwatch {
    phases: Vec<Timing>,
    last: Instant,
}

impl Default for Stopwatch {
    fn default() -> Self {
        Self::start(Vec::new())
    }
}

impl Stopwatch {
    /// Starts now, after the phases already measured elsewhere (e.g. by the Python side).
    pub fn start(before: Vec<Timing>) -> Self {
        Self {
            phases: before,
            last: Instant::now(),
        }
    }

    /// Ends a phase: the time since the previous lap (or the start) goes to it.
    pub fn lap(&mut self, phase: &str, by: &str) {
        let now = Instant::now();
        self.push(phase, by, now - self.last);
        self.last = now;
    }

    /// Ends a phase whose time is split between layerdiff and runtimes: each of `runtime`'s
    /// durations of the time since the previous lap goes to its phase, the rest to `own_phase`.
    pub fn split_lap(&mut self, own_phase: &str, runtime: &[(&str, Duration)]) {
        let now = Instant::now();
        let mut left = now - self.last;
        for &(phase, time) in runtime {
            let time = time.min(left);
            self.push(phase, RUNTIME, time);
            left -= time;
        }
        self.push(own_phase, OWN, left);
        self.last = now;
    }

    /// Adds to the phase of that name (a segmented run passes through each phase many times),
    /// or starts it.
    fn push(&mut self, phase: &str, by: &str, time: Duration) {
        match self
            .phases
            .iter_mut()
            .find(|t| t.phase == phase && t.by == by)
        {
            Some(t) => t.seconds += time.as_secs_f64(),
            None => self.phases.push(Timing::new(phase, by, time.as_secs_f64())),
        }
    }

    /// The phases so far.
    pub fn phases(&self) -> Vec<Timing> {
        self.phases.clone()
    }
}

/// The breakdown printed by `--timings`: each phase, and layerdiff's own share of the total.
pub fn timings_text(phases: &[Timing]) -> String {
    let total: f64 = phases.iter().map(|t| t.seconds).sum();
    let own: f64 = phases
        .iter()
        .filter(|t| t.by == OWN)
        .map(|t| t.seconds)
        .sum();
    let width = phases.iter().map(|t| t.phase.len()).max().unwrap_or(0);
    let mut out = format!("timings ({total:.3} s in all):\n");
    for t in phases {
        out.push_str(&format!(
            "  {:<width$}  {:>8.3} s  {:>5.1}%  {}\n",
            t.phase,
            t.seconds,
            100.0 * t.seconds / total.max(f64::MIN_POSITIVE),
            t.by
        ));
    }
    out.push_str(&format!(
        "  layerdiff's own work: {own:.3} s, {:.1}% of the total\n",
        100.0 * own / total.max(f64::MIN_POSITIVE)
    ));
    out
}
