//! Progress on a terminal: one line of layers done, time so far and time left, rewritten in
//! place on stderr; nothing when stderr is not a terminal (a pipe, CI logs) or the run is quiet.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// The progress line of a run over `total` layers.
pub struct Ticker {
    total: usize,
    start: Instant,
    shown: Option<Instant>,
}

impl Ticker {
    /// A ticker when stderr is a terminal and the run may print.
    pub fn for_terminal(total: usize, quiet: bool) -> Option<Self> {
        (!quiet && std::io::stderr().is_terminal()).then(|| Self {
            total,
            start: Instant::now(),
            shown: None,
        })
    }

    /// `done` layers of the total are done: the line, at most twice a second, and the last one
    /// ended with a newline.
    pub fn tick(&mut self, done: usize) {
        if let Some(text) = self.due(done, Instant::now()) {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(text.as_bytes());
            let _ = err.flush();
        }
    }

    /// What to write when `done` layers are done at `now`: the line rewritten in place, unless
    /// one was written less than half a second ago and the run is not finished.
    fn due(&mut self, done: usize, now: Instant) -> Option<String> {
        let finished = done >= self.total;
        if !finished
            && self
                .shown
                .is_some_and(|t| now - t < Duration::from_millis(500))
        {
            return None;
        }
        self.shown = Some(now);
        let line = line(done, self.total, now - self.start);
        Some(format!(
            "\r{line}\x1b[K{}",
            if finished { "\n" } else { "" }
        ))
    }
}

/// `  layers 12/68, 3.1s, about 14s left`.
fn line(done: usize, total: usize, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let left = if done == 0 {
        0.0
    } else {
        secs / done as f64 * total.saturating_sub(done) as f64
    };
    format!("  layers {done}/{total}, {secs:.1}s, about {left:.0}s left")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_two_lines_a_second_and_the_last_ends_the_line() {
        let start = Instant::now();
        let mut ticker = Ticker {
            total: 3,
            start,
            shown: None,
        };
        let written: String = (1..=3).filter_map(|done| ticker.due(done, start)).collect();
        assert!(written.starts_with("\r  layers 1/3, "), "{written:?}");
        assert!(
            written.ends_with("\r  layers 3/3, 0.0s, about 0s left\x1b[K\n"),
            "{written:?}"
        );
        assert!(!written.contains("layers 2/3"), "{written:?}");
    }

    #[test]
    fn the_line_says_layers_done_and_time_left_at_this_pace() {
        assert_eq!(
            line(10, 40, Duration::from_secs(5)),
            "  layers 10/40, 5.0s, about 15s left"
        );
        assert_eq!(
            line(0, 40, Duration::ZERO),
            "  layers 0/40, 0.0s, about 0s left"
        );
    }
}
