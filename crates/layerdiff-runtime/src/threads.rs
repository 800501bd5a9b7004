//! `LAYERDIFF_THREADS`: how many threads one run's kernels use. By default each runtime takes
//! one per core; runs side by side (a CI matrix, a sweep, a test suite's processes) then fight
//! for the cores, and ONNX Runtime's pool spins while it waits: on a 2-core machine, two runs
//! at one thread each finish a quarter sooner than at two each.

use crate::{Error, Result};

/// The variable that caps the threads of a run's kernels.
pub const THREADS_ENV: &str = "LAYERDIFF_THREADS";

/// The threads `LAYERDIFF_THREADS` gives each pool of a run (ONNX Runtime's intra-op pool,
/// OpenVINO's, PyTorch's in the command, layerdiff's own); `None` where it is unset or empty:
/// each runtime's own default, one per core.
pub fn thread_cap() -> Result<Option<usize>> {
    let Some(text) = std::env::var_os(THREADS_ENV) else {
        return Ok(None);
    };
    let text = text.to_string_lossy();
    if text.trim().is_empty() {
        return Ok(None);
    }
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(Error::Threads(text.into_owned())),
    }
}

/// At a door of the process (the command, the Python module): checks `LAYERDIFF_THREADS` and
/// sizes layerdiff's own pool (the comparison, the float64 kernels) to it. The pool can be
/// sized once, before its first use: a later call only checks.
pub fn cap_threads() -> Result<()> {
    if let Some(n) = thread_cap()? {
        // Err: already built (this process called it before, or the pool has been used)
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global();
    }
    Ok(())
}

/// `, 1 thread` where `LAYERDIFF_THREADS` capped a runtime's pool (its numbers can depend on
/// how a kernel splits its work); nothing at the runtime's default.
pub(crate) fn threads_words(threads: Option<usize>) -> String {
    match threads {
        None => String::new(),
        Some(1) => ", 1 thread".to_string(),
        Some(n) => format!(", {n} threads"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test touches the variable: the process's environment is shared by the tests.
    #[test]
    fn the_cap_is_a_whole_number_of_one_or_more_and_unset_means_none() {
        let cases: [(Option<&str>, Option<Option<usize>>); 7] = [
            (None, Some(None)),
            (Some(""), Some(None)),
            (Some("3"), Some(Some(3))),
            (Some(" 2 "), Some(Some(2))),
            (Some("0"), None),
            (Some("-1"), None),
            (Some("all"), None),
        ];
        for (value, expected) in cases {
            // SAFETY: no other test of this crate reads or writes this variable.
            unsafe {
                match value {
                    Some(v) => std::env::set_var(THREADS_ENV, v),
                    None => std::env::remove_var(THREADS_ENV),
                }
            }
            match (thread_cap(), expected) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{value:?}"),
                (Err(e), None) => assert_eq!(
                    e.to_string(),
                    format!(
                        "LAYERDIFF_THREADS is `{}`: give the number of threads each run's \
                         kernels may use, 1 or more",
                        value.unwrap()
                    )
                ),
                (got, want) => panic!("{value:?}: {got:?}, expected {want:?}"),
            }
        }
        unsafe { std::env::remove_var(THREADS_ENV) };
    }
}
