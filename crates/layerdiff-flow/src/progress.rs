//! What a command is doing, on stderr, for the person or the log that watches it. A line per
//! phase (`[  3.1s] starting openvino…`); while layers are compared, a line of layers done and
//! time left, rewritten in place on a terminal and written as a plain line at most every 10 s
//! elsewhere (a pipe, a CI log: no ANSI codes); and, whatever the run is doing, a line at least
//! every 10 s (`still …`), so a log never looks hung. Only a command prints: its door calls
//! [`start`] (nothing at all with `--quiet`); a library user's process prints nothing.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a log may go without a line while the run works: 10 s, or the seconds
/// `LAYERDIFF_HEARTBEAT` says (a test's shorter wait).
fn heartbeat() -> Duration {
    static EVERY: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| {
        std::env::var("LAYERDIFF_HEARTBEAT")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(Duration::from_secs(10), Duration::from_secs_f64)
    })
}

/// What is shown, once a command started it.
struct Shown {
    start: Instant,
    terminal: bool,
    /// The phase under way, for the heartbeat's line (`None`: the run's work is done).
    phase: Option<String>,
    /// When the last line was written.
    written: Instant,
    /// A terminal's in-place line is on screen, not yet ended.
    mid_line: bool,
}

static SHOWN: Mutex<Option<Shown>> = Mutex::new(None);

/// Whether a terminal's in-place line is on screen, for a signal handler, which may not lock.
pub(crate) static MID_LINE: AtomicBool = AtomicBool::new(false);

/// Set by a signal handler that asked the run to stop: the heartbeat says nothing after it.
pub(crate) static STOPPING: AtomicBool = AtomicBool::new(false);

fn shown() -> std::sync::MutexGuard<'static, Option<Shown>> {
    SHOWN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The command's door: progress is shown from now on, unless `quiet`; the heartbeat starts.
pub fn start(quiet: bool) {
    if quiet {
        return;
    }
    let now = Instant::now();
    *shown() = Some(Shown {
        start: now,
        terminal: std::io::stderr().is_terminal(),
        phase: None,
        written: now,
        mid_line: false,
    });
    static HEART: std::sync::Once = std::sync::Once::new();
    HEART.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("layerdiff-progress".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(Duration::from_millis(250));
                    beat(Instant::now());
                }
            });
    });
}

/// Whether progress is shown (a command's run, not quiet).
pub fn showing() -> bool {
    shown().is_some()
}

/// A phase begins: its line, `[  3.1s] what…`.
pub fn phase(what: &str) {
    let mut guard = shown();
    let Some(s) = guard.as_mut() else { return };
    if STOPPING.load(Ordering::Relaxed) {
        return; // after `stopping…`, only what the run leaves is said
    }
    s.phase = Some(what.to_string());
    let line = format!("{}{what}…\n", stamp(s.start.elapsed()));
    s.write(&line, false, Instant::now());
}

/// The run's work is done (its result is being written and printed): no heartbeat after.
pub fn done() {
    if let Some(s) = shown().as_mut() {
        s.phase = None;
        if s.mid_line {
            s.write("\n", false, Instant::now());
        }
    }
}

/// The heartbeat at `now`: where no line was written for the heartbeat's time (10 s) while a phase is under
/// way, `still <phase>…`; nothing once a signal asked the run to stop.
fn beat(now: Instant) {
    let mut guard = shown();
    let Some(s) = guard.as_mut() else { return };
    if let Some(line) = s.due_beat(now)
        && !STOPPING.load(Ordering::Relaxed)
    {
        s.write(&line, false, now);
    }
}

impl Shown {
    fn due_beat(&self, now: Instant) -> Option<String> {
        let phase = self.phase.as_ref()?;
        (now - self.written >= heartbeat())
            .then(|| format!("{}still {phase}…\n", stamp(now - self.start)))
    }

    /// Writes `text`; `in_place`: a terminal's line to rewrite (no newline).
    fn write(&mut self, text: &str, in_place: bool, now: Instant) {
        let mut err = std::io::stderr().lock();
        let lead = if self.mid_line && !in_place {
            "\r\x1b[K"
        } else {
            ""
        };
        let _ = write!(err, "{lead}{text}");
        let _ = err.flush();
        self.mid_line = in_place;
        MID_LINE.store(in_place, Ordering::Relaxed);
        self.written = now;
    }
}

/// `[  3.1s] `: the time since the command started.
fn stamp(elapsed: Duration) -> String {
    format!("[{:6.1}s] ", elapsed.as_secs_f64())
}

/// The line of layers done over a run of `total` layers.
pub struct Ticker {
    total: usize,
    start: Instant,
    shown: Option<Instant>,
}

