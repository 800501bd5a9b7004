#![no_main]
//! See layerdiff_fuzz::inputs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| layerdiff_fuzz::inputs(data));
