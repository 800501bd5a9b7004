//! Every input the fuzzers kept (`fuzz/corpus/TARGET/`: a minimized corpus) and every crasher
//! they found (`fuzz/regressions/TARGET/`, each fixed), run through its target again: seconds,
//! in `make test`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;

/// One allocation past this is what the fuzzers report as out of memory
/// (`-malloc_limit_mb`): here it aborts the test, with the size, as libFuzzer does.
const MALLOC_LIMIT: usize = 1 << 30;

struct Bounded;

// SAFETY: forwards to the system allocator; refusing an allocation (a null pointer) is allowed.
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MALLOC_LIMIT {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Bounded = Bounded;

fn folder(kind: &str, target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(kind)
        .join(target)
}

#[test]
fn every_kept_input_and_every_crasher_runs_clean() {
    for (target, body) in layerdiff_fuzz::TARGETS {
        let mut ran = 0;
        for kind in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(folder(kind, target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("a readable folder").path();
                let data = std::fs::read(&path).expect("a readable file");
                body(&data);
                ran += 1;
            }
        }
        assert!(ran >= 100, "{target}: only {ran} kept inputs under fuzz/");
    }
}