impl Ticker {
    /// A ticker when the command shows progress (see [`start`]) and this run may print.
    pub fn new(total: usize, quiet: bool) -> Option<Self> {
        (!quiet && showing()).then(|| Self {
            total,
            start: Instant::now(),
            shown: None,
        })
    }

    /// `done` layers of the total are done: the line, rewritten in place at most twice a
    /// second on a terminal, a plain line at most every 10 s elsewhere; the last one
    /// always.
    pub fn tick(&mut self, done: usize) {
        let now = Instant::now();
        let mut guard = shown();
        let Some(s) = guard.as_mut() else { return };
        if let Some(text) = self.due(done, now, s.terminal) {
            s.write(&text, s.terminal && done < self.total, now);
        }
    }

    /// What to write when `done` layers are done at `now`, on a terminal or not.
    fn due(&mut self, done: usize, now: Instant, terminal: bool) -> Option<String> {
        let finished = done >= self.total;
        let every = if terminal {
            Duration::from_millis(500)
        } else {
            heartbeat()
        };
        // the first line waits a second at most: a quick run needs none
        let (last, wait) = match self.shown {
            Some(shown) => (shown, every),
            None => (self.start, every.min(Duration::from_secs(1))),
        };
        if !finished && now - last < wait {
            return None;
        }
        self.shown = Some(now);
        let line = line(done, self.total, now - self.start);
        Some(if terminal {
            format!("\r{line}\x1b[K{}", if finished { "\n" } else { "" })
        } else {
            format!("{line}\n")
        })
    }
}

/// `  layers 12/68, 3.1s, about 14s left`; the time left only from a twentieth of the layers
/// on (the first segment holds the whole run's start: its pace says nothing of the rest).
fn line(done: usize, total: usize, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if done == 0 || done * 20 < total {
        return format!("  layers {done}/{total}, {secs:.1}s");
    }
    let left = secs / done as f64 * total.saturating_sub(done) as f64;
    format!("  layers {done}/{total}, {secs:.1}s, about {left:.0}s left")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticker(total: usize, start: Instant) -> Ticker {
        Ticker {
            total,
            start,
            shown: None,
        }
    }

    #[test]
    fn on_a_terminal_at_most_two_lines_a_second_and_the_last_ends_the_line() {
        let start = Instant::now();
        let mut ticker = ticker(4, start);
        let at = |ms| start + Duration::from_millis(ms);
        assert_eq!(
            ticker.due(1, at(100), true),
            None,
            "a quick start says nothing"
        );
        let first = ticker.due(1, at(1000), true).unwrap();
        assert!(first.starts_with("\r  layers 1/4, 1.0s, "), "{first:?}");
        assert_eq!(ticker.due(2, at(1200), true), None);
        assert!(ticker.due(2, at(1600), true).is_some());
        let last = ticker.due(4, at(1700), true).unwrap();
        assert_eq!(last, "\r  layers 4/4, 1.7s, about 0s left\x1b[K\n");
    }

    #[test]
    fn piped_a_plain_line_at_most_every_ten_seconds_and_the_last() {
        let start = Instant::now();
        let mut ticker = ticker(100, start);
        let at = |s| start + Duration::from_secs(s);
        let first = ticker.due(5, at(1), false).unwrap();
        assert_eq!(first, "  layers 5/100, 1.0s, about 19s left\n");
        assert!(!first.contains('\x1b') && !first.contains('\r'));
        assert_eq!(ticker.due(50, at(9), false), None);
        assert!(ticker.due(60, at(11), false).is_some());
        assert_eq!(
            ticker.due(100, at(12), false).as_deref(),
            Some("  layers 100/100, 12.0s, about 0s left\n")
        );
    }

    #[test]
    fn the_heartbeat_names_the_phase_after_ten_silent_seconds_and_not_once_done() {
        let start = Instant::now();
        let mut s = Shown {
            start,
            terminal: false,
            phase: Some("starting openvino".into()),
            written: start,
            mid_line: false,
        };
        assert_eq!(s.due_beat(start + Duration::from_secs(9)), None);
        assert_eq!(
            s.due_beat(start + Duration::from_secs(10)).as_deref(),
            Some("[  10.0s] still starting openvino…\n")
        );
        s.phase = None;
        assert_eq!(s.due_beat(start + Duration::from_secs(30)), None);
    }

    #[test]
    fn the_line_says_layers_done_and_time_left_at_this_pace() {
        assert_eq!(
            line(10, 40, Duration::from_secs(5)),
            "  layers 10/40, 5.0s, about 15s left"
        );
        assert_eq!(line(0, 40, Duration::ZERO), "  layers 0/40, 0.0s");
        // one layer of 476 after the first segment's 4.6 s: no estimate from that pace
        assert_eq!(
            line(1, 476, Duration::from_millis(4600)),
            "  layers 1/476, 4.6s"
        );
    }
}
