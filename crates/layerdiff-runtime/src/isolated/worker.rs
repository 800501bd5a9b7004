//! A worker process: what talks to it, and how it ended when it died.

use std::io::{BufReader, BufWriter};
use std::process::{Child, ChildStdin, ChildStdout};

use crate::Error;

/// A worker process, and the pipes a request goes out and its answer comes back on.
pub(super) struct Worker {
    pub(super) child: Child,
    pub(super) to: BufWriter<ChildStdin>,
    pub(super) from: BufReader<ChildStdout>,
    /// What the worker printed on stderr: the last words of one that crashed.
    pub(super) log: tempfile::NamedTempFile,
}

/// Why a request got no answer.
pub(super) enum Failure {
    /// The worker died: how (`SIGSEGV, a segmentation fault`), and its last words on stderr.
    Died(String, Option<String>),
    /// The runtime in the worker refused or failed, with an error of its own.
    Said(Error),
}

impl Worker {
    /// How the worker ended, and its last words (the end of what it wrote on stderr).
    pub(super) fn died(mut self) -> Failure {
        let _ = self.child.kill(); // one that answered garbage is still alive
        let how = match self.child.wait() {
            Ok(status) => describe(status),
            Err(e) => format!("lost ({e})"),
        };
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        let words: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let last_words =
            (!words.is_empty()).then(|| words[words.len().saturating_sub(3)..].join(" / "));
        Failure::Died(how, last_words)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a worker ended: `SIGSEGV, a segmentation fault`, `exit code 3`.
fn describe(status: std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return match signal {
                4 => "SIGILL, an illegal instruction".to_string(),
                6 => "SIGABRT, an abort".to_string(),
                7 => "SIGBUS, a bad memory access".to_string(),
                8 => "SIGFPE, an arithmetic fault".to_string(),
                9 => "SIGKILL, killed from outside (often for memory)".to_string(),
                11 => "SIGSEGV, a segmentation fault".to_string(),
                other => format!("signal {other}"),
            };
        }
    }
    match status.code() {
        Some(code) => format!("exit code {code}"),
        None => "an unknown end".to_string(),
    }
}
