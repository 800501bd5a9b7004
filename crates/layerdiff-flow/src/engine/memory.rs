//! Memory: how big each value will be, the budget a run holds its values to (as written on the
//! command line, and when none is given), and how a run was split to keep to it.

use std::collections::HashMap;

use layerdiff_core::DType;
use layerdiff_onnx::{Dimension, GraphIndex};

/// A memory size as given on the command line: `4G`, `512M`, `1.5GB`, `2GiB`, `800000000`
/// (powers of 1024 for the letters).
pub fn parse_memory(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => return Err(format!("`{text}` is not a memory size (e.g. 4G, 512M)")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a memory size (e.g. 4G, 512M)"))?;
    if value <= 0.0 || !value.is_finite() {
        return Err(format!("`{text}`: the memory budget must be above zero"));
    }
    Ok((value * scale as f64) as u64)
}

/// A size in words: `1.5 GB`, `300 MB`, `12 KB`, `40 B` (powers of 1024).
pub fn bytes_text(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} B")
    } else if b >= (1u64 << 30) as f64 {
        format!("{:.1} GB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.0} MB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.0} KB", b / 1024.0)
    }
}

/// The budget a run holds its values to: the one given, else what [`DefaultBudget`] leaves
/// them.
pub fn budget(given: Option<u64>) -> Option<u64> {
    given.or_else(|| DefaultBudget::now().map(|d| d.values(0)))
}

/// Whether PyTorch holds a model's weights (`weights` bytes, as it computes in them) one module
/// at a time, read from the checkpoint's files as the forward pass reaches each module: where
/// they take more than the budget given (`--max-memory`), or, with none given, more than a
/// quarter of what the whole process should hold ([`DefaultBudget`]), whose rest the float64
/// truth, the runtime's copy of the weights and the values need.
pub fn streams_weights(weights: u64, given: Option<u64>) -> bool {
    match given {
        Some(budget) => weights > budget,
        None => DefaultBudget::now().is_some_and(|d| weights > d.process / 4),
    }
}

/// The budget when none is given: the whole process is kept within half the memory it could
/// use when the run is planned (what the system has available, plus what the process already
/// holds: libraries, a PyTorch model already built). Its values get what is left of that once
/// what it holds and the runtime's copy of the weights are taken off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultBudget {
    /// The most the whole process should hold.
    pub process: u64,
    /// What it holds already.
    pub held: u64,
}

impl DefaultBudget {
    /// Read from Linux's `/proc` (`MemAvailable`, this process's `VmRSS`); `None` elsewhere.
    pub fn now() -> Option<Self> {
        let kib = |text: &str, key: &str| -> Option<u64> {
            let line = text.lines().find(|l| l.starts_with(key))?;
            Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
        };
        let available = kib(
            &std::fs::read_to_string("/proc/meminfo").ok()?,
            "MemAvailable:",
        )?;
        let held = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| kib(&s, "VmRSS:"))
            .unwrap_or(0);
        Some(Self {
            process: (available + held) / 2,
            held,
        })
    }

    /// What the values may hold at once when a run also loads `weights` bytes beside them.
    pub fn values(&self, weights: u64) -> u64 {
        self.process
            .saturating_sub(self.held.saturating_add(weights))
    }
}

/// Estimated bytes of every value a graph computes: from its declared type and shape, with
/// symbolic dimensions taken from the inputs as given; where the file declares none, the
/// largest of the producing node's inputs (right for elementwise ops, a guess elsewhere).
pub fn value_sizes(
    index: &GraphIndex,
    inputs: &[(String, layerdiff_core::Tensor)],
) -> HashMap<String, u64> {
    let mut symbols: HashMap<&str, u64> = HashMap::new();
    for (name, tensor) in inputs {
        if let Some(dims) = index.value_type(name).and_then(|t| t.dims.as_ref()) {
            for (d, &size) in dims.iter().zip(&tensor.shape) {
                if let Dimension::Symbolic(Some(symbol)) = d {
                    symbols.insert(symbol, size as u64);
                }
            }
        }
    }
    let mut sizes: HashMap<String, u64> = inputs
        .iter()
        .map(|(n, t)| (n.clone(), t.bytes.len() as u64))
        .collect();
    let declared = |name: &str| -> Option<u64> {
        let t = index.value_type(name)?;
        let element = DType::from_onnx_code(t.elem_type).ok()?.size() as u64;
        t.dims.as_ref()?.iter().try_fold(element, |acc, d| {
            let d = match d {
                Dimension::Fixed(v) => u64::try_from(*v).ok()?,
                Dimension::Symbolic(Some(s)) => *symbols.get(s.as_str())?,
                Dimension::Symbolic(None) => return None,
            };
            Some(acc.saturating_mul(d))
        })
    };
    for node in index.nodes() {
        let guess = node
            .inputs
            .iter()
            .filter_map(|i| sizes.get(i).copied().or_else(|| declared(i)))
            .max()
            .unwrap_or(0);
        for out in node.outputs.iter().filter(|o| !o.is_empty()) {
            let bytes = declared(out).unwrap_or(guess);
            sizes.insert(out.clone(), bytes);
        }
    }
    sizes
}

