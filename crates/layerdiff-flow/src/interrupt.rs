//! Ctrl-C and SIGTERM in the middle of a run. The `layerdiff` command ([`catch`]) says
//! `stopping…` at once and turns the first one into a request the engine reads between layers
//! ([`requested`]): it stops there, and the run's report holds the layers compared so far,
//! marked incomplete (or, when none was, nothing is written). The command's end ([`conclude`])
//! removes what else the run made in its folders and says, last, what is left; the exit code is
//! 128 + the signal's number either way ([`exit_code`]). A second signal ends the process at
//! once, as if nothing had caught the first. A library user's process is left as it is: only the
//! command installs the handlers.

use std::sync::atomic::{AtomicI32, Ordering};

/// The signal that asked the run to stop (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// SIGINT's number (Ctrl-C).
pub const SIGINT: i32 = 2;
/// SIGTERM's number (`kill`, a CI runner's timeout).
pub const SIGTERM: i32 = 15;

/// The signal that asked the run to stop, if one has.
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::Relaxed) {
        0 => None,
        signal => Some(signal),
    }
}

/// Asks the run to stop at the next layer, as `signal` would.
pub fn request(signal: i32) {
    SIGNAL.store(signal, Ordering::Relaxed);
}

/// Forgets the request, for a process that goes on to another run after one stopped.
pub fn clear() {
    SIGNAL.store(0, Ordering::Relaxed);
    crate::progress::STOPPING.store(false, Ordering::Relaxed);
}

/// The exit code of a run a signal stopped: 128 + its number, as shells report a process a
/// signal ended (130 for Ctrl-C, 143 for SIGTERM).
pub fn exit_code() -> Option<u8> {
    requested().map(|signal| (128 + signal).clamp(0, 255) as u8)
}

/// The command's end, with the exit code its run returned: where a signal stopped the run, what
/// the run made besides its reports goes ([`crate::made::sweep`]), the last line says what is
/// left, and the exit code is 128 + the signal's number.
/// A signal that came once the run's reports were written whole changes nothing: the run keeps
/// the exit code it returned.
pub fn conclude(code: u8) -> u8 {
    let Some(signal) = requested() else {
        return code;
    };
    crate::progress::done();
    let swept = crate::made::sweep();
    eprintln!("interrupted by {}: {}", name(signal), swept.words());
    if swept.whole {
        code
    } else {
        exit_code().unwrap_or(code)
    }
}

/// A signal in words.
pub fn name(signal: i32) -> String {
    match signal {
        SIGINT => "SIGINT (Ctrl-C)".to_string(),
        SIGTERM => "SIGTERM".to_string(),
        other => format!("signal {other}"),
    }
}

/// Installs the handlers of SIGINT and SIGTERM: the first of either asks the run to stop
/// ([`request`]); a handler installed before (the Python interpreter's) still runs, so Python
/// code is interrupted as it always was; a second signal ends the process with that signal.
/// Unix only; elsewhere Ctrl-C keeps the system's default.
pub fn catch() {
    #[cfg(unix)]
    unix::install();
}

#[cfg(unix)]
mod unix {
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The handlers found before ours (`sa_sigaction` and its flags), per signal: SIGINT, SIGTERM.
    static PREVIOUS: [(AtomicUsize, AtomicUsize); 2] = [
        (AtomicUsize::new(0), AtomicUsize::new(0)),
        (AtomicUsize::new(0), AtomicUsize::new(0)),
    ];

    fn slot(signal: i32) -> &'static (AtomicUsize, AtomicUsize) {
        &PREVIOUS[usize::from(signal == super::SIGTERM)]
    }

    pub(super) fn install() {
        for signal in [super::SIGINT, super::SIGTERM] {
            // SAFETY: a zeroed sigaction is a valid "no handler" value, and `on_signal` is an
            // `extern "C" fn(c_int)` as `sa_handler` requires (no SA_SIGINFO).
            unsafe {
                let mut ours: libc::sigaction = std::mem::zeroed();
                ours.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                ours.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut ours.sa_mask);
                let mut before: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, &ours, &mut before) == 0
                    && before.sa_sigaction != on_signal as extern "C" fn(libc::c_int) as usize
                {
                    let (handler, flags) = slot(signal);
                    handler.store(before.sa_sigaction, Ordering::Relaxed);
                    flags.store(before.sa_flags as usize, Ordering::Relaxed);
                }
            }
        }
    }

    /// Only async-signal-safe work: atomics, `write`, `signal`, `raise` and the previous
    /// handler.
    extern "C" fn on_signal(signal: libc::c_int) {
        if super::requested().is_some() {
            // the second signal: what it would have done had we not caught the first
            // SAFETY: restoring the default action and raising the signal are async-signal-safe.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
                libc::raise(signal);
            }
            return;
        }
        super::request(signal);
        crate::progress::STOPPING.store(true, Ordering::Relaxed);
        // said at once, whatever the run is in the middle of (a runtime's compile, an export)
        let said: &[u8] = if signal == super::SIGINT {
            "stopping… (Ctrl-C again ends it at once, without a report)\n".as_bytes()
        } else {
            "stopping on SIGTERM…\n".as_bytes()
        };
        let ended: &[u8] = if crate::progress::MID_LINE.load(Ordering::Relaxed) {
            b"\n"
        } else {
            b""
        };
        for bytes in [ended, said] {
            // SAFETY: write(2) is async-signal-safe; the bytes are static strings'.
            unsafe {
                libc::write(libc::STDERR_FILENO, bytes.as_ptr().cast(), bytes.len());
            }
        }
        let (handler, flags) = slot(signal);
        let handler = handler.load(Ordering::Relaxed);
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            return;
        }
        // SAFETY: `handler` is the function the previous sigaction installed, called as its
        // flags say it takes its arguments.
        unsafe {
            if flags.load(Ordering::Relaxed) as libc::c_int & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(handler);
                f(signal, std::ptr::null_mut(), std::ptr::null_mut());
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                f(signal);
            }
        }
    }
}
