//! The process's memory as the Python side sees it: the C heap set up for the `layerdiff`
//! command's own process (the Python API leaves a user's process as it is), freed memory handed
//! back, and sizes in words.

use pyo3::prelude::*;

/// Sets the C heap up for the `layerdiff` command's own process (see
/// `layerdiff_flow::memory::settle_heap`); the Python API never calls it.
#[pyfunction]
pub(crate) fn settle_heap() {
    layerdiff_flow::memory::settle_heap();
}

/// Sets the C heap up for the `layerdiff` command's process once its model is streamed (see
/// `layerdiff_flow::memory::heap_for_streaming`); the Python API never calls it.
#[pyfunction]
pub(crate) fn heap_for_streaming() {
    layerdiff_flow::memory::heap_for_streaming();
}

/// Hands the memory the process has freed back to the system, where the C library keeps it
/// (see `layerdiff_flow::memory::give_back_freed`): a checkpoint held one module at a
/// time calls it before its widest reads.
#[pyfunction]
pub(crate) fn give_back_freed() {
    layerdiff_flow::memory::give_back_freed();
}

/// A size in words as reports write it (`1.5 GB`, `300 MB`: powers of 1024).
#[pyfunction]
pub(crate) fn bytes_text(bytes: u64) -> String {
    layerdiff_flow::memory::bytes_text(bytes)
}