/// How a run was split to bound its memory.
#[derive(Debug, Clone, Copy)]
pub struct Segmentation {
    /// Segments run (1: the whole graph at once).
    pub segments: usize,
    /// Estimated bytes of all values both sides produce.
    pub total_bytes: u64,
    /// Estimated most bytes of values held at once.
    pub peak_bytes: u64,
    /// The whole process's bound, when the budget is the default one (see [`DefaultBudget`]).
    pub process: Option<u64>,
    /// Whether the peak counts the weights a segment's run loads (see `Plan::weights_counted`).
    pub weights_counted: bool,
}

impl Segmentation {
    /// The line that tells a user the run was split (`None` for a run of the whole graph).
    pub fn text(&self) -> Option<String> {
        (self.segments > 1).then(|| {
            let process = self.process.map_or(String::new(), |p| {
                format!(
                    ", the whole process within about {} (half the memory it could use)",
                    bytes_text(p)
                )
            });
            let held = if self.weights_counted {
                "of values and weights"
            } else {
                "of values"
            };
            format!(
                "ran in {} segments to hold at most about {} {held} at once ({} of values in all){process}; see --max-memory",
                self.segments,
                bytes_text(self.peak_bytes),
                bytes_text(self.total_bytes)
            )
        })
    }
}

/// Sets the C heap up for a run that takes and frees values of many megabytes: a command's own
/// process only (a library user's process is left as it is). Elsewhere than glibc, nothing to
/// do.
///
/// - glibc gives each thread that allocates a heap arena of its own, and memory freed in one is
///   not reused by another: with PyTorch's, ONNX Runtime's and the float64 run's threads that
///   held about 100 MB more at the peak of a ResNet-18 run. Two arenas keep the heap near what
///   is in use, at no measurable cost in time.
/// - glibc maps a block above its mmap threshold (128 KB at first, raised as such blocks are
///   freed) afresh from the system and unmaps it when freed, and hands the top of its heap back
///   as soon as 128 KB of it is free: every value, model copy and session then costs page
///   faults to take and to give back (a fifth of a ResNet-18 run's CPU time went to the kernel's
///   memory management). Blocks up to 256 MB come from the heap, and up to 256 MB freed at its
///   top is kept for the next: ResNet-18's `layerdiff onnx` ran in 0.95 s instead of 1.16 s,
///   ResNet-50 against float16 in 3.0 s instead of 3.5 s, with the same peak memory (a run
///   segmented by `--max-memory 300MB` peaked 5% higher). Memory held free this way is handed
///   back where a segmented run asks ([`give_back_freed`]).
pub fn settle_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        const M_ARENA_MAX: i32 = -8;
        const HELD: i32 = 256 << 20;
        // glibc builds that cap the threshold lower refuse it: their cap, then
        const CAP: i32 = 32 << 20;
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // SAFETY: mallopt only sets glibc's allocator parameters.
        unsafe {
            mallopt(M_ARENA_MAX, 2);
            if mallopt(M_MMAP_THRESHOLD, HELD) == 0 {
                mallopt(M_MMAP_THRESHOLD, CAP);
            }
            mallopt(M_TRIM_THRESHOLD, HELD);
        }
    }
}

/// Sets the C heap up for a command whose PyTorch model is streamed (its weights taken and
/// freed module by module, each block tens or hundreds of megabytes): [`settle_heap`]'s
/// blocks kept in the heap would hold freed weights between the live ones, and the process
/// would keep up to a model's worth of them. Blocks above 4 MB are mapped afresh and handed back
/// when freed, and the heap's top is handed back beyond 4 MB free: more page faults for the
/// values, a peak set by what is live.
pub fn heap_for_streaming() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        const SMALL: i32 = 4 << 20;
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // SAFETY: mallopt only sets glibc's allocator parameters.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, SMALL);
            mallopt(M_TRIM_THRESHOLD, SMALL);
        }
    }
}

/// Whether a run split as `split` hands the memory freed between its segments back to the
/// system ([`give_back_freed`]): where the budget cut it, or where its values in all would not
/// fit the budget a run is given by default (a budget given that holds more than the machine
/// could). A run within both keeps what a stretch freed for the next.
pub fn hands_back_freed(split: &Segmentation) -> bool {
    split.segments > 1 || DefaultBudget::now().is_none_or(|d| split.total_bytes > d.values(0))
}

/// Hands the heap memory freed so far back to the system. glibc keeps freed memory for reuse
/// (more so across threads' arenas), so a process that is about to take a big new block (a
/// runtime's copy of the model) would otherwise hold both. Elsewhere, nothing to do.
///
/// The engine calls it between segments only where [`hands_back_freed`] says: taking memory back
/// costs a page fault and a zeroed page for every 4 KB, and far more on a virtual machine whose
/// host backs the guest's memory only when it is first touched and can take freed pages back
/// (on the 2-core VM `make bench` last ran on: about 3 s per GiB never touched, 0.15 s for
/// memory used before). Handing back what
/// each stretch of a 581M decoder's one-segment run freed cost 2 s of its 23 s (second runs
/// 2.5-2.9 s, 1.7-2.1 s without); keeping it raised the peak by 0.3-0.6 GB (5.4 to 5.7-6.0),
/// within the default budget, which holds the whole run.
pub fn give_back_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: malloc_trim only returns free pages of glibc's own heaps to the system.
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_freed_between_stretches_is_kept_only_by_a_run_that_fits_the_machine_whole() {
        let split = |segments, total_bytes| Segmentation {
            segments,
            total_bytes,
            peak_bytes: total_bytes,
            process: None,
            weights_counted: false,
        };
        // cut by the budget: handed back between segments, as the low point needs
        assert!(hands_back_freed(&split(3, 1 << 20)));
        // one segment, but more values than the machine could hold (`--max-memory 1T`)
        assert!(hands_back_freed(&split(1, u64::MAX / 2)));
        // one segment of a few megabytes: kept for the next stretch, where /proc tells
        if DefaultBudget::now().is_some() {
            assert!(!hands_back_freed(&split(1, 1 << 20)));
        }
    }

    #[test]
    fn weights_are_streamed_above_the_budget_given_and_held_whole_below_it() {
        assert!(streams_weights(4 << 30, Some(1 << 30)));
        assert!(!streams_weights(1 << 30, Some(1 << 30)));
        // none given: a model far below any machine's memory is held whole
        assert!(!streams_weights(1 << 20, None));
    }

    #[test]
    fn the_default_budget_leaves_the_values_what_the_process_and_a_runtime_do_not_hold() {
        let budget = DefaultBudget {
            process: 10 << 30,
            held: 2 << 30,
        };
        assert_eq!(budget.values(1 << 30), 7 << 30);
        assert_eq!(budget.values(20 << 30), 0, "never below nothing");
        #[cfg(target_os = "linux")]
        {
            let now = DefaultBudget::now().expect("Linux has /proc");
            assert!(now.held > 0 && now.process > now.held / 2, "{now:?}");
        }
    }

    #[test]
    fn memory_sizes_parse_and_bad_ones_are_named() {
        assert_eq!(parse_memory("4G"), Ok(4 << 30));
        assert_eq!(parse_memory("512M"), Ok(512 << 20));
        assert_eq!(parse_memory("1.5GB"), Ok(3 << 29));
        assert_eq!(parse_memory("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_memory("1000"), Ok(1000));
        assert!(
            parse_memory("4X")
                .unwrap_err()
                .contains("`4X` is not a memory size")
        );
        assert!(parse_memory("0").unwrap_err().contains("above zero"));
    }
}
